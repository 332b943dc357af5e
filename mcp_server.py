"""MCP server (stdio) over a Markdown vault: search, append-only write-back, note reading; and the --search self-test.

Answers the client at once; imports the heavy libraries, syncs the index and loads the model in the background.
Logs go to stderr only: in stdio mode stdout is the protocol.
"""

import argparse
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from kb_config import Config, KBError, add_common_args, load_cli_config, setup_logging

logger = logging.getLogger("mcp_server")

# Offline always: never reach Hugging Face, never send Chroma telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "TOKENIZERS_PARALLELISM": "false",
}
# How long a search waits for a sync another thread is running (the startup sync) before answering from what is indexed.
SYNC_WAIT_S = 20.0
# On shutdown, how long to let a running sync finish its current batch before exiting.
SHUTDOWN_WAIT_S = 3.0
# Save this process's keyword view to disk at most this often (it is the next process's fast start).
SAVE_VIEW_DELAY_S = 10.0
# torch threads in the server. It embeds one short query at a time, where a second thread saves ~10 ms on an idle
# 2-core machine but, measured here, turned 15 ms into ~490 ms when the other core was busy (e.g. the client itself).
SERVER_TORCH_THREADS = 1
# Recorded MCP handshake answers (initialize, tools/list), replayed at start-up while the SDK imports.
HANDSHAKE_CACHE = "mcp-handshake.json"
# Packages whose version shapes those answers (the tool schemas come from pydantic).
HANDSHAKE_DEPENDENCIES = ("mcp", "mcp_types", "pydantic", "pydantic_core")
# Longest title shown per note in list_notes.
TITLE_CHARS = 80

INSTRUCTIONS = (
    "The user's personal Markdown notes (a 'second brain'). Search them before answering questions about the user's "
    "own projects, decisions, people, plans or past work; cite the note path and lines. Append to them only when the "
    "user asks you to remember or note something."
)


