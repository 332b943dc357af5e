"""Hybrid search over an Engine's index: BM25 and vector candidates fused by reciprocal rank, gated for relevance.

The one search implementation: the MCP tool, `--search`, eval/run_eval.py and eval/bench.py all call Searcher.search.
Imports ingest (the engine), kb_text, kb_vectors, kb_config.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ingest import Engine
from kb_config import SEARCH_MODES, KBError, ModelUnavailableError
from kb_state import ChunkRecord
from kb_text import cjk_share
from kb_vectors import is_english_only

logger = logging.getLogger(__name__)

# A chunk counts as a keyword match when it holds at least this idf-weighted share of the query's terms.
MIN_KEYWORD_COVERAGE = 0.3
# Queries at least this CJK are not judged by an English-only model's cosine (it scores any two Chinese texts alike).
CJK_QUERY_SHARE = 0.3
# Fusion weight of the semantic list (times search.semantic_weight) when its cosine is not trusted, as above.
UNTRUSTED_SEMANTIC_WEIGHT = 0.3
# For a mostly Chinese query, let the cosine of its Latin words (names, identifiers) vouch for relevance.
LATIN_COSINE_EVIDENCE = True

# At most this many chunks of one note in the results, so one long note does not crowd out the rest.
MAX_CHUNKS_PER_NOTE = 2
# Latin words of a query (what an English-only model is given from a mostly Chinese query).
_LATIN_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
# Notes named as low-confidence pointers when a search abstains.
CLOSEST_ON_ABSTAIN = 3
# Characters of context kept before the first matched term in a snippet.
SNIPPET_LEAD_CHARS = 60


@dataclass(frozen=True)
class Hit:
    """One search result: where it is (note, heading path, lines), a bounded snippet and the scores."""

    path: str
    title: str
    heading_path: str
    line_start: int
    line_end: int
    snippet: str
    score: float  # fused reciprocal-rank score (or the single path's score in keyword/semantic mode)
    keyword_rank: int | None  # 1-based rank in the BM25 list, None if BM25 did not find it
    cosine: float | None  # cosine similarity to the query, None without vectors
    chunk_id: str

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["score"] = round(self.score, 5)
        d["cosine"] = None if self.cosine is None else round(self.cosine, 4)
        return d


@dataclass
class SearchResult:
    """Hits best first; `abstained` when nothing passed the relevance gate; `notes` explain degradations."""

    query: str
    mode: str
    hits: list[Hit]
    abstained: bool
    notes: list[str] = field(default_factory=list)
    closest: list[str] = field(default_factory=list)  # on abstain: the nearest notes, as low-confidence pointers
    elapsed_ms: float = 0.0


def _path_filter(prefix: str | None) -> Callable[[str], bool] | None:
    if not prefix:
        return None
    p = prefix.strip().replace("\\", "/").strip("/")
    if not p or p == ".":
        return None
    return lambda path: path == p or path.startswith(p + "/")


class _Filter:
    """A search filter: `note(path)` decides per note (folder, tag, date); calling it with a chunk id decides per chunk."""

    def __init__(self, chunks: dict[str, ChunkRecord], note: Callable[[str], bool]) -> None:
        self.chunks = chunks
        self.note = note

    def __call__(self, chunk_id: str) -> bool:
        c = self.chunks.get(chunk_id)
        return c is not None and self.note(c.path)


class Searcher:
    """Runs searches against one Engine; loads the optional cross-encoder reranker on first use."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self._reranker: Any = None
        self._rerank_lock = threading.Lock()

    # ---- candidates -----------------------------------------------------------------------------------------

    def _semantic(
        self, query: str, n: int, accept: _Filter | None, notes: list[str]
    ) -> tuple[list[tuple[str, float]], list[float] | None]:
        engine = self.engine
        if engine.model_error:
            raise ModelUnavailableError(engine.model_error)
        if not query:
            return [], None
        qvec = engine.embedder.embed_query(query)
        paths = None
        if accept is not None:
            with engine.mutex:
                paths = [p for p in engine.files if accept.note(p)]
            if not paths:
                return [], qvec
        try:
            found = engine.vectors.query(qvec, n, paths)
        except Exception as e:  # a store another process is rewriting: degrade to keyword for this search
            logger.warning("vector query failed: %s", e)
            notes.append(f"semantic search failed for this query ({type(e).__name__}); keyword results only")
            return [], qvec
        with engine.mutex:
            return [(cid, cos) for cid, cos in found if cid in engine.chunks and (accept is None or accept(cid))], qvec

    def _cosines(self, qvec: list[float] | None, ids: list[str], known: dict[str, float]) -> dict[str, float]:
        missing = [cid for cid in ids if cid not in known]
        if qvec is None or not missing:
            return known
        out = dict(known)
        for cid, vec in self.engine.vectors.get_vectors(missing).items():
            out[cid] = sum(a * b for a, b in zip(qvec, vec))
        return out

    def _coverage(self, tokens: list[str], chunk_ids: list[str]) -> dict[str, float]:
        """idf-weighted share of the query's distinct terms found in each chunk."""
        distinct = list(dict.fromkeys(tokens))
        if not distinct:
            return {cid: 0.0 for cid in chunk_ids}
        bm25 = self.engine.bm25
        idf = bm25.term_idf(distinct)
        total = sum(idf.values()) or 1.0
        return {cid: sum(idf[t] for t in bm25.terms_in(cid, distinct)) / total for cid in chunk_ids}

    # ---- search -----------------------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        top_k: int | None = None,
        mode: str | None = None,
        path_prefix: str | None = None,
        tag: str | None = None,
        modified_within_days: float | None = None,
    ) -> SearchResult:
        """Search the index (the caller syncs first). Raises KBError for bad arguments or an unusable mode."""
        t0 = time.perf_counter()
        query = (query or "").strip()
        if not query:
            raise KBError("query is empty; pass the words or question to search for")
        mode = mode or self.cfg.search_mode
        if mode not in SEARCH_MODES:
            raise KBError(f"mode '{mode}' is unknown; use one of {', '.join(SEARCH_MODES)}")
        top_k = top_k or self.cfg.top_k
        engine = self.engine
        notes: list[str] = []
        accept = self._filter(path_prefix, tag, modified_within_days)
        n = max(self.cfg.candidates, top_k * 4)

        with engine.mutex:
            tokens = engine.tokenizer.tokenize(query)
            kw = engine.bm25.search(tokens, n, accept) if mode != "semantic" else []
        # An English-only model scores any two Chinese texts alike: a mostly Chinese query gives it only its Latin
        # words (names, identifiers); that list is down-weighted in the fusion, and only its cosine can vouch.
        trusted = mode == "semantic" or not (is_english_only(engine.embedder.name) and cjk_share(query) >= CJK_QUERY_SHARE)
        sem_query = query if trusted else " ".join(_LATIN_WORD_RE.findall(query))
        sem: list[tuple[str, float]] = []
        qvec: list[float] | None = None
        if mode != "keyword":
            try:
                sem, qvec = self._semantic(sem_query, n, accept, notes)
            except ModelUnavailableError as e:
                if mode == "semantic":
                    raise
                notes.append(f"semantic search unavailable, keyword results only: {e}")

        kw_rank = {cid: i for i, (cid, _) in enumerate(kw, 1)}
        fused = self._fuse(mode, kw, sem, trusted)
        with engine.mutex:
            fused = [(cid, s) for cid, s in fused if cid in engine.chunks]
            coverage = self._coverage(tokens, [cid for cid, _ in fused[:n]])
        cos = self._cosines(qvec, [cid for cid, _ in fused[:n]], dict(sem))

        def evidence(cid: str) -> bool:
            return self._is_relevant(mode, coverage.get(cid, 0.0), cos.get(cid) if (trusted or LATIN_COSINE_EVIDENCE) else None)

        closest: list[str] = []
        if not any(evidence(cid) for cid, _ in fused[:n]):  # abstain: nothing passed the relevance gate
            with engine.mutex:
                closest = list(dict.fromkeys(engine.chunks[cid].path for cid, _ in fused[:n] if cid in engine.chunks))
            fused = []
        if self.cfg.rerank_model and fused:
            fused = self._rerank(query, fused, notes)
        hits = self._collect(fused, top_k, kw_rank, cos, tokens)
        return SearchResult(
            query,
            mode,
            hits,
            abstained=not hits,
            notes=notes,
            closest=closest[:CLOSEST_ON_ABSTAIN],
            elapsed_ms=(time.perf_counter() - t0) * 1000,
        )

    def _filter(self, path_prefix: str | None, tag: str | None, within_days: float | None) -> _Filter | None:
        by_path = _path_filter(path_prefix)
        tag_norm = tag.strip().lstrip("#").lower() if tag and tag.strip() else None
        since_ns = int((time.time() - within_days * 86400) * 1e9) if within_days is not None else None
        if by_path is None and tag_norm is None and since_ns is None:
            return None
        files = self.engine.files

        def note(path: str) -> bool:
            rec = files.get(path)
            if rec is None or (by_path and not by_path(path)):
                return False
            if tag_norm and not any(t.lower() == tag_norm or t.lower().startswith(tag_norm + "/") for t in rec.tags):
                return False
            return since_ns is None or rec.mtime_ns >= since_ns

        return _Filter(self.engine.chunks, note)

    def _fuse(
        self, mode: str, kw: list[tuple[str, float]], sem: list[tuple[str, float]], trusted: bool
    ) -> list[tuple[str, float]]:
        if mode == "keyword":
            return kw
        if mode == "semantic":
            return sem
        k, scores = self.cfg.rrf_k, {}
        sem_weight = self.cfg.semantic_weight * (1.0 if trusted else UNTRUSTED_SEMANTIC_WEIGHT)
        for weight, ranked in ((self.cfg.keyword_weight, kw), (sem_weight, sem)):
            for rank, (cid, _) in enumerate(ranked, 1):
                scores[cid] = scores.get(cid, 0.0) + weight / (k + rank)
        return sorted(scores.items(), key=lambda x: -x[1])

    def _is_relevant(self, mode: str, coverage: float, cosine: float | None) -> bool:
        keyword_ok = coverage >= MIN_KEYWORD_COVERAGE
        semantic_ok = cosine is not None and cosine >= self.cfg.min_cosine
        if mode == "keyword":
            return keyword_ok
        if mode == "semantic":
            return semantic_ok
        return keyword_ok or semantic_ok

    def _collect(
        self, ranked: list[tuple[str, float]], top_k: int, kw_rank: dict[str, int], cos: dict[str, float], tokens: list[str]
    ) -> list[Hit]:
        hits: list[Hit] = []
        per_note: dict[str, int] = {}
        engine = self.engine
        with engine.mutex:
            for cid, score in ranked:
                c = engine.chunks.get(cid)
                if c is None or per_note.get(c.path, 0) >= MAX_CHUNKS_PER_NOTE:
                    continue
                per_note[c.path] = per_note.get(c.path, 0) + 1
                rec = engine.files.get(c.path)
                hits.append(
                    Hit(
                        c.path,
                        rec.title if rec else c.path,
                        c.heading_path,
                        c.line_start,
                        c.line_end,
                        make_snippet(c, tokens, self.cfg.snippet_chars),
                        score,
                        kw_rank.get(cid),
                        cos.get(cid),
                        cid,
                    )
                )
                if len(hits) >= top_k:
                    break
        return hits

    # ---- optional cross-encoder -----------------------------------------------------------------------------

    def _rerank(self, query: str, ranked: list[tuple[str, float]], notes: list[str]) -> list[tuple[str, float]]:
        """Reorder the best fused candidates with the cross-encoder; the rest keep their order after them."""
        head, tail = ranked[: self.cfg.rerank_candidates], ranked[self.cfg.rerank_candidates :]
        try:
            reranker = self._load_reranker()
        except ModelUnavailableError as e:
            notes.append(f"reranker unavailable, fused order kept: {e}")
            return ranked
        with self.engine.mutex:
            texts = [f"{self.engine.chunks[cid].context}\n{self.engine.chunks[cid].text}" for cid, _ in head]
        scores = reranker.score(query, texts)
        order = sorted(range(len(head)), key=lambda i: -scores[i])
        return [(head[i][0], float(scores[i])) for i in order] + tail

    def _load_reranker(self) -> Any:
        with self._rerank_lock:
            if self._reranker is None:
                from kb_vectors import CrossEncoderReranker

                reranker = CrossEncoderReranker(self.cfg.rerank_model, self.cfg.embed_device)
                reranker.load()
                self._reranker = reranker
            return self._reranker


def make_snippet(chunk: ChunkRecord, tokens: list[str], max_chars: int) -> str:
    """The chunk text around its first query-term match, at most `max_chars` characters, whitespace folded."""
    text = re.sub(r"\s+", " ", chunk.text).strip()
    if len(text) <= max_chars:
        return text
    low = text.lower()
    positions = [low.find(t) for t in tokens if len(t) > 1 and low.find(t) >= 0]
    start = max(0, min(positions) - SNIPPET_LEAD_CHARS) if positions else 0
    start = min(start, len(text) - max_chars)
    piece = text[start : start + max_chars - 2]
    return ("…" if start else "") + piece + ("…" if start + len(piece) < len(text) else "")
