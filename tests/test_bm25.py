"""bm25_index: score parity with rank_bm25, incremental edits, search and persistence."""

from __future__ import annotations

import gzip
import math
import os
import pickle
import random
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

import bm25_index
import kb_files
from bm25_index import BM25Index, load_index, save_index
from kb_config import IndexFormatError

# Few distinct terms, so several occur in more than half the documents and hit rank_bm25's epsilon floor.
VOCAB = ["redis", "cache", "jieba", "库存", "同步", "backup", "timer", "note"]
SEEDS = [1, 2, 3, 7, 42]


def _corpus(seed: int, n_docs: int = 40) -> dict[str, list[str]]:
    rng = random.Random(seed)
    weights = [8, 6, 4, 3, 2, 2, 1, 1]
    return {f"c{i}": ["note"] + rng.choices(VOCAB, weights, k=rng.randint(1, 15)) for i in range(n_docs)}


def _queries(seed: int) -> list[list[str]]:
    rng = random.Random(seed + 1000)
    queries = [[t] for t in VOCAB] + [["unknown"], ["unknown", "redis"], ["redis", "redis", "cache"], ["note", "note"]]
    queries += [rng.choices(VOCAB + ["zzz"], k=rng.randint(1, 6)) for _ in range(10)]
    return queries


def build_index(docs: Iterable[tuple[str, list[str]]]) -> BM25Index:
    index = BM25Index()
    for cid, tokens in docs:
        index.add(cid, tokens)
    return index


def _scores(index: BM25Index, query: list[str], ids: list[str]) -> np.ndarray:
    """Every chunk's score through the public search (a chunk holding no query term scores 0, as in rank_bm25)."""
    found = dict(index.search(query, len(ids) + 1))
    return np.array([found.get(c, 0.0) for c in ids])


def _assert_parity(index: BM25Index, docs: dict[str, list[str]], queries: list[list[str]]) -> None:
    ids = list(docs)
    reference = BM25Okapi([docs[c] for c in ids])
    for q in queries:
        np.testing.assert_allclose(_scores(index, q, ids), reference.get_scores(q), rtol=1e-9, atol=1e-12, err_msg=str(q))


def _has_negative_idf_term(docs: dict[str, list[str]]) -> bool:
    n = len(docs)
    df = {t: sum(t in toks for toks in docs.values()) for t in VOCAB}
    return any(math.log(n - d + 0.5) - math.log(d + 0.5) < 0 for d in df.values() if d)


