"""MCP server (stdio) over a Markdown vault: search, append-only write-back, note reading; and the --search self-test.

The MCP SDK's own stdio server answers the client as soon as the SDK is imported (about a second); the engine, jieba
and the model load in a background thread, in the order that gets a keyword answer soonest, and file events keep the
index fresh (kb_live). Logs go to stderr only: in stdio mode stdout is the protocol.

Imports: kb_config, kb_live; lazily: kb_engine, kb_graph, kb_http, kb_links, kb_scan, kb_search, kb_state, kb_text, kb_write.
"""

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated, Any

from kb_config import Config, KBError, add_common_args, load_cli_config, setup_logging
from kb_live import SYNC_WAIT_S, LiveIndex, load_model

logger = logging.getLogger("mcp_server")

# Offline always: never reach Hugging Face, never send telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "TOKENIZERS_PARALLELISM": "false",
}
# How long a mode="semantic" search waits for the model still loading at start-up (hybrid never waits: it answers
# with keywords and says semantic results join shortly).
MODEL_WAIT_S = 60.0
# Longest title shown per note in list_notes.
TITLE_CHARS = 80
# Characters of a file name or path quoted in an error message (names can be thousands of characters).
QUOTE_CHARS = 120
# Ending of a reply cut by the last-resort size guard.
CUT_MARK = "\n[cut to fit the response budget]"
# Said with keyword-only answers while the model loads after a start.
SEMANTIC_LOADING_NOTE = (
    "semantic results join shortly: the embedding model is still loading, so this answer is keyword search only "
    "(if nothing relevant was found, search again in a few seconds)"
)

INSTRUCTIONS = (
    "The user's personal Markdown notes (a 'second brain'), often in Chinese and English. Search them before "
    "answering questions about the user's own projects, decisions, people, plans or past work; cite the note path and "
    "lines. With each search pass `alternatives`: the question in the vault's other language, its key terms, the likely "
    "note title (index_status says which languages and folders the vault holds). Append to the notes only when the "
    "user asks you to remember or note something."
)


def fit(text: str, budget: int) -> str:
    """`text` cut to `budget` characters, saying so (the last-resort guard of the response budget)."""
    if len(text) <= budget:
        return text
    return text[: max(0, budget - len(CUT_MARK))] + CUT_MARK


def _quote(value: Any) -> str:
    text = str(value)
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + f"... ({len(text):,} characters)")


def os_error_message(e: OSError) -> str:
    """A tool error for an operating-system refusal: what failed, on which path, and what to pass instead."""
    where = f" for {_quote(e.filename)}" if e.filename else ""
    what = e.strerror or str(e) or type(e).__name__
    if e.errno == errno.ENAMETOOLONG:
        hint = "a name is longer than 255 bytes or the path longer than the system allows; pass a shorter path"
    elif e.errno in (errno.EACCES, errno.EPERM):
        hint = "the server may not read or write it; check the file's permissions"
    else:
        hint = "pass a note path from list_notes or search"
    return f"the file system refused the operation{where}: {what}; {hint}"


