"""BM25 (Okapi, rank-bm25's formula and defaults) as an incremental inverted index, persisted as a gzip pickle.

Query cost follows the postings of the query terms, not the corpus size. Imports: kb_config, kb_files.
"""

from __future__ import annotations

import gzip
import math
import pickle
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from kb_config import IndexFormatError
from kb_files import atomic_write_with

# rank_bm25.BM25Okapi defaults, kept for score parity.
K1, B, EPSILON = 1.5, 0.75, 0.25
# Bump when the pickled layout changes; an older file is rebuilt, never mis-read.
FORMAT_VERSION = 2
# Compact postings once dead slots (removed chunks) exceed this share of all slots...
COMPACT_DEAD_SHARE = 0.3
# ...and this many, so small indexes are not compacted on every edit.
COMPACT_MIN_DEAD = 2000
# gzip level for the saved index: 1 is ~4x faster than 9 and only ~15% larger here.
GZIP_LEVEL = 1


class BM25Index:
    """Inverted BM25 index over chunk ids; add/remove are incremental, scores match rank_bm25.BM25Okapi.

    Example:
        idx = BM25Index(); idx.add("c1", ["redis", "cache"]); idx.search(["redis"], k=5) -> [("c1", 0.28)]
    """

    def __init__(self) -> None:
        self._term_ids: dict[str, int] = {}
        self._df = array("i")
        self._post_slots: list[array] = []
        self._post_tfs: list[array] = []
        self._slot_ids: list[str | None] = []  # slot -> chunk id, None once removed
        self._slot_terms: list[array | None] = []  # slot -> its unique term ids (to undo df on removal)
        self._slot_len = array("i")
        self._alive = bytearray()
        self._slot_of: dict[str, int] = {}
        self._total_len = 0
        self._idf_cache: tuple[int, np.ndarray] | None = None
        self._version = 0

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self._slot_of

    def add(self, chunk_id: str, tokens: list[str]) -> None:
        """Index a chunk's tokens, replacing any earlier version of the same id."""
        if chunk_id in self._slot_of:
            self.remove(chunk_id)
        slot = len(self._slot_ids)
        counts = Counter(tokens)
        term_list = array("i")
        for term, tf in counts.items():
            tid = self._term_ids.get(term)
            if tid is None:
                tid = len(self._df)
                self._term_ids[term] = tid
                self._df.append(0)
                self._post_slots.append(array("i"))
                self._post_tfs.append(array("i"))
            self._df[tid] += 1
            self._post_slots[tid].append(slot)
            self._post_tfs[tid].append(tf)
            term_list.append(tid)
        self._slot_ids.append(chunk_id)
        self._slot_terms.append(term_list)
        self._slot_len.append(len(tokens))
        self._alive.append(1)
        self._slot_of[chunk_id] = slot
        self._total_len += len(tokens)
        self._version += 1

    def remove(self, chunk_id: str) -> bool:
        """Forget a chunk; returns False if it was not indexed. Postings are compacted lazily."""
        slot = self._slot_of.pop(chunk_id, None)
        if slot is None:
            return False
        for tid in self._slot_terms[slot] or ():
            self._df[tid] -= 1
        self._total_len -= self._slot_len[slot]
        self._slot_ids[slot] = None
        self._slot_terms[slot] = None
        self._slot_len[slot] = 0
        self._alive[slot] = 0
        self._version += 1
        dead = len(self._slot_ids) - len(self._slot_of)
        if dead >= COMPACT_MIN_DEAD and dead > COMPACT_DEAD_SHARE * len(self._slot_ids):
            self.compact()
        return True

    def compact(self) -> None:
        """Renumber live slots and drop dead postings and unused terms."""
        live = [s for s, cid in enumerate(self._slot_ids) if cid is not None]
        new_slot = {old: new for new, old in enumerate(live)}
        old_terms = {tid: term for term, tid in self._term_ids.items()}
        term_ids: dict[str, int] = {}
        df, post_slots, post_tfs = array("i"), [], []
        remap: dict[int, int] = {}
        for tid, slots in enumerate(self._post_slots):
            if self._df[tid] <= 0:
                continue
            keep = [(new_slot[s], tf) for s, tf in zip(slots, self._post_tfs[tid]) if s in new_slot]
            remap[tid] = len(df)
            term_ids[old_terms[tid]] = len(df)
            df.append(len(keep))
            post_slots.append(array("i", [s for s, _ in keep]))
            post_tfs.append(array("i", [tf for _, tf in keep]))
        self._term_ids, self._df, self._post_slots, self._post_tfs = term_ids, df, post_slots, post_tfs
        self._slot_ids = [self._slot_ids[s] for s in live]
        self._slot_terms = [array("i", (remap[t] for t in self._slot_terms[s])) for s in live]  # type: ignore[union-attr]
        self._slot_len = array("i", (self._slot_len[s] for s in live))
        self._alive = bytearray(b"\x01" * len(live))
        self._slot_of = {cid: i for i, cid in enumerate(self._slot_ids)}  # type: ignore[misc]
        self._version += 1

    def _idf(self) -> np.ndarray:
        """idf per term id, with rank_bm25's epsilon floor for negative values; cached per index version."""
        if self._idf_cache and self._idf_cache[0] == self._version:
            return self._idf_cache[1]
        n = len(self._slot_of)
        df = np.frombuffer(self._df, dtype=np.int32).astype(np.float64) if len(self._df) else np.zeros(0)
        idf = np.log(n - df + 0.5) - np.log(df + 0.5) if n else np.zeros_like(df)
        present = df > 0
        if present.any():
            average = idf[present].mean()
            idf = np.where(idf < 0, EPSILON * average, idf)
        idf[~present] = 0.0
        self._idf_cache = (self._version, idf)
        return idf

    def _score_slots(self, tokens: Iterable[str], matched: np.ndarray | None = None) -> np.ndarray:
        """Scores per slot; marks in `matched` the slots holding at least one query term."""
        scores = np.zeros(len(self._slot_ids))
        n = len(self._slot_of)
        if not n:
            return scores
        idf = self._idf()
        avgdl = self._total_len / n
        lengths = np.frombuffer(self._slot_len, dtype=np.int32)
        for term in tokens:  # repeated query terms count again, as in rank_bm25
            tid = self._term_ids.get(term)
            if tid is None or self._df[tid] <= 0:
                continue
            slots = np.frombuffer(self._post_slots[tid], dtype=np.int32)
            tf = np.frombuffer(self._post_tfs[tid], dtype=np.int32).astype(np.float64)
            norm = K1 * (1 - B + B * lengths[slots] / avgdl) if avgdl else K1
            scores[slots] += idf[tid] * tf * (K1 + 1) / (tf + norm)
            if matched is not None:
                matched[slots] = True
        return scores

    def search(self, tokens: list[str], k: int, accept: Callable[[str], bool] | None = None) -> list[tuple[str, float]]:
        """The k best (chunk id, score) among chunks holding a query term, best first; `accept` filters chunk ids.

        Scores can be <= 0 in tiny corpora (rank_bm25's idf floor); a chunk that matches still counts.
        """
        if not tokens or not self._slot_of:
            return []
        matched = np.zeros(len(self._slot_ids), dtype=bool)
        scores = self._score_slots(tokens, matched)
        alive = np.frombuffer(self._alive, dtype=np.uint8)
        hits = np.flatnonzero(matched & (alive == 1))
        if not len(hits):
            return []
        if accept is None and len(hits) > k:
            hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
        order = hits[np.argsort(-scores[hits], kind="stable")]
        out: list[tuple[str, float]] = []
        for slot in order:
            cid = self._slot_ids[slot]
            if cid is not None and (accept is None or accept(cid)):
                out.append((cid, float(scores[slot])))
                if len(out) >= k:
                    break
        return out

    def term_idf(self, tokens: Iterable[str]) -> dict[str, float]:
        """A weight per distinct token for how much of a query a chunk holds: Lucene's idf, ln(1 + (N - df + 0.5) /
        (df + 0.5)), highest for a token absent from the index.

        Always positive, unlike the scores' idf (rank_bm25's is 0 for a word in half the chunks and floored below):
        in a vault of two notes every word weighed 0, so a note holding every word of the query held "none" of it,
        and a keyword search answered nothing relevant. On the dev sets the gate decides exactly as before.
        """
        n = len(self._slot_of)
        out: dict[str, float] = {}
        for t in tokens:
            tid = self._term_ids.get(t)
            df = self._df[tid] if tid is not None else 0
            out[t] = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        return out

    def terms_in(self, chunk_id: str, tokens: Iterable[str]) -> set[str]:
        """Which of `tokens` occur in the chunk."""
        slot = self._slot_of.get(chunk_id)
        if slot is None:
            return set()
        have = set(self._slot_terms[slot] or ())
        return {t for t in tokens if self._term_ids.get(t) in have}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_idf_cache"] = None
        return state


