"""A note's Markdown structure and its chunks: fenced code, headings and sections, heading-aware chunking with
overlap, and Logseq outlines chunked at block boundaries.

Over 500 lines for a reason: Markdown sections and Logseq outlines share the block packing (_pack, _split_block) and
one entry point, chunk_note; apart, each would import the other's private helpers.
Pure: strings in, records out. Imports: kb_frontmatter, kb_text.
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from kb_frontmatter import (
    PROPERTY_LINE_RE,
    as_str_list,
    frontmatter_properties,
    logseq_page_name,
    merge_properties,
    note_date,
    parse_frontmatter,
    parse_property_line,
)
from kb_text import CJK_CHARS, estimate_tokens, split_lines

logger = logging.getLogger(__name__)

# Bump when chunk boundaries, chunk text or what a note's record keeps change for the same input (3: outlines chunk at
# block boundaries; 4: a note's heading levels, its shape for the translation test; 5: a chunk's first line is where
# the sentences it carries over from the previous chunk start). A bump re-reads every note and reuses the vectors of
# unchanged text.
CHUNKER_VERSION = 5

# Separator between heading levels in a chunk's heading path.
HEADING_SEP = " > "

# Folders of a Logseq graph whose notes are outlines, and whose file names encode page names.
LOGSEQ_FOLDERS = ("pages", "journals")

# Logseq block properties that are structure, not data: kept on the chunk, not on the note.
LOGSEQ_BLOCK_KEYS = frozenset({"id", "collapsed"})

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

# ATX heading opener; the rest of the line is cut in _parse_heading (a lazy regex there was quadratic in spaces).
_HEADING_OPEN_RE = re.compile(r" {0,3}(#{1,6})[ \t]")

_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")

_INLINE_CODE_RE = re.compile(r"`[^`\n]*`")

_INLINE_TAG_RE = re.compile(
    r"(?<![\w&#/])#([A-Za-z0-9_\-/" + CJK_CHARS + r"]*[A-Za-z_" + CJK_CHARS + r"][A-Za-z0-9_\-/" + CJK_CHARS + r"]*)"
)

# Sentence ends: Chinese full stops always; Latin ones when followed by whitespace.
_SENTENCE_END_RE = re.compile(r"(?<=[。！？；…])|(?<=[.!?;])(?=\s)")

# A fence where outlines and list items put one too: after indentation and a bullet. A backtick fence's info
# string holds no backtick (so "```inline```" is not a fence).
_LOOSE_FENCE_RE = re.compile(r"[ \t]*+(?:[-*+][ \t]++)?(?:(`{3,}+)(?![^\n]*`)|(~{3,}+))")

# An outline bullet: indentation, a marker, then a space or the end of the line ("---" and "-x" are not bullets).
_BULLET_RE = re.compile(r"([ \t]*+)[-*+](?:[ \t]++|$)")

# Logseq's multi-word tag #[[...]] (a plain #tag is _INLINE_TAG_RE's).
_BRACKET_TAG_RE = re.compile(r"(?<![\w&#/])#\[\[([^\[\]\n]+)\]\]")

# [[x]] inside a heading-path label, shown as x.
_LABEL_REF_RE = re.compile(r"#?\[\[([^\[\]\n]+)\]\]")


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


def _tail_for_overlap(text: str, overlap_tokens: int) -> tuple[str, int]:
    """The last whole sentences of `text` that fit in `overlap_tokens` (empty if none fits), and the index of the line
    of `text` its first sentence comes from."""
    tail, first = "", 0
    sentences = [(s, i) for i, line in enumerate(text.split("\n")) for s in _SENTENCE_END_RE.split(line) if s.strip()]
    for s, i in reversed(sentences):
        candidate = s.strip() + (" " + tail if tail else "")
        if estimate_tokens(candidate) > overlap_tokens:
            break
        tail, first = candidate, i
    return tail, first


def _first_line_of(block: _Block, first: int, sec: _Section) -> int:
    """The file line where line `first` of a block's text comes from, its lines (each a file line or part of one)
    aligned in order from the block's first line; the block's first line if they cannot be. Where a line repeats
    (a `}` of code), the earliest place that fits: a chunk's line range must hold everything it shows."""
    at = block.start
    for i, line in enumerate(block.text.split("\n")):
        line = line.strip()
        if not line:
            continue
        while at <= block.end and line not in sec.lines[at - sec.start]:
            at += 1
        if at > block.end:
            return block.start
        if i >= first:
            return at
    return block.start


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
        elif not (seen_bullet and (code or line[0] in " \t")) and not (not seen_bullet and PROPERTY_LINE_RE.match(line)):
            others += 1
    return bullets >= OUTLINE_MIN_BULLETS and others <= (1 - OUTLINE_MIN_SHARE) * total


def _in_logseq_folder(rel_path: str) -> bool:
    parts = PurePosixPath(rel_path).parts
    return len(parts) > 1 and parts[-2] in LOGSEQ_FOLDERS


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
        b.props = merge_properties(*found.get(i, ()))
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
            props = merge_properties(*(m.props for m in members)) if i else {}
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
            props = merge_properties(prev.props, u.props)
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
    An outline (ParsedNote.outline: any note in a pages/ or journals/ folder of a Logseq graph when `logseq_graph`,
    else text whose lines are mostly bullets) is chunked at block boundaries instead,
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
        line_props = merge_properties(*page_props, *block_props)
        prose = "\n".join(line for line, code in zip(body, in_code) if not code)
    else:
        found = (parse_property_line(line) for line, code in zip(body, in_code) if not code and "::" in line)
        line_props = merge_properties(*({p[0]: p[1]} for p in found if p and p[0] not in LOGSEQ_BLOCK_KEYS))
        prose = "\n".join(_prose_lines(body))
    properties = merge_properties(frontmatter_properties(meta), line_props)
    sections = [] if outline else _sections(body, fm_lines + 1)
    title = str(meta.get("title") or "").strip() or next(iter(line_props.get("title", ())), "")
    if not title:  # the first level-1 heading (the section parser already skips fenced code)
        title = next((sec.path[0] for sec in sections if len(sec.path) == 1 and sec.lines[0].startswith("# ")), "")
    title = title or (logseq_page_name(fallback_title) if in_graph else fallback_title)
    tags = as_str_list(meta.get("tags") or meta.get("tag"))
    prose = _INLINE_CODE_RE.sub("", prose)
    inline = tuple(m.group(1) for m in _INLINE_TAG_RE.finditer(prose))
    if outline:
        inline += tuple(m.group(1).strip() for m in _BRACKET_TAG_RE.finditer(prose))
    tags = tuple(dict.fromkeys(tags + line_props.get("tags", ()) + inline))
    aliases = as_str_list(meta.get("aliases") or meta.get("alias"))
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
                prev = packed[i - 1]
                tail, first = _tail_for_overlap(prev.text, overlap_tokens)
                if tail:  # the chunk starts where its carried-over sentences do, so path:lines holds what it shows
                    start = _first_line_of(prev, first, sec)
                    p = _Block(tail + "\n" + p.text, start, p.end, p.is_code, p.tokens + estimate_tokens(tail))
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