class KnowledgeBase(LiveIndex):
    """Everything behind the tools: the live index (kb_live: the engine, created in the background, and freshness)
    and the tools' logic."""

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
    ) -> tuple[str, dict]:
        from kb_scan import modified_cutoff

        modified_cutoff(modified_within_days)  # a bad value is a tool error before any work
        notes = self.ensure_fresh()
        mode = mode or self.cfg.search_mode
        if mode != "keyword" and not self._model_ready.is_set():
            if mode == "semantic":
                if not self._model_ready.wait(MODEL_WAIT_S):
                    raise KBError(
                        f"the embedding model is still loading after {MODEL_WAIT_S:.0f} s; try again shortly, or "
                        "search with mode='keyword'"
                    )
            else:
                mode = "keyword"
                notes.append(SEMANTIC_LOADING_NOTE)

        def run() -> Any:
            return self.searcher.search(
                query,
                alternatives=alternatives,
                top_k=top_k,
                mode=mode,
                path_prefix=path_prefix,
                tag=tag,
                modified_within_days=modified_within_days,
                where=where,
                date_from=date_from,
                date_to=date_to,
            )

        result = run()
        if self.apply_late_events(notes):
            result = run()
        stale = self._stale_hits(result)
        if stale:  # a hit's note changed after the events were taken: apply it and search again
            logger.info("re-checking %d hit notes changed on disk: %s", len(stale), stale[:3])
            if self._sync(self.engine, stale, notes):
                result = run()
        notes += result.notes
        self._after_search()
        return format_search(result, notes, self.cfg.max_response_chars)

    def append(self, path: str, content: str, heading: str | None, create_heading: bool) -> tuple[str, dict]:
        from kb_write import append_to_note

        self._engine()
        result = append_to_note(self.cfg, path, content, heading, create_heading)
        indexed = "and indexed"
        try:
            report = self._try_sync(SYNC_WAIT_S, [result.path])
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

    def _expand_embeds(self, norm: str) -> str:
        """The note with its ![[embeds]] replaced by the embedded notes or sections (depth-limited, cycle-safe)."""
        from kb_links import expand_embeds
        from kb_scan import read_note_bytes, resolve_inside
        from kb_state import decode_note

        self.ensure_fresh()
        resolver = self.engine.view.resolver()

        def read(rel: str) -> str | None:
            try:
                full, _ = resolve_inside(self.cfg, rel)
                return decode_note(read_note_bytes(full, self.cfg.max_file_bytes))[0]
            except (KBError, OSError, ValueError):
                return None

        return expand_embeds(norm, read, resolver)

    def read_note(self, path: str, heading: str | None, start_line: int, expand: bool = False) -> tuple[str, dict]:
        from kb_scan import read_note_bytes, resolve_inside
        from kb_state import decode_note
        from kb_text import split_lines

        self._engine()
        full, norm = resolve_inside(self.cfg, path)
        try:
            text, _ = decode_note(read_note_bytes(full, self.cfg.max_file_bytes))
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise KBError(f"cannot read '{norm}': {reason}; check the note with index_status (skipped files)") from e
        expanded = ""
        if expand:
            text, expanded = self._expand_embeds(norm), " (embeds expanded: line numbers count the expanded text)"
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
        header_room = len(norm) + len(repeat_note) + len(expanded) + 260 + 4 * widest
        budget = max(200, self.cfg.max_response_chars - header_room)
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
    ) -> tuple[str, dict]:
        from kb_filter import NoteFilter, note_day
        from kb_scan import modified_cutoff

        modified_cutoff(modified_within_days)  # a bad value is a tool error before any work
        self.ensure_fresh()
        view = self.engine.view
        flt = NoteFilter.of(path_prefix, None, modified_within_days, where, date_from, date_to, view.property_keys())
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
        room = self.cfg.max_response_chars - len(head) - 200  # 200: the "showing N" remark
        lines, items, used = [], [], 0
        for p, r in rows:
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.mtime_ns / 1e9))
            line = (
                f"{p} | {r.title[:TITLE_CHARS]} | {stamp}"
                + (f" | date {r.date}" if r.date else "")
                + (f" | skipped: {r.skipped}" if r.skipped else "")
            )
            if used + len(line) + 1 > room:
                break
            lines.append(line)
            items.append({"path": p, "title": r.title, "modified": stamp, "date": r.date or None, "tags": list(r.tags)})
            used += len(line) + 1
        if len(items) < len(rows):
            head += f"; showing {len(items)} (narrow with path_prefix, where or dates for the rest)"
        return head + ":\n" + "\n".join(lines), {"total": len(rows), "notes": items, "truncated": len(items) < len(rows)}

    def related(self, path: str, limit: int) -> tuple[str, dict]:
        from kb_graph import related_notes
        from kb_scan import resolve_inside

        _, norm = resolve_inside(self.cfg, path)
        self.ensure_fresh()
        rel = related_notes(self.engine, norm, limit)
        sections = [
            ("links from this note", [f"{h.path} (line {h.line}: {h.context})" for h in rel.outgoing[:limit]]),
            ("backlinks (notes linking here)", [f"{h.path}:{h.line} {h.context}" for h in rel.backlinks[:limit]]),
            ("nearest in meaning", [f"{p} (cosine {c:.2f})" for p, c in rel.nearest]),
            ("unresolved links", [f"[[{h.path}]] (line {h.line})" for h in rel.unresolved[:limit]]),
        ]
        parts = [f"Notes related to {norm}; open one with read_note", *rel.notes]
        used = sum(len(x) + 1 for x in parts)
        cut = False
        for title, rows in sections:
            if not rows:
                continue
            block = [f"\n{title} ({len(rows)}):"]
            for row in rows:
                if used + len(row) + 3 > self.cfg.max_response_chars - 200:
                    cut = True
                    break
                block.append(f"- {row}")
                used += len(row) + 3
            parts.extend(block)
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

    def status(self) -> tuple[str, dict]:
        self.ensure_fresh()
        engine = self._engine()
        rep = engine.last_report
        pending = engine.pending_vectors
        notes, chunks = engine.view.size()
        info = {
            "kb_dir": str(self.cfg.kb_dir),
            "index_dir": str(self.cfg.index_dir),
            "notes": notes,
            "chunks": chunks,
            "model": engine.embedder.name,
            "semantic_search": engine.model_error is None,
            "model_loading": not self._model_ready.is_set(),
            "model_error": engine.model_error,
            "sync_running": engine.syncing,
            "sync_progress": list(engine.progress) if engine.progress else None,
            "chunks_without_vector": pending or None,
            "last_sync": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(engine.last_sync_at)) if engine.last_sync_at else None,
            "last_sync_ms": round(rep.elapsed_ms, 1) if rep else None,
            "last_sync_summary": rep.summary() if rep else None,
            "change_detection": self.change_detection(),
            "sync_warning": engine.held_deletions,
            "freshness": dict(self.counts, file_events=self.changes.events if self.changes else 0),
            "writable": list(self.cfg.writable),
            "creatable": list(self.cfg.creatable),
        }
        skipped = engine.skipped_files()
        info["vault"] = engine.vault_profile()
        info["warning"] = engine.model_warning()
        lines = [f"{k}: {v}" for k, v in info.items() if v not in (None, [], {})]
        info["skipped_total"] = len(skipped)
        info["skipped_files"] = {}
        if skipped:
            room = self.cfg.max_response_chars - sum(len(x) + 1 for x in lines) - 300  # 300: the two remarks
            lines.append(f"skipped files ({len(skipped)}):")
            for p, why in skipped.items():
                line = f"  {p}: {why}"
                if len(line) + 1 > room:
                    break
                lines.append(line)
                info["skipped_files"][p] = why
                room -= len(line) + 1
            rest = len(skipped) - len(info["skipped_files"])
            if rest:
                lines.append(
                    f"  ... and {rest} more, cut to fit the response budget; list_notes (with a path_prefix) marks "
                    "every skipped note with its reason"
                )
        return "\n".join(lines), info


