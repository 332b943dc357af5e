"""eval/faults.py parts `kills` and `append-kills`: kill -9 of ingest.py mid-index and of a server mid-append.

kills: N SIGKILLs of `ingest.py` at random moments of a first index, an incremental re-index (after random edits)
and `--rebuild`, each followed by a completing run; the index must then equal a fresh rebuild in another data dir.
append-kills: a server appending to inbox.md is killed at a random moment; the note must be unchanged or hold every
acknowledged append whole, and a killed append's temp file must be swept by the next start once it is stale.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import anyio
from faults_common import (
    PYTHON,
    START_TIMEOUT_S,
    Processes,
    Server,
    build_reference,
    compare_with_rebuild,
    index_problems,
    load_cfg,
    make_test_embedder,
    read_index,
    run_cli,
    tail,
    temp_leftovers,
)
from faults_report import PartResult, Run
from harness import write_config
from synthetic_vault import render_synthetic_note, write_synthetic_vault

# Notes in the generated vault (quick / full): enough chunks that embedding spans several segments.
KILL_NOTES_QUICK, KILL_NOTES_FULL = 60, 200
# The phases a kill lands in; rounds cycle through them in a shuffled order.
KILL_PHASES = ("first", "incremental", "rebuild")
# Earliest kill after the start (the interpreter is still importing before this).
KILL_MIN_S = 0.05
# Rounds at most per kill asked for (a round whose ingest finished before the kill is repeated).
MAX_ROUNDS_PER_KILL = 3
# Notes changed before each incremental round (modified, added, deleted or renamed).
EDITS_PER_ROUND = 12
# Longest a completing ingest may take before it counts as hung (killed, exit 124).
INGEST_TIMEOUT_S = 600.0
# Queries whose top-5 must equal a fresh rebuild's: words the synthetic vault uses, in both languages.
QUERIES = (
    "backup restore archive",
    "docker logs container",
    "network timeout retry proxy",
    "数据库 迁移 索引",
    "会议 决定 负责人",
    "python install package dependency",
    "password key login account",
    "git push branch merge",
)
# append-kills: appends per round at most (the kill normally comes first), and the kill's random moment.
APPENDS_PER_ROUND = 40
APPEND_KILL_MAX_S = 1.5
# Characters of payload per append: a multi-line block big enough that a torn write would show.
APPEND_PAYLOAD_CHARS = 1500
# A call in this part taking longer than this is a hang (the server is killed well before).
APPEND_CALL_TIMEOUT_S = 30.0
# How old a leftover temp file must be before a start-up sweep removes it (kb_files.STALE_TEMP_S).
STALE_TEMP_S = 600.0
# Initial content of inbox.md: ends with a newline after a non-blank line, so every append adds "\n" + block + "\n".
INBOX_START = "# Inbox\n\nThings to remember.\n"


# ---- kills -----------------------------------------------------------------------------------------------------


def edit_vault(vault: Path, rng: random.Random, n_ops: int, next_index: list[int]) -> dict[str, int]:
    """Random edits a user makes between two indexing runs; returns counts per kind."""
    counts = {"modified": 0, "added": 0, "deleted": 0, "renamed": 0}
    for _ in range(n_ops):
        notes = sorted(p for p in vault.rglob("*.md") if p.is_file())
        op = rng.choice(("modified", "modified", "added", "deleted", "renamed")) if notes else "added"
        if op == "added":
            rel, text = render_synthetic_note(rng, next_index[0])
            next_index[0] += 1
            path = vault / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        else:
            victim = rng.choice(notes)
            if op == "modified":
                _, text = render_synthetic_note(rng, next_index[0])
                keep = victim.read_text(encoding="utf-8").split("\n")
                cut = rng.randint(0, len(keep))
                victim.write_text("\n".join(keep[:cut]) + "\n\n" + text.split("---", 2)[-1], encoding="utf-8")
            elif op == "deleted":
                victim.unlink()
            else:
                victim.rename(victim.with_name(f"renamed-{next_index[0]}.md"))
                next_index[0] += 1
        counts[op] += 1
    return counts


def next_kill_bound(bound_s: float, delay_s: float, hit: bool) -> float:
    """The latest kill moment to draw from next time in a phase. An ingest that finished before a kill at delay_s
    took less than delay_s (the machine got quieter since the estimate was measured): halve that, so the next kill
    in this phase lands. A landed kill keeps the bound."""
    return bound_s if hit else min(bound_s, delay_s) / 2


def _kill_ingest(procs: Processes, args: list[str], delay_s: float, log: Path) -> bool:
    """Start ingest.py and SIGKILL it after delay_s; True if the kill landed (it was still running)."""
    p = procs.popen([PYTHON, "ingest.py", *args], log=log)
    try:
        p.wait(timeout=delay_s)
        return False
    except subprocess.TimeoutExpired:
        procs.kill(p.pid)
        p.wait()
        return True


def run_kills(run: Run, n_kills: int, n_notes: int | None = None) -> PartResult:
    """N random kill -9 of ingest.py, each followed by a completing run compared with a fresh rebuild."""
    res = PartResult("kills")
    base = run.folder("kills")
    vault = base / "vault"
    write_synthetic_vault(vault, n_notes or (KILL_NOTES_QUICK if run.quick else KILL_NOTES_FULL), run.seed)
    config = write_config(base / "config.yaml", vault, base / "data", run.model)
    ref_config = write_config(base / "ref.yaml", vault, base / "ref", run.model)
    cfg, ref_cfg = load_cfg(config), load_cfg(ref_config)
    embedder = make_test_embedder(cfg)
    log = base / "ingest.log"
    next_index = [100_000]

    rc, _, first_s = run_cli(run.procs, ["ingest.py", "--config", str(config), "-q"], INGEST_TIMEOUT_S, log)
    if rc != 0:
        res.fail("setup: first index", "exit 0", f"exit {rc}: {tail(log)}", f"{PYTHON} ingest.py --config {config}")
        return res
    edit_vault(vault, run.rng, EDITS_PER_ROUND, next_index)
    _, _, incremental_s = run_cli(run.procs, ["ingest.py", "--config", str(config), "-q"], INGEST_TIMEOUT_S, log)
    estimate = {"first": first_s, "rebuild": first_s, "incremental": incremental_s}
    run.say(f"kills: first index {first_s:.1f} s, incremental {incremental_s:.1f} s; {n_kills} kills follow")

    # Rounds go on until n_kills kills landed on a running ingest (one that finished first does not count).
    # Each run of three rounds covers every phase once, in a random order, so even --quick's 3 kills hit all three.
    phases: list[str] = []
    while len(phases) < n_kills * MAX_ROUNDS_PER_KILL:
        phases += run.rng.sample(KILL_PHASES, len(KILL_PHASES))
    landed = {p: 0 for p in KILL_PHASES}
    missed = {p: 0 for p in KILL_PHASES}
    ties = completing_s = 0.0
    edits: dict[str, int] = {}
    stale: list[Path] = []
    res.figures.update(index_temp_files_left=0, index_temp_bytes_left=0, index_temp_files_swept=0)
    for i, phase in enumerate(phases, 1):
        if sum(landed.values()) >= n_kills:
            break
        args = ["--config", str(config), "-q"]
        if phase == "first":
            shutil.rmtree(cfg.index_dir, ignore_errors=True)
            stale = []
        elif phase == "incremental":
            for k, v in edit_vault(vault, run.rng, EDITS_PER_ROUND, next_index).items():
                edits[k] = edits.get(k, 0) + v
        else:
            args.append("--rebuild")
        delay = run.rng.uniform(KILL_MIN_S, max(KILL_MIN_S * 2, estimate[phase]))
        hit = _kill_ingest(run.procs, args, delay, log)
        (landed if hit else missed)[phase] += 1
        estimate[phase] = next_kill_bound(estimate[phase], delay, hit)
        repro = f"kill -9 of `{PYTHON} ingest.py {' '.join(args)}` after {delay:.2f} s (round {i}, seed {run.seed})"
        rc, out, secs = run_cli(run.procs, ["ingest.py", "--config", str(config), "--json", "-q"], INGEST_TIMEOUT_S, log)
        completing_s += secs
        if rc != 0:
            res.fail(f"kill {i} ({phase}): completing run", "exit 0", f"exit {rc}: {tail(log)}", repro)
            continue
        shutil.rmtree(ref_cfg.index_dir, ignore_errors=True)
        got, ref = read_index(cfg, embedder), build_reference(ref_cfg, embedder)
        problems = index_problems(got) + [f"fresh rebuild: {p}" for p in index_problems(ref)]
        diff, tie_lists = compare_with_rebuild(got, ref, QUERIES)
        ties += tie_lists
        for p in problems + diff:
            res.fail(
                f"kill {i} ({phase}, {'landed' if hit else 'ingest had finished'})", "index equals a fresh rebuild", p, repro
            )
        # Temp files a killed writer left in the index: made stale now, the next completing run must sweep them.
        for p in stale:
            if p.exists():
                res.fail(f"kill {i}: stale temp file in the index", "swept by the next run", f"{p} still there", repro)
        res.figures["index_temp_files_swept"] += sum(1 for p in stale if not p.exists())
        stale = temp_leftovers(cfg.index_dir)
        res.figures["index_temp_files_left"] += len(stale)
        res.figures["index_temp_bytes_left"] += sum(p.stat().st_size for p in stale)
        old = time.time() - STALE_TEMP_S - 60
        for p in stale:
            os.utime(p, (old, old))
        run.say(
            f"kills: round {i} ({sum(landed.values())}/{n_kills} landed) {phase} after {delay:.2f} s "
            f"({'landed' if hit else 'finished first'}): "
            f"{'ok' if not problems + diff else f'{len(problems + diff)} problems'}"
        )
        res.figures["chunks"] = got.chunks
        res.figures["notes"] = len(got.chunk_ids)
    res.figures.update(
        kills=sum(landed.values()),
        rounds=sum(landed.values()) + sum(missed.values()),
        kills_landed=landed,
        ingest_finished_before_kill=missed,
        edits=edits,
        queries_compared=len(QUERIES) * 3 * (sum(landed.values()) + sum(missed.values())),
        top5_tie_only_differences=int(ties),
        first_index_s=round(first_s, 2),
        mean_completing_run_s=round(completing_s / max(1, sum(landed.values()) + sum(missed.values())), 2),
        model=embedder.name,
    )
    return res


# ---- append-kills ---------------------------------------------------------------------------------------------


def _block(round_no: int, n: int, rng: random.Random) -> str:
    payload = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(APPEND_PAYLOAD_CHARS))
    return f"- append-kill r{round_no} n{n} begin\n  payload {payload}\n  append-kill r{round_no} n{n} end"


def _render(blocks: list[str]) -> str:
    return "".join("\n" + b + "\n" for b in blocks)


def classify_note(before: str, after: str, acked: list[str], inflight: str | None) -> str:
    """unchanged | whole | whole+inflight (the unacknowledged last append landed) | torn."""
    if after == before:
        return "unchanged" if not acked else "lost"
    if not after.startswith(before):
        return "torn"
    rest = after[len(before) :]
    if rest == _render(acked):
        return "whole"
    if inflight is not None and rest == _render([*acked, inflight]):
        return "whole+inflight"
    return "torn"


async def _append_round(run: Run, config: Path, vault: Path, workdir: Path, r: int, res: PartResult, aged: list[Path]) -> str:
    inbox = vault / "inbox.md"
    before = inbox.read_text(encoding="utf-8")
    acked: list[str] = []
    inflight: list[str | None] = [None]
    delay = run.rng.uniform(0.02, APPEND_KILL_MAX_S)
    repro = f"append-kill round {r}: SIGKILL {delay:.2f} s into sequential appends to inbox.md (seed {run.seed})"
    async with Server(run.procs, config, workdir, f"append-{r}") as s:
        first = await s.call("index_status", timeout_s=START_TIMEOUT_S)
        if first.kind != "ok":
            res.fail(f"round {r}: index_status after start", "ok", f"{first.kind}: {first.text}", repro)
        # the start-up sync has run: stale leftovers of the previous kill must be gone
        for p in aged:
            if p.exists():
                res.fail(f"round {r}: stale temp file", "swept by the next start", f"{p.name} still in {p.parent}", repro)
        res.figures["stale_temp_swept"] += sum(1 for p in aged if not p.exists())

        async def appender() -> None:
            for n in range(APPENDS_PER_ROUND):
                block = _block(r, n, run.rng)
                inflight[0] = block
                o = await s.call("update_knowledge_base", {"path": "inbox.md", "content": block}, APPEND_CALL_TIMEOUT_S)
                if o.kind == "ok":
                    acked.append(block)
                    inflight[0] = None
                    continue
                if o.kind != "disconnected":
                    res.fail(f"round {r} append {n}", "ok, or disconnected by the kill", f"{o.kind}: {o.text}", repro)
                return

        async def killer() -> None:
            await anyio.sleep(delay)
            s.kill()

        async with anyio.create_task_group() as tg:
            tg.start_soon(appender)
            tg.start_soon(killer)
    after = inbox.read_text(encoding="utf-8", errors="replace")
    verdict = classify_note(before, after, acked, inflight[0])
    if verdict in ("torn", "lost"):
        res.fail(
            f"round {r}", "note unchanged or every acknowledged append whole", f"{verdict} ({len(acked)} acknowledged)", repro
        )
    res.figures["acknowledged_appends"] += len(acked)
    return verdict


async def _append_kills(run: Run, n_rounds: int, res: PartResult) -> None:
    base = run.folder("append-kills")
    vault = base / "vault"
    write_synthetic_vault(vault, 10, run.seed)
    (vault / "inbox.md").write_text(INBOX_START, encoding="utf-8")
    config = write_config(base / "config.yaml", vault, base / "data", run.model, write={"writable": ["inbox.md"]})
    verdicts: dict[str, int] = {}
    aged: list[Path] = []
    for r in range(1, n_rounds + 2):  # the last start only checks the sweep
        if r > n_rounds:
            async with Server(run.procs, config, base, "append-final") as s:
                await s.call("index_status", timeout_s=START_TIMEOUT_S)
                for p in aged:
                    if p.exists():
                        res.fail("final start: stale temp file", "swept by the next start", f"{p.name} still there")
                res.figures["stale_temp_swept"] += sum(1 for p in aged if not p.exists())
            break
        verdict = await _append_round(run, config, vault, base, r, res, aged)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
        leftovers = temp_leftovers(vault)
        res.figures["temp_files_after_kill"] += len(leftovers)
        old = time.time() - STALE_TEMP_S - 60
        for p in leftovers:  # make them stale, so the next start must sweep them
            os.utime(p, (old, old))
        aged = leftovers
        run.say(f"append-kills: round {r}/{n_rounds}: {verdict}, {len(leftovers)} temp files left")
    res.figures["verdicts"] = verdicts
    res.figures["temp_files_in_vault_at_end"] = len(temp_leftovers(vault))


def run_append_kills(run: Run, n_rounds: int) -> PartResult:
    res = PartResult("append-kills")
    res.figures.update(rounds=n_rounds, acknowledged_appends=0, temp_files_after_kill=0, stale_temp_swept=0)
    anyio.run(_append_kills, run, n_rounds, res)
    return res
