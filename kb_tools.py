"""The tools' logic: search, append, read_note, list_notes, related_notes and index_status over the live index, each
returning the text the model reads and the same as structured content, within the response budget.

The transport (mcp_server: stdio or HTTP) only declares the tools and dispatches to KnowledgeBase. `private`, where a
tool takes it, is what a remote client without the notes:private scope must not see (None: the owner sees every note):
a private note is in no reply, and reading one answers as a missing note does.
Imports: kb_config, kb_live; lazily: kb_chunk, kb_filter, kb_frontmatter, kb_graph, kb_links, kb_scan, kb_search, kb_state,
kb_text, kb_vectors, kb_write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from kb_config import Config, KBError
from kb_live import SYNC_WAIT_S, LiveIndex

if TYPE_CHECKING:
    from kb_filter import PrivateNotes
    from kb_search import SearchResult
    from kb_vectors import Embedder

logger = logging.getLogger(__name__)

# Longest title shown per note in list_notes.
TITLE_CHARS = 80
# Characters of a file name or path quoted in an error message (names can be thousands of characters).
QUOTE_CHARS = 120
# Ending of a reply cut by the last-resort size guard.
CUT_MARK = "\n[cut to fit the response budget]"
# Room a reply that may be cut keeps for the remark saying so and how to get the rest (each is under 160 characters).
REMARK_ROOM = 200
# Room a search reply keeps for its first line's fixed words (the query and the alternatives are counted apart).
HEAD_ROOM = 200
# Characters of a search reply's listing (its entries and the tail of further notes): about a reply's length before
# the tail (1,857-1,912 characters on the three dev sets), which the tail fills with more distinct notes.
LISTING_CHARS = 1700
# Notes the tail always has room for: where the entries' snippets would fill the listing (long English passages),
# they are cut (the longest first, to no less than half the longest) so that the next note is still named.
TAIL_MIN_NOTES = 1
# The line that opens the tail.
TAIL_HEAD = "\nMore candidates (path:lines · heading), no snippet; read_note opens one:"
# Room read_note keeps for its header's fixed words (the longest: a cut line's notice plus the "call again" remark);
# the path, the section note and the line numbers are counted apart.
READ_HEADER_ROOM = 260


def fit(text: str, budget: int) -> str:
    """`text` cut to `budget` characters, saying so (the last-resort guard of the response budget)."""
    if len(text) <= budget:
        return text
    return text[: max(0, budget - len(CUT_MARK))] + CUT_MARK


class Budget:
    """What is left of the response budget while a reply is built, REMARK_ROOM kept back for the closing remark.

    Example: b = Budget(max_response_chars, head); rows = [r for r in rows if b.take(r)] keeps the rows that fit.
    """

    def __init__(self, total: int, *spent: str) -> None:
        self.left = total - REMARK_ROOM - sum(len(x) + 1 for x in spent)

    def take(self, text: str) -> bool:
        """Spend room for `text` and its newline if it fits; False (nothing spent) if it does not."""
        if len(text) + 1 > self.left:
            return False
        self.left -= len(text) + 1
        return True


def quote(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + f"... ({len(text):,} characters)")


class KnowledgeBase:
    """The tools' logic over a live index (kb_live: the engine, created in the background, and freshness); each tool
    returns (text for the model, structured content). The transport (mcp_server) only dispatches to these."""

    def __init__(self, cfg: Config, embedder: Embedder | None = None, live: LiveIndex | None = None) -> None:
        self.cfg = cfg
        self.live = live or LiveIndex(cfg, embedder)
        # How this session is served (shared or in-process, sessions attached), for index_status; set by mcp_server.
        self.serving: Callable[[], dict] = lambda: {"mode": "in-process"}

    def start(self) -> None:
        self.live.start()

    def shutdown(self) -> None:
        self.live.shutdown()

    # ---- tools ----------------------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        alternatives: list[str] | None = None,
        top_k: int | None = None,
        path_prefix: str | None = None,
        mode: str | None = None,
        tag: str | None = None,
        modified_within_days: float | None = None,
        where: dict[str, Any] | None = None,
        date_from: str | None = None,
        date_to: str | None = None,
        private: PrivateNotes | None = None,
    ) -> tuple[str, dict]:
        from kb_scan import modified_cutoff

        modified_cutoff(modified_within_days)  # a bad value is a tool error before any work
        live = self.live
        mode = mode or self.cfg.search_mode
        notes = live.ensure_fresh(ahead=(query, alternatives, mode))
        result = live.search(
            query,
            mode,
            notes,
            alternatives=alternatives,
            top_k=top_k,
            path_prefix=path_prefix,
            tag=tag,
            modified_within_days=modified_within_days,
            where=where,
            date_from=date_from,
            date_to=date_to,
            private=private,
        )
        notes += result.notes
        return format_search(result, notes, self.cfg.max_response_chars)

    def append(
        self, path: str, content: str, heading: str | None, create_heading: bool, private: PrivateNotes | None = None
    ) -> tuple[str, dict]:
        from kb_write import append_to_note

        self.live.ready_engine()
        if private is not None:
            self._refuse_private_append(path, private)
        result = append_to_note(self.cfg, path, content, heading, create_heading)
        indexed = "and indexed"
        try:
            report = self.live.try_sync(SYNC_WAIT_S, [result.path])
            if report is None:
                indexed = "but not yet indexed (a long indexing run is busy); the next search indexes it"
            elif report.lock_timeout:
                indexed = "but not yet indexed (another process held the index lock); the next search indexes it"
        except KBError as e:
            indexed = f"but not yet indexed ({e}); the next search indexes it"
        if result.duplicate:
            text = (
                f"Not appended again: the same text was already appended to {result.path} (lines "
                f"{result.line_start}-{result.line_end}) within the last {self.cfg.dedupe_window_s:.0f} s."
            )
        else:
            where = f" under '{result.heading}'" + (" (new heading)" if result.created_heading else "") if result.heading else ""
            text = (
                f"Appended {result.chars} characters to {result.path}{where}, lines {result.line_start}-{result.line_end}"
                f"{' (new note)' if result.created_note else ''}, {indexed}."
            )
        return text, asdict(result)

    def _refuse_private_append(self, path: str, private: PrivateNotes) -> None:
        """Refuse an append to a private note (by its path, or its properties) as to a note that is not there."""
        from kb_config import WriteRefusedError
        from kb_scan import read_note_bytes, resolve_inside
        from kb_state import decode_note

        full, norm = resolve_inside(self.cfg, path, must_exist=False)
        try:
            text = decode_note(read_note_bytes(full, self.cfg.max_file_bytes))[0]
        except (OSError, ValueError):
            text = ""  # a note not there yet: private by its path only
        if self._is_private(private, norm, text):
            raise WriteRefusedError(
                f"note '{norm}' does not exist and this client may not create it; append to an existing allowed note"
            )

    def _expand_embeds(self, norm: str, private: PrivateNotes | None = None) -> str:
        """The note with its ![[embeds]] replaced by the embedded notes or sections (depth-limited, cycle-safe); an
        embedded note `private` covers stays an unexpanded embed, as a missing one does."""
        from kb_links import expand_embeds
        from kb_scan import read_note_bytes, resolve_inside
        from kb_state import decode_note

        self.live.ensure_fresh()
        resolver = self.live.engine.view.resolver()

        def read(rel: str) -> str | None:
            try:
                full, norm_rel = resolve_inside(self.cfg, rel)
                text = decode_note(read_note_bytes(full, self.cfg.max_file_bytes))[0]
            except (KBError, OSError, ValueError):
                return None
            return None if self._is_private(private, norm_rel, text) else text

        return expand_embeds(norm, read, resolver)

    def _is_private(self, private: PrivateNotes | None, norm: str, text: str) -> bool:
        """Whether `private` covers the note at `norm` holding `text`: by its path, its indexed properties, or the
        frontmatter it has now (a note made private a moment ago, not indexed yet)."""
        if private is None:
            return False
        from kb_frontmatter import frontmatter_properties, parse_frontmatter
        from kb_state import FileRecord

        engine = self.live.engine  # read_note made it ready
        if private.covers(norm, engine.view.record(norm) if engine is not None else None):
            return True
        return private.covers(norm, FileRecord(0, 0, "", properties=frontmatter_properties(parse_frontmatter(text)[0])))

    def read_note(
        self, path: str, heading: str | None, start_line: int, expand: bool = False, private: PrivateNotes | None = None
    ) -> tuple[str, dict]:
        from kb_scan import missing_note_error, read_note_bytes, resolve_inside
        from kb_state import decode_note
        from kb_text import split_lines

        self.live.ready_engine()
        full, norm = resolve_inside(self.cfg, path)
        try:
            text, _ = decode_note(read_note_bytes(full, self.cfg.max_file_bytes))
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise KBError(f"cannot read '{norm}': {reason}; check the note with index_status (skipped files)") from e
        if self._is_private(private, norm, text):
            raise missing_note_error(self.cfg, norm)  # answered exactly as a note that is not there
        expanded = ""
        if expand:
            text, expanded = self._expand_embeds(norm, private), " (embeds expanded: line numbers count the expanded text)"
        lines = split_lines(text)  # as chunk line numbers count them, so cited lines match (CR-only notes too)
        if len(lines) > 1 and lines[-1] == "":
            lines.pop()  # the final newline ends the last line; it does not start an empty one
        first, last, repeat_note = 1, len(lines), ""
        if heading and heading.strip():
            first, last, repeat_note = _section_bounds(lines, heading, norm)
        if start_line > last:
            where = f"'{norm}' ({last} lines)"
            if heading and heading.strip():
                where = f"section '{heading.strip()}' of '{norm}' (lines {first}-{last})"
            raise KBError(f"start_line {start_line} is past the end of {where}; pass a start_line from {first} to {last}")
        first = max(first, start_line)
        # Room for the header (its longest form, numbers at their widest) and one cut-line notice.
        widest = len(str(len(lines) + 1))
        header_room = len(norm) + len(repeat_note) + len(expanded) + READ_HEADER_ROOM + 4 * widest
        budget = max(REMARK_ROOM, self.cfg.max_response_chars - header_room)
        out: list[str] = []
        used = 0
        end = first - 1
        cut_line: tuple[int, int, int] | None = None  # (line number, characters shown, characters in the line)
        for i in range(first - 1, last):
            line = lines[i]
            if used + len(line) + 1 > budget:
                if out:
                    break
                line = line[:budget]  # one line longer than the whole budget: show its start
                cut_line = (i + 1, len(line), len(lines[i]))
            out.append(line)
            used += len(line) + 1
            end = i + 1
            if cut_line:
                break
        body = "\n".join(out)
        header = f"{norm} lines {first}-{end} of {len(lines)}{repeat_note}{expanded}"
        if cut_line:
            n, shown, total = cut_line
            header += (
                f" (line {n} has {total:,} characters; only its first {shown:,} are shown: read_note pages by whole "
                "lines, search finds words in the rest)"
            )
        more = end < last
        if more:
            header += f" (cut to fit the response budget; call read_note again with start_line={end + 1} for the rest)"
        return f"{header}\n\n{body}", {
            "path": norm,
            "line_start": first,
            "line_end": end,
            "total_lines": len(lines),
            "truncated": more or cut_line is not None,
            "next_start_line": end + 1 if more else None,
            "line_cut": {"line": cut_line[0], "shown_chars": cut_line[1], "total_chars": cut_line[2]} if cut_line else None,
            "text": body,
        }

    def list_notes(
        self,
        path_prefix: str | None,
        modified_within_days: float | None,
        where: dict[str, Any] | None = None,
        date_from: str | None = None,
        date_to: str | None = None,
        sort: str = "modified",
        private: PrivateNotes | None = None,
    ) -> tuple[str, dict]:
        from kb_filter import NoteFilter, note_day
        from kb_scan import modified_cutoff

        modified_cutoff(modified_within_days)  # a bad value is a tool error before any work
        self.live.ensure_fresh()
        view = self.live.engine.view
        flt = NoteFilter.of(path_prefix, None, modified_within_days, where, date_from, date_to, view.property_keys(), private)
        rows = view.select(flt.accepts)
        prefix, since, props, first, last = flt.folder, flt.since, flt.where, flt.date_from, flt.date_to
        if sort == "date":
            rows.sort(key=lambda x: (note_day(x[1]), x[1].mtime_ns), reverse=True)
        else:
            rows.sort(key=lambda x: -x[1].mtime_ns)
        head = (
            f"{len(rows)} notes"
            + (f" under '{prefix}/'" if prefix else "")
            + (f" modified in the last {modified_within_days:g} days" if since is not None else "")
            + (f" matching {where}" if props else "")
            + (f" dated {first or '…'} to {last or '…'}" if first or last else "")
            + (", newest note date first" if sort == "date" else ", newest first")
        )
        budget = Budget(self.cfg.max_response_chars, head)
        lines, items = [], []
        for p, r in rows:
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.mtime_ns / 1e9))
            line = (
                f"{p} | {r.title[:TITLE_CHARS]} | {stamp}"
                + (f" | date {r.date}" if r.date else "")
                + (f" | skipped: {r.skipped}" if r.skipped else "")
            )
            if not budget.take(line):
                break
            lines.append(line)
            items.append({"path": p, "title": r.title, "modified": stamp, "date": r.date or None, "tags": list(r.tags)})
        if len(items) < len(rows):
            head += f"; showing {len(items)} (narrow with path_prefix, where or dates for the rest)"
        return head + ":\n" + "\n".join(lines), {"total": len(rows), "notes": items, "truncated": len(items) < len(rows)}

    def related(self, path: str, limit: int, private: PrivateNotes | None = None) -> tuple[str, dict]:
        from kb_graph import related_notes
        from kb_scan import missing_note_error, resolve_inside

        _, norm = resolve_inside(self.cfg, path)
        self.live.ensure_fresh()
        if private is not None and private.covers(norm, self.live.engine.view.record(norm)):
            raise missing_note_error(self.cfg, norm)  # answered exactly as a note that is not there
        rel = related_notes(self.live.engine, norm, limit, private)
        sections = [
            ("links from this note", [f"{h.path} (line {h.line}: {h.context})" for h in rel.outgoing[:limit]]),
            ("backlinks (notes linking here)", [f"{h.path}:{h.line} {h.context}" for h in rel.backlinks[:limit]]),
            ("nearest in meaning", [f"{p} (cosine {c:.2f})" for p, c in rel.nearest]),
            ("unresolved links", [f"[[{h.path}]] (line {h.line})" for h in rel.unresolved[:limit]]),
        ]
        parts = [f"Notes related to {norm}; open one with read_note", *rel.notes]
        budget = Budget(self.cfg.max_response_chars, *parts)
        cut = False
        for title, rows in sections:
            if not rows or not budget.take(f"\n{title} ({len(rows)}):"):
                cut = cut or bool(rows)
                continue
            parts.append(f"\n{title} ({len(rows)}):")
            for row in rows:
                if not budget.take(f"- {row}"):
                    cut = True
                    break
                parts.append(f"- {row}")
        if cut:
            parts.append("\n(cut to fit the response budget; lower limit for a shorter list)")
        data = {
            "path": norm,
            "outgoing": [asdict(h) for h in rel.outgoing[:limit]],
            "backlinks": [asdict(h) for h in rel.backlinks[:limit]],
            "nearest": [{"path": p, "cosine": round(c, 4)} for p, c in rel.nearest],
            "unresolved": [asdict(h) for h in rel.unresolved[:limit]],
            "notes": rel.notes,
            "truncated": cut,
        }
        return "\n".join(parts), data

    def status(self, private: PrivateNotes | None = None) -> tuple[str, dict]:
        self.live.ensure_fresh()
        if private is not None:
            return self._visible_status(private)
        engine = self.live.ready_engine()
        rep = engine.last_report
        engine.load_vectors()  # a server may not have them yet (the first answer needs the keyword view only)
        pending = engine.pending_vectors
        notes, chunks = engine.view.size()
        info = {
            "kb_dir": str(self.cfg.kb_dir),
            "index_dir": str(self.cfg.index_dir),
            "notes": notes,
            "chunks": chunks,
            "model": engine.embedder.name,
            "semantic_search": engine.model_error is None,
            "model_loading": not self.live.model_ready.is_set(),
            "model_error": engine.model_error,
            "sync_running": engine.syncing,
            "sync_progress": list(engine.progress) if engine.progress else None,
            "chunks_without_vector": pending or None,
            "semantic_coverage": {c.model: c.as_dict() for c in engine.coverage()} or None,  # chunks with each model's vector
            "indexing_seconds_left": round(left) if (left := engine.seconds_left()) is not None else None,
            "last_sync": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(engine.last_sync_at)) if engine.last_sync_at else None,
            "last_sync_ms": round(rep.elapsed_ms, 1) if rep else None,
            "last_sync_summary": rep.summary() if rep else None,
            "change_detection": self.live.change_detection(),
            "sync_warning": self.live.sync_error or engine.held_deletions,
            "freshness": dict(self.live.counts, file_events=self.live.changes.events if self.live.changes else 0),
            "writable": list(self.cfg.writable),
            "creatable": list(self.cfg.creatable),
            "serving": self.serving(),
        }
        skipped = engine.skipped_files()
        info["vault"] = engine.vault_profile()
        info["warning"] = engine.model_warning()
        lines = [f"{k}: {v}" for k, v in info.items() if v not in (None, [], {})]
        info["skipped_total"] = len(skipped)
        info["skipped_files"] = {}
        if skipped:
            lines.append(f"skipped files ({len(skipped)}):")
            budget = Budget(self.cfg.max_response_chars, *lines)
            for p, why in skipped.items():
                line = f"  {p}: {why}"
                if not budget.take(line):
                    break
                lines.append(line)
                info["skipped_files"][p] = why
            rest = len(skipped) - len(info["skipped_files"])
            if rest:
                lines.append(
                    f"  ... and {rest} more, cut to fit the response budget; list_notes (with a path_prefix) marks "
                    "every skipped note with its reason"
                )
        return "\n".join(lines), info

    def _visible_status(self, private: PrivateNotes) -> tuple[str, dict]:
        """index_status for a client that must not see private notes: counts over the notes it sees, without the
        index's internals that count every note (coverage, pending vectors, the last sync's counts, skipped files)."""
        from kb_filter import NoteFilter

        engine = self.live.ready_engine()
        visible = NoteFilter(private=private).accepts
        rows = engine.view.select(visible)
        info = {
            "notes": len(rows),
            "chunks": sum(len(r.chunks) for _, r in rows),
            "model": engine.embedder.name,
            "semantic_search": engine.model_error is None,
            "model_loading": not self.live.model_ready.is_set(),
            "sync_running": engine.syncing,
            "last_sync": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(engine.last_sync_at)) if engine.last_sync_at else None,
            "writable": [w for w in self.cfg.writable if not private.covers(w, engine.view.record(w))],  # by path or property
            "creatable": [c for c in self.cfg.creatable if not private.covers(c, None)],
            "vault": engine.vault_profile(visible=visible),
            "private_notes": "hidden: this client was not granted notes:private",
        }
        lines = [f"{k}: {v}" for k, v in info.items() if v not in (None, [], {})]
        return "\n".join(lines), info


def _section_bounds(lines: list[str], heading: str, norm: str) -> tuple[int, int, str]:
    """1-based first and last line of the section under `heading`, and a note when the heading repeats."""
    from kb_chunk import find_sections, list_headings

    found = find_sections(lines, heading)
    if not found:
        names = ", ".join(t[:TITLE_CHARS] for _, _, t in list_headings(lines)[:30]) or "none"
        raise KBError(f"heading {quote(heading.strip())} is not in '{norm}'; its headings are: {names}")
    start, end, _ = found[0]
    note = ""
    if len(found) > 1:
        others = ", ".join(str(i + 1) for i, _, _ in found[1:20])
        note = f" (the heading appears {len(found)} times; this is the first, others start at lines {others}: use start_line)"
    return start + 1, end, note


def format_search(result: SearchResult, notes: list[str], budget: int) -> tuple[str, dict]:
    """Compact, citeable text for the model, plus the same as structured content; cut to the response budget.

    One entry per note: `path:lines` (every matching passage, merged), heading, which strings found it, a snippet,
    and its translation on a numbered line of its own; then the tail, one line per further candidate note (and its
    translation), within LISTING_CHARS, which always keeps room for the tail's first TAIL_MIN_NOTES notes (the
    entries' snippets are cut for it). Below the relevance gate the same entries come under one sentence saying they
    are low confidence: the client judges.
    """
    structured: dict[str, Any] = {
        "query": result.query,
        "mode": result.mode,
        "abstained": result.abstained,
        "hits": [],
        "more": [],
        "notes": notes,
        "truncated": False,
    }
    count = len(result.hits) + len(result.more)
    if not count:
        text = (
            f'Nothing in the notes matches "{result.query}": no passage shares its words or meaning. Tell the user the '
            "notes do not cover it, or search again with other words (the terms a note would use, the other language)."
        )
        return fit("\n".join([text, *notes]), budget), structured
    alternatives = ""
    if result.alternatives:
        alternatives = "\nAlso searched: " + "; ".join(f'alt {i} "{a}"' for i, a in enumerate(result.alternatives, 1))
        structured["alternatives"] = result.alternatives
    room = Budget(budget, " " * HEAD_ROOM, result.query, alternatives, *notes)
    hits = _room_for_the_tail(result.hits, result.more)
    body: list[str] = []
    n = 0  # the number of the last path listed (a translation has its own, right after its note's)
    for h in hits:
        block = _entry(h, n + 1, True)
        if not room.take(block):
            break
        n += _numbers(h)
        body.append(block)
        structured["hits"].append(h.as_dict())
    # The tail: one line per further note, while the listing (less which strings found each entry) stays within
    # LISTING_CHARS (today's reply's length: more distinct notes in the same space) and the response budget.
    if len(body) == len(hits) and result.more:
        used = _listing_chars(hits)
        lines = []
        for h in result.more:
            line = _tail_line(h, n + 1)
            if used + len(line) + 1 > LISTING_CHARS or not room.take(line):
                break
            n += _numbers(h)
            used += len(line) + 1
            lines.append(line)
            structured["more"].append(h.as_dict())
        if lines:
            body += [TAIL_HEAD, *lines]
    mode = "" if result.mode == "hybrid" else f" ({result.mode})"  # the default goes unsaid; keyword-only is news
    if result.abstained:
        head = (
            f'Low confidence for "{result.query}"{mode}: no passage passed the relevance check, so the notes '
            "may not cover this. Use a note below (or its translation) only if it plainly answers; else say the notes do "
            "not cover it."
        )
    else:
        head = (
            f'{n} notes for "{result.query}"{mode}, best first. Judge which answer: often several do (the topic\'s '
            "note, a summary covering it, a translation, which answers as its note does); cite each path:lines."
        )
    if len(structured["hits"]) < len(result.hits):
        structured["truncated"] = True
        body.append(
            f"\n({len(result.hits) - len(structured['hits'])} more notes cut to fit the response budget; lower top_k or "
            "narrow with path_prefix, and use read_note to open a note)"
        )
    return fit("\n".join([head + alternatives, *notes, *body]), budget), structured


def _entry(h: Any, number: int, by: bool) -> str:
    """An entry of the reply: `[n] path:lines · heading · found by …`, its snippet, its translation's line."""
    found = f" · found by {', '.join(h.found_by)}" if by and h.found_by else ""
    return f"\n[{number}] {_where(h)}{_label(h)}{found}\n{h.snippet}{_also(h, number, True)}"


