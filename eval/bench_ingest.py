"""Time a from-scratch `ingest.py` of a vault and sample the memory of all its processes (the CLI and its embedding
workers) from /proc: wall, CPU seconds, peak summed Pss (shared pages counted once), peak VmRSS of the largest
process. `--code-dir` runs another checkout's ingest.py (the code before a change) with this interpreter, so before
and after run on one machine, one after the other. Imports: harness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import PYTHON, REPO_ROOT, child_env, proportional_memory_mb, resident_memory_mb, say, write_config

# Seconds between two samples of the processes' memory.
SAMPLE_INTERVAL_S = 0.5


def _descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (read from /proc/*/stat's parent field)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def run_ingest(code_dir: Path, kb_dir: Path, data_dir: Path, model: str | None) -> dict:
    """One ingest from scratch into `data_dir`, sampled; returns its figures and the CLI's own JSON summary."""
    config = write_config(data_dir.parent / f"{data_dir.name}-config.yaml", kb_dir, data_dir, model)
    cmd = [PYTHON, str(code_dir / "ingest.py"), "--config", str(config), "--json", "-q"]
    started = time.perf_counter()
    before = os.times()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=child_env(), cwd=code_dir)
    peak_pss = peak_rss = 0.0
    while proc.poll() is None:
        pss = rss = 0.0
        for pid in _descendants(proc.pid):
            pss += proportional_memory_mb(pid) or 0.0
            rss = max(rss, resident_memory_mb(pid)[0] or 0.0)
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        time.sleep(SAMPLE_INTERVAL_S)
    out = proc.stdout.read() if proc.stdout else b""
    wall = time.perf_counter() - started
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"ingest exited {proc.returncode}: {' '.join(cmd)}")
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round((after.children_user - before.children_user) + (after.children_system - before.children_system), 1),
        "peak_pss_mb": round(peak_pss, 1),
        "peak_rss_largest_mb": round(peak_rss, 1),
        "summary": json.loads(out.decode("utf-8")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="example: python eval/bench_ingest.py --kb-dir ../shared/corpora/hello-algo --repeat 1 --json",
    )
    ap.add_argument("--kb-dir", type=Path, required=True, help="the vault to index (read only)")
    ap.add_argument("--code-dir", type=Path, default=REPO_ROOT, help="the checkout whose ingest.py runs")
    ap.add_argument("--out-dir", type=Path, help="where the index goes (default: a temp dir, removed after)")
    ap.add_argument("--model", help="embedding.model (default: the configured default pair)")
    ap.add_argument("--repeat", type=int, default=1, help="ingests from scratch; the median is reported")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="kb-bench-ingest-"))
    runs = []
    try:
        for i in range(args.repeat):
            data_dir = out_dir / f"data-{i}"
            shutil.rmtree(data_dir, ignore_errors=True)
            say("ingest", f"run {i + 1} of {args.repeat}: {args.code_dir / 'ingest.py'} on {args.kb_dir}")
            runs.append(run_ingest(args.code_dir.resolve(), args.kb_dir.resolve(), data_dir, args.model))
            say("ingest", f"{runs[-1]['wall_s']} s, {runs[-1]['cpu_s']} CPU-s, peak Pss {runs[-1]['peak_pss_mb']} MB")
    finally:
        if args.out_dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    walls = sorted(r["wall_s"] for r in runs)
    result = {
        "kb_dir": str(args.kb_dir),
        "code_dir": str(args.code_dir),
        "wall_s_median": walls[len(walls) // 2],
        "cpu_s_median": sorted(r["cpu_s"] for r in runs)[len(runs) // 2],
        "peak_pss_mb_max": max(r["peak_pss_mb"] for r in runs),
        "peak_rss_largest_mb_max": max(r["peak_rss_largest_mb"] for r in runs),
        "chunks_embedded": runs[0]["summary"].get("chunks_embedded"),
        "runs": runs,
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key in ("wall_s_median", "cpu_s_median", "peak_pss_mb_max", "peak_rss_largest_mb_max", "chunks_embedded"):
            print(f"{key:28} {result[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
