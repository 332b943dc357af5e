"""What the client reads: the exact default reply of the search tool for every question of a golden set, scored by
what it shows, and a client's picks from those replies scored against the gold.

`dump` writes each question's reply (the text the MCP tool returns, through kb_tools.format_search) to a JSON lines
file that holds no gold, for a helper playing the client; it prints shown recall (the share of gold notes whose path
appears anywhere in the reply), distinct notes shown, reply length, the NDCG@5 of the notes in the order the reply
shows them, and the server's abstentions. `score` scores a picks file ({"id", "picks": [...]} per line).
Usage:
  python eval/replies.py dump --kb-dir DIR --golden FILE.jsonl --index-dir DIR [--alternatives FILE] --out FILE
  python eval/replies.py score --golden FILE.jsonl --picks FILE.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_eval import load_alternatives, load_golden, make_tuning, ndcg, parse_sets

from kb_config import KBError, load_config, setup_logging

# A note path counts as shown where it stands on its own in the reply: not as the tail of a longer path.
_PATH_EDGE = r"(?<![\w./\-])"


def shown_notes(reply: str, paths: list[str]) -> list[str]:
    """The vault's note paths that appear in `reply`, in the order the reply first shows them."""
    found = []
    for p in paths:
        if p not in reply:  # most paths of a large vault: skip the regex (8,960 patterns overflow re's cache)
            continue
        m = re.search(_PATH_EDGE + re.escape(p) + r"(?![\w\-])", reply)
        if m:
            found.append((m.start(), p))
    return [p for _, p in sorted(found)]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def summarize_replies(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Shown recall, distinct notes, reply characters (mean, max), NDCG@5 of the shown order, server abstentions."""
    answerable = [r for r in rows if r["gold"]]
    offtopic = [r for r in rows if not r["gold"]]
    out: dict[str, Any] = {"n": len(rows)}
    if answerable:
        out["shown_recall"] = _mean([len(set(r["shown"]) & set(r["gold"])) / len(r["gold"]) for r in answerable])
        out["ndcg@5"] = _mean([ndcg(r["shown"], r["gold"]) for r in answerable])
        out["server_false_abstain"] = _mean([float(r["abstained"]) for r in answerable])
    if offtopic:
        out["server_offtopic_abstain"] = _mean([float(r["abstained"]) for r in offtopic])
    out["distinct_notes"] = _mean([float(len(r["shown"])) for r in rows])
    out["chars_mean"] = _mean([float(r["chars"]) for r in rows])
    out["chars_max"] = max((r["chars"] for r in rows), default=0)
    return out


def score_picks(questions: list[dict[str, Any]], picks: dict[str, list[str]]) -> dict[str, Any]:
    """A client's picks scored like a ranking: NDCG@5, false abstention (no pick where a note answers), off-topic
    refusal (no pick where none does); overall and per language."""

    def one(qs: list[dict[str, Any]]) -> dict[str, Any]:
        answerable = [q for q in qs if q["gold"]]
        offtopic = [q for q in qs if not q["gold"]]
        out: dict[str, Any] = {"n": len(qs)}
        if answerable:
            out["ndcg@5"] = _mean([ndcg(picks.get(q["id"], []), q["gold"]) for q in answerable])
            out["false_abstain"] = _mean([float(not picks.get(q["id"])) for q in answerable])
        if offtopic:
            out["offtopic_refusal"] = _mean([float(not picks.get(q["id"])) for q in offtopic])
        return out

    missing = [q["id"] for q in questions if q["id"] not in picks]
    if missing:
        raise KBError(f"the picks lack {len(missing)} question(s), e.g. {missing[:3]}; write one line per question")
    res = {"overall": one(questions)}
    res["by_lang"] = {lang: one([q for q in questions if q["lang"] == lang]) for lang in sorted({q["lang"] for q in questions})}
    return res


def open_engine(kb_dir: Path, index_dir: Path, sets: dict[str, Any] | None = None) -> Any:
    """An Engine over `kb_dir` with its index in `index_dir`, brought up to date (the ingest CLI's embedding workers);
    `sets` overrides config keys. Raises KBError when the model cannot load."""
    from ingest import INGEST_WORKERS
    from kb_engine import Engine
    from kb_vectors import config_embedder

    overrides = {"kb_dir": str(kb_dir.resolve()), "data_dir": str(index_dir.resolve()), **(sets or {})}
    cfg = load_config(None, env={}, overrides=overrides)
    engine = Engine(cfg, config_embedder(cfg, workers=INGEST_WORKERS), embed_workers=INGEST_WORKERS, embed_processes=True)
    engine.sync_all()
    if engine.model_error:
        raise KBError(engine.model_error)
    return engine


def dump(args: argparse.Namespace) -> dict[str, Any]:
    from kb_search import Searcher
    from kb_tools import format_search

    questions = load_golden(args.golden)
    alternatives = load_alternatives(args.alternatives) if args.alternatives else {}
    engine = open_engine(args.kb_dir, args.index_dir, parse_sets(args.set))
    cfg = engine.cfg
    searcher = Searcher(engine, make_tuning(parse_sets(args.tune)))
    paths = sorted(engine.files)
    rows = []
    with args.out.open("w", encoding="utf-8") as out:
        for q in questions:
            result = searcher.search(q["q"], alternatives=alternatives.get(q["id"]))
            reply, _ = format_search(result, list(result.notes), cfg.max_response_chars)
            out.write(json.dumps({"id": q["id"], "q": q["q"], "reply": reply}, ensure_ascii=False) + "\n")
            shown = shown_notes(reply, paths)
            rows.append(
                {
                    "id": q["id"],
                    "lang": q["lang"],
                    "gold": q["gold"],
                    "shown": shown,
                    "chars": len(reply),
                    "abstained": result.abstained,
                    "ms": result.elapsed_ms,
                }
            )
    res = {"overall": summarize_replies(rows)}
    res["by_lang"] = {
        lang: summarize_replies([r for r in rows if r["lang"] == lang]) for lang in sorted({r["lang"] for r in rows})
    }
    res["search_ms_p50"] = statistics.median(r["ms"] for r in rows)
    if args.rows:
        res["rows"] = rows
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="replies.py",
        description="Write the search tool's exact default replies for a golden set and score what they show; or score a "
        "client's picks from them.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python eval/replies.py dump --kb-dir examples/sample_kb --golden eval/golden_sample_kb.jsonl "
        "--index-dir /tmp/kb-sample --out /tmp/replies.jsonl\n"
        "  python eval/replies.py score --golden eval/golden_sample_kb.jsonl --picks eval/picks/sample-end-plain.jsonl",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write the replies (no gold) and print what they show")
    d.add_argument("--kb-dir", type=Path, required=True, help="the vault (read only)")
    d.add_argument("--golden", type=Path, required=True, help="golden questions, JSON lines")
    d.add_argument("--index-dir", type=Path, required=True, help="index folder (built or brought up to date first)")
    d.add_argument("--alternatives", type=Path, help="the client's alternatives per question, JSON lines")
    d.add_argument("--out", type=Path, required=True, help="where to write {id, q, reply} per question")
    d.add_argument("--rows", action="store_true", help="also print each question's shown notes")
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. search.top_k=8")
    d.add_argument("--tune", action="append", default=[], metavar="NAME=VALUE", help="replace a field of kb_search.Tuning")
    s = sub.add_parser("score", help="score a client's picks")
    s.add_argument("--golden", type=Path, required=True, help="golden questions, JSON lines")
    s.add_argument("--picks", type=Path, required=True, help='the client\'s picks: {"id", "picks": [...]} per line')
    args = parser.parse_args(argv)
    setup_logging(0, True)
    try:
        if args.command == "dump":
            res = dump(args)
        else:
            picks = {}
            for line in args.picks.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    item = json.loads(line)
                    picks[str(item["id"])] = [str(p) for p in item.get("picks") or []]
            res = score_picks(load_golden(args.golden), picks)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
