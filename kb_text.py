"""Pure text functions shared by ingest and search: frontmatter and properties, note dates, heading-aware and
outline (Logseq) chunking, BM25 tokenizing.

Takes strings, returns records; touches no note files. Imports: nothing from the project.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
import textwrap
import unicodedata
import urllib.parse
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

logger = logging.getLogger(__name__)

# Bump when tokenizing changes in a way that invalidates stored BM25 postings.
TOKENIZER_VERSION = 4
# Bump when chunk boundaries, chunk text or what a note's record keeps change for the same input (3: outlines chunk at
# block boundaries; 4: a note's heading levels, its shape for the translation test). A bump re-reads every note and
# reuses the vectors of unchanged text.
CHUNKER_VERSION = 4
# Separator between heading levels in a chunk's heading path.
HEADING_SEP = " > "
# A vault term (title, alias, tag) joins the jieba dictionary only within these lengths.
USER_TERM_MIN_CHARS, USER_TERM_MAX_CHARS = 2, 12
# jieba frequency given to vault terms: fixed (not suggested) so every process segments alike, and high
# enough that a term beats the split into its common parts.
USER_TERM_FREQ = 2000
# Longest token kept: a longer run of letters/digits (a hash, a base64 blob) is cut to this prefix, so one
# hostile run costs bounded index space; 64 keeps a SHA-256 in hex whole.
MAX_TOKEN_CHARS = 64
# YAML nodes a frontmatter block may expand to, each alias counted at every use: more is an alias bomb.
MAX_FRONTMATTER_NODES = 10_000
# Characters of scalar text a frontmatter block may expand to, aliases counted at every use.
MAX_FRONTMATTER_CHARS = 200_000
# Deepest frontmatter mapping flattened into dotted property keys ("project.owner"); deeper levels are ignored.
MAX_PROPERTY_DEPTH = 8
# Property keys whose first date-like value is a note's date (after a daily-note or journal file name).
DATE_KEYS = ("date",)
# Folders of a Logseq graph whose notes are outlines, and whose file names encode page names.
LOGSEQ_FOLDERS = ("pages", "journals")
# Logseq block properties that are structure, not data: kept on the chunk, not on the note.
LOGSEQ_BLOCK_KEYS = frozenset({"id", "collapsed"})
# Logseq properties whose value is one text even when it holds commas.
LOGSEQ_TEXT_KEYS = frozenset({"title"})
# Text without a frontmatter or outline structure is an outline when this share of its non-empty lines are
# bullets or their indented continuations (a Markdown note with a title line and a list is not)...
OUTLINE_MIN_SHARE = 0.9
# ... and it has at least this many bullets.
OUTLINE_MIN_BULLETS = 2
# Columns a tab counts for when comparing bullet indentation.
TAB_COLUMNS = 4
# Characters of one parent block's text kept in an outline chunk's heading path.
OUTLINE_PATH_BLOCK_CHARS = 40
# Parent blocks named in an outline chunk's heading path (the outermost ones); bounds hostile nesting.
OUTLINE_PATH_MAX_LEVELS = 6

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK}]")
_CJK_RUN_RE = re.compile(f"[{_CJK}]+")
_MIXED_PART_RE = re.compile(f"[{_CJK}]+|[a-z0-9]+")
# Runs of letters, digits and CJK: the unit handed to jieba (so "云仓wms" can match a user term).
_RUN_RE = re.compile(f"[{_CJK}a-z0-9]+(?:\\+\\+|#)?")
_LATIN_WORD_RE = re.compile(r"[a-z0-9]+(?:\+\+|#)?")
# Identifiers such as backup-nightly.timer, settings.local.json, err_conn_reset: indexed whole as well.
# Linear time: it starts only at the start of a run and its runs are possessive, so a long run without a
# separator fails once instead of being retried from every position inside it (quadratic before).
_COMPOUND_RE = re.compile(r"(?<![a-z0-9])[a-z0-9]++(?:[._\-/:][a-z0-9]++)+")
_SYMBOL_RE = re.compile(f"[^\\s{_CJK}A-Za-z0-9_]")
_WORD_RE = re.compile(r"[A-Za-z0-9_]+")
# Code in a note's text (fenced blocks, inline spans): not prose when judging its language.
_CODE_RE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.S)
# Latin words (letters only: numbers and identifiers' digits are no language).
_LATIN_LETTERS_RE = re.compile(r"[A-Za-z]+")
_PROSE_RE = re.compile(f"[{_CJK}A-Za-z]")
# ATX heading opener; the rest of the line is cut in _parse_heading (a lazy regex there was quadratic in spaces).
_HEADING_OPEN_RE = re.compile(r" {0,3}(#{1,6})[ \t]")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")
_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
_INLINE_TAG_RE = re.compile(r"(?<![\w&#/])#([A-Za-z0-9_\-/" + _CJK + r"]*[A-Za-z_" + _CJK + r"][A-Za-z0-9_\-/" + _CJK + r"]*)")
# Sentence ends: Chinese full stops always; Latin ones when followed by whitespace.
_SENTENCE_END_RE = re.compile(r"(?<=[。！？；…])|(?<=[.!?;])(?=\s)")
# A fence where outlines and list items put one too: after indentation and a bullet. A backtick fence's info
# string holds no backtick (so "```inline```" is not a fence).
_LOOSE_FENCE_RE = re.compile(r"[ \t]*+(?:[-*+][ \t]++)?(?:(`{3,}+)(?![^\n]*`)|(~{3,}+))")
# An outline bullet: indentation, a marker, then a space or the end of the line ("---" and "-x" are not bullets).
_BULLET_RE = re.compile(r"([ \t]*+)[-*+](?:[ \t]++|$)")
# A Logseq (or Dataview) property line "key:: value", also as a bullet's text; "std::vector" is not one.
_PROPERTY_RE = re.compile(r"[ \t]*+(?:[-*+][ \t]++)?([\w\-]++)::(?:[ \t](.*))?$")
# A whole value that is a page reference: [[x]], [[x|label]], #[[x]] or #x.
_REF_VALUE_RE = re.compile(r"#?\[\[([^\[\]|\n]+)(?:\|[^\[\]\n]*)?\]\]|#([^\s#\[\]]+)")
# Logseq's multi-word tag #[[...]] (a plain #tag is _INLINE_TAG_RE's).
_BRACKET_TAG_RE = re.compile(r"(?<![\w&#/])#\[\[([^\[\]\n]+)\]\]")
# [[x]] inside a heading-path label, shown as x.
_LABEL_REF_RE = re.compile(r"#?\[\[([^\[\]\n]+)\]\]")
# Dates in file names and property values: 2026-03-02 (also _ . /), 2026年3月2日, Mar 2nd, 2026.
_ISO_DATE_RE = re.compile(r"(\d{4})([-_./])(\d{1,2})\2(\d{1,2})(?!\d)")
_ZH_DATE_RE = re.compile(r"(\d{4})年(\d{1,2})月(\d{1,2})日")
_EN_DATE_RE = re.compile(r"([A-Za-z]{3,9})\.? (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})(?!\d)")
_MONTH_NAMES = "january february march april may june july august september october november december".split()

EN_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off
    on once only or other our ours ourselves out over own same she should so some such than that the their theirs
    them themselves then there these they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours yourself yourselves don doesn didn isn aren wasn weren
    haven hasn hadn won wouldn shouldn couldn ll ve re tell told show find know want please many much also again
    really just still ever even get got say said thing things""".split()
)
ZH_STOPWORDS = frozenset(
    """的 了 是 在 和 与 及 或 也 就 都 而 着 过 被 把 让 给 对 从 向 于 以 之 其 这 那 这个 那个 这些 那些 哪 哪个 哪些
    什么 怎么 怎样 怎么样 如何 为什么 为何 为啥 啥 咋 吗 呢 吧 啊 呀 哦 嗯 么 嘛 我 我们 你 你们 他 他们 她 她们 它 它们
    自己 有 没有 没 不 很 还 又 再 才 就是 一个 一下 一些 有没有 是不是 是否 可以 能 会 要 想 请问 请 关于 一 个 当时 之前
    以前 以后 之后 时候 什么时候 多少 多久 多长 多长时间 几 几个 几次 几天 几点 哪 哪天 哪里 哪儿 哪家 哪位 谁 那次 这次
    上次 那个 这个 那些 这些 那里 这里 还是 或者 然后 因为 所以 如果 但是 而且 已经 应该 需要 记得 里 中 上 下""".split()
)
STOPWORDS = EN_STOPWORDS | ZH_STOPWORDS


