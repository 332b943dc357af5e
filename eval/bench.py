"""Performance benchmark: full ingest, no-change sync, edit-to-searchable, search latency, server start, memory, index size.

Times the product's own code paths (Engine.sync_all, Searcher.search, `mcp_server.py` over stdio) on a copy of a vault
or a generated one, with the index in --out-dir; never touches the user's notes or index. Imports the project modules.
Over 500 lines for a reason: each phase is a small function (bench_*, then *_metrics naming what it reports), and
the metrics' notes, which say how each number was taken, are most of its length.
`--mcp` times the server only, through the MCP SDK's client, as a user feels it (eval/bench_mcp.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio  # noqa: E402
from harness import (  # noqa: E402
    QUERIES,
    Metric,
    launch,
    median,
    peak_memory_mb,
    percentile,
    prepare_vault,
    say,
    write_config,
)
from synthetic_vault import SEED  # noqa: E402

from kb_config import KBError, load_config, setup_logging  # noqa: E402

# SEED (from synthetic_vault) also picks the notes edited and the raw-embedding sample: runs are comparable.
# Full ingests, raw-embedding runs and server starts timed to the first search when --repeat is not given.
DEFAULT_INGEST_RUNS, DEFAULT_FIRST_SEARCH_STARTS = 3, 2
# Server starts timed to the initialize reply (the last ones also time the first search).
INITIALIZE_STARTS = 5
# No-change syncs timed (the stale check before each search).
NOCHANGE_SYNCS = 20
# Notes edited for edit-to-searchable, and how long one may take before it counts as not found.
EDIT_NOTES, EDIT_TIMEOUT_S = 5, 60.0
# Timed passes over the query list per search mode (after one untimed warm-up pass).
SEARCH_ROUNDS = 3
# Above this many embedded chunks, raw embedder throughput is measured on a random sample of RAW_SAMPLE chunks.
RAW_SAMPLE_ABOVE, RAW_SAMPLE = 2048, 1024
# Searches sent to the last server process before its peak memory is read.
SERVER_EXTRA_SEARCHES = 6
# Longest wait for one server reply (the first search waits for the start-up sync and the model).
SERVER_REPLY_TIMEOUT_S = 180.0
# Dimension of the fake embedder (that of the default model, so the server's real query vectors fit the store).
FAKE_DIM = 384
SEARCH_MODES = ("hybrid", "keyword", "semantic")
SEARCH_TOOL = "search_my_knowledge_base"
# The server's first search after a cold start: a word most vaults (and the synthetic one) contain.
FIRST_QUERY = "backup"

# ---- in-process phases ------------------------------------------------------------------------------------------


class RecordingEmbedder:
    """Passes calls to an embedder; keeps the texts of each embed_documents call and the seconds spent embedding."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name
        self.calls: list[list[str]] = []
        self.seconds = 0.0

    def reset(self) -> None:
        self.calls, self.seconds = [], 0.0

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        t0 = time.perf_counter()
        out = self.inner.embed_documents(texts)
        self.seconds += time.perf_counter() - t0
        self.calls.append(list(texts))
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


def _config(vault: Path, data_dir: Path) -> Any:
    return load_config(None, env={"KB_DIR": str(vault), "KB_DATA_DIR": str(data_dir)})


def bench_ingest(vault: Path, out_dir: Path, embedder: RecordingEmbedder, runs: int) -> tuple[Any, dict[str, Any]]:
    """Full ingest `runs` times into fresh index folders, each followed by the bare embedder on the texts it embedded.

    Interleaving keeps both measured under the same machine load. Returns the last engine (index in out_dir/data).
    """
    from kb_engine import Engine

    res: dict[str, Any] = {"ingest_s": [], "embed_in_pipeline_s": [], "save_view_s": [], "raw_s": []}
    engine: Any = None
    for i in range(runs):
        data_dir = out_dir / ("data" if i == runs - 1 else f"data-run{i}")
        shutil.rmtree(data_dir, ignore_errors=True)
        if engine is not None:
            shutil.rmtree(engine.cfg.data_dir, ignore_errors=True)
        engine = Engine(_config(vault, data_dir), embedder)
        embedder.reset()
        t0 = time.perf_counter()
        res["report"] = engine.sync_all()
        res["ingest_s"].append(time.perf_counter() - t0)
        res["embed_in_pipeline_s"].append(embedder.seconds)
        t0 = time.perf_counter()
        engine.save_view()
        res["save_view_s"].append(time.perf_counter() - t0)
        raw_s, res["raw_note"] = time_raw_embed(embedder.inner, embedder.calls)
        res["raw_s"].append(raw_s)
        say(
            "bench",
            f"ingest {i + 1}/{runs}: {res['ingest_s'][-1]:.2f} s, {len(engine.files)} notes, {len(engine.chunks)} chunks, "
            f"{res['report'].chunks_embedded} embedded ({embedder.seconds:.2f} s inside the embedder); "
            f"bare embedder on the same texts {raw_s:.2f} s",
        )
    sizes = [len(c) for c in embedder.calls]
    res["call_sizes"] = f"{min(sizes)}-{max(sizes)}" if sizes else "-"
    return engine, res


