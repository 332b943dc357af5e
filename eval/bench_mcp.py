"""The MCP mode of eval/bench.py (`--mcp`): the server timed as a user feels it, through the SDK's own stdio client.

Launches `mcp_server.py` the way Claude Code does and reports launch -> initialize, launch -> first answer (and when
semantic results join), search p50/p95 over 30 queries, and edit -> searchable for an in-place write, an atomic save
(temp file + rename), a new file in a new folder, a rename and a deletion. With --busy, everything again beside a
process spinning one core (bounded in time, killed at the end). Works on a copy of the vault in --out-dir, indexed
there with ingest.py (or seeded from an index already built, --data-dir); the user's notes and index are never touched.

Every launch is a session's relay (issue 32): the timed launches each start from no shared server (a cold first
session, as every session was before), and the warm session's memory is its shared server's. With --sessions N: one
server of its own (--no-shared) beside N sessions through relays, the later ones launched while the earlier stay open:
their launch -> initialize and -> first (semantic) answer, search p50 through a relay against the direct server's
(alternated), and the memory of the N sessions (relays plus their shared server) against the direct server's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from harness import (
    QUERIES,
    REPO_ROOT,
    Busy,
    Metric,
    child_env,
    launch,
    median,
    peak_memory_mb,
    percentile,
    prepare_vault,
    private_runtime,
    proportional_memory_mb,
    read_pid,
    resident_memory_mb,
    say,
    serving_info,
    write_config,
)

from kb_config import KBError, load_config
from kb_relay import stop_servers
from kb_vectors import HASH_MODEL_NAME

# Server launches timed to initialize and the first answer (the last session then runs the searches and edits).
DEFAULT_STARTS = 3
# Searches timed in the warm session.
SEARCHES = 30
# Alternatives passed with each query of the alternatives timing (the most a client may pass).
ALTERNATIVES = 4
# The first question after launch: a word most vaults (and the synthetic one) contain.
FIRST_QUERY = "backup"
# Longest wait for one reply, and for the model to load (semantic results joining) after a launch.
CALL_TIMEOUT_S = 120.0
SEMANTIC_WAIT_S = 180.0
# Pause between searches while waiting for semantic results or for an edit to show.
POLL_S = 0.02
# An edit not found this long after it was saved counts as not found.
EDIT_TIMEOUT_S = 10.0
# The edit kinds, in the order run (each on its own uniquely worded text).
EDIT_KINDS = ("in_place", "atomic_save", "new_folder", "rename", "delete")
# ingest.py run to bring the vault copy's index up to date before the timings.
INGEST_TIMEOUT_S = 7200


def seed_index(src_vault: Path, data_dir: Path, config: Path) -> bool:
    """Copy the index of `src_vault` built in `data_dir` to where the server looks for the copy's; False if none."""
    src = load_config(None, env={"KB_DIR": str(src_vault), "KB_DATA_DIR": str(data_dir)}).index_dir
    dest = load_config(config, env={}).index_dir
    if not src.is_dir():
        return False
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    return True


def run_ingest(config: Path, log: Path) -> None:
    """`ingest.py --config`: the copy's index, current with its notes, as a user's would be."""
    with log.open("ab") as err:
        proc = subprocess.run(
            [sys.executable, str(REPO_ROOT / "ingest.py"), "--config", str(config), "-q"],
            cwd=REPO_ROOT,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=INGEST_TIMEOUT_S,
        )
    if proc.returncode != 0:
        raise KBError(f"ingest.py failed (code {proc.returncode}) on the vault copy; see {log}")


async def search(session: Any, query: str, mode: str | None = None, alternatives: list[str] | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"query": query} | ({"mode": mode} if mode else {})
    if alternatives:
        args["alternatives"] = alternatives
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool("search_my_knowledge_base", args)
    if result.is_error:
        raise KBError(f"the server's search failed: {result.content[0].text}")
    return result.structured_content or {}


async def wait_semantic(session: Any, mode: str) -> bool:
    """Search until answers are no longer keyword-only (the model loaded); False if that never happened in time."""
    if mode == "keyword":
        return True
    deadline = time.monotonic() + SEMANTIC_WAIT_S
    while time.monotonic() < deadline:
        if (await search(session, FIRST_QUERY))["mode"] != "keyword":
            return True
        await anyio.sleep(POLL_S * 5)
    return False