@dataclass(frozen=True)
class Chunk:
    """A piece of a note: its text, heading path (e.g. "Project X > Decisions") and 1-based inclusive line range.

    `properties` holds the Logseq block properties (`key:: value`, `id::` included) of an outline chunk's blocks.
    """

    text: str
    heading_path: str
    line_start: int
    line_end: int
    properties: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedNote:
    """A note split into metadata and chunks; `frontmatter_error` says why a broken block was kept as text.

    `properties`: lower-cased keys to string values from frontmatter, Logseq page and block properties and
    `key:: value` lines (dates as ISO text, booleans "true"/"false"); `date`: the note's ISO date (note_date);
    `outline`: chunked at outline blocks.
    """

    title: str
    tags: tuple[str, ...]
    aliases: tuple[str, ...]
    chunks: tuple[Chunk, ...]
    frontmatter_error: str | None = None
    properties: dict[str, tuple[str, ...]] = field(default_factory=dict)
    date: str | None = None
    outline: bool = False


@dataclass
class _Block:
    text: str
    start: int  # 1-based file line
    end: int
    is_code: bool = False
    tokens: int = field(default=0)


def split_lines(text: str) -> list[str]:
    """A note's lines as chunk line numbers count them: CRLF, CR-only (old Mac) and LF all end a line.

    Readers that cite line numbers (read_note, the append path) split with this too, so they agree with search.
    Example: split_lines("a\rb\r\nc") -> ["a", "b", "c"]
    """
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def estimate_tokens(text: str) -> int:
    """Approximate model tokens: one per CJK character, Latin word and symbol."""
    return len(_CJK_RE.findall(text)) + len(_WORD_RE.findall(text)) + len(_SYMBOL_RE.findall(text))


def _as_str_list(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        items = re.split(r"[,\s]+", value) if "," in value or " " in value.strip() else [value]
    elif isinstance(value, (list, tuple, set)):
        items = [str(v) for v in value if v is not None]
    else:
        items = [str(value)]
    return tuple(dict.fromkeys(s.strip().lstrip("#").strip() for s in items if s and s.strip().lstrip("#").strip()))


def _as_pair(item: object) -> tuple:
    """A mapping node's (key, value) pair as is; a sequence node's item as a 1-tuple."""
    return item if isinstance(item, tuple) else (item,)


def _yaml_expansion_error(root: object) -> str | None:
    """Why a YAML node graph is too big once aliases are expanded (nodes, scalar characters), or None.

    Walks the graph once (iteratively, shared nodes memoized), so the check itself stays cheap on a bomb.
    """
    sizes: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()  # nodes whose children are being sized: meeting one again is a recursive alias
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, children_sized = stack.pop()
        value = getattr(node, "value", None)
        children = [] if isinstance(value, str) else [c for item in value for c in _as_pair(item)]
        if children_sized:
            on_path.discard(id(node))
            nodes, chars = 1, len(value) if isinstance(value, str) else 0
            for child in children:
                n, c = sizes[id(child)]
                nodes, chars = nodes + n, chars + c
            if nodes > MAX_FRONTMATTER_NODES or chars > MAX_FRONTMATTER_CHARS:
                return (
                    f"frontmatter expands to over {MAX_FRONTMATTER_NODES} YAML values or {MAX_FRONTMATTER_CHARS} "
                    "characters (anchors and aliases repeated); shorten it"
                )
            sizes[id(node)] = (nodes, chars)
            continue
        if id(node) in sizes:
            continue
        if id(node) in on_path:
            return "frontmatter has a recursive YAML alias (an anchor used inside itself)"
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children)
    return None