def save_index(index: BM25Index, path: Path, meta: dict[str, Any]) -> None:
    """Write index + meta as a gzip pickle atomically; a cache the next process can rebuild, so no fsync.

    Streamed through gzip into the file: the whole pickle (18 MB at 9,000 notes) and its compressed copy were held in
    memory at once, the server's highest memory peak."""
    state = {"format": FORMAT_VERSION, "index": index, "meta": meta}

    def write(f: BinaryIO) -> None:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as z:
            pickle.dump(state, z, protocol=pickle.HIGHEST_PROTOCOL)

    atomic_write_with(path, write, durable=False)


def load_index(path: Path) -> tuple[BM25Index, dict[str, Any]]:
    """Load an index written by save_index; raises IndexFormatError if unreadable or of another format.

    Only ever called on our own file in the configured data folder (it unpickles).
    """
    try:
        with gzip.open(path, "rb") as f:
            data = pickle.load(f)
    except FileNotFoundError:
        raise
    except Exception as e:  # a torn or foreign file: rebuild, never crash
        raise IndexFormatError(f"BM25 index {path} is unreadable ({type(e).__name__}: {e}); it will be rebuilt") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION or not isinstance(data.get("index"), BM25Index):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise IndexFormatError(f"BM25 index {path} has format {found}, expected {FORMAT_VERSION}; it will be rebuilt")
    return data["index"], data.get("meta", {})
