"""The in-memory view a process searches: notes, chunks and their BM25 index, with the vault's terms in jieba, and
the chunks' vectors (in the engine's store) in chunk terms.

Built from notes on disk (or the BM25 pickle saved by an earlier process), changed one note at a time by the engine.
Over 500 lines for a reason: every read a search or a tool makes (notes, chunks, words, links, vectors) is one locked
query of IndexView, so a reader never takes the mutex or walks the dictionaries; the link graph and anchor text it
keeps current sit beside it.
Imports: bm25_index, kb_config, kb_links, kb_state, kb_text.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bm25_index import BM25Index, load_index, save_index
from kb_config import IndexFormatError
from kb_links import LinkResolver
from kb_state import ChunkRecord, FileRecord, LinkRow
from kb_text import Tokenizer

logger = logging.getLogger(__name__)

# Distinct metadata strings whose tokens are cached (cleared when full or when the dictionary changes).
META_TOKEN_CACHE = 50_000
# Anchor text: how many times the words other notes use to link to a note join each of its chunks' BM25 tokens
# (0: off). Measured in docs/retrieval.md.
ANCHOR_TEXT_WEIGHT = 1
# At most this many distinct anchors per note (the most used first), so a hub note's chunks stay about their text.
MAX_ANCHORS = 16


class VectorReader(Protocol):
    """What the view reads of a vector store (kb_store's segment files or kb_chroma's server), by content hash."""

    @property
    def segments(self) -> tuple[str, ...]: ...

    def __len__(self) -> int: ...

    def vector(self, content: str) -> np.ndarray | None: ...

    def cosines(self, query: Sequence[float], contents: Sequence[str]) -> dict[str, float]: ...

    def nearest(self, query: Sequence[float], n: int) -> list[tuple[str, float]]: ...

    def nearest_many(self, queries: Sequence[Sequence[float]], ns: Sequence[int]) -> list[list[tuple[str, float]]]: ...


@dataclass(frozen=True)
class LinkGraph:
    """The vault's note-to-note links as the view holds them, resolved together (a new note can take over a name).

    `outgoing[path]`: (link, resolved path or None) in the note's order; `backlinks[path]`: (linking note, link);
    `unresolved[path]`: links that lead nowhere; `ambiguous`: names several notes share, with their paths.
    """

    resolver: LinkResolver
    outgoing: dict[str, list[tuple[LinkRow, str | None]]]
    backlinks: dict[str, list[tuple[str, LinkRow]]]
    unresolved: dict[str, list[LinkRow]]
    ambiguous: dict[str, tuple[str, ...]]


def make_resolver(files: dict[str, FileRecord]) -> LinkResolver:
    """A resolver over the indexed notes (skipped files are not link targets) and their aliases."""
    notes = {p: r for p, r in files.items() if not r.skipped}
    return LinkResolver(notes, {p: r.aliases for p, r in notes.items() if r.aliases})


def build_link_graph(files: dict[str, FileRecord], resolver: LinkResolver | None = None) -> LinkGraph:
    """Resolve every stored link against the notes in `files` (links into the same note are not backlinks)."""
    resolver = resolver or make_resolver(files)
    outgoing: dict[str, list[tuple[LinkRow, str | None]]] = {}
    backlinks: dict[str, list[tuple[str, LinkRow]]] = {}
    unresolved: dict[str, list[LinkRow]] = {}
    for path, rec in files.items():
        if rec.skipped:
            continue
        for row in rec.links:
            target = resolver.resolve(row.target, path).path if row.target else path
            outgoing.setdefault(path, []).append((row, target))
            if target is None:
                unresolved.setdefault(path, []).append(row)
            elif target != path:
                backlinks.setdefault(target, []).append((path, row))
    return LinkGraph(resolver, outgoing, backlinks, unresolved, resolver.ambiguous_names())


class AnchorText:
    """Each note's anchor text: the words other notes link to it with (a link's label, else the name it was written
    with), minus what the note says of itself (file name, title, aliases); the most used first, MAX_ANCHORS each.

    Kept incrementally: an edited note re-resolves only its own links; when the set of names changed (a note added,
    removed or renamed, aliases edited), only the links that look up a name that now leads elsewhere.
    Example: "[[Redis 缓存策略|cache policy]]" in another note gives "tech/Redis 缓存策略.md" ("cache policy",).
    """

    def __init__(self) -> None:
        self.by_note: dict[str, tuple[str, ...]] = {}
        self._resolver: LinkResolver | None = None  # the one the contributions below were resolved with
        self._out: dict[str, tuple[str, ...]] = {}  # linking note -> the notes it gives anchors to
        self._in: dict[str, dict[str, tuple[str, ...]]] = {}  # note -> {linking note: the texts it links with}
        self._lookups: dict[str, set[str]] = {}  # resolver key -> linking notes whose links look it up
        self._looked_up: dict[str, set[str]] = {}  # linking note -> the keys its links look up

    def update(self, files: dict[str, FileRecord], resolver: LinkResolver, dirty: set[str]) -> list[str]:
        """Bring the anchors up to date after the notes in `dirty` changed; returns the notes whose anchors changed."""
        sources, affected = set(dirty), set(dirty)
        if self._resolver is None:
            sources.update(p for p, r in files.items() if r.links)
            affected.update(self.by_note)
        elif resolver is not self._resolver:
            for key in self._resolver.changed_keys(resolver):
                sources.update(self._lookups.get(key, ()))
        self._resolver = resolver
        for src in sources:
            self._forget(src, affected)
            rec = files.get(src)
            if rec is None or rec.skipped or not rec.links:
                continue
            given: dict[str, list[str]] = {}
            keys: set[str] = set()
            for row in rec.links:
                target = resolver.resolve(row.target, src, keys).path if row.target else None
                if target is not None and target != src:
                    given.setdefault(target, []).append((row.label or posixpath.basename(row.target)).strip())
            for target, texts in given.items():
                self._in.setdefault(target, {})[src] = tuple(texts)
            affected.update(given)
            self._out[src] = tuple(given)
            self._looked_up[src] = keys
            for key in keys:
                self._lookups.setdefault(key, set()).add(src)
        changed = []
        for target in affected:
            new = self._texts(target, files.get(target))
            if new != self.by_note.get(target, ()):
                changed.append(target)
                if new:
                    self.by_note[target] = new
                else:
                    self.by_note.pop(target, None)
        return changed

    def _forget(self, src: str, affected: set[str]) -> None:
        for target in self._out.pop(src, ()):
            affected.add(target)
            linking = self._in.get(target, {})
            linking.pop(src, None)
            if not linking:
                self._in.pop(target, None)
        for key in self._looked_up.pop(src, ()):
            users = self._lookups.get(key)
            if users is not None:
                users.discard(src)
                if not users:
                    del self._lookups[key]

    def _texts(self, target: str, rec: FileRecord | None) -> tuple[str, ...]:
        linking = self._in.get(target)
        if not linking or rec is None:
            return ()
        own = {_fold(posixpath.splitext(posixpath.basename(target))[0]), *(_fold(t) for t in (rec.title, *rec.aliases))}
        counts: dict[str, list[Any]] = {}
        for texts in linking.values():
            for text in texts:
                key = _fold(text)
                if key and key not in own and key.removesuffix(".md") not in own:
                    counts.setdefault(key, [0, text])[0] += 1
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return tuple(text for _, (_, text) in ranked[:MAX_ANCHORS])


def _with_link_rows(files: dict[str, FileRecord]) -> dict[str, FileRecord]:
    """Records from a BM25 pickle written before links were LinkRow records (plain tuples), given LinkRows."""
    return {
        p: replace(r, links=tuple(LinkRow(*x) for x in r.links)) if r.links and not isinstance(r.links[0], LinkRow) else r
        for p, r in files.items()
    }


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


# Whether a note (path, record) is wanted: kb_filter.NoteFilter.accepts, or any predicate of that shape.
NotePredicate = Callable[[str, FileRecord], bool]
# Whether a chunk (by id) is wanted: made by IndexView.chunk_filter; asked only inside the view's own queries.
ChunkPredicate = Callable[[str], bool]


class IndexView:
    """Notes (`files`), chunks and BM25 as this process sees them; every change goes through `put` or `set_record`
    (the engine's), every read through the query methods below (the search's, the tools').

    `mutex` guards all of it against the server's search threads; readers never take it themselves: each query takes
    it and returns values that stay valid after a change (records are immutable). `content_ids` maps a chunk's content
    hash to the chunks holding that text, so a vector found by content leads back to chunks.
    """

    def __init__(self, tokenizer: Tokenizer, metadata_weight: int, store: VectorReader) -> None:
        self.tokenizer = tokenizer
        self.metadata_weight = metadata_weight
        self.store = store  # the engine's; it writes there, the queries below read in chunk terms
        self.mutex = threading.RLock()
        self.files: dict[str, FileRecord] = {}
        self.chunks: dict[str, ChunkRecord] = {}
        self.content_ids: dict[str, set[str]] = {}
        self.bm25 = BM25Index()
        self.version = 0  # bumped on every change; keys the cached stat map
        self._saved_version = -1  # the version the BM25 pickle on disk holds
        self._stats: tuple[int, dict[str, tuple[int, int, int, int]]] = (-1, {})
        self._meta_tokens: dict[str, list[str]] = {}
        self._graph: tuple[int, LinkGraph | None] = (-1, None)
        self._resolver: LinkResolver | None = None  # dropped when a note comes, goes or changes its aliases
        self.anchor_text = AnchorText()
        self.anchor_weight = ANCHOR_TEXT_WEIGHT
        self._links_dirty: set[str] = set()  # notes put since the anchors were last brought up to date
        self._linking = 0  # notes in `files` with at least one link

    # ---- queries ---------------------------------------------------------------------------------------------------

    def chunk(self, chunk_id: str) -> ChunkRecord | None:
        with self.mutex:
            return self.chunks.get(chunk_id)

    def chunks_by_id(self, ids: Iterable[str]) -> dict[str, ChunkRecord]:
        """The chunks of `ids` still in the view, in the order given."""
        with self.mutex:
            return {cid: c for cid in ids if (c := self.chunks.get(cid)) is not None}

    def record(self, path: str) -> FileRecord | None:
        with self.mutex:
            return self.files.get(path)

    def records(self, paths: Iterable[str]) -> dict[str, FileRecord]:
        """The records of the notes of `paths` still in the view."""
        with self.mutex:
            return {p: r for p in paths if (r := self.files.get(p)) is not None}

    def chunk_count(self) -> int:
        with self.mutex:
            return len(self.chunks)

    def size(self) -> tuple[int, int]:
        """(notes, chunks) in the view."""
        with self.mutex:
            return len(self.files), len(self.chunks)

    def paths(self) -> list[str]:
        """Every note's path."""
        with self.mutex:
            return list(self.files)

    def chunk_ids(self) -> list[str]:
        """Every chunk id, sorted (a stable order to sample from)."""
        with self.mutex:
            return sorted(self.chunks)

    def notes_with_chunks(self) -> dict[str, tuple[str, ...]]:
        """{path: its chunk ids} of every note whose first chunk is in the view."""
        with self.mutex:
            return {p: r.chunks for p, r in self.files.items() if r.chunks and r.chunks[0] in self.chunks}

    def select(self, wanted: NotePredicate | None = None) -> list[tuple[str, FileRecord]]:
        """(path, record) of every note `wanted` accepts (every note without it), in the view's order."""
        with self.mutex:
            return [(p, r) for p, r in self.files.items() if wanted is None or wanted(p, r)]

    def scope(self, wanted: NotePredicate | None) -> tuple[list[str] | None, int]:
        """The notes a filter allows (None: the whole vault) and how many chunks they hold: what a search ranks."""
        with self.mutex:
            if wanted is None:
                return None, len(self.chunks)
            paths = [p for p, r in self.files.items() if wanted(p, r)]
            return paths, sum(len(self.files[p].chunks) for p in paths)

    def chunk_filter(self, wanted: NotePredicate | None) -> ChunkPredicate | None:
        """A chunk-id predicate for the queries below: the chunk is in the view and its note is `wanted`."""
        if wanted is None:
            return None

        def accept(chunk_id: str) -> bool:  # called by the queries below, under the mutex
            c = self.chunks.get(chunk_id)
            return c is not None and wanted(c.path, self.files.get(c.path))

        return accept

    def present(self, ranked: Iterable[tuple[str, float]], accept: ChunkPredicate | None = None) -> list[tuple[str, float]]:
        """`ranked` without the chunks no longer in the view (a sync removed them) or that `accept` rules out."""
        with self.mutex:
            return [(cid, s) for cid, s in ranked if cid in self.chunks and (accept is None or accept(cid))]

    def paths_of(self, ids: Iterable[str]) -> dict[str, str]:
        """{chunk id: its note} of the chunks of `ids` still in the view."""
        with self.mutex:
            return {cid: c.path for cid in ids if (c := self.chunks.get(cid)) is not None}

    def tokenize(self, text: str) -> list[str]:
        """A text's BM25 tokens, as the vault's chunks were tokenized (its titles, aliases and tags are words)."""
        with self.mutex:
            return self.tokenizer.tokenize(text)

    def load_dictionary(self) -> None:
        """Read jieba's dictionary without holding the view's lock, so searches in English answer during the read."""
        self.tokenizer.load_dictionary()

    def keyword(self, tokens: list[str], n: int, accept: ChunkPredicate | None = None) -> list[tuple[str, float]]:
        """The n best chunks for `tokens` by BM25, best first."""
        with self.mutex:
            return self.bm25.search(tokens, n, accept)

    def term_weights(self, tokens: Iterable[str]) -> dict[str, float]:
        """Each distinct token's weight for how much of a query a passage holds (its idf in this vault)."""
        with self.mutex:
            return self.bm25.term_idf(dict.fromkeys(tokens))

    def coverage(self, tokens: list[str], ids: list[str]) -> dict[str, float]:
        """idf-weighted share of the distinct `tokens` found in each chunk of `ids`."""
        distinct = list(dict.fromkeys(tokens))
        if not distinct:
            return {cid: 0.0 for cid in ids}
        with self.mutex:
            idf = self.bm25.term_idf(distinct)
            total = sum(idf.values()) or 1.0
            return {cid: sum(idf[t] for t in self.bm25.terms_in(cid, distinct)) / total for cid in ids}

    def holders(self, token: str, accept: ChunkPredicate | None = None) -> list[str]:
        """The notes holding `token`, in BM25 order of their chunks."""
        with self.mutex:
            found = self.bm25.search([token], len(self.chunks), accept)
            return list(dict.fromkeys(self.chunks[cid].path for cid, _ in found if cid in self.chunks))

    # ---- vectors, in chunk terms (the store holds one vector per distinct chunk text) ---------------------------

    def nearest(self, vector: Sequence[float], n: int, paths: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """The n chunks nearest to `vector` as (chunk id, cosine), best first; `paths` restricts to those notes."""
        if paths is not None:
            with self.mutex:
                ids = [cid for p in paths if (r := self.files.get(p)) for cid in r.chunks]
            return sorted(self.cosines(vector, ids).items(), key=lambda x: -x[1])[:n]
        want = n * 2
        while True:
            near = self.store.nearest(vector, want)
            found = self._chunks_of(near)
            if len(found) >= n or want >= len(self.store) or len(near) < want:  # fewer: no more rows hold its model
                return found[:n]
            want *= 4  # many stored texts no chunk holds any more: ask for more

    def nearest_many(
        self, vectors: Sequence[Sequence[float]], ns: Sequence[int], paths: Sequence[str] | None = None
    ) -> list[list[tuple[str, float]]]:
        """`nearest` for several vectors (the j-th wants ns[j] chunks), in one pass over the store (no `paths`)."""
        if paths is not None or len(vectors) < 2:
            return [self.nearest(v, n, paths) for v, n in zip(vectors, ns)]
        out: list[list[tuple[str, float]]] = []
        for vector, n, near in zip(vectors, ns, self.store.nearest_many(vectors, [n * 2 for n in ns])):
            found = self._chunks_of(near)
            done = len(found) >= n or len(near) >= len(self.store) or len(near) < n * 2
            out.append(found[:n] if done else self.nearest(vector, n))
        return out

    def cosines(self, vector: Sequence[float], ids: Iterable[str]) -> dict[str, float]:
        """The cosine of `vector` with each chunk of `ids` that is in the view and has a vector."""
        contents = self._contents(ids)
        cos = self.store.cosines(vector, list(set(contents.values())))
        return {cid: cos[c] for cid, c in contents.items() if c in cos}

    def vectors_of(self, ids: Iterable[str]) -> dict[str, np.ndarray]:
        """The stored vector of each chunk of `ids` that is in the view and has one, as the store holds it."""
        return {cid: v for cid, content in self._contents(ids).items() if (v := self.store.vector(content)) is not None}

    def vector_rows(self) -> int:
        """Rows in the vector store (a row gaining a model is written again: this grows while a first index runs)."""
        return len(self.store)

    def vectors_version(self) -> tuple[int, tuple[str, ...]]:
        """Changes when a note or a vector did (the view's version, the store's segments): keys caches of vectors."""
        return self.version, self.store.segments

    def _contents(self, ids: Iterable[str]) -> dict[str, str]:
        """{chunk id: its content hash, the store's key} of the chunks of `ids` still in the view."""
        with self.mutex:
            return {cid: c.content for cid in ids if (c := self.chunks.get(cid)) is not None}

    def _chunks_of(self, near: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """(content, cosine) pairs as (chunk id, cosine), every chunk holding that text, each once, in order."""
        found: list[tuple[str, float]] = []
        with self.mutex:
            get = self.content_ids.get
            for content, cos in near:
                ids = get(content)
                if not ids:
                    continue
                if len(ids) == 1:  # most texts are one chunk's: no sort
                    found.append((*ids, cos))
                else:
                    found.extend((cid, cos) for cid in sorted(ids))
        return list(dict.fromkeys(found))

    def property_keys(self) -> list[str]:
        """Every property key some note has, sorted."""
        with self.mutex:
            return sorted({k for r in self.files.values() for k in r.properties})

    @property
    def changed_since_save(self) -> bool:
        return self.version != self._saved_version

    def link_graph(self) -> LinkGraph:
        """The resolved links of the notes in the view (rebuilt after any change; dictionary lookups only)."""
        with self.mutex:
            version, graph = self._graph
            if graph is None or version != self.version:
                graph = build_link_graph(self.files, self.resolver())
                self._graph = (self.version, graph)
            return graph

    def resolver(self) -> LinkResolver:
        """The link resolver over the notes in the view (rebuilt only when the set of names changed)."""
        with self.mutex:
            if self._resolver is None:
                self._resolver = make_resolver(self.files)
            return self._resolver

    # ---- persistence ---------------------------------------------------------------------------------------------

    def load(self, path: Path, params: dict[str, Any]) -> bool:
        """Start from the BM25 pickle if it was built with the same parameters; False (view stays empty) otherwise."""
        try:
            index, meta = load_index(path)
        except FileNotFoundError:
            return False
        except IndexFormatError as e:
            logger.warning("%s", e)
            return False
        if meta.get("params") != params:
            logger.info("the BM25 index was built with other parameters; rebuilding it from the notes")
            return False
        with self.mutex:
            self.bm25, self.files, self.chunks = index, _with_link_rows(meta["files"]), meta["chunks"]
            self.content_ids = {}
            for cid, c in self.chunks.items():
                self.content_ids.setdefault(c.content, set()).add(cid)
            self.anchor_text = AnchorText()
            self.anchor_text.by_note = dict(meta.get("anchors", {}))
            self._resolver, self._links_dirty = None, set()
            self._linking = sum(1 for r in self.files.values() if r.links)
            self.version += 1
            self._saved_version = self.version
            self.tokenizer.set_user_terms(meta.get("user_terms", ()))
        return True

    def save(self, path: Path, params: dict[str, Any]) -> None:
        """Persist the view as the BM25 pickle (atomic), so the next process starts from it."""
        with self.mutex:
            self._saved_version = self.version
            meta = {
                "params": params,
                "files": dict(self.files),
                "chunks": dict(self.chunks),
                "user_terms": sorted(self.tokenizer.user_terms),
                "anchors": dict(self.anchor_text.by_note),
            }
            save_index(self.bm25, path, meta)

    def clear(self) -> None:
        with self.mutex:
            self.files, self.chunks, self.content_ids, self.bm25 = {}, {}, {}, BM25Index()
            self.anchor_text, self._resolver, self._links_dirty, self._linking = AnchorText(), None, set(), 0
            self.version += 1
            self.tokenizer.set_user_terms(())

    # ---- changes -------------------------------------------------------------------------------------------------

    def stat_map(self) -> dict[str, tuple[int, int, int, int]]:
        """{path: change signature (kb_scan.Stat)} of every note in the view (cached until the next change)."""
        version, stats = self._stats
        if version != self.version:
            stats = {p: r.stat for p, r in self.files.items()}
            self._stats = (self.version, stats)
        return stats

    def set_record(self, path: str, record: FileRecord) -> None:
        """Replace a note's record without touching its chunks (same content, new stat)."""
        self.files[path] = record
        self.version += 1

    def put(self, path: str, record: FileRecord | None, chunks: Sequence[ChunkRecord]) -> None:
        """Replace a note and its chunks (None: the note is gone)."""
        self.version += 1
        old = self.files.pop(path, None)
        self._links_dirty.add(path)
        self._linking += bool(record and record.links) - bool(old and old.links)
        if old is None or record is None or (old.aliases, bool(old.skipped)) != (record.aliases, bool(record.skipped)):
            self._resolver = None  # the names links resolve to changed
        for cid in old.chunks if old else ():
            self.bm25.remove(cid)
            c = self.chunks.pop(cid, None)
            if c is not None:
                ids = self.content_ids.get(c.content)
                if ids is not None:
                    ids.discard(cid)
                    if not ids:
                        del self.content_ids[c.content]
        if record is None:
            return
        self.files[path] = record
        for c in chunks:
            self.chunks[c.id] = c
            self.content_ids.setdefault(c.content, set()).add(c.id)
            self.bm25.add(c.id, self.tokens(c, record))

    def tokens(self, c: ChunkRecord, rec: FileRecord | None) -> list[str]:
        """A chunk's BM25 tokens: its text, then its title, heading path, tags and aliases `metadata_weight` times,
        then the anchor text of links to its note ANCHOR_TEXT_WEIGHT times."""
        meta = self._cached_tokens(" ".join([c.context, *(rec.tags if rec else ()), *(rec.aliases if rec else ())]))
        anchors = self.anchor_text.by_note.get(c.path)
        extra = self._cached_tokens(" ".join(anchors)) * self.anchor_weight if anchors else []
        return self.tokenizer.tokenize(c.text) + meta * self.metadata_weight + extra

    def _cached_tokens(self, meta: str) -> list[str]:
        meta_tokens = self._meta_tokens.get(meta)
        if meta_tokens is None:  # every chunk of a section repeats its title, heading path and tags: tokenize once
            if len(self._meta_tokens) > META_TOKEN_CACHE:
                self._meta_tokens.clear()
            meta_tokens = self._meta_tokens[meta] = self.tokenizer.tokenize(meta)
        return meta_tokens

    def refresh_anchors(self) -> int:
        """Bring anchor text up to date after notes were put; re-tokenize the chunks of notes whose anchors changed
        (a link added, edited or gone, or a note that now takes a name over). Returns how many notes."""
        dirty, self._links_dirty = self._links_dirty, set()
        if self.anchor_weight <= 0:
            return 0
        if not self.anchor_text.by_note and not self._linking:
            self.anchor_text = AnchorText()  # no links anywhere: nothing to resolve or keep
            return 0
        changed = self.anchor_text.update(self.files, self.resolver(), dirty)
        for path in changed:
            rec = self.files.get(path)
            for cid in rec.chunks if rec else ():
                c = self.chunks.get(cid)
                if c is not None:
                    self.bm25.add(cid, self.tokens(c, rec))
        return len(changed)

    def refresh_user_terms(self, adding: Iterable[FileRecord] = ()) -> None:
        """Vault titles, aliases and tags become single jieba tokens; re-tokenize only the chunks they occur in.

        With `adding`, the terms of notes about to be indexed join the dictionary first (none leave), so a big sync
        tokenizes its new chunks once with the final dictionary instead of twice.
        """
        records = list(adding)
        if records:
            terms = set(self.tokenizer.user_terms) | {t for r in records for t in (r.title, *r.aliases, *r.tags) if t}
        else:
            terms = {t for r in self.files.values() for t in (r.title, *r.aliases, *r.tags) if t}
        changed = self.tokenizer.set_user_terms(terms)
        if not changed:
            return
        self._meta_tokens.clear()
        pattern = re.compile("|".join(re.escape(t) for t in sorted(changed, key=len, reverse=True)))
        for cid, c in list(self.chunks.items()):
            rec = self.files.get(c.path)
            hay = " ".join([c.text, c.context, *(rec.tags if rec else ()), *(rec.aliases if rec else ())]).lower()
            if pattern.search(hay):
                self.bm25.add(cid, self.tokens(c, rec))
