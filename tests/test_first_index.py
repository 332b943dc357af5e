"""A first index (issue 34): model by model, the multilingual model first, on several workers that pause while a
search runs; an English-only model skips mostly Chinese chunks; replies and index_status say how much is covered.

Real files, vector segments and state in tmp_path, real jieba; hash embedders named after the default pair (so the
English-only one is recognised by name) that record what they embed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from kb_fixtures import make_config, wait_until, write_note

import kb_embedrun
import mcp_server
from kb_engine import Engine, content_of, embed_text
from kb_store import ALL_PARTS, VectorStore
from kb_text import cjk_share
from kb_vectors import HashEmbedder, MultiEmbedder

WAIT_S = 30.0
USE, MINILM = "use-multilingual", "all-MiniLM-L6-v2"


class Recorder(HashEmbedder):
    """A hash embedder that records every text it embeds, in order, and may hold a call until released."""

    def __init__(self, dim: int, name: str) -> None:
        super().__init__(dim=dim, name=name)
        self.texts: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.waiting = threading.Event()

    def embed_documents(self, texts):
        if not self.release.is_set():
            self.waiting.set()
            self.release.wait(WAIT_S)
        self.texts.extend(texts)
        return super().embed_documents(texts)


def _pair() -> MultiEmbedder:
    return MultiEmbedder([Recorder(24, USE), Recorder(16, MINILM)])


@pytest.fixture
def mixed_vault(tmp_path: Path) -> Path:
    """English notes, Chinese notes and a Chinese note about commands (its code blocks are not prose)."""
    root = tmp_path / "mixed"
    for i in range(6):
        write_note(root, f"en/cmd{i}.md", f"# cmd{i}\n\nList the files of directory {i}, sorted by size.\n")
        write_note(root, f"zh/cmd{i}.md", f"# cmd{i}\n\n列出第 {i} 个目录中的文件，按大小排序。\n")
    write_note(root, "zh/git.md", "# Git\n\n撤销最近一次提交：\n\n```\ngit reset --soft HEAD~1\n```\n")
    write_note(  # mostly Chinese, but with enough English terms for the English model to read
        root,
        "zh/k8s.md",
        "# Kubernetes 排查\n\n先用 kubectl get pods 看状态，CrashLoopBackOff 就看 kubectl logs --previous，"
        "OOMKilled 调大 memory limit，ImagePullBackOff 检查镜像地址和 imagePullSecrets。\n",
    )
    return root


def _engine(vault: Path, data: Path, embedder: MultiEmbedder | None = None, **kw: object) -> Engine:
    return Engine(make_config(vault, data), embedder or _pair(), **kw)


def _chinese(engine: Engine) -> set[str]:
    """The contents the English model leaves out: mostly Chinese, fewer than 10 Latin words."""
    texts = {c.content: embed_text(c, engine.files[c.path]) for c in engine.chunks.values()}
    return {k for k, t in texts.items() if cjk_share(t) >= 0.3 and len(re.findall(r"[A-Za-z][\w.\-]*", t)) < 10}


def test_first_index_embeds_every_chunk_with_the_multilingual_model_and_english_chunks_with_the_english_one(
    mixed_vault, tmp_path
):
    engine = _engine(mixed_vault, tmp_path / "data")
    use, minilm = engine.embedder.parts

    report = engine.sync_all()

    contents = {c.content for c in engine.chunks.values()}
    chinese = _chinese(engine)
    assert 0 < len(chinese) < len(contents)
    assert not any(c.path == "zh/k8s.md" and c.content in chinese for c in engine.chunks.values())
    assert len(use.texts) == len(contents) and len(minilm.texts) == len(contents) - len(chinese)
    assert report.embedded_by_model == {USE: len(contents), MINILM: len(contents) - len(chinese)}
    assert report.chunks_embedded == len(contents) and engine.pending_vectors == 0
    assert {c.model: (c.embedded, c.total, c.skipped) for c in engine.coverage()} == {
        USE: (len(contents), len(contents), 0),
        MINILM: (len(contents) - len(chinese), len(contents) - len(chinese), len(chinese)),
    }
    assert engine.coverage_note() is None
    assert engine.sync_all().embedded_by_model == {}  # nothing left: the skipped chunks are not pending


def test_first_index_rows_equal_the_pair_embedders_rows_where_both_models_embed(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data")
    engine.sync_all()
    reference = MultiEmbedder([HashEmbedder(24, USE), HashEmbedder(16, MINILM)])
    chinese = _chinese(engine)
    for c in engine.chunks.values():
        stored = engine.store.vector(c.content)
        joint = np.asarray(reference.embed_documents([embed_text(c, engine.files[c.path])])[0], dtype=np.float32)
        if c.content in chinese:  # the English model's slots stay empty
            assert np.array_equal(stored[:24], joint[:24]) and not stored[24:].any()
            assert engine.store.parts_of(c.content) == 0b01
        else:  # bit for bit what embedding both at once stored
            assert np.array_equal(stored, joint) and engine.store.parts_of(c.content) == ALL_PARTS


def test_first_index_embeds_with_the_multilingual_model_first(mixed_vault, tmp_path):
    order: list[str] = []
    pair = MultiEmbedder([Recorder(16, MINILM), Recorder(24, USE)])  # listed English first: still embedded second
    for part in pair.parts:
        real = part.embed_documents
        part.embed_documents = lambda texts, real=real, name=part.name: order.extend([name] * len(texts)) or real(texts)
    engine = _engine(mixed_vault, tmp_path / "data", pair)

    engine.sync_all()

    assert order and order == sorted(order, key=lambda name: name != USE)


def test_sync_embeds_only_the_edited_chunks_with_each_model_when_one_note_changes(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data")
    use, minilm = engine.embedder.parts
    engine.sync_all()
    before = len(use.texts), len(minilm.texts)

    write_note(mixed_vault, "en/cmd1.md", "# cmd1\n\nList the files of directory 1, sorted by date instead.\n")
    write_note(mixed_vault, "zh/cmd1.md", "# cmd1\n\n列出第 1 个目录中的文件，按日期排序。\n")
    report = engine.sync_all()

    assert (len(use.texts) - before[0], len(minilm.texts) - before[1]) == (2, 1)  # the Chinese one: USE only
    assert report.embedded_by_model == {USE: 2, MINILM: 1} and report.chunks_embedded == 2
    assert engine.pending_vectors == 0


def test_two_workers_store_the_same_rows_as_one(mixed_vault, tmp_path):
    one = _engine(mixed_vault, tmp_path / "one", embed_workers=1)
    two = _engine(mixed_vault, tmp_path / "two", embed_workers=2)
    one.sync_all()
    report = two.sync_all()

    assert report.chunks_embedded == len({c.content for c in two.chunks.values()})
    for c in one.chunks.values():
        assert np.array_equal(one.store.vector(c.content), two.store.vector(c.content))
        assert one.store.parts_of(c.content) == two.store.parts_of(c.content)


def test_index_built_before_drops_the_english_models_chinese_vectors_without_embedding(mixed_vault, tmp_path, caplog):
    """An index of whole rows (every model for every chunk, as before issue 34): the first sync of the new code keeps
    the multilingual vectors, drops the English model's of mostly Chinese chunks, re-embeds nothing, and says so."""
    data = tmp_path / "data"
    old = _engine(mixed_vault, data)
    old.sync_all(embed_limit=0)
    texts = old._texts_for(old._state_contents())
    with old._locked():
        old.store.load(old.store.write_segment(dict(zip(texts, old.embedder.embed_documents(list(texts.values()))))))
        old.state.meta.pop("vector_policy", None)
        old._commit_state(old.store.segments)
    new = _engine(mixed_vault, data)
    use, minilm = new.embedder.parts

    with caplog.at_level("INFO"):
        report = new.sync_all()

    chinese = _chinese(new)
    assert not use.texts and not minilm.texts and report.chunks_embedded == 0
    assert all(new.store.parts_of(c) == (0b01 if c in chinese else ALL_PARTS) for c in texts)
    assert any(f"dropped its vectors of {len(chinese)} such chunks" in r for r in report.reasons)
    assert _engine(mixed_vault, data).sync_all().reasons == []  # recorded in state.json: done once


