"""eval/faults.py part `soak`: a long day at a person's pace. Two servers, watcher.py and the external editor run on
one vault for D seconds (an hour in the full run); the servers search, append and ask index_status every few seconds.

Every SAMPLE_EVERY_S it reads each process's resident memory, open file descriptors and threads from /proc. Resources
must stay flat: the median of the last quarter of the samples at most GROWTH_LIMIT above the median of the first
quarter after warm-up (the first WARM_UP_SHARE of the run: start-up, the first sync and the first searches). Memory is
judged as the private (anonymous) resident set, where a leak shows; the file-backed part is reported beside it. That
part grows by design while new words arrive: MiniLM's 47 MB word table stays a memory map and only the rows of words
in use are paged in, pages the kernel shares between servers and may drop at any time (the 1-hour run's +12% was
that). At the
end, as in the storm: every acknowledged append and every external line present exactly once, and every live note
found at its path.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from faults_common import PYTHON, REPO_ROOT, START_TIMEOUT_S, Server, latency_figures, run_cli, tail
from faults_report import PartResult, Run
from faults_storm import INBOX, INBOX_START, Storm, check_hits, file_checks, read_editor_log, stop_watcher
from harness import write_config
from synthetic_vault import write_synthetic_vault

# Background notes in the soak vault.
SOAK_NOTES = 40
# A person's pace: seconds between one server loop's calls (uniform), and the editor's pauses scaled from the storm's
# 0.02-0.12 s to about 1-6 s.
SOAK_PAUSES = {"append": (5.0, 15.0), "search": (1.0, 4.0), "status": (10.0, 20.0)}
EDITOR_PAUSE_SCALE = 50.0
# Resource samples: how often, the share of the run that is warm-up, and the growth allowed after it.
SAMPLE_EVERY_S = 5.0
WARM_UP_SHARE = 1 / 3
GROWTH_LIMIT = 0.10
# Open files and threads are small counts: one started once after warm-up (an executor's worker, a timer) is not
# growth (7 -> 8 threads is +14%); a leak adds one per call, hundreds in an hour.
COUNT_SLACK = 1
# Fewest samples after warm-up for a growth judgement (a shorter run reports its figures without one).
MIN_SAMPLES = 8
# Live notes checked per server at the end.
FOUND_SAMPLE = 20


# What is judged for growth; "rss_kb" (all resident memory) and "rss_file_kb" are reported beside them.
JUDGED = ("rss_anon_kb", "fds", "threads")
REPORTED = ("rss_kb", "rss_file_kb")


def read_resources(pid: int) -> dict[str, int] | None:
    """{"rss_kb", "rss_anon_kb", "rss_file_kb", "fds", "threads"} of a live process, from /proc; None once it is
    gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kb = {
        key: int(fields[name].split()[0])
        for key, name in (("rss_kb", "VmRSS"), ("rss_anon_kb", "RssAnon"), ("rss_file_kb", "RssFile"))
    }
    return kb | {"fds": fds, "threads": int(fields["Threads"])}


