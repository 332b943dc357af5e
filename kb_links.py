"""Links between notes: wikilinks, Markdown links and embeds parsed from text, resolved to vault paths by Obsidian's
and Logseq's rules, and embeds expanded for reading. Pure: strings in, records out. Imports: kb_chunk, kb_config, kb_frontmatter, kb_text.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from kb_chunk import LOGSEQ_FOLDERS, code_fence_lines, find_sections
from kb_config import KBError
from kb_frontmatter import logseq_page_name, note_date, parse_frontmatter
from kb_text import split_lines

# Extensions a link target may carry and still name a note; `.md` is optional in every link.
NOTE_EXTENSIONS = (".md", ".markdown")
# A wikilink or embed to a file with one of these extensions names an attachment, not a note.
ATTACHMENT_EXTENSIONS = frozenset(
    "png jpg jpeg gif svg webp bmp avif heic tif tiff ico pdf mp3 mp4 m4a wav ogg flac webm mov mkv avi "
    "csv tsv xlsx xls docx doc pptx zip gz canvas base json yaml yml txt html".split()
)
# Embed levels expanded by default (a note's own embeds are level 1).
DEFAULT_EMBED_DEPTH = 3
# Characters embeds may add to one expansion; later embeds are left as they are, with a marker.
MAX_EXPANDED_CHARS = 1_000_000
# Month abbreviations of Logseq's default journal title ("Mar 2nd, 2026"), locale-independent.
MONTH_ABBR = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

LinkKind = Literal["wiki", "markdown"]

# One pass finds every link form; each alternative scans to the next bracket or parenthesis at most, and the
# quantifiers after a Markdown link's "](" are possessive, so a line costs linear time however hostile.
_LINK_RE = re.compile(
    r"\{\{embed[ \t]*+\[\[(?P<lq>[^\[\]\n]+)\]\][ \t]*+\}\}"  # Logseq {{embed [[page]]}}
    r"|(?P<wbang>!?)\[\[(?P<wiki>[^\[\]\n]+)\]\]"  # [[Note#Heading|label]], ![[embed]]
    r"|(?P<mbang>!?)\[(?P<label>[^\[\]\n]*)\]\([ \t]*+"  # [label](dest "title")
    r"(?:<(?P<adest>[^<>\n]*)>|(?P<dest>[^\s()<>]*+))(?:[ \t]++(?:\"[^\"\n]*\"|'[^'\n]*'))?[ \t]*+\)"
)
# A [[link]] (or ![[embed]]) in a search query.
_QUERY_LINK_RE = re.compile(r"!?\[\[([^\[\]\n]+)\]\]")
# A URL scheme (http:, mailto:, obsidian:, file:) or a protocol-relative //host: not a link to a note.
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:|//")
# A file extension in a Markdown link: a letter, then up to four letters or digits ("v1.2" has none).
_EXTENSION_RE = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,4}$")
_BACKTICKS_RE = re.compile(r"`+")
# A block id at the end of a line ("text ^id") or alone on a line.
_BLOCK_ID_RE = r"(?:^|\s)\^{}\s*$"


@dataclass(frozen=True)
class Link:
    """One link in a note. `target` is the note as written (URL-decoded for Markdown links, "" for a link into
    the same note); `heading` / `block` the anchor after "#" ("#^id" is a block); `line` is 1-based."""

    target: str
    heading: str | None
    block: str | None
    label: str | None
    embed: bool
    line: int
    kind: LinkKind


@dataclass(frozen=True)
class Resolution:
    """Where a link target leads: a vault-relative note path or None; `ambiguous` lists every note the name
    matched (shortest path first) when there were several, the chosen `path` among them."""

    path: str | None
    ambiguous: tuple[str, ...] = ()


def _mask_code_spans(line: str) -> str:
    """The line with inline code spans (`x`, ``x``) blanked out, columns kept; linear in the line.

    An opening run of backticks pairs with the next run of the same length, as CommonMark says; runs are
    looked up per length with a moving cursor, so unmatched runs cost nothing extra.
    """
    runs = [(m.start(), m.end()) for m in _BACKTICKS_RE.finditer(line)]
    by_len: dict[int, list[int]] = {}
    for idx, (s, e) in enumerate(runs):
        by_len.setdefault(e - s, []).append(idx)
    cursor = dict.fromkeys(by_len, 0)
    out, pos, i = [], 0, 0
    while i < len(runs):
        s, e = runs[i]
        same = by_len[e - s]
        while cursor[e - s] < len(same) and same[cursor[e - s]] <= i:
            cursor[e - s] += 1
        if cursor[e - s] == len(same):
            i += 1  # no closing run: literal backticks
            continue
        j = same[cursor[e - s]]
        close_end = runs[j][1]
        out.extend((line[pos:s], " " * (close_end - s)))
        pos, i = close_end, j + 1
    out.append(line[pos:])
    return "".join(out)


def _split_anchor(target: str) -> tuple[str, str | None, str | None]:
    """(name, heading, block) of "Note#Heading" / "Note#^block" / "Note"."""
    name, _, anchor = target.partition("#")
    anchor = anchor.strip()
    if anchor.startswith("^"):
        return name.strip(), None, anchor[1:].strip() or None
    return name.strip(), anchor or None, None


def _link_from_match(m: re.Match[str], line: int) -> Link | None:
    """The Link one _LINK_RE match stands for, or None (an attachment, a URL, an empty link)."""
    if m.group("lq") is not None:
        name, heading, block = _split_anchor(m.group("lq"))
        return Link(name, heading, block, None, True, line, "wiki") if name else None
    if m.group("wiki") is not None:
        inner, _, label = m.group("wiki").partition("|")
        name, heading, block = _split_anchor(inner.rstrip("\\"))  # "\|" is how a table cell escapes the bar
        ext = posixpath.splitext(name)[1][1:].lower()
        if (not name and not heading and not block) or ext in ATTACHMENT_EXTENSIONS:
            return None
        return Link(name, heading, block, label.strip() or None, bool(m.group("wbang")), line, "wiki")
    dest = m.group("adest") if m.group("adest") is not None else m.group("dest")
    if not dest or _SCHEME_RE.match(dest):
        return None
    path, _, anchor = dest.partition("#")
    path = urllib.parse.unquote(path)
    ext = _EXTENSION_RE.search(path)
    if ext and ext.group(0).lower() not in NOTE_EXTENSIONS:
        return None  # an image, a PDF, a source file: not a note
    name, heading, block = _split_anchor(path + ("#" + urllib.parse.unquote(anchor) if anchor else ""))
    if not name and not heading and not block:
        return None
    return Link(name, heading, block, m.group("label").strip() or None, bool(m.group("mbang")), line, "markdown")


def _line_links(line: str, lineno: int) -> list[tuple[re.Match[str], Link]]:
    masked = _mask_code_spans(line) if "`" in line else line
    found = ((m, _link_from_match(m, lineno)) for m in _LINK_RE.finditer(masked))
    return [(m, link) for m, link in found if link is not None]


def parse_links(text: str) -> list[Link]:
    """Every link to a note in `text`, in order: [[Note]], [[Note|label]], [[Note#Heading]], [[Note#^block]],
    ![[embed]], Logseq [[page]], #[[page]] and {{embed [[page]]}}, and [label](path/to/Note%20Name.md#heading).

    Links in fenced code and inline code, URLs (http:, mailto:, ...) and attachments (images, PDFs) are skipped.
    Example: parse_links("see [[Redis 缓存#集群|cache]]")
    -> [Link("Redis 缓存", "集群", None, "cache", False, 1, "wiki")]
    """
    lines = split_lines(text.lstrip("\ufeff"))
    in_code = code_fence_lines(lines)
    out: list[Link] = []
    for i, line in enumerate(lines):
        if not in_code[i] and "[" in line:
            out.extend(link for _, link in _line_links(line, i + 1))
    return out


def split_query_links(query: str) -> tuple[str, list[Link]]:
    """A search query's [[links]] (wiki form only) and the query with each written as its words.

    Example: split_query_links("rollback in [[库存同步方案#回滚|sync plan]]")
    -> ("rollback in sync plan", [Link("库存同步方案", "回滚", None, "sync plan", False, 1, "wiki")])
    """
    links: list[Link] = []

    def words(m: re.Match[str]) -> str:
        inner, _, label = m.group(1).partition("|")
        name, heading, block = _split_anchor(inner)
        if not name:
            return m.group(0)
        links.append(Link(name, heading, block, label.strip() or None, m.group(0).startswith("!"), 1, "wiki"))
        return label.strip() or " ".join(x for x in (name, heading) if x)

    return _QUERY_LINK_RE.sub(words, query), links


def _key(name: str) -> str:
    """Comparison form of a name or path: NFC (macOS stores NFD names), lower-cased, forward slashes."""
    return unicodedata.normalize("NFC", name).replace("\\", "/").strip().lower()


def _strip_note_ext(key: str) -> str:
    for ext in NOTE_EXTENSIONS:
        if key.endswith(ext):
            return key[: -len(ext)]
    return key


def journal_titles(day: str) -> tuple[str, ...]:
    """Page names a Logseq journal of ISO date `day` may be linked by: its default title format ("Mar 2nd, 2026")
    and the ISO-like ones ("2026-03-02", "2026/03/02", "2026_03_02", "2026年03月02日")."""
    y, m, d = (int(x) for x in day.split("-"))
    suffix = "th" if 11 <= d <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return (
        f"{MONTH_ABBR[m - 1]} {d}{suffix}, {y}",
        day,
        day.replace("-", "/"),
        day.replace("-", "_"),
        f"{y}年{m:02d}月{d:02d}日",
    )


class LinkResolver:
    """Resolves link targets to vault-relative note paths, by Obsidian's rules with Logseq's page names.

    Case-insensitive, `.md` optional. A target with a folder tries the linking note's folder, then the vault
    root, then any note whose path ends with it ("folder/Note" disambiguates); a bare name matches file names,
    then Logseq page names (pages/Kestrel___Roadmap.md is "Kestrel/Roadmap"), then aliases, then Logseq journal
    titles. Several matches: the one in the linking note's folder, else the shortest path, flagged ambiguous.
    Example: LinkResolver(["a/Note.md", "b/c/Note.md"]).resolve("Note", "x.md")
    -> Resolution("a/Note.md", ("a/Note.md", "b/c/Note.md"))
    """

    def __init__(self, paths: Iterable[str], aliases: Mapping[str, Iterable[str]] | None = None) -> None:
        ordered = sorted(set(paths), key=lambda p: (len(p), p))  # shortest path first: it wins a shared name
        self._paths: dict[str, str] = {}
        self._names: dict[str, list[str]] = {}
        self._aliases: dict[str, list[str]] = {}
        self._journals: dict[str, list[str]] = {}
        for path in ordered:
            key = _key(path)
            self._paths.setdefault(key, path)
            self._paths.setdefault(_strip_note_ext(key), path)
            folder, name = posixpath.split(key)
            stem = posixpath.splitext(name)[0]
            names = {stem, name}
            if posixpath.basename(folder) in LOGSEQ_FOLDERS:
                names.add(_key(logseq_page_name(posixpath.splitext(posixpath.basename(path))[0])))
                if posixpath.basename(folder) == "journals" and (day := note_date(path, {})):
                    for title in journal_titles(day):
                        self._journals.setdefault(_key(title), []).append(path)
            for n in names:
                self._names.setdefault(n, []).append(path)
        for path in ordered:  # aliases of paths not in `paths` are ignored
            for alias in (aliases or {}).get(path, ()):
                if alias.strip() and path not in self._aliases.setdefault(_key(alias), []):
                    self._aliases[_key(alias)].append(path)

    def ambiguous_names(self) -> dict[str, tuple[str, ...]]:
        """File names (lower-cased stems) shared by several notes, each with its notes, shortest path first."""
        return {n: tuple(ps) for n, ps in self._names.items() if len(ps) > 1 and "." not in n}

    def namesakes(self, path: str) -> tuple[str, ...]:
        """The other notes with `path`'s file name (in other folders), shortest path first."""
        stem = posixpath.splitext(posixpath.basename(_key(path)))[0]
        return tuple(p for p in self._names.get(stem, ()) if p != path)

    def _exact(self, key: str, seen: set[str]) -> str | None:
        seen.update((key, _strip_note_ext(key)))
        return self._paths.get(key) or self._paths.get(_strip_note_ext(key))

    def resolve(self, target: str, from_path: str = "", consulted: set[str] | None = None) -> Resolution:
        """The note `target` (a Link's target) leads to from the note at `from_path`; Resolution(None) if none.

        An empty target (a link into the linking note itself, "[[#Heading]]") resolves to `from_path`. `consulted`,
        if given, receives every key looked up: the answer can change only if one of them does (see changed_keys).
        """
        seen = consulted if consulted is not None else set()
        raw = target.strip().replace("\\", "/")
        if not raw:
            return Resolution(from_path or None)
        from_dir = posixpath.dirname(from_path)
        if raw.startswith(("./", "../")):  # explicitly relative: nothing else
            rel = posixpath.normpath(posixpath.join(from_dir, raw))
            if rel.startswith("../") or rel == "..":
                return Resolution(None)
            return Resolution(self._exact(_key(rel), seen))
        key = _key(raw.lstrip("/"))
        if "/" in key:
            rel = posixpath.normpath(posixpath.join(from_dir, key))
            hit = (None if rel.startswith("../") else self._exact(rel, seen)) or self._exact(key, seen)
            if hit:
                return Resolution(hit)
        seen.update((key, _strip_note_ext(key)))  # what names, aliases and journal titles are looked up by
        for table in (self._names, None, self._aliases, self._journals):
            if table is None:  # a partial path: notes whose path ends with it
                if "/" not in key:
                    continue
                tail = _strip_note_ext(key)
                seen.add(posixpath.basename(tail))
                candidates = [
                    p for p in self._names.get(posixpath.basename(tail), []) if _strip_note_ext(_key(p)).endswith("/" + tail)
                ]
            else:
                candidates = table.get(key) or table.get(_strip_note_ext(key)) or []
            if candidates:
                return _pick(candidates, from_dir)
        return Resolution(None)

    def changed_keys(self, other: LinkResolver) -> set[str]:
        """Keys that lead to other notes in `other` than here (a note came, went or changed its aliases)."""
        out: set[str] = set()
        for mine, theirs in (
            (self._paths, other._paths),
            (self._names, other._names),
            (self._aliases, other._aliases),
            (self._journals, other._journals),
        ):
            out.update(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        return out


def _pick(candidates: list[str], from_dir: str) -> Resolution:
    if len(candidates) == 1:
        return Resolution(candidates[0])
    here = [p for p in candidates if posixpath.dirname(p) == from_dir]
    return Resolution(here[0] if here else candidates[0], tuple(candidates))


def _excerpt(text: str, heading: str | None, block: str | None) -> str | None:
    """The part of a note an embed shows: the body without frontmatter, one section (its heading and the lines
    up to the next heading of the same or a higher level), or one block ("^id"); None if the anchor is missing."""
    lines = split_lines(text.lstrip("\ufeff"))
    if heading:
        found = find_sections(lines, heading.split("#")[-1])  # "H1#H2" names H2 under H1
        part = lines[found[0][0] : found[0][1]] if found else None
    elif block:
        part = _block_lines(lines, block)
    else:
        part = lines[parse_frontmatter("\n".join(lines))[1] :]
    if part is None:
        return None
    while part and not part[-1].strip():
        part = part[:-1]
    return "\n".join(part)


def _block_lines(lines: list[str], block: str) -> list[str] | None:
    """The lines of the block marked "^block": a list item with its deeper lines, or the paragraph it ends."""
    marker = re.compile(_BLOCK_ID_RE.format(re.escape(block)))
    at = next((i for i, line in enumerate(lines) if marker.search(line)), None)
    if at is None:
        return None
    if not marker.sub("", lines[at]).strip():  # "^id" on a line of its own marks the paragraph above
        end, at = at, at - 1
    else:
        end = at + 1
    item = re.match(r"([ \t]*)[-*+] ", lines[at]) if at >= 0 else None
    if item:
        width = len(item.group(1))
        while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) > width:
            end += 1
        start = at
    else:
        start = at
        while start > 0 and lines[start - 1].strip():
            start -= 1
    return [marker.sub("", line) for line in lines[max(start, 0) : end]]


def expand_embeds(
    path: str,
    read: Callable[[str], str | None],
    resolver: LinkResolver,
    max_depth: int = DEFAULT_EMBED_DEPTH,
    max_chars: int = MAX_EXPANDED_CHARS,
) -> str:
    """The note at `path` with each embed (![[Note]], ![[Note#Section]], ![[Note#^block]], ![](Note.md),
    {{embed [[page]]}}) replaced by the text it shows, embeds inside embeds too, `max_depth` levels deep.

    A cycle, a level past `max_depth`, a missing note or anchor, or more than `max_chars` added characters
    leave the embed as written (a cycle: only the marker) with a marker saying why, e.g.
    "(embed of Daily#Plan skipped: cycle)". `read(path)` returns a note's text or None; each note is read once.
    Raises KBError when `path` itself cannot be read.
    """
    cache: dict[str, str | None] = {}

    def load(p: str) -> str | None:
        if p not in cache:
            cache[p] = read(p)
        return cache[p]

    text = load(path)
    if text is None:
        raise KBError(f"cannot read {path!r} to expand its embeds; pass a note path that list_notes shows")
    budget = [max_chars]

    def embed(link: Link, raw: str, at: str, chain: tuple[str, ...], level: int) -> str:
        name = link.target + (f"#{link.heading}" if link.heading else "") + (f"#^{link.block}" if link.block else "")
        dest = resolver.resolve(link.target, at).path
        if dest is None:
            return f"{raw} (embed of {name} not found)"
        if dest in chain:
            return f"(embed of {name} skipped: cycle)"
        if level > max_depth:
            return f"{raw} (embed of {name} skipped: deeper than {max_depth} levels)"
        body = load(dest)
        part = None if body is None else _excerpt(body, link.heading, link.block)
        if part is None:
            return f"{raw} (embed of {name} not found: {'unreadable' if body is None else 'no such heading or block'})"
        if len(part) > budget[0]:
            return f"{raw} (embed of {name} skipped: embeds over {max_chars:,} characters)"
        budget[0] -= len(part)
        return expand(part, dest, (*chain, dest), level + 1)

    def expand(body: str, at: str, chain: tuple[str, ...], level: int) -> str:
        lines = split_lines(body)
        in_code = code_fence_lines(lines)
        out = []
        for i, line in enumerate(lines):
            pieces, pos = [], 0
            for m, link in [] if in_code[i] or "[" not in line else _line_links(line, i + 1):
                if link.embed:
                    pieces.extend((line[pos : m.start()], embed(link, line[m.start() : m.end()], at, chain, level)))
                    pos = m.end()
            out.append("".join(pieces) + line[pos:])
        return "\n".join(out)

    return expand(text, path, (path,), 1)