def time_raw_embed(inner: Any, calls: list[list[str]]) -> tuple[float, str]:
    """Seconds the bare embedder takes for the engine's embed calls, replayed; sampled and scaled for big vaults."""
    texts = [t for call in calls for t in call]
    if len(texts) <= RAW_SAMPLE_ABOVE:
        t0 = time.perf_counter()
        for call in calls:
            inner.embed_documents(call)
        return time.perf_counter() - t0, "the same calls replayed"
    sample = random.Random(SEED).sample(texts, RAW_SAMPLE)
    size = int(statistics.median(len(c) for c in calls))
    t0 = time.perf_counter()
    for i in range(0, len(sample), size):
        inner.embed_documents(sample[i : i + size])
    elapsed = time.perf_counter() - t0
    return elapsed * len(texts) / len(sample), (
        f"extrapolated from a random sample of {RAW_SAMPLE} of the {len(texts)} embedded chunks, calls of {size}"
    )


def bench_nochange(engine: Any) -> dict[str, Any]:
    times, embedded, did_work = [], 0, 0
    for _ in range(NOCHANGE_SYNCS):
        t0 = time.perf_counter()
        report = engine.sync_all()
        times.append(time.perf_counter() - t0)
        embedded += report.chunks_embedded
        did_work += report.did_work
    return {"times": times, "embedded": embedded, "did_work": did_work}


def bench_edits(engine: Any, searcher: Any) -> dict[str, Any]:
    """Append a unique nonsense word to EDIT_NOTES notes; time sync + hybrid search until a hit holds the word, and
    count the searches whose first hit is that note (each earlier word is a look-alike of the next)."""
    rng = random.Random(SEED + 1)
    notes = sorted(p for p, r in engine.files.items() if not r.skipped and r.chunks)
    picked = rng.sample(notes, min(EDIT_NOTES, len(notes)))
    totals, syncs, searches, embedded, found, first, tries = [], [], [], [], 0, 0, []
    for path in picked:
        word = "zq" + "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(10))
        with (engine.cfg.kb_dir / path).open("a", encoding="utf-8") as f:
            f.write(f"\n\nbench marker {word}\n")
        t0 = time.perf_counter()
        hit, n, sync_s, search_s, emb = False, 0, 0.0, 0.0, 0
        while not hit and time.perf_counter() - t0 < EDIT_TIMEOUT_S:
            n += 1
            t1 = time.perf_counter()
            report = engine.sync_all()
            t2 = time.perf_counter()
            result = searcher.search(word, mode="hybrid")
            sync_s, search_s = sync_s + t2 - t1, search_s + time.perf_counter() - t2
            emb += report.chunks_embedded
            with engine.mutex:
                hit = any(
                    h.path == path and word in engine.chunks[h.chunk_id].text for h in result.hits if h.chunk_id in engine.chunks
                )
        totals.append(time.perf_counter() - t0)
        syncs.append(sync_s)
        searches.append(search_s)
        embedded.append(emb)
        tries.append(n)
        found += hit
        first += bool(hit and result.hits[0].path == path)
    return {
        "total": totals,
        "sync": syncs,
        "search": searches,
        "embedded": embedded,
        "found": found,
        "first": first,
        "edited": len(picked),
        "tries": tries,
    }