async def bench_starts(config: Path, errlog: Any, starts: int, mode: str, runtime: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"init": [], "first": [], "first_mode": [], "semantic": []}
    for i in range(starts):
        stop_servers(runtime)  # each launch is a cold first session: no shared server to attach to
        async with launch(config, errlog, read_timeout_s=CALL_TIMEOUT_S) as server:
            session, t0, init_s = server.client, server.started, server.initialize_s
            res["init"].append(init_s)
            first = await search(session, FIRST_QUERY)
            res["first"].append(time.perf_counter() - t0)
            res["first_mode"].append(first["mode"])
            joined = await wait_semantic(session, mode)
            res["semantic"].append(time.perf_counter() - t0 if joined else None)
            say(
                "bench",
                f"start {i + 1}/{starts}: initialize {init_s * 1000:.0f} ms, first answer ({first['mode']}) "
                f"{res['first'][-1] * 1000:.0f} ms after launch, semantic results from "
                + (f"{res['semantic'][-1]:.1f} s" if joined else "never (timed out)"),
            )
    return res


def _notes(vault: Path) -> list[Path]:
    return sorted(p for p in vault.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(vault).parts))


async def bench_edits(session: Any, vault: Path, mode: str, tag: str) -> dict[str, tuple[float | None, int]]:
    """Each edit kind: seconds from the saved change to the first reply that shows it, and the searches it took."""
    notes = _notes(vault)
    if len(notes) < 2:
        raise KBError(f"the vault {vault} needs at least 2 notes for the edit timings")
    rel = lambda p: p.relative_to(vault).as_posix()  # noqa: E731
    new_dir = vault / f"bench-{tag}" / "sub"
    moved = new_dir / "renamed.md"
    words = {kind: f"zyxbench{tag}{kind.replace('_', '')}" for kind in EDIT_KINDS}

    def in_place() -> None:
        with notes[0].open("a", encoding="utf-8") as f:
            f.write(f"\n- bench marker {words['in_place']}\n")

    def atomic_save() -> None:
        tmp = notes[1].with_name(f".{notes[1].name}.bench-tmp")
        tmp.write_text(notes[1].read_text(encoding="utf-8") + f"\n- bench marker {words['atomic_save']}\n", encoding="utf-8")
        os.replace(tmp, notes[1])

    def new_folder() -> None:
        new_dir.mkdir(parents=True)
        text = f"# Bench note\n\nbench marker {words['new_folder']} {words['rename']} {words['delete']}\n"
        (new_dir / "new.md").write_text(text, encoding="utf-8")

    def rename() -> None:
        (new_dir / "new.md").rename(moved)

    def delete() -> None:
        moved.unlink()

    steps: dict[str, tuple[Callable[[], None], str, Callable[[list[str]], bool]]] = {
        "in_place": (in_place, words["in_place"], lambda paths: rel(notes[0]) in paths),
        "atomic_save": (atomic_save, words["atomic_save"], lambda paths: rel(notes[1]) in paths),
        "new_folder": (new_folder, words["new_folder"], lambda paths: rel(new_dir / "new.md") in paths),
        "rename": (rename, words["rename"], lambda paths: rel(moved) in paths and rel(new_dir / "new.md") not in paths),
        "delete": (delete, words["delete"], lambda paths: rel(moved) not in paths),
    }
    out: dict[str, tuple[float | None, int]] = {}
    for kind in EDIT_KINDS:
        change, query, shown = steps[kind]
        await anyio.sleep(0.2)  # the previous step's events are long delivered: each step starts from rest
        change()
        t0 = time.perf_counter()
        tries, found = 0, None
        while time.perf_counter() - t0 < EDIT_TIMEOUT_S:
            tries += 1
            data = await search(session, query, mode)
            if shown([h["path"] for h in data.get("hits", [])]):
                found = time.perf_counter() - t0
                break
            await anyio.sleep(POLL_S)
        out[kind] = (found, tries)
        say("bench", f"edit {kind}: " + (f"{found * 1000:.0f} ms, search #{tries}" if found is not None else "NOT FOUND"))
    return out


