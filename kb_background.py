"""The vault's background: a fixed random sample of its chunk vectors, against which the relevance gate judges a
query's best cosine; and its notes as whole-note vectors, from which the translation step pairs a note with its
translation; and each chunk's language (mostly Chinese or not), remembered.

Reads the index through kb_view's queries only. Imports: kb_text, kb_vectors, kb_view.
"""

from __future__ import annotations

import logging
import math
import posixpath
import random
import re
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from kb_text import cjk_share
from kb_vectors import Embedder, model_slots
from kb_view import IndexView

logger = logging.getLogger(__name__)

# Chunks sampled (once per index size) as the background of the cosine gate; 256 let the decision depend on the seed.
BACKGROUND_SAMPLE = 2048
# Seed of that sample, so a search's decision does not change between runs.
BACKGROUND_SEED = 13
# The sample is drawn again once the number of chunks moved by more than this share (not on every edit).
BACKGROUND_REFRESH_SHARE = 0.1
# The query's nearest chunks left out of its background (they are what is being judged).
NEAREST_EXCLUDED = 10
# Fewer background chunks than this (a vault of a few notes) cannot calibrate: the cosine gate stays open.
MIN_BACKGROUND = 20
# Cosine differences below this are float noise (a background of identical cosines has no spread).
COSINE_EPSILON = 1e-6
# Notes whose mean vectors are computed in one pass (bounds the pass's copy of their chunk vectors: ~8 MB at 512 floats).
NOTE_BLOCK = 2048
# Chunks whose language is remembered (cleared when full; ids are content-addressed, so never stale).
CJK_CACHE_CHUNKS = 500_000

# Language markers a translation's file name may carry beside its original's ("setup.zh.md", "setup_en.md").
_LANGUAGE_SUFFIX_RE = re.compile(r"[._\-](?:zh|cn|en|zh[_\-](?:cn|hans|hant|tw|hk))$", re.I)
# Folder names that hold one language's copy of a tree ("en/guide/setup.md" beside "zh/guide/setup.md").
LANGUAGE_FOLDERS = ("en", "zh", "cn", "zh-cn", "zh_cn", "zh-hans", "zh-hant", "zh-tw", "en-us", "en_us")

Ranked = list[tuple[str, float]]
# The background sample: chunk ids, their stored vectors (one row each) and each id's row.
Sample = tuple[list[str], np.ndarray, dict[str, int]]


def chance_z(pool: int) -> float:
    """Standard deviations above its mean that the best of `pool` unrelated chunks reaches by chance (a normal's
    1 - 1/pool quantile): 2.6 for 250 chunks, 3.8 for 15,000."""
    return NormalDist().inv_cdf(1.0 - 1.0 / pool) if pool > 1 else 0.0


