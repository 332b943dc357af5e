"""Retrieval evaluation: index a vault into a temporary index and score the product's search on a golden set.

Every question goes through kb_search.Searcher.search, the code path of the MCP tool; `grep` (no index) and `bm25`
(rank-bm25 over whole notes, no chunks, no gate) are the baselines a user gets from simpler tools.
Usage: python eval/run_eval.py --kb-dir DIR --golden FILE.jsonl [--modes hybrid,keyword,semantic,grep,bm25] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Process start, for the cold-start figure (imports, index load, model load, first answer).
T_START = time.perf_counter()

from harness import percentile  # noqa: E402

from kb_config import KBError, load_config, pin_blas_threads, setup_logging  # noqa: E402

pin_blas_threads()  # as ingest.py: before numpy loads, so the index is built as the ingest CLI builds it

MODES = ("hybrid", "keyword", "semantic", "grep", "bm25")
# Ranks scored: NDCG and recall at 5, MRR at 10 (file level).
K_NDCG, K_MRR = 5, 10
REQUIRED_KEYS = {"id", "lang", "cls", "q", "gold"}


def load_golden(path: Path) -> list[dict[str, Any]]:
    """Read and check a golden file: one JSON object per line with id, lang, cls, q, gold."""
    questions = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise KBError(f"{path}:{n} is not JSON ({e})") from e
        missing = REQUIRED_KEYS - set(item)
        if missing:
            raise KBError(f"{path}:{n} lacks {', '.join(sorted(missing))}; each line needs {', '.join(sorted(REQUIRED_KEYS))}")
        questions.append(item)
    if not questions:
        raise KBError(f"{path} holds no questions")
    return questions


def ndcg(ranked: list[str], gold: list[str], k: int = K_NDCG) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, p in enumerate(ranked[:k]) if p in gold)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(gold), k)))
    return dcg / ideal if ideal else 0.0


def mrr(ranked: list[str], gold: list[str], k: int = K_MRR) -> float:
    return next((1 / (i + 1) for i, p in enumerate(ranked[:k]) if p in gold), 0.0)


def recall(ranked: list[str], gold: list[str], k: int = K_NDCG) -> float:
    return len(set(ranked[:k]) & set(gold)) / len(gold) if gold else 0.0


def grep_rank(engine: Any, query: str) -> tuple[list[str], bool]:
    """Baseline without an index: notes ranked by how many distinct query terms their text contains."""
    terms = list(dict.fromkeys(engine.tokenizer.tokenize(query)))
    counts: dict[str, int] = defaultdict(int)
    texts: dict[str, list[str]] = defaultdict(list)
    for c in engine.chunks.values():
        texts[c.path].append(c.text.lower())
    for path, parts in texts.items():
        body = "\n".join(parts)
        counts[path] = sum(1 for t in terms if t in body)
    ranked = sorted((p for p, n in counts.items() if n), key=lambda p: (-counts[p], p))
    return ranked, not ranked


class NoteBM25:
    """Baseline: rank-bm25's BM25Okapi over whole notes with the engine's jieba tokens; no chunks, no gate."""

    def __init__(self, engine: Any) -> None:
        from rank_bm25 import BM25Okapi

        self.tokenize = engine.tokenizer.tokenize
        self.paths = sorted(engine.files)
        root = engine.cfg.kb_dir
        docs = [self.tokenize((root / p).read_text(encoding="utf-8", errors="replace")) for p in self.paths]
        self.bm25 = BM25Okapi(docs)

    def rank(self, query: str) -> tuple[list[str], bool]:
        """Notes sharing a term with the query, best BM25 score first; abstains only when none does."""
        tokens = self.tokenize(query)
        if not tokens:
            return [], True
        scores = self.bm25.get_scores(tokens)
        order = sorted((i for i, sc in enumerate(scores) if sc > 0), key=lambda i: (-scores[i], self.paths[i]))
        ranked = [self.paths[i] for i in order[:K_MRR]]
        return ranked, not ranked


def load_alternatives(path: Path) -> dict[str, list[str]]:
    """The client's alternatives per question id, in the shared format: one {"id", "alternatives": [...]} per line."""
    out: dict[str, list[str]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            out[str(item["id"])] = [str(a) for a in item["alternatives"]]
        except (ValueError, KeyError, TypeError) as e:
            raise KBError(f'{path}:{n} is not {{"id", "alternatives": [...]}} ({e})') from e
    return out


def run_mode(
    searcher: Any, mode: str, questions: list[dict[str, Any]], alternatives: dict[str, list[str]] | None = None
) -> list[dict[str, Any]]:
    rows = []
    note_bm25 = NoteBM25(searcher.engine) if mode == "bm25" else None
    for q in questions:
        t0 = time.perf_counter()
        if note_bm25 is not None:
            ranked, abstained = note_bm25.rank(q["q"])
        elif mode == "grep":
            ranked, abstained = grep_rank(searcher.engine, q["q"])
        else:
            alts = (alternatives or {}).get(q["id"])
            result = searcher.search(q["q"], alternatives=alts, top_k=K_MRR, mode=mode)
            ranked, abstained = result.ranked_notes(), result.abstained
        ms = (time.perf_counter() - t0) * 1000
        rows.append(
            {
                "id": q["id"],
                "lang": q["lang"],
                "cls": q["cls"],
                "gold": q["gold"],
                "ranked": ranked[:K_MRR],
                "abstained": abstained,
                "ms": ms,
            }
        )
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in rows if r["gold"]]
    offtopic = [r for r in rows if not r["gold"]]
    out: dict[str, Any] = {"n": len(rows), "answerable": len(answerable), "offtopic": len(offtopic)}
    if answerable:
        out["ndcg@5"] = statistics.fmean(ndcg(r["ranked"], r["gold"]) for r in answerable)
        out["mrr@10"] = statistics.fmean(mrr(r["ranked"], r["gold"]) for r in answerable)
        out["recall@5"] = statistics.fmean(recall(r["ranked"], r["gold"]) for r in answerable)
        out["false_abstain"] = sum(r["abstained"] for r in answerable) / len(answerable)
    if offtopic:
        out["abstain"] = sum(r["abstained"] for r in offtopic) / len(offtopic)
    return out


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall, per lang and per cls metrics, plus latency."""
    ms = sorted(r["ms"] for r in rows)
    res: dict[str, Any] = {
        "overall": summarize(rows),
        "latency_ms": {"p50": statistics.median(ms), "p95": percentile(ms, 0.95)},
    }
    for key in ("lang", "cls"):
        res[f"by_{key}"] = {v: summarize([r for r in rows if r[key] == v]) for v in sorted({r[key] for r in rows})}
    return res


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    cols = ["ndcg@5", "mrr@10", "recall@5", "false_abstain", "abstain"]
    print(f"{'mode':9} {'slice':16} {'n':>3} " + " ".join(f"{c:>13}" for c in cols))
    for mode, res in results.items():
        slices = (
            [("overall", res["overall"])]
            + [(f"lang={k}", v) for k, v in res["by_lang"].items()]
            + [(f"cls={k}", v) for k, v in res["by_cls"].items()]
        )
        for name, s in slices:
            print(f"{mode:9} {name:16} {s['n']:>3} " + " ".join(f"{_fmt(s.get(c, '-')):>13}" for c in cols))
        lat = res["latency_ms"]
        print(f"{mode:9} latency ms p50 {lat['p50']:.1f}  p95 {lat['p95']:.1f}\n")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """--set key=value pairs (dotted config keys) into overrides; values parsed as YAML scalars."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise KBError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def make_tuning(tunes: dict[str, Any]) -> Any:
    """kb_search.Tuning with the --tune fields replaced (experiments in docs/retrieval.md); refuses unknown names."""
    from dataclasses import fields, replace

    from kb_search import Tuning

    known = {f.name for f in fields(Tuning)}
    bad = sorted(set(tunes) - known)
    if bad:
        raise KBError(f"--tune {', '.join(bad)}: kb_search.Tuning has no such field; it has {', '.join(sorted(known))}")
    return replace(Tuning(), **tunes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="run_eval.py",
        description="Score second-brain-mcp's search on a golden question set (NDCG@5, MRR@10, Recall@5 at note level, "
        "abstain rates, latency) per mode, overall, per language and per class. Indexes into a temporary folder.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python eval/run_eval.py --kb-dir examples/sample_kb --golden eval/golden_sample_kb.jsonl",
    )
    parser.add_argument("--kb-dir", type=Path, required=True, help="the vault to index (read only)")
    parser.add_argument("--golden", type=Path, required=True, help="golden questions, JSON lines")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument(
        "--index-dir",
        type=Path,
        help="where to build the index (default: a new temporary folder); an index already there for the same vault, "
        "model and chunking is reused and only brought up to date, so repeated runs on a big vault skip the embedding",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="threads that embed side by side, each running one model call on one core (default: the ingest CLI's, every core)",
    )
    parser.add_argument(
        "--config", type=Path, help="take model and search settings from this config (kb_dir/data_dir are replaced)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. search.rrf_k=20"
    )
    parser.add_argument("--per-question", action="store_true", help="also print each question's ranked notes")
    parser.add_argument(
        "--tune",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="for experiments: replace a field of the ranker's kb_search.Tuning, e.g. cross_weight=0.3",
    )
    parser.add_argument(
        "--alternatives",
        type=Path,
        help="the client's alternatives per question (JSON lines {id, alternatives}), passed with each question",
    )
    args = parser.parse_args(argv)
    setup_logging(0, True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    try:
        questions = load_golden(args.golden)
        index_dir = args.index_dir or Path(tempfile.mkdtemp(prefix="kb-eval-"))
        overrides = {"kb_dir": str(args.kb_dir.resolve()), "data_dir": str(index_dir.resolve()), **parse_sets(args.set)}
        cfg = load_config(args.config, env={}, overrides=overrides)
        tuning = make_tuning(parse_sets(args.tune))
        alternatives = load_alternatives(args.alternatives) if args.alternatives else None
        try:
            from kb_engine import Engine
        except ImportError:  # the engine's module before its move out of the ingest CLI
            from kb_engine import Engine
        from ingest import INGEST_WORKERS
        from kb_search import Searcher
        from kb_vectors import config_embedder

        embedder = config_embedder(cfg)
        engine = Engine(cfg, embedder, embed_workers=args.threads or INGEST_WORKERS, embed_processes=True)
        t0 = time.perf_counter()
        sync = engine.sync_all()
        if engine.model_error and any(m in ("hybrid", "semantic") for m in modes):
            raise KBError(engine.model_error)
        index_s = time.perf_counter() - t0
        searcher = Searcher(engine, tuning)
        searcher.search("warm up", mode="hybrid" if "hybrid" in modes else "keyword")
        first_answer_s = time.perf_counter() - T_START
        results = {mode: report(rows := run_mode(searcher, mode, questions, alternatives)) | {"rows": rows} for mode in modes}
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    meta = {
        "kb_dir": str(cfg.kb_dir),
        "golden": str(args.golden),
        "questions": len(questions),
        "notes": len(engine.files),
        "chunks": len(engine.chunks),
        "model": engine.embedder.name,
        "index_s": round(index_s, 1),
        "chunks_embedded": sync.chunks_embedded,
        "first_answer_s": round(first_answer_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "torch_loaded": "torch" in sys.modules,
        "overrides": parse_sets(args.set),
        "tune": parse_sets(args.tune),
        "alternatives": str(args.alternatives) if args.alternatives else None,
    }
    if args.json:
        out = {
            "meta": meta,
            "modes": {m: {k: v for k, v in r.items() if k != "rows" or args.per_question} for m, r in results.items()},
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    print(
        f"{meta['notes']} notes, {meta['chunks']} chunks, model {meta['model']}, {len(questions)} questions "
        f"(indexed in {index_s:.1f} s, {sync.chunks_embedded} chunks embedded; first answer {first_answer_s:.1f} s "
        f"after start; peak RSS {meta['peak_rss_mb']} MB; torch {'loaded' if meta['torch_loaded'] else 'not loaded'})\n"
    )
    print_table({m: r for m, r in results.items()})
    if args.per_question:
        for mode, r in results.items():
            for row in r["rows"]:
                mark = (
                    "ok "
                    if (row["ranked"][:1] and row["ranked"][0] in row["gold"]) or (not row["gold"] and row["abstained"])
                    else "MISS"
                )
                print(
                    f"{mode:8} {mark} {row['id']:7} {row['cls']:10} gold={row['gold'][:2]} got={row['ranked'][:3]} abst={row['abstained']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