class KnowledgeBase:
    """Everything behind the tools: the engine (created in the background), freshness checks and the tools' logic."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.engine: Any = None
        self.searcher: Any = None
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
        self._last_check = 0.0
        self._save_timer: threading.Timer | None = None
        self._save_lock = threading.Lock()

    # ---- start-up -------------------------------------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._startup, name="kb-startup", daemon=True).start()

    def _startup(self) -> None:
        try:
            from ingest import Engine
            from kb_search import Searcher
            from kb_vectors import SentenceTransformerEmbedder

            cfg = self.cfg
            embedder = SentenceTransformerEmbedder(
                cfg.embed_model, cfg.embed_device, cfg.embed_batch_size, threads=SERVER_TORCH_THREADS
            )
            self.engine = Engine(cfg, embedder)
            self.searcher = Searcher(self.engine)
        except BaseException as e:  # reported by every tool call
            self._init_error = e
            logger.exception("start-up failed")
            return
        finally:
            self._ready.set()
        try:
            self.engine.sync_all()
            self._last_check = time.monotonic()
            if self.engine.view_changed:
                self._schedule_save()
        except Exception:
            logger.exception("start-up sync failed; the next search retries")
        with self.engine.mutex:
            self.engine.tokenizer.tokenize("预热 warm-up")  # jieba loads its dictionary lazily (~0.7 s): not in a search
        if self.engine.model_error is None:
            try:
                self.engine.embedder.load()  # so the first search does not pay for it
            except KBError as e:
                self.engine.model_error = str(e)
                logger.warning("%s", e)

    def _engine(self) -> Any:
        if not self._ready.wait(timeout=60):
            raise KBError("the index is still starting up; try again in a few seconds")
        if self._init_error is not None:
            raise KBError(f"the knowledge base could not start: {self._init_error}")
        return self.engine

    def _schedule_save(self) -> None:
        with self._save_lock:
            if self._save_timer is None or not self._save_timer.is_alive():
                self._save_timer = threading.Timer(SAVE_VIEW_DELAY_S, self._save_view)
                self._save_timer.daemon = True
                self._save_timer.start()

    def _save_view(self) -> None:
        try:
            self.engine.save_view()
        except Exception:
            logger.exception("could not save the keyword index cache (harmless: the next start rebuilds it)")

    def ensure_fresh(self) -> list[str]:
        """The cheap stale check before a search: one stat walk, applying any change. Returns notes for the reply."""
        engine = self._engine()
        notes: list[str] = []
        if time.monotonic() - self._last_check < self.cfg.check_interval_s:
            return notes
        try:
            report = engine.try_sync(SYNC_WAIT_S)
        except KBError as e:
            notes.append(f"the index could not be refreshed ({e}); results may miss recent edits")
            return notes
        self._last_check = time.monotonic()
        if report is None:
            done = engine.progress
            notes.append(
                "indexing is still running"
                + (f" ({done[0]}/{done[1]} chunks)" if done else "")
                + "; results cover what is indexed so far"
            )
        elif engine.view_changed:
            self._schedule_save()
        if engine.model_error:
            notes.append(f"semantic search is off: {engine.model_error}")
        return notes

    # ---- tools ----------------------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        top_k: int | None = None,
        path_prefix: str | None = None,
        mode: str | None = None,
        tag: str | None = None,
        modified_within_days: float | None = None,
    ) -> tuple[str, dict]:
        notes = self.ensure_fresh()
        result = self.searcher.search(
            query, top_k=top_k, mode=mode, path_prefix=path_prefix, tag=tag, modified_within_days=modified_within_days
        )
        notes += result.notes
        return format_search(result, notes, self.cfg.max_response_chars)

    def append(self, path: str, content: str, heading: str | None, create_heading: bool) -> tuple[str, dict]:
        from kb_write import append_to_note

        engine = self._engine()
        result = append_to_note(self.cfg, path, content, heading, create_heading)
        indexed = "and indexed"
        try:
            if engine.try_sync(SYNC_WAIT_S, [result.path]) is None:
                indexed = "but not yet indexed (a long indexing run is busy); the next search indexes it"
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

    def read_note(self, path: str, heading: str | None, start_line: int) -> tuple[str, dict]:
        from kb_scan import resolve_inside
        from kb_state import decode_note

        self._engine()
        full, norm = resolve_inside(self.cfg, path)
        try:
            text, _ = decode_note(full.read_bytes())
        except (OSError, ValueError) as e:
            raise KBError(f"cannot read '{norm}': {e}") from e
        lines = text.replace("\r\n", "\n").split("\n")
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
        budget = self.cfg.max_response_chars
        out: list[str] = []
        used = 0
        end = first - 1
        for i in range(first - 1, last):
            if used + len(lines[i]) + 1 > budget and out:
                break
            out.append(lines[i])
            used += len(lines[i]) + 1
            end = i + 1
        body = "\n".join(out)
        header = f"{norm} lines {first}-{end} of {len(lines)}{repeat_note}"
        more = end < last
        if more:
            header += f" (cut to fit the response budget; call read_note again with start_line={end + 1} for the rest)"
        return f"{header}\n\n{body}", {
            "path": norm,
            "line_start": first,
            "line_end": end,
            "total_lines": len(lines),
            "truncated": more,
            "next_start_line": end + 1 if more else None,
            "text": body,
        }

    def list_notes(self, path_prefix: str | None, modified_within_days: float | None) -> tuple[str, dict]:
        self.ensure_fresh()
        engine = self.engine
        prefix = (path_prefix or "").strip().replace("\\", "/").strip("/")
        since = time.time() - modified_within_days * 86400 if modified_within_days is not None else None
        with engine.mutex:
            rows = [
                (p, r)
                for p, r in engine.files.items()
                if (not prefix or p == prefix or p.startswith(prefix + "/")) and (since is None or r.mtime_ns / 1e9 >= since)
            ]
        rows.sort(key=lambda x: -x[1].mtime_ns)
        lines, items, used = [], [], 0
        for p, r in rows:
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.mtime_ns / 1e9))
            line = f"{p} | {r.title[:TITLE_CHARS]} | {stamp}" + (f" | skipped: {r.skipped}" if r.skipped else "")
            if used + len(line) + 1 > self.cfg.max_response_chars - 200:
                break
            lines.append(line)
            items.append({"path": p, "title": r.title, "modified": stamp, "tags": list(r.tags)})
            used += len(line) + 1
        head = (
            f"{len(rows)} notes"
            + (f" under '{prefix}/'" if prefix else "")
            + (f" modified in the last {modified_within_days:g} days" if since is not None else "")
            + ", newest first"
        )
        if len(items) < len(rows):
            head += f"; showing {len(items)} (narrow with path_prefix or modified_within_days for the rest)"
        return head + ":\n" + "\n".join(lines), {"total": len(rows), "notes": items, "truncated": len(items) < len(rows)}

    def status(self) -> tuple[str, dict]:
        self.ensure_fresh()
        engine = self._engine()
        rep = engine.last_report
        with engine.mutex:
            info = {
                "kb_dir": str(self.cfg.kb_dir),
                "index_dir": str(self.cfg.index_dir),
                "notes": len(engine.files),
                "chunks": len(engine.chunks),
                "model": engine.embedder.name,
                "semantic_search": engine.model_error is None,
                "model_error": engine.model_error,
                "sync_running": engine.syncing,
                "sync_progress": list(engine.progress) if engine.progress else None,
                "last_sync": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(engine.last_sync_at))
                if engine.last_sync_at
                else None,
                "last_sync_ms": round(rep.elapsed_ms, 1) if rep else None,
                "last_sync_summary": rep.summary() if rep else None,
                "skipped_files": engine.skipped_files(),
                "writable": list(self.cfg.writable),
                "creatable": list(self.cfg.creatable),
            }
        warning = engine.model_warning()
        info["warning"] = warning
        lines = [f"{k}: {v}" for k, v in info.items() if k != "skipped_files" and v not in (None, [], {})]
        skipped = info["skipped_files"]
        if skipped:
            lines.append(f"skipped files ({len(skipped)}):")
            lines += [f"  {p}: {why}" for p, why in list(skipped.items())[:50]]
        return "\n".join(lines), info


def _section_bounds(lines: list[str], heading: str, norm: str) -> tuple[int, int, str]:
    """1-based first and last line of the section under `heading`, and a note when the heading repeats."""
    from kb_text import find_sections, list_headings

    found = find_sections(lines, heading)
    if not found:
        names = ", ".join(t for _, _, t in list_headings(lines)[:30]) or "none"
        raise KBError(f"heading '{heading.strip()}' is not in '{norm}'; its headings are: {names}")
    start, end, _ = found[0]
    note = ""
    if len(found) > 1:
        others = ", ".join(str(i + 1) for i, _, _ in found[1:])
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
        return "\n".join([text, *notes]), structured
    head = f'{len(result.hits)} hits for "{result.query}" ({result.mode}); cite as path:lines'
    parts = [head, *notes]
    used = sum(len(p) + 1 for p in parts)
    for i, h in enumerate(result.hits, 1):
        scores = (
            f"fused {h.score:.4f}"
            + (f", keyword #{h.keyword_rank}" if h.keyword_rank else "")
            + (f", cosine {h.cosine:.2f}" if h.cosine is not None else "")
        )
        block = f"\n[{i}] {h.path}:{h.line_start}-{h.line_end} · {h.heading_path or h.title} · {scores}\n{h.snippet}"
        if used + len(block) > budget:
            structured["truncated"] = True
            parts.append(
                f"\n({len(result.hits) - i + 1} more hits cut to fit the response budget; lower top_k or narrow "
                "with path_prefix, and use read_note to open a hit)"
            )
            break
        parts.append(block)
        structured["hits"].append(h.as_dict())
        used += len(block)
    return "\n".join(parts), structured


# ---- the MCP server -------------------------------------------------------------------------------------------


def build_server(kb: KnowledgeBase) -> Any:
    """The MCPServer with its five tools; every failure becomes a tool error the model can read.

    The SDK is imported here, not at module level: serve() answers the handshake while this import runs.
    (No `from __future__ import annotations` in this module, so the tool annotations below resolve to these names.)
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field

    server = MCPServer(name=kb.cfg.server_name, instructions=INSTRUCTIONS, log_level=kb.cfg.log_level)

    def run(fn: Any, *args: Any) -> CallToolResult:
        try:
            text, data = fn(*args)
        except KBError as e:
            raise ToolError(str(e)) from e
        except Exception as e:
            logger.exception("tool failed")
            raise ToolError(f"internal error ({type(e).__name__}: {e}); the server keeps running, see its log") from e
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read_only)
    def search_my_knowledge_base(
        query: Annotated[
            str, Field(description="What to look for: a question or keywords, any language", min_length=1, max_length=2000)
        ],
        top_k: Annotated[int | None, Field(description="Hits to return (default from config, usually 5)", ge=1, le=50)] = None,
        path_prefix: Annotated[str | None, Field(description="Only notes under this folder, e.g. 'projects/'")] = None,
        mode: Annotated[
            str | None,
            Field(description="hybrid (default), keyword (exact names, ids) or semantic", pattern="^(hybrid|keyword|semantic)$"),
        ] = None,
        tag: Annotated[str | None, Field(description="Only notes with this tag, e.g. 'health'")] = None,
        modified_within_days: Annotated[float | None, Field(description="Only notes changed in the last N days", gt=0)] = None,
    ) -> CallToolResult:
        """Search the user's personal notes (Markdown vault). Call it before answering anything about the user's own
        projects, decisions, people, plans, configs or past work, and cite hits as path:lines. Returns note path,
        heading, line range, a short snippet and scores; says "Nothing relevant" when the notes do not cover the
        question. Use read_note to open a hit in full."""
        return run(kb.search, query, top_k, path_prefix, mode, tag, modified_within_days)

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
    ) -> CallToolResult:
        """Read a note, or one section of it, with line numbers in the header. Long notes are cut to a size budget;
        the reply says which start_line continues."""
        return run(kb.read_note, path, heading, start_line)

    @server.tool(annotations=read_only)
    def list_notes(
        path_prefix: Annotated[str | None, Field(description="Only notes under this folder, e.g. 'daily/'")] = None,
        modified_within_days: Annotated[float | None, Field(description="Only notes changed in the last N days", gt=0)] = None,
    ) -> CallToolResult:
        """List notes (path | title | last modified), newest first, e.g. to see recent daily notes."""
        return run(kb.list_notes, path_prefix, modified_within_days)

    @server.tool(annotations=read_only)
    def index_status() -> CallToolResult:
        """Index health: notes and chunks indexed, last sync, model, running sync, skipped files and why."""
        return run(kb.status)

    return server