def bench_search(searcher: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode in SEARCH_MODES:
        for q in QUERIES:  # warm-up: jieba, model, Chroma caches
            searcher.search(q, mode=mode)
        times, abstained = [], 0
        for _ in range(SEARCH_ROUNDS):
            for q in QUERIES:
                t0 = time.perf_counter()
                result = searcher.search(q, mode=mode)
                times.append(time.perf_counter() - t0)
                abstained += result.abstained
        out[mode] = {"times": times, "abstain_share": abstained / len(times)}
        say("bench", f"search {mode}: p50 {statistics.median(times) * 1000:.1f} ms over {len(times)} searches")
    return out


# ---- the server subprocess --------------------------------------------------------------------------------------


def bench_server(cfg: Any, out_dir: Path, search_starts: int) -> dict[str, Any]:
    """Cold starts through the SDK's stdio client: launch -> initialize reply on each; on the last `search_starts`,
    launch -> first search reply too. The last start also runs a few more searches and reads the server's peak memory.
    """
    config_file = write_config(out_dir / "server.yaml", cfg.kb_dir, cfg.data_dir, server={"log_level": "INFO"})
    log_file = out_dir / "server.log"
    log_file.unlink(missing_ok=True)
    res: dict[str, Any] = {
        "init": [],
        "first_from_launch": [],
        "first_call": [],
        "still_indexing": 0,
        "first_hits": [],
        "memory_mb": None,
        "memory_source": "",
    }
    starts = max(INITIALIZE_STARTS, search_starts)

    async def search(client: Any, query: str, mode: str | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"query": query} | ({"mode": mode} if mode else {})
        with anyio.fail_after(SERVER_REPLY_TIMEOUT_S):
            result = await client.call_tool(SEARCH_TOOL, args)
        if result.is_error:
            raise KBError(f"the server's search failed: {result.content[0].text}")
        return result.structured_content or {}

    async def one_start(i: int) -> None:
        with log_file.open("a", encoding="utf-8") as err:
            async with launch(config_file, err, pidfile=out_dir / "server.pid", read_timeout_s=SERVER_REPLY_TIMEOUT_S) as s:
                res["init"].append(s.initialize_s)
                if i < starts - search_starts:
                    say("bench", f"server start {i + 1}/{starts}: initialize {s.initialize_s:.2f} s")
                    return
                t_call = time.perf_counter()
                data = await search(s.client, FIRST_QUERY)
                t_done = time.perf_counter()
                res["first_from_launch"].append(t_done - s.started)
                res["first_call"].append(t_done - t_call)
                res["first_hits"].append(len(data.get("hits", [])))
                res["still_indexing"] += any("still running" in n for n in data.get("notes", []))
                say(
                    "bench",
                    f"server start {i + 1}/{starts}: initialize {s.initialize_s:.2f} s, first search "
                    f"{res['first_from_launch'][-1]:.2f} s after launch ({res['first_call'][-1]:.2f} s for the call)",
                )
                if i == starts - 1:
                    for j in range(SERVER_EXTRA_SEARCHES):
                        await search(s.client, QUERIES[(j * 5 + 1) % len(QUERIES)], SEARCH_MODES[j % len(SEARCH_MODES)])
                    if s.pid is not None:
                        res["memory_mb"], res["memory_source"] = peak_memory_mb(s.pid)

    for i in range(starts):
        anyio.run(one_start, i)
    if res["memory_mb"] is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        res["memory_mb"] = peak / (2**20 if sys.platform == "darwin" else 1024)
        res["memory_source"] = "ru_maxrss of the largest child (resource)"
    return res


def disk_usage_mb(path: Path) -> float:
    """Like `du`: allocated blocks where the OS reports them, else file sizes."""
    if not path.exists():
        return 0.0
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    total = 0
    for p in files:
        st = p.stat()
        total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total / 2**20


def _self_peak_mb() -> float | None:
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 1024)


# ---- the run ----------------------------------------------------------------------------------------------------


class _Metrics:
    """The metrics in the order measured, each labelled with the embedder that produced it (`label` by default)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.rows: list[Metric] = []

    def add(self, key: str, value: Any, unit: str, note: str = "", by: str | None = None) -> None:
        self.rows.append(Metric(key, value, unit, by or self.label, note))


def _bench_embedder(args: argparse.Namespace, cfg: Any) -> tuple[RecordingEmbedder, str, float | None]:
    """The embedder the ingest records (the fake one, or the configured model loaded and warmed), its label, and the
    model's load time (None for the fake)."""
    from kb_vectors import HashEmbedder, config_embedder

    if args.fake_embedder:
        # Stored under the configured model's name so the server subprocess (real model) takes the index as current.
        return RecordingEmbedder(HashEmbedder(dim=FAKE_DIM), cfg.embed_model), "fake-embedder", None
    inner = config_embedder(cfg)
    t0 = time.perf_counter()
    inner.load()
    inner.embed_documents(["warm-up", "模型预热"])  # first call pays one-off torch set-up
    return RecordingEmbedder(inner, inner.name), cfg.embed_model, time.perf_counter() - t0


