"""Fault drills against real processes: kill -9 of ingest and of a server mid-append, a multi-process edit storm,
hostile paths, broken notes and bad tool arguments, and a long day's soak. Prints figures and every inconsistency
with its repro.

Runs `ingest.py`, `watcher.py` and `mcp_server.py` as subprocesses (the server through the MCP SDK's stdio client)
on vaults it generates in a temp folder; never touches your notes or index. POSIX only. The parts live in
eval/faults_kills.py, eval/faults_storm.py, eval/faults_hostile.py and eval/faults_soak.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from faults_common import HASH_MODEL, Processes
from faults_report import PartResult, Run
from harness import private_runtime

PARTS = ("kills", "append-kills", "storm", "hostile", "soak")
# Seed of every random choice (kill moments, edits, storm operations): the same seed replays the same plan.
DEFAULT_SEED = 20240917
# Sizes of each part: quick (the test suite, well under 2 minutes on 2 cores) and full (docs/reliability.md).
QUICK = {"kills": 3, "append_kills": 2, "servers": 2, "storm_s": 8.0, "soak_s": 180.0}
FULL = {"kills": 50, "append_kills": 30, "servers": 3, "storm_s": 300.0, "soak_s": 3600.0}


def run_part(name: str, run: Run, args: argparse.Namespace) -> PartResult:
    t0 = time.perf_counter()
    run.say(f"part {name} starts")
    try:
        if name == "kills":
            from faults_kills import run_kills

            res = run_kills(run, args.kills, args.notes)
        elif name == "append-kills":
            from faults_kills import run_append_kills

            res = run_append_kills(run, args.append_kills)
        elif name == "storm":
            from faults_storm import run_storm

            res = run_storm(run, args.servers, args.storm_seconds)
        elif name == "soak":
            from faults_soak import run_soak

            res = run_soak(run, args.soak_seconds)
        else:
            from faults_hostile import run_hostile

            res = run_hostile(run)
    finally:
        run.procs.kill_all()  # whatever a part left running (a hung server, a watcher) ends here
    res.seconds = time.perf_counter() - t0
    run.say(f"part {name}: {res.inconsistencies} inconsistencies in {res.seconds:.0f} s")
    return res


def print_text(results: list[PartResult], header: str) -> None:
    print(header)
    for r in results:
        print(f"\n== {r.name}: {r.inconsistencies} inconsistencies ({r.seconds:.0f} s)")
        for k, v in r.figures.items():
            shown = json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else v
            print(f"  {k}: {shown}")
        for f in r.findings:
            print(f"  FAIL {f.case}\n       expected: {f.expected}\n       got:      {f.got}")
            if f.repro:
                print(f"       repro:    {f.repro}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eval/faults.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  .venv/bin/python eval/faults.py --quick\n"
        "  .venv/bin/python eval/faults.py --parts kills --kills 50 --json",
    )
    parser.add_argument("--quick", action="store_true", help="a small version of every part (about 80 s on 2 cores)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated parts to run, from {', '.join(PARTS)} (default: all)"
    )
    parser.add_argument("--kills", type=int, help=f"kill -9 of ingest.py (default {QUICK['kills']} quick, {FULL['kills']} full)")
    parser.add_argument(
        "--append-kills",
        type=int,
        help=f"kill -9 of a server mid-append (default {QUICK['append_kills']} quick, {FULL['append_kills']} full)",
    )
    parser.add_argument(
        "--servers", type=int, help=f"servers in the storm (default {QUICK['servers']} quick, {FULL['servers']} full)"
    )
    parser.add_argument(
        "--storm-seconds", type=float, help=f"length of the storm (default {QUICK['storm_s']:g} quick, {FULL['storm_s']:g} full)"
    )
    parser.add_argument(
        "--soak-seconds", type=float, help=f"length of the soak (default {QUICK['soak_s']:g} quick, {FULL['soak_s']:g} full)"
    )
    parser.add_argument("--notes", type=int, help="notes in the kills vault (default 60 quick, 200 full; fewer for --real-model)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of every random choice (default {DEFAULT_SEED})")
    parser.add_argument("--real-model", action="store_true", help="the configured default model instead of hash-embedder")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (vaults, indexes, server logs)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    sizes = QUICK if args.quick else FULL
    args.kills = sizes["kills"] if args.kills is None else args.kills
    args.append_kills = sizes["append_kills"] if args.append_kills is None else args.append_kills
    args.servers = sizes["servers"] if args.servers is None else args.servers
    args.storm_seconds = sizes["storm_s"] if args.storm_seconds is None else args.storm_seconds
    args.soak_seconds = sizes["soak_s"] if args.soak_seconds is None else args.soak_seconds

    root = Path(tempfile.mkdtemp(prefix="kb-faults-"))
    procs = Processes()
    run = Run(root, None if args.real_model else HASH_MODEL, args.quick, args.seed, procs, verbose=not args.quiet)
    results: list[PartResult] = []
    t0 = time.perf_counter()
    try:
        with private_runtime():  # the shared servers the relays start live in a folder of this run's own
            for name in parts:
                results.append(run_part(name, run, args))
    finally:
        procs.kill_all()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    total = sum(r.inconsistencies for r in results)
    mode = "quick" if args.quick else "full"
    if args.json:
        out = {
            "mode": mode,
            "model": run.model or "configured default",
            "seed": args.seed,
            "seconds": round(time.perf_counter() - t0, 1),
            "inconsistencies": total,
            "parts": {r.name: r.as_dict() for r in results},
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print_text(
            results,
            f"eval/faults.py {mode}, model {run.model or 'configured default'}, seed {args.seed}: "
            f"{total} inconsistencies in {time.perf_counter() - t0:.0f} s",
        )
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