def serve(cfg: Config) -> int:
    """Serve MCP over stdio until the client goes away, answering the handshake while the SDK still imports."""
    from kb_handshake import HandshakeFront, code_key

    # The recorded answers are valid only for this code and these SDK versions (their files' size and mtime).
    sdk = [Path(s.origin) for name in HANDSHAKE_DEPENDENCIES if (s := importlib.util.find_spec(name)) and s.origin]
    key = code_key(Path(__file__).resolve(), *sdk, cfg.server_name)
    front = HandshakeFront(cfg.data_dir / HANDSHAKE_CACHE, key)
    front.start()
    kb = KnowledgeBase(cfg)
    loaded: dict[str, Any] = {}
    ready = threading.Event()

    def load_sdk() -> None:
        try:
            loaded["server"] = build_server(kb)
        except BaseException as e:  # reported below, in the main thread
            loaded["error"] = e
        ready.set()

    threading.Thread(target=load_sdk, name="sdk-import", daemon=True).start()
    if front.answer_until(ready):
        if "error" in loaded:
            raise loaded["error"]
        kb.start()
        try:
            _run_sdk(loaded["server"], front)
        except KeyboardInterrupt:
            pass
    logger.info("client disconnected; shutting down")
    engine = kb.engine
    if engine is not None and engine.syncing:
        engine.cancel = True
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while engine.syncing and time.monotonic() < deadline:
            time.sleep(0.05)
    sys.stderr.flush()
    os._exit(0)  # daemon threads (model loading, chroma) must not keep a client-less server alive


