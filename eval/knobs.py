"""Which of the ranker's knobs still change what the client is shown: each knob halved and doubled, every question of
a golden set searched with and without the client's alternatives, compared with the defaults by what the default
reply shows (shown recall, NDCG@5 of the shown order, reply length, the server's abstentions, which notes it names).

A knob that changes none of them on any dev set does nothing the client can see (docs/retrieval.md, "Knobs").
Usage: python eval/knobs.py --kb-dir DIR --golden FILE.jsonl --index-dir DIR [--alternatives FILE] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from replies import open_engine, shown_notes, summarize_replies
from run_eval import load_alternatives, load_golden

from kb_config import KBError, setup_logging

# The config keys that weigh or gate the ranking (the user's; the other search.* keys shape the reply).
CONFIG_KNOBS = ("gate_margin", "candidates", "rrf_k", "keyword_weight")
# Module constants that can change a search's outcome (kb_background's sample and calibration; kb_search's; the reply's).
MODULE_KNOBS = (
    "kb_background.BACKGROUND_SAMPLE",
    "kb_background.BACKGROUND_SEED",
    "kb_background.NEAREST_EXCLUDED",
    "kb_background.MIN_BACKGROUND",
    "kb_search.TAIL_NOTES",
    "kb_search.SNIPPET_LEAD_CHARS",
    "kb_tools.TAIL_MIN_NOTES",
)
# Each knob is tried at these multiples of its default (a default of 0 is tried at 1 instead).
FACTORS = (0.5, 2.0)
METRICS = ("shown_recall", "ndcg@5", "chars_mean", "server_false_abstain", "server_offtopic_abstain")


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return max(1, round(value * factor)) if value else 1
    return value * factor if value else 1.0


def run_all(searcher: Any, questions: list[dict[str, Any]], alternatives: dict[str, list[str]], paths: list[str]) -> dict:
    from kb_tools import format_search

    rows = []
    for q in questions:
        result = searcher.search(q["q"], alternatives=alternatives.get(q["id"]))
        reply, _ = format_search(result, list(result.notes), searcher.cfg.max_response_chars)
        rows.append(
            {
                "id": q["id"],
                "gold": q["gold"],
                "shown": shown_notes(reply, paths),
                "chars": len(reply),
                "abstained": result.abstained,
            }
        )
    return {"summary": summarize_replies(rows), "rows": rows}


def compare(base: dict, other: dict) -> dict[str, Any]:
    """Each metric's change, and how many questions' shown notes changed (as a set) or changed order."""
    out = {m: round(other["summary"].get(m, 0.0) - base["summary"].get(m, 0.0), 4) for m in METRICS}
    pairs = list(zip(base["rows"], other["rows"]))
    out["questions_other_notes"] = sum(set(a["shown"]) != set(b["shown"]) for a, b in pairs)
    out["questions_other_order"] = sum(a["shown"] != b["shown"] for a, b in pairs)
    out["questions_other_abstain"] = sum(a["abstained"] != b["abstained"] for a, b in pairs)
    return out


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    from kb_search import Searcher, Tuning

    questions = load_golden(args.golden)
    variants = {"plain": {}}
    if args.alternatives:
        variants["alternatives"] = load_alternatives(args.alternatives)
    engine = open_engine(args.kb_dir, args.index_dir)
    cfg = engine.cfg
    paths = sorted(engine.files)

    def searcher_with(tuning: Any = None, cfg_change: dict | None = None) -> Any:
        s = Searcher(engine, tuning)
        if cfg_change:
            s.cfg = replace(cfg, **cfg_change)
        return s

    base = {v: run_all(searcher_with(), questions, alts, paths) for v, alts in variants.items()}
    knobs: list[tuple[str, str, Any]] = [("tune", f.name, f.default) for f in fields(Tuning)]
    knobs += [("config", k, getattr(cfg, k)) for k in CONFIG_KNOBS]
    for dotted in MODULE_KNOBS:
        module, name = dotted.split(".")
        knobs.append(("module", dotted, getattr(importlib.import_module(module), name)))
    only = set(args.only.split(",")) if args.only else None
    out: dict[str, Any] = {"base": {v: b["summary"] for v, b in base.items()}, "knobs": {}}
    for kind, name, default in knobs:
        if only and name not in only:
            continue
        for factor in FACTORS:
            value = _scaled(default, factor)
            if kind == "module":
                module, attr = name.split(".")
                mod = importlib.import_module(module)
                setattr(mod, attr, value)
            try:
                searcher = searcher_with(
                    replace(Tuning(), **{name: value}) if kind == "tune" else None,
                    {name: value} if kind == "config" else None,
                )
                got = {v: compare(base[v], run_all(searcher, questions, alts, paths)) for v, alts in variants.items()}
            finally:
                if kind == "module":
                    setattr(mod, attr, default)
            out["knobs"][f"{name}={value}"] = got
            print(f"{name}={value}: {json.dumps(got)}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="knobs.py",
        description="Halve and double each ranker knob and report what changes in the default reply, per variant "
        "(plain, with the client's alternatives).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python eval/knobs.py --kb-dir examples/sample_kb --golden eval/golden_sample_kb.jsonl "
        "--index-dir /tmp/kb-sample --alternatives ../shared/golden/alternatives/golden_sample_kb.jsonl",
    )
    parser.add_argument("--kb-dir", type=Path, required=True, help="the vault (read only)")
    parser.add_argument("--golden", type=Path, required=True, help="golden questions, JSON lines")
    parser.add_argument("--index-dir", type=Path, required=True, help="index folder (built or brought up to date first)")
    parser.add_argument("--alternatives", type=Path, help="the client's alternatives per question, JSON lines")
    parser.add_argument("--only", help="comma-separated knob names to try (default: all)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (else one line per knob)")
    args = parser.parse_args(argv)
    setup_logging(0, True)
    try:
        res = sweep(args)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("base:", json.dumps(res["base"]))
    for knob, got in res["knobs"].items():
        moved = {v: {k: x for k, x in d.items() if x} for v, d in got.items()}
        print(f"{knob:40} {json.dumps(moved) if any(moved.values()) else 'no change'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