@dataclass(frozen=True)
class _NoteMatrix:
    """Every note as one unit vector in one model's slots (the mean of its chunks' vectors), with its language; and
    the notes of each language apart (`by_language[cjk]`: their rows in order, and those rows' vectors), so a note's
    nearest note in the other language is one product with the other language's notes only. `nearest` remembers
    each note's answer for as long as this matrix stands."""

    paths: list[str]
    row: dict[str, int]
    matrix: np.ndarray
    cjk: np.ndarray
    by_language: dict[bool, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    nearest: dict[str, str | None] = field(default_factory=dict)


class Background:
    """One searcher's background sample of an index's chunks, its notes' vectors, and its chunks' languages (a chunk
    is Chinese when at least `cjk_threshold` of its text is)."""

    def __init__(self, view: IndexView, embedder: Embedder, cjk_threshold: float) -> None:
        self.view = view
        self.embedder = embedder
        self.cjk_threshold = cjk_threshold
        self._chunk_cjk: dict[str, bool] = {}
        self._sample: tuple[tuple[str, int], Sample | None] | None = None
        self._lock = threading.Lock()
        self._note_vectors: dict[str, tuple[tuple[str, ...], np.ndarray | None, bool]] = {}  # path -> (chunks, vector, cjk)
        self._notes: tuple[tuple[int, str], _NoteMatrix] | None = None  # (view version, model) -> matrix
        self._incomplete: set[str] = set()  # notes whose vector lacks some chunk's: computed again as vectors come
        self._held: tuple[np.ndarray | None, dict[tuple[int, int], np.ndarray]] = (None, {})  # sample, slots -> rows

    def is_cjk(self, chunk_id: str) -> bool:
        """Whether a chunk is mostly Chinese (remembered: a chunk id names its text); False once a sync removed it."""
        known = self._chunk_cjk.get(chunk_id)
        if known is None:
            chunk = self.view.chunk(chunk_id)
            if chunk is None:
                return False
            if len(self._chunk_cjk) > CJK_CACHE_CHUNKS:
                self._chunk_cjk.clear()
            known = self._chunk_cjk[chunk_id] = cjk_share(chunk.text) >= self.cjk_threshold
        return known

    def vectors(self) -> Sample | None:
        """Ids and stored vectors of a fixed random sample of the vault's chunks (drawn again when the model changes or
        the number of chunks, or of stored rows, moved by more than BACKGROUND_REFRESH_SHARE: a sample drawn during a
        first index, while most chunks lacked vectors, is drawn again as they arrive)."""
        view = self.view
        key = (self.embedder.name, view.chunk_count(), view.vector_rows())
        cached = self._sample
        if cached is not None and cached[0][0] == key[0]:
            if all(abs(new - old) <= BACKGROUND_REFRESH_SHARE * old for new, old in zip(key[1:], cached[0][1:])):
                return cached[1]
        ids = view.chunk_ids()
        with self._lock:
            sample = random.Random(BACKGROUND_SEED).sample(ids, min(BACKGROUND_SAMPLE, len(ids)))
            try:
                stored = view.vectors_of(sample)
            except Exception as e:  # no background this time: the cosine gate stays closed, keywords still count
                logger.warning("cannot read background vectors: %s", e)
                return None
            got = [cid for cid in sample if cid in stored]
            matrix = np.asarray([stored[cid] for cid in got], dtype=np.float32)
            background = (got, matrix, {cid: i for i, cid in enumerate(got)}) if got else None
            self._sample = (key, background)
            return background

    def z(self, vector: Sequence[float], scale: float, top_cosine: float, hits: Ranked) -> float | None:
        """How many standard deviations `top_cosine` stands above the query's cosines to the vault's background.

        The query's own nearest chunks (the first NEAREST_EXCLUDED of `hits`) are not background. A vault too small to
        leave MIN_BACKGROUND chunks cannot tell a match from noise: infinity (the cosine vouches). None when the
        background cannot be read.
        """
        background = self.vectors()
        if background is None or background[1].shape[1] != len(vector):
            return None
        ids, matrix, index = background
        query = np.asarray(vector, dtype=np.float32)
        keep = self._holding(matrix, query)
        keep[[i for cid, _ in hits[:NEAREST_EXCLUDED] if (i := index.get(cid)) is not None]] = False
        if int(keep.sum()) < MIN_BACKGROUND:
            return math.inf
        sims = (matrix @ query)[keep] * scale
        return (top_cosine - float(sims.mean())) / max(float(sims.std()), COSINE_EPSILON)

    def _holding(self, matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Which sample rows hold a vector of the query's model (a row may lack one: a first index under way, or an
        English-only model's skipped Chinese chunk, kb_store); a row without it is no background for that model."""
        used = np.flatnonzero(query)
        if not len(used):
            return np.ones(len(matrix), dtype=bool)
        if self._held[0] is not matrix:  # a new sample
            self._held = (matrix, {})
        key = (int(used[0]), int(used[-1]))
        cached = self._held[1].get(key)
        if cached is None:
            cached = self._held[1][key] = np.abs(matrix[:, key[0] : key[1] + 1]).max(axis=1) > 0
        return cached.copy()

    def translations(
        self, fused: Ranked, model: str, query_cjk: bool, head_notes: int, named: Collection[str] = ()
    ) -> tuple[Ranked, dict[str, str]]:
        """`fused` with each of the first `head_notes` notes' translation beside it (the one in the query's language
        first, unless only the other is `named`: it holds the identifier or is the [[link]] the query names), and the
        pairs found (each note of a pair -> the other). A translation the search did not find stands for itself with
        its passage nearest the found one. `model` is a multilingual model's name.

        Two notes are translations when each is the other's nearest note in the other language (whole notes: the mean
        of their chunks' vectors; two languages rarely chunk a text alike), they have the same headings at the same
        levels, and either the same file name (less a language marker) or at least two headings: a translation keeps
        its original's shape, and two short one-heading notes of a small vault are each other's nearest by default.
        Where a note's path with a language folder swapped (`en/…`, `zh/…`) names a note in the other language, that
        note is the one tested instead of the nearest.
        """
        notes = self._note_matrix(model)
        if notes is None or len(notes.paths) < 2:
            return fused, {}
        view = self.view
        path_of = view.paths_of(cid for cid, _ in fused)  # a sync may have removed some since the fusion
        head: dict[str, str] = {}  # note -> its first chunk in the results
        for cid, _ in fused:
            path = path_of.get(cid)
            if path is not None and path not in head and path in notes.row:
                head[path] = cid
                if len(head) >= head_notes:
                    break
        records = view.records(head)
        unmirrored = [p for p in head if _mirror(notes, p) is None]
        self._fill_nearest(notes, unmirrored)  # each note's nearest, then theirs: two products for all head notes
        self._fill_nearest(notes, [o for p in unmirrored if (o := notes.nearest[p]) is not None])
        pairs: dict[str, str] = {}
        chunk_of = dict(head)  # each paired note -> the chunk that stands for it (a translation brought in: its first)
        for path in head:
            if path in pairs:
                continue
            mirror = _mirror(notes, path)  # the same path in the other language's folder: that is its translation
            other = mirror or notes.nearest[path]
            if other is None or other in pairs or (mirror is None and notes.nearest[other] != path):
                continue
            a, b = records.get(path) or view.record(path), view.record(other)
            if a is None or b is None or not b.chunks or not _same_shape(path, a.headings, other, b.headings):
                continue
            pairs.update({path: other, other: path})
            if other not in chunk_of:  # one already among the first notes keeps its own chunk
                chunk_of[other] = self._aligned(chunk_of[path], b.chunks, model)
        if not pairs:
            return fused, {}
        # Each pair sits together where its first note was, the note in the query's language first.
        out: Ranked = []
        done: set[str] = set()
        for cid, score in fused:
            if cid in done:
                continue
            path = path_of.get(cid)
            partner = pairs.get(path) if path is not None and chunk_of.get(path) == cid else None
            pair = [(cid, score)] if partner is None else [(cid, score), (chunk_of[partner], score)]
            if partner is not None and _second_first(path, partner, bool(notes.cjk[notes.row[path]]) != query_cjk, named):
                pair.reverse()
            out.extend(p for p in pair if p[0] not in done)
            done.update(p[0] for p in pair)
        return out, pairs

    def _aligned(self, chunk_id: str, others: Sequence[str], model: str) -> str:
        """The chunk of `others` (a translation's chunks) nearest in `model`'s meaning to `chunk_id`: the passage that
        says what the found one says; the first when vectors are missing."""
        stored = self.view.vectors_of([chunk_id, *others])
        if chunk_id not in stored:
            return others[0]
        slots, _ = model_slots(self.embedder, model)
        v = stored[chunk_id][slots]
        held = [c for c in others if c in stored]
        return max(held, key=lambda c: float(stored[c][slots] @ v)) if held else others[0]

    def notes_for(self, model: str) -> int:
        """Build the notes' vectors in `model`'s slots now (the translation step's first use); returns how many."""
        notes = self._note_matrix(model)
        return len(notes.paths) if notes is not None else 0

    def _fill_nearest(self, notes: _NoteMatrix, paths: Sequence[str]) -> None:
        """Remember in `notes.nearest` each note's nearest note in the other language (whole-note cosine; None where
        there is none; the first of equals in the notes' order), for several notes in one product per language (one
        product per note, over tldr's 4,480 notes in the other language, cost 5.8 ms of a search with alternatives)."""
        todo = [p for p in dict.fromkeys(paths) if p not in notes.nearest]
        for cjk in (False, True):
            mine = [p for p in todo if bool(notes.cjk[notes.row[p]]) == cjk]
            if not mine:
                continue
            rows, vectors = notes.by_language.get(not cjk, (None, None))
            if rows is None:
                notes.nearest.update(dict.fromkeys(mine))
                continue
            best = np.argmax(vectors @ notes.matrix[[notes.row[p] for p in mine]].T, axis=0)  # the first of equals
            notes.nearest.update({p: notes.paths[int(rows[int(b)])] for p, b in zip(mine, best)})

    def _note_means(self, todo: list[str], records: dict[str, tuple[str, ...]], slots: slice) -> dict[str, np.ndarray]:
        """Each note's unit mean vector in `slots` (notes without a stored vector left out), NOTE_BLOCK notes per pass:
        one gather and one np.add.reduceat each, where a mean per note cost ~0.3 s at 9,000 notes before the first
        semantic answer."""
        out: dict[str, np.ndarray] = {}
        block: np.ndarray | None = None  # the new vectors in one allocation (thousands of small ones fragment the heap)
        for start in range(0, len(todo), NOTE_BLOCK):
            notes = todo[start : start + NOTE_BLOCK]
            stored = self.view.vectors_of([c for p in notes for c in records[p]])
            rows: list[np.ndarray] = []
            counts: list[int] = []
            for p in notes:
                got = [v for c in records[p] if c in stored and (v := stored[c][slots]).any()]  # rows holding the model
                rows.extend(got)
                counts.append(len(got))
                if len(got) < len(records[p]):  # some chunk lacks the model's vector yet (a first index under way)
                    self._incomplete.add(p)
                else:
                    self._incomplete.discard(p)
            if not rows:
                continue
            held = [i for i, n in enumerate(counts) if n]
            starts = np.cumsum([0, *(counts[i] for i in held[:-1])])
            sums = np.add.reduceat(np.asarray(rows, dtype=np.float32), starts, axis=0)
            sums /= np.asarray([counts[i] for i in held], dtype=np.float32)[:, None]
            sums /= np.maximum(np.linalg.norm(sums, axis=1), COSINE_EPSILON)[:, None]
            if block is None:
                block = np.empty((len(todo), sums.shape[1]), dtype=np.float32)
            for row, i in zip(sums, held):
                block[start + i] = row
                out[notes[i]] = block[start + i]
        return out

    def _note_matrix(self, model: str) -> _NoteMatrix | None:
        """Every note's vector in `model`'s slots (rebuilt when the view or the vectors changed; a note whose chunks
        and vector are unchanged is reused)."""
        view = self.view
        key = (view.vectors_version(), model)  # a note or a vector changed since
        if self._notes is not None and self._notes[0] == key:
            return self._notes[1]
        records = view.notes_with_chunks()
        slots, _ = model_slots(self.embedder, model)
        cache = self._note_vectors
        todo = [
            p
            for p, chunks in records.items()
            if p not in cache or cache[p][0] != chunks or cache[p][1] is None or p in self._incomplete
        ]
        if todo:
            means = self._note_means(todo, records, slots)
            for p in todo:
                # the note's language: that of most of its chunks
                langs = [self.is_cjk(c) for c in view.chunks_by_id(records[p])]
                cache[p] = (records[p], means.get(p), 2 * sum(langs) > len(langs))
        for p in [p for p in cache if p not in records]:
            del cache[p]
        # One copy of the vectors: the notes grouped by language (each language's own order kept, for "the first of
        # equals"), so each language's rows are a slice of the matrix, and the cache keeps views of its rows.
        paths = sorted((p for p in records if p in cache and cache[p][1] is not None), key=lambda p: cache[p][2])
        if not paths:
            return None
        matrix = np.stack([cache[p][1] for p in paths])
        cjk = np.fromiter((cache[p][2] for p in paths), dtype=bool, count=len(paths))
        for i, p in enumerate(paths):
            cache[p] = (cache[p][0], matrix[i], cache[p][2])
        by_language = {}
        for lang in (False, True):
            rows = np.flatnonzero(cjk == lang)
            if len(rows):
                by_language[lang] = (rows, matrix[rows[0] : rows[-1] + 1])
        out = _NoteMatrix(paths, {p: i for i, p in enumerate(paths)}, matrix, cjk, by_language)
        self._notes = (key, out)
        return out


def _second_first(first: str, second: str, other_language: bool, named: Collection[str]) -> bool:
    """Whether a pair's second note goes first: the note the query names (its identifier, its [[link]]) before its
    translation, which holds neither; else the one in the query's language."""
    if (first in named) != (second in named):
        return second in named
    return other_language


def _mirror(notes: _NoteMatrix, path: str) -> str | None:
    """The note at `path` with one of its folders swapped for another language's (LANGUAGE_FOLDERS), when that note
    is in the other language: a tree kept in two languages. Its nearest note in the other language may be another
    (two chapters' summaries read alike: hello-algo's en/chapter_stack_and_queue/summary.md and
    zh/chapter_heap/summary.md were each other's nearest)."""
    parts = path.split("/")
    language = bool(notes.cjk[notes.row[path]])
    for i, folder in enumerate(parts[:-1]):
        if folder.casefold() not in LANGUAGE_FOLDERS:
            continue
        for marker in LANGUAGE_FOLDERS:
            other = "/".join([*parts[:i], marker, *parts[i + 1 :]])
            row = notes.row.get(other)
            if other != path and row is not None and bool(notes.cjk[row]) != language:
                return other
    return None


def _same_shape(a: str, heads_a: tuple[int, ...], b: str, heads_b: tuple[int, ...]) -> bool:
    """Whether two notes have a translation's shape: the same heading levels, and the same file name (less a language
    marker) or at least two headings."""
    if heads_a != heads_b:
        return False
    stem_a, stem_b = (_LANGUAGE_SUFFIX_RE.sub("", posixpath.splitext(posixpath.basename(p))[0]).casefold() for p in (a, b))
    return stem_a == stem_b or len(heads_a) >= 2