def test_english_models_search_list_leaves_out_chunks_without_its_vector(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data")
    engine.sync_all()
    from kb_vectors import embed_query_part

    minilm_query = embed_query_part(engine.embedder, 1, "list files sorted by size")
    use_query = embed_query_part(engine.embedder, 0, "list files sorted by size")
    english = engine.view.nearest(minilm_query.vector, 100)
    everything = engine.view.nearest(use_query.vector, 100)

    assert {engine.chunks[cid].path for cid, _ in english} == {p for p in engine.files if p.startswith("en/")} | {"zh/k8s.md"}
    assert len(everything) == len(engine.chunks)


def test_coverage_note_says_how_much_is_covered_until_every_chunk_has_its_vectors(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data")
    engine.sync_all(embed_limit=0)
    total = len({c.content for c in engine.chunks.values()})
    english = total - len(_chinese(engine))

    assert (
        engine.coverage_note()
        == f"semantic results cover 0 of {total} passages ({MINILM}: 0 of the {english} it embeds); the rest is being indexed"
    )
    engine.embed_pending()
    assert engine.coverage_note() is None and engine.seconds_left() is None


def test_coverage_note_says_nothing_is_covered_while_the_notes_read_are_not_committed(mixed_vault, tmp_path, monkeypatch):
    """A server's first search answers from the keyword view before the first commit (bench_first_index saw a hybrid
    reply 7 s after launch that said nothing of its coverage)."""
    engine = _engine(mixed_vault, tmp_path / "data")
    engine.sync_all(embed_limit=0)
    monkeypatch.setattr(engine.state, "files", {})  # the view holds the notes read; state.json has none of them yet
    chunks = engine.view.chunk_count()
    assert engine.coverage_note() == f"semantic results cover 0 of {chunks} passages; the rest is being indexed"


def test_coverage_note_gives_the_time_left_from_the_rates_measured():
    coverage = [kb_embedrun.Coverage(USE, 7889, 7889), kb_embedrun.Coverage(MINILM, 1024, 3402, skipped=4487)]
    meter = kb_embedrun.RunMeter()
    meter.record(MINILM, 100, 10.0)  # 10 chunks/s on one worker: 2,378 left take ~4 min
    note = kb_embedrun.coverage_note(coverage, meter.seconds_left({USE: 0, MINILM: 2378}), running=True)
    assert (
        note == f"semantic results cover all 7,889 passages ({MINILM}: 1,024 of the 3,402 it embeds); indexing, about 4 min left"
    )
    assert kb_embedrun.RunMeter().seconds_left({MINILM: 5}) is None  # no rate yet: no guess


def test_embedding_run_pauses_while_a_search_runs(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data", embed_workers=2)
    use, minilm = engine.embedder.parts
    engine.sync_all(embed_limit=0)
    with engine.search_gate.searching():
        run = threading.Thread(target=engine.embed_pending)
        run.start()
        assert wait_until(lambda: engine.search_gate.pauses >= 1, WAIT_S)
        assert not use.texts and not minilm.texts  # nothing embedded while the search runs
    run.join(WAIT_S)
    assert engine.pending_vectors == 0 and use.texts


def test_progress_is_reported_per_model(mixed_vault, tmp_path):
    engine = _engine(mixed_vault, tmp_path / "data")
    seen: dict[str, tuple[int, int]] = {}
    engine.sync_all(progress=lambda stage, done, total: seen.__setitem__(stage, (done, total)))
    contents = len({c.content for c in engine.chunks.values()})
    english = contents - len(_chinese(engine))
    assert seen[f"embed:{USE}"] == (contents, contents) and seen[f"embed:{MINILM}"] == (english, english)


def test_a_model_failing_in_one_worker_ends_the_run_with_the_reason(mixed_vault, tmp_path):
    from kb_config import ModelUnavailableError

    pair = _pair()

    def broken(texts):
        raise ModelUnavailableError("the English model is not installed")

    pair.parts[1].embed_documents = broken
    engine = _engine(mixed_vault, tmp_path / "data", pair, embed_workers=2)
    engine.sync_all()
    assert engine.model_error == "the English model is not installed"


def test_search_replies_say_how_much_is_covered_during_a_first_index(mixed_vault, tmp_path):
    """The server on an unindexed vault: while the first index runs, every semantic reply says how much its semantic
    lists cover; index_status gives the numbers; once done, neither says more."""
    pair = _pair()
    use = pair.parts[0]
    use.release.clear()  # the first model call waits: the first index stays at 0
    kb = mcp_server.KnowledgeBase(make_config(mixed_vault, tmp_path / "data"), embedder=pair)
    kb.start()
    try:
        assert use.waiting.wait(WAIT_S), "the background embedding did not start"
        text, data = kb.search("list files sorted by size", mode="hybrid")
        total = len({c.content for c in kb.live.engine.chunks.values()})
        assert f"semantic results cover 0 of {total} passages" in text
        assert any(n.startswith("semantic results cover 0 of") for n in data["notes"])
        status = kb.status()[1]["semantic_coverage"]
        assert status[USE] == {"embedded": 0, "of": total}
        use.release.set()
        assert kb.live.startup_done.wait(WAIT_S)
        text, data = kb.search("list files sorted by size", mode="hybrid")
        assert "semantic results cover" not in text
        assert kb.status()[1]["semantic_coverage"][USE] == {"embedded": total, "of": total}
    finally:
        use.release.set()
        kb.shutdown()


def test_store_scores_a_query_only_on_rows_holding_its_model(tmp_path):
    store = VectorStore(tmp_path)
    dims = (2, 2)
    half = 1 / np.sqrt(2)
    store.load(store.write_part(0, dims, {"a": [half, 0.0], "b": [0.0, half]}))
    store.load(store.write_part(1, dims, {"a": [half, 0.0]}))

    english = [0.0, 0.0, 1.0, 0.0]
    assert [k for k, _ in store.nearest(english, 5)] == ["a"]
    assert set(store.cosines(english, ["a", "b"])) == {"a"}
    assert store.missing(["a", "b"], 1) == ["b"] and store.missing(["a", "b"], 0) == []
    assert store.parts_of("a") == ALL_PARTS and store.parts_of("b") == 0b01
    reread = VectorStore(tmp_path)
    reread.load(store.segments)
    assert reread.partial and [k for k, _ in reread.nearest(english, 5)] == ["a"]
    assert content_of("k-abc-1") == "abc"


def test_relevance_background_and_note_vectors_are_drawn_again_as_a_first_index_fills_in(mixed_vault, tmp_path):
    """A server warms its searcher up before its first index: the gate's background sample and the translation step's
    note vectors taken then (few or no vectors) must not stay once the vectors have come."""
    from kb_search import Searcher

    engine = _engine(mixed_vault, tmp_path / "data")
    engine.sync_all(embed_limit=0)
    searcher = Searcher(engine)
    searcher.warm_up()
    assert searcher._background.vectors() is None  # nothing embedded yet
    assert searcher._background.notes_for(USE) == 0

    engine.embed_pending()

    ids, matrix, _ = searcher._background.vectors()
    assert len(ids) == len(engine.chunks)
    assert searcher._background.notes_for(USE) == len(engine.files)


def test_ingest_runs_blas_on_one_thread_so_its_embedding_workers_do_not_fight_its_pool():
    """OpenBLAS's own idle threads spun beside the embedding workers (CPU time doubled; two workers ran slower than
    one): the ingest CLI pins BLAS to one thread before numpy loads, unless the user set it."""
    code = "import ingest, threadpoolctl; print([i['num_threads'] for i in threadpoolctl.threadpool_info()])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    repo = Path(__file__).resolve().parent.parent
    pinned = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "[1]"
    own = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, env=env | {"OPENBLAS_NUM_THREADS": "2"}, capture_output=True, text=True
    )
    assert own.stdout.strip() == "[2]"  # a user's own setting wins


def test_worker_processes_store_the_same_rows_as_one_thread(mixed_vault, tmp_path):
    one = _engine(mixed_vault, tmp_path / "one", embed_workers=1)
    pair = _pair()
    forked = _engine(mixed_vault, tmp_path / "forked", pair, embed_workers=2, embed_processes=True)
    one.sync_all()
    report = forked.sync_all()

    assert report.chunks_embedded == len({c.content for c in forked.chunks.values()})
    assert all(part.texts == ["load"] for part in pair.parts)  # the children embedded; here only the load probe ran
    for c in one.chunks.values():
        assert np.array_equal(one.store.vector(c.content), forked.store.vector(c.content))
        assert one.store.parts_of(c.content) == forked.store.parts_of(c.content)


def test_a_model_failing_in_a_worker_process_ends_the_run_with_the_reason(mixed_vault, tmp_path):
    from kb_config import ModelUnavailableError

    pair = _pair()
    calls = []

    def broken(texts):
        calls.append(texts)
        if len(calls) > 1:  # the load probe passes; the first real call, in a child, fails
            raise ModelUnavailableError("the English model ran out of memory")
        return HashEmbedder(dim=16, name=MINILM).embed_documents(texts)

    pair.parts[1].embed_documents = broken
    engine = _engine(mixed_vault, tmp_path / "data", pair, embed_workers=2, embed_processes=True)
    engine.sync_all()
    assert engine.model_error == "the English model ran out of memory"


@pytest.mark.parametrize(
    ("seconds", "says"),
    [(10.0, "indexing, less than a minute left"), (40.0, "indexing, about 1 min left"), (61.0, "indexing, about 2 min left")],
)
def test_coverage_note_words_the_time_left_as_people_read_it(seconds, says):
    note = kb_embedrun.coverage_note([kb_embedrun.Coverage(USE, 10, 20)], seconds, running=True)
    assert note.endswith(says)


class Revised(Recorder):
    """A recorder whose vectors depend on its revision (as the bundled MiniLM's int8 kernel's differ from its float
    pass's)."""

    def __init__(self, dim: int, name: str, revision: int) -> None:
        super().__init__(dim, name)
        self.vector_revision = revision

    def embed_documents(self, texts):
        vectors = super().embed_documents(texts)
        return [[x * (-1.0 if self.vector_revision else 1.0) for x in v] for v in vectors]


def test_a_new_revision_of_one_model_re_embeds_its_vectors_only_while_the_old_ones_answer(mixed_vault, tmp_path):
    data = tmp_path / "data"
    first = _engine(mixed_vault, data, MultiEmbedder([Recorder(24, USE), Revised(16, MINILM, 0)]))
    first.sync_all()
    english = [c for c in {c.content for c in first.chunks.values()} if first.store.parts_of(c) == ALL_PARTS]
    old = {c: first.store.vector(c).copy() for c in english}
    use, minilm = Recorder(24, USE), Revised(16, MINILM, 1)
    engine = _engine(mixed_vault, data, MultiEmbedder([use, minilm]))
    engine.load_vectors()
    assert english and {c.model: c.embedded for c in engine.coverage()}[MINILM] == 0  # all of revision 0

    minilm.release.clear()  # hold the English model's first call: the index as a search sees it meanwhile
    run = threading.Thread(target=engine.sync_all)
    run.start()
    assert minilm.waiting.wait(WAIT_S)
    assert all(np.array_equal(engine.store.vector(c), old[c]) for c in english)  # the old vectors still answer
    minilm.release.set()
    run.join(WAIT_S)

    assert use.texts == [] and len(minilm.texts) == len(english)  # only the new revision's model embedded
    for c in english:
        now = engine.store.vector(c)
        assert np.array_equal(now[:24], old[c][:24]) and np.allclose(now[24:], -old[c][24:], atol=1e-6)
    assert engine.coverage_note() is None and engine.sync_all().embedded_by_model == {}
    reopened = _engine(mixed_vault, data, MultiEmbedder([Recorder(24, USE), Revised(16, MINILM, 1)]))
    assert reopened.sync_all().embedded_by_model == {}  # the revisions are in the index's files


def test_a_new_revision_of_the_first_model_re_embeds_its_part_of_every_row_only(mixed_vault, tmp_path):
    """The multilingual model's int8 graph (kb_use) moves its vectors, part 0 of every row, and no other model's."""
    data = tmp_path / "data"
    first = _engine(mixed_vault, data, MultiEmbedder([Revised(24, USE, 0), Recorder(16, MINILM)]))
    first.sync_all()
    old = {c: first.store.vector(c).copy() for c in {c.content for c in first.chunks.values()}}
    use, minilm = Revised(24, USE, 1), Recorder(16, MINILM)
    engine = _engine(mixed_vault, data, MultiEmbedder([use, minilm]))
    engine.sync_all()
    assert minilm.texts == [] and len(use.texts) == len(set(use.texts)) == len(old)  # each content once
    for c, vector in old.items():
        now = engine.store.vector(c)
        assert np.allclose(now[:24], -vector[:24], atol=1e-6) and np.array_equal(now[24:], vector[24:])
    reopened = _engine(mixed_vault, data, MultiEmbedder([Revised(24, USE, 1), Recorder(16, MINILM)]))
    assert reopened.sync_all().embedded_by_model == {}
