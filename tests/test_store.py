"""kb_store: vector segments round-trip, exact nearest search, compaction and the errors a reader can meet."""

from __future__ import annotations

import numpy as np
import pytest

import kb_store
from kb_config import IndexFormatError
from kb_store import VectorStore, pack_revisions


def _unit(*xs: float) -> list[float]:
    v = np.asarray(xs, dtype=float)
    return (v / np.linalg.norm(v)).tolist()


def test_segments_written_by_one_store_are_read_by_another(tmp_path):
    writer = VectorStore(tmp_path)
    segments = writer.write_segment({"a": _unit(1, 0, 0), "b": _unit(0, 1, 0)})
    reader = VectorStore(tmp_path)

    reader.load(segments)

    assert len(reader) == 2 and "a" in reader and reader.dim == 3
    assert reader.nearest(_unit(1, 0.1, 0), 1)[0][0] == "a"
    assert reader.cosines(_unit(0, 1, 0), ["a", "b", "zzz"]) == pytest.approx({"a": 0.0, "b": 1.0})


def test_write_segment_skips_vectors_already_stored(tmp_path):
    store = VectorStore(tmp_path)
    store.load(store.write_segment({"a": _unit(1, 0)}))

    assert store.write_segment({"a": _unit(1, 0)}) == store.segments
    assert store.missing(["a", "b", "b"]) == ["b"]


def test_nearest_returns_best_first_and_at_most_n(tmp_path):
    store = VectorStore(tmp_path)
    store.load(store.write_segment({k: _unit(1, i) for i, k in enumerate("abcde")}))

    found = store.nearest(_unit(1, 0), 3)

    assert [k for k, _ in found] == ["a", "b", "c"]
    assert store.nearest(_unit(1, 0), 50) and len(store.nearest(_unit(1, 0), 50)) == 5


def test_compaction_keeps_only_live_vectors_and_old_files_can_be_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(kb_store, "COMPACT_MIN_DEAD", 1)
    store = VectorStore(tmp_path)
    store.load(store.write_segment({"a": _unit(1, 0), "b": _unit(0, 1)}))
    store.load(store.write_segment({"c": _unit(1, 1)}))

    compacted = store.compacted({"a", "c"})
    assert compacted is not None and len(compacted) == 1
    store.remove_unlisted(compacted)
    store.load(compacted)

    assert sorted(p.name for p in (tmp_path / "vectors").iterdir()) == list(compacted)
    assert "b" not in store and "a" in store and "c" in store


