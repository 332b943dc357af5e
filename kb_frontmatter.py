"""Note metadata from text: YAML frontmatter (bounded against alias bombs and deep nesting), properties from
frontmatter and Logseq `key:: value` lines, and note dates (a journal's name, a `date` property).

Pure: strings in, records out. Imports: nothing from the project.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

logger = logging.getLogger(__name__)

# YAML nodes a frontmatter block may expand to, each alias counted at every use: more is an alias bomb.
MAX_FRONTMATTER_NODES = 10_000

# Characters of scalar text a frontmatter block may expand to, aliases counted at every use.
MAX_FRONTMATTER_CHARS = 200_000

# Deepest frontmatter mapping flattened into dotted property keys ("project.owner"); deeper levels are ignored.
MAX_PROPERTY_DEPTH = 8

# Property keys whose first date-like value is a note's date (after a daily-note or journal file name).
DATE_KEYS = ("date",)

# Logseq properties whose value is one text even when it holds commas.
LOGSEQ_TEXT_KEYS = frozenset({"title"})

# A Logseq (or Dataview) property line "key:: value", also as a bullet's text; "std::vector" is not one.
PROPERTY_LINE_RE = re.compile(r"[ \t]*+(?:[-*+][ \t]++)?([\w\-]++)::(?:[ \t](.*))?$")

# A whole value that is a page reference: [[x]], [[x|label]], #[[x]] or #x.
_REF_VALUE_RE = re.compile(r"#?\[\[([^\[\]|\n]+)(?:\|[^\[\]\n]*)?\]\]|#([^\s#\[\]]+)")

# Dates in file names and property values: 2026-03-02 (also _ . /), 2026年3月2日, Mar 2nd, 2026.
_ISO_DATE_RE = re.compile(r"(\d{4})([-_./])(\d{1,2})\2(\d{1,2})(?!\d)")

_ZH_DATE_RE = re.compile(r"(\d{4})年(\d{1,2})月(\d{1,2})日")

_EN_DATE_RE = re.compile(r"([A-Za-z]{3,9})\.? (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})(?!\d)")

_MONTH_NAMES = "january february march april may june july august september october november december".split()


def as_str_list(value: object) -> tuple[str, ...]:
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


def merge_properties(*sources: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
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
    m = PROPERTY_LINE_RE.match(line)
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