async def bench_session(config: Path, errlog: Any, vault: Path, mode: str, tag: str) -> dict[str, Any]:
    """One warm session: search latency over SEARCHES queries, then the edits, then the server's own counters and its
    peak resident memory."""
    pidfile = config.with_name(f"server-{tag}.pid")
    async with launch(config, errlog, pidfile=pidfile, read_timeout_s=CALL_TIMEOUT_S) as server:
        session = server.client
        await wait_semantic(session, mode)
        for q in QUERIES[:3]:
            await search(session, q, mode)  # warm-up: jieba and the model's first calls
        times, alt_times = [], []
        for i, q in enumerate((QUERIES * 2)[:SEARCHES]):
            t = time.perf_counter()
            await search(session, q, mode)
            times.append(time.perf_counter() - t)
            # the same query with 4 alternatives, as a client passes them (the next queries: both languages, any length)
            t = time.perf_counter()
            await search(session, q, mode, [QUERIES[(i + k) % len(QUERIES)] for k in range(1, ALTERNATIVES + 1)])
            alt_times.append(time.perf_counter() - t)
        serving = await serving_info(session, CALL_TIMEOUT_S)
        pid = serving["pid"] if serving.get("mode") == "shared" else server.pid  # the server's, not the relay's
        resident = resident_memory_mb(pid) if pid is not None else (None, None)
        edits = await bench_edits(session, vault, mode, tag)
        with anyio.fail_after(CALL_TIMEOUT_S):
            status = (await session.call_tool("index_status", {})).structured_content or {}
        memory = peak_memory_mb(pid) if pid is not None else (None, "")
    return {"times": times, "alt_times": alt_times, "edits": edits, "status": status, "memory": memory, "resident": resident}


async def bench_sessions(config: Path, errlog: Any, n: int, mode: str, runtime: Path) -> dict[str, Any]:
    """--sessions N: a direct server (--no-shared) and N sessions through relays; see the module docstring."""
    res: dict[str, Any] = {"init": [], "first": [], "first_mode": [], "direct": [], "relay": []}
    stop_servers(runtime)
    async with contextlib.AsyncExitStack() as stack:
        pidfile = config.with_name("direct.pid")
        direct = await stack.enter_async_context(
            launch(config, errlog, pidfile=pidfile, read_timeout_s=CALL_TIMEOUT_S, extra_args=["--no-shared"])
        )
        await wait_semantic(direct.client, mode)
        sessions = []
        for i in range(n):
            pidfile = config.with_name(f"session-{i}.pid")
            s = await stack.enter_async_context(launch(config, errlog, pidfile=pidfile, read_timeout_s=CALL_TIMEOUT_S))
            first = await search(s.client, FIRST_QUERY, mode)
            first_s = time.perf_counter() - s.started
            if i == 0:
                res["cold"] = {"init": s.initialize_s, "first": first_s, "first_mode": first["mode"]}
                await wait_semantic(s.client, mode)  # the later sessions find the shared server warm
            else:
                res["init"].append(s.initialize_s)
                res["first"].append(first_s)
                res["first_mode"].append(first["mode"])
            say(
                "bench",
                f"session {i + 1}/{n}: initialize {s.initialize_s * 1000:.0f} ms, first answer ({first['mode']}) {first_s * 1000:.0f} ms after launch",
            )
            sessions.append(s)
        for q in QUERIES[:3]:
            await search(direct.client, q, mode)
            await search(sessions[-1].client, q, mode)
        for q in (QUERIES * 2)[:SEARCHES]:  # alternated, so both see the same machine
            for key, client in (("direct", direct.client), ("relay", sessions[-1].client)):
                t = time.perf_counter()
                await search(client, q, mode)
                res[key].append(time.perf_counter() - t)
        for s in sessions[:-1]:
            await search(s.client, QUERIES[0], mode)  # every session has searched
        serving = await serving_info(sessions[-1].client, CALL_TIMEOUT_S)
        res["attached"] = serving.get("sessions_attached")
        shared_pid = serving.get("pid") if serving.get("mode") == "shared" else None
        relay_pids = [s.pid for s in sessions if s.pid is not None]
        res["relay_rss"] = [resident_memory_mb(p)[0] or 0.0 for p in relay_pids]
        res["relay_pss"] = [proportional_memory_mb(p) or 0.0 for p in relay_pids]
        res["shared_rss"] = resident_memory_mb(shared_pid)[0] if shared_pid else None
        res["shared_pss"] = proportional_memory_mb(shared_pid) if shared_pid else None
        direct_pid = read_pid(config.with_name("direct.pid"))
        res["direct_rss"] = resident_memory_mb(direct_pid)[0] if direct_pid else None
        res["direct_pss"] = proportional_memory_mb(direct_pid) if direct_pid else None
    return res


