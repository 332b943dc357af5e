"""The in-memory view a process searches: notes, chunks and their BM25 index, with the vault's terms in jieba.

Built from notes on disk (or the BM25 pickle saved by an earlier process), changed one note at a time by the engine.
Imports kb_config, kb_state, kb_text and bm25_index.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bm25_index import BM25Index, load_index, save_index
from kb_config import IndexFormatError
from kb_links import LinkResolver
from kb_state import ChunkRecord, FileRecord, LinkRow
from kb_text import Tokenizer

logger = logging.getLogger(__name__)

# Distinct metadata strings whose tokens are cached (cleared when full or when the dictionary changes).
META_TOKEN_CACHE = 50_000


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


def build_link_graph(files: dict[str, FileRecord]) -> LinkGraph:
    """Resolve every stored link against the notes in `files` (links into the same note are not backlinks)."""
    notes = {p: r for p, r in files.items() if not r.skipped}
    resolver = LinkResolver(notes, {p: r.aliases for p, r in notes.items() if r.aliases})
    outgoing: dict[str, list[tuple[LinkRow, str | None]]] = {}
    backlinks: dict[str, list[tuple[str, LinkRow]]] = {}
    unresolved: dict[str, list[LinkRow]] = {}
    for path, rec in notes.items():
        for row in rec.links:
            target = resolver.resolve(row[0], path).path if row[0] else path
            outgoing.setdefault(path, []).append((row, target))
            if target is None:
                unresolved.setdefault(path, []).append(row)
            elif target != path:
                backlinks.setdefault(target, []).append((path, row))
    return LinkGraph(resolver, outgoing, backlinks, unresolved, resolver.ambiguous_names())


class IndexView:
    """Notes (`files`), chunks and BM25 as this process sees them; every change goes through `put` or `set_record`.

    `mutex` guards all of it against the server's search threads. `content_ids` maps a chunk's content hash to the
    chunks holding that text, so a vector found by content leads back to chunks.
    """

    def __init__(self, tokenizer: Tokenizer, metadata_weight: int) -> None:
        self.tokenizer = tokenizer
        self.metadata_weight = metadata_weight
        self.mutex = threading.RLock()
        self.files: dict[str, FileRecord] = {}
        self.chunks: dict[str, ChunkRecord] = {}
        self.content_ids: dict[str, set[str]] = {}
        self.bm25 = BM25Index()
        self.version = 0  # bumped on every change; keys the cached stat map
        self._saved_version = -1  # the version the BM25 pickle on disk holds
        self._stats: tuple[int, dict[str, tuple[int, int]]] = (-1, {})
        self._meta_tokens: dict[str, list[str]] = {}
        self._graph: tuple[int, LinkGraph | None] = (-1, None)

    @property
    def changed_since_save(self) -> bool:
        return self.version != self._saved_version

    def link_graph(self) -> LinkGraph:
        """The resolved links of the notes in the view (rebuilt after any change; dictionary lookups only)."""
        with self.mutex:
            version, graph = self._graph
            if graph is None or version != self.version:
                graph = build_link_graph(self.files)
                self._graph = (self.version, graph)
            return graph

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
            self.bm25, self.files, self.chunks = index, meta["files"], meta["chunks"]
            self.content_ids = {}
            for cid, c in self.chunks.items():
                self.content_ids.setdefault(c.content, set()).add(cid)
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
            }
            save_index(self.bm25, path, meta)

    def clear(self) -> None:
        with self.mutex:
            self.files, self.chunks, self.content_ids, self.bm25 = {}, {}, {}, BM25Index()
            self.version += 1
            self.tokenizer.set_user_terms(())

    # ---- changes -------------------------------------------------------------------------------------------------

    def stat_map(self) -> dict[str, tuple[int, int]]:
        """{path: (mtime_ns, size)} of every note in the view (cached until the next change)."""
        version, stats = self._stats
        if version != self.version:
            stats = {p: (r.mtime_ns, r.size) for p, r in self.files.items()}
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
        """A chunk's BM25 tokens: its text, then its title, heading path, tags and aliases `metadata_weight` times."""
        meta = " ".join([c.context, *(rec.tags if rec else ()), *(rec.aliases if rec else ())])
        meta_tokens = self._meta_tokens.get(meta)
        if meta_tokens is None:  # every chunk of a section repeats its title, heading path and tags: tokenize once
            if len(self._meta_tokens) > META_TOKEN_CACHE:
                self._meta_tokens.clear()
            meta_tokens = self._meta_tokens[meta] = self.tokenizer.tokenize(meta)
        return self.tokenizer.tokenize(c.text) + meta_tokens * self.metadata_weight

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