def _run_sdk(server: Any, front: Any) -> None:
    """MCPServer.run_stdio_async, over the front's streams instead of the process's stdin/stdout."""
    import anyio
    from mcp.server.stdio import stdio_server

    async def run() -> None:
        stdin, stdout = front.sdk_streams()
        async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
            low = server._lowlevel_server
            await low.run(read_stream, write_stream, low.create_initialization_options())

    anyio.run(run)


# ---- the --search self-test ------------------------------------------------------------------------------------


def self_test(cfg: Config, query: str, top_k: int | None, mode: str | None, path_prefix: str | None, as_json: bool) -> int:
    """Run the same sync + search as the tool, without MCP, and print the hits."""
    from ingest import Engine
    from kb_search import Searcher

    t0 = time.perf_counter()
    engine = Engine(cfg)
    report = engine.sync_all()
    if engine.view_changed:
        engine.save_view()
    sync_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    if mode != "keyword" and engine.model_error is None:
        try:
            engine.embedder.load()  # timed apart: the search time below is what a warm server pays
        except KBError as e:
            engine.model_error = str(e)
    load_ms = (time.perf_counter() - t1) * 1000
    result = Searcher(engine).search(query, top_k=top_k, mode=mode, path_prefix=path_prefix)
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
            notes_indexed=len(engine.files),
            chunks_indexed=len(engine.chunks),
        )
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0
    print(
        f"vault {cfg.kb_dir}: {len(engine.files)} notes, {len(engine.chunks)} chunks; sync {sync_ms:.0f} ms ({report.summary()})"
    )
    print(f"model load {load_ms:.0f} ms, search {result.elapsed_ms:.0f} ms\n")
    print(format_search(result, notes, 10**9)[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mcp_server.py",
        description="second-brain-mcp: serve your Markdown notes to MCP clients over stdio (default), or run one search "
        "as a self-test with --search.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python mcp_server.py                          # stdio server (for claude mcp add)\n"
        '  python mcp_server.py --search "backup timer"  # self-test: sync + search, hits on stdout',
    )
    add_common_args(parser)
    parser.add_argument("--search", metavar="QUERY", help="run one search (same sync + search as the tool) and exit")
    parser.add_argument("--top-k", type=int, help="hits for --search (default: search.top_k)")
    parser.add_argument(
        "--mode", choices=("hybrid", "keyword", "semantic"), help="search mode for --search (default: search.mode)"
    )
    parser.add_argument("--path-prefix", help="only notes under this folder, for --search")
    parser.add_argument("--json", action="store_true", help="print --search results as JSON")
    args = parser.parse_args(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    try:
        cfg = load_cli_config(args)
    except KBError as e:
        setup_logging(args.verbose, args.quiet)
        print(f"error: {e}", file=sys.stderr)
        return 1
    setup_logging(args.verbose, args.quiet, default="WARNING" if args.search else cfg.log_level)
    if args.search is None:
        return serve(cfg)
    try:
        return self_test(cfg, args.search, args.top_k, args.mode, args.path_prefix, args.json)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
