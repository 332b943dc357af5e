"""MCP server (stdio) over a Markdown vault: search, append-only write-back, note reading; and the --search self-test.

In stdio mode (server.shared on) this process is a thin relay (kb_relay) to the one shared server of this vault and
config, which it starts if none runs (`--serve-shared`, kb_shared): the relay imports only kb_config and the standard
library, so a second session is answered in a fraction of a second. In-process (--no-shared, Windows, or no shared
server to be had) the MCP SDK's own stdio server answers the client as soon as the SDK is imported (about a second);
the engine, jieba and the model load in a background thread, in the order that gets a keyword answer soonest, and
file events keep the index fresh (kb_live). Logs go to stderr only: in stdio mode stdout is the protocol.

Imports: kb_config; lazily: kb_relay, kb_shared, kb_live, kb_tools, kb_engine, kb_http, kb_authcli, kb_scan,
kb_search, kb_filter, kb_remote.
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
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from kb_config import SEARCH_MODES, Config, KBError, add_common_args, load_cli_config, pin_blas_threads, setup_logging

if TYPE_CHECKING:  # imported where used: the relay path must stay light (no SDK, numpy or jieba)
    from kb_tools import KnowledgeBase

logger = logging.getLogger("mcp_server")

# Offline always: never reach Hugging Face, never send telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "TOKENIZERS_PARALLELISM": "false",
}
INSTRUCTIONS = (
    "The user's personal Markdown notes (a 'second brain'), often in Chinese and English. Search them before "
    "answering questions about the user's own projects, decisions, people, plans or past work; cite the note path and "
    "lines. With each search pass `alternatives`: the question in the vault's other language, its key terms, the likely "
    "note title (index_status says which languages and folders the vault holds). Append to the notes only when the "
    "user asks you to remember or note something."
)


def os_error_message(e: OSError) -> str:
    """A tool error for an operating-system refusal: what failed, on which path, and what to pass instead."""
    from kb_tools import quote

    where = f" for {quote(e.filename)}" if e.filename else ""
    what = e.strerror or str(e) or type(e).__name__
    if e.errno == errno.ENAMETOOLONG:
        hint = "a name is longer than 255 bytes or the path longer than the system allows; pass a shorter path"
    elif e.errno in (errno.EACCES, errno.EPERM):
        hint = "the server may not read or write it; check the file's permissions"
    else:
        hint = "pass a note path from list_notes or search"
    return f"the file system refused the operation{where}: {what}; {hint}"


# The tools' names this module served at import before the relay made it light; imported on first use (PEP 562).
LAZY_NAMES = {"KnowledgeBase": "kb_tools", "fit": "kb_tools", "format_search": "kb_tools", "quote": "kb_tools"}
LAZY_NAMES |= {"load_model": "kb_live", "use_one_malloc_arena": "kb_live"}


def __getattr__(name: str) -> Any:
    if name in LAZY_NAMES:
        import importlib

        return getattr(importlib.import_module(LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'mcp_server' has no attribute {name!r}")


# ---- the MCP server -------------------------------------------------------------------------------------------


def build_server(kb: "KnowledgeBase", audit: Any = None, client_name: Any = None) -> Any:
    """The MCPServer with its six tools; every failure becomes a tool error the model can read.

    Over HTTP, `audit` (kb_audit.AuditLog) gets one line per tool call, naming the OAuth client by `client_name`
    (client id -> its registered name). An OAuth client's call runs with what its scopes grant (kb_remote.Access).

    The SDK is imported here, not at module level, so `--search` and `--help` never pay for it. The knowledge base
    starts from the server's lifespan, i.e. once the SDK's stdio transport owns stdout (a stray print from any
    library loading in the background then lands on stderr, never in the protocol).
    """
    from kb_live import collector_paused

    # The SDK's import and the tools' schemas make most of the ~150k objects a server holds from its start: Python's
    # cyclic collector walked them again and again as they were made (a cold session's `initialize` on tldr: 0.86 s
    # with it running, 0.71 s paused).
    with collector_paused():
        return _server_with_tools(kb, audit, client_name)


def _server_with_tools(kb: "KnowledgeBase", audit: Any, client_name: Any) -> Any:
    """build_server's work. (No `from __future__ import annotations` in this module, so the tool annotations below
    resolve to these names.)"""
    import functools
    import inspect

    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field

    from kb_filter import PrivateNotes
    from kb_remote import SCOPE_APPEND, SCOPE_READ, access_of, redact_reply, reply_paths
    from kb_scan import MAX_MODIFIED_WITHIN_DAYS
    from kb_search import MAX_ALTERNATIVE_CHARS, MAX_ALTERNATIVES, TAIL_NOTES
    from kb_tools import fit

    @contextlib.asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[dict]:
        kb.start()
        yield {}

    server = MCPServer(name=kb.cfg.server_name, instructions=INSTRUCTIONS, log_level=kb.cfg.log_level, lifespan=lifespan)
    budget = kb.cfg.max_response_chars
    private = PrivateNotes.of(kb.cfg.private_paths)

    def run(fn: Any, *args: Any, scope: str = SCOPE_READ) -> CallToolResult:
        token = get_access_token()  # None on stdio, a shared server's sessions and the static token: the owner
        access = access_of(token.client_id if token else None, token.scopes if token else None, private, kb.cfg.redact)
        if not access.allows(scope):
            raise ToolError(
                f"this client was not granted {scope}; the vault's owner can grant it when the client signs in again "
                "(remove and add the connector)"
            )
        try:
            text, data = fn(*args, private=access.private)
            if access.redact:
                text, data = redact_reply(text, data)
        except KBError as e:
            raise ToolError(fit(str(e), budget)) from e
        except OSError as e:  # a path the operating system refuses (too long, no permission): the model can fix it
            raise ToolError(fit(os_error_message(e), budget)) from e
        except Exception as e:
            logger.exception("tool failed")
            raise ToolError(f"internal error ({type(e).__name__}: {e}); the server keeps running, see its log") from e
        return CallToolResult(content=[TextContent(type="text", text=fit(text, budget))], structured_content=data)

    def audited(fn: Any) -> Any:
        """`fn` leaving one audit line per call (tool, arguments, outcome, time, the note paths it returned)."""
        if audit is None:
            return fn

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            token = get_access_token()
            client = token.client_id if token else None
            name = client_name(client) if client and client_name else None
            t0 = time.perf_counter()
            ok, error, paths = False, None, []
            try:
                result = fn(*args, **kwargs)
                ok, paths = not result.is_error, reply_paths(result.structured_content)
                return result
            except Exception as e:
                error = str(e)
                raise
            finally:
                ms = (time.perf_counter() - t0) * 1000
                audit.record_tool(
                    transport="http" if token else "http-token", client_id=client, client_name=name, tool=fn.__name__,
                    arguments=kwargs, ok=ok, ms=ms, paths=paths, error=error,
                )  # fmt: skip

        return call

    def tool(**kw: Any) -> Any:
        """server.tool with the function's docstring, less its indentation, as the description: the client's model
        reads every character of it on every turn."""
        return lambda fn: server.tool(description=inspect.cleandoc(fn.__doc__ or ""), **kw)(audited(fn))

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

    @tool(annotations=read_only)
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
                "translated into the vault's other language (Chinese <-> English: a note may be written in either; a "
                "question that mixes both: once wholly in each); the key terms or the likely note title as short "
                "keywords, in both languages (one string may hold both); an exact command, setting, file or product "
                "name you expect the note to contain: it is a search term, so name it even when it is the answer. Add "
                "no facts you are unsure of (dates, numbers, outcomes). Example for '上次 NAS 停电以后发生了什么': "
                "['what happened after the NAS power outage', 'NAS 停电 UPS', 'NAS power outage UPS shutdown']",
                max_length=MAX_ALTERNATIVES,
            ),
        ] = None,
        top_k: Annotated[
            int | None,
            Field(
                description=f"Notes shown with a snippet (default from config, usually 4); {TAIL_NOTES} more follow, one line each",
                ge=1,
                le=50,
            ),
        ] = None,
        path_prefix: Annotated[str | None, Field(description="Only notes under this folder, e.g. 'projects/'")] = None,
        mode: Annotated[
            str | None,
            Field(
                description="hybrid (default), keyword (exact names, ids) or semantic", pattern=f"^({'|'.join(SEARCH_MODES)})$"
            ),
        ] = None,
        tag: Annotated[str | None, Field(description="Only notes with this tag, e.g. 'health'")] = None,
        modified_within_days: Annotated[float | None, days] = None,
        where: Annotated[dict[str, Any] | None, where_field] = None,
        date_from: Annotated[str | None, date_from_field] = None,
        date_to: Annotated[str | None, date_to_field] = None,
    ) -> CallToolResult:
        """Search the user's personal notes (Markdown vault; index_status says its languages and folders). Call it
        before answering anything about the user's own projects, decisions, people, plans, configs or past work. Pass
        `alternatives` (the question in the other language, keywords, the likely name): they find notes the question's
        own words miss.
        Returns one entry per note, best first: `path:lines` of its matching passages, heading, which strings
        found it, its translation (the same text in the other language: it answers as the note does), a snippet; then
        more candidate notes, one line each. The order is the server's guess: read the whole list, judge yourself
        which notes answer (often several: the topic's own note, a summary covering it, a translation; a candidate's
        path or heading may be the answer), open promising ones with read_note, and cite each path:lines. A reply starting "Low confidence" matched nothing clearly: use a note only if it plainly
        answers, else tell the user the notes do not cover it."""
        return run(kb.search, query, alternatives, top_k, path_prefix, mode, tag, modified_within_days, where, date_from, date_to)

    @tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False))
    def update_knowledge_base(
        path: Annotated[str, Field(description="Note path relative to the vault, e.g. 'inbox.md'")],
        content: Annotated[str, Field(description="Markdown text to append", min_length=1)],
        heading: Annotated[str | None, Field(description="Append at the end of this section, e.g. 'TODO'")] = None,
        create_heading: Annotated[bool, Field(description="Add the heading at the end if the note lacks it")] = False,
    ) -> CallToolResult:
        """Append text to one of the user's notes when they ask to remember, note or save something ("记一下",
        "remember this", "add to my notes"). Append-only: never edits or deletes existing text. Only whitelisted notes
        (default: inbox.md); other paths are refused with the reason. The text is searchable right after."""
        return run(kb.append, path, content, heading, create_heading, scope=SCOPE_APPEND)

    @tool(annotations=read_only)
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

    @tool(annotations=read_only)
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

    @tool(annotations=read_only)
    def related_notes(
        path: Annotated[str, Field(description="Note path relative to the vault, as returned by search")],
        limit: Annotated[int, Field(description="Entries per list (links, backlinks, nearest)", ge=1, le=50)] = 10,
    ) -> CallToolResult:
        """Walk the user's own note graph from one note: the notes it links to and the notes linking to it, each with
        the line that links (the context), its unresolved links, and the notes nearest in meaning."""
        return run(kb.related, path, limit)

    @tool(annotations=read_only)
    def index_status() -> CallToolResult:
        """Index health: notes and chunks indexed, last sync, model, running sync, how changes are detected, skipped
        files and why."""
        return run(kb.status)

    return server


def serve(cfg: Config, in_process_reason: str = "") -> int:
    """Serve MCP over stdio (the SDK's own transport) in this process until the client goes away, then exit at once."""
    from kb_live import use_one_malloc_arena
    from kb_tools import KnowledgeBase

    use_one_malloc_arena()
    kb = KnowledgeBase(cfg)
    kb.serving = lambda: {"mode": "in-process", "reason": in_process_reason or "server.shared is off or --no-shared"}
    server = build_server(kb)  # imports the SDK (~0.7 s); `initialize` is answered as soon as run() starts
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
    logger.info("client disconnected; shutting down")
    kb.shutdown()
    sys.stderr.flush()
    os._exit(0)  # daemon threads (model loading, file events) must not keep a client-less server alive


# ---- the shared server and its relay ---------------------------------------------------------------------------

# This script, as the relay starts it again: the shared server (`--serve-shared KEY`) or a private in-process server.
SCRIPT = Path(__file__).resolve()


def shared_off_reason(cfg: Config, no_shared: bool) -> str:
    """Why this stdio session runs in-process rather than through the shared server ("" when it may share)."""
    import socket

    if no_shared:
        return "--no-shared"
    if not cfg.shared:
        return "server.shared is false"
    if os.name == "nt" or not hasattr(socket, "AF_UNIX") or not hasattr(os, "getuid"):
        return "no shared server on Windows: each session runs its own (see README, Shared server)"
    return ""


def forwarded_args(args: argparse.Namespace) -> list[str]:
    """The flags that decide the config, absolute, for the processes the relay starts (same config, same key)."""
    out: list[str] = []
    if args.config:
        out += ["--config", str(Path(args.config).expanduser().resolve())]
    if args.kb_dir:
        out += ["--kb-dir", str(Path(args.kb_dir).expanduser().resolve())]
    return out + ["-v"] * args.verbose + (["-q"] if args.quiet else [])


def relay(cfg: Config, args: argparse.Namespace) -> int:
    """Relay this stdio session to the shared server (started if none runs); serve in-process if none can be had."""
    from kb_relay import SharedUnavailable, exec_pump, identity_key, prepare_runtime_dir, run_relay, shared_paths, start_if_absent

    assert cfg.runtime_dir is not None
    fwd = forwarded_args(args)
    try:
        prepare_runtime_dir(cfg.runtime_dir)
        key = identity_key(cfg)
    except SharedUnavailable as e:
        reason = f"no shared server could be had: {e}"
        print(f"second-brain-mcp: serving this session in-process ({reason})", file=sys.stderr, flush=True)
        return serve(cfg, reason)
    plan = {
        "runtime_dir": str(cfg.runtime_dir),
        "key": key,
        "server_argv": [sys.executable, str(SCRIPT), "--serve-shared", key, *fwd],
        "fallback_argv": [sys.executable, str(SCRIPT), "--no-shared", *fwd],
    }
    start_if_absent(shared_paths(cfg.runtime_dir, key), plan["server_argv"])  # a cold server starts before the exec
    try:
        exec_pump(plan)  # never returns: the config, YAML and argparse this process loaded are not needed any more
    except OSError as e:
        logger.info("cannot exec the relay's pump (%s); relaying from this process", e)
    return run_relay(plan)


def serve_shared_transport(cfg: Config, key: str, args: argparse.Namespace) -> int:
    """The shared server (started by a relay, detached): every relay's connection is an MCP session over one index."""
    import signal

    from kb_live import use_one_malloc_arena
    from kb_relay import SharedUnavailable, identity_key, prepare_runtime_dir, shared_paths
    from kb_shared import SharedServer
    from kb_tools import KnowledgeBase

    if identity_key(cfg) != key:
        logger.error("the config or the code changed since the relay computed its key; not starting (the relay retries)")
        return 3
    assert cfg.runtime_dir is not None

    def still_current() -> bool:
        try:
            return identity_key(load_cli_config(args)) == key
        except KBError:
            return False

    try:
        prepare_runtime_dir(cfg.runtime_dir)
        shared = SharedServer(cfg, key, shared_paths(cfg.runtime_dir, key), still_current)
        shared.bind()  # before the SDK import: a relay's connection waits in the backlog, not in a retry loop
    except (SharedUnavailable, KBError) as e:
        logger.error("%s", e)
        return 1

    def on_term(*_: Any) -> None:
        shared.cleanup()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    use_one_malloc_arena()
    kb = KnowledgeBase(cfg)
    kb.serving = shared.describe
    server = build_server(kb)  # kb starts with the first session's lifespan, as in-process: initialize comes first
    try:
        shared.serve(server)
    except KeyboardInterrupt:
        pass
    finally:
        shared.cleanup()
    kb.shutdown()
    logging.shutdown()
    os._exit(0)  # daemon threads (model loading, file events) must not keep it alive


def stop_shared() -> int:
    """--stop-shared: ask this user's shared servers to exit."""
    from kb_config import user_runtime_dir
    from kb_relay import stop_servers

    folder = user_runtime_dir()
    lines = stop_servers(folder)
    for line in lines:
        print(line)
    if not lines:
        print(f"no shared server runs (runtime folder {folder})")
    return 0


def serve_http_transport(cfg: Config, host: str, port: int) -> int:
    """Serve MCP over streamable HTTP (several sessions, one index) until interrupted; refuses without a token, or with
    server.auth: oauth before `auth init` or without an https server.public_url."""
    from kb_http import check_bind, check_oauth, client_names, configured_token, open_audit, serve_http
    from kb_live import use_one_malloc_arena
    from kb_tools import KnowledgeBase

    try:  # checked before the index and the model load, so a refusal is said at once
        if cfg.server_auth == "oauth":
            check_oauth(cfg)
        else:
            found = configured_token(cfg)
            check_bind(host, found[0] if found else None)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    use_one_malloc_arena()
    kb = KnowledgeBase(cfg)
    kb.serving = lambda: {"mode": "http", "pid": os.getpid()}
    oauth = cfg.server_auth == "oauth"  # every tool call over HTTP has its audit line; OAuth clients by name
    server = build_server(kb, open_audit(cfg), client_names(cfg) if oauth else None)
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
    from kb_live import load_model
    from kb_search import Searcher
    from kb_tools import format_search

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
    argv = sys.argv[1:] if argv is None else list(argv)
    if "auth" in argv:  # `auth ...` (kb_authcli) before the server's parser; the common flags may sit on either side
        common = argparse.ArgumentParser(prog="mcp_server.py", add_help=False, allow_abbrev=False)
        add_common_args(common)
        known, rest = common.parse_known_args(argv)
        if rest[:1] == ["auth"]:
            import kb_authcli

            kb_authcli.build_parser().parse_args(rest[1:])  # --help and usage errors before a first run's config.yaml is made
            setup_logging(known.verbose, known.quiet, default="WARNING")
            try:
                cfg = load_cli_config(known)
            except KBError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            return kb_authcli.main(rest[1:], cfg)
    parser = argparse.ArgumentParser(
        prog="mcp_server.py",
        description="second-brain-mcp: serve your Markdown notes to MCP clients over stdio (default) or streamable "
        "HTTP with a bearer token, or run one search as a self-test with --search.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python mcp_server.py                          # stdio server (for claude mcp add)\n"
        "  python mcp_server.py --stop-shared            # stop the shared server (it also exits when idle)\n"
        '  python mcp_server.py --search "backup timer"  # self-test: sync + search, hits on stdout\n'
        "  python mcp_server.py --print-token             # create the token HTTP clients send\n"
        "  python mcp_server.py --transport http --port 8765   # http://127.0.0.1:8765/mcp\n"
        "  python mcp_server.py auth init             # OAuth for claude.ai and phones (see: auth --help)",
    )
    add_common_args(parser)
    parser.add_argument("--search", metavar="QUERY", help="run one search (same sync + search as the tool) and exit")
    parser.add_argument("--top-k", type=int, help="hits for --search (default: search.top_k)")
    parser.add_argument("--mode", choices=SEARCH_MODES, help="search mode for --search (default: search.mode)")
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
    parser.add_argument(
        "--no-shared",
        action="store_true",
        help="stdio: serve this session in this process instead of through the shared server (as server.shared: false)",
    )
    parser.add_argument(
        "--stop-shared", action="store_true", help="stop this user's shared servers (open sessions start a new one) and exit"
    )
    parser.add_argument("--serve-shared", metavar="KEY", help=argparse.SUPPRESS)  # what the relay starts
    parser.add_argument("--fallback-reason", default="", help=argparse.SUPPRESS)  # why a relay's child is in-process
    args = parser.parse_args(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if args.stop_shared:
        return stop_shared()
    pin_blas_threads()  # numpy loads later, in the start-up thread (and in a shared server this starts)
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
    if args.serve_shared:
        return serve_shared_transport(cfg, args.serve_shared, args)
    if args.search is None:
        reason = args.fallback_reason or shared_off_reason(cfg, args.no_shared)
        return serve(cfg, reason) if reason else relay(cfg, args)
    try:
        return self_test(cfg, args.search, args.top_k, args.mode, args.path_prefix, args.json, args.alt)
    except BrokenPipeError:  # `--search ... | head`: the reader left; say nothing more, as other commands do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