def _section_bounds(lines: list[str], heading: str, norm: str) -> tuple[int, int, str]:
    """1-based first and last line of the section under `heading`, and a note when the heading repeats."""
    from kb_text import find_sections, list_headings

    found = find_sections(lines, heading)
    if not found:
        names = ", ".join(t[:TITLE_CHARS] for _, _, t in list_headings(lines)[:30]) or "none"
        raise KBError(f"heading {_quote(heading.strip())} is not in '{norm}'; its headings are: {names}")
    start, end, _ = found[0]
    note = ""
    if len(found) > 1:
        others = ", ".join(str(i + 1) for i, _, _ in found[1:20])
        note = f" (the heading appears {len(found)} times; this is the first, others start at lines {others}: use start_line)"
    return start + 1, end, note


def format_search(result: Any, notes: list[str], budget: int) -> tuple[str, dict]:
    """Compact, citeable text for the model, plus the same as structured content; cut to the response budget."""
    structured: dict[str, Any] = {
        "query": result.query,
        "mode": result.mode,
        "abstained": result.abstained,
        "hits": [],
        "notes": notes,
        "truncated": False,
    }
    if result.abstained:
        text = (
            f'Nothing relevant in the notes for "{result.query}": no note passed the relevance threshold, so the '
            "notes do not seem to cover this. Say so rather than guess from them, or search again with other words "
            "(for example the terms the notes would use, or the other language)."
        )
        if result.closest:
            text += " Nearest notes, low confidence: " + ", ".join(result.closest) + "."
        structured["closest"] = result.closest
        structured["low_confidence"] = [h.as_dict() for h in result.low_confidence]
        parts = [text, *notes]
        if result.low_confidence:
            parts.append("Nearest passages (low confidence, probably not an answer; judge them yourself):")
            for i, h in enumerate(result.low_confidence, 1):
                parts.append(f"[{i}] {h.path}:{h.line_start}-{h.line_end} · {h.heading_path or h.title}\n{h.snippet}")
        return fit("\n".join(parts), budget), structured
    head = f'{len(result.hits)} hits for "{result.query}" ({result.mode}); cite as path:lines'
    if result.alternatives:
        head += "; also searched: " + "; ".join(f'[alternative {i}] "{a}"' for i, a in enumerate(result.alternatives, 1))
        structured["alternatives"] = result.alternatives
    parts = [head, *notes]
    used = sum(len(p) + 1 for p in parts)
    first_hit: dict[str, int] = {}  # note -> the number of its first hit
    for i, h in enumerate(result.hits, 1):
        first_hit.setdefault(h.path, i)
        scores = (
            f"fused {h.score:.4f}"
            + (f", keyword #{h.keyword_rank}" if h.keyword_rank else "")
            + (f", cosine {h.cosine:.2f}" if h.cosine is not None else "")
        )
        of = f" · translation of [{first_hit[h.translation_of]}]" if h.translation_of in first_hit else ""
        by = f" · found by {', '.join(h.found_by)}" if h.found_by else ""
        block = f"\n[{i}] {h.path}:{h.line_start}-{h.line_end} · {h.heading_path or h.title}{of} · {scores}{by}\n{h.snippet}"
        if used + len(block) > budget - 200:  # 200: the remark below
            structured["truncated"] = True
            parts.append(
                f"\n({len(result.hits) - i + 1} more hits cut to fit the response budget; lower top_k or narrow "
                "with path_prefix, and use read_note to open a hit)"
            )
            break
        parts.append(block)
        structured["hits"].append(h.as_dict())
        used += len(block)
    return fit("\n".join(parts), budget), structured