def _numbers(h: Any) -> int:
    """How many numbered paths a hit takes in the reply: its own, and its translation's."""
    return 2 if h.translation else 1


def _tail_line(h: Any, number: int) -> str:
    return f"[{number}] {_where(h)}{_label(h)}{_also(h, number, False)}"


def _listing_chars(hits: Sequence[Any]) -> int:
    """What the entries and the tail's heading take of LISTING_CHARS: which strings found each entry aside (the
    client's own strings, one label per entry, are not the listing's to pay for)."""
    n, used = 0, len(TAIL_HEAD) + 1
    for h in hits:
        used += len(_entry(h, n + 1, False)) + 1
        n += _numbers(h)
    return used


def _room_for_the_tail(hits: Sequence[Any], more: Sequence[Any]) -> list[Any]:
    """`hits` with their snippets cut, the longest first, to leave the listing room for the tail's first
    TAIL_MIN_NOTES notes; none below half the longest (then the tail gets what is left)."""
    hits = list(hits)
    if not more or not hits:
        return hits
    floor = max(len(h.snippet) for h in hits) // 2
    n = sum(_numbers(h) for h in hits)
    need = _listing_chars(hits) - LISTING_CHARS
    for h in more[:TAIL_MIN_NOTES]:
        need += len(_tail_line(h, n + 1)) + 1
        n += _numbers(h)
    sizes = sorted((len(h.snippet) for h in hits), reverse=True)
    if need <= 0 or sum(max(0, s - floor) for s in sizes) <= 0:
        return hits
    # The longest snippets come down to one width (never below floor) until `need` characters are freed.
    cap = sizes[0]
    while cap > floor and sum(max(0, s - cap) for s in sizes) < need:
        cap -= 1
    return [replace(h, snippet=_shorter(h.snippet, cap)) if len(h.snippet) > cap else h for h in hits]


