"""Search quality guard: the golden set, scored end to end with the real bundled model, must not regress."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "eval"))

import run_eval  # noqa: E402

# Largest drop of hybrid NDCG@5 below eval/baseline.json that still passes.
ALLOWED_DROP = 0.03


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("eval") / "scores.json"
    argv = [
        "--kb-dir",
        str(REPO / "examples" / "sample_kb"),
        "--golden",
        str(REPO / "eval" / "golden_sample_kb.jsonl"),
        "--modes",
        "hybrid,keyword,semantic,grep",
        "--json",
        "--index-dir",
        str(out.parent / "index"),
    ]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_eval.main(argv) == 0
    return json.loads(buf.getvalue())


def test_hybrid_ndcg_does_not_drop_below_baseline(scores):
    baseline = json.loads((REPO / "eval" / "baseline.json").read_text(encoding="utf-8"))
    want = baseline["modes"]["hybrid"]["overall"]["ndcg@5"]
    got = scores["modes"]["hybrid"]["overall"]["ndcg@5"]
    assert got >= want - ALLOWED_DROP, f"hybrid NDCG@5 {got:.3f} fell more than {ALLOWED_DROP} below the baseline {want:.3f}"


def test_hybrid_beats_single_modes_overall(scores):
    modes = scores["modes"]
    hybrid = modes["hybrid"]["overall"]["ndcg@5"]
    assert hybrid > max(modes[m]["overall"]["ndcg@5"] for m in ("keyword", "semantic", "grep"))


def test_eval_reports_every_slice_and_latency(scores):
    hybrid = scores["modes"]["hybrid"]
    assert set(hybrid["by_lang"]) == {"en", "zh", "mixed"}
    assert set(hybrid["by_cls"]) == {"keyword", "paraphrase", "deep", "multi", "offtopic"}
    assert hybrid["latency_ms"]["p50"] > 0 and "abstain" in hybrid["overall"] and "false_abstain" in hybrid["overall"]
    assert scores["meta"]["questions"] >= 50


def test_golden_questions_are_not_inside_indexed_notes():
    notes = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "examples" / "sample_kb").rglob("*.md"))
    golden = run_eval.load_golden(REPO / "eval" / "golden_sample_kb.jsonl")
    assert not [q["id"] for q in golden if q["q"] in notes]


def test_metrics_match_hand_computed_values():
    gold = ["a.md", "b.md"]
    assert run_eval.ndcg(["a.md", "x.md", "b.md"], gold) == pytest.approx((1 + 1 / 2) / (1 + 1 / 1.5849625), rel=1e-6)
    assert run_eval.mrr(["x.md", "y.md", "b.md"], gold) == pytest.approx(1 / 3)
    assert run_eval.recall(["x.md", "a.md"], gold) == 0.5
    assert run_eval.collapse(["a.md", "a.md", "b.md"]) == ["a.md", "b.md"]
