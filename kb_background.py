"""The vault's background: a fixed random sample of its chunk vectors, against which the relevance gate judges a
query's best cosine, and the translation step judges two notes (how far a cosine stands above chance, in this vault).

Imports the engine and kb_vectors.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kb_engine import Engine
from kb_vectors import model_slots

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

# Translations (hybrid mode): a found note's passage in the other language (its translation, in a vault that keeps
# notes in both) follows it. A candidate counts as the translation when a multilingual model puts it this many standard
# deviations above the level the best of the vault's other-language chunks reaches by chance (as the relevance gate
# judges the query; a negative value or no multilingual model turns this off).
TRANSLATION_Z_MARGIN = 2.0
# Only the first this many notes of the results bring their translation.
TRANSLATION_HEAD_NOTES = 5
# Candidates: each semantic list's first this many chunks' notes, and the head notes' namesakes (same file name).
TRANSLATION_CANDIDATES = 10

Ranked = list[tuple[str, float]]


def chance_z(pool: int) -> float:
    """Standard deviations above its mean that the best of `pool` unrelated chunks reaches by chance (a normal's
    1 - 1/pool quantile): 2.6 for 250 chunks, 3.8 for 15,000."""
    return NormalDist().inv_cdf(1.0 - 1.0 / pool) if pool > 1 else 0.0


@dataclass(frozen=True)
class _ModelBackground:
    """The background sample as the translation step reads it: one model's slots of each vector, and each chunk's
    language and note (rows by note)."""

    matrix: np.ndarray
    known: np.ndarray  # chunks still in the index when this was built
    cjk: np.ndarray
    rows_of: dict[str, list[int]]


class Background:
    """One searcher's background sample of an engine's chunks; `is_cjk(chunk id)` tells a chunk's language."""

    def __init__(self, engine: Engine, is_cjk: Callable[[str], bool]) -> None:
        self.engine = engine
        self._is_cjk = is_cjk
        self._sample: tuple[tuple[str, int], tuple[list[str], np.ndarray] | None] | None = None
        self._lock = threading.Lock()
        self._in_model: tuple[tuple[list[str], np.ndarray], str, _ModelBackground] | None = None

    def vectors(self) -> tuple[list[str], np.ndarray] | None:
        """Ids and stored vectors of a fixed random sample of the vault's chunks (drawn again when the model changes or
        the number of chunks moved by more than BACKGROUND_REFRESH_SHARE)."""
        engine = self.engine
        with engine.mutex:
            key = (engine.embedder.name, len(engine.chunks))
            cached = self._sample
            if cached is not None and cached[0][0] == key[0]:
                if abs(key[1] - cached[0][1]) <= BACKGROUND_REFRESH_SHARE * cached[0][1]:
                    return cached[1]
            ids = sorted(engine.chunks)
        with self._lock:
            sample = random.Random(BACKGROUND_SEED).sample(ids, min(BACKGROUND_SAMPLE, len(ids)))
            try:
                stored = engine.vectors.get_vectors(sample)
            except Exception as e:  # no background this time: the cosine gate stays closed, keywords still count
                logger.warning("cannot read background vectors: %s", e)
                return None
            got = [cid for cid in sample if cid in stored]
            background = (got, np.asarray([stored[cid] for cid in got], dtype=np.float32)) if got else None
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
        ids, matrix = background
        near = {cid for cid, _ in hits[:NEAREST_EXCLUDED]}
        keep = np.fromiter((cid not in near for cid in ids), dtype=bool, count=len(ids))
        if int(keep.sum()) < MIN_BACKGROUND:
            return math.inf
        sims = (matrix @ np.asarray(vector, dtype=np.float32))[keep] * scale
        return (top_cosine - float(sims.mean())) / max(float(sims.std()), COSINE_EPSILON)

    def translations(self, fused: Ranked, lists: Sequence[Ranked], model: str) -> tuple[Ranked, dict[str, str]]:
        """`fused` with each head note's translation (see TRANSLATION_Z_MARGIN) right after that note's first chunk, and
        the pairs found (each note of a pair -> the other). `model` is a multilingual model's name; `lists` its and the
        other models' ranked chunks, whose first notes are candidates.

        Notes are compared whole (the mean of their chunks' vectors): two languages rarely chunk a text alike.
        Candidates are the notes the semantic lists found and the notes that share a head note's file name.
        """
        background = self.vectors()
        if background is None or TRANSLATION_Z_MARGIN < 0:
            return fused, {}
        engine = self.engine
        slots, scale = model_slots(engine.embedder, model)
        with engine.mutex:
            head: dict[str, str] = {}  # note -> its first chunk in the results
            for cid, _ in fused:
                chunk = engine.chunks.get(cid)  # a sync may have removed it since the fusion
                if chunk is None:
                    continue
                path = chunk.path
                if path not in head:
                    head[path] = cid
                    if len(head) >= TRANSLATION_HEAD_NOTES:
                        break
            resolver = engine.view.resolver()
            found = [
                engine.chunks[cid].path for hits in lists for cid, _ in hits[:TRANSLATION_CANDIDATES] if cid in engine.chunks
            ]
            namesakes = [other for path in head for other in resolver.namesakes(path)]
            notes = [p for p in dict.fromkeys([*head, *found, *namesakes]) if p in engine.files]
            chunks_of = {p: [c for c in engine.files[p].chunks if c in engine.chunks] for p in notes}
            cjk = {p: self._is_cjk(chunks_of[p][0]) for p in notes if chunks_of[p]}
            live = np.fromiter((cid in engine.chunks for cid in background[0]), dtype=bool, count=len(background[0]))
            bg = self._model_background(background, model, slots)
            total = len(engine.chunks)
        stored = engine.vectors.arrays([c for p in cjk for c in chunks_of[p]])
        means: dict[str, np.ndarray] = {}
        for p in cjk:
            rows = [stored[c] for c in chunks_of[p] if c in stored]
            if rows:
                m = np.asarray(rows, dtype=np.float32)[:, slots].mean(axis=0)
                means[p] = m / max(float(np.linalg.norm(m)), COSINE_EPSILON)  # unit: dot products are cosines
        translation: dict[str, str] = {}  # head chunk -> the translation note's first chunk
        pairs: dict[str, str] = {}
        taken: set[str] = set()
        live &= bg.known
        head_means = [p for p in head if p in means]
        if not head_means:
            return fused, {}
        bg_sims = bg.matrix @ np.stack([means[p] for p in head_means], axis=1) * scale  # background x head notes
        for path, cid in head.items():
            if path not in means or path in taken:  # a note pulled up as a translation brings no other
                continue
            others = [p for p in means if cjk[p] != cjk[path] and p not in taken]
            if not others:
                continue
            x = means[path]
            cos = np.asarray([means[p] for p in others]) @ x
            best = int(np.argmax(cos))
            pair = (path, others[best])
            judged = live.copy()
            judged[[i for p in pair for i in bg.rows_of.get(p, ())]] = False  # the two notes are not their background
            keep = judged & (bg.cjk != cjk[path])
            if int(keep.sum()) < MIN_BACKGROUND:  # few notes in the other language: judged against all (stricter)
                keep = judged
            if int(keep.sum()) < MIN_BACKGROUND:
                continue
            sims = bg_sims[keep, head_means.index(path)]
            z = (float(cos[best]) - float(sims.mean())) / max(float(sims.std()), COSINE_EPSILON)
            pool = round(total * int(keep.sum()) / max(int(live.sum()), 1))
            if z >= chance_z(pool) + TRANSLATION_Z_MARGIN:
                taken.update(pair)
                pairs.update({pair[0]: pair[1], pair[1]: pair[0]})
                if others[best] not in head:  # one already among the first notes keeps its place
                    translation[cid] = chunks_of[others[best]][0]
        if not translation:
            return fused, pairs
        moved = set(translation.values())
        out: Ranked = []
        for cid, score in fused:
            if cid in moved:
                continue
            out.append((cid, score))
            if cid in translation:
                out.append((translation[cid], score))
        return out, pairs

    def _model_background(self, background: tuple[list[str], np.ndarray], model: str, slots: slice) -> _ModelBackground:
        """The background sample in one model's slots, with each chunk's language and note (kept until the sample or the
        model changes; chunks removed since are masked out by the caller). Called under the engine's mutex."""
        cached = self._in_model
        if cached is not None and cached[0] is background and cached[1] == model:
            return cached[2]
        ids = background[0]
        chunks = self.engine.chunks
        known = np.fromiter((cid in chunks for cid in ids), dtype=bool, count=len(ids))
        cjk = np.fromiter((bool(k) and self._is_cjk(cid) for k, cid in zip(known, ids)), dtype=bool, count=len(ids))
        rows_of: dict[str, list[int]] = {}
        for i, cid in enumerate(ids):
            if known[i]:
                rows_of.setdefault(chunks[cid].path, []).append(i)
        out = _ModelBackground(np.ascontiguousarray(background[1][:, slots]), known, cjk, rows_of)
        self._in_model = (background, model, out)
        return out