def _shorter(snippet: str, chars: int) -> str:
    """`snippet` in at most `chars` characters, cut at a space near the end where there is one, ending in "…"."""
    cut = snippet[: chars - 1]
    space = cut.rfind(" ", len(cut) - 20)
    if space > chars // 2:
        cut = cut[:space]
    return cut.rstrip(" …") + "…"


def _lines(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{a}-{b}" if b != a else str(a) for a, b in ranges)


def _where(h: Any) -> str:
    """`path:34-57, 88-95` for a hit (its best passage's lines when it has no ranges)."""
    return f"{h.path}:{_lines(h.ranges or ((h.line_start, h.line_end),))}"


def _label(h: Any) -> str:
    """· the best passage's heading path, less the note's title (the path names the note); the title alone when it
    says more than the file name; else nothing."""
    parts = [p for p in h.heading_path.split(" > ") if p]
    if parts and parts[0] == h.title:
        parts = parts[1:]
    label = " > ".join(parts) or (h.title if h.title.casefold() != PurePosixPath(h.path).stem.casefold() else "")
    return f" · {label[:TITLE_CHARS]}" if label else ""


def _also(h: Any, number: int, lines: bool) -> str:
    """The entry's translation (the same text in the other language) on a line of its own after the entry, numbered
    as a path the client can pick like any other, but without a snippet of its own: on the entry's line, or under
    its number, a client picked the entry's path only (the gold holds both); its lines in an entry with a snippet."""
    if not h.translation:
        return ""
    where = f":{_lines(h.translation_ranges)}" if lines and h.translation_ranges else ""
    return f"\n[{number + 1}] {h.translation}{where} · translation of [{number}]"
