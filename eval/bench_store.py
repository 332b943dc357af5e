"""Vector store benchmark: the same vault indexed with vectors in local segment files and in a Chroma server.

For each store: full ingest, no-change sync, hybrid and semantic search p50/p95 over the golden questions (or fixed
queries), edit-to-searchable. Starts its own `chroma run` on a free port for the http store and stops it.
Usage: python eval/bench_store.py --kb-dir DIR [--golden FILE.jsonl] [--stores local,http] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import percentile

from kb_config import KBError, load_config, setup_logging

# Queries used when no golden file is given.
DEFAULT_QUERIES = ("how do I list files", "compress a folder", "查看进程", "git undo last commit", "网络连接测试")
# Searches timed per mode (cycling through the queries).
SEARCHES = 60
# How long `chroma run` may take to answer its heartbeat.
CHROMA_START_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_chroma(path: Path) -> tuple[subprocess.Popen, int]:
    exe = Path(sys.executable).parent / "chroma"
    port = _free_port()
    proc = subprocess.Popen(
        [str(exe) if exe.exists() else "chroma", "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + CHROMA_START_S
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1).read()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise KBError(f"chroma run did not answer within {CHROMA_START_S} s")


def bench_store(vault: Path, work: Path, store: str, queries: list[str], port: int | None) -> dict[str, Any]:
    """Index `vault` with vectors in `store`, then time what a user waits for."""
    from kb_engine import Engine
    from kb_search import Searcher

    env = {"KB_DIR": str(vault), "KB_DATA_DIR": str(work / f"data-{store}")}
    if os.environ.get("KB_EMBED_MODEL"):
        env["KB_EMBED_MODEL"] = os.environ["KB_EMBED_MODEL"]  # e.g. hash-embedder, to time the stores alone
    cfg = load_config(None, env=env)
    if store == "http":
        cfg = replace(cfg, vector_mode="http", chroma_host="127.0.0.1", chroma_port=port or 8000)
    engine = Engine(cfg)
    t0 = time.perf_counter()
    report = engine.sync_all()
    ingest_s = time.perf_counter() - t0
    nochange = []
    for _ in range(10):
        t = time.perf_counter()
        engine.sync_all()
        nochange.append((time.perf_counter() - t) * 1000)
    searcher = Searcher(engine)
    out: dict[str, Any] = {
        "store": store,
        "notes": len(engine.files),
        "chunks": len(engine.chunks),
        "chunks_embedded": report.chunks_embedded,
        "ingest_s": round(ingest_s, 1),
        "nochange_sync_ms_p50": round(statistics.median(nochange), 1),
    }
    for mode in ("hybrid", "semantic"):
        times = []
        for i in range(SEARCHES):
            t = time.perf_counter()
            searcher.search(queries[i % len(queries)], mode=mode)
            times.append((time.perf_counter() - t) * 1000)
        out[f"{mode}_ms_p50"] = round(statistics.median(times), 1)
        out[f"{mode}_ms_p95"] = round(percentile(times, 0.95), 1)
    note = sorted(engine.files)[0]
    target = vault / note
    target.write_text(target.read_text(encoding="utf-8") + "\n\nzymurgy benchmark marker\n", encoding="utf-8")
    t = time.perf_counter()
    engine.sync_all()
    hits = searcher.search("zymurgy benchmark marker", mode="keyword").hits
    out["edit_to_searchable_ms"] = round((time.perf_counter() - t) * 1000, 1)
    out["edit_found"] = bool(hits) and hits[0].path == note
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eval/bench_store.py",
        description="Compare the local vector store with a Chroma server (vector_store.mode http) on one vault: ingest, "
        "no-change sync, search p50/p95, edit-to-searchable. The vault is copied; the index goes to a temp folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--kb-dir", type=Path, required=True, help="the vault to benchmark (copied, never written)")
    parser.add_argument("--golden", type=Path, help="golden .jsonl whose questions are the search queries")
    parser.add_argument("--stores", default="local,http", help="comma-separated: local, http")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    setup_logging(0, True)
    queries = list(DEFAULT_QUERIES)
    if args.golden:
        queries = [json.loads(line)["q"] for line in args.golden.read_text(encoding="utf-8").splitlines() if line.strip()]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        work = Path(tmp)
        for store in [s.strip() for s in args.stores.split(",") if s.strip()]:
            vault = work / f"vault-{store}"
            shutil.copytree(args.kb_dir, vault, symlinks=True)
            proc, port = _start_chroma(work / "chroma") if store == "http" else (None, None)
            try:
                results.append(bench_store(vault, work, store, queries, port))
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    keys = [k for k in results[0] if k != "store"]
    print(f"{'':28}" + "".join(f"{r['store']:>14}" for r in results))
    for k in keys:
        print(f"{k:28}" + "".join(f"{r[k]!s:>14}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