def add_session_metrics(add: Callable[..., None], se: dict[str, Any], n: int) -> None:
    """The --sessions figures (issue 32's bars beside each)."""
    cold = se["cold"]
    add("cold_session_initialize_ms", cold["init"] * 1000, "ms", "first session, no shared server running")
    add("cold_session_first_answer_ms", cold["first"] * 1000, "ms", f"first session, mode {cold['first_mode']}")
    add("later_session_initialize_ms", median(se["init"]) * 1000, "ms", f"launch -> initialize, median of {n - 1} (bar 300)")
    add("later_session_initialize_max_ms", max(se["init"]) * 1000, "ms")
    add(
        "later_session_first_answer_ms",
        median(se["first"]) * 1000,
        "ms",
        f"launch -> first search reply, median of {n - 1} (bar 500)",
    )
    add("later_session_first_answer_max_ms", max(se["first"]) * 1000, "ms")
    add("later_session_first_modes", ",".join(sorted(set(se["first_mode"]))), "mode", "hybrid: semantic results included")
    relay, direct = median(se["relay"]) * 1000, median(se["direct"]) * 1000
    add("search_p50_relay_ms", relay, "ms", f"{len(se['relay'])} searches through a relay, alternated with the direct ones")
    add("search_p50_direct_ms", direct, "ms", "a server of its own (--no-shared)")
    add("search_p50_relay_minus_direct_ms", relay - direct, "ms", "bar: within 2")
    total_rss = sum(se["relay_rss"]) + (se["shared_rss"] or 0.0)
    add("sessions_attached", se["attached"], "sessions")
    add("relay_rss_mb", median(se["relay_rss"]), "MB", "VmRSS of one relay, median")
    add("shared_server_rss_mb", se["shared_rss"], "MB", "VmRSS of the shared server after every session searched")
    add("direct_server_rss_mb", se["direct_rss"], "MB", "VmRSS of the direct server after its searches")
    add("sessions_total_rss_mb", total_rss, "MB", f"{n} relays + the shared server, VmRSS summed")
    if se["direct_rss"]:
        add("sessions_rss_ratio", total_rss / se["direct_rss"], "x", "total over one direct server's (bar: <= 1.3)")
    total_pss = sum(se["relay_pss"]) + (se["shared_pss"] or 0.0)
    add("sessions_total_pss_mb", total_pss, "MB", "the same in PSS (shared pages counted once)")
    if se["direct_pss"]:
        add("sessions_pss_ratio", total_pss / se["direct_pss"], "x", "total PSS over the direct server's PSS")


