"""The bundled models' forward passes as onnxruntime graphs, written here from the models' own weights: no onnx
package, no torch, no download. A graph is built once per user into the cache folder (an .onnx file), checked by its
model against its numpy pass, then opened by every process. Where onnxruntime is missing a model stays in numpy.

Owns the ONNX writer (the protobuf wire format of the few messages a graph needs), the graphs (the BERT encoder of
all-MiniLM-L6-v2; USE's token-level layers) and the sessions. Imports: kb_files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import math
import struct
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kb_files import atomic_write_bytes, drop_older_caches

logger = logging.getLogger(__name__)

# How to install the runtime when it is missing (requirements.txt pins it).
ORT_INSTALL_HINT = "pip install -r requirements.txt (onnxruntime)"
# ONNX TensorProto data types by numpy dtype.
ONNX_TYPES = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int32): 6, np.dtype(np.int64): 7}
# AttributeProto types: FLOAT, INT, STRING, INTS.
ATTR_FLOAT, ATTR_INT, ATTR_STRING, ATTR_INTS = 1, 2, 3, 7
# The IR version and opsets the graphs are written for (onnxruntime 1.17 and later read them).
IR_VERSION = 8
OPSETS = (("", 17), ("com.microsoft", 1))
# Bump when a graph's layout changes: the cached file is then rebuilt.
GRAPH_LAYOUT = 6
# The largest int8 value: symmetric quantization, so -127..127 (zero point 0)...
INT8_MAX = 127
INV_INT8_MAX = np.array(1.0 / INT8_MAX, dtype=np.float32)
# ...held as uint8 around this zero point for the integer product's input.
U8_ZERO = 128
# Cache file names: prefix, model, layout, what it was built from.
GRAPH_PREFIX = "ort-"
# A newly built int8 graph is used only if each check text's vector has at least this cosine to the numpy pass's
# (measured: 0.982 the lowest of 240 hello-algo chunks; a miswired graph gives ~0.1-0.5).
MIN_GRAPH_COSINE = 0.97
# What a session is told: errors only (its warnings would go to stderr in every process).
ORT_LOG_ERRORS = 3
# onnxruntime's graph rewrites a session leaves out (open_session says why).
UNFUSED = ["SkipLayerNormFusion"]
# A run with this option ends by freeing the regions of the CPU arena no tensor holds (release_arena).
SHRINK_ARENA = ("memory.enable_memory_arena_shrinkage", "cpu:0")


# ---- the ONNX writer ------------------------------------------------------------------------------------------------
# Field numbers are onnx.proto's (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto).


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values as protobuf writes them: ten bytes, two's complement
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int_field(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _len_field(field: int, data: bytes | str) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _varint(field << 3 | 2) + _varint(len(raw)) + raw


def tensor_proto(name: str, array: np.ndarray) -> bytes:
    """A TensorProto holding `array` (little-endian raw data)."""
    array = np.ascontiguousarray(array)
    raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    dims = b"".join(_int_field(1, d) for d in array.shape)
    return dims + _int_field(2, ONNX_TYPES[array.dtype]) + _len_field(8, name) + _len_field(9, raw)


def _attribute(name: str, value: float | int | str | Sequence[int]) -> bytes:
    out = _len_field(1, name)
    if isinstance(value, float):
        return out + _varint(2 << 3 | 5) + struct.pack("<f", value) + _int_field(20, ATTR_FLOAT)
    if isinstance(value, int):
        return out + _int_field(3, value) + _int_field(20, ATTR_INT)
    if isinstance(value, str):
        return out + _len_field(4, value) + _int_field(20, ATTR_STRING)
    return out + b"".join(_int_field(8, v) for v in value) + _int_field(20, ATTR_INTS)


def node_proto(op: str, inputs: Sequence[str], outputs: Sequence[str], domain: str = "", **attrs: Any) -> bytes:
    """A NodeProto; an empty input name is an omitted optional input."""
    out = b"".join(_len_field(1, i) for i in inputs) + b"".join(_len_field(2, o) for o in outputs) + _len_field(4, op)
    out += b"".join(_len_field(5, _attribute(k, v)) for k, v in attrs.items())
    return out + (_len_field(7, domain) if domain else b"")


def value_info(name: str, dtype: Any, dims: Sequence[int | str]) -> bytes:
    """A ValueInfoProto for a graph input or output: a tensor of `dtype`, each dim a size or a symbolic name."""
    shape = b"".join(_len_field(1, _int_field(1, d) if isinstance(d, int) else _len_field(2, d)) for d in dims)
    tensor_type = _int_field(1, ONNX_TYPES[np.dtype(dtype)]) + _len_field(2, shape)
    return _len_field(1, name) + _len_field(2, _len_field(1, tensor_type))


class GraphWriter:
    """Nodes and initializers of one graph, then the ModelProto's bytes.

    Example: g = GraphWriter(); w = g.const("w", np.eye(2, dtype=np.float32)); g.op("MatMul", ["x", w], ["y"])
    """

    def __init__(self) -> None:
        self.nodes: list[bytes] = []
        self.inits: list[bytes] = []
        self._n = 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(tensor_proto(name, array))
        return name

    def op(self, op: str, inputs: Sequence[str], outputs: Sequence[str] | None = None, domain: str = "", **attrs: Any) -> str:
        """Append a node; returns its (first) output's name, made up when `outputs` is None."""
        if outputs is None:
            self._n += 1
            outputs = [f"{op.lower()}_{self._n}"]
        self.nodes.append(node_proto(op, inputs, outputs, domain, **attrs))
        return outputs[0]

    def model(
        self, inputs: Sequence[bytes], outputs: Sequence[bytes], name: str, opsets: Sequence[tuple[str, int]] = OPSETS
    ) -> bytes:
        graph = b"".join(_len_field(1, n) for n in self.nodes) + _len_field(2, name)
        graph += b"".join(_len_field(5, t) for t in self.inits)
        graph += b"".join(_len_field(11, v) for v in inputs) + b"".join(_len_field(12, v) for v in outputs)
        sets = b"".join(_len_field(8, _len_field(1, d) + _int_field(2, v)) for d, v in opsets)
        return _int_field(1, IR_VERSION) + sets + _len_field(2, "second-brain-mcp") + _len_field(7, graph)