def _ingest_metrics(m: _Metrics, ing: dict[str, Any], runs: int, chunks: int, model_load_s: float | None) -> None:
    n_embedded = ing["report"].chunks_embedded
    ingest_s, raw_s = statistics.median(ing["ingest_s"]), statistics.median(ing["raw_s"])
    m.add(
        "ingest_s",
        ingest_s,
        "s",
        f"median of {runs} full ingests (Engine.sync_all on an empty index; model load excluded, jieba set-up included)",
    )
    m.add("ingest_chunks_per_s", chunks / ingest_s if ingest_s else None, "chunks/s")
    m.add("ingest_embed_s", statistics.median(ing["embed_in_pipeline_s"]), "s", "time inside embed_documents during ingest")
    m.add("save_view_s", statistics.median(ing["save_view_s"]), "s", "Engine.save_view (BM25 pickle) after ingest")
    m.add(
        "raw_embed_s",
        raw_s,
        "s",
        f"bare embed_documents after each ingest (engine calls of {ing['call_sizes']} texts); {ing['raw_note']}",
    )
    m.add("raw_embed_chunks_per_s", n_embedded / raw_s if raw_s else None, "chunks/s")
    m.add("pipeline_overhead", ingest_s / raw_s - 1 if raw_s else None, "ratio", "ingest_s / raw_embed_s - 1")
    in_run = [t / e - 1 for t, e in zip(ing["ingest_s"], ing["embed_in_pipeline_s"]) if e]
    m.add(
        "pipeline_overhead_in_run",
        median(in_run),
        "ratio",
        "ingest_s / ingest_embed_s - 1, within the same runs (steadier than pipeline_overhead on a busy machine)",
    )
    m.add(
        "ingest_outside_embedder_s",
        statistics.median(t - e for t, e in zip(ing["ingest_s"], ing["embed_in_pipeline_s"])),
        "s",
        "ingest time not spent in embed_documents: scan, chunking, BM25, Chroma, state.json",
    )
    if model_load_s is not None:
        m.add("model_load_s", model_load_s, "s", "load + first encode, before the ingest timings")


def _index_metrics(m: _Metrics, engine: Any) -> None:
    """No-change syncs, edits until searchable, search latency, then the index on disk."""
    from kb_search import Searcher

    say("bench", f"no-change sync x{NOCHANGE_SYNCS}")
    nc = bench_nochange(engine)
    m.add("nochange_sync_ms", statistics.median(nc["times"]) * 1000, "ms", f"median of {NOCHANGE_SYNCS} Engine.sync_all()")
    m.add("nochange_sync_p95_ms", percentile(nc["times"], 0.95) * 1000, "ms")
    m.add("nochange_sync_chunks_embedded", nc["embedded"], "chunks", f"total over {NOCHANGE_SYNCS} syncs (must be 0)")

    searcher = Searcher(engine)
    say("bench", f"edit-to-searchable on {EDIT_NOTES} notes")
    ed = bench_edits(engine, searcher)
    m.add(
        "edit_to_searchable_ms", (median(ed["total"]) or 0) * 1000, "ms", f"median of {ed['edited']} notes: sync + hybrid search"
    )
    m.add("edit_sync_ms", (median(ed["sync"]) or 0) * 1000, "ms", "the sync part")
    m.add("edit_search_ms", (median(ed["search"]) or 0) * 1000, "ms", "the search part")
    m.add("edit_chunks_embedded", median(ed["embedded"]), "chunks", "median per edit")
    m.add("edit_found", ed["found"], "notes", f"of {ed['edited']} edited notes, the word was found")
    m.add("edit_found_first", ed["first"], "notes", "of those, the edited note was the first hit (the word is exact evidence)")
    m.add("edit_notes", ed["edited"], "notes")
    m.add("edit_max_tries", max(ed["tries"], default=0), "syncs", "sync+search rounds until found (1 = at once)")

    say("bench", f"search latency: {len(QUERIES)} queries x {SEARCH_ROUNDS} rounds x {len(SEARCH_MODES)} modes")
    for mode, s in bench_search(searcher).items():
        m.add(f"search_{mode}_p50_ms", statistics.median(s["times"]) * 1000, "ms", f"warm, {len(s['times'])} searches")
        m.add(f"search_{mode}_p95_ms", percentile(s["times"], 0.95) * 1000, "ms")
        m.add(f"search_{mode}_abstain_share", s["abstain_share"], "share", "searches with no hit past the relevance gate")

    engine.save_view()  # the server should start from a current keyword view, as after ingest.py
    index_dir = engine.cfg.index_dir
    m.add("index_total_mb", disk_usage_mb(index_dir), "MB", str(index_dir))
    m.add("index_vectors_mb", disk_usage_mb(index_dir / "vectors"), "MB", "the vector segments")
    m.add("index_bm25_mb", disk_usage_mb(engine.cfg.bm25_index_file), "MB")
    m.add("index_state_mb", disk_usage_mb(index_dir / "state.json"), "MB")
    m.add("bench_peak_rss_mb", _self_peak_mb(), "MB", "this benchmark process (ru_maxrss)")


