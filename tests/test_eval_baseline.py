"""Search quality guard: the golden set, scored end to end with the real bundled model, must not regress."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "eval"))

import run_eval  # noqa: E402
from kb_fixtures import seed_sample_index  # noqa: E402

from kb_config import FIELDS  # noqa: E402

# Largest drop of hybrid NDCG@5 below eval/baseline.json that still passes.
ALLOWED_DROP = 0.03


@pytest.fixture(scope="module")
def eval_index(sample_index, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The index ingest.py built of the sample vault, where run_eval finds it current (nothing is embedded again)."""
    index = tmp_path_factory.mktemp("eval") / "index"
    seed_sample_index(sample_index, REPO / "examples" / "sample_kb", index)
    return index


def run_eval_json(*args: str) -> dict:
    """run_eval.main on the sample vault and golden set with `args`, its JSON output parsed."""
    import contextlib
    import io

    argv = ["--kb-dir", str(REPO / "examples" / "sample_kb"), "--golden", str(REPO / "eval" / "golden_sample_kb.jsonl")]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_eval.main([*argv, *args, "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def scores(eval_index: Path) -> dict:
    return run_eval_json("--modes", ",".join(run_eval.MODES), "--index-dir", str(eval_index))


@pytest.fixture(scope="module")
def scores_with_alternatives(eval_index: Path) -> dict:
    """Hybrid with the client's alternatives (eval/alternatives/client1/: the shared golden file's copy)."""
    alternatives = REPO / "eval" / "alternatives" / "client1" / "golden_sample_kb.jsonl"
    return run_eval_json("--modes", "hybrid", "--alternatives", str(alternatives), "--index-dir", str(eval_index))


def test_alternatives_meet_the_sample_targets_and_never_rescue_offtopic_questions(scores_with_alternatives):
    """Issue 18's sample targets with the client's alternatives: NDCG@5 >= 0.95, false abstention <= 0.03,
    off-topic abstention >= 0.75 (without the veto on cosine-only passes it was 0.60: 糖醋排骨, 公积金 answered)."""
    overall = scores_with_alternatives["modes"]["hybrid"]["overall"]
    assert overall["ndcg@5"] >= 0.95
    assert overall["false_abstain"] <= 0.03
    assert overall["abstain"] >= 0.75


def test_hybrid_ndcg_does_not_drop_below_baseline(scores):
    baseline = json.loads((REPO / "eval" / "baseline.json").read_text(encoding="utf-8"))
    want = baseline["modes"]["hybrid"]["overall"]["ndcg@5"]
    got = scores["modes"]["hybrid"]["overall"]["ndcg@5"]
    assert got >= want - ALLOWED_DROP, f"hybrid NDCG@5 {got:.3f} fell more than {ALLOWED_DROP} below the baseline {want:.3f}"


def test_hybrid_beats_single_modes_overall(scores):
    modes = scores["modes"]
    hybrid = modes["hybrid"]["overall"]["ndcg@5"]
    assert hybrid > max(modes[m]["overall"]["ndcg@5"] for m in ("keyword", "semantic", "grep", "bm25"))


# mx-04 ("WMS-231 那个 PR 是做什么的") once had two of its three gold notes in hybrid's top 5 and bm25 all three; the
# identifier WMS-231 now puts the notes holding it first (kb_search.Searcher._exact_notes).
@pytest.mark.parametrize(
    ("lang", "baseline"),
    [(lang, b) for lang in ("en", "zh", "mixed") for b in ("grep", "bm25")],
)
def test_hybrid_beats_grep_and_plain_bm25_in_each_language(scores, lang, baseline):
    modes = scores["modes"]
    hybrid, other = modes["hybrid"]["by_lang"][lang]["ndcg@5"], modes[baseline]["by_lang"][lang]["ndcg@5"]
    assert hybrid > other, f"{lang}: hybrid {hybrid:.3f} <= {baseline} {other:.3f}"


def test_relevance_gate_keeps_false_abstentions_rare(scores):
    overall = scores["modes"]["hybrid"]["overall"]
    assert overall["false_abstain"] <= 0.05 and overall["abstain"] >= 0.5


def test_eval_runs_the_configured_default_model(scores):
    default = next(f.default for f in FIELDS if f.key == "embedding.model")
    assert scores["meta"]["model"] == default


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


def test_bm25_baseline_ranks_whole_notes_by_shared_terms(tmp_path):
    from kb_text import Tokenizer

    (tmp_path / "a.md").write_text("# Backup\n\nThe nightly backup runs at three.\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("# 跑步\n\n周末长距离跑步十八公里。\n", encoding="utf-8")
    (tmp_path / "c.md").write_text("# Garden\n\nWater the tomatoes.\n", encoding="utf-8")

    engine = SimpleNamespace(
        tokenizer=Tokenizer(), files=dict.fromkeys(["a.md", "b.md", "c.md"]), cfg=SimpleNamespace(kb_dir=tmp_path)
    )
    ranker = run_eval.NoteBM25(engine)
    assert ranker.rank("when does the backup run")[0][0] == "a.md"
    assert ranker.rank("跑步 多少公里")[0] == ["b.md"]
    assert ranker.rank("quantum chromodynamics") == ([], True)


def test_metrics_match_hand_computed_values():
    gold = ["a.md", "b.md"]
    assert run_eval.ndcg(["a.md", "x.md", "b.md"], gold) == pytest.approx((1 + 1 / 2) / (1 + 1 / 1.5849625), rel=1e-6)
    assert run_eval.mrr(["x.md", "y.md", "b.md"], gold) == pytest.approx(1 / 3)
    assert run_eval.recall(["x.md", "a.md"], gold) == 0.5
