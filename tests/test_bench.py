"""eval/bench.py: a tiny synthetic run reports every metric with sane values (work asserted, never wall time)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from kb_fixtures import REPO_ROOT, SAMPLE_KB

from kb_config import KBError

BENCH = REPO_ROOT / "eval" / "bench.py"
TIME_KEYS = (
    "ingest_s",
    "ingest_embed_s",
    "save_view_s",
    "raw_embed_s",
    "nochange_sync_ms",
    "edit_to_searchable_ms",
    "edit_sync_ms",
    "search_hybrid_p50_ms",
    "search_hybrid_p95_ms",
    "search_keyword_p50_ms",
    "search_keyword_p95_ms",
    "search_semantic_p50_ms",
    "search_semantic_p95_ms",
    "server_initialize_ms",
    "server_first_search_from_launch_ms",
    "server_first_search_call_ms",
)
SIZE_KEYS = ("index_total_mb", "index_vectors_mb", "index_bm25_mb", "index_state_mb", "server_peak_rss_mb")


def _load_bench():
    spec = importlib.util.spec_from_file_location("eval_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["eval_bench"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _run_json(script: str, *args: str) -> dict:
    """Run an eval script with --json in a subprocess; its parsed output (the test fails with its stderr otherwise)."""
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "eval" / script), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_bench_reports_every_metric_for_tiny_synthetic_vault(tmp_path):
    out = tmp_path / "bench"
    data = _run_json("bench.py", "--synthetic", "50", "--fake-embedder", "--repeat", "2", "--out-dir", str(out))
    env, metrics = data["env"], data["metrics"]
    value = {k: m["value"] for k, m in metrics.items()}
    assert env["notes"] == 50 and env["chunks"] > 0 and env["chunks_embedded"] == env["chunks"]
    assert env["fake_embedder"] is True and env["cpu_count"] >= 1 and env["python"]
    for key in TIME_KEYS + SIZE_KEYS:
        assert value[key] > 0, key
    assert value["server_first_search_call_ms"] <= value["server_first_search_from_launch_ms"]
    assert value["search_hybrid_p50_ms"] <= value["search_hybrid_p95_ms"]
    assert value["ingest_chunks_per_s"] > 0 and value["raw_embed_chunks_per_s"] > 0
    assert value["pipeline_overhead"] > -1
    assert value["nochange_sync_chunks_embedded"] == 0
    assert value["edit_found"] == value["edit_found_first"] == value["edit_notes"] == 5 and value["edit_chunks_embedded"] >= 1
    assert 0 <= value["search_hybrid_abstain_share"] <= 1
    # Every number produced with the fake embedder says so; the server's ones name the real model.
    assert all(m["embedder"] == "fake-embedder" for k, m in metrics.items() if not k.startswith("server_"))
    assert all("over fake-embedder vectors" in m["embedder"] for k, m in metrics.items() if k.startswith("server_"))
    assert (out / "vault").is_dir() and (out / "data").is_dir()
    # A second full ingest starts from a fresh folder (eval/bench.py's default is three: it once crashed at the second).
    assert metrics["ingest_s"]["note"].startswith("median of 2 full ingests")


def test_bench_synthetic_vault_is_deterministic_and_mixed(tmp_path):
    _load_bench()  # puts eval/ on sys.path
    from synthetic_vault import write_synthetic_vault

    write_synthetic_vault(tmp_path / "a", 30)
    write_synthetic_vault(tmp_path / "b", 30)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.md"))
    assert len(files_a) == 30
    assert files_a == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.md"))
    texts = [(tmp_path / "a" / p).read_text(encoding="utf-8") for p in files_a]
    assert texts == [(tmp_path / "b" / p).read_text(encoding="utf-8") for p in files_a]
    assert all(t.startswith("---\ntitle: ") and "\ntags: [" in t and "\n## " in t for t in texts)
    joined = "\n".join(texts)
    assert "```" in joined and "\n- " in joined and "### " in joined
    assert any("\u4e00" <= ch <= "\u9fff" for ch in joined) and "backup" in joined


def test_bench_copies_kb_dir_and_never_writes_into_it(tmp_path):
    bench = _load_bench()
    src = tmp_path / "notes"
    src.mkdir()
    (src / "a.md").write_text("# A\n\nbackup notes\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    vault, _ = bench.prepare_vault(out, src, None)
    assert vault == out / "vault" and (vault / "a.md").read_text(encoding="utf-8") == "# A\n\nbackup notes\n"
    with pytest.raises(KBError):
        bench.prepare_vault(src / "bench", src, None)  # an out dir inside the vault is refused
    assert sorted(p.name for p in src.iterdir()) == ["a.md"]


def test_bench_mcp_mode_times_launch_searches_and_every_edit_kind_quiet_and_busy(tmp_path):
    out = tmp_path / "bench-mcp"
    args = ["--mcp", "--busy", "--synthetic", "12", "--mode", "keyword", "--repeat", "1", "--json", "--out-dir", str(out)]
    args += ["--model", "use-multilingual"]  # the server's model (no torch): what the 100k-chunk row runs with
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout)
    value = {k: m["value"] for k, m in data["metrics"].items()}
    assert data["env"]["notes"] == 12 and data["env"]["busy"] is True and data["env"]["mode"] == "keyword"
    assert data["env"]["embedder"] == "use-multilingual"
    assert json.loads((out / "server.yaml").read_text())["embedding"]["model"] == "use-multilingual"
    for suffix in ("", "_busy"):
        assert 0 < value[f"mcp_initialize_ms{suffix}"] <= value[f"mcp_first_answer_ms{suffix}"]
        assert value[f"mcp_first_answer_mode{suffix}"] == "keyword"
        assert 0 < value[f"mcp_search_p50_ms{suffix}"] <= value[f"mcp_search_p95_ms{suffix}"]
        for kind in ("in_place", "atomic_save", "new_folder", "rename", "delete"):
            assert value[f"mcp_edit_{kind}_ms{suffix}"] > 0, kind  # None: never found
            assert value[f"mcp_edit_{kind}_searches{suffix}"] >= 1
        assert value[f"mcp_full_walks_before_search{suffix}"] == 0  # edits came from file events
        # memory with the model loaded and the index open: its own part within it, and within the later peak
        rss, private = value[f"mcp_server_rss_mb{suffix}"], value[f"mcp_server_private_mb{suffix}"]
        assert 0 < private < rss <= value[f"mcp_server_peak_rss_mb{suffix}"]
    assert (out / "vault").is_dir() and (out / "server.log").is_file()


@pytest.mark.parametrize(
    "flags", [["--busy"], ["--data-dir", "/tmp"], ["--model", "use-multilingual"], ["--mcp", "--fake-embedder"]]
)
def test_bench_refuses_mcp_flags_in_the_wrong_mode(tmp_path, flags):
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--synthetic", "5", *flags, "--out-dir", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2 and "--mcp" in proc.stderr


def test_bench_links_times_each_case_and_checks_incremental_against_fresh():
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "eval" / "bench_links.py"), "--notes", "60", "--links-per-note", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["notes"] == 60 and result["links"] == 180 and result["incremental_equals_fresh"] == 1.0
    for key in ("resolver_build_ms", "first_build_ms", "edit_p50_ms", "new_note_p50_ms", "takeover_ms"):
        assert result[key] >= 0, key


def test_plant_identifiers_puts_every_planted_note_first_and_leaves_the_vault_alone(tmp_path):
    """eval/plant_identifiers.py on a copy of the sample vault (hash embedder): every planted identifier's note comes
    first despite its look-alikes, and the vault it copied from is unchanged."""
    before = {p: p.read_bytes() for p in SAMPLE_KB.rglob("*") if p.is_file()}
    plant = ("--kb-dir", str(SAMPLE_KB), "--out-dir", str(tmp_path / "plant"), "--rounds", "3", "--fake-embedder")
    result = _run_json("plant_identifiers.py", *plant)
    assert result["rounds"] == 3 and result["searches"] == result["first"] == 9 and not result["misses"]
    assert (tmp_path / "plant" / "vault" / "fresh-0-0.md").is_file()
    assert {p: p.read_bytes() for p in SAMPLE_KB.rglob("*") if p.is_file()} == before


def test_bench_first_index_summarizes_its_rounds():
    spec = importlib.util.spec_from_file_location("eval_bench_first_index", REPO_ROOT / "eval" / "bench_first_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rounds = [
        {"mode": "keyword", "search_ms": 900.0, "says_coverage": False},
        {"mode": "hybrid", "search_ms": 40.0, "says_coverage": True},
        {"mode": "hybrid", "search_ms": 60.0, "says_coverage": True},
        {"mode": "hybrid", "search_ms": 50.0, "says_coverage": False},  # the round that found every chunk covered
    ]
    got = module.summarize(rounds, first_full=12.0, all_full=30.0, peak=250.4)
    assert got["replies_before_full"] == 2 and got["replies_saying_coverage"] == 2
    assert got["keyword_only_replies"] == 1
    assert (got["search_ms_p50"], got["search_ms_p95"]) == (40.0, 60.0)
    assert (got["multilingual_full_s"], got["all_models_full_s"], got["peak_rss_mb"]) == (12.0, 30.0, 250)