# ---- the graphs -----------------------------------------------------------------------------------------------------


def int8_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A weight matrix (in, out) as int8 per output column, symmetric: (int8 matrix, float32 scale per column)."""
    scale = np.maximum(np.abs(w).max(axis=0), np.float32(1e-12)) / np.float32(INT8_MAX)
    return np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8), scale.astype(np.float32)


def minilm_graph(tensors: Mapping[str, np.ndarray], n_layers: int, heads: int, eps: float, int8: bool = True) -> bytes:
    """The BERT encoder layers of a checkpoint (all-MiniLM-L6-v2's tensor names): `hidden` (texts, tokens, width),
    the embeddings' LayerNorm already applied, and `lengths` (texts,) int32, each text's tokens from the left; out
    `last` (texts, tokens, width), the last layer's states (a padded position's are junk). The int8 graph takes one
    text a run (texts = 1): its inputs are quantized by QuantizeLinear with a scale per token along axis 1 (one pass
    instead of Div, Round, Add and Cast: the same bytes, 3-10% faster on 400 hello-algo chunks).

    `int8`: every weight product in int8 (symmetric, per output column for the weights, per token for the input,
    both quantized in the graph): 2.0x the float32 products on 240 hello-algo chunks, one query 2.1 ms against 10.5,
    at cosine 0.998 mean (0.996 lowest) to the float vectors; 256 dev questions 0.997 (0.988). Quantizing the input
    over the whole tensor instead (onnxruntime's DynamicQuantizeMatMul) was as fast but 0.994 (0.982), and lost
    0.008 NDCG@5 on tldr. Without `int8` the graph is float32 (the numpy pass's arithmetic, to ~1e-7: the test of the
    graph's wiring)."""
    g = GraphWriter()

    def f32(name: str) -> np.ndarray:
        return np.asarray(tensors[name], dtype=np.float32)

    ones: dict[str, str] = {}  # constants the int8 products share

    def const(name: str, value: np.ndarray) -> str:
        if name not in ones:
            ones[name] = g.const(name, value)
        return ones[name]

    def matmul(x: str, name: str, w: np.ndarray) -> str:
        if not int8:
            return g.op("MatMul", [x, g.const(name, w)])
        # Weights: int8 per output column. Input: int8 per token (its own scale, so the few tokens whose states run
        # far larger, [CLS] and [SEP] among them, cost the others no precision), held as uint8 around 128: u8 x s8 is
        # the integer product x86 runs fastest.
        q, w_scale = int8_columns(w)
        peak = g.op("ReduceMax", [g.op("Abs", [x])], axes=[-1], keepdims=1)
        s = g.op("Mul", [g.op("Max", [peak, const("tiny", np.array(1e-12, np.float32))]), const("inv_max", INV_INT8_MAX)])
        # round(x / s) + 128 as uint8 in one pass: a scale per token along axis 1 (one text per run, so texts is 1)
        per_token = g.op("Reshape", [s, const("flat", np.array([-1], np.int64))])
        if "token_zeros" not in ones:
            ones["token_zeros"] = g.op("Expand", [const("u8_zero", np.array(U8_ZERO, np.uint8)), g.op("Shape", [per_token])])
        xq = g.op("QuantizeLinear", [x, per_token, ones["token_zeros"]], axis=1)
        y = g.op("MatMulInteger", [xq, g.const(name, q), const("u8_zero", np.array(U8_ZERO, np.uint8))])
        y = g.op("Cast", [y], to=ONNX_TYPES[np.dtype(np.float32)])
        return g.op("Mul", [g.op("Mul", [y, s]), g.const(f"{name}.scale", w_scale)])

    def add_norm(y: str, skip: str, name: str, prefix: str, outputs: list[str] | None = None) -> str:
        """LayerNorm(y + dense bias + skip) with the checkpoint's `prefix` dense.bias and LayerNorm weights."""
        weights = [g.const(f"{name}_{t}", f32(f"{prefix}LayerNorm.{w}")) for t, w in (("g", "weight"), ("b", "bias"))]
        bias = g.const(f"{name}_dense_b", f32(f"{prefix}dense.bias"))
        summed = g.op("Add", [g.op("Add", [y, bias]), skip])
        return g.op("LayerNormalization", [summed, *weights], outputs, axis=-1, epsilon=eps)

    width = f32("encoder.layer.0.attention.self.query.weight").shape[0]
    scale = np.float32(1.0 / math.sqrt(width // heads))  # folded into the query projection
    split = g.const("split_qkv", np.array([width] * 3, dtype=np.int64))
    x = "hidden"
    for i in range(n_layers):
        p, a = f"encoder.layer.{i}.", f"encoder.layer.{i}.attention.self."
        qkv_w = np.concatenate([f32(a + "query.weight") * scale, f32(a + "key.weight"), f32(a + "value.weight")]).T
        qkv_b = np.concatenate([f32(a + "query.bias") * scale, f32(a + "key.bias"), f32(a + "value.bias")])
        qkv = matmul(x, f"l{i}.qkv_w", qkv_w)
        qkv = g.op("Add", [qkv, g.const(f"l{i}.qkv_b", qkv_b)])
        q, k, v = f"l{i}.q", f"l{i}.k", f"l{i}.v"
        g.op("Split", [qkv, split], [q, k, v], axis=2)
        ctx = g.op("MultiHeadAttention", [q, k, v, "", "lengths", "bias"], domain="com.microsoft", num_heads=heads, scale=1.0)
        att = matmul(ctx, f"l{i}.out_w", f32(p + "attention.output.dense.weight").T)
        h1 = add_norm(att, x, f"l{i}.ln1", p + "attention.output.")
        inner = matmul(h1, f"l{i}.ff1_w", f32(p + "intermediate.dense.weight").T)
        inner = g.op("BiasGelu", [inner, g.const(f"l{i}.ff1_b", f32(p + "intermediate.dense.bias"))], domain="com.microsoft")
        y = matmul(inner, f"l{i}.ff2_w", f32(p + "output.dense.weight").T)
        x = add_norm(y, h1, f"l{i}.ln2", p + "output.", ["last"] if i == n_layers - 1 else None)
    inputs = [
        value_info("hidden", np.float32, ["texts", "tokens", width]),
        value_info("lengths", np.int32, ["texts"]),
        value_info("bias", np.float32, [1, 1, "tokens", "tokens"]),
    ]
    return g.model(inputs, [value_info("last", np.float32, ["texts", "tokens", width])], "minilm")


def use_graph(params: Mapping[str, Any], table_zero: int, orders: Sequence[tuple[int, int]], width: int) -> bytes:
    """The token-level part of the USE multilingual v3 encoder (the wheel's NumpyBackend, its attribute names in
    `params`) in int8, for several texts' tokens laid end to end. In: `rows` (tokens, 512) uint8, each token's row of
    the quantized embedding table, with `row_scale` and `row_low` (tokens, 1) float32 its chunk's dequantization
    (row * scale + low); `windows` (tokens, widest n-gram) int64, each token's neighbours (the wheel's _window_index:
    a slot outside the token's text holds `tokens`, a zero row); `text_of` (tokens, 1) and `text_of_flat` (tokens,)
    int64, each token's text; `text_zeros` (texts, 1) float32 zeros. Out: `feats` (tokens, 512 + 3 x `width`), the
    layer-normed features each text's vector is pooled from.

    The embedding's projection multiplies the table's uint8 rows themselves, around `table_zero` (the table's
    typical value: the rows vary by a few units around ~30, so a product of the raw rows would lose their
    differences to int8 weights' rounding), and adds the zero point's and the chunk's offset exactly. Each n-gram
    convolution quantizes its input once per text (one scale for all of a text's tokens, so a window's bytes share
    it, and a text's vector does not depend on the texts run beside it), then gathers the windows as bytes. 2.6x the
    numpy pass on 400 hello-algo chunks, at cosine 0.99983 mean (0.9987 lowest) to its vectors. Opset 18
    (ScatterElements' max).
    """
    g = GraphWriter()
    shared: dict[str, str] = {}

    def const(name: str, value: np.ndarray) -> str:
        if name not in shared:
            shared[name] = g.const(name, value)
        return shared[name]

    def f32(name: str, i: int | None = None) -> np.ndarray:
        return np.asarray(params[name] if i is None else params[name][i], dtype=np.float32)

    def layer_norm(x: str, gamma: str, beta: str, outputs: list[str] | None = None) -> str:
        weights = [g.const(gamma, f32(gamma)), g.const(beta, f32(beta))]
        return g.op("LayerNormalization", [x, *weights], outputs, axis=-1, epsilon=float(params["eps"]))

    def ints(name: str, *values: int) -> str:
        return const(name, np.array(values, dtype=np.int64))

    # The embedding (for the features) and its projection (for the convolutions).
    f32_type = ONNX_TYPES[np.dtype(np.float32)]
    rows = g.op("Cast", ["rows"], to=f32_type)
    emb = g.op("Add", [g.op("Mul", [rows, "row_scale"]), "row_low"])
    proj = f32("proj_W")
    q, w_scale = int8_columns(proj)
    y = g.op("MatMulInteger", ["rows", g.const("proj_q", q), g.const("proj_zero", np.array(table_zero, np.uint8))])
    y = g.op("Mul", [g.op("Mul", [g.op("Cast", [y], to=f32_type), g.const("proj_s", w_scale)]), "row_scale"])
    offset = g.op("Add", ["row_low", g.op("Mul", ["row_scale", g.const("zero_f", np.array(table_zero, np.float32))])])
    offset = g.op("Mul", [offset, g.const("proj_colsum", proj.sum(axis=0, keepdims=True))])
    x = layer_norm(g.op("Add", [g.op("Add", [y, offset]), g.const("proj_b", f32("proj_b"))]), "ln_g_all", "ln_b_all")

    widest = max(left for _, left in orders)  # the windows' columns: the widest left context first
    span = widest + 1 + max(n - 1 - left for n, left in orders)
    zero_row = ints("zero_row_shape", 1, width)

    def conv(inp: str, name: str, w: np.ndarray, bias: np.ndarray, cols: str, n: int) -> str:
        """relu(windows of `inp` x w + bias): `inp` quantized once per text, its windows gathered as bytes."""
        peak = g.op("ReduceMax", [g.op("Abs", [inp]), ints("last_axis", -1)], keepdims=1)  # opset 18: axes an input
        peak = g.op("ScatterElements", ["text_zeros", "text_of", peak], axis=0, reduction="max")
        scale = g.op("Mul", [g.op("Max", [peak, const("tiny", np.array(1e-12, np.float32))]), const("inv_max", INV_INT8_MAX)])
        scale = g.op("Gather", [scale, "text_of_flat"], axis=0)
        flat_scale = g.op("Reshape", [scale, ints("minus_one", -1)])
        zeros = g.op("Expand", [const("u8_zero", np.array(U8_ZERO, np.uint8)), g.op("Shape", ["text_of_flat"])])
        xq = g.op("QuantizeLinear", [inp, flat_scale, zeros], axis=0)
        pad = g.op("Expand", [const("u8_zero", np.array(U8_ZERO, np.uint8)), zero_row])
        windows = g.op("Gather", [g.op("Concat", [xq, pad], axis=0), cols], axis=0)
        windows = g.op("Reshape", [windows, ints(f"shape_{n}", -1, n * width)])
        q, w_scale = int8_columns(w)
        y = g.op("MatMulInteger", [windows, g.const(name, q), const("u8_zero", np.array(U8_ZERO, np.uint8))])
        y = g.op("Mul", [g.op("Mul", [g.op("Cast", [y], to=f32_type), scale]), g.const(f"{name}.scale", w_scale)])
        return g.op("Relu", [g.op("Add", [y, g.const(f"{name}.bias", bias)])])

    feats = [emb]
    for i, (n, left) in enumerate(orders):
        xs = g.op("Slice", [x, ints(f"from_{i}", i * width), ints(f"to_{i}", (i + 1) * width), ints("axis_1", 1)])
        cols = g.op(
            "Slice", ["windows", ints(f"first_{i}", widest - left), ints(f"last_{i}", widest - left + n), ints("axis_1", 1)]
        )
        h = g.op("Add", [conv(xs, f"w1_{i}", f32("w1", i), f32("b1", i), cols, n), xs])
        feats.append(g.op("Add", [conv(h, f"w2_{i}", f32("w2", i), f32("b2", i), cols, n), h]))
    layer_norm(g.op("Concat", feats, axis=1), "ln_g", "ln_b", ["feats"])
    dim = int(proj.shape[0])
    inputs = [
        value_info("rows", np.uint8, ["tokens", dim]),
        value_info("row_scale", np.float32, ["tokens", 1]),
        value_info("row_low", np.float32, ["tokens", 1]),
        value_info("windows", np.int64, ["tokens", span]),
        value_info("text_of", np.int64, ["tokens", 1]),
        value_info("text_of_flat", np.int64, ["tokens"]),
        value_info("text_zeros", np.float32, ["texts", 1]),
    ]
    return g.model(inputs, [value_info("feats", np.float32, ["tokens", dim + len(orders) * width])], "use", (("", 18),))


# ---- sessions -------------------------------------------------------------------------------------------------------

_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


@functools.cache
def runtime_version() -> str | None:
    """onnxruntime's version, or None where it is not installed (found without importing it; 0.5 ms, so once)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return None


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log a warning once per process (a fallback every embedder of the process shares)."""
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logger.warning(message, *args)


def cached_graph(cache_dir: Path | None, model: str, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool, Path | None]:
    """The graph of `model` built from what `key` names: its bytes, whether it was built now (so not yet checked) and
    its cache file (None: not cached). The file's name holds the layout and onnxruntime's version (either changing
    rebuilds it) and the sha256 of its bytes, checked before they are used: a torn or altered file is rebuilt."""
    if cache_dir is None:
        return build(), True, None
    stem = f"{GRAPH_PREFIX}{model}-l{GRAPH_LAYOUT}-{key}-ort{runtime_version() or 'none'}-"
    for found in sorted(cache_dir.glob(f"{stem}*.onnx")) if cache_dir.is_dir() else ():
        try:
            data = found.read_bytes()
        except OSError as e:
            logger.info("rebuilding the %s graph: cannot read %s (%s)", model, found, e)
            break
        if hashlib.sha256(data).hexdigest() == found.name[len(stem) : -len(".onnx")]:
            return data, False, found
        logger.info("rebuilding the %s graph: %s does not hold the bytes its name's digest says", model, found)
        drop_graph(found)
    data = build()
    path = cache_dir / f"{stem}{hashlib.sha256(data).hexdigest()}.onnx"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, durable=False)
    except OSError as e:
        logger.warning("not caching the %s graph in %s (%s); each process builds its own", model, cache_dir, e)
        return data, True, None
    drop_older_caches(cache_dir, f"{GRAPH_PREFIX}{model}-", path.name)  # another checkpoint's, layout's or runtime's
    return data, True, path


_SHARED_ARENA = threading.Lock()  # held while the process's one arena is registered
_shared_arena_ready = False


def _share_one_arena(ort: Any) -> bool:
    """Register one CPU arena for every session of this process (once); False where this onnxruntime cannot.

    Each session had its own arena, each grown for its largest run and kept: one shared arena holds the pair's
    sessions in ~5 MB less (hello-algo's queries and 120 chunks: 150 -> 145 MB resident; a server 260 -> 255 MB) at the
    same speed, two threads embedding at once included."""
    global _shared_arena_ready
    with _SHARED_ARENA:
        if not _shared_arena_ready:
            try:
                memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(memory, ort.OrtArenaCfg(0, -1, -1, -1))
                _shared_arena_ready = True
            except Exception as e:  # an older runtime without the call: each session keeps its own arena
                logger.debug("onnxruntime sessions keep their own arenas: %s", e)
                return False
        return True


def open_session(graph: bytes | str, threads: int) -> Any:
    """An onnxruntime CPU session over a graph (its bytes, or its file's path): `threads` threads per run that sleep
    between runs (spinning ones steal a busy core), every graph optimisation, errors-only logging, the process's one
    arena."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if _share_one_arena(ort):
        options.add_session_config_entry("session.use_env_allocators", "1")
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = ORT_LOG_ERRORS
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Each run's tensors take the arena's free chunks one by one, not one block planned for the whole run: the block
    # wanted a region of its own whenever the free ones were smaller (the two models share the arena), so a server's
    # peak (an edit's chunks through both) stood 4 MB higher (through MCP: hello-algo 238.3-238.9 -> 234.6-234.8 MB,
    # tldr 372.8-373.1 -> 368.4-368.7; searches and an ingest's time and memory the same).
    options.enable_mem_pattern = False
    # No second, repacked copy of the int8 weights: 154 MB resident against 167 MB for MiniLM alone, at the same
    # speed (120 hello-algo chunks one by one: 3.7 s either way).
    options.add_session_config_entry("session.disable_prepacking", "1")
    # LayerNorm(x + skip) stays two nodes: onnxruntime's fused SkipLayerNormalization ran 0.39 ms on 200 tokens of
    # MiniLM's width against 0.07 ms for the Add and LayerNormalization it replaces (a 200-token chunk 27.7 -> 23.4 ms).
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"], disabled_optimizers=UNFUSED)


@functools.lru_cache(maxsize=1)
def matmul_session() -> Any | None:
    """A one-thread onnxruntime session multiplying a float32 matrix `a` (rows, width) by `b` (width, columns) into
    `y`, or None where onnxruntime is missing. For the vector store's scans: OpenBLAS multiplies a tall matrix by a few
    columns at half the speed of onnxruntime's MLAS (tldr's 15,735 x 896 vectors by 10 columns: 10.5 ms against 4.9),
    while one column is its fast matrix-vector product."""
    if runtime_version() is None:
        return None
    g = GraphWriter()
    g.op("MatMul", ["a", "b"], ["y"])
    inputs = [value_info("a", np.float32, ["rows", "width"]), value_info("b", np.float32, ["width", "columns"])]
    return open_session(g.model(inputs, [value_info("y", np.float32, ["rows", "columns"])], "matmul"), threads=1)


def release_arena() -> None:
    """Free what the process's one onnxruntime arena holds but no run is using, for the allocator to return (kb_live
    trims it right after). The arena keeps what its largest run grew it to: a note's 256-token chunks make MiniLM's
    16 MB, which a server otherwise held for its life while its queries need a third of it. Not for every run: the
    next run grows it again (~2 ms for 16 MB). A no-op where onnxruntime was never loaded or sessions keep arenas of
    their own (an older runtime); a failure is logged, never raised."""
    if "onnxruntime" not in sys.modules or not _shared_arena_ready:
        return
    import onnxruntime as ort

    try:
        options = ort.RunOptions()
        options.add_run_config_entry(*SHRINK_ARENA)
        _shrinking_session().run(["y"], {"x": np.zeros(1, dtype=np.float32)}, options)  # they share the arena
    except Exception as e:  # best effort, on a search's path after an edit: memory held is no reason to fail it
        logger.debug("onnxruntime's arena was not shrunk: %s", e)


@functools.lru_cache(maxsize=1)
def _shrinking_session() -> Any:
    """A one-node session (Identity) whose runs shrink the arena it shares with the models' sessions."""
    g = GraphWriter()
    g.op("Identity", ["x"], ["y"])
    return open_session(g.model([value_info("x", np.float32, [1])], [value_info("y", np.float32, [1])], "shrink"), threads=1)


def open_cached_graph(
    cache_dir: Path | None, model: str, key: str, build: Callable[[], bytes], threads: int, check: Callable[[Any], str | None]
) -> tuple[Any | None, str | None]:
    """(a session over `model`'s graph, None), or (None, why it cannot run). The graph comes from the per-user cache
    (cached_graph: built by `build` where missing); a cached one onnxruntime cannot open is removed and built once
    more; a newly built one must pass `check` (session -> None, or why its vectors are off), else it is removed."""
    for attempt in range(2):
        graph, fresh, path = cached_graph(cache_dir, model, key, build)
        # From its file where cached: a session made from bytes keeps them for its life (onnxruntime's
        # InferenceSession._model_bytes), MiniLM's 10 MB in every process beside the weights it parsed from them. The
        # file's bytes were just checked against its name.
        source: bytes | str = graph if path is None else str(path)
        del graph
        try:
            session = open_session(source, threads)
        except Exception as e:  # onnxruntime's own errors have no common base class
            drop_graph(path)
            if fresh or attempt:
                return None, f"onnxruntime could not run its graph ({type(e).__name__}: {e})"
            logger.info("rebuilding the cached %s graph %s, which onnxruntime could not open (%s)", model, path, e)
            continue
        failed = check(session) if fresh else None
        if failed is not None:
            drop_graph(path)
            return None, failed
        return session, None
    raise AssertionError("unreachable: the second attempt returns")


def drop_graph(path: Path | None) -> None:
    """Remove a cached graph that failed its check (rebuilt next time, after the cause is fixed)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