def test_a_compaction_streams_its_segment_into_the_file_without_a_second_copy(tmp_path, monkeypatch):
    """The merged segment goes to its file in pieces: a whole copy in memory first held the vectors twice, on top of
    the segments they replace (the end of a tldr ingest's peak)."""
    import tracemalloc

    monkeypatch.setattr(kb_store, "MAX_SEGMENTS", 1)
    rng = np.random.default_rng(7)
    halves = [rng.standard_normal((6_000, 896)).astype(np.float32) for _ in range(2)]  # 2 x 20.5 MB
    store = VectorStore(tmp_path)
    for h, half in enumerate(halves):
        store.load(store.write_segment({f"{h}-{i}": row for i, row in enumerate(half)}))
    tracemalloc.start()
    try:
        compacted = store.compacted({f"{h}-{i}" for h in range(2) for i in range(6_000)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    merged = sum(half.nbytes for half in halves)
    assert compacted is not None and peak < 1.8 * merged, (peak, merged)  # the merged rows once, and 16 MB pieces
    reader = VectorStore(tmp_path)
    reader.load(compacted)
    assert np.array_equal(reader.vector("1-5999"), halves[1][-1])


def test_compaction_is_skipped_when_little_is_dead(tmp_path):
    store = VectorStore(tmp_path)
    store.load(store.write_segment({"a": _unit(1, 0), "b": _unit(0, 1)}))

    assert store.compacted({"a"}) is None


def test_load_raises_file_not_found_when_a_named_segment_is_gone(tmp_path):
    writer = VectorStore(tmp_path)
    segments = writer.write_segment({"a": _unit(1, 0)})
    writer.remove_unlisted(())

    with pytest.raises(FileNotFoundError):
        VectorStore(tmp_path).load(segments)


def test_load_rejects_a_torn_segment_with_the_next_step(tmp_path):
    segments = VectorStore(tmp_path).write_segment({"a": _unit(1, 0)})
    (tmp_path / "vectors" / segments[0]).write_bytes(b"not a zip")

    with pytest.raises(IndexFormatError, match="--rebuild"):
        VectorStore(tmp_path).load(segments)


def test_query_of_another_models_size_is_refused_with_the_next_step(tmp_path):
    store = VectorStore(tmp_path)
    store.load(store.write_segment({"a": _unit(1, 0, 0)}))

    with pytest.raises(IndexFormatError, match="another embedding model"):
        store.nearest(_unit(1, 0), 1)
    with pytest.raises(IndexFormatError, match="another embedding model"):
        store.cosines(_unit(1, 0), ["a"])


def test_nearest_many_gives_each_query_what_nearest_gives_it(tmp_path):
    rng = np.random.default_rng(7)
    store = VectorStore(tmp_path)
    vectors = rng.standard_normal((60, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.load(store.write_segment({f"c{i}": v.tolist() for i, v in enumerate(vectors)}))
    queries = [vectors[3].tolist(), (vectors[40] * 0.6 + vectors[41] * 0.4).tolist(), rng.standard_normal(8).tolist()]
    ns = [5, 12, 0]
    many = store.nearest_many(queries, ns)
    for q, n, got in zip(queries, ns, many):
        alone = store.nearest(q, n)
        assert [c for c, _ in got] == [c for c, _ in alone] and len(got) == n
        assert [s for _, s in got] == pytest.approx([s for _, s in alone], abs=1e-6)
    assert many[0][0][0] == "c3"


@pytest.mark.parametrize("sizes", [(10,), (7, 9), (5, 5), (4, 1, 6, 3), (1, 12)])
def test_a_large_scan_split_over_two_threads_scores_every_row_in_order(sizes, monkeypatch):
    """kb_store._scan cuts the rows at the middle (inside a block, or at a block's edge) and runs the halves side by
    side: the same dot products, in the rows' order, as one product per block."""
    monkeypatch.setattr(kb_store, "SPLIT_SCAN_ROWS", 2)
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal((n, 6)).astype(np.float32) for n in sizes]
    q = rng.standard_normal((6, 3)).astype(np.float32)
    got = kb_store._scan(blocks, q)
    assert got.shape == (sum(sizes), 3)
    assert np.allclose(got, np.concatenate(blocks) @ q, atol=1e-5)


@pytest.mark.parametrize("runtime", [True, False], ids=["onnxruntime", "without"])
def test_a_scan_of_several_query_vectors_runs_in_onnxruntime_where_installed(runtime, monkeypatch):
    """Several columns go through onnxruntime's MatMul (OpenBLAS ran them at half its speed), one column through
    numpy's matrix-vector product; without onnxruntime every product is numpy's. The same dot products either way."""
    from kb_kernels import matmul_session

    runs = []

    class Recorder:
        def run(self, names, feeds):
            runs.append(feeds["b"].shape[1])
            return matmul_session().run(names, feeds)

    monkeypatch.setattr(kb_store, "matmul_session", (lambda: Recorder()) if runtime else (lambda: None))
    rng = np.random.default_rng(5)
    block = rng.standard_normal((300, 16)).astype(np.float32)
    for columns in (1, 2, 10):
        q = rng.standard_normal((16, columns)).astype(np.float32)
        assert np.allclose(kb_store._product(block, q), block @ q, atol=1e-5)
    assert runs == ([2, 10] if runtime else [])


def _held_by_store() -> int:
    """Bytes traced now whose allocation ran through kb_store: what the store holds, whatever other threads of the
    process (pytest-xdist's, a previous test's) allocate meanwhile (two memory tests failed once under xdist)."""
    import tracemalloc

    traces = tracemalloc.take_snapshot().traces
    # Arrays only (64 KiB or more): Snapshot.filter_traces over every small object took seconds.
    return sum(t.size for t in traces if t.size >= 1 << 16 and any(f.filename == kb_store.__file__ for f in t.traceback))


def test_loaded_vectors_are_held_once_however_many_segments(tmp_path):
    """The matrix a search scans is the only copy of the vectors: each segment's own array used to stay beside it
    (56 MB more in a server on the tldr vault)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    rows_a, rows_b = (rng.random((2000, 512), dtype=np.float32) for _ in range(2))
    one_segment = rows_a.nbytes
    tracemalloc.start(8)
    try:
        # A store that writes a segment, then grows by a second one (a server's edits): the old arrays are freed.
        writer = VectorStore(tmp_path)
        first = writer.write_segment({f"a{i}": v for i, v in enumerate(rows_a)})
        writer.load(first)
        both = writer.write_segment({f"b{i}": v for i, v in enumerate(rows_b)})
        writer.load(both)
        grown = _held_by_store()
        # A store that reads one or two segments another process wrote.
        held = []
        for names in (first, both):
            before = _held_by_store()
            reader = VectorStore(tmp_path)
            reader.load(names)
            held.append(_held_by_store() - before)
            del reader
    finally:
        tracemalloc.stop()
    assert 2 * one_segment <= grown < 1.3 * 2 * one_segment, grown / one_segment  # (at least: the filter sees them)
    assert one_segment <= held[0] < 1.3 * one_segment and held[1] < 1.3 * 2 * one_segment, [h / one_segment for h in held]
    assert len(writer) == 4000 and writer.nearest(writer.vector("b7").tolist(), 1)[0][0] == "b7"


def test_a_commits_new_segment_is_loaded_without_copying_the_vectors_already_held(tmp_path):
    """A server's edit adds a small segment: adopting it must not copy every vector held (concatenating them into
    one matrix did, +64 MB at tldr on every commit: the server's memory peak), and searches see both segments."""
    import tracemalloc

    rng = np.random.default_rng(1)
    big, small = rng.random((4000, 256), dtype=np.float32), rng.random((3, 256), dtype=np.float32)
    store = VectorStore(tmp_path)
    tracemalloc.start(8)
    try:
        first = store.write_segment({f"a{i}": v for i, v in enumerate(big)})
        store.load(first)
        both = store.write_segment({f"b{i}": v for i, v in enumerate(small)})
        before = _held_by_store()
        store.load(both)
        added = _held_by_store() - before
    finally:
        tracemalloc.stop()
    assert before > big.nbytes and added < 0.1 * big.nbytes, (before / big.nbytes, added / big.nbytes)
    query = small[1] / np.linalg.norm(small[1])
    assert store.nearest(query.tolist(), 1)[0][0] == "b1"
    assert store.cosines(query.tolist(), ["b1", "a7"])["b1"] == pytest.approx(float(small[1] @ query), abs=1e-6)
    assert np.array_equal(store.vector("a7"), big[7]) and np.array_equal(store.vector("b2"), small[2])


def _random_unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    v = rng.standard_normal(dim)
    return v / np.linalg.norm(v)


def test_a_vector_of_another_revision_counts_as_missing_and_is_replaced_in_place(tmp_path, monkeypatch):
    """The bundled MiniLM's int8 kernel after its float one (revision 1, then 2): every row keeps answering with its
    old vector until its new one is written; the other model's vector is kept as it was."""
    rng = np.random.default_rng(0)
    dims = (3, 2)
    store = VectorStore(tmp_path)
    store.load(store.write_part(0, dims, {"a": _random_unit(rng, 3), "b": _random_unit(rng, 3)}))
    store.load(store.write_part(1, dims, {"a": _random_unit(rng, 2), "b": _random_unit(rng, 2)}))  # revision 0
    before = {k: store.vector(k).copy() for k in "ab"}
    one, two = pack_revisions([0, 1]), pack_revisions([0, 2])

    assert store.missing("ab", 1) == [] and store.missing("ab", 1, revs=one) == ["a", "b"]
    assert store.missing("ab", 0, revs=one) == []  # model 0 made none at revision 1: its vectors stand
    new_b = _random_unit(rng, 2)
    store.load(store.write_part(1, dims, {"b": new_b}, revs=one))
    assert store.missing("ab", 1, revs=one) == ["a"]
    assert np.allclose(store.vector("b")[3:], new_b) and np.allclose(store.vector("b")[:3], before["b"][:3])
    assert np.array_equal(store.vector("a"), before["a"])  # still answering with its revision-0 vector
    assert store.write_part(1, dims, {"b": _random_unit(rng, 2)}, revs=one) == store.segments  # held at this revision

    again = VectorStore(tmp_path)  # the revisions are in the files
    again.load(store.segments)
    assert again.missing("ab", 1, revs=one) == ["a"]
    monkeypatch.setattr(kb_store, "MAX_SEGMENTS", 0)
    merged = again.compacted({"a", "b"})  # a merge into one segment keeps each row's revisions
    assert merged is not None and len(merged) == 1
    again.load(merged)
    assert again.missing("ab", 1, revs=one) == ["a"]
    assert again.missing("ab", 1, revs=two) == ["a", "b"]  # a newer kernel: every vector moves once more
    again.load(again.write_part(1, dims, {"a": _random_unit(rng, 2)}, revs=two))
    assert again.missing("ab", 1, revs=two) == ["b"] and again.missing("ab", 0, revs=two) == []
    again.load(again.without_part(1, dims, ["b"]))  # a model that no longer embeds a text drops its revision too
    assert again.missing(["b"], 1) == ["b"] and again.missing(["b"], 0, revs=0) == []


def test_revisions_written_a_bit_a_model_read_as_revision_1(tmp_path):
    """Segments from before REVISION_BITS kept bit i for model i's revision 1: they read as that, so an index made by
    the first int8 kernels moves to the next once, and not again."""
    store = VectorStore(tmp_path)
    name = "seg-0000000000000001.npz"
    store.folder.mkdir(parents=True)
    np.savez(
        store.folder / name,
        keys=np.asarray(["a", "b"]),
        vectors=np.eye(2, dtype=np.float32),
        revs=np.asarray([0b11, 0b10], np.uint8),
    )
    store.load((name,))
    assert store.missing("ab", revs=pack_revisions([1, 1])) == ["b"]
    assert store.missing("ab", 1, revs=pack_revisions([0, 1])) == []
    assert store.missing("ab", 1, revs=pack_revisions([0, 2])) == ["a", "b"]
    with pytest.raises(ValueError, match="below 4"):
        pack_revisions([4])


def test_whole_rows_of_another_revision_are_missing_and_rewritten(tmp_path):
    store = VectorStore(tmp_path)
    store.load(store.write_segment({"a": [1.0, 0.0], "b": [0.0, 1.0]}))
    assert store.missing("ab", revs=1) == ["a", "b"] and store.missing("ab") == []
    store.load(store.write_segment({"a": [0.6, 0.8]}, revs=1))
    assert store.missing("ab", revs=1) == ["b"]
    assert np.allclose(store.vector("a"), [0.6, 0.8])
    assert store.write_segment({"a": [0.6, 0.8]}, revs=1) == store.segments
