"""The optional cross-encoder reranker, with a tiny BERT cross-encoder built in the test (no download)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kb_search import Searcher
from kb_vectors import CrossEncoderReranker, HashEmbedder

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz0123456789", "the", "we", "for"]


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer BERT sequence classifier with a 45-token vocabulary, saved like a hub model."""
    missing = "sentence-transformers is not installed (opt-in: pip install -r requirements-st.txt; requirements-dev.txt has it)"
    torch = pytest.importorskip("torch", reason=missing)
    pytest.importorskip("sentence_transformers", reason=missing)
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-ce")
    (folder / "vocab.txt").write_text("\n".join(VOCAB), encoding="utf-8")
    torch.manual_seed(7)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=512,
        num_labels=1,
        initializer_range=0.6,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


def test_reranker_scores_pairs_from_a_local_folder(tiny_cross_encoder):
    reranker = CrossEncoderReranker(str(tiny_cross_encoder), device="cpu")
    scores = reranker.score("postgresql ledger", ["we chose postgresql", "the rate limit is 50"])
    assert len(scores) == 2 and scores[0] != scores[1]
    assert reranker.score("q", []) == []


def test_search_orders_hits_by_cross_encoder_scores(small_vault, make_engine, tiny_cross_encoder):
    engine = make_engine(small_vault, HashEmbedder())
    engine.sync_all()
    plain = Searcher(engine).search("word1x3 word2x5 postgresql", top_k=5, mode="keyword")
    assert len(plain.hits) >= 2  # notes: long.md (both words, two sections) and the notes holding postgresql
    searcher = Searcher(engine)
    searcher.cfg = replace(engine.cfg, rerank_model=str(tiny_cross_encoder), embed_device="cpu")
    reranked = searcher.search("word1x3 word2x5 postgresql", top_k=5, mode="keyword")
    assert {h.path for h in reranked.hits} == {h.path for h in plain.hits}
    ce = CrossEncoderReranker(str(tiny_cross_encoder), device="cpu")
    texts = [f"{engine.chunks[h.chunk_id].context}\n{engine.chunks[h.chunk_id].text}" for h in reranked.hits]
    scores = ce.score("word1x3 word2x5 postgresql", texts)
    assert scores == sorted(scores, reverse=True)
    assert [h.score for h in reranked.hits] == pytest.approx(scores)


def test_search_keeps_fused_order_with_note_when_reranker_missing(small_vault, make_engine, tmp_path):
    engine = make_engine(small_vault, HashEmbedder())
    engine.sync_all()
    searcher = Searcher(engine)
    searcher.cfg = replace(engine.cfg, rerank_model=str(tmp_path / "no-such-model"))
    result = searcher.search("postgresql ledger", mode="keyword")
    assert result.hits and any("reranker unavailable" in n for n in result.notes)
    assert "rerank.model" in " ".join(result.notes)
