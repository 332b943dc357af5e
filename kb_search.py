"""Hybrid search over an Engine's index: BM25 and vector candidates (one list per model) fused by reciprocal rank,
gated for relevance against the vault's own background (kb_background), a found note followed by its translation.

The one search implementation: the MCP tool, `--search`, eval/run_eval.py and eval/bench.py all call Searcher.search.
Over 500 lines for a reason: the stages of one search (see Searcher) read in order in one file; apart, each stage
would hand the next a dozen values.
Imports: kb_background, kb_config, kb_engine, kb_filter, kb_links, kb_state, kb_text, kb_vectors, kb_view.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kb_background import Background, chance_z
from kb_config import SEARCH_MODES, KBError, ModelUnavailableError
from kb_engine import Engine
from kb_filter import NoteFilter, PrivateNotes
from kb_links import Link, split_query_links
from kb_state import ChunkRecord
from kb_text import CJK_CHARS, cjk_share
from kb_vectors import PartQuery, embed_query_parts, embedder_parts, is_english_only
from kb_view import ChunkPredicate

logger = logging.getLogger(__name__)

# Alternatives the client may pass with a query, and the longest each may be (more or longer is a tool error).
MAX_ALTERNATIVES = 4
MAX_ALTERNATIVE_CHARS = 300
# Searches whose query vectors embed_ahead keeps for them at once (searches running side by side over HTTP); an older
# one's vectors are dropped, and its search embeds them again.
AHEAD_KEPT = 8
# Latin words of a query (what an English-only model is given from a mostly Chinese query).
_LATIN_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
# An identifier among a query's tokens: letters with digits or with inner . _ - / : (an error code, ticket id, path,
# host name, a random string). The notes holding it come first (see Searcher._exact_notes).
_IDENTIFIER_RE = re.compile(r"(?=[^\s]*[a-z])(?=[^\s]*(?:[0-9]|[a-z0-9][._\-/:][a-z0-9]))[a-z0-9._\-/:]{3,}")
# Further candidate notes a reply lists after its hits, one line each without a snippet (the client opens them).
TAIL_NOTES = 10
# Score step between a linked note's chunks the search did not find (they follow its found ones in note order).
LINKED_TAIL_STEP = 1e-6
# Characters of context kept before the first matched term when the matching sentence is longer than half a snippet.
SNIPPET_LEAD_CHARS = 60
# A character a snippet counts twice: CJK, and the full-width punctuation that goes with it.
_WIDE_RE = re.compile(f"[{CJK_CHARS}\u3000-\u303f\uff00-\uffef]")
# A sentence of a snippet's text: up to the end of a line or of a sentence (. ! ? before a space, or 。！？；;); a dot
# inside a name (ls.md, e.g.x) does not end one.
_SENTENCE_RE = re.compile(r"(?:[^\n.!?。！？；;]|[.!?](?!\s|$))+[.!?。！？；;]?")


@dataclass(frozen=True)
class Tuning:
    """The ranker's constants, in one value: each is measured on the three dev sets in docs/retrieval.md, and
    eval/run_eval.py --tune NAME=VALUE replaces one for an experiment (the search.* config keys are the user's)."""

    # Relevance gate: a candidate holding this idf-weighted share of the query's terms makes the search relevant
    # (else the models' cosines must stand out from the vault's background by search.gate_margin, kb_background).
    gate_coverage: float = 0.3
    # A keyword list gets its full fusion weight once one of its first `trust_probe` chunks holds this share of its
    # probe's terms, proportionally less below (a paraphrase shares few words: its keyword list is noise). The
    # client's alternatives, on average, must hold as much to count as evidence for the gate.
    full_coverage: float = 0.5
    trust_probe: int = 10
    # A query that passed on its cosines alone (no candidate holds gate_coverage of its words) is still off-topic
    # when not one of the client's alternatives has this share of its words in one of its first chunks: the client
    # rewrote the question into the words a note would use, and the vault uses none of them (docs/retrieval.md).
    alternative_words: float = 0.2
    # A probe at least this CJK is Chinese: an English-only model gets only its Latin words, and its list counts for
    # the share of the probe's words it read (_Probe.latin_share), not a fixed weight: "Windows 上有个程序卡死了..."
    # gives it one word of eight (tldr 0.606 -> 0.619, docs/retrieval.md).
    cjk_share: float = 0.3
    # Without a probe in the other language (the client's translation), a multilingual model also gives its best
    # chunks in the other language than the query's, at this weight, drawn from `cross_pool` times the candidates.
    cross_weight: float = 0.5
    cross_pool: int = 8
    # A model whose best cosine does not stand out from the vault's background is fused at this share of its weight.
    quiet_weight: float = 0.5
    # At most this many passages of one note make its entry's lines.
    chunks_per_note: int = 2
    # The notes holding every identifier of the query go first when at most this many hold them (a default answer's
    # size): more is no longer exact evidence (node_modules, SHA-256 in a dozen notes). Not the top_k a call asks
    # for, so a longer list starts with the same notes (with top_k 10: tldr 0.594 -> 0.606, docs/retrieval.md).
    exact_notes: int = 5


@dataclass(frozen=True)
class _SemanticList:
    """One model's ranked candidates for a query: (chunk id, that model's cosine), best first."""

    part: PartQuery
    trusted: bool  # False: an English-only model given a Chinese query's Latin words only
    hits: list[tuple[str, float]]
    pool: int  # chunks the list was ranked from
    cross: bool = False  # only chunks in the other language than the query's (see Tuning.cross_weight)
    probe: int = 0  # which string it searched: 0 the query, 1.. the alternatives


@dataclass(frozen=True)
class _Probe:
    """One string the search runs: the query (index 0) or one of the client's alternatives."""

    index: int
    text: str
    tokens: list[str]
    cjk: bool
    latin_share: float  # the share of its words an English-only model reads (its Latin words: names, commands)


@dataclass(frozen=True)
class Hit:
    """One note in the results: its matching passages (the best one's heading path and lines, and every one's lines,
    merged), the best passage's snippet, the scores, its translation (folded in: it takes no entry of its own) and
    which strings found it."""

    path: str
    title: str
    heading_path: str
    line_start: int  # the best passage's lines
    line_end: int
    snippet: str  # around the best passage's matching sentence ("" for a note in the reply's tail)
    score: float  # fused reciprocal-rank score of the best passage (or the single path's score in keyword/semantic mode)
    keyword_rank: int | None  # 1-based rank of the best passage in the query's BM25 list, None if BM25 did not find it
    cosine: float | None  # the best passage's cosine similarity to the query, None without vectors
    chunk_id: str
    ranges: tuple[tuple[int, int], ...] = ()  # the lines of every matching passage, overlapping and adjacent merged
    translation: str | None = None  # the same text in the other language (kb_background.translations)
    translation_ranges: tuple[tuple[int, int], ...] = ()  # the lines of its passages the search found, if any
    found_by: tuple[str, ...] = ()  # which strings found it: "query", "alternative 1", ...

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["score"] = round(self.score, 5)
        d["cosine"] = None if self.cosine is None else round(self.cosine, 4)
        d["ranges"] = [list(r) for r in self.ranges]
        d["translation_ranges"] = [list(r) for r in self.translation_ranges]
        return d


@dataclass
class SearchResult:
    """Notes best first: `hits` with snippets, then `more` (the reply's tail, one line each); `abstained` when none
    passed the relevance gate (they are shown all the same, as low confidence); `notes` explain degradations."""

    query: str
    mode: str
    hits: list[Hit]
    abstained: bool
    notes: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    alternatives: list[str] = field(default_factory=list)  # the client's other strings, as searched
    more: list[Hit] = field(default_factory=list)  # further candidate notes, no snippet

    def ranked_notes(self) -> list[str]:
        """Every note the result names, in reading order: each hit, then its translation; then the tail's."""
        return list(dict.fromkeys(p for h in [*self.hits, *self.more] for p in (h.path, h.translation) if p))


class Searcher:
    """Runs searches against one Engine with a Tuning; loads the optional cross-encoder reranker on first use.

    The stages of a search, in order: probes (the query and the client's alternatives), candidates (a keyword list
    and one list per model for each probe), fusion (reciprocal rank, each list weighted by its own evidence), exact
    names first ([[links]], then identifiers only a few notes hold), the relevance gate, translations, hits.
    """

    def __init__(self, engine: Engine, tuning: Tuning | None = None) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.tuning = tuning or Tuning()
        self._reranker: Any = None
        self._rerank_lock = threading.Lock()
        self.view = engine.view  # every read of notes, chunks and vectors goes through its query methods
        self._background = Background(engine.view, engine.embedder, self.tuning.cjk_share)
        self._ahead: dict[tuple[tuple[str, ...], str], list[list[tuple[PartQuery, bool]]]] = {}  # embed_ahead's
        self._ahead_lock = threading.Lock()

    def warm_up(self) -> None:
        """Read the relevance gate's background sample and the notes' vectors for the translation step now (~0.1 and
        ~0.5 s at 15,000 chunks), not in the first search."""
        self._background.vectors()
        multilingual = [p.name for p in embedder_parts(self.engine.embedder) if not is_english_only(p.name)]
        if multilingual:
            self._background.notes_for(multilingual[0])

    # ---- probes and candidates --------------------------------------------------------------------------------

    def _probes(self, text: str, alternatives: Sequence[str] | None) -> list[_Probe]:
        """The query and the client's alternatives (repeats dropped), each with its tokens and language."""
        out: list[_Probe] = []
        for t in _probe_texts(text, alternatives):
            tokens = self.view.tokenize(t)
            latin = sum(1 for w in tokens if _LATIN_WORD_RE.match(w)) / len(tokens) if tokens else 0.0
            out.append(_Probe(len(out), t, tokens, cjk_share(t) >= self.tuning.cjk_share, latin))
        return out

    def embed_ahead(self, query: str, alternatives: Sequence[str] | None, mode: str | None) -> None:
        """Embed a search's query and alternatives now, for the search that follows (kb_live runs this while it waits
        for file events to settle: the vectors never depend on the index). Bad arguments are left to the search to
        report; a search that never comes leaves its vectors to be dropped (AHEAD_KEPT)."""
        mode = mode or self.cfg.search_mode
        if mode not in SEARCH_MODES or mode == "keyword" or self.engine.model_error:
            return
        text, _ = split_query_links((query or "").strip())
        try:
            texts = tuple(_probe_texts(text.strip() or query.strip(), alternatives))
        except KBError:
            return
        if not texts or not texts[0]:
            return
        found = self._part_queries(texts, mode)
        with self._ahead_lock:
            self._ahead[(texts, mode)] = found
            while len(self._ahead) > AHEAD_KEPT:
                self._ahead.pop(next(iter(self._ahead)))

    def _embedded(self, texts: Sequence[str], mode: str) -> list[list[tuple[PartQuery, bool]]]:
        """_part_queries, taken from embed_ahead's where it ran for these texts."""
        with self._ahead_lock:
            found = self._ahead.pop((tuple(texts), mode), None)
        return found if found is not None else self._part_queries(texts, mode)

    def _part_queries(self, texts: Sequence[str], mode: str) -> list[list[tuple[PartQuery, bool]]]:
        """For each text (the query, the alternatives), one query vector per model, each with whether its cosine is
        trusted; each model embeds every text it reads in one call.

        An English-only model scores any two Chinese texts alike: a mostly Chinese query gives it only its Latin words
        (names, identifiers), or nothing without any; except in semantic mode when no other model reads the query.
        """
        embedder = self.engine.embedder
        parts = embedder_parts(embedder)
        plans: list[list[tuple[int, str, bool]]] = []  # per text: (model, the text it embeds, trusted)
        for query in texts:
            cjk = cjk_share(query) >= self.tuning.cjk_share
            trust = [not (cjk and is_english_only(part.name)) for part in parts]
            if mode == "semantic" and not any(trust):
                trust = [True] * len(parts)
            plan = [
                (i, query if trusted else " ".join(_LATIN_WORD_RE.findall(query)), trusted) for i, trusted in enumerate(trust)
            ]
            plans.append([(i, text, trusted) for i, text, trusted in plan if text])
        vectors: dict[tuple[int, str], PartQuery] = {}
        # One model after the other: both bundled models run in onnxruntime, a query in 1-4 ms, and on two threads each
        # waited on the other's hold of the GIL between its native calls (five strings: 19.4 ms side by side, 19.2 ms in
        # turn; tldr's searches in process 20.3 -> 19.0 ms).
        for i in range(len(parts)):
            wanted = list(dict.fromkeys(text for plan in plans for m, text, _ in plan if m == i))
            if wanted:
                vectors.update(zip(((i, t) for t in wanted), embed_query_parts(embedder, i, wanted)))
        return [[(vectors[(i, text)], trusted) for i, text, trusted in plan] for plan in plans]

    def _semantic(
        self,
        probes: Sequence[_Probe],
        mode: str,
        n: int,
        accept: ChunkPredicate | None,
        scope: tuple[list[str] | None, int],
        notes: list[str],
        *,
        cross: bool,
        query_cjk: bool,
    ) -> list[_SemanticList]:
        """Every probe's ranked list per model (and the cross-lingual lists), from one pass over the vectors."""
        engine = self.engine
        if engine.model_error:
            raise ModelUnavailableError(engine.model_error)
        queries = self._embedded([p.text for p in probes], mode)
        paths, pool = scope
        if paths is not None and not paths:
            return [_SemanticList(q, trusted, [], 0, probe=p.index) for p, qs in zip(probes, queries) for q, trusted in qs]
        flat = [
            (p, q, trusted, cross and trusted and not is_english_only(q.model))
            for p, qs in zip(probes, queries)
            for q, trusted in qs
        ]
        wants = [n * self.tuning.cross_pool if other_language else n for *_, other_language in flat]
        try:
            found_all = self.view.nearest_many([q.vector for _, q, _, _ in flat], wants, paths)
        except Exception as e:  # a store another process is rewriting: degrade to keyword for this search
            logger.warning("vector query failed: %s", e)
            notes.append(f"semantic search failed for this query ({type(e).__name__}); keyword results only")
            return []
        out: list[_SemanticList] = []
        for (p, q, trusted, other_language), found in zip(flat, found_all):
            hits = self.view.present(((cid, float(cos) * q.scale) for cid, cos in found), accept)
            other = [h for h in hits if self._background.is_cjk(h[0]) != query_cjk][:n] if other_language else []
            out.append(_SemanticList(q, trusted, hits[:n], pool, probe=p.index))
            if other:
                out.append(_SemanticList(q, trusted, other, pool, cross=True, probe=p.index))
        return out

    def _cosines(self, lists: Sequence[_SemanticList], ids: list[str]) -> list[dict[str, float]]:
        """Each model's cosine for each of `ids` (from its ranked list, else from the stored vectors)."""
        out = [dict(sl.hits) for sl in lists]
        missing = sorted({cid for known in out for cid in ids if cid not in known})
        if not missing:
            return out
        stored = self.view.vectors_of(missing)
        if not stored:
            return out
        got = list(stored)
        matrix = np.asarray([stored[cid] for cid in got], dtype=np.float32)
        for sl, known in zip(lists, out):
            query = np.asarray(sl.part.vector, dtype=np.float32)
            sims = matrix @ query * sl.part.scale
            held = np.abs(matrix[:, query != 0]).max(axis=1, initial=0.0) > 0  # a row may lack a model (kb_store)
            for cid, sim, has in zip(got, sims.tolist(), held.tolist()):
                if has:
                    known.setdefault(cid, sim)
        return out

    # ---- search -----------------------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        alternatives: Sequence[str] | None = None,
        top_k: int | None = None,
        mode: str | None = None,
        path_prefix: str | None = None,
        tag: str | None = None,
        modified_within_days: float | None = None,
        where: dict[str, Any] | None = None,
        date_from: str | None = None,
        date_to: str | None = None,
        private: PrivateNotes | None = None,
    ) -> SearchResult:
        """Search the index (the caller syncs first). Raises KBError for bad arguments or an unusable mode.

        `alternatives`: the client's other strings for the same question (a translation, keywords, a likely name), run
        with the query and fused; they help find notes but never make an off-topic question relevant on their own.
        `where` filters by note properties, `date_from`/`date_to` by note date (kb_graph: a journal's own date first).
        `private`: the notes this caller must not see (a remote client without notes:private), in no list, snippet or
        translation.
        """
        t0 = time.perf_counter()
        query = (query or "").strip()
        if not query:
            raise KBError("query is empty; pass the words or question to search for")
        mode = mode or self.cfg.search_mode
        if mode not in SEARCH_MODES:
            raise KBError(f"mode '{mode}' is unknown; use one of {', '.join(SEARCH_MODES)}")
        top_k = top_k or self.cfg.top_k
        tune = self.tuning
        view = self.view
        notes: list[str] = []
        keys = view.property_keys() if where else ()
        flt = NoteFilter.of(path_prefix, tag, modified_within_days, where, date_from, date_to, keys, private)
        wanted = flt.accepts if flt.active else None
        accept = view.chunk_filter(wanted)
        n = max(self.cfg.candidates, top_k * 4)

        text, links = split_query_links(query)
        linked = self._resolve_query_links(links, notes, private) if links else []
        text = text.strip() or query
        probes = self._probes(text, alternatives)
        query_probe = probes[0]
        # The client's translation makes the server's own other-language list unnecessary (and it would count twice).
        cross = mode == "hybrid" and tune.cross_weight > 0 and all(p.cjk == query_probe.cjk for p in probes)
        keyword = {p.index: view.keyword(p.tokens, n, accept) if mode != "semantic" else [] for p in probes}
        lists: list[_SemanticList] = []
        if mode != "keyword":
            try:
                scope = view.scope(wanted)
                lists = self._semantic(probes, mode, n, accept, scope, notes, cross=cross, query_cjk=query_probe.cjk)
            except ModelUnavailableError as e:
                if mode == "semantic":
                    raise
                lists = []
                notes.append(f"semantic search unavailable, keyword results only: {e}")

        kw = keyword[0]
        kw_rank = {cid: i for i, (cid, _) in enumerate(kw, 1)}
        read = {sl.probe for sl in lists if sl.trusted}  # probes some model read whole
        probe_cov = {
            p.index: max(view.coverage(p.tokens, [cid for cid, _ in keyword[p.index][: tune.trust_probe]]).values(), default=0.0)
            for p in probes
        }
        kw_trust = {
            i: min(1.0, c / tune.full_coverage) if i in read and tune.full_coverage > 0 else 1.0 for i, c in probe_cov.items()
        }
        by_model = [sl for sl in lists if not sl.cross]  # a cross-lingual list repeats its model's cosines
        excess = {id(sl): self._cosine_excess(sl) for sl in by_model if sl.hits}
        quiet = {(sl.probe, sl.part.model) for sl in by_model if excess.get(id(sl), -math.inf) < 0}
        fused, found_by = self._fuse(mode, keyword, lists, kw_trust, quiet, probes)
        fused = view.present(fused)
        exact = [p for p in self._exact_notes(query_probe.tokens, accept) if p not in linked] if mode != "semantic" else []
        if exact:
            fused = self._linked_first(fused, exact, accept)
        if linked:
            fused = self._linked_first(fused, linked, accept)
        head = [cid for cid, _ in fused[:n]]
        coverage = view.coverage(query_probe.tokens, head)
        first_note = view.paths_of(head[:1]).get(head[0]) if head else None
        named = first_note is not None and (first_note in linked or first_note in exact)
        query_lists = [sl for sl in by_model if sl.probe == 0]
        cosines = self._cosines(query_lists, head)
        alt_cov = [probe_cov[p.index] for p in probes[1:]]
        query_cov = max(coverage.values(), default=0.0)
        relevant = named or self._is_relevant(mode, query_cov, query_lists, excess)
        if alt_cov and mode != "semantic" and not named:
            # The client's alternatives count only through the words they share with a note: their cosines would let
            # an off-topic question through (each string is one more chance to match by chance). Enough shared words
            # on average make a search relevant; none shared undoes a pass on the query's cosines alone (hybrid).
            if not relevant:
                relevant = sum(alt_cov) / len(alt_cov) >= tune.full_coverage
            elif mode == "hybrid" and query_cov < tune.gate_coverage and max(alt_cov) < tune.alternative_words:
                relevant = False
        mean_cos: dict[str, float] = {}  # the hit's cosine: the mean of the models' cosines (the one model's, with one)
        if cosines:
            mean_cos = {cid: sum(got) / len(got) for cid in head if (got := [c[cid] for c in cosines if cid in c])}
        if self.cfg.rerank_model and fused:
            fused = self._rerank(text, fused, notes)
            if linked:  # the cross-encoder reads the words only: the named notes stay first
                fused = self._linked_first(view.present(fused), linked, accept)
        # Below the gate nothing is hidden: the same notes are shown, marked low confidence (the client judges).
        found = {cid for cid, _ in fused}
        pairs: dict[str, str] = {}
        if mode == "hybrid" and fused:
            fused, pairs = self._with_translations(fused, lists, query_probe.cjk, {*exact, *linked}, top_k + TAIL_NOTES)
            if private is not None:  # a translation the search brought in is a note like any other
                visible = NoteFilter(private=private).accepts
                fused = view.present(fused, view.chunk_filter(visible))
                records = view.records({*pairs, *pairs.values()})
                pairs = {a: b for a, b in pairs.items() if visible(a, records.get(a)) and visible(b, records.get(b))}
        hits, more = self._collect(fused, found, top_k, kw_rank, mean_cos, pairs, found_by, probes)
        return SearchResult(
            query,
            mode,
            hits,
            abstained=not relevant or not hits,
            notes=notes,
            elapsed_ms=(time.perf_counter() - t0) * 1000,
            alternatives=[p.text for p in probes[1:]],
            more=more,
        )

    def _exact_notes(self, tokens: list[str], accept: ChunkPredicate | None) -> list[str]:
        """The notes holding every identifier of the query (an error code, ticket id, path, host, a random string;
        a query of one word counts as one), when they are few (at most Tuning.exact_notes): exact evidence, which the
        models' look-alikes must not outvote. In BM25 order."""
        distinct = list(dict.fromkeys(tokens))
        wanted = [t for t in distinct if _IDENTIFIER_RE.fullmatch(t)] or (distinct if len(distinct) == 1 else [])
        if not wanted:
            return []
        holders: list[str] | None = None
        for t in wanted:
            paths = self.view.holders(t, accept)
            holders = paths if holders is None else [p for p in holders if p in paths]
            if not holders or len(holders) > self.tuning.exact_notes:
                return []
        return holders or []

    def _with_translations(
        self, fused: list[tuple[str, float]], lists: Sequence[_SemanticList], query_cjk: bool, named: set[str], head: int
    ) -> tuple[list[tuple[str, float]], dict[str, str]]:
        """`fused` with each head note's translation beside it, the one in the query's language first (a `named` note,
        which holds the query's identifier or is its [[link]], before its translation, which does not), and the pairs
        found (kb_background.translations), as a multilingual model judges them."""
        model = next((sl for sl in lists if not sl.cross and sl.trusted and not is_english_only(sl.part.model)), None)
        if model is None:
            return fused, {}
        return self._background.translations(fused, model.part.model, query_cjk, head, named)

    def _resolve_query_links(self, links: Sequence[Link], notes: list[str], private: PrivateNotes | None) -> list[str]:
        """The notes a query's [[links]] name (as a note's own links resolve), each said in the reply's notes; a note
        `private` covers is named by none."""
        resolver = self.view.resolver()
        paths: list[str] = []
        for link in links:
            path = resolver.resolve(link.target).path
            if path is not None and private is not None and private.covers(path, self.view.record(path)):
                path = None
            if path is None:
                notes.append(f"[[{link.target}]] names no note in this vault; its words were searched as text")
            elif path not in paths:
                paths.append(path)
                notes.append(f"[[{link.target}]] is {path}: its passages that best match the query come first")
        return paths

    def _linked_first(
        self, fused: list[tuple[str, float]], linked: list[str], accept: ChunkPredicate | None
    ) -> list[tuple[str, float]]:
        """The linked notes' chunks ahead of the rest: those the search found in their fused order, then their other
        chunks in note order (a query that is only a link still leads to the note). Scores stay in descending order."""
        bonus = (fused[0][1] if fused else 0.0) + 1.0
        wanted = set(linked)
        path_of = self.view.paths_of(cid for cid, _ in fused)
        first = [(cid, s + bonus) for cid, s in fused if path_of.get(cid) in wanted]
        seen = {cid for cid, _ in first}
        records = self.view.records(linked)
        rest = [(cid, 0.0) for path in linked for cid in (records[path].chunks if path in records else ()) if cid not in seen]
        extra = [cid for cid, _ in self.view.present(rest, accept)]
        later = [(cid, bonus - LINKED_TAIL_STEP * i) for i, cid in enumerate(extra, 1)]
        return first + later + [(cid, s) for cid, s in fused if cid not in seen]

    def _fuse(
        self,
        mode: str,
        keyword: dict[int, list[tuple[str, float]]],
        lists: Sequence[_SemanticList],
        kw_trust: dict[int, float],
        quiet: set[tuple[int, str]],
        probes: Sequence[_Probe],
    ) -> tuple[list[tuple[str, float]], dict[str, set[int]]]:
        """Reciprocal rank fusion of every probe's lists, best first, and which probes found each chunk.

        Each list's weight is its evidence: a keyword list by how much of its probe it holds (kw_trust), a model's
        list by how much of the probe it reads (all, or its Latin words' share) and whether it stands out (else quiet_weight);
        the cross-lingual list at cross_weight."""
        tune = self.tuning
        ranked: list[tuple[float, int, list[tuple[str, float]]]] = []
        if mode != "semantic":
            ranked += [(self.cfg.keyword_weight * kw_trust.get(i, 1.0), i, kw) for i, kw in keyword.items()]
        if mode != "keyword":
            for sl in lists:
                weight = tune.cross_weight if sl.cross else 1.0 if sl.trusted else probes[sl.probe].latin_share
                if mode == "hybrid" and (sl.probe, sl.part.model) in quiet:
                    weight *= tune.quiet_weight
                ranked.append((weight, sl.probe, sl.hits))
        if mode != "hybrid" and len(ranked) == 1:  # one list: its own scores
            only = ranked[0][2]
            return list(only), {cid: {ranked[0][1]} for cid, _ in only}
        k, scores = self.cfg.rrf_k, {}
        found: dict[str, set[int]] = {}
        for weight, probe, hits in ranked:
            for rank, (cid, _) in enumerate(hits, 1):
                scores[cid] = scores.get(cid, 0.0) + weight / (k + rank)
                found.setdefault(cid, set()).add(probe)
        return sorted(scores.items(), key=lambda x: -x[1]), found

    def _cosine_excess(self, sl: _SemanticList) -> float:
        """How far a model's best cosine stands above the level its best of `sl.pool` unrelated chunks reaches by chance,
        in standard deviations of the vault's background, less search.gate_margin (>= 0: it found something)."""
        z = self._background.z(sl.part.vector, sl.part.scale, sl.hits[0][1], sl.hits)
        return -math.inf if z is None else z - chance_z(sl.pool) - self.cfg.gate_margin

    def _is_relevant(self, mode: str, coverage: float, lists: Sequence[_SemanticList], excess: dict[int, float]) -> bool:
        """The relevance gate on the query: enough of its terms in one candidate, or the models' best cosines far enough
        above their chance level in this vault (see search.gate_margin), averaged over the models that read the whole
        query (a Chinese query's Latin words speak only where no model read it whole)."""
        keyword_ok = coverage >= self.tuning.gate_coverage
        if mode == "keyword":
            return keyword_ok
        judged = [sl for sl in lists if id(sl) in excess]
        judged = [sl for sl in judged if sl.trusted] or judged
        semantic_ok = bool(judged) and sum(excess[id(sl)] for sl in judged) / len(judged) >= 0
        if mode == "semantic":
            return semantic_ok
        return keyword_ok or semantic_ok

    def _collect(
        self,
        ranked: list[tuple[str, float]],
        found: set[str],
        top_k: int,
        kw_rank: dict[str, int],
        cos: dict[str, float],
        pairs: dict[str, str],
        found_by: dict[str, set[int]],
        probes: Sequence[_Probe],
    ) -> tuple[list[Hit], list[Hit]]:
        """One entry per note (a note and its translation are one entry, the first of the two in `ranked` leading):
        the first `top_k` with a snippet, the next TAIL_NOTES without. An entry's lines are those of its passages the
        search `found` (at most Tuning.chunks_per_note per note; a translation it did not find: the passage `ranked`
        stands it for); its snippet is cut around the sentence that best matches the query and the strings that found
        the entry."""
        chunks = self.view.chunks_by_id(cid for cid, _ in ranked)
        groups: dict[str, dict[str, list[tuple[str, float]]]] = {}  # leading note -> {note: its passages, best first}
        lead_of: dict[str, str] = {}
        wanted = top_k + TAIL_NOTES
        for cid, score in ranked:
            c = chunks.get(cid)
            if c is None:
                continue
            lead = lead_of.get(c.path)
            if lead is None:
                if len(groups) >= wanted:
                    continue
                lead = c.path
                groups[lead] = {}
                lead_of[lead] = lead
                if pairs.get(lead):
                    lead_of[pairs[lead]] = lead
            passages = groups[lead].setdefault(c.path, [])
            if (cid in found or not passages) and len(passages) < self.tuning.chunks_per_note:
                passages.append((cid, score))
        records = self.view.records(groups)
        probe_tokens = {p.index: p.tokens for p in probes}
        weights = self.view.term_weights({t for ts in probe_tokens.values() for t in ts})
        hits: list[Hit] = []
        for n, (lead, members) in enumerate(groups.items()):
            own = members[lead]
            partner = pairs.get(lead)
            best, score = own[0]
            c = chunks[best]
            rec = records.get(lead)
            by = sorted({i for m in members.values() for cid, _ in m for i in found_by.get(cid, ())})
            snippet = ""
            if n < top_k:
                tokens = [t for i in sorted({0, *by}) for t in probe_tokens.get(i, ())]
                snippet = make_snippet(c, tokens, self.cfg.snippet_chars, weights)
            hits.append(
                Hit(
                    lead,
                    rec.title if rec else lead,
                    c.heading_path,
                    c.line_start,
                    c.line_end,
                    snippet,
                    score,
                    kw_rank.get(best),
                    cos.get(best),
                    best,
                    merge_ranges((chunks[cid].line_start, chunks[cid].line_end) for cid, _ in own),
                    partner,
                    merge_ranges((chunks[cid].line_start, chunks[cid].line_end) for cid, _ in members.get(partner or "", ())),
                    tuple(_probe_name(i) for i in by) if len(probes) > 1 else (),
                )
            )
        return hits[:top_k], hits[top_k:]

    # ---- optional cross-encoder -----------------------------------------------------------------------------

    def _rerank(self, query: str, ranked: list[tuple[str, float]], notes: list[str]) -> list[tuple[str, float]]:
        """Reorder the best fused candidates with the cross-encoder; the rest keep their order after them."""
        head, tail = ranked[: self.cfg.rerank_candidates], ranked[self.cfg.rerank_candidates :]
        try:
            reranker = self._load_reranker()
        except ModelUnavailableError as e:
            notes.append(f"reranker unavailable, fused order kept: {e}")
            return ranked
        chunks = self.view.chunks_by_id(cid for cid, _ in head)
        head = [(cid, s) for cid, s in head if cid in chunks]  # a sync may have removed some since the fusion
        scores = reranker.score(query, [f"{chunks[cid].context}\n{chunks[cid].text}" for cid, _ in head])
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


