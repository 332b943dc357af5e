"""The vault's own structure for the tools: related notes (links, backlinks, nearest in meaning), property filters
(`where`) and note dates (journal dates before file times).

Imports: kb_config, kb_engine, kb_scan, kb_state, kb_text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kb_config import KBError
from kb_engine import Engine
from kb_scan import read_note_bytes
from kb_state import FileRecord, LinkRow, decode_note
from kb_text import iso_date, split_lines

logger = logging.getLogger(__name__)

# Characters of a linking line shown as context.
LINE_CONTEXT_CHARS = 240
# Property keys named in a bad-filter error, at most.
KEYS_IN_ERROR = 40
# Nearest chunks looked at per related note wanted (several chunks of one note are merged into one entry).
NEAREST_CHUNKS_PER_NOTE = 6


@dataclass(frozen=True)
class LinkHit:
    """One end of a link: the other note, the line of the linking note and the link's label or anchor."""

    path: str
    line: int
    context: str  # the linking line, shortened
    label: str = ""
    heading: str = ""
    embed: bool = False


@dataclass
class Related:
    """What `related_notes` shows for one note."""

    path: str
    outgoing: list[LinkHit] = field(default_factory=list)
    backlinks: list[LinkHit] = field(default_factory=list)
    unresolved: list[LinkHit] = field(default_factory=list)
    nearest: list[tuple[str, float]] = field(default_factory=list)  # (note, best chunk cosine)
    notes: list[str] = field(default_factory=list)


def _line_reader(engine: Engine) -> Callable[[str, int], str]:
    """Line N of a note (1-based), each note read once per call of the returned function's owner."""
    cache: dict[str, list[str]] = {}

    def line(path: str, n: int) -> str:
        if path not in cache:
            try:
                text, _ = decode_note(read_note_bytes(engine.cfg.kb_dir / path, engine.cfg.max_file_bytes))
                cache[path] = split_lines(text)
            except (OSError, ValueError) as e:
                logger.debug("cannot read %s for link context: %s", path, e)
                cache[path] = []
        lines = cache[path]
        text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        return text if len(text) <= LINE_CONTEXT_CHARS else text[: LINE_CONTEXT_CHARS - 1] + "…"

    return line


def _hit(path: str, row: LinkRow, context: str) -> LinkHit:
    target, heading, _block, label, embed, line = row
    return LinkHit(path, line, context, label or "", heading or "", bool(embed))


def related_notes(engine: Engine, path: str, limit: int) -> Related:
    """Outgoing links and backlinks of `path` (with the line that links), its unresolved links, and the `limit`
    notes nearest in meaning (by the best cosine between its chunks and theirs)."""
    with engine.mutex:
        rec = engine.files.get(path)
        if rec is None or rec.skipped:
            why = f" (skipped: {rec.skipped})" if rec and rec.skipped else ""
            raise KBError(f"'{path}' is not an indexed note{why}; pass a path from search_my_knowledge_base or list_notes")
        graph = engine.view.link_graph()
        chunk_ids = [cid for cid in rec.chunks if cid in engine.chunks]
    line = _line_reader(engine)
    out = Related(path)
    for row, target in graph.outgoing.get(path, [])[: limit * 4]:
        hit = _hit(target or row[0], row, line(path, row[5]))
        (out.outgoing if target else out.unresolved).append(hit)
    for src, row in graph.backlinks.get(path, [])[: limit * 4]:
        out.backlinks.append(_hit(src, row, line(src, row[5])))
    out.nearest = _nearest(engine, path, chunk_ids, limit, out.notes)
    return out


def _nearest(engine: Engine, path: str, chunk_ids: list[str], limit: int, notes: list[str]) -> list[tuple[str, float]]:
    if engine.model_error:
        notes.append(f"no notes nearest in meaning: semantic search is off ({engine.model_error})")
        return []
    vectors = engine.vectors.get_vectors(chunk_ids[:NEAREST_CHUNKS_PER_NOTE])
    if not vectors:
        notes.append("no notes nearest in meaning yet: this note's chunks are still being embedded")
        return []
    best: dict[str, float] = {}
    try:
        for vec in vectors.values():
            for cid, cos in engine.vectors.query(vec, (limit + 1) * NEAREST_CHUNKS_PER_NOTE):
                c = engine.chunks.get(cid)
                if c is not None and c.path != path and cos > best.get(c.path, -2.0):
                    best[c.path] = cos
    except KBError as e:
        notes.append(f"no notes nearest in meaning: {e}")
        return []
    return sorted(best.items(), key=lambda x: -x[1])[:limit]


# ---- filters ----------------------------------------------------------------------------------------------------


def property_keys(files: Mapping[str, FileRecord]) -> list[str]:
    """Every property key some note has, sorted."""
    return sorted({k for r in files.values() for k in r.properties})


def check_where(where: Mapping[str, Any] | None, files: Mapping[str, FileRecord]) -> dict[str, set[str]] | None:
    """Validate a `where` filter into {lower-cased key: accepted values}. Raises KBError naming the valid keys.

    Values are compared as text ("3", "true", "2026-03-02"); a list value accepts any of its items.
    """
    if not where:
        return None
    known = set(property_keys(files))
    out: dict[str, set[str]] = {}
    for key, value in where.items():
        k = str(key).strip().lower()
        if k not in known:
            shown = ", ".join(sorted(known)[:KEYS_IN_ERROR]) or "none (no note has properties)"
            raise KBError(f"where: no note has the property '{key}'; the vault's property keys are: {shown}")
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) or v is None for v in values):
            raise KBError(f"where: '{key}' needs a text, number or boolean value, or a list of them (got {value!r})")
        out[k] = {_as_text(v) for v in values}
    return out


def _as_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def matches_where(rec: FileRecord, where: dict[str, set[str]]) -> bool:
    """Exact match on a single value, membership on a list; case-insensitive."""
    for key, wanted in where.items():
        have = {v.lower() for v in rec.properties.get(key, ())}
        if not have & {w.lower() for w in wanted}:
            return False
    return True


def check_date(name: str, value: str | None) -> str | None:
    """A `date_from`/`date_to` argument as an ISO date, or a KBError saying the form."""
    if value is None or not str(value).strip():
        return None
    day = iso_date(str(value).strip())
    if day is None:
        raise KBError(f"{name} must be a date like 2026-03-02 (got {value!r})")
    return day


def note_day(rec: FileRecord) -> str:
    """The note's date: a journal's or daily note's own date, else the day it was last modified (local time)."""
    return rec.date or time.strftime("%Y-%m-%d", time.localtime(rec.mtime_ns / 1e9))


def note_time(rec: FileRecord) -> float:
    """Seconds since the epoch for "modified within N days": a journal's date (its end of day), else its mtime."""
    if rec.date:
        try:
            return time.mktime(time.strptime(rec.date, "%Y-%m-%d")) + 86_399
        except (ValueError, OverflowError):
            pass
    return rec.mtime_ns / 1e9