# ---- the MCP server -------------------------------------------------------------------------------------------


def build_server(kb: KnowledgeBase) -> Any:
    """The MCPServer with its five tools; every failure becomes a tool error the model can read.

    The SDK is imported here, not at module level, so `--search` and `--help` never pay for it. The knowledge base
    starts from the server's lifespan, i.e. once the SDK's stdio transport owns stdout (a stray print from any
    library loading in the background then lands on stderr, never in the protocol).
    (No `from __future__ import annotations` in this module, so the tool annotations below resolve to these names.)
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field

    from kb_scan import MAX_MODIFIED_WITHIN_DAYS
    from kb_search import MAX_ALTERNATIVE_CHARS, MAX_ALTERNATIVES

    @contextlib.asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[dict]:
        kb.start()
        yield {}

    server = MCPServer(name=kb.cfg.server_name, instructions=INSTRUCTIONS, log_level=kb.cfg.log_level, lifespan=lifespan)
    budget = kb.cfg.max_response_chars

    def run(fn: Any, *args: Any) -> CallToolResult:
        try:
            text, data = fn(*args)
        except KBError as e:
            raise ToolError(fit(str(e), budget)) from e
        except OSError as e:  # a path the operating system refuses (too long, no permission): the model can fix it
            raise ToolError(fit(os_error_message(e), budget)) from e
        except Exception as e:
            logger.exception("tool failed")
            raise ToolError(f"internal error ({type(e).__name__}: {e}); the server keeps running, see its log") from e
        return CallToolResult(content=[TextContent(type="text", text=fit(text, budget))], structured_content=data)

    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    where_field = Field(
        description='Only notes whose properties (frontmatter, Logseq key:: value) match, e.g. {"status": "active", '
        '"project": "Kestrel"}: exact on single values, membership on lists, case-insensitive'
    )
    date_from_field = Field(description="Only notes dated on or after this day (journal date, else last change), 2026-03-02")
    date_to_field = Field(description="Only notes dated on or before this day, e.g. 2026-03-08")
    days = Field(
        description=f"Only notes changed in the last N days (above 0, at most {MAX_MODIFIED_WITHIN_DAYS}), e.g. 7",
        gt=0,
        le=MAX_MODIFIED_WITHIN_DAYS,
    )

    @server.tool(annotations=read_only)
    def search_my_knowledge_base(
        query: Annotated[
            str,
            Field(
                description="What to look for: a question or keywords, any language. A [[Note name]] in it puts that "
                "note's best-matching passages first, e.g. '[[Homelab]] backup schedule'",
                min_length=1,
                max_length=2000,
            ),
        ],
        alternatives: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_ALTERNATIVE_CHARS)]] | None,
            Field(
                description=f"Up to {MAX_ALTERNATIVES} other ways to find the same notes (each at most "
                f"{MAX_ALTERNATIVE_CHARS} characters), searched with `query` and fused with it. Pass them: the question "
                "translated into the vault's other language (Chinese <-> English: a note may be written in either); the "
                "key terms or the likely note title as short keywords, in both languages; an exact command, setting, "
                "file or product name you expect the note to contain. Do not answer the question in them and add no "
                "facts you are unsure of. Example for '上次 NAS 停电以后发生了什么': ['what happened after the NAS "
                "power outage', 'NAS 停电 UPS', 'NAS power outage UPS shutdown']",
                max_length=MAX_ALTERNATIVES,
            ),
        ] = None,
        top_k: Annotated[int | None, Field(description="Hits to return (default from config, usually 5)", ge=1, le=50)] = None,
        path_prefix: Annotated[str | None, Field(description="Only notes under this folder, e.g. 'projects/'")] = None,
        mode: Annotated[
            str | None,
            Field(description="hybrid (default), keyword (exact names, ids) or semantic", pattern="^(hybrid|keyword|semantic)$"),
        ] = None,
        tag: Annotated[str | None, Field(description="Only notes with this tag, e.g. 'health'")] = None,
        modified_within_days: Annotated[float | None, days] = None,
        where: Annotated[dict[str, Any] | None, where_field] = None,
        date_from: Annotated[str | None, date_from_field] = None,
        date_to: Annotated[str | None, date_to_field] = None,
    ) -> CallToolResult:
        """Search the user's personal notes (Markdown vault; index_status says its languages and folders). Call it
        before answering anything about the user's own projects, decisions, people, plans, configs or past work, and
        cite hits as path:lines. Pass `alternatives` (the question in the other language, keywords, the likely name):
        they find notes the question's own words miss. Returns note path, heading, line range, a short snippet,
        scores and which strings found each hit; a note's translation is marked "translation of [n]". Says "Nothing
        relevant" when the notes do not cover the question, with the nearest passages marked low confidence. Use
        read_note to open a hit in full."""
        return run(kb.search, query, alternatives, top_k, path_prefix, mode, tag, modified_within_days, where, date_from, date_to)

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    )
    def update_knowledge_base(
        path: Annotated[str, Field(description="Note path relative to the vault, e.g. 'inbox.md'")],
        content: Annotated[str, Field(description="Markdown text to append", min_length=1)],
        heading: Annotated[str | None, Field(description="Append at the end of this section, e.g. 'TODO'")] = None,
        create_heading: Annotated[bool, Field(description="Add the heading at the end if the note lacks it")] = False,
    ) -> CallToolResult:
        """Append text to one of the user's notes when they ask to remember, note or save something ("记一下",
        "remember this", "add to my notes"). Append-only: never edits or deletes existing text. Only whitelisted notes
        (default: inbox.md); other paths are refused with the reason. The text is searchable right after."""
        return run(kb.append, path, content, heading, create_heading)

    @server.tool(annotations=read_only)
    def read_note(
        path: Annotated[str, Field(description="Note path relative to the vault, as returned by search")],
        heading: Annotated[str | None, Field(description="Only this section, e.g. 'Decisions'")] = None,
        start_line: Annotated[int, Field(description="Start at this line (to continue a cut read)", ge=1)] = 1,
        expand_embeds: Annotated[
            bool,
            Field(description="Replace ![[Note]] / ![[Note#Section]] embeds with the embedded text (3 levels, cycle-safe)"),
        ] = False,
    ) -> CallToolResult:
        """Read a note, or one section of it, with line numbers in the header. Long notes are cut to a size budget;
        the reply says which start_line continues."""
        return run(kb.read_note, path, heading, start_line, expand_embeds)

    @server.tool(annotations=read_only)
    def list_notes(
        path_prefix: Annotated[str | None, Field(description="Only notes under this folder, e.g. 'daily/'")] = None,
        modified_within_days: Annotated[float | None, days] = None,
        where: Annotated[dict[str, Any] | None, where_field] = None,
        date_from: Annotated[str | None, date_from_field] = None,
        date_to: Annotated[str | None, date_to_field] = None,
        sort: Annotated[
            str,
            Field(
                description="modified (last change, default) or date (a journal's own date first)", pattern="^(modified|date)$"
            ),
        ] = "modified",
    ) -> CallToolResult:
        """List notes (path | title | last modified | date), newest first, e.g. to see recent daily notes or every
        note of a project; filter by folder, properties (where) and dates."""
        return run(kb.list_notes, path_prefix, modified_within_days, where, date_from, date_to, sort)

    @server.tool(annotations=read_only)
    def related_notes(
        path: Annotated[str, Field(description="Note path relative to the vault, as returned by search")],
        limit: Annotated[int, Field(description="Entries per list (links, backlinks, nearest)", ge=1, le=50)] = 10,
    ) -> CallToolResult:
        """Walk the user's own note graph from one note: the notes it links to and the notes linking to it, each with
        the line that links (the context), its unresolved links, and the notes nearest in meaning."""
        return run(kb.related, path, limit)

    @server.tool(annotations=read_only)
    def index_status() -> CallToolResult:
        """Index health: notes and chunks indexed, last sync, model, running sync, how changes are detected, skipped
        files and why."""
        return run(kb.status)

    return server


def serve(cfg: Config) -> int:
    """Serve MCP over stdio (the SDK's own transport) until the client goes away, then exit at once."""
    kb = KnowledgeBase(cfg)
    server = build_server(kb)  # imports the SDK (~0.7 s); `initialize` is answered as soon as run() starts
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
    logger.info("client disconnected; shutting down")
    kb.shutdown()
    sys.stderr.flush()
    os._exit(0)  # daemon threads (model loading, file events) must not keep a client-less server alive


def serve_http_transport(cfg: Config, host: str, port: int) -> int:
    """Serve MCP over streamable HTTP (several sessions, one index) until interrupted; refuses without a token."""
    from kb_http import check_bind, configured_token, serve_http

    try:
        found = configured_token(cfg)
        check_bind(host, found[0] if found else None)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    kb = KnowledgeBase(cfg)
    server = build_server(kb)
    kb.start()  # index and model load now, not at the first session
    try:
        serve_http(server, cfg, host, port)
    except KeyboardInterrupt:
        pass
    kb.shutdown()
    return 0


# ---- the --search self-test ------------------------------------------------------------------------------------


def self_test(
    cfg: Config,
    query: str,
    top_k: int | None,
    mode: str | None,
    path_prefix: str | None,
    as_json: bool,
    alternatives: list[str] | None = None,
) -> int:
    """Run the same sync + search as the tool, without MCP, and print the hits."""
    from kb_engine import Engine
    from kb_search import Searcher

    t0 = time.perf_counter()
    engine = Engine(cfg)
    report = engine.sync_all()
    if engine.view_changed:
        engine.save_view()
    sync_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    if mode != "keyword":
        load_model(engine)  # timed apart: the search time below is what a warm server pays
    load_ms = (time.perf_counter() - t1) * 1000
    result = Searcher(engine).search(query, alternatives=alternatives, top_k=top_k, mode=mode, path_prefix=path_prefix)
    notes = list(result.notes)
    if engine.model_error:
        notes.append(f"semantic search is off: {engine.model_error}")
    if as_json:
        text, data = format_search(result, notes, 10**9)
        data.update(
            sync=report.summary(),
            sync_ms=round(sync_ms, 1),
            model_load_ms=round(load_ms, 1),
            search_ms=round(result.elapsed_ms, 1),
            notes_indexed=engine.view.size()[0],
            chunks_indexed=engine.view.size()[1],
        )
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0
    print(
        f"vault {cfg.kb_dir}: {engine.view.size()[0]} notes, {engine.view.size()[1]} chunks; sync {sync_ms:.0f} ms ({report.summary()})"
    )
    print(f"model load {load_ms:.0f} ms, search {result.elapsed_ms:.0f} ms\n")
    print(format_search(result, notes, 10**9)[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mcp_server.py",
        description="second-brain-mcp: serve your Markdown notes to MCP clients over stdio (default) or streamable "
        "HTTP with a bearer token, or run one search as a self-test with --search.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python mcp_server.py                          # stdio server (for claude mcp add)\n"
        '  python mcp_server.py --search "backup timer"  # self-test: sync + search, hits on stdout\n'
        "  python mcp_server.py --print-token             # create the token HTTP clients send\n"
        "  python mcp_server.py --transport http --port 8765   # http://127.0.0.1:8765/mcp",
    )
    add_common_args(parser)
    parser.add_argument("--search", metavar="QUERY", help="run one search (same sync + search as the tool) and exit")
    parser.add_argument("--top-k", type=int, help="hits for --search (default: search.top_k)")
    parser.add_argument(
        "--mode", choices=("hybrid", "keyword", "semantic"), help="search mode for --search (default: search.mode)"
    )
    parser.add_argument("--path-prefix", help="only notes under this folder, for --search")
    parser.add_argument(
        "--alt",
        action="append",
        metavar="TEXT",
        help="an alternative for --search (the question in the other language, keywords); repeat up to 4 times",
    )
    parser.add_argument("--json", action="store_true", help="print --search results as JSON")
    parser.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="stdio (default) or streamable HTTP at /mcp"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address for --transport http (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port for --transport http (default: 8765)")
    parser.add_argument(
        "--print-token", action="store_true", help="print the HTTP bearer token, creating it (mode 0600) on first use"
    )
    args = parser.parse_args(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    try:
        cfg = load_cli_config(args)
    except KBError as e:
        setup_logging(args.verbose, args.quiet)
        print(f"error: {e}", file=sys.stderr)
        return 1
    setup_logging(args.verbose, args.quiet, default="WARNING" if args.search or args.print_token else cfg.log_level)
    if args.print_token:
        from kb_http import create_token

        token, where = create_token(cfg)
        print(token)
        print(f"(stored in {where}; clients send it as 'Authorization: Bearer <token>')", file=sys.stderr)
        return 0
    if args.transport == "http" and args.search is None:
        return serve_http_transport(cfg, args.host, args.port)
    if args.search is None:
        return serve(cfg)
    try:
        return self_test(cfg, args.search, args.top_k, args.mode, args.path_prefix, args.json, args.alt)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