def run_mcp_bench(args: Any, out_dir: Path) -> dict[str, Any]:
    """Every MCP phase, quiet and (with --busy) beside a spinning core; returns {"env", "metrics"} like bench.py."""
    vault, source = prepare_vault(out_dir, args.kb_dir, args.synthetic)
    say("bench", f"vault: {vault} ({source})")
    mode = args.mode
    config = write_config(
        out_dir / "server.yaml",
        vault,
        out_dir / "data",
        getattr(args, "model", None),
        search={"mode": mode},
        server={"log_level": "INFO"},
    )
    log = out_dir / "server.log"
    log.unlink(missing_ok=True)
    if args.data_dir is not None and args.kb_dir is not None:
        seeded = seed_index(args.kb_dir.expanduser().resolve(), args.data_dir.expanduser().resolve(), config)
        say("bench", "index seeded from " + str(args.data_dir) if seeded else f"no index of {args.kb_dir} in {args.data_dir}")
    say("bench", "bringing the copy's index up to date with ingest.py")
    t = time.perf_counter()
    run_ingest(config, log)
    say("bench", f"ingest.py: {time.perf_counter() - t:.1f} s")
    cfg = load_config(config, env={})
    starts = args.repeat or DEFAULT_STARTS
    metrics: list[Metric] = []
    label = f"{cfg.embed_model} (server, mode {mode})"
    conditions = [("", None)] + ([("_busy", Busy)] if args.busy else [])
    with log.open("a", encoding="utf-8") as errlog, private_runtime() as runtime:
        for suffix, competitor in conditions:
            where = "beside a process spinning one core" if competitor else "quiet"
            say("bench", f"--- {where}: {starts} launches, then {SEARCHES} searches and {len(EDIT_KINDS)} edits")
            with competitor() if competitor else contextlib.nullcontext():
                sessions = getattr(args, "sessions", None)
                if sessions:
                    ss = anyio.run(bench_sessions, config, errlog, sessions, mode, runtime)
                st = anyio.run(bench_starts, config, errlog, starts, mode, runtime)
                se = anyio.run(bench_session, config, errlog, vault, mode, suffix.strip("_") or "quiet")

            def add(key: str, value: Any, unit: str, note: str = "", suffix: str = suffix, where: str = where) -> None:
                metrics.append(Metric(f"mcp_{key}{suffix}", value, unit, label, f"{note}; {where}".lstrip("; ")))

            if sessions:
                add_session_metrics(add, ss, sessions)
            add("initialize_ms", median(st["init"]) * 1000, "ms", f"launch -> initialize reply, median of {starts}")
            add(
                "first_answer_ms",
                median(st["first"]) * 1000,
                "ms",
                f"launch -> first search reply, median of {starts}",
            )
            add("first_answer_mode", st["first_mode"][-1], "mode", "mode of the last launch's first answer")
            joined = [s for s in st["semantic"] if s is not None]
            if mode != "keyword":
                add(
                    "semantic_joins_ms",
                    median(joined) * 1000 if joined else None,
                    "ms",
                    f"launch -> first answer with semantic results, median of {len(joined)}",
                )
            add("search_p50_ms", median(se["times"]) * 1000, "ms", f"{len(se['times'])} searches, warm, client-side")
            add("search_p95_ms", percentile(se["times"], 0.95) * 1000, "ms")
            alt_p50 = median(se["alt_times"])
            add("search_alt4_p50_ms", alt_p50 * 1000, "ms", f"the same queries with {ALTERNATIVES} alternatives each")
            add("search_alt4_ratio", round(alt_p50 / median(se["times"]), 2), "x", "alternatives p50 / plain p50")
            add("server_peak_rss_mb", se["memory"][0], "MB", se["memory"][1] + ", after the searches and edits")
            add("server_rss_mb", se["resident"][0], "MB", "VmRSS after the searches (model loaded, index open)")
            add("server_private_mb", se["resident"][1], "MB", "RssAnon then: the part no other process shares")
            for kind, (found, tries) in se["edits"].items():
                add(f"edit_{kind}_ms", None if found is None else found * 1000, "ms", "saved -> the reply that shows it")
                add(f"edit_{kind}_searches", tries if found is not None else None, "searches", "1 = the very next search")
            fresh = se["status"].get("freshness", {})
            add("full_walks_before_search", fresh.get("full_walks_before_search"), "walks", "in the warm session")
    status = se["status"]
    env = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": sys.version.split()[0],
        "vault": source,
        "out_dir": str(out_dir),
        "notes": status.get("notes"),
        "chunks": status.get("chunks"),
        "embedder": cfg.embed_model,
        "fake_embedder": cfg.embed_model == HASH_MODEL_NAME,
        "mode": mode,
        "starts": starts,
        "busy": bool(args.busy),
        "change_detection": status.get("change_detection"),
    }
    return {
        "env": env,
        "metrics": {m.key: {"value": m.value, "unit": m.unit, "embedder": m.embedder, "note": m.note} for m in metrics},
    }