def parse_frontmatter(text: str) -> tuple[dict, int, str | None]:
    """Return (metadata, number of lines the frontmatter block spans, error or None).

    A block that is not valid YAML mapping is reported in `error` and treated as ordinary text (0 lines).
    """
    if not text.startswith("---"):
        return {}, 0, None
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return {}, 0, None
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            break
    else:
        return {}, 0, "frontmatter has no closing '---' line"
    import yaml

    loader = yaml.SafeLoader("\n".join(lines[1:i]))
    try:
        root = loader.get_single_node()
        # Checked on the node graph, before construction: anchors and aliases share nodes there, so an alias
        # bomb is still small; built into Python objects (and tags turned into strings) it is not.
        too_big = _yaml_expansion_error(root) if root is not None else None
        if too_big:
            return {}, 0, too_big
        meta = loader.construct_document(root) if root is not None else None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: a date such as 2024-13-45
        return {}, 0, f"frontmatter is not valid YAML ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    except RecursionError:
        return {}, 0, "frontmatter is nested too deeply to read"
    finally:
        loader.dispose()
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return {}, 0, "frontmatter is not a key: value mapping"
    return meta, i + 1, None


# ---- properties and dates -------------------------------------------------------------------------------------------


def _unwrap_ref(value: str) -> str:
    """A value that is one page reference ([[x]], [[x|label]], #[[x]], #x) as its page name, else as is."""
    m = _REF_VALUE_RE.fullmatch(value)
    return (m.group(1) or m.group(2)).strip() if m else value


def _scalar_strings(value: object, depth: int = 0) -> list[str]:
    """A YAML value as property strings: dates ISO, booleans "true"/"false", lists flattened, mappings skipped."""
    if value is None or isinstance(value, (dict, bytes)):
        return []
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, (dt.date, dt.time)):  # datetime is a date
        return [value.isoformat()]
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [s for v in items for s in _scalar_strings(v, depth + 1)] if depth < MAX_PROPERTY_DEPTH else []
    text = str(value).strip()
    return [_unwrap_ref(text)] if text else []


def frontmatter_properties(meta: Mapping[object, object]) -> dict[str, tuple[str, ...]]:
    """Frontmatter as properties: lower-cased keys, nested mappings as dotted keys, every value a string tuple.

    Example: frontmatter_properties({"Due": date(2026, 3, 2), "project": {"name": "Kestrel"}})
    -> {"due": ("2026-03-02",), "project.name": ("Kestrel",)}
    """
    acc: dict[str, dict[str, None]] = {}
    stack: list[tuple[str, Mapping[object, object], int]] = [("", meta, 0)]
    while stack:  # iterative: a deep mapping must not exhaust the call stack
        prefix, mapping, depth = stack.pop()
        for raw_key, value in mapping.items():
            key = prefix + str(raw_key).strip().lower()
            if isinstance(value, Mapping):
                if depth + 1 < MAX_PROPERTY_DEPTH:
                    stack.append((key + ".", value, depth + 1))
            else:
                acc.setdefault(key, {}).update(dict.fromkeys(_scalar_strings(value)))
    return {k: tuple(v) for k, v in acc.items()}