def _server_metrics(m: _Metrics, sv: dict[str, Any], search_starts: int, by: str) -> None:
    m.add(
        "server_initialize_ms",
        statistics.median(sv["init"]) * 1000,
        "ms",
        f"launch -> initialize reply, median of {len(sv['init'])} starts",
        by=by,
    )
    m.add(
        "server_first_search_from_launch_ms",
        statistics.median(sv["first_from_launch"]) * 1000,
        "ms",
        f"launch -> reply to the first search (sent right after initialize), median of {search_starts}",
        by=by,
    )
    m.add("server_first_search_call_ms", statistics.median(sv["first_call"]) * 1000, "ms", "that first tools/call alone", by=by)
    m.add("server_first_search_hits", median(sv["first_hits"]), "hits", f"query {FIRST_QUERY!r}", by=by)
    m.add(
        "server_first_search_still_indexing",
        sv["still_indexing"],
        "starts",
        "first searches answered before the start-up sync finished",
        by=by,
    )
    m.add(
        "server_peak_rss_mb", sv["memory_mb"], "MB", f"after {SERVER_EXTRA_SEARCHES + 1} searches; {sv['memory_source']}", by=by
    )


def run_bench(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Every phase in order; returns {"env": ..., "metrics": {key: {value, unit, embedder, note}}}."""
    ingest_runs = args.repeat or DEFAULT_INGEST_RUNS
    search_starts = args.repeat or DEFAULT_FIRST_SEARCH_STARTS
    vault, source = prepare_vault(out_dir, args.kb_dir, args.synthetic)
    say("bench", f"vault: {vault} ({source})")
    base_cfg = _config(vault, out_dir / "data")
    embedder, label, model_load_s = _bench_embedder(args, base_cfg)
    m = _Metrics(label)

    engine, ing = bench_ingest(vault, out_dir, embedder, ingest_runs)
    chunks, n_embedded = len(engine.chunks), ing["report"].chunks_embedded
    _ingest_metrics(m, ing, ingest_runs, chunks, model_load_s)
    _index_metrics(m, engine)

    server_label = f"{base_cfg.embed_model} (server)" + (", over fake-embedder vectors" if args.fake_embedder else "")
    say(
        "bench",
        f"server: {max(INITIALIZE_STARTS, search_starts)} cold starts of mcp_server.py, {search_starts} to the first search",
    )
    _server_metrics(m, bench_server(engine.cfg, out_dir, search_starts), search_starts, server_label)

    env = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "vault": source,
        "out_dir": str(out_dir),
        "notes": len(engine.files),
        "chunks": chunks,
        "chunks_embedded": n_embedded,
        "embedder": f"HashEmbedder(dim={FAKE_DIM})" if args.fake_embedder else base_cfg.embed_model,
        "fake_embedder": bool(args.fake_embedder),
        "embed_batch_size": base_cfg.embed_batch_size,
        "chunk_tokens": base_cfg.chunk_tokens,
        "queries": len(QUERIES),
        "ingest_runs": ingest_runs,
        "server_starts": max(INITIALIZE_STARTS, search_starts),
        "server_first_search_starts": search_starts,
    }
    return {
        "env": env,
        "metrics": {r.key: {"value": r.value, "unit": r.unit, "embedder": r.embedder, "note": r.note} for r in m.rows},
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def format_table(result: dict[str, Any]) -> str:
    env, metrics = result["env"], result["metrics"]
    fake = " [FAKE: numbers marked fake-embedder measure index mechanics only]" if env["fake_embedder"] else ""
    head = (
        f"second-brain-mcp bench: {env['vault']}; {env['notes']} notes, {env['chunks']} chunks; embedder "
        f"{env['embedder']}{fake}; {env['cpus_usable']} CPUs, Python {env['python']}"
    )
    rows = [("metric", "value", "unit", "embedder", "note")] + [
        (k, _fmt(m["value"]), m["unit"], m["embedder"], m["note"]) for k, m in metrics.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [head, ""]
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) if i != 1 else r[i].rjust(widths[i]) for i in range(4)) + "  " + r[4])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="eval/bench.py",
        description="Benchmark indexing and search on a copy of a vault or a generated one: full ingest (and its overhead "
        "over the bare embedder), no-change sync, edit-to-searchable, search latency per mode, MCP server start and "
        "first search, peak memory, index size. The index goes into --out-dir; your notes and index are never touched.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="examples:\n  python eval/bench.py --synthetic 50 --fake-embedder --json\n"
        "  python eval/bench.py --kb-dir ~/notes --repeat 1 --out-dir /tmp/kb-bench\n"
        "  python eval/bench.py --mcp --busy --kb-dir ~/notes --out-dir /tmp/kb-bench-mcp",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--kb-dir", type=Path, help="benchmark a copy of this vault (copied into --out-dir, never written)")
    src.add_argument("--synthetic", type=int, metavar="N_NOTES", help="generate a deterministic vault of this many notes")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--fake-embedder",
        action="store_true",
        help=f"HashEmbedder(dim={FAKE_DIM}) instead of the model: index mechanics at scale, no model cost",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help=f"runs of the expensive phases: full ingest, raw embedding, server start to first search "
        f"(default: {DEFAULT_INGEST_RUNS} ingests, {DEFAULT_FIRST_SEARCH_STARTS} first searches; "
        f"initialize is always timed on at least {INITIALIZE_STARTS} starts)",
    )
    parser.add_argument(
        "--out-dir", type=Path, help="work folder for the vault copy and the index (default: a temp dir, removed after)"
    )
    parser.add_argument(
        "--mcp",
        action="store_true",
        help="time the MCP server only, through the SDK's stdio client: launch -> initialize and -> first answer, search "
        "p50/p95, edit -> searchable for five kinds of edit (see eval/bench_mcp.py)",
    )
    parser.add_argument(
        "--busy", action="store_true", help="with --mcp: run every timing again beside a process spinning one core"
    )
    parser.add_argument(
        "--sessions",
        type=int,
        metavar="N",
        help="with --mcp: also N sessions through relays to one shared server, beside a direct server: later sessions' "
        "initialize and first answer, search p50 relay vs direct, total memory (see eval/bench_mcp.py)",
    )
    parser.add_argument(
        "--mode", choices=SEARCH_MODES, default="hybrid", help="with --mcp: the search mode the server is configured with"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="with --mcp and --kb-dir: start from the index of --kb-dir already built in this data_dir (copied, never "
        "written), instead of indexing the copy from scratch",
    )
    parser.add_argument(
        "--model",
        help="with --mcp: the server's embedding.model (default: the config default), e.g. use-multilingual; with "
        "--data-dir, the model that index was built with",
    )
    args = parser.parse_args(argv)
    if args.synthetic is not None and args.synthetic < 1:
        parser.error("--synthetic needs at least 1 note")
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat needs at least 1")
    if args.mcp and args.fake_embedder:
        parser.error("--mcp times the server with its real model; leave out --fake-embedder")
    if not args.mcp and (args.busy or args.data_dir or args.model or args.sessions or args.mode != "hybrid"):
        parser.error("--busy, --mode, --model, --sessions and --data-dir go with --mcp")
    if args.sessions is not None and args.sessions < 2:
        parser.error("--sessions needs at least 2 (a first session and a later one)")
    setup_logging(default="WARNING")
    temp = args.out_dir is None
    out_dir = Path(tempfile.mkdtemp(prefix="kb-bench-")) if temp else args.out_dir.expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        if args.mcp:
            from bench_mcp import run_mcp_bench

            result = run_mcp_bench(args, out_dir)
        else:
            result = run_bench(args, out_dir)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if temp:
            shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps(result, ensure_ascii=False, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