def _probe_texts(text: str, alternatives: Sequence[str] | None) -> list[str]:
    """The query's text and the client's alternatives, stripped, repeats (ignoring case) dropped; KBError for
    alternatives the tool does not take."""
    alts = [a.strip() for a in alternatives or () if a is not None]
    if len(alts) > MAX_ALTERNATIVES:
        raise KBError(f"{len(alts)} alternatives given; pass at most {MAX_ALTERNATIVES}")
    for i, a in enumerate(alts, 1):
        if not a:
            raise KBError(f"alternative {i} is empty; drop it or write other words for the same question")
        if len(a) > MAX_ALTERNATIVE_CHARS:
            raise KBError(
                f"alternative {i} has {len(a)} characters; each may have at most {MAX_ALTERNATIVE_CHARS} "
                "(short keywords or one translated sentence)"
            )
    out: dict[str, str] = {}
    for t in [text, *alts]:
        out.setdefault(t.casefold(), t)
    return list(out.values())


def _probe_name(index: int) -> str:
    return "query" if index == 0 else f"alt {index}"


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Line ranges in order, overlapping and adjacent ones merged: [(34, 50), (38, 57), (88, 95)] -> ((34, 57), (88, 95))."""
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((a, b) for a, b in out)


def make_snippet(chunk: ChunkRecord, tokens: Sequence[str], max_chars: int, weights: dict[str, float] | None = None) -> str:
    """The chunk's text from the sentence (or line) whose snippet holds the most of `tokens`, each weighted by
    `weights` (its idf), the middle one of equals (centred on where they are); whitespace folded, at most `max_chars` wide: a CJK character counts
    two (it says as much as two or three Latin letters, so a Chinese snippet holds about what an English one does).
    From the start when no sentence holds any of `tokens`."""
    text = _fold(chunk.text)
    wide = np.zeros(len(text) + 1, dtype=np.int64)  # wide[i]: the width of text[:i]
    np.cumsum([2 if _WIDE_RE.match(ch) else 1 for ch in text], out=wide[1:])
    if wide[-1] <= max_chars:
        return text
    room = max_chars - 2  # the ellipses
    low = text.lower()
    words = [t for t in dict.fromkeys(t.lower() for t in tokens) if len(t) > 1 or cjk_share(t) == 1.0]
    words = [w for w in words if w in low]
    weights = weights or {}

    def end_of(start: int) -> int:
        return int(np.searchsorted(wide, wide[start] + room, side="right")) - 1

    starts, at = [], 0
    for m in _SENTENCE_RE.finditer(chunk.text):
        sentence = _fold(m.group())
        found = text.find(sentence, at)
        if not sentence or found < 0:
            continue
        at = found + len(sentence)
        starts.append((found, at))
        if end_of(found) < at:  # a sentence longer than the snippet: also from just before its first match
            inside = [i for w in words if (i := low.find(w, found, at)) >= 0]
            if inside and min(inside) - SNIPPET_LEAD_CHARS > found:
                starts.append((min(inside) - SNIPPET_LEAD_CHARS, at))
    scores = [sum(weights.get(w, 1.0) for w in words if w in low[s : end_of(s)]) for s, _ in starts]
    best = max(scores, default=0.0)
    tied = [s for (s, _), score in zip(starts, scores) if score == best and best > 0]
    start = tied[(len(tied) - 1) // 2] if tied else 0
    # start no later than where the rest of the text still fills the snippet
    start = max(0, min(start, int(np.searchsorted(wide, wide[-1] - room))))
    end = end_of(start)
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


def _fold(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
