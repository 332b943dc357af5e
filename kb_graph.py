"""The vault's own structure for the tools: related notes (links, backlinks, nearest in meaning).

Imports: kb_config, kb_engine, kb_scan, kb_state, kb_text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kb_config import KBError
from kb_engine import Engine
from kb_scan import read_note_bytes
from kb_state import LinkRow, decode_note
from kb_text import split_lines

logger = logging.getLogger(__name__)

# Characters of a linking line shown as context.
LINE_CONTEXT_CHARS = 240
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
    return LinkHit(path, row.line, context, row.label or "", row.heading or "", bool(row.embed))


def related_notes(engine: Engine, path: str, limit: int, private: Any = None) -> Related:
    """Outgoing links and backlinks of `path` (with the line that links), its unresolved links, and the `limit`
    notes nearest in meaning (by the best cosine between its chunks and theirs). `private` (kb_filter.PrivateNotes,
    for a client that must not see private notes): a private `path` is answered as one not indexed, and no private
    note is listed (a link to one is left out, not shown as unresolved)."""
    view = engine.view
    rec = view.record(path)
    hidden: Callable[[str], bool] = (lambda p: private.covers(p, view.record(p))) if private is not None else (lambda p: False)
    if rec is not None and hidden(path):
        rec = None
    if rec is None or rec.skipped:
        why = f" (skipped: {rec.skipped})" if rec and rec.skipped else ""
        raise KBError(f"'{path}' is not an indexed note{why}; pass a path from search_my_knowledge_base or list_notes")
    graph = view.link_graph()
    chunk_ids = list(view.chunks_by_id(rec.chunks))
    line = _line_reader(engine)
    out = Related(path)
    outgoing = [(row, target) for row, target in graph.outgoing.get(path, []) if not (target and hidden(target))]
    for row, target in outgoing[: limit * 4]:
        hit = _hit(target or row.target, row, line(path, row.line))
        (out.outgoing if target else out.unresolved).append(hit)
    backlinks = [(src, row) for src, row in graph.backlinks.get(path, []) if not hidden(src)]
    for src, row in backlinks[: limit * 4]:
        out.backlinks.append(_hit(src, row, line(src, row.line)))
    out.nearest = _nearest(engine, path, chunk_ids, limit, out.notes, hidden)
    return out


def _nearest(
    engine: Engine, path: str, chunk_ids: list[str], limit: int, notes: list[str], hidden: Callable[[str], bool]
) -> list[tuple[str, float]]:
    if engine.model_error:
        notes.append(f"no notes nearest in meaning: semantic search is off ({engine.model_error})")
        return []
    vectors = engine.view.vectors_of(chunk_ids[:NEAREST_CHUNKS_PER_NOTE])
    if not vectors:
        notes.append("no notes nearest in meaning yet: this note's chunks are still being embedded")
        return []
    best: dict[str, float] = {}
    try:
        for vec in vectors.values():
            found = engine.view.nearest(vec, (limit + 1) * NEAREST_CHUNKS_PER_NOTE)
            path_of = engine.view.paths_of(cid for cid, _ in found)
            for cid, cos in found:
                other = path_of.get(cid)
                if other is not None and other != path and cos > best.get(other, -2.0) and not hidden(other):
                    best[other] = cos
    except KBError as e:
        notes.append(f"no notes nearest in meaning: {e}")
        return []
    return sorted(best.items(), key=lambda x: -x[1])[:limit]