def _merge_properties(*sources: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """Union of property maps: keys in first-seen order, each key's values deduplicated in order; linear."""
    acc: dict[str, dict[str, None]] = {}
    for src in sources:
        for key, values in src.items():
            acc.setdefault(key, {}).update(dict.fromkeys(values))
    return {k: tuple(v) for k, v in acc.items()}


def parse_property_line(line: str) -> tuple[str, tuple[str, ...]] | None:
    """(lower-cased key, values) of a Logseq `key:: value` line (also as a bullet's text), or None.

    Comma-separated values become several (commas inside [[...]] do not split); [[x]], #[[x]] and #x become x.
    Example: parse_property_line("tags:: work, [[Data, Platform]], #ops") -> ("tags", ("work", "Data, Platform", "ops"))
    """
    m = _PROPERTY_RE.match(line)
    if m is None:
        return None
    key, raw = m.group(1).lower(), (m.group(2) or "").strip()
    if key in LOGSEQ_TEXT_KEYS:
        return key, (_unwrap_ref(raw),) if raw else ()
    items, depth, start = [], 0, 0
    for i, ch in enumerate(raw):  # split at commas outside [[...]], in one pass
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(raw[start:i])
            start = i + 1
    items.append(raw[start:])
    return key, tuple(dict.fromkeys(_unwrap_ref(s.strip()) for s in items if s.strip()))


def iso_date(value: str) -> str | None:
    """The date a text starts with, as YYYY-MM-DD: 2026-03-02 (or _ . / separators, a time may follow),
    2026年3月2日, "Mar 2nd, 2026" / "March 2, 2026" (Logseq's journal titles); None if none or not a real date."""
    value = _unwrap_ref(value.strip())
    if m := _ISO_DATE_RE.match(value):
        y, mo, d = int(m.group(1)), int(m.group(3)), int(m.group(4))
    elif m := _ZH_DATE_RE.match(value):
        y, mo, d = (int(g) for g in m.groups())
    elif m := _EN_DATE_RE.match(value):
        name = m.group(1).lower()
        mo = next((i + 1 for i, full in enumerate(_MONTH_NAMES) if full.startswith(name)), 0)  # 0: not a month
        y, d = int(m.group(3)), int(m.group(2))
    else:
        return None
    try:
        return dt.date(y, mo, d).isoformat()
    except ValueError:  # month 13, February 30, an unknown month name
        return None


def note_date(rel_path: str, properties: Mapping[str, Sequence[str]]) -> str | None:
    """A note's own date (ISO): a Logseq journal's or daily note's file name (journals/2026_03_02.md,
    2026-03-02.md, "2026-03-02 Monday.md"), else its first `date` property that reads as a date; else None."""
    stem = PurePosixPath(rel_path).stem
    if m := _ISO_DATE_RE.match(stem):
        if m.group(2) in "-_" and (day := iso_date(m.group(0).replace("_", "-"))):
            return day
    for key in DATE_KEYS:
        for value in properties.get(key, ()):
            if day := iso_date(value):
                return day
    return None


def logseq_page_name(stem: str) -> str:
    """The Logseq page name a pages/ file stem encodes: "___" (triple-lowbar format) and "%2F" are "/",
    other %XX escapes decoded. Example: logseq_page_name("Kestrel Project___Roadmap") -> "Kestrel Project/Roadmap"."""
    return urllib.parse.unquote(stem.replace("___", "/"))


def _fence_states(lines: Sequence[str]) -> list[int]:
    """Per line: 0 outside code, 1 a fence's opening line, 2 inside a fence or its closing line (loose rules)."""
    out: list[int] = []
    fence: str | None = None
    for line in lines:
        m = _LOOSE_FENCE_RE.match(line)
        run = (m.group(1) or m.group(2)) if m else ""
        if fence is None:
            fence = run or None
            out.append(1 if run else 0)
        else:
            out.append(2)
            if run and run[0] == fence[0] and len(run) >= len(fence) and line.strip().lstrip("-*+ \t") == run:
                fence = None
    return out


def code_fence_lines(lines: Sequence[str]) -> list[bool]:
    """For each line, whether it is part of a fenced code block (fence lines included), with fences allowed
    after indentation and a bullet as outlines and list items put them; an unclosed fence runs to the end."""
    return [state > 0 for state in _fence_states(lines)]


def _prose_lines(lines: list[str]) -> list[str]:
    """The lines outside fenced code blocks, by the chunker's fence rules (an unclosed fence runs to the end).

    Line by line on purpose: a regex over the whole note was quadratic on unclosed fences and long backtick runs.
    """
    out: list[str] = []
    fence: str | None = None
    for line in lines:
        m = _FENCE_RE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            else:
                out.append(line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
            fence = None
    return out


def heading_levels(text: str) -> tuple[int, ...]:
    """The levels of a note's ATX headings outside code, in order: its shape, which a translation keeps.

    Example: heading_levels("# A\n\n## B\n\n```\n# not a heading\n```\n## C\n") -> (1, 2, 2)
    """
    return tuple(h[0] for line in _prose_lines(split_lines(text)) if (h := _parse_heading(line)) is not None)


def _parse_heading(line: str) -> tuple[int, str] | None:
    """(level, title) of an ATX heading line ("## Title ##" -> (2, "Title")), or None; linear in the line."""
    body = line[:-1] if line.endswith("\n") else line
    m = _HEADING_OPEN_RE.match(body)
    if m is None or "\n" in body or len(body) == m.end():
        return None
    rest = body[m.end() :].strip(" \t")
    head = rest.rstrip("#")
    # A closing run of '#' counts only after whitespace that follows at least one title character.
    if head and head[-1] in " \t":
        rest = head
    return len(m.group(1)), rest.strip()


def _blocks(lines: list[str], first_line: int) -> list[_Block]:
    """Split section lines into paragraphs and fenced code blocks (kept whole), with file line numbers."""
    blocks: list[_Block] = []
    cur: list[str] = []
    cur_start = 0
    fence: str | None = None
    for offset, line in enumerate(lines):
        lineno = first_line + offset
        m = _FENCE_RE.match(line)
        if fence is None and m:
            if cur:
                blocks.append(_Block("\n".join(cur), cur_start, lineno - 1))
            cur, cur_start, fence = [line], lineno, m.group(1)
            continue
        if fence is not None:
            cur.append(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
                blocks.append(_Block("\n".join(cur), cur_start, lineno, is_code=True))
                cur, fence = [], None
            continue
        if not line.strip():
            if cur:
                blocks.append(_Block("\n".join(cur), cur_start, lineno - 1))
                cur = []
            continue
        if not cur:
            cur_start = lineno
        cur.append(line)
    if cur:
        blocks.append(_Block("\n".join(cur), cur_start, first_line + len(lines) - 1, is_code=fence is not None))
    for b in blocks:
        b.tokens = estimate_tokens(b.text)
    return blocks


def _split_block(block: _Block, limit: int) -> list[_Block]:
    """Split an oversize block: code and multi-line text at line ends, prose at sentence ends, then hard."""
    if block.tokens <= limit:
        return [block]
    lines = block.text.split("\n")
    if len(lines) > 1:
        pieces = [_Block(line, block.start + i, block.start + i, block.is_code) for i, line in enumerate(lines)]
    else:
        sentences = [s for s in _SENTENCE_END_RE.split(block.text) if s]
        if len(sentences) > 1:  # pieces keep their own spacing, so joining them with "" restores the text
            pieces = [_Block(s, block.start, block.end) for s in sentences]
        else:
            step = max(1, len(block.text) * limit // max(block.tokens, 1))
            pieces = [_Block(block.text[i : i + step], block.start, block.end) for i in range(0, len(block.text), step)]
    for p in pieces:
        p.tokens = estimate_tokens(p.text)
    out: list[_Block] = []
    for p in _pack(pieces, limit, joiner="\n" if len(lines) > 1 else ""):
        if p.tokens > limit and p.text != block.text:
            out.extend(_split_block(p, limit))
        else:
            out.append(_Block(p.text.strip(), p.start, p.end, p.is_code, p.tokens))
    return out


def _pack(blocks: list[_Block], limit: int, joiner: str = "\n\n") -> list[_Block]:
    """Greedily join consecutive blocks while the total stays within `limit` tokens."""
    out: list[_Block] = []
    for b in blocks:
        if out and out[-1].tokens + b.tokens <= limit:
            last = out[-1]
            out[-1] = _Block(last.text + joiner + b.text, last.start, b.end, last.is_code and b.is_code, last.tokens + b.tokens)
        else:
            out.append(_Block(b.text, b.start, b.end, b.is_code, b.tokens))
    return out


def _tail_for_overlap(text: str, overlap_tokens: int) -> str:
    """The last whole sentences of `text` that fit in `overlap_tokens` (empty if none fits)."""
    tail = ""
    sentences = [s for line in text.split("\n") for s in _SENTENCE_END_RE.split(line) if s.strip()]
    for s in reversed(sentences):
        candidate = s.strip() + (" " + tail if tail else "")
        if estimate_tokens(candidate) > overlap_tokens:
            break
        tail = candidate
    return tail


@dataclass
class _Section:
    path: tuple[str, ...]
    start: int
    lines: list[str]
    level: int = 0


def _sections(lines: list[str], first_line: int) -> list[_Section]:
    sections = [_Section((), first_line, [])]
    stack: list[tuple[int, str]] = []
    fence: str | None = None
    for offset, line in enumerate(lines):
        m = _FENCE_RE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
                fence = None
        h = _parse_heading(line) if fence is None and not m else None
        if h:
            level, title = h
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            sections.append(_Section(tuple(t for _, t in stack), first_line + offset, [line], level))
        else:
            sections[-1].lines.append(line)
    return sections


def list_headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(0-based line index, level, title) of every Markdown heading, skipping frontmatter and fenced code.

    The chunker's own heading parser, so appends and section reads agree with the heading paths search shows.
    """
    _, fm_lines, _ = parse_frontmatter("\n".join(lines))
    return [(sec.start - 1, sec.level, sec.path[-1]) for sec in _sections(lines[fm_lines:], fm_lines + 1)[1:]]


def find_sections(lines: list[str], title: str) -> list[tuple[int, int, int]]:
    """Every section whose heading text equals `title` (case-insensitive; a leading "## " is ignored), as
    (heading line index, end index exclusive: the next heading of the same or a higher level, level)."""
    wanted = re.sub(r"^#{1,6}\s+", "", title.strip()).lower()
    heads = list_headings(lines)
    out = []
    for i, level, text in heads:
        if text.lower() == wanted:
            end = next((j for j, lv, _ in heads if j > i and lv <= level), len(lines))
            out.append((i, end, level))
    return out


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


# ---- outlines (Logseq) ----------------------------------------------------------------------------------------------


def _indent_width(indent: str) -> int:
    return indent.count(" ") + TAB_COLUMNS * indent.count("\t")


def _looks_like_outline(body: Sequence[str], in_code: Sequence[bool]) -> bool:
    """Most non-empty lines are bullets or their indented continuations (page properties may come first), and
    no line is a Markdown heading: a note with headings and long lists is a Markdown note."""
    bullets = others = total = 0
    seen_bullet = False
    for line, code in zip(body, in_code):
        if not line.strip():
            continue
        if not code and _parse_heading(line):
            return False
        total += 1
        if not code and _BULLET_RE.match(line):
            bullets, seen_bullet = bullets + 1, True
        elif not (seen_bullet and (code or line[0] in " \t")) and not (not seen_bullet and _PROPERTY_RE.match(line)):
            others += 1
    return bullets >= OUTLINE_MIN_BULLETS and others <= (1 - OUTLINE_MIN_SHARE) * total


def _in_logseq_folder(rel_path: str) -> bool:
    parts = PurePosixPath(rel_path).parts
    return len(parts) > 1 and parts[-2] in LOGSEQ_FOLDERS


def is_outline(rel_path: str, text: str, logseq_graph: bool = False) -> bool:
    """Whether a note is chunked as an outline: any note in a pages/ or journals/ folder of a Logseq graph
    (`logseq_graph`: the vault root holds a logseq/ folder), else text whose lines are mostly bullets."""
    if logseq_graph and _in_logseq_folder(rel_path):
        return True
    lines = split_lines(text.lstrip("\ufeff"))
    _, fm_lines, _ = parse_frontmatter("\n".join(lines))
    body = lines[fm_lines:]
    return _looks_like_outline(body, code_fence_lines(body))


@dataclass
class _OBlock:
    """One outline block: a bullet with its continuation lines (property lines set apart)."""

    indent: int
    parent: int | None
    lines: list[tuple[int, str]] = field(default_factory=list)  # (file line, text), property lines left out
    props: dict[str, tuple[str, ...]] = field(default_factory=dict)
    label: str = ""
    tokens: int = 0


def _block_label(text: str) -> str:
    """A block's first line as a heading-path entry: bullet, heading marks and [[ ]] dropped, cut short."""
    label = _LABEL_REF_RE.sub(r"\1", text.strip().lstrip("-*+ \t").lstrip("#").strip())
    label = " ".join(label.split())
    return label if len(label) <= OUTLINE_PATH_BLOCK_CHARS else label[: OUTLINE_PATH_BLOCK_CHARS - 1].rstrip() + "…"


def _outline_blocks(body: list[str], first_line: int) -> list[_OBlock]:
    """Blocks in document order; block 0 holds the lines before the first bullet (page properties, text)."""
    blocks = [_OBlock(-1, None)]
    stack: list[int] = []  # open blocks, outermost first
    states = _fence_states(body)
    found: dict[int, list[dict[str, tuple[str, ...]]]] = defaultdict(list)  # block index -> its property lines
    for offset, line in enumerate(body):
        lineno = first_line + offset
        m = None if states[offset] == 2 else _BULLET_RE.match(line)  # a fence may open on a bullet's line
        if m:
            indent = _indent_width(m.group(1))
            while stack and blocks[stack[-1]].indent >= indent:
                stack.pop()
            blocks.append(_OBlock(indent, stack[-1] if stack else None))
            stack.append(len(blocks) - 1)
        block = blocks[-1]
        prop = None if states[offset] else parse_property_line(line)
        if prop:
            found[len(blocks) - 1].append({prop[0]: prop[1]})
        else:
            block.lines.append((lineno, line))
    for i, b in enumerate(blocks):
        b.props = _merge_properties(*found.get(i, ()))
        kept = [k for k, (_, t) in enumerate(b.lines) if t.strip()]
        b.lines = b.lines[kept[0] : kept[-1] + 1] if kept else []  # no blank lines at either end
        b.label = next((_block_label(t) for _, t in b.lines if t.strip()), "")
        b.tokens = estimate_tokens("\n".join(t for _, t in b.lines))
    return blocks


def _outline_path(blocks: list[_OBlock], i: int) -> tuple[str, ...]:
    labels = []
    p = blocks[i].parent
    while p is not None:
        labels.append(blocks[p].label)
        p = blocks[p].parent
    return tuple(x for x in reversed(labels) if x)[:OUTLINE_PATH_MAX_LEVELS]


@dataclass
class _Unit:
    path: tuple[str, ...]
    text: str  # raw lines, indentation kept (dedented once the chunk is complete)
    start: int
    end: int
    props: dict[str, tuple[str, ...]]
    tokens: int
    label_only: bool = False  # a parent's one short line, named in full by its children's heading paths


def _outline_units(blocks: list[_OBlock], limit: int) -> list[_Unit]:
    """A block's subtree as one unit while it fits `limit`; a bigger one gives its own lines (split at line and
    sentence ends when they alone are too long), then its children, whose paths name it."""
    n = len(blocks)
    last = list(range(n))  # each block's last descendant (descendants follow their block)
    subtree = [b.tokens for b in blocks]
    for i in range(n - 1, 0, -1):
        p = blocks[i].parent
        if p is not None:
            last[p], subtree[p] = max(last[p], last[i]), subtree[p] + subtree[i]
    units: list[_Unit] = []
    i = 0
    while i < n:
        b = blocks[i]
        whole = i > 0 and subtree[i] <= limit  # block 0 (before the first bullet) has no children
        members = blocks[i : last[i] + 1] if whole else [b]
        lines = [ln for m in members for ln in m.lines]
        if any(t.strip() for _, t in lines):
            path = _outline_path(blocks, i)
            props = _merge_properties(*(m.props for m in members)) if i else {}
            tokens = sum(m.tokens for m in members)
            if tokens <= limit:
                label_only = not whole and last[i] > i and len(lines) == 1 and not b.label.endswith("…")
                units.append(_Unit(path, "\n".join(t for _, t in lines), lines[0][0], lines[-1][0], props, tokens, label_only))
            else:
                pieces = [_Block(t, line, line, tokens=estimate_tokens(t)) for line, t in lines]
                split = [q for piece in pieces for q in _split_block(piece, limit)]
                for k, q in enumerate(_pack(split, limit, joiner="\n")):
                    units.append(_Unit(path, q.text, q.start, q.end, props if k == 0 else {}, q.tokens))
        i = last[i] + 1 if whole else i + 1
    return units


def _chunk_outline(blocks: list[_OBlock], limit: int) -> list[Chunk]:
    """Outline chunks: each unit joins the one before while they fit and it lies under that one's path, so a
    parent's line stays with its first children and a child never joins its parent's later siblings. A parent's
    short line left alone is dropped: its children's heading paths carry it, as section titles do."""
    merged: list[_Unit] = []
    for u in _outline_units(blocks, limit):
        prev = merged[-1] if merged else None
        fits = prev is not None and prev.tokens + u.tokens <= limit and not u.label_only  # a label opens a chunk
        if prev is not None and fits and u.path[: len(prev.path)] == prev.path:
            props = _merge_properties(prev.props, u.props)
            merged[-1] = _Unit(prev.path, prev.text + "\n" + u.text, prev.start, u.end, props, prev.tokens + u.tokens)
        else:
            merged.append(u)
    return [
        Chunk(textwrap.dedent(u.text).strip(), HEADING_SEP.join(u.path), u.start, u.end, u.props)
        for u in merged
        if not u.label_only  # its text lives on in the heading paths of the chunks after it
    ]


def chunk_note(
    text: str,
    fallback_title: str,
    chunk_tokens: int,
    overlap_tokens: int = 0,
    *,
    rel_path: str = "",
    logseq_graph: bool = False,
) -> ParsedNote:
    """Parse a note into metadata and heading-aware chunks of at most about `chunk_tokens` tokens.

    Sections split at Markdown headings (never inside fenced code); adjacent small sections merge up to the
    limit under their common heading path; long sections split at paragraphs, then sentences, then hard.
    With `overlap_tokens`, a split section's chunk starts with the previous chunk's last sentences.
    An outline (is_outline: `rel_path` and `logseq_graph` as there) is chunked at block boundaries instead,
    without overlap. `rel_path` also gives the note's date (note_date) and a Logseq page's title.
    """
    lines = split_lines(text.lstrip("\ufeff"))
    text = "\n".join(lines)
    meta, fm_lines, fm_error = parse_frontmatter(text)
    body = lines[fm_lines:]
    in_code = code_fence_lines(body)
    in_graph = logseq_graph and _in_logseq_folder(rel_path)
    outline = in_graph or _looks_like_outline(body, in_code)
    if outline:
        blocks = _outline_blocks(body, fm_lines + 1)
        page_props = [blocks[0].props] + ([blocks[1].props] if len(blocks) > 1 and not blocks[1].lines else [])
        block_props = [{k: v for k, v in b.props.items() if k not in LOGSEQ_BLOCK_KEYS} for b in blocks[1:]]
        line_props = _merge_properties(*page_props, *block_props)
        prose = "\n".join(line for line, code in zip(body, in_code) if not code)
    else:
        found = (parse_property_line(line) for line, code in zip(body, in_code) if not code and "::" in line)
        line_props = _merge_properties(*({p[0]: p[1]} for p in found if p and p[0] not in LOGSEQ_BLOCK_KEYS))
        prose = "\n".join(_prose_lines(body))
    properties = _merge_properties(frontmatter_properties(meta), line_props)
    sections = [] if outline else _sections(body, fm_lines + 1)
    title = str(meta.get("title") or "").strip() or next(iter(line_props.get("title", ())), "")
    if not title:  # the first level-1 heading (the section parser already skips fenced code)
        title = next((sec.path[0] for sec in sections if len(sec.path) == 1 and sec.lines[0].startswith("# ")), "")
    title = title or (logseq_page_name(fallback_title) if in_graph else fallback_title)
    tags = _as_str_list(meta.get("tags") or meta.get("tag"))
    prose = _INLINE_CODE_RE.sub("", prose)
    inline = tuple(m.group(1) for m in _INLINE_TAG_RE.finditer(prose))
    if outline:
        inline += tuple(m.group(1).strip() for m in _BRACKET_TAG_RE.finditer(prose))
    tags = tuple(dict.fromkeys(tags + line_props.get("tags", ()) + inline))
    aliases = _as_str_list(meta.get("aliases") or meta.get("alias"))
    aliases = tuple(dict.fromkeys(aliases + line_props.get("alias", ()) + line_props.get("aliases", ())))
    date = note_date(rel_path, properties)
    if outline:
        return ParsedNote(title, tags, aliases, tuple(_chunk_outline(blocks, chunk_tokens)), fm_error, properties, date, True)

    # Each section becomes packed pieces; then adjacent single-piece sections merge while they fit.
    units: list[tuple[tuple[str, ...], _Block, bool]] = []  # (heading path, block, whole section?)
    # With overlap (at most half a chunk), pack to the limit minus the overlap so that a chunk with its
    # carried-over tail stays within the limit.
    overlap_tokens = min(overlap_tokens, chunk_tokens // 2)
    body_limit = chunk_tokens - overlap_tokens
    for sec in sections:
        blocks = [b for b in _blocks(sec.lines, sec.start) if b.text.strip()]
        if not blocks or (len(blocks) == 1 and sec.path and _parse_heading(blocks[0].text)):
            continue  # an empty section or a heading alone: its title lives on in its children's paths
        pieces: list[_Block] = []
        for b in blocks:
            pieces.extend(_split_block(b, body_limit))
        packed = _pack(pieces, body_limit)
        if len(packed) > 1 and sec.path and _parse_heading(packed[0].text.strip()):
            packed = packed[1:]  # the heading line alone; it lives on in the chunks' heading path
        for i, p in enumerate(packed):
            if i and overlap_tokens:
                tail = _tail_for_overlap(packed[i - 1].text, overlap_tokens)
                if tail:
                    p = _Block(tail + "\n" + p.text, p.start, p.end, p.is_code, p.tokens + estimate_tokens(tail))
            units.append((sec.path, p, len(packed) == 1))

    merged: list[tuple[tuple[str, ...], _Block, bool]] = []
    for path, block, whole in units:
        if merged and whole and merged[-1][2] and merged[-1][1].tokens + block.tokens <= chunk_tokens:
            ppath, prev, _ = merged[-1]
            joined = _Block(prev.text + "\n\n" + block.text, prev.start, block.end, False, prev.tokens + block.tokens)
            merged[-1] = (_common_prefix(ppath, path), joined, True)
        else:
            merged.append((path, block, whole))
    chunks = tuple(Chunk(b.text, HEADING_SEP.join(path), b.start, b.end) for path, b, _ in merged)
    return ParsedNote(title, tags, aliases, chunks, fm_error, properties, date)


def chunk_context(title: str, heading_path: str) -> str:
    """The label a chunk is embedded and keyword-indexed with: note title, then heading path when it adds to it."""
    if not heading_path or heading_path == title:
        return title
    if heading_path.startswith(title + HEADING_SEP):
        return heading_path
    return title + HEADING_SEP + heading_path


def content_hash(*parts: str) -> str:
    """Stable short hash of text parts (chunk ids, embedding reuse keys); never fails, even on lone surrogates."""
    h = hashlib.blake2b(digest_size=10)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))  # a file name that is not UTF-8 arrives with surrogates
        h.update(b"\x00")
    return h.hexdigest()


def _jieba_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "second-brain-mcp"


class Tokenizer:
    """BM25 tokenizer for Chinese, English and mixed text; the same instance serves ingest and query.

    Chinese goes through jieba's cut_for_search with the vault's own terms (titles, aliases, tags) added to its
    dictionary; without jieba it falls back to CJK unigrams + bigrams. Latin text is lowercased words, and
    identifiers such as `backup-nightly.timer` are kept whole as well as split.
    """

    def __init__(self, use_jieba: bool = True) -> None:
        self._jieba = None
        self.user_terms: frozenset[str] = frozenset()
        self._pending_add: set[str] = set()  # dictionary changes not yet applied to jieba (see _sync_dictionary)
        self._pending_del: set[str] = set()
        if use_jieba:
            try:
                import jieba
            except ImportError:
                logger.warning("jieba is not installed; Chinese falls back to unigrams + bigrams (pip install jieba)")
            else:
                jieba.setLogLevel(logging.WARNING)  # its "Building prefix dict" lines must never reach stdout
                tk = jieba.Tokenizer()
                cache = _jieba_cache_dir()
                try:
                    cache.mkdir(parents=True, exist_ok=True)
                    tk.tmp_dir = str(cache)
                except OSError:
                    pass  # jieba then uses the temp folder
                self._jieba = tk
        self.signature = f"tok{TOKENIZER_VERSION}-{'jieba' if self._jieba else 'ngram'}-{content_hash(*sorted(STOPWORDS))}"

    @property
    def uses_jieba(self) -> bool:
        return self._jieba is not None

    def set_user_terms(self, terms: Iterable[str]) -> frozenset[str]:
        """Make the vault's own names single tokens; returns the terms whose treatment changed."""
        new = vault_terms(terms)
        changed = new ^ self.user_terms
        self._pending_add |= new - self.user_terms
        self._pending_add -= self.user_terms - new
        self._pending_del |= self.user_terms - new
        self.user_terms = new
        return changed

    def _sync_dictionary(self) -> None:
        """Apply dictionary changes lazily: loading jieba's dictionary costs ~0.7 s, and a no-change sync needs none."""
        if self._jieba is None or not (self._pending_add or self._pending_del):
            return
        for t in self._pending_del:
            if t not in self.user_terms:
                self._jieba.del_word(t)
        for t in self._pending_add:
            self._jieba.add_word(t, freq=USER_TERM_FREQ)
        self._pending_add, self._pending_del = set(), set()

    def _cjk_tokens(self, run: str) -> list[str]:
        if self._jieba is not None:
            self._sync_dictionary()
            out = []
            for t in self._jieba.cut_for_search(run, HMM=True):
                out.append(t)
                if t in self.user_terms and not _CJK_RUN_RE.fullmatch(t):
                    out.extend(_MIXED_PART_RE.findall(t))  # "云仓wms" also matches "云仓" and "wms"
            return out
        out: list[str] = []
        pos = 0
        for m in _CJK_RUN_RE.finditer(run):
            out.extend(_LATIN_WORD_RE.findall(run[pos : m.start()]))
            s = m.group(0)
            out.extend(s)
            out.extend(s[i : i + 2] for i in range(len(s) - 1))
            pos = m.end()
        out.extend(_LATIN_WORD_RE.findall(run[pos:]))
        return out

    def tokenize(self, text: str) -> list[str]:
        """Lowercased, normalized tokens with stopwords and punctuation removed."""
        norm = unicodedata.normalize("NFKC", text).lower()
        tokens = [m.group(0) for m in _COMPOUND_RE.finditer(norm)]
        for m in _RUN_RE.finditer(norm):
            run = m.group(0)
            if _CJK_RE.search(run):
                tokens.extend(self._cjk_tokens(run))
            else:
                tokens.append(run)
        return [t[:MAX_TOKEN_CHARS] for t in tokens if t not in STOPWORDS and (len(t) > 1 or t.isdigit() or _CJK_RE.match(t))]


def vault_terms(names: Iterable[str]) -> frozenset[str]:
    """Dictionary words from vault titles, aliases and tags: their runs of letters/digits/CJK that contain CJK.

    Example: vault_terms(["云仓WMS 项目", "Homelab"]) -> {"云仓wms", "项目"}
    """
    out = set()
    for name in names:
        for run in _RUN_RE.findall(unicodedata.normalize("NFKC", name).lower()):
            if USER_TERM_MIN_CHARS <= len(run) <= USER_TERM_MAX_CHARS and _CJK_RE.search(run):
                out.add(run)
    return frozenset(out)


def cjk_share(text: str) -> float:
    """How Chinese (or Japanese) `text` reads: CJK characters among its words, where each CJK character and each Latin
    word counts once; code (fenced blocks, `spans`) is left out while prose remains.

    Counting characters instead made a Chinese note full of commands read as English (a code line outweighs its
    caption), and a short English word as long as several Chinese words.
    Example: cjk_share("git reset --hard 和 --soft 有什么区别") -> 0.6
    """
    prose = _CODE_RE.sub(" ", text)
    if not _PROSE_RE.search(prose):
        prose = text
    cjk = len(_CJK_RE.findall(prose))
    words = cjk + len(_LATIN_LETTERS_RE.findall(prose))
    return cjk / words if words else 0.0
