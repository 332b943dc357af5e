"""eval/faults.py part `storm`: K servers + watcher.py + an ingest loop + an external editor on one vault for D seconds.
The K servers are K client sessions, each through its relay, all attached to the one shared server of their config.

The editor (eval/faults_editor.py) creates, edits, renames and deletes notes and appends numbered lines to inbox.md;
each server appends numbered lines to inbox.md and searches and asks index_status, concurrently. Afterwards: every
acknowledged append present exactly once, no external line lost, no ghost or stale hits after a settle, call
latencies (over 5 s is a hang), no chunk without a vector, the index equal to a fresh rebuild, and a fresh process
that opens and searches it.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from faults_common import (
    HANG_S,
    PYTHON,
    REPO_ROOT,
    START_TIMEOUT_S,
    Outcome,
    Server,
    build_reference,
    compare_with_rebuild,
    index_problems,
    latency_figures,
    load_cfg,
    make_test_embedder,
    pending_on_disk,
    read_index,
    run_cli,
    tail,
)
from faults_editor import WORDS, ext_line, pause_until
from faults_kills import QUERIES
from faults_report import PartResult, Run
from harness import write_config
from synthetic_vault import write_synthetic_vault

from kb_relay import is_zombie

# Background notes in the storm vault (quick / full).
STORM_NOTES_QUICK, STORM_NOTES_FULL = 30, 100
# The editor's operations at most (it stops at the storm's end anyway): about 15 a second.
EDITOR_OPS_PER_S = 20
# Pause between one server loop's calls, seconds (uniform): appends, searches, index_status.
APPEND_PAUSE_S, SEARCH_PAUSE_S, STATUS_PAUSE_S = (0.2, 0.6), (0.05, 0.3), (0.8, 1.5)
# Calls per loop at most (each loop also stops at the storm's end).
MAX_CALLS_PER_LOOP = 5000
# The watcher's debounce; the settle waits a few of these after the editor stops.
WATCHER_DEBOUNCE_S = 0.5
SETTLE_S = 3.0
# After that, how long the watcher and the servers get to give every chunk its vector (quick / full).
SETTLE_MAX_S_QUICK, SETTLE_MAX_S_FULL = 10.0, 30.0
# Longest an ingest run of the loop may take (killed and counted as a failure beyond it).
INGEST_TIMEOUT_S = 180.0
# Notes checked per server after the settle: deleted ones (ghost hits) and live ones (found at their path).
GHOST_SAMPLE_QUICK, GHOST_SAMPLE_FULL = 15, 60
# Hits asked for in the ghost and freshness searches.
CHECK_TOP_K = 10
# The note the servers and the editor both append to.
INBOX = "inbox.md"
INBOX_START = "# Inbox\n\nCaptured lines.\n"
# Failed calls whose reply starts alike (this many characters) are reported as one finding with a count.
FAILURE_KEY_CHARS = 160
# Server log lines that mean an unexpected exception (the tool replied, but something escaped a thread).
TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\)", re.M)


def srv_line(k: int, n: int) -> str:
    return f"- srv{k} append {n} srvtok{k}x{n}"


class Storm:
    """Shared state of the storm's loops: what was acknowledged, in flight, and every call's outcome."""

    def __init__(self, run: Run, deadline: float, pauses: dict[str, tuple[float, float]] | None = None) -> None:
        self.run = run
        self.deadline = deadline
        # Pause between one loop's calls, seconds (uniform): the storm's by default; the soak's are a person's.
        self.pauses = pauses or {"append": APPEND_PAUSE_S, "search": SEARCH_PAUSE_S, "status": STATUS_PAUSE_S}
        self.acked: list[str] = []
        self.unacked: list[str] = []
        self.bad: list[tuple[str, Outcome]] = []  # (server, outcome) of every call that did not succeed
        self.ingest: list[tuple[int, float]] = []
        self.t0 = time.time()

    def live(self) -> bool:
        return time.monotonic() < self.deadline

    async def pause(self, kind: str) -> None:
        """One loop's pause between calls, never past the deadline."""
        await anyio.sleep(pause_until(self.deadline, self.run.rng.uniform(*self.pauses[kind])))

    def start_loops(self, tg: Any, servers: list[Server]) -> None:
        """Each server's append, search and index_status loops, in the task group `tg`."""
        for k, s in enumerate(servers):
            tg.start_soon(self.appender, s, k)
            tg.start_soon(self.searcher, s)
            tg.start_soon(self.statuser, s)

    async def appender(self, s: Server, k: int) -> None:
        for n in range(1, MAX_CALLS_PER_LOOP + 1):
            if not self.live():
                return
            line = srv_line(k, n)
            o = await s.call("update_knowledge_base", {"path": INBOX, "content": line})
            (self.acked if o.kind == "ok" else self.unacked).append(line)
            if o.kind != "ok":
                self.bad.append((s.name, o))
            await self.pause("append")

    async def searcher(self, s: Server) -> None:
        rng = self.run.rng
        for _ in range(MAX_CALLS_PER_LOOP):
            if not self.live():
                return
            query = rng.choice([*QUERIES, *WORDS, f"stormtok{rng.randint(1, 40)}v0", "exttok1"])
            mode = rng.choice(("hybrid", "keyword", "semantic"))
            o = await s.call("search_my_knowledge_base", {"query": query, "mode": mode})
            if o.kind != "ok":
                self.bad.append((s.name, o))
            await self.pause("search")

    async def statuser(self, s: Server) -> None:
        for _ in range(MAX_CALLS_PER_LOOP):
            if not self.live():
                return
            o = await s.call("index_status")
            if o.kind != "ok":
                self.bad.append((s.name, o))
            await self.pause("status")

    def ingest_loop(self, config: Path, log: Path) -> None:
        while self.live():
            rc, _, secs = run_cli(self.run.procs, ["ingest.py", "--config", str(config), "-q"], INGEST_TIMEOUT_S, log)
            self.ingest.append((rc, secs))


