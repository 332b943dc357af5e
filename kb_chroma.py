"""Vectors in a Chroma server (`vector_store.mode: http`), for big indexes and indexes shared across machines.

The same interface as kb_store.VectorStore, so the engine does not know which one it has. One collection per vault
and model, one record per content hash (a text embedded once serves every chunk that holds it). Every chromadb
error is translated here into VectorStoreUnavailableError, which the engine and search turn into a keyword-only
answer with a note. The only module that imports chromadb. Imports: kb_config.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from kb_config import Config, IndexFormatError, VectorStoreUnavailableError

logger = logging.getLogger(__name__)

# Chroma caps one call at about this many records; larger calls are split.
CHROMA_BATCH = 4000
# Marker prefix of the "segments" an http store reports: each write makes a new one, so state.json's commit tells
# every process that the vectors changed (Chroma itself is shared; nothing is loaded from files).
GENERATION_PREFIX = "chroma-"
# Chroma limits collection names to 3-512 characters from this set.
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


def collection_name(cfg: Config, model: str) -> str:
    """`<prefix><vault>-<model>-<hash of both>`: vaults and models never share a collection."""
    vault = cfg.index_dir.name
    key = hashlib.sha1(f"{cfg.kb_dir}\0{model}".encode()).hexdigest()[:10]
    name = f"{cfg.chroma_prefix}{_NAME_RE.sub('_', vault)[:40]}-{_NAME_RE.sub('_', model)[:40]}-{key}"
    return name.strip("._-") if len(name) >= 3 else f"kb-{key}"


class ChromaVectorStore:
    """A collection on a Chroma server (chromadb.HttpClient), reached lazily; thread-safe."""

    def __init__(self, cfg: Config, model: str) -> None:
        self.cfg = cfg
        self.name = collection_name(cfg, model)
        self.where = f"{'https' if cfg.chroma_ssl else 'http'}://{cfg.chroma_host}:{cfg.chroma_port}"
        self._lock = threading.RLock()
        self._collection: Any = None
        self._segments: tuple[str, ...] = ()
        self._known: set[str] | None = None  # content hashes stored, fetched once per generation
        self._dim = 0

    # ---- the connection -----------------------------------------------------------------------------------------

    @contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except (VectorStoreUnavailableError, IndexFormatError):
            raise
        except Exception as e:  # chromadb raises many types (connection, HTTP status, server errors)
            with self._lock:
                self._collection = None  # reconnect next time: the server may have restarted
            raise VectorStoreUnavailableError(
                f"the Chroma server at {self.where} failed while {what} ({type(e).__name__}: {str(e)[:200]}); "
                "check that `chroma run` is up and vector_store.host/port/ssl/headers are right. Keyword search keeps "
                "working; vectors are caught up by the next sync"
            ) from e

    def _open(self) -> Any:
        with self._lock:
            if self._collection is None:
                try:
                    import chromadb
                    from chromadb.config import Settings
                except ImportError as e:
                    raise VectorStoreUnavailableError(
                        f"vector_store.mode http needs Chroma's client, which is not installed ({e}); run: "
                        "pip install -r requirements-chroma.txt (from the clone; installed with pipx: "
                        "pipx inject second-brain-mcp -r requirements-chroma.txt)"
                    ) from e
                with self._translated("connecting"):
                    client = chromadb.HttpClient(
                        host=self.cfg.chroma_host,
                        port=self.cfg.chroma_port,
                        ssl=self.cfg.chroma_ssl,
                        headers=dict(self.cfg.chroma_headers),
                        settings=Settings(anonymized_telemetry=False),
                    )
                    self._collection = client.get_or_create_collection(
                        self.name, metadata={"hnsw:space": "cosine"}, embedding_function=None
                    )
            return self._collection

    # ---- what the engine reads -----------------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[str, ...]:
        return self._segments

    @property
    def dim(self) -> int:
        return self._dim

    def _keys(self) -> set[str]:
        with self._lock:
            if self._known is None:
                col = self._open()
                known: set[str] = set()
                with self._translated("listing vectors"):
                    offset = 0
                    while True:
                        page = col.get(include=[], limit=CHROMA_BATCH, offset=offset)["ids"]
                        known.update(page)
                        if len(page) < CHROMA_BATCH:
                            break
                        offset += CHROMA_BATCH
                self._known = known
            return self._known

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, content: object) -> bool:
        return content in self._keys()

    def missing(self, contents: Iterable[str]) -> list[str]:
        known = self._keys()
        return [c for c in dict.fromkeys(contents) if c not in known]

    def load(self, names: Sequence[str]) -> None:
        """Adopt state.json's generation marker: when it changed, another process wrote; re-list the keys."""
        with self._lock:
            if tuple(names) != self._segments:
                self._segments = tuple(names)
                self._known = None

    # ---- writing (under the engine's index lock) ------------------------------------------------------------------

    def write_segment(self, vectors: dict[str, Sequence[float]]) -> tuple[str, ...]:
        with self._lock:
            new = {k: v for k, v in vectors.items() if k not in self._keys()}
            if not new:
                return self._segments
            col = self._open()
            ids = list(new)
            with self._translated("storing vectors"):
                for i in range(0, len(ids), CHROMA_BATCH):
                    part = ids[i : i + CHROMA_BATCH]
                    col.upsert(ids=part, embeddings=[list(map(float, new[k])) for k in part])
            self._keys().update(ids)
            return (f"{GENERATION_PREFIX}{uuid.uuid4().hex[:16]}",)

    def compacted(self, live: set[str]) -> tuple[str, ...] | None:
        """Delete vectors no chunk references; returns a new generation marker when something was deleted."""
        with self._lock:
            dead = sorted(self._keys() - live)
            if not dead:
                return None
            col = self._open()
            with self._translated("deleting vectors"):
                for i in range(0, len(dead), CHROMA_BATCH):
                    col.delete(ids=dead[i : i + CHROMA_BATCH])
            self._keys().difference_update(dead)
            return (f"{GENERATION_PREFIX}{uuid.uuid4().hex[:16]}",)

    def remove_unlisted(self, listed: Iterable[str]) -> None:
        """Nothing to sweep: a Chroma server holds no files of ours (dead vectors go through `compacted`)."""

    def clear(self) -> None:
        with self._lock:
            col = self._open()
            with self._translated("clearing the collection"):
                ids = sorted(self._keys())
                for i in range(0, len(ids), CHROMA_BATCH):
                    col.delete(ids=ids[i : i + CHROMA_BATCH])
            self._known = set()

    # ---- searching ---------------------------------------------------------------------------------------------------

    def _get(self, contents: Sequence[str]) -> dict[str, np.ndarray]:
        col = self._open()
        out: dict[str, np.ndarray] = {}
        with self._translated("reading vectors"):
            for i in range(0, len(contents), CHROMA_BATCH):
                got = col.get(ids=list(contents[i : i + CHROMA_BATCH]), include=["embeddings"])
                for cid, emb in zip(got["ids"], got["embeddings"]):
                    out[cid] = np.asarray(emb, dtype=np.float32)
        if out:
            self._dim = len(next(iter(out.values())))
        return out

    def vector(self, content: str) -> np.ndarray | None:
        return self._get([content]).get(content)

    def cosines(self, query: Sequence[float], contents: Sequence[str]) -> dict[str, float]:
        q = np.asarray(query, dtype=np.float32)
        got = self._get(list(dict.fromkeys(contents)))
        if got and len(next(iter(got.values()))) != q.size:
            raise IndexFormatError(
                f"the Chroma collection {self.name} holds vectors of another size than the query; run "
                "`python ingest.py --rebuild` to re-embed with the configured model"
            )
        return {c: float(v @ q) for c, v in got.items()}

    def nearest_many(self, queries: Sequence[Sequence[float]], ns: Sequence[int]) -> list[list[tuple[str, float]]]:
        """`nearest` for each query (one request each: the server does the scan)."""
        return [self.nearest(q, n) for q, n in zip(queries, ns)]

    def nearest(self, query: Sequence[float], n: int) -> list[tuple[str, float]]:
        if n <= 0:
            return []
        col = self._open()
        with self._translated("searching"):
            total = col.count()
            if not total:
                return []
            res = col.query(query_embeddings=[list(map(float, query))], n_results=min(n, total), include=["distances"])
        return [(cid, 1.0 - float(d)) for cid, d in zip(res["ids"][0], res["distances"][0])]
