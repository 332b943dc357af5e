"""kb_search.Searcher: fusion, relevance gate, filters, grouping, snippets and degradation (hash embedder, real BM25/Chroma)."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

import kb_search
from kb_config import KBError, ModelUnavailableError
from kb_search import Searcher, make_snippet
from kb_vectors import HashEmbedder


@pytest.fixture
def searcher(small_vault, make_engine):
    (small_vault / "daily").mkdir()
    (small_vault / "daily" / "2026-01-01.md").write_text(
        "---\ntags: [daily, work/meeting]\n---\n# Jan 1\n\nDiscussed the PostgreSQL migration plan.\n", encoding="utf-8"
    )
    engine = make_engine(small_vault, HashEmbedder())
    engine.sync_all()
    return Searcher(engine)


def _paths(result) -> list[str]:
    return [h.path for h in result.hits]


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "semantic"])
def test_search_finds_exact_term_in_every_mode(searcher, mode):
    result = searcher.search("PostgreSQL ledger", mode=mode)
    assert result.hits and result.hits[0].path == "projects/alpha.md"


def test_search_returns_bounded_citeable_hits(searcher):
    hit = searcher.search("vendor API rate limit", mode="hybrid").hits[0]
    lines = (searcher.cfg.kb_dir / hit.path).read_text(encoding="utf-8").split("\n")
    assert "rate limit" in "\n".join(lines[hit.line_start - 1 : hit.line_end])
    assert hit.heading_path.startswith("Alpha") and hit.keyword_rank == 1 and hit.cosine is not None
    assert len(hit.snippet) <= searcher.cfg.snippet_chars + 2


def test_search_filters_by_path_prefix_before_ranking(searcher):
    result = searcher.search("PostgreSQL", path_prefix="daily/", mode="hybrid")
    assert _paths(result) == ["daily/2026-01-01.md"]
    assert searcher.search("PostgreSQL", path_prefix="nowhere", mode="hybrid").abstained


def test_search_filters_by_tag_including_child_tags(searcher):
    assert set(_paths(searcher.search("PostgreSQL", tag="work", mode="keyword"))) == {"projects/alpha.md", "daily/2026-01-01.md"}
    assert _paths(searcher.search("PostgreSQL", tag="#work/meeting", mode="keyword")) == ["daily/2026-01-01.md"]
    assert _paths(searcher.search("PostgreSQL", tag="daily", mode="keyword")) == ["daily/2026-01-01.md"]
    assert searcher.search("PostgreSQL", tag="wor", mode="keyword").abstained  # a prefix of a tag is not a tag


def test_search_filters_by_modification_date(searcher):
    old = searcher.cfg.kb_dir / "projects" / "alpha.md"
    os.utime(old, (time.time() - 40 * 86400, time.time() - 40 * 86400))
    searcher.engine.sync_all()
    recent = _paths(searcher.search("PostgreSQL", modified_within_days=7, mode="hybrid", top_k=10))
    assert recent[0] == "daily/2026-01-01.md" and "projects/alpha.md" not in recent
    assert "projects/alpha.md" in _paths(searcher.search("PostgreSQL", modified_within_days=60, mode="hybrid"))


def test_search_keeps_at_most_two_chunks_per_note(searcher):
    result = searcher.search("section", top_k=10, mode="keyword")  # every section of long.md matches
    assert _paths(result).count("long.md") == kb_search.MAX_CHUNKS_PER_NOTE
    assert max(_paths(result).count(p) for p in set(_paths(result))) <= kb_search.MAX_CHUNKS_PER_NOTE


def test_search_abstains_and_names_nearest_notes_when_nothing_is_relevant(searcher, monkeypatch):
    # the hash embedder shares characters between any two texts: only a high cosine bar stands for "unrelated"
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, min_cosine=0.99))
    result = searcher.search("zebra crossing quantum sourdough", mode="hybrid")
    assert result.abstained and result.hits == []
    assert 0 < len(result.closest) <= kb_search.CLOSEST_ON_ABSTAIN


@pytest.mark.parametrize("query", ["the of and", "的 了 是", "什么 怎么 多久"])
def test_search_with_only_stopwords_abstains_in_keyword_mode(searcher, query):
    assert searcher.search(query, mode="keyword").abstained


def test_search_handles_top_k_larger_than_corpus(searcher):
    result = searcher.search("word0x1 PostgreSQL 跑步", top_k=50, mode="hybrid")
    assert 0 < len(result.hits) <= len(searcher.engine.chunks)


def test_search_finds_mixed_chinese_english_query(searcher):
    assert searcher.search("周末 跑步 配速", mode="keyword").hits[0].path == "笔记.md"


def test_search_never_returns_a_note_deleted_since_the_last_sync(searcher):
    (searcher.cfg.kb_dir / "projects" / "alpha.md").unlink()
    searcher.engine.sync_all()
    assert "projects/alpha.md" not in _paths(searcher.search("PostgreSQL ledger", mode="hybrid"))


@pytest.mark.parametrize(("kwargs", "message"), [({"query": "  "}, "empty"), ({"query": "x", "mode": "fuzzy"}, "unknown")])
def test_search_rejects_bad_arguments_with_clear_message(searcher, kwargs, message):
    query = kwargs.pop("query")
    with pytest.raises(KBError, match=message):
        searcher.search(query, **kwargs)


class _NoModel(HashEmbedder):
    def embed_query(self, text):
        raise ModelUnavailableError("embedding model 'gone' cannot be loaded (test)")


def test_hybrid_degrades_to_keyword_with_note_when_model_missing(searcher):
    searcher.engine.embedder = _NoModel()
    result = searcher.search("PostgreSQL ledger", mode="hybrid")
    assert result.hits[0].path == "projects/alpha.md"
    assert any("semantic search unavailable" in n for n in result.notes)
    with pytest.raises(ModelUnavailableError):
        searcher.search("PostgreSQL ledger", mode="semantic")


def test_english_only_model_does_not_vouch_for_chinese_queries(searcher, monkeypatch):
    """With an English-only model, a Chinese query's relevance rests on its terms, not on the model's cosine."""
    searcher.engine.embedder = HashEmbedder(name="all-MiniLM-L6-v2")
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, min_cosine=-1.0))  # any cosine would pass
    assert searcher.search("今天天气怎么样", mode="hybrid").abstained
    assert not searcher.search("今天天气怎么样", mode="semantic").abstained


def test_snippet_centres_on_first_matched_term():
    from kb_state import ChunkRecord

    text = "intro " * 100 + "the MAGIC word is here " + "outro " * 100
    chunk = ChunkRecord("c", "p.md", "", 1, 1, text, "", "")
    snippet = make_snippet(chunk, ["magic"], 120)
    assert "MAGIC" in snippet and snippet.startswith("…") and snippet.endswith("…") and len(snippet) <= 122