def read_editor_log(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the editor was killed mid-line: that op is not counted
    return out


async def check_hits(s: Server, vault: Path, tokens: dict[str, str], expect_found: bool, res: PartResult) -> dict[str, int]:
    """Search each token (keyword mode); every hit must name a note on disk that holds the token; a live note's
    token must find that note. Returns counts."""
    counts = {"searched": 0, "ghost": 0, "stale": 0, "found": 0, "missed": 0}
    for token, rel in tokens.items():
        o = await s.call("search_my_knowledge_base", {"query": token, "mode": "keyword", "top_k": CHECK_TOP_K})
        counts["searched"] += 1
        if o.kind != "ok":
            res.fail(f"{s.name}: settle search {token!r}", "ok", f"{o.kind}: {o.text}")
            continue
        paths = [h["path"] for h in (o.data or {}).get("hits", [])]
        for p in paths:
            f = vault / p
            if not f.is_file():
                counts["ghost"] += 1
                res.fail(f"{s.name}: ghost hit for {token!r}", "hits name notes on disk", f"{p} does not exist")
            elif token not in f.read_text(encoding="utf-8", errors="replace"):
                counts["stale"] += 1
                res.fail(f"{s.name}: stale hit for {token!r}", "hits hold the searched text", f"{p} no longer holds it")
        if expect_found:
            if rel in paths:
                counts["found"] += 1
            else:
                counts["missed"] += 1
                res.fail(f"{s.name}: fresh note not found", f"{token!r} finds {rel}", f"hits {paths}")
    return counts


async def _storm(run: Run, res: PartResult, base: Path, vault: Path, config: Path, n_servers: int, seconds: float) -> None:
    procs = run.procs
    watcher = procs.popen(
        [PYTHON, "watcher.py", "--config", str(config), "--debounce", str(WATCHER_DEBOUNCE_S)], log=base / "watcher.log"
    )
    editor_log = base / "editor.jsonl"
    async with AsyncExitStack() as stack:
        servers: list[Server] = []
        for k in range(n_servers):
            s = await stack.enter_async_context(Server(procs, config, base, f"storm-{k}"))
            for tool, args in (
                ("index_status", {}),
                ("search_my_knowledge_base", {"query": "warm up the model", "mode": "semantic"}),
            ):
                warm = await s.call(tool, args, timeout_s=START_TIMEOUT_S)
                if warm.kind != "ok":
                    res.fail(f"{s.name}: first {tool} (warm-up)", "ok", f"{warm.kind}: {warm.text[:300]}")
            s.calls.clear()  # start-up (the SDK import, the first sync, the model load) is not part of the storm
            servers.append(s)
        # Each "server" is a session: its relay, attached to the one shared server of this config (issue 32).
        res.figures["sessions_through_relays"] = sum(1 for s in servers if s.shared_pid is not None)
        res.figures["shared_servers"] = len({s.shared_pid for s in servers if s.shared_pid is not None})
        max_ops = int(seconds * EDITOR_OPS_PER_S)
        editor = procs.popen(
            [
                PYTHON,
                str(REPO_ROOT / "eval" / "faults_editor.py"),
                str(vault),
                str(editor_log),
                str(seconds),
                str(run.seed),
                str(max_ops),
            ],
            log=base / "editor.err",
        )
        storm = Storm(run, time.monotonic() + seconds)
        run.say(f"storm: {n_servers} servers, watcher, ingest loop and editor for {seconds:.0f} s")
        async with anyio.create_task_group() as tg:
            storm.start_loops(tg, servers)
            tg.start_soon(anyio.to_thread.run_sync, storm.ingest_loop, config, base / "ingest.log")
        try:
            await anyio.to_thread.run_sync(lambda: editor.wait(timeout=60))
        except subprocess.TimeoutExpired:
            res.fail("editor", "finishes at the storm's end", "still running 60 s later; killed")
            procs.kill(editor.pid)
        run.say("storm: settling")
        await anyio.sleep(SETTLE_S)
        # The watcher and the servers alone must bring every chunk its vector (no manual ingest).
        index_dir = load_cfg(config).index_dir
        settle_max_s = SETTLE_MAX_S_QUICK if run.quick else SETTLE_MAX_S_FULL
        settle_end = time.monotonic() + settle_max_s
        while (pending := pending_vectors(index_dir)) and time.monotonic() < settle_end:
            await anyio.sleep(1.0)
        res.figures["chunks_without_vector_after_settle"] = pending
        if pending:
            res.fail("settle", f"every chunk has a vector within {settle_max_s:.0f} s", f"{pending} chunks without a vector")
        rc, _, _ = await anyio.to_thread.run_sync(
            lambda: run_cli(procs, ["ingest.py", "--config", str(config), "-q"], INGEST_TIMEOUT_S, base / "ingest.log")
        )
        if rc != 0:
            res.fail("settle: ingest.py", "exit 0", f"exit {rc}: {tail(base / 'ingest.log')}")
        events = read_editor_log(editor_log)
        done = next((e for e in events if e.get("op") == "done"), {})
        live = dict(done.get("notes", {}))  # path -> token
        gone_tokens = {e["token"]: e["path"] for e in events if e.get("op") == "delete"}
        gone_tokens.update({e["old_token"]: e["path"] for e in events if e.get("op") == "edit"})
        sample = GHOST_SAMPLE_QUICK if run.quick else GHOST_SAMPLE_FULL
        picked_gone = dict(run.rng.sample(sorted(gone_tokens.items()), min(sample, len(gone_tokens))))
        picked_live = dict(run.rng.sample(sorted((t, p) for p, t in live.items()), min(sample, len(live))))
        checks = collections.Counter()
        for s in servers:
            checks.update(await check_hits(s, vault, picked_gone, False, res))
            checks.update(await check_hits(s, vault, picked_live, True, res))
        alive = [s.name for s in servers if s.pid is not None and _alive(s.pid)]
    res.figures["servers_alive_at_end"] = len(alive)
    stop_watcher(procs, watcher, res)
    file_checks(res, vault, storm, events)
    res.figures.update(
        editor_ops=sum(1 for e in events if e.get("op") not in ("done", None)),
        editor_ops_by_kind=dict(collections.Counter(e["op"] for e in events if e.get("op") != "done")),
        settle_searches=dict(checks),
        ingest_runs=len(storm.ingest),
        ingest_failures=sum(1 for rc, _ in storm.ingest if rc != 0),
        ingest_max_s=round(max((s for _, s in storm.ingest), default=0.0), 2),
    )
    for rc, secs in storm.ingest:
        if rc != 0:
            res.fail("ingest loop", "exit 0", f"exit {rc} after {secs:.1f} s: {tail(base / 'ingest.log', 400)}")
            break
    calls = [c for s in servers for c in s.calls]
    lat = latency_figures(calls)
    res.figures["latency"] = lat
    res.figures["calls"] = len(calls)
    if lat["hangs"]:
        worst = sorted((c for c in calls if c.latency_s > HANG_S), key=lambda c: -c.latency_s)[:3]
        res.fail(
            "call latency",
            f"no call over {HANG_S:.0f} s",
            f"{lat['hangs']} calls over {HANG_S:.0f} s, worst: "
            + "; ".join(f"{c.server} {c.tool} {c.latency_s:.1f} s at +{c.started - storm.t0:.1f} s" for c in worst),
        )
        res.findings[-1].count = lat["hangs"]
    res.figures["failed_calls"] = dict(collections.Counter(o.kind for _, o in storm.bad))
    groups: dict[tuple[str, str, str], list[str]] = {}
    for name, o in storm.bad:  # one finding per kind of failure, with how often and where it happened
        groups.setdefault((o.tool, o.kind, o.text[:FAILURE_KEY_CHARS]), []).append(name)
    for (tool, kind, text), names in groups.items():
        where = ", ".join(f"{n} x{c}" for n, c in sorted(collections.Counter(names).items()))
        res.fail(f"{tool} during the storm ({where})", "ok", f"{kind}: {text}")
        res.findings[-1].count = len(names)
    tracebacks = {s.name: len(TRACEBACK_RE.findall(tail(s.errlog, 10**8))) for s in servers}
    for log in sorted({s.shared_log for s in servers if s.shared_log is not None}):  # the relays' shared server
        tracebacks[f"shared:{log.name}"] = len(TRACEBACK_RE.findall(tail(log, 10**8)))
    tracebacks["watcher"] = len(TRACEBACK_RE.findall(tail(base / "watcher.log", 10**8)))
    res.figures["tracebacks_in_logs"] = tracebacks
    for name, n in tracebacks.items():
        if n:
            log = (
                Path(next(str(s.shared_log) for s in servers if s.shared_log and name == f"shared:{s.shared_log.name}"))
                if name.startswith("shared:")
                else base / ("watcher.log" if name == "watcher" else f"{name}.err")
            )
            res.fail(f"{name} log", "no traceback", f"{n} tracebacks; last: {last_traceback(log)}")


def pending_vectors(index_dir: Path) -> int:
    for _ in range(3):
        try:
            return pending_on_disk(index_dir)
        except (OSError, ValueError):
            time.sleep(0.2)  # state.json replaced mid-read
    return pending_on_disk(index_dir)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").exists() and not is_zombie(pid)


def last_traceback(log: Path) -> str:
    text = tail(log, 10**8)
    i = text.rfind("Traceback (most recent call last)")
    return text[i : i + 1500] if i >= 0 else ""


def stop_watcher(procs: Any, watcher: subprocess.Popen, res: PartResult) -> None:
    if watcher.poll() is not None:
        res.fail("watcher.py", "runs for the whole storm", f"exited with {watcher.returncode}")
        return
    watcher.terminate()
    try:
        watcher.wait(timeout=10)
    except subprocess.TimeoutExpired:
        res.fail("watcher.py", "exits within 10 s of SIGTERM", "still running; killed")
        procs.kill(watcher.pid)


def file_checks(res: PartResult, vault: Path, storm: Storm, events: list[dict[str, Any]]) -> None:
    lines = collections.Counter((vault / INBOX).read_text(encoding="utf-8", errors="replace").splitlines())
    lost = [a for a in storm.acked if lines[a] == 0]
    doubled = [a for a in storm.acked + storm.unacked if lines[a] > 1]
    ext = [e["n"] for e in events if e.get("op") == "ext"]
    ext_lost = [n for n in ext if lines[ext_line(n)] == 0]
    ext_doubled = [n for n in ext if lines[ext_line(n)] > 1]
    res.figures.update(
        acknowledged_appends=len(storm.acked),
        unacknowledged_appends=len(storm.unacked),
        unacknowledged_present=sum(1 for a in storm.unacked if lines[a] == 1),
        lost_appends=len(lost),
        doubled_appends=len(doubled),
        external_lines=len(ext),
        external_lines_lost=len(ext_lost),
        external_lines_doubled=len(ext_doubled),
    )
    if lost:
        res.fail("acknowledged appends", "each present once in inbox.md", f"{len(lost)} missing, e.g. {lost[:3]}")
        res.findings[-1].count = len(lost)
    if doubled:
        res.fail("appends", "at most once in inbox.md", f"{len(doubled)} present twice or more, e.g. {doubled[:3]}")
        res.findings[-1].count = len(doubled)
    if ext_lost or ext_doubled:
        res.fail(
            "external lines (the editor's own appends to inbox.md)",
            "each present exactly once",
            f"{len(ext_lost)} of {len(ext)} lost (e.g. {[ext_line(n) for n in ext_lost[:3]]}), {len(ext_doubled)} doubled",
        )
        res.findings[-1].count = len(ext_lost) + len(ext_doubled)


def _index_checks(run: Run, res: PartResult, base: Path, config: Path, vault: Path) -> None:
    cfg = load_cfg(config)
    embedder = make_test_embedder(cfg)
    got = read_index(cfg, embedder)
    ref = build_reference(load_cfg(write_config(base / "ref.yaml", vault, base / "ref", run.model)), embedder)
    problems = index_problems(got)
    diff, ties = compare_with_rebuild(got, ref, QUERIES)
    res.figures.update(chunks=got.chunks, notes=len(got.chunk_ids), chunks_without_vector=got.pending_vectors, top5_ties=ties)
    for p in problems + diff:
        res.fail("index after the storm", "consistent and equal to a fresh rebuild", p)
    rc, out, secs = run_cli(
        run.procs, ["mcp_server.py", "--config", str(config), "--search", "backup", "--json"], 120, base / "fresh.err"
    )
    try:
        data = json.loads(out) if rc == 0 else {}
    except ValueError:
        data = {}
    res.figures["fresh_process_search"] = {"exit": rc, "seconds": round(secs, 2), "hits": len(data.get("hits", []))}
    if rc != 0 or not data:
        res.fail("a fresh process searches the index", "exit 0 with JSON", f"exit {rc}: {tail(base / 'fresh.err')}")
    elif any("semantic search is off" in n for n in data.get("notes", [])):
        res.fail("a fresh process searches the index", "semantic search on", f"notes: {data['notes']}")


def run_storm(run: Run, n_servers: int, seconds: float) -> PartResult:
    res = PartResult("storm")
    base = run.folder("storm")
    vault = base / "vault"
    write_synthetic_vault(vault, STORM_NOTES_QUICK if run.quick else STORM_NOTES_FULL, run.seed)
    (vault / INBOX).write_text(INBOX_START, encoding="utf-8")
    config = write_config(base / "config.yaml", vault, base / "data", run.model, write={"writable": [INBOX]})
    rc, _, _ = run_cli(run.procs, ["ingest.py", "--config", str(config), "-q"], INGEST_TIMEOUT_S, base / "ingest.log")
    if rc != 0:
        res.fail("setup: first index", "exit 0", f"exit {rc}: {tail(base / 'ingest.log')}")
        return res
    res.figures.update(servers=n_servers, seconds=seconds)
    anyio.run(_storm, run, res, base, vault, config, n_servers, seconds)
    run.say("storm: checking the index")
    _index_checks(run, res, base, config, vault)
    return res