# ---- parity with rank_bm25 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_scores_match_rank_bm25_on_random_corpora(seed: int) -> None:
    docs = _corpus(seed)
    assert _has_negative_idf_term(docs)  # the epsilon floor is exercised

    _assert_parity(build_index(docs.items()), docs, _queries(seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_scores_match_rank_bm25_after_removes_and_re_adds(seed: int) -> None:
    docs = _corpus(seed)
    index = build_index(docs.items())
    rng = random.Random(seed)
    for cid in rng.sample(list(docs), 15):
        assert index.remove(cid)
        del docs[cid]
    for i, cid in enumerate(rng.sample(list(docs), 5)):  # re-add an existing id with new tokens
        docs[cid] = rng.choices(VOCAB, k=i + 2)
        index.add(cid, docs[cid])
    for i in range(5):
        docs[f"new{i}"] = rng.choices(VOCAB[:3], k=4)
        index.add(f"new{i}", docs[f"new{i}"])

    assert len(index) == len(docs)
    _assert_parity(index, docs, _queries(seed))
    index.compact()
    assert len(index) == len(docs)
    _assert_parity(index, docs, _queries(seed))


def test_scores_match_rank_bm25_after_automatic_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm25_index, "COMPACT_MIN_DEAD", 2)
    docs = _corpus(5)
    index = build_index(docs.items())
    for cid in list(docs)[:20]:
        index.remove(cid)
        del docs[cid]

    assert len(index._slot_ids) < 40  # dead slots were dropped along the way
    _assert_parity(index, docs, _queries(5))


def test_remove_returns_false_for_an_unknown_id() -> None:
    index = build_index([("a", ["redis"])])

    assert index.remove("missing") is False
    assert index.remove("a") is True
    assert index.remove("a") is False
    assert len(index) == 0 and "a" not in index


def test_compact_drops_terms_no_live_chunk_uses() -> None:
    index = build_index([("a", ["redis", "cache"]), ("b", ["cache"]), ("c", ["note"]), ("d", ["note"])])
    index.remove("a")

    index.compact()

    assert "redis" not in index._term_ids
    assert index.search(["redis"], k=5) == []
    assert [cid for cid, _ in index.search(["cache"], k=5)] == ["b"]


# ---- search ------------------------------------------------------------------------------------------------


SMALL_DOCS = {
    "a": ["redis", "cache", "redis"],
    "b": ["redis", "backup", "timer", "note"],
    "c": ["jieba", "库存", "同步"],
    "d": ["cache", "note", "note", "note"],
    "e": ["timer"],
}


@pytest.fixture
def small_index() -> BM25Index:
    return build_index(SMALL_DOCS.items())


@pytest.mark.parametrize("k", [1, 2, 3, 5, 50])
def test_search_returns_top_k_best_first(small_index: BM25Index, k: int) -> None:
    query = ["redis", "cache", "timer"]
    ids = ["a", "b", "c", "d", "e"]
    scores = dict(zip(ids, BM25Okapi([SMALL_DOCS[c] for c in ids]).get_scores(query)))
    expected = sorted((c for c in ids if scores[c] > 0), key=lambda c: -scores[c])[:k]

    hits = small_index.search(query, k=k)

    assert [cid for cid, _ in hits] == expected
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert all(s == pytest.approx(scores[c]) for c, s in hits)


def test_search_returns_every_match_when_k_exceeds_the_corpus(small_index: BM25Index) -> None:
    hits = small_index.search(["note"], k=100)

    assert sorted(cid for cid, _ in hits) == ["b", "d"]


@pytest.mark.parametrize("query", [[], ["unknown"], ["zzz", "qqq"]])
def test_search_returns_nothing_for_an_empty_or_unknown_query(small_index: BM25Index, query: list[str]) -> None:
    assert small_index.search(query, k=5) == []


def test_search_returns_nothing_on_an_empty_index() -> None:
    assert BM25Index().search(["redis"], k=5) == []


def test_search_applies_the_accept_filter_before_taking_k(small_index: BM25Index) -> None:
    unfiltered = [cid for cid, _ in small_index.search(["redis", "cache", "timer"], k=5)]

    hits = small_index.search(["redis", "cache", "timer"], k=2, accept=lambda cid: cid != unfiltered[0])

    assert [cid for cid, _ in hits] == unfiltered[1:3]


def test_search_never_returns_a_removed_chunk(small_index: BM25Index) -> None:
    small_index.remove("a")

    assert "a" not in [cid for cid, _ in small_index.search(["redis", "cache"], k=10)]


# ---- persistence -------------------------------------------------------------------------------------------


def test_save_and_load_round_trip_gives_identical_scores(tmp_path: Path) -> None:
    docs = _corpus(3)
    index = build_index(docs.items())
    index.remove("c0")
    del docs["c0"]
    meta = {"tokenizer": "tok3-jieba-x", "user_terms": ["米哈游"]}
    path = tmp_path / "idx" / "bm25.pkl.gz"

    save_index(index, path, meta)
    loaded, loaded_meta = load_index(path)

    assert loaded_meta == meta
    assert len(loaded) == len(index)
    for q in _queries(3):
        assert np.array_equal(_scores(loaded, q, list(docs)), _scores(index, q, list(docs)))
    assert loaded.search(["redis", "cache"], k=5) == index.search(["redis", "cache"], k=5)


def test_save_index_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "bm25.pkl.gz"

    save_index(build_index([("a", ["x"])]), path, {})
    save_index(build_index([("b", ["y"])]), path, {})

    assert os.listdir(tmp_path) == ["bm25.pkl.gz"]


@pytest.mark.parametrize("failing", ["pickle.dump", "os.replace", "gzip"])
def test_save_index_keeps_the_previous_file_loadable_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "bm25.pkl.gz"
    save_index(build_index([("old", ["x"])]), path, {"generation": 1})

    def boom(*args: object, **kwargs: object) -> None:
        if failing == "pickle.dump":
            args[1].write(b"half a pickle")  # type: ignore[attr-defined]  # the stream is cut mid-way
        raise OSError("disk full")

    owner, attr = {
        "pickle.dump": (bm25_index.pickle, "dump"),  # fails mid-stream: the temp file is partly written
        "os.replace": (kb_files.os, "replace"),
        "gzip": (bm25_index.gzip, "GzipFile"),
    }[failing]
    monkeypatch.setattr(owner, attr, boom)
    with pytest.raises(OSError, match="disk full"):
        save_index(build_index([("new", ["y"])]), path, {"generation": 2})
    monkeypatch.undo()

    index, meta = load_index(path)
    assert meta == {"generation": 1} and "old" in index and "new" not in index
    assert os.listdir(tmp_path) == ["bm25.pkl.gz"]


def _gzip_pickle(path: Path, obj: object) -> None:
    path.write_bytes(gzip.compress(pickle.dumps(obj)))


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("garbage", lambda p: p.write_bytes(b"not a gzip file at all")),
        ("empty", lambda p: p.write_bytes(b"")),
        ("gzip-not-pickle", lambda p: p.write_bytes(gzip.compress(b"plain text"))),
        ("list", lambda p: _gzip_pickle(p, [1, 2, 3])),
        ("old-format", lambda p: _gzip_pickle(p, {"format": 1, "index": BM25Index(), "meta": {}})),
        ("no-index", lambda p: _gzip_pickle(p, {"format": bm25_index.FORMAT_VERSION, "index": {"a": 1}})),
    ],
)
def test_load_index_rejects_a_corrupt_or_foreign_file(tmp_path: Path, name: str, write) -> None:
    path = tmp_path / f"{name}.pkl.gz"
    write(path)

    with pytest.raises(IndexFormatError) as info:
        load_index(path)

    assert str(path) in str(info.value) and "rebuilt" in str(info.value)


def test_load_index_rejects_a_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "bm25.pkl.gz"
    save_index(build_index(_corpus(1).items()), path, {})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    with pytest.raises(IndexFormatError, match="unreadable"):
        load_index(path)


def test_load_index_raises_file_not_found_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_index(tmp_path / "absent.pkl.gz")