def growth(samples: list[dict[str, int]], warm_up: int) -> dict[str, Any]:
    """Per resource: median of the first quarter after warm-up, of the last quarter, and the growth between them
    (None when there are too few samples to judge)."""
    after = samples[warm_up:]
    if len(after) < MIN_SAMPLES:
        return {"judged": False, "samples_after_warm_up": len(after)}
    q = max(1, len(after) // 4)
    out: dict[str, Any] = {"judged": True, "samples_after_warm_up": len(after)}
    # The private memory through the run, as the median of each tenth of the samples (MB): a plateau or a slope.
    tenth = max(1, len(samples) // 10)
    out["rss_anon_mb_by_tenth"] = [
        round(statistics.median(s["rss_anon_kb"] for s in samples[i : i + tenth]) / 1024, 1)
        for i in range(0, len(samples), tenth)
    ]
    for key in JUDGED + REPORTED:
        first = statistics.median(s[key] for s in after[:q])
        last = statistics.median(s[key] for s in after[-q:])
        out[key] = {"after_warm_up": first, "end": last, "growth": round((last - first) / first, 3) if first else 0.0}
    return out


async def _sample(pids: dict[str, int], every_s: float, until: float, out: dict[str, list[dict[str, int]]]) -> None:
    while time.monotonic() < until:
        for name, pid in pids.items():
            now = read_resources(pid)
            if now is not None:
                out.setdefault(name, []).append(now)
        await anyio.sleep(every_s)


def judge_growth(res: PartResult, samples: dict[str, list[dict[str, int]]], seconds: float, every_s: float) -> None:
    warm_up = int(seconds * WARM_UP_SHARE / every_s)
    figures: dict[str, Any] = {}
    for name, rows in samples.items():
        figures[name] = g = growth(rows, warm_up)
        for key in JUDGED:
            slack = COUNT_SLACK if key in ("fds", "threads") else 0
            if g["judged"] and g[key]["growth"] > GROWTH_LIMIT and g[key]["end"] - g[key]["after_warm_up"] > slack:
                res.fail(
                    f"{name}: {key} over the soak",
                    f"flat after warm-up (growth <= {GROWTH_LIMIT:.0%})",
                    f"{g[key]['after_warm_up']:g} -> {g[key]['end']:g} ({g[key]['growth']:+.1%})",
                )
    res.figures["resources"] = figures


async def _soak(run: Run, res: PartResult, base: Path, vault: Path, config: Path, seconds: float) -> None:
    procs = run.procs
    watcher = procs.popen([PYTHON, "watcher.py", "--config", str(config)], log=base / "watcher.log")
    log = base / "editor.jsonl"
    every_s = min(SAMPLE_EVERY_S, max(1.0, seconds / 60))
    samples: dict[str, list[dict[str, int]]] = {}
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(Server(procs, config, base, f"soak-{k}")) for k in range(2)]
        for s in servers:
            warm = await s.call("search_my_knowledge_base", {"query": "warm up", "mode": "semantic"}, START_TIMEOUT_S)
            if warm.kind != "ok":
                res.fail(f"{s.name}: first search (warm-up)", "ok", f"{warm.kind}: {warm.text[:300]}")
        editor = procs.popen(
            [PYTHON, str(REPO_ROOT / "eval" / "faults_editor.py"), str(vault), str(log), str(seconds), str(run.seed)]
            + [str(int(seconds)), str(EDITOR_PAUSE_SCALE)],
            log=base / "editor.err",
        )
        pids = {s.name: s.pid for s in servers if s.pid is not None} | {"watcher": watcher.pid}
        if servers[0].shared_pid is not None:
            pids["shared"] = servers[0].shared_pid  # the one server both sessions' relays attached to
        storm = Storm(run, time.monotonic() + seconds, SOAK_PAUSES)
        run.say(f"soak: 2 servers, watcher and editor at a person's pace for {seconds:.0f} s")
        async with anyio.create_task_group() as tg:
            storm.start_loops(tg, servers)
            tg.start_soon(_sample, pids, every_s, storm.deadline, samples)
        try:
            await anyio.to_thread.run_sync(lambda: editor.wait(timeout=60))
        except subprocess.TimeoutExpired:
            res.fail("editor", "finishes at the soak's end", "still running 60 s later; killed")
            procs.kill(editor.pid)
        await anyio.sleep(3.0)  # the watcher's debounce and the servers' event syncs
        events = read_editor_log(log)
        done = next((e for e in events if e.get("op") == "done"), {})
        live = sorted((t, p) for p, t in done.get("notes", {}).items())
        picked = dict(run.rng.sample(live, min(FOUND_SAMPLE, len(live))))
        found: dict[str, int] = {}
        for s in servers:
            for k, v in (await check_hits(s, vault, picked, True, res)).items():
                found[k] = found.get(k, 0) + v
    stop_watcher(procs, watcher, res)
    judge_growth(res, samples, seconds, every_s)
    file_checks(res, vault, storm, events)
    calls = [c for s in servers for c in s.calls]
    res.figures.update(
        seconds=seconds,
        sample_every_s=every_s,
        editor_ops=sum(1 for e in events if e.get("op") not in ("done", None)),
        calls=len(calls),
        latency=latency_figures(calls),
        end_searches=found,
        failed_calls=len(storm.bad),
    )
    for name, o in storm.bad[:5]:
        res.fail(f"{o.tool} during the soak ({name})", "ok", f"{o.kind}: {o.text[:300]}")


def run_soak(run: Run, seconds: float) -> PartResult:
    res = PartResult("soak")
    base = run.folder("soak")
    vault = base / "vault"
    write_synthetic_vault(vault, SOAK_NOTES, run.seed)
    (vault / INBOX).write_text(INBOX_START, encoding="utf-8")
    config = write_config(base / "config.yaml", vault, base / "data", run.model, write={"writable": [INBOX]})
    rc, _, _ = run_cli(run.procs, ["ingest.py", "--config", str(config), "-q"], 180, base / "ingest.log")
    if rc != 0:
        res.fail("setup: first index", "exit 0", f"exit {rc}: {tail(base / 'ingest.log')}")
        return res
    anyio.run(_soak, run, res, base, vault, config, seconds)
    return res
