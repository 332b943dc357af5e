"""Engine integration tests: real files, real vector segments and state in tmp_path, real jieba, a counting hash embedder.

Over 500 lines for a reason: one test per behaviour of a sync (what it embeds, skips, keeps and rebuilds), each
reading alone over its own vault; split, they would share the same fixtures from two files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT, make_config, write_note

import ingest
import kb_engine
import kb_state
from kb_config import LockTimeoutError, ModelUnavailableError
from kb_engine import Engine
from kb_state import FileLock
from kb_vectors import HashEmbedder


def _vector_ids_for(engine: Engine, path: str) -> list[str]:
    return [cid for cid, c in engine.chunks.items() if c.path == path and c.content in engine.store]


def assert_consistent(engine: Engine) -> None:
    """state.json, the keyword view and the vectors hold exactly the chunks of the notes, each chunk with a vector,
    as this process and a fresh one see them; no segment file is left that state.json does not name."""
    state = json.loads(engine.state_path.read_text(encoding="utf-8"))
    state_ids = {cid for rec in state["files"].values() for cid in rec["chunks"]}
    assert set(engine.chunks) == state_ids
    assert len(engine.bm25) == len(state_ids)
    assert engine.pending_vectors == 0
    assert all(kb_engine.content_of(cid) in engine.store for cid in state_ids)
    fresh = Engine(engine.cfg, HashEmbedder(name=engine.embedder.name))
    fresh.sync_all(write=False)
    assert fresh.pending_vectors == 0 and set(fresh.chunks) == state_ids
    if engine.cfg.vector_mode == "local":
        on_disk = {p.name for p in (engine.cfg.index_dir / "vectors").glob("seg-*")}
        assert on_disk == set(state["segments"])
    else:  # a Chroma server: nothing orphaned after deletes
        assert len(fresh.store) == len({kb_engine.content_of(cid) for cid in state_ids})


_assert_consistent = assert_consistent


def _blank_config(tmp_path: Path) -> Path:
    """A config file of defaults for ingest.main runs: without one, a clone's config.yaml is created (or a developer's
    own, with another model, is used)."""
    path = tmp_path / "blank-config.yaml"
    path.write_text("{}\n", encoding="utf-8")
    return path


def test_sync_embeds_nothing_when_unchanged(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    first = engine.sync_all()
    assert first.added == 4 and first.chunks_embedded == len(engine.chunks) > 0
    calls = len(emb.calls)
    second = engine.sync_all()
    assert second.chunks_embedded == 0 and second.unchanged == 4 and not second.did_work
    assert len(emb.calls) == calls
    _assert_consistent(engine)


def test_sync_skips_reading_when_stat_unchanged(small_vault, make_engine, monkeypatch):
    engine = make_engine(small_vault)
    engine.sync_all()
    reads: list[Path] = []
    real = kb_engine.read_note_bytes  # how the engine reads a note (Path.read_bytes is not on its path)
    monkeypatch.setattr(kb_engine, "read_note_bytes", lambda path, limit: reads.append(path) or real(path, limit))
    engine.sync_all()
    assert reads == []
    (small_vault / "inbox.md").write_text("# Inbox\n\n- changed\n", encoding="utf-8")
    engine.sync_all()
    assert [p.name for p in reads] == ["inbox.md"]  # the patch sees reads: this test can fail


def test_sync_reembeds_nothing_when_only_touched(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    note = small_vault / "projects" / "alpha.md"
    st = note.stat()
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    report = engine.sync_all()
    assert report.touched == 1 and report.chunks_embedded == 0 and report.changed == 0
    assert engine.files["projects/alpha.md"].mtime_ns == st.st_mtime_ns + 5_000_000_000
    assert not engine.sync_all().did_work  # the new stat was committed


def _keep_size_and_mtime(note: Path, old: str, new: str) -> None:
    """Replace a word by one of the same length and set the mtime back, as `rsync -t` and backup restores do."""
    assert len(old.encode()) == len(new.encode())
    st = note.stat()
    note.write_text(note.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = note.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_an_edit_that_keeps_size_and_mtime_is_indexed(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    _keep_size_and_mtime(small_vault / "inbox.md", "first", "okapi")
    report = engine.sync_all()
    assert report.changed == 1
    assert any("okapi" in c.text for c in engine.chunks.values() if c.path == "inbox.md")
    fresh = make_engine(small_vault)  # a later ingest.py run has nothing left to do and holds the new text
    assert not fresh.sync_all().did_work
    assert any("okapi" in c.text for c in fresh.chunks.values() if c.path == "inbox.md")


def test_an_index_without_the_full_change_signature_is_read_once_and_not_re_embedded(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    state = json.loads(engine.state_path.read_text(encoding="utf-8"))
    for rec in state["files"].values():  # as written before ctime and inode were recorded
        del rec["ctime_ns"], rec["inode"]
    engine.state_path.write_text(json.dumps(state), encoding="utf-8")
    embedded = emb.embedded
    report = make_engine(small_vault, emb).sync_all()
    assert report.touched == 4 and report.changed == 0 and emb.embedded == embedded
    assert not make_engine(small_vault, emb).sync_all().did_work


def test_sync_reembeds_only_the_edited_section(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    long_note = small_vault / "long.md"
    before = [c for c in engine.chunks.values() if c.path == "long.md"]
    assert len(before) >= 4
    text = long_note.read_text(encoding="utf-8").replace("word3x7 ", "EDITED ")
    long_note.write_text(text, encoding="utf-8")
    embedded_before = emb.embedded
    report = engine.sync_all()
    assert report.changed == 1
    assert emb.embedded - embedded_before == report.chunks_embedded == 1
    assert report.chunks_deleted == 1
    _assert_consistent(engine)


def test_sync_updates_line_ranges_without_embedding_when_text_shifts(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    note = small_vault / "long.md"
    note.write_text(note.read_text(encoding="utf-8").replace("# Long\n", "# Long\n\nIntro line added.\n", 1), encoding="utf-8")
    report = engine.sync_all()
    assert report.chunks_embedded <= 1  # only the chunk holding the new intro
    lines = note.read_text(encoding="utf-8").split("\n")
    for c in engine.chunks.values():
        if c.path == "long.md" and c.heading_path.endswith("Section 5"):
            assert lines[c.line_start - 1].startswith("## Section 5")


def test_sync_removes_chunks_of_deleted_note(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    assert _vector_ids_for(engine, "long.md")
    (small_vault / "long.md").unlink()
    report = engine.sync_all()
    assert report.removed == 1 and report.chunks_deleted > 0
    assert _vector_ids_for(engine, "long.md") == []
    found = engine.view.nearest(HashEmbedder().embed_query("Section 3 word3x7 word3x8"), 50)
    assert found and not any(engine.chunks[cid].path == "long.md" for cid, _ in found)
    assert not any(c.path == "long.md" for c in engine.chunks.values())
    _assert_consistent(engine)


def test_sync_reuses_vectors_when_note_renamed(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    (small_vault / "projects" / "alpha.md").rename(small_vault / "projects" / "alpha-renamed.md")
    embedded = emb.embedded
    report = engine.sync_all()
    assert report.added == 1 and report.removed == 1
    assert emb.embedded == embedded and report.chunks_reused > 0
    assert _vector_ids_for(engine, "projects/alpha.md") == []
    assert _vector_ids_for(engine, "projects/alpha-renamed.md")
    _assert_consistent(engine)


def test_apply_file_changes_handles_given_paths_only(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    (small_vault / "inbox.md").write_text("# Inbox\n\n- second capture about sourdough\n", encoding="utf-8")
    (small_vault / "笔记.md").write_text("# 跑步\n\n改了\n", encoding="utf-8")
    report = engine.apply_file_changes([small_vault / "inbox.md"])
    assert report.changed == 1
    assert report.unchanged == 3 and "1 changed, 0 removed, 3 unchanged" in report.summary()  # of the index's 4 notes
    assert any("sourdough" in c.text for c in engine.chunks.values())
    assert not any("改了" in c.text for c in engine.chunks.values())  # not named, not applied yet
    (small_vault / "inbox.md").unlink()
    removal = engine.apply_file_changes(["inbox.md"])
    assert removal.removed == 1 and removal.unchanged == 3
    nothing = engine.apply_file_changes([".obsidian/app.json", "../outside.md"])
    assert nothing.did_work is False and nothing.unchanged == 3


def test_sync_rebuilds_affected_chunks_when_chunk_size_changes(small_vault, make_engine, tmp_path):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    old_ids = set(engine.chunks)
    emb2 = HashEmbedder()
    engine2 = make_engine(small_vault, emb2, chunk_tokens=64)
    report = engine2.sync_all()
    assert any("chunking changed" in r for r in report.reasons)
    assert report.changed == 4
    kept = set(engine2.chunks) & old_ids
    assert kept and set(engine2.chunks) != old_ids  # short notes chunk the same way and keep their vectors
    assert report.chunks_embedded == emb2.embedded == len(set(engine2.chunks) - old_ids)
    _assert_consistent(engine2)


def test_sync_reembeds_everything_when_model_changes(small_vault, make_engine):
    engine = make_engine(small_vault, HashEmbedder(name="model-a"))
    engine.sync_all()
    emb_b = HashEmbedder(name="model-b")
    engine_b = make_engine(small_vault, emb_b)
    report = engine_b.sync_all()
    assert any("embedding model changed" in r for r in report.reasons)
    assert report.chunks_embedded == len(engine_b.chunks) and report.chunks_reused == 0
    _assert_consistent(engine_b)


def test_sync_after_crash_mid_embedding_embeds_only_what_was_not_committed(small_vault, make_engine, monkeypatch):
    monkeypatch.setattr(kb_engine, "EMBED_BATCH", 3)
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    calls = {"n": 0}
    real_commit = Engine._commit_state

    def crash_on_third(self, segments=None):
        calls["n"] += 1  # 1: the notes' records, 2: the first batch of vectors, 3: the second batch
        if calls["n"] == 3:
            raise RuntimeError("simulated crash after a segment was written, before its commit")
        real_commit(self, segments)

    monkeypatch.setattr(Engine, "_commit_state", crash_on_third)
    with pytest.raises(RuntimeError):
        engine.sync_all()
    assert emb.embedded == 6
    monkeypatch.setattr(Engine, "_commit_state", real_commit)
    emb2 = HashEmbedder()
    engine2 = make_engine(small_vault, emb2)
    engine2.sync_all()
    assert emb2.embedded == len(engine2.chunks) - 3  # the committed first batch is kept, the torn one redone
    _assert_consistent(engine2)  # the unnamed segment of the crashed batch is gone


def test_sync_reembeds_and_drops_old_segments_when_state_is_lost(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    (small_vault / "long.md").unlink()
    engine.state_path.unlink()  # as if state.json were lost together with the note's removal
    engine2 = make_engine(small_vault)
    engine2.sync_all()
    _assert_consistent(engine2)


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("binary.md", b"\x00\x01\x02 not text", "binary"),
        ("latin1.md", "caf\xe9 cr\xe8me".encode("latin-1") + b"\xff\xfe\xfa", "not UTF-8"),
    ],
)
def test_sync_skips_unreadable_note_with_reason(small_vault, make_engine, name, data, reason):
    (small_vault / name).write_bytes(data)
    engine = make_engine(small_vault)
    report = engine.sync_all()
    assert report.skipped == 1 and report.added == 4
    assert reason in engine.skipped_files()[name]
    assert not engine.sync_all().did_work  # not retried until the file changes


def test_sync_skips_note_over_size_limit(small_vault, make_engine):
    (small_vault / "huge.md").write_text("x " * 3000, encoding="utf-8")
    engine = make_engine(small_vault, max_file_bytes=1000)
    engine.sync_all()
    assert "max_file_bytes" in engine.skipped_files()["huge.md"]


def test_sync_indexes_gb18030_and_broken_frontmatter_notes(small_vault, make_engine):
    (small_vault / "gbk.md").write_bytes("# 旧笔记\n\n这是一篇用 GBK 编码保存的旧笔记，讲红烧肉。\n".encode("gb18030"))
    (small_vault / "broken.md").write_text(
        "---\ntitle: 'unclosed\ntags: [a\n---\n# Cat\n\nThe cat weighs 5.4 kg.\n", encoding="utf-8"
    )
    engine = make_engine(small_vault)
    engine.sync_all()
    assert engine.files["gbk.md"].encoding == "gb18030"
    assert any("红烧肉" in c.text for c in engine.chunks.values() if c.path == "gbk.md")
    assert any("5.4 kg" in c.text for c in engine.chunks.values() if c.path == "broken.md")


def test_second_process_sees_first_process_writes_without_embedding(small_vault, make_engine, tmp_path):
    a = make_engine(small_vault, HashEmbedder())
    a.sync_all()
    emb_b = HashEmbedder()
    b = make_engine(small_vault, emb_b)
    b.sync_all()
    assert emb_b.embedded == 0
    (small_vault / "inbox.md").write_text("# Inbox\n\n- zanzibar ferry schedule\n", encoding="utf-8")
    a.sync_all()
    report = b.sync_all()
    assert emb_b.embedded == 0 and report.chunks_embedded == 0
    assert any("zanzibar" in c.text for c in b.chunks.values())
    hits = b.view.nearest(HashEmbedder().embed_query("zanzibar ferry schedule"), 3)
    assert hits and b.chunks[hits[0][0]].path == "inbox.md"


def test_a_server_answers_before_its_vectors_load_and_loads_them_before_any_write(small_vault, make_engine):
    """defer_vectors (a server's start-up): the first sync reads the view only; an edit committed before load_vectors
    loads the segments first, so state.json keeps naming every vector and nothing is embedded again."""
    from kb_search import Searcher

    a = make_engine(small_vault, HashEmbedder())
    a.sync_all()
    segments, vectors = a.state.segments, len(a.store)
    emb = HashEmbedder()
    server = make_engine(small_vault, emb)
    server.defer_vectors()
    server.sync_all(write=False)
    assert len(server.store) == 0 and server.pending_vectors == 0  # not loaded, and not counted as missing
    assert Searcher(server).search("PostgreSQL ledger", mode="keyword").hits[0].path == "projects/alpha.md"
    (small_vault / "笔记.md").unlink()  # a commit with nothing to embed: it alone names the segments
    server.apply_file_changes(["笔记.md"])
    assert set(server.state.segments) == set(segments) and len(server.store) == vectors and emb.embedded == 0
    (small_vault / "inbox.md").write_text("# Inbox\n\n- zanzibar ferry schedule\n", encoding="utf-8")
    report = server.apply_file_changes(["inbox.md"])
    assert report.chunks_embedded == emb.embedded == 1 and server.pending_vectors == 0
    fresh_embedder = HashEmbedder()
    fresh = make_engine(small_vault, fresh_embedder)
    fresh.sync_all()  # what the next process reads: every vector still named
    assert fresh_embedder.embedded == 0 and fresh.pending_vectors == 0
    server.load_vectors()  # a no-op once loaded
    assert len(server.store) == len(fresh.store)


def test_sync_reports_lock_timeout_and_keeps_keyword_view_fresh(small_vault, make_engine):
    engine = make_engine(small_vault, lock_timeout_s=0.2)
    engine.sync_all()
    (small_vault / "inbox.md").write_text("# Inbox\n\n- quokka sighting\n", encoding="utf-8")
    other = FileLock(engine.cfg.index_dir / "lock")
    other_proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
                "print('locked', flush=True); time.sleep(30)"
            ),
            str(other.path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other_proc.stdout.readline().strip() == "locked"
        report = engine.sync_all()
    finally:
        other_proc.kill()
        other_proc.wait()
    assert report.lock_timeout and not report.committed and "not committed" in report.summary()
    assert any("index lock" in r and "nothing was committed" in r for r in report.reasons)
    assert any("quokka" in c.text for c in engine.chunks.values())  # keyword view updated anyway
    assert engine.sync_all().changed == 1  # committed once the lock is free


def test_file_lock_times_out_with_clear_message(tmp_path):
    first, second = FileLock(tmp_path / "lock"), FileLock(tmp_path / "lock")
    first.acquire(1)
    try:
        # flock is per open file description: a second descriptor in this process conflicts like another process
        with pytest.raises(LockTimeoutError, match="lock_timeout"):
            second.acquire(0.1)
    finally:
        first.release()
    second.acquire(0.1)
    second.release()


class _BrokenModel(HashEmbedder):
    def embed_documents(self, texts):
        raise ModelUnavailableError("embedding model 'missing-model' cannot be loaded (test)")

    def embed_query(self, text):
        raise ModelUnavailableError("embedding model 'missing-model' cannot be loaded (test)")


def test_sync_degrades_to_keyword_index_when_model_unavailable(small_vault, make_engine):
    engine = make_engine(small_vault, _BrokenModel())
    report = engine.sync_all()
    assert engine.model_error and "missing-model" in engine.model_error
    assert report.added == 4 and report.chunks_embedded == 0 and report.pending_vectors == 0
    assert engine.bm25.search(engine.tokenizer.tokenize("PostgreSQL ledger"), 3)


def test_new_process_starts_from_saved_view_without_rechunking(small_vault, make_engine, monkeypatch):
    engine = make_engine(small_vault)
    engine.sync_all()
    engine.save_view()
    planned: list[str] = []
    real_plan = Engine._plan
    monkeypatch.setattr(Engine, "_plan", lambda self, path, stat, old: planned.append(path) or real_plan(self, path, stat, old))
    engine2 = make_engine(small_vault)
    engine2.sync_all()
    assert planned == []
    assert set(engine2.chunks) == set(engine.chunks)


def test_rebuild_clears_and_reindexes(small_vault, make_engine):
    emb = HashEmbedder()
    engine = make_engine(small_vault, emb)
    engine.sync_all()
    n = len(engine.chunks)
    report = engine.sync_all(rebuild=True)
    assert report.added == 4 and report.chunks_embedded == n
    _assert_consistent(engine)


def test_vault_terms_become_single_tokens_after_sync(small_vault, make_engine):
    (small_vault / "米哈游面试.md").write_text(
        "---\naliases: [米哈游]\n---\n# 面试\n\n米哈游的二面问了限流。\n", encoding="utf-8"
    )
    engine = make_engine(small_vault)
    engine.sync_all()
    assert "米哈游" in engine.tokenizer.tokenize("米哈游面试")
    hits = engine.bm25.search(engine.tokenizer.tokenize("米哈游"), 1)
    assert hits and engine.chunks[hits[0][0]].path == "米哈游面试.md"


def test_model_warning_names_multilingual_model_for_chinese_vault(tmp_path, make_engine):
    vault = tmp_path / "zh"
    vault.mkdir()
    (vault / "a.md").write_text("# 笔记\n\n" + "今天学习了分布式事务和消息队列的设计。" * 20, encoding="utf-8")
    engine = make_engine(vault, HashEmbedder(name="all-MiniLM-L6-v2"))
    engine.sync_all()
    warning = engine.model_warning()
    assert warning and "use-multilingual" in warning
    english = make_engine(vault, HashEmbedder(name="BAAI/bge-small-zh-v1.5"), data_dir=tmp_path / "d2")
    english.sync_all()
    assert english.model_warning() is None


def test_ingest_cli_prints_json_summary_and_creates_config_on_first_run(small_vault, tmp_path, monkeypatch, capsys):
    import kb_config

    example = tmp_path / "config.example.yaml"
    example.write_text((REPO_ROOT / "config.example.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(kb_config, "DEFAULT_CONFIG_FILE", tmp_path / "config.yaml")
    monkeypatch.setattr(kb_config, "EXAMPLE_CONFIG_FILE", example)
    monkeypatch.delenv("KB_CONFIG", raising=False)
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(ingest, "config_embedder", lambda *a, **k: HashEmbedder())
    assert ingest.main(["--kb-dir", str(small_vault), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "created" in err and (tmp_path / "config.yaml").is_file()
    summary = json.loads(out)
    assert summary["added"] == 4 and summary["notes"] == 4 and summary["chunks_embedded"] > 0
    assert ingest.main(["--kb-dir", str(small_vault), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunks_embedded"] == 0


def test_ingest_cli_exits_1_with_message_for_missing_model(small_vault, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(ingest, "config_embedder", lambda *a, **k: _BrokenModel())
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"kb_dir: {small_vault}\n", encoding="utf-8")
    assert ingest.main(["--config", str(cfg_file)]) == 1
    assert "missing-model" in capsys.readouterr().err


def test_ingest_cli_exits_1_for_invalid_config(tmp_path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("kb_dir: /does/not/exist\nsearch:\n  top_k: 0\n", encoding="utf-8")
    assert ingest.main(["--config", str(cfg_file)]) == 1
    err = capsys.readouterr().err
    assert "search.top_k must be >= 1" in err


def test_two_processes_syncing_at_once_stay_consistent(sample_vault, tmp_path):
    """Two real ingest processes on one index at the same time: no corruption, no duplicate vectors."""
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(
        f"kb_dir: {json.dumps(str(sample_vault))}\ndata_dir: {json.dumps(str(tmp_path / 'data'))}\n", encoding="utf-8"
    )
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from kb_config import load_config; from kb_engine import Engine; from kb_vectors import HashEmbedder;"
        "e = Engine(load_config(sys.argv[2]), HashEmbedder()); r = e.sync_all(); print(r.chunks_embedded)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(REPO_ROOT), str(cfg_file)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [int(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    engine = Engine(make_config(sample_vault, tmp_path / "data"), HashEmbedder())
    engine.sync_all()
    _assert_consistent(engine)
    assert sum(outs) == len(engine.chunks)  # every chunk embedded exactly once across both processes


@pytest.mark.parametrize("model", ["no-such-org/no-such-model", "/definitely/not/a/model/folder"])
@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None,
    reason="sentence-transformers is not installed (pip install -r requirements-st.txt)",
)
def test_real_embedder_refuses_unloadable_model_with_next_step(model):
    """Refused before sentence-transformers is imported (with torch, 5-10 s of CPU): a server never downloads, and
    a path that names no folder cannot load."""
    from kb_vectors import SentenceTransformerEmbedder

    imported = "sentence_transformers" in sys.modules  # another test of this process may have imported it
    with pytest.raises(ModelUnavailableError) as err:
        SentenceTransformerEmbedder(model, device="cpu").embed_query("hello")
    message = str(err.value)
    assert model in message and "ingest.py" in message and "local folder" in message
    assert imported or "sentence_transformers" not in sys.modules


def test_unloadable_new_model_leaves_existing_vectors_untouched(small_vault, make_engine):
    engine = make_engine(small_vault, HashEmbedder(name="model-a"))
    engine.sync_all()
    broken = make_engine(small_vault, _BrokenModel(name="model-b"))
    broken.sync_all()
    assert broken.model_error and "missing-model" in broken.model_error
    assert json.loads(broken.state_path.read_text(encoding="utf-8"))["params"]["model"] == "model-a"
    _assert_consistent(engine)  # model-a's vectors are all still there


def test_saved_view_is_not_rewritten_when_nothing_changed(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    assert engine.view_changed
    engine.save_view()
    fresh = make_engine(small_vault)
    fresh.sync_all()
    assert not fresh.view_changed  # loaded from the pickle, nothing to write back
    (small_vault / "inbox.md").write_text("# Inbox\n\n- new\n", encoding="utf-8")
    fresh.sync_all()
    assert fresh.view_changed


def test_try_sync_answers_none_while_another_thread_syncs(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    with engine._sync_lock:  # as if the server's start-up sync were still running
        assert engine.try_sync(0.05) is None and engine.syncing
    (small_vault / "inbox.md").write_text("# Inbox\n\n- capybara\n", encoding="utf-8")
    report = engine.try_sync(0.05, ["inbox.md"])
    assert report is not None and report.changed == 1


def test_skipped_files_lists_what_the_scan_could_not_take_as_a_note(small_vault, make_engine):
    os.mkfifo(small_vault / "pipe.md")
    (small_vault / "dangling.md").symlink_to(small_vault / "nowhere.md")
    os.close(os.open(os.fsencode(small_vault) + b"/caf\xe9.md", os.O_CREAT | os.O_WRONLY, 0o644))
    engine = make_engine(small_vault)

    report = engine.sync_all()

    skipped = engine.skipped_files()
    assert report.added == 4
    assert "FIFO" in skipped["pipe.md"]
    assert "dangling.md" in skipped and any("caf" in p for p in skipped)


def test_first_sync_sweeps_old_temp_files_a_killed_writer_left(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()
    hour_ago = time.time() - 3600
    leftovers = [engine.cfg.index_dir / ".kb-tmp-old.tmp", engine.cfg.index_dir / "vectors" / ".kb-tmp-old2.tmp"]
    leftovers.append(small_vault / "projects" / ".kb-tmp-note.tmp")
    for p in leftovers:
        p.write_text("torn", encoding="utf-8")
        os.utime(p, (hour_ago, hour_ago))

    make_engine(small_vault).sync_all()

    assert not any(p.exists() for p in leftovers)


# ---- a vault that looks empty ------------------------------------------------------------------------------------


def _move_notes_away(vault: Path, dest: Path, keep: int = 0) -> int:
    notes = sorted(p for p in vault.rglob("*.md") if ".trash" not in p.parts and ".obsidian" not in p.parts)
    dest.mkdir()
    for i, p in enumerate(notes[keep:]):
        p.rename(dest / f"{i}.md")
    return len(notes) - keep


@pytest.mark.parametrize("keep", [0, 3])  # an empty mount point; a cloud folder with only a few notes synced yet
def test_sync_keeps_the_index_when_most_of_the_vault_vanishes(sample_vault, make_engine, tmp_path, keep):
    engine = make_engine(sample_vault)
    engine.sync_all()
    indexed = len(engine.files)
    _move_notes_away(sample_vault, tmp_path / "away", keep)
    report = engine.sync_all()
    assert len(engine.files) == indexed and report.removed == 0
    assert engine.held_deletions and "--allow-mass-delete" in engine.held_deletions
    assert any("indexed notes are missing" in r for r in report.reasons)
    fresh = make_engine(sample_vault)  # another process (a server starting) holds back the same way
    fresh.sync_all()
    assert len(fresh.files) == indexed
    engine.allow_mass_delete = True  # the user confirms: they were deleted
    engine.sync_all()
    assert len(engine.files) == keep and engine.held_deletions is None


def test_sync_removes_a_few_deleted_notes_as_usual(sample_vault, make_engine, tmp_path):
    engine = make_engine(sample_vault)
    engine.sync_all()
    indexed = len(engine.files)
    for p in sorted(sample_vault.glob("daily/*.md"))[:3]:
        p.unlink()
    report = engine.sync_all()
    assert report.removed == 3 and len(engine.files) == indexed - 3 and engine.held_deletions is None


def test_ingest_refuses_to_empty_the_index_without_the_flag(sample_vault, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ingest, "config_embedder", lambda *a, **k: HashEmbedder())
    monkeypatch.setenv("KB_CONFIG", str(_blank_config(tmp_path)))
    args = ["--kb-dir", str(sample_vault), "-q"]
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    assert ingest.main(args) == 0
    _move_notes_away(sample_vault, tmp_path / "away")
    assert ingest.main(args) == 1
    err = capsys.readouterr().err
    assert "nothing was removed" in err and "--allow-mass-delete" in err
    assert ingest.main([*args, "--allow-mass-delete"]) == 0


def test_ingest_on_a_full_index_disk_says_what_to_do_and_exits_1(small_vault, tmp_path, monkeypatch, capsys):
    import errno

    import kb_files

    monkeypatch.setattr(ingest, "config_embedder", lambda *a, **k: HashEmbedder())
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kb_files, "atomic_write_bytes", full)
    monkeypatch.setattr(kb_state, "write_state_file", full)
    monkeypatch.setenv("KB_CONFIG", str(_blank_config(tmp_path)))
    assert ingest.main(["--kb-dir", str(small_vault), "-q"]) == 1
    err = capsys.readouterr().err
    assert "is full" in err and "Nothing already indexed was lost" in err and "Traceback" not in err


def test_a_sync_chunks_each_changed_note_once_and_the_view_takes_what_was_committed(small_vault, make_engine, monkeypatch):
    """One way into the view: the notes a sync commits enter the view as they were chunked for the commit, not
    chunked a second time by the view's reconcile step."""
    engine = make_engine(small_vault)
    engine.sync_all()
    calls: list[str] = []
    real = kb_engine.chunk_note

    def counting(text, *args, **kwargs):
        calls.append(text[:20])
        return real(text, *args, **kwargs)

    monkeypatch.setattr(kb_engine, "chunk_note", counting)
    (small_vault / "inbox.md").write_text("# Inbox\n\n- a fresh okapi line\n", encoding="utf-8")
    write_note(small_vault, "new/fresh.md", "# Fresh\n\nA brand new note about quokkas.\n")
    report = engine.sync_all()
    assert (report.added, report.changed) == (1, 1)
    assert len(calls) == 2
    state = kb_state.read_state_file(engine.state_path)
    assert state is not None
    assert {p: r.chunks for p, r in state["files"].items()} == {p: r.chunks for p, r in engine.view.files.items()}
    assert any("quokkas" in c.text for c in engine.view.chunks.values())


def test_vault_profile_samples_the_whole_index_not_its_first_folder(tmp_path, make_engine, monkeypatch):
    """A vault of 30 English pages then 10 Chinese translations (tldr's pages/ and pages.zh/): the profile a client
    reads to decide whether to translate its question must see both languages, in their shares."""
    vault = tmp_path / "vault"
    for i in range(30):
        write_note(vault, f"a-pages/cmd{i:02}.md", f"# cmd{i}\n\nList the files of a directory, sorted by size {i}.\n")
    for i in range(10):
        write_note(vault, f"b-pages.zh/cmd{i:02}.md", f"# cmd{i}\n\n列出目录中的文件，按大小排序，第 {i} 个例子。\n")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    monkeypatch.setattr(kb_engine, "LANGUAGE_SAMPLE_CHUNKS", 8)  # a big vault: the sample is a small part of it
    languages = engine.vault_profile()["languages"]
    assert set(languages) == {"en", "zh"} and 0.15 <= languages["zh"] <= 0.35, languages


def test_ingest_embeds_on_every_core_with_each_model_call_on_one_thread(small_vault, tmp_path, monkeypatch):
    """The ingest CLI is a foreground job: the engine runs one embedding worker per core (kb_embedrun), each model
    call on one BLAS thread (USE with two went 2.5x slower with a core busy; workers degrade gracefully)."""
    from kb_vectors import make_embedder

    asked: dict = {}
    workers: list[int] = []

    def recording(*args, **kwargs):
        asked.update(kwargs)
        return HashEmbedder()

    class RecordingEngine(Engine):
        def __init__(self, *args, **kwargs):
            workers.append(kwargs.get("embed_workers", 1))
            super().__init__(*args, **kwargs)

    monkeypatch.setenv("KB_CONFIG", str(_blank_config(tmp_path)))
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(ingest, "config_embedder", recording)
    monkeypatch.setattr(ingest, "Engine", RecordingEngine)
    assert ingest.main(["--kb-dir", str(small_vault), "-q"]) == 0
    assert workers == [ingest.INGEST_WORKERS] and ingest.INGEST_WORKERS == (os.cpu_count() or 1)
    assert "workers" not in asked and "threads" not in asked  # each model on one thread
    use, minilm = make_embedder("use-multilingual,all-MiniLM-L6-v2").parts  # nothing is loaded
    assert (use.threads, minilm.threads) == (1, 1)
