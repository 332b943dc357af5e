"""kb_search.Searcher: fusion, relevance gate, filters, grouping, snippets and degradation (hash embedder, real BM25,
real vector segments). Over 500 lines for a reason: one test per stage's behaviour, in the stages' order (Searcher).
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import replace

import pytest

import kb_background
import kb_search
from kb_config import KBError, ModelUnavailableError
from kb_search import MAX_ALTERNATIVE_CHARS, MAX_ALTERNATIVES, Searcher, Tuning, make_snippet
from kb_vectors import HashEmbedder
from mcp_server import format_search

# Frames tracemalloc keeps per allocation: enough to reach this file's test from where numpy allocates.
TRACE_FRAMES = 25


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


@pytest.mark.parametrize("prefix", ["daily/", "./daily/", "daily//", "/daily", "\\daily\\", "./daily"])
def test_search_reads_path_prefix_as_list_notes_does(searcher, prefix):
    """Search had its own prefix parser: "./daily/" or "daily//" found nothing while list_notes took them."""
    assert _paths(searcher.search("PostgreSQL", path_prefix=prefix, mode="hybrid")) == ["daily/2026-01-01.md"]


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
    assert recent and "projects/alpha.md" not in recent
    assert "daily/2026-01-01.md" not in recent  # a journal is as old as its own date, whatever its file time
    assert "projects/alpha.md" in _paths(searcher.search("PostgreSQL", modified_within_days=60, mode="hybrid"))


def test_search_gives_each_note_one_entry_holding_the_lines_of_its_passages(searcher):
    """A note's chunks took a slot each (Homelab.md:38-54 and Homelab.md:34-50, the same timer block twice)."""
    result = searcher.search("section", top_k=10, mode="keyword")  # every section of long.md matches
    named = [h.path for h in [*result.hits, *result.more]]
    assert named.count("long.md") == 1 and len(named) == len(set(named))
    entry = next(h for h in result.hits if h.path == "long.md")
    chunks = {(c.line_start, c.line_end) for c in searcher.engine.chunks.values() if c.path == "long.md"}
    assert 1 <= len(entry.ranges) <= Tuning().chunks_per_note  # separate sections: separate ranges
    assert all(any(a <= s and e <= b for a, b in entry.ranges) for s, e in chunks if (s, e) == (entry.line_start, entry.line_end))


@pytest.mark.parametrize(
    ("ranges", "merged"),
    [
        ([(38, 54), (34, 50)], ((34, 54),)),  # overlapping
        ([(34, 50), (51, 57)], ((34, 57),)),  # adjacent
        ([(88, 95), (34, 57)], ((34, 57), (88, 95))),  # separate, in note order
        ([(5, 5)], ((5, 5),)),
        ([], ()),
    ],
)
def test_merge_ranges_joins_overlapping_and_adjacent_lines(ranges, merged):
    assert kb_search.merge_ranges(ranges) == merged


def test_search_below_the_gate_shows_the_same_notes_marked_low_confidence(searcher, monkeypatch):
    # the hash embedder shares characters between any two texts: only a high bar stands for "unrelated"
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=1e6))
    monkeypatch.setattr(kb_background, "MIN_BACKGROUND", 1)  # a tiny vault's cosine would vouch for anything
    monkeypatch.setattr(kb_background, "NEAREST_EXCLUDED", 0)
    result = searcher.search("zebra crossing quantum sourdough", mode="hybrid")
    assert result.abstained and result.hits  # nothing hidden behind the gate: the client judges
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=-1e6))
    passed = searcher.search("zebra crossing quantum sourdough", mode="hybrid")
    assert not passed.abstained and passed.ranked_notes() == result.ranked_notes()  # the same notes either way
    text, structured = format_search(result, [], 20_000)
    assert text.startswith('Low confidence for "zebra crossing quantum sourdough"') and structured["abstained"] is True
    assert [h["path"] for h in structured["hits"]] == [h.path for h in result.hits]


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
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=-1e6))  # any cosine would pass
    assert searcher.search("今天天气怎么样", mode="hybrid").abstained
    assert not searcher.search("今天天气怎么样", mode="semantic").abstained


@pytest.mark.parametrize("latin", ["zorblax", "zorblax quuxify"])
def test_an_english_only_model_counts_for_the_share_of_a_chinese_query_it_reads(searcher, latin):
    """A mostly Chinese query gives an English-only model only its Latin words; that model's list weighs in by the
    share of the query's words it read (a fixed 0.3 let one generic word, "Windows", outvote tldr's Chinese pages)."""
    searcher.engine.embedder = model = HashEmbedder(name="all-MiniLM-L6-v2")
    (searcher.cfg.kb_dir / "进程.md").write_text("# 进程\n\n程序卡死了就用命令行强行关掉它。\n", encoding="utf-8")
    searcher.engine.sync_all()
    query = f"{latin} 程序卡死了，怎么用命令行强行关掉"
    tokens = searcher.view.tokenize(query)
    share = len(latin.split()) / len(tokens)
    result = searcher.search(query, mode="hybrid", top_k=20)
    model_rank = {cid: r for r, (cid, _) in enumerate(searcher.view.nearest(model.embed_query(latin), 50), 1)}
    only_model = [h for h in result.hits if h.keyword_rank is None]
    assert result.hits[0].path == "进程.md" and only_model
    for hit in only_model:
        assert hit.score == pytest.approx(share / (searcher.cfg.rrf_k + model_rank[hit.chunk_id]))


def test_cosine_gate_stays_open_in_a_vault_too_small_to_calibrate(searcher, monkeypatch):
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=1e6))
    assert not searcher.search("zebra crossing quantum sourdough", mode="semantic").abstained


@pytest.mark.parametrize("notes", [1, 2, 3])
def test_keyword_search_answers_from_the_first_notes_of_a_vault(tmp_path, make_engine, notes):
    """A query every word of which one note holds is relevant however small the vault: with two notes each word's
    idf was 0, the note held "none" of the query, and keyword search (also hybrid's while the model loads) abstained."""
    vault = tmp_path / "new"
    vault.mkdir()
    texts = ["The PostgreSQL ledger moved to the new host.", "周五记得续费域名。", "Water the tomatoes on Sunday."]
    for i in range(notes):
        (vault / f"n{i}.md").write_text(f"# Note {i}\n\n{texts[i]}\n", encoding="utf-8")
    engine = make_engine(vault)
    engine.sync_all()
    result = Searcher(engine).search("PostgreSQL ledger", mode="keyword")
    assert [h.path for h in result.hits] == ["n0.md"]
    assert Searcher(engine).search("quantum sourdough", mode="keyword").abstained


def test_multilingual_model_vouches_for_chinese_queries(searcher, monkeypatch):
    """A multilingual model gets the whole Chinese query, and its cosine can pass the gate on its own."""
    searcher.engine.embedder = HashEmbedder(name="use-multilingual")
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=-1e6))
    result = searcher.search("今天天气怎么样", mode="hybrid")
    assert not result.abstained and result.hits[0].cosine is not None


@pytest.fixture
def topic_vault(tmp_path):
    """Forty notes on forty unrelated topics: a background for the cosine gate."""
    root = tmp_path / "topics"
    root.mkdir()
    for i in range(40):
        words = " ".join(f"topic{i}word{j}" for j in range(12))
        (root / f"note{i:02}.md").write_text(f"# Note {i}\n\n{words}\n", encoding="utf-8")
    return root


class _Offset(HashEmbedder):
    """The hash embedder with one constant extra dimension: every cosine moves up (c -> (c + k^2) / (1 + k^2))."""

    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def _vector(self, text):
        v = super()._vector(text) + [self.k]
        norm = sum(x * x for x in v) ** 0.5
        return [x / norm for x in v]


@pytest.mark.parametrize("query", ["topic7word1 topic7word5", "topic7word3", "unrelated quantum sourdough", "zzz"])
def test_cosine_gate_is_calibrated_per_model_not_by_absolute_cosine(topic_vault, make_engine, tmp_path, query):
    """A model whose cosines all sit higher decides the same: the gate compares with the vault's own background."""
    decisions = []
    for i, embedder in enumerate([HashEmbedder(), _Offset(3.0)]):
        engine = make_engine(topic_vault, embedder, data_dir=tmp_path / f"data{i}")
        engine.sync_all()
        decisions.append(Searcher(engine).search(query, mode="semantic").abstained)
    assert decisions[0] == decisions[1]


class _TopicEmbedder(HashEmbedder):
    """Exact cosines for the gate: "topicN" words point at axis N, every text shares one common axis."""

    def _vector(self, text):
        v = [0.0] * (self.dim - 1) + [1.0]
        for n in re.findall(r"topic(\d+)", text):
            v[int(n)] += 2.0
        norm = sum(x * x for x in v) ** 0.5
        return [x / norm for x in v]


def test_cosine_gate_passes_a_clear_match_and_stops_noise(topic_vault, make_engine):
    engine = make_engine(topic_vault, _TopicEmbedder())
    engine.sync_all()
    searcher = Searcher(engine)
    hit = searcher.search("what about topic7", mode="semantic")
    assert not hit.abstained and hit.hits[0].path == "note07.md"
    noise = searcher.search("quantum sourdough violin", mode="semantic")  # equally far from every note
    assert noise.abstained and noise.hits  # still shows the nearest notes


def test_search_with_two_models_reports_the_mean_of_their_cosines(small_vault, make_engine):
    from kb_engine import embed_text
    from kb_vectors import MultiEmbedder

    a, b = HashEmbedder(dim=32, name="model-a"), HashEmbedder(dim=48, name="model-b")
    engine = make_engine(small_vault, MultiEmbedder([a, b]))
    engine.sync_all()
    top = Searcher(engine).search("PostgreSQL ledger", mode="hybrid").hits[0]
    assert top.path == "projects/alpha.md"
    text = embed_text(engine.chunks[top.chunk_id], engine.files.get(top.path))
    own = [sum(x * y for x, y in zip(m.embed_query("PostgreSQL ledger"), m.embed_documents([text])[0])) for m in (a, b)]
    assert top.cosine == pytest.approx(sum(own) / 2, abs=1e-5)


def test_snippet_centres_on_first_matched_term():
    from kb_state import ChunkRecord

    text = "intro " * 100 + "the MAGIC word is here " + "outro " * 100
    chunk = ChunkRecord("c", "p.md", "", 1, 1, text, "", "")
    snippet = make_snippet(chunk, ["magic"], 120)
    assert "MAGIC" in snippet and snippet.startswith("…") and snippet.endswith("…") and len(snippet) <= 122


def test_snippet_starts_at_a_sentence_whose_snippet_holds_most_of_the_words_not_at_the_first_match():
    from kb_state import ChunkRecord

    text = (
        "The backup box sits under the desk. "
        + "Filler about the hardware and the cables. " * 8
        + "The nightly backup timer fires at 02:30 with a random delay.\n"
        + "Unrelated closing words here. " * 8
    )
    chunk = ChunkRecord("c", "p.md", "", 1, 1, text, "", "")
    snippet = make_snippet(chunk, ["nightly", "backup", "timer"], 120)
    assert "The nightly backup timer fires at 02:30" in snippet and "box" not in snippet, snippet
    assert snippet.startswith(("…Filler about", "…The nightly")), snippet  # a sentence's start
    # a rare word outweighs two common ones (idf): the sentence with "02:30" wins over "backup box"
    weighted = make_snippet(chunk, ["backup", "02:30", "box"], 120, {"backup": 0.1, "box": 0.1, "02:30": 5.0})
    assert "02:30" in weighted and "box sits" not in weighted, weighted


def test_a_note_found_only_by_an_alternative_shows_the_alternatives_words(tmp_path, make_engine):
    """A hit found only by an alternative (a translation) showed its chunk's opening, not the words that matched."""
    vault = tmp_path / "vault"
    vault.mkdir()
    opening = "这一节先讲历史背景和一些无关的内容。" * 12
    (vault / "笔记.md").write_text(
        f"# 笔记\n\n{opening}\n\n周末跑步的配速是六分钟一公里。\n\n" + "其他内容。" * 40, encoding="utf-8"
    )
    (vault / "other.md").write_text("# Other\n\nNothing about running at all.\n", encoding="utf-8")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    cfg = replace(engine.cfg, snippet_chars=80)
    searcher = Searcher(engine)
    searcher.cfg = cfg
    result = searcher.search("weekend running pace", alternatives=["周末 跑步 配速"], mode="keyword")
    hit = next(h for h in result.hits if h.path == "笔记.md")
    assert hit.found_by == ("alt 1",) and "周末跑步的配速" in hit.snippet, hit.snippet


@pytest.mark.parametrize(("pool", "low", "high"), [(1, 0.0, 0.0), (250, 2.6, 2.7), (15_000, 3.8, 3.9)])
def test_chance_level_of_the_best_cosine_grows_with_the_pool(pool, low, high):
    assert low <= kb_background.chance_z(pool) <= high


def test_background_sample_is_drawn_once_not_on_every_edit(topic_vault, make_engine, monkeypatch):
    import random

    import kb_background

    engine = make_engine(topic_vault, _TopicEmbedder())
    engine.sync_all()
    searcher = Searcher(engine)
    reads: list[list[str]] = []  # every read of stored vectors (the translation step's note vectors read too)
    real = engine.view.vectors_of
    monkeypatch.setattr(engine.view, "vectors_of", lambda ids: reads.append(list(ids)) or real(ids))

    def sample_reads() -> int:  # reads of the background sample: the whole 40-chunk vault, in the sample's order
        sample = random.Random(kb_background.BACKGROUND_SEED).sample(sorted(engine.chunks), 40)
        return sum(1 for ids in reads if ids == sample)

    searcher.warm_up()
    assert sample_reads() == 1
    searcher.search("what about topic7", mode="semantic")
    searcher.search("what about topic8", mode="semantic")
    assert sample_reads() == 1  # read once
    (topic_vault / "note40.md").write_text("# Note 40\n\ntopic40word0\n", encoding="utf-8")
    engine.sync_all()
    searcher.search("what about topic9", mode="semantic")
    assert not any(len(ids) == 41 for ids in reads)  # one more chunk (2.5%) keeps the sample


def _cross_lingual_vault(root):
    vault = root / "xl"
    vault.mkdir()
    for i in range(8):  # English notes with every word of the query: above the Chinese note in both lists
        (vault / f"en{i}.md").write_text(f"# Release {i}\n\nkubectl rollout undo deployment batch {i}\n", encoding="utf-8")
    (vault / "回滚.md").write_text("# 回滚\n\n发布失败时把 deployment 回滚到上一个版本。\n", encoding="utf-8")
    return vault


@pytest.mark.parametrize(("weight", "found"), [(Tuning().cross_weight, True), (0.0, False)])
def test_a_question_reaches_the_note_in_the_other_language_through_the_cross_lingual_list(tmp_path, make_engine, weight, found):
    engine = make_engine(_cross_lingual_vault(tmp_path), HashEmbedder())
    engine.sync_all()
    searcher = Searcher(engine, Tuning(cross_weight=weight))
    result = searcher.search("kubectl rollout undo deployment", mode="hybrid", top_k=5)
    assert ("回滚.md" in [h.path for h in result.hits]) is found
    assert len(result.hits) == 5 and len({h.path for h in result.hits}) == 5
    semantic = searcher.search("kubectl rollout undo deployment", mode="semantic", top_k=5)  # the model's own ranking
    assert "回滚.md" not in [h.path for h in semantic.hits]


def _translated_vault(root, zh_commands: str):
    """Forty other notes (the background), an English note and a Chinese note of the same file name with `zh_commands`
    as its code."""
    vault = root / "tr"
    (vault / "en").mkdir(parents=True)
    (vault / "zh").mkdir()
    for i in range(40):
        words = " ".join(f"topic{i}word{j}" for j in range(2 + i % 16))  # and two words of the query: above the Chinese note
        (vault / f"note{i:02}.md").write_text(f"# Note {i}\n\nbroken release {i}: {words}\n", encoding="utf-8")
    commands = "`kubectl rollout undo deployment/web` `kubectl rollout history deployment/web` `kubectl rollout status`"
    (vault / "en" / "rollback.md").write_text(
        f"# Roll back a release\n\nRoll back a broken release: {commands}\n", encoding="utf-8"
    )
    (vault / "zh" / "rollback.md").write_text(f"# 回滚\n\n发布失败时回滚到上一个版本：{zh_commands}\n", encoding="utf-8")
    return vault


_SAME_COMMANDS = "`kubectl rollout undo deployment/web` `kubectl rollout history deployment/web` `kubectl rollout status`"


@pytest.mark.parametrize(
    ("zh_commands", "zh_name", "zh_heading", "follows"),
    [
        # The Chinese note is the English one's translation (its nearest, same name, same headings): it follows it.
        (_SAME_COMMANDS, "rollback.md", "# 回滚", True),
        (_SAME_COMMANDS, "helm.md", "# 回滚", False),  # another name and one heading: two short notes, nothing more
        (_SAME_COMMANDS, "rollback.md", "# 回滚\n\n## 步骤", False),  # other headings: not its shape
    ],
)
def test_a_found_note_brings_its_translation_right_after_it(tmp_path, make_engine, zh_commands, zh_name, zh_heading, follows):
    vault = _translated_vault(tmp_path, zh_commands)
    (vault / "zh" / "rollback.md").unlink()
    (vault / "zh" / zh_name).write_text(f"{zh_heading}\n\n发布失败时回滚到上一个版本：{zh_commands}\n", encoding="utf-8")
    engine = make_engine(vault, HashEmbedder(name="multilingual-hash"))
    engine.sync_all()
    # No list finds the Chinese note (no cross-lingual list): only the translation step brings it.
    result = Searcher(engine, Tuning(cross_weight=0.0)).search("roll back a broken release", mode="hybrid", top_k=5)
    assert result.hits[0].path == "en/rollback.md"
    # The translation is named on the note's own entry and takes no entry of its own (else forty notes with two words
    # of the query come first, and it is not named at all).
    assert result.hits[0].translation == ("zh/rollback.md" if follows else None)
    if follows:
        assert "zh/rollback.md" not in [h.path for h in [*result.hits, *result.more]]
    text, structured = format_search(result, [], 20_000)
    assert ("[1] en/rollback.md:1-3 · Roll back a release\n" in text) and (
        "\n[2] zh/rollback.md:1-3 · translation of [1]\n" in text
    ) is follows, text
    assert structured["hits"][0]["translation"] == ("zh/rollback.md" if follows else None)
    # In the query's language first: a Chinese question's entry is the Chinese note, the English one folded in.
    if follows:
        zh_first = Searcher(engine, Tuning(cross_weight=0.0)).search("发布失败时怎么回滚 rollback", mode="hybrid", top_k=5)
        got = [(h.path, h.translation) for h in zh_first.hits[:1]]
        assert got == [("zh/rollback.md", "en/rollback.md")], got
    keyword = Searcher(engine).search("roll back a broken release", mode="keyword", top_k=5)  # hybrid mode only
    assert "zh/rollback.md" not in [h.path for h in keyword.hits]


def test_a_note_in_a_language_folder_is_paired_with_the_same_path_in_the_other_languages_folder(tmp_path, make_engine):
    """hello-algo's en/chapter_stack_and_queue/summary.md and zh/chapter_heap/summary.md were each other's nearest
    notes: two chapters' summaries read alike. The tree kept in two languages names the translation."""
    vault = _translated_vault(tmp_path, _SAME_COMMANDS)
    (vault / "zh" / "rollback.md").write_text("# 回滚\n\n发布失败时回滚到上一个版本。\n", encoding="utf-8")
    (vault / "zh" / "deploy").mkdir()  # another chapter's note with the same name, nearer by its commands
    (vault / "zh" / "deploy" / "rollback.md").write_text(f"# 部署\n\n部署新版本：{_SAME_COMMANDS}\n", encoding="utf-8")
    engine = make_engine(vault, HashEmbedder(name="multilingual-hash"))
    engine.sync_all()
    result = Searcher(engine, Tuning(cross_weight=0.0)).search("roll back a broken release", mode="hybrid", top_k=5)
    assert result.hits[0].path == "en/rollback.md"
    assert result.hits[0].translation == "zh/rollback.md"


class _Unplaced(HashEmbedder):
    """A multilingual model that cannot place a query: each query gets a random direction (seeded by its text)."""

    def __init__(self) -> None:
        super().__init__(dim=256, name="multilingual-hash")

    def embed_query(self, text):
        rng = random.Random(text)
        v = [rng.gauss(0.0, 1.0) for _ in range(self.dim)]
        norm = sum(x * x for x in v) ** 0.5
        return [x / norm for x in v]


def test_a_word_just_written_comes_first_though_the_models_find_nothing_for_it(tmp_path, make_engine, monkeypatch):
    """A unique word is a keyword match the models cannot place (their best cosine does not stand out): their lists
    are noise and are fused at Tuning.quiet_weight, else chunks near the top of two of them (a model's own list and
    its cross-lingual list) outrank the one note that holds the word."""
    # A random direction stands out by chance now and then; real models' best cosine for such a word did not, 12 times
    # in 12 on the sample vault.
    monkeypatch.setattr(Searcher, "_cosine_excess", lambda self, sl: -1.0)
    rng = random.Random(7)
    vault = tmp_path / "mixed"
    vault.mkdir()
    for i in range(80):  # a quarter English, the rest Chinese, each note its own words
        if i % 4:
            body = "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(120))
        else:
            body = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxy") for _ in range(6)) for _ in range(40))
        (vault / f"n{i:02}.md").write_text(f"# Note {i}\n\n{body}\n", encoding="utf-8")
    engine = make_engine(vault, _Unplaced())
    engine.sync_all()
    searcher = Searcher(engine)
    for i in range(0, 80, 6):
        word = "zq" + "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(10))
        with (vault / f"n{i:02}.md").open("a", encoding="utf-8") as f:
            f.write(f"\nbench marker {word}\n")
        engine.sync_all()
        hits = searcher.search(word, mode="hybrid", top_k=5).hits
        assert hits and hits[0].path == f"n{i:02}.md", (word, [h.path for h in hits])


def test_collect_folds_a_notes_translation_into_the_entry_of_the_first_of_the_two(tmp_path, make_engine):
    """A translation took an entry of its own: "how do I give a note another name" showed two notes in five slots."""
    vault = tmp_path / "vault"
    (vault / "en").mkdir(parents=True)
    (vault / "zh").mkdir()
    long = " ".join(f"word{i}" for i in range(400))
    (vault / "en" / "a.md").write_text(f"# A\n\n## One\n\n{long}\n\n## Two\n\n{long}\n", encoding="utf-8")
    (vault / "zh" / "a.md").write_text(f"# 甲\n\n## 一\n\n{long}\n\n## 二\n\n{long}\n", encoding="utf-8")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    en, zh = (list(engine.files[p].chunks) for p in ("en/a.md", "zh/a.md"))
    assert len(en) >= 2 and len(zh) >= 2
    ranked = [(zh[0], 0.3), (en[0], 0.3), (zh[1], 0.2), (en[1], 0.1)]
    pairs = {"zh/a.md": "en/a.md", "en/a.md": "zh/a.md"}
    hits, more = Searcher(engine)._collect(ranked, {cid for cid, _ in ranked}, 4, {}, {}, pairs, {}, [])
    assert more == [] and [(h.path, h.translation) for h in hits] == [("zh/a.md", "en/a.md")]  # zh/a.md came first
    lines = {cid: (c.line_start, c.line_end) for cid, c in engine.chunks.items()}
    assert hits[0].ranges == kb_search.merge_ranges([lines[zh[0]], lines[zh[1]]])
    assert hits[0].translation_ranges == kb_search.merge_ranges([lines[en[0]], lines[en[1]]])


# ---- the client's alternatives ----------------------------------------------------------------------------------


def test_alternatives_find_what_the_query_misses_and_each_hit_says_who_found_it(searcher):
    plain = searcher.search("how far do I run on weekends", mode="keyword")
    assert "笔记.md" not in _paths(plain)  # the English words are nowhere in the Chinese note
    result = searcher.search("how far do I run on weekends", alternatives=["周末 跑步 公里"], mode="hybrid")
    assert result.hits[0].path == "笔记.md"
    assert "alt 1" in result.hits[0].found_by
    assert result.alternatives == ["周末 跑步 公里"]
    text, structured = format_search(result, [], 20_000)
    assert 'Also searched: alt 1 "周末 跑步 公里"' in text and "found by" in text
    assert structured["hits"][0]["found_by"] == list(result.hits[0].found_by) or structured["hits"][0]["found_by"]


@pytest.mark.parametrize(
    ("alternatives", "message"),
    [
        (["a"] * (MAX_ALTERNATIVES + 1), f"at most {MAX_ALTERNATIVES}"),
        (["x" * (MAX_ALTERNATIVE_CHARS + 1)], f"at most {MAX_ALTERNATIVE_CHARS}"),
        (["ok", "  "], "alternative 2 is empty"),
    ],
)
def test_alternatives_past_the_limits_are_refused_with_the_limit(searcher, alternatives, message):
    with pytest.raises(KBError, match=message):
        searcher.search("PostgreSQL", alternatives=alternatives)


class _QueryRecorder(HashEmbedder):
    """The hash embedder, recording every query text it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def embed_query(self, text):
        self.queries.append(text)
        return super().embed_query(text)


def test_search_uses_the_vectors_embed_ahead_made_for_it_once(small_vault, make_engine):
    embedder = _QueryRecorder()
    engine = make_engine(small_vault, embedder)
    engine.sync_all()
    searcher = Searcher(engine)
    query, alternatives = "[[alpha]] PostgreSQL ledger", ["ALPHA postgresql LEDGER", "账本 数据库"]
    plain = searcher.search(query, alternatives=alternatives)
    embedded = list(embedder.queries)
    assert embedded == ["alpha PostgreSQL ledger", "账本 数据库"]  # the link's words kept, the repeat dropped
    embedder.queries.clear()
    searcher.embed_ahead(query, alternatives, None)
    assert embedder.queries == embedded
    ahead = searcher.search(query, alternatives=alternatives)
    assert embedder.queries == embedded  # nothing embedded again
    assert [(h.path, h.score) for h in ahead.hits] == [(h.path, h.score) for h in plain.hits]
    searcher.search(query, alternatives=alternatives)
    assert embedder.queries == embedded * 2  # used once: a later search embeds its own


@pytest.mark.parametrize(
    ("alternatives", "mode"), [(["ok", "  "], "hybrid"), (["x" * (MAX_ALTERNATIVE_CHARS + 1)], "hybrid"), ([], "keyword")]
)
def test_embed_ahead_leaves_bad_arguments_and_keyword_searches_alone(small_vault, make_engine, alternatives, mode):
    embedder = _QueryRecorder()
    engine = make_engine(small_vault, embedder)
    engine.sync_all()
    searcher = Searcher(engine)
    searcher.embed_ahead("PostgreSQL", alternatives, mode)
    assert embedder.queries == [] and not searcher._ahead


def test_embed_ahead_keeps_only_the_latest_searches_vectors(searcher, monkeypatch):
    monkeypatch.setattr(kb_search, "AHEAD_KEPT", 2)
    for q in ("one", "two", "three"):
        searcher.embed_ahead(q, None, "hybrid")
    assert [texts for texts, _ in searcher._ahead] == [("two",), ("three",)]


def test_alternatives_alone_do_not_make_an_offtopic_question_relevant(searcher, monkeypatch):
    """An alternative's cosine is one more chance to match by chance: only words found in a note count for it."""
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=1e6))  # the hash embedder's cosines vouch for nothing
    monkeypatch.setattr(kb_background, "MIN_BACKGROUND", 1)
    monkeypatch.setattr(kb_background, "NEAREST_EXCLUDED", 0)
    off = searcher.search("zebra crossing quantum sourdough", alternatives=["斑马线 量子 酸面包", "zebra quantum bread"])
    assert off.abstained and off.hits  # the nearest notes, to judge
    text, structured = format_search(off, [], 20_000)
    assert text.startswith("Low confidence") and structured["abstained"] and structured["hits"]
    on = searcher.search("zebra crossing quantum sourdough", alternatives=["PostgreSQL ledger", "vendor API rate limit"])
    assert not on.abstained  # the client's keywords are in a note: evidence


def test_alternatives_with_no_word_in_the_vault_undo_a_pass_on_cosines_alone(searcher, monkeypatch):
    """The client rewrote the question into the words a note would use: when the vault holds none of them, the
    query's cosines alone (near-miss topics: a sweet-and-sour dish beside a braised-pork recipe) do not answer."""
    monkeypatch.setattr(searcher, "cfg", replace(searcher.cfg, gate_margin=-1e6))  # every cosine passes the gate
    query = "zebra crossing quantum sourdough"
    assert not searcher.search(query).abstained  # alone, the query's cosines decide
    off = searcher.search(query, alternatives=["斑马线 量子 酸面包", "zebra quantum bread"])
    assert off.abstained and off.hits
    on = searcher.search(query, alternatives=["zebra quantum bread", "PostgreSQL migration ledger"])
    assert not on.abstained  # one alternative's words are in a note
    keyword_pass = searcher.search("PostgreSQL ledger", alternatives=["斑马线 量子 酸面包"])
    assert not keyword_pass.abstained  # the query's own words vouch: alternatives cannot veto that


def test_alternatives_words_make_a_keyword_mode_search_relevant(searcher):
    """In keyword mode too, the client's words found in a note answer a question whose own words are not there."""
    plain = searcher.search("zebra crossing quantum sourdough", mode="keyword")
    assert plain.abstained
    helped = searcher.search("zebra crossing quantum sourdough", alternatives=["PostgreSQL ledger"], mode="keyword")
    assert not helped.abstained and helped.hits[0].path == "projects/alpha.md"


# ---- exact evidence: an identifier only a few notes hold comes first -------------------------------------------------


def _plant_lookalikes(vault, target: str, token: str) -> None:
    with (vault / target).open("a", encoding="utf-8") as f:
        f.write(f"\n\nmarker {token}\n")
    for i, other in enumerate(("zq1ebabdf863", "zqd17f683628")):
        (vault / f"fresh{i}.md").write_text(f"# Fresh {i}\n\nfresh {other}\n", encoding="utf-8")


@pytest.mark.parametrize("query", ["zq0e3ba105b1", "what is zq0e3ba105b1 about", "zq0e3ba105b1 那个是什么"])
def test_an_identifier_held_by_one_note_puts_that_note_first_despite_lookalikes(sample_vault, make_engine, query):
    _plant_lookalikes(sample_vault, "tech/Git cheatsheet.md", "zq0e3ba105b1")
    engine = make_engine(sample_vault, HashEmbedder(name="multilingual-hash"))
    engine.sync_all()
    result = Searcher(engine).search(query, mode="hybrid")
    assert not result.abstained and result.hits[0].path == "tech/Git cheatsheet.md", [h.path for h in result.hits]


def test_an_identifier_comes_first_before_its_notes_translation_in_the_querys_language(tmp_path, make_engine):
    """The translation step puts a pair's note in the query's language first, but not ahead of the one note holding
    the query's identifier: its translation does not hold it (hello-algo: 14 of 30 planted identifiers lost so)."""
    vault = tmp_path / "vault"
    for lang, words in (("en", "archive create extract compress files"), ("zh", "归档 创建 解压 压缩 文件")):
        (vault / lang).mkdir(parents=True)
        for name in ("tar", "zip", "gzip"):
            body = f"# {name}\n\n## One\n\n{name} {words}\n\n## Two\n\n{name} {words} {name}\n"
            (vault / lang / f"{name}.md").write_text(body, encoding="utf-8")
    _plant_lookalikes(vault, "en/tar.md", "zq0e3ba105b1")
    engine = make_engine(vault, HashEmbedder(name="multilingual-hash"))
    engine.sync_all()
    hits = Searcher(engine).search("zq0e3ba105b1 那个是什么", mode="hybrid").hits
    assert [(h.path, h.translation) for h in hits[:1]] == [("en/tar.md", "zh/tar.md")]


def test_an_identifier_many_notes_hold_is_ranked_as_usual(searcher):
    for i in range(12):
        (searcher.cfg.kb_dir / f"common{i}.md").write_text(f"# Common {i}\n\nrelease v2 note {i}\n", encoding="utf-8")
    searcher.engine.sync_all()
    with searcher.engine.mutex:
        assert searcher._exact_notes(["v2"], None) == []  # twelve notes hold it: more than a reply shows
        # two notes hold it: both, in the keyword order
        held = searcher._exact_notes(["postgresql"], None)
    keyword = [h.path for h in searcher.search("postgresql", mode="keyword").hits]
    assert sorted(held) == ["daily/2026-01-01.md", "projects/alpha.md"] and held == [p for p in keyword if p in held]


def test_the_first_hits_do_not_depend_on_how_many_the_call_asks_for(searcher):
    """Seven notes mention err-4711 in passing, two are about the failed deploy: asking for 10 hits must start with
    the same 5 as asking for 5 (the identifier rule once put up to top_k holders first: with 10, the seven)."""
    root = searcher.cfg.kb_dir
    for i in range(7):
        (root / f"log{i}.md").write_text(f"# Log {i}\n\nSaw err-4711 once, nothing else happened.\n", encoding="utf-8")
    for i in range(2):
        (root / f"deploy{i}.md").write_text(
            f"# Deploy {i}\n\nThe deploy failed at the migration step; the failed deploy was rolled back.\n",
            encoding="utf-8",
        )
    searcher.engine.sync_all()
    five = [h.path for h in searcher.search("deploy failed err-4711", top_k=5).hits]
    ten = [h.path for h in searcher.search("deploy failed err-4711", top_k=10).hits]
    assert ten[:5] == five and {"deploy0.md", "deploy1.md"} <= set(five), (five, ten)


def test_a_translation_is_found_once_its_vectors_arrive_after_the_first_search(tmp_path, make_engine):
    """The notes' vectors are cached: a note searched before its chunks were embedded must not stay without one."""
    engine = make_engine(_translated_vault(tmp_path, _SAME_COMMANDS), HashEmbedder(name="multilingual-hash"))
    engine.sync_all(embed_limit=0)  # committed, nothing embedded yet (a server right after a bulk change)
    searcher = Searcher(engine, Tuning(cross_weight=0.0))
    searcher._background.notes_for("multilingual-hash")  # built while no note has a vector
    engine.embed_pending()
    result = searcher.search("roll back a broken release", mode="hybrid", top_k=5)
    assert [(h.path, h.translation) for h in result.hits[:1]] == [("en/rollback.md", "zh/rollback.md")]


def test_the_translation_steps_note_vectors_are_each_notes_mean_across_passes(tmp_path, make_engine, monkeypatch):
    """A note's vector is the unit mean of its chunks' vectors, also when its notes are averaged in several passes and
    a note between them has no vector yet (they were computed one note at a time: 0.6 s of a tldr server's start)."""
    import numpy as np

    vault = tmp_path / "notes"
    vault.mkdir()
    for i in range(9):
        words = " ".join(f"word{i}x{k}" for k in range(40))  # each part over chunk_tokens: a chunk of its own
        sections = "".join(f"\n## Part {j}\n\nrelease {i} part {j} {words}\n" for j in range(1 + i % 3))
        (vault / f"n{i}.md").write_text(f"# Note {i}\n{sections}", encoding="utf-8")
    engine = make_engine(vault, HashEmbedder(name="multilingual-hash"), chunk_tokens=32)
    engine.sync_all()
    assert len({len(c) for c in engine.view.notes_with_chunks().values()}) == 3  # notes of 4, 8 and 12 chunks
    (vault / "n4.md").write_text("# Note 4\n\nnot embedded yet\n", encoding="utf-8")
    engine.sync_all(embed_limit=0)  # n4 is in the view without a vector
    monkeypatch.setattr(kb_background, "NOTE_BLOCK", 2)
    background = Searcher(engine)._background
    assert background.notes_for("multilingual-hash") == 8
    view = engine.view
    for path, chunks in view.notes_with_chunks().items():
        got = background._note_matrix("multilingual-hash")
        if path == "n4.md":
            assert path not in got.row
            continue
        stored = view.vectors_of(chunks)
        mean = np.mean([stored[c] for c in chunks], axis=0)
        np.testing.assert_allclose(got.matrix[got.row[path]], mean / np.linalg.norm(mean), atol=1e-6)


def test_the_translation_steps_note_vectors_are_held_once(tmp_path, make_engine):
    """Each note's whole-note vector exists once: in the matrix the translation step multiplies (the per-note arrays
    and a copy per language used to stay beside it: 37 MB more in a server on the tldr vault)."""
    import tracemalloc

    vault = tmp_path / "many"
    (vault / "en").mkdir(parents=True)
    (vault / "zh").mkdir()
    for i in range(150):
        (vault / "en" / f"n{i}.md").write_text(f"# Note {i}\n\nrelease {i} word{i} other{i % 7}\n", encoding="utf-8")
        (vault / "zh" / f"n{i}.md").write_text(f"# 笔记 {i}\n\n发布 {i} 词{i} word{i}\n", encoding="utf-8")
    dim = 1024
    engine = make_engine(vault, HashEmbedder(dim=dim, name="multilingual-hash"))
    engine.sync_all()
    searcher = Searcher(engine)
    tracemalloc.start(TRACE_FRAMES)
    try:
        notes = searcher._background.notes_for("multilingual-hash")
        # Only what this call allocated: a whole-process count once failed under CI (4.8x: another thread's arrays).
        held = sum(t.size for t in tracemalloc.take_snapshot().traces if any(f.filename == __file__ for f in t.traceback))
    finally:
        tracemalloc.stop()
    vectors = notes * dim * 4
    assert notes == 300 and vectors <= held < 1.5 * vectors, held / vectors  # (at least: the filter sees the matrix)
    result = searcher.search("release 7 word7", mode="hybrid", top_k=4)
    # The same path in the other language's folder is its translation (kb_background._mirror).
    assert (result.hits[0].path, result.hits[0].translation) == ("en/n7.md", "zh/n7.md"), [h.path for h in result.hits]


# ---- the reply the client reads -----------------------------------------------------------------------------------


def _hit(path: str, line: int, **kw) -> kb_search.Hit:
    fields = {"snippet": "", "score": 0.1, "keyword_rank": None, "cosine": None, "chunk_id": f"{path}#{line}"}
    return kb_search.Hit(path, path.rsplit("/", 1)[-1].removesuffix(".md"), "", line, line + 9, **(fields | kw))


def test_format_search_lists_further_notes_one_line_each_within_todays_length():
    """The default reply showed 3.5-4.2 distinct notes in ~1,900 characters; the tail fills that space with more."""
    import kb_tools

    hits = [_hit(f"notes/entry{i}.md", 10 * i, snippet="s" * 240, ranges=((10 * i, 10 * i + 9),)) for i in range(4)]
    more = [_hit(f"notes/candidate{i}.md", 5, ranges=((5, 14), (40, 44)), translation=f"zh/c{i}.md") for i in range(30)]
    result = kb_search.SearchResult("q", "hybrid", hits, abstained=False, more=more)
    text, structured = format_search(result, [], 20_000)
    listing = text.split("\n", 1)[1]
    assert len(listing) <= kb_tools.LISTING_CHARS and 4 < len(structured["hits"]) + len(structured["more"]) < 34
    listed = len(structured["hits"]) + 2 * len(structured["more"])  # each candidate with its translation
    assert text.startswith(f'{listed} notes for "q"')
    assert "\n[5] notes/candidate0.md:5-14, 40-44\n[6] zh/c0.md · translation of [5]\n" in text  # path:lines, no snippet
    assert [h["path"] for h in structured["more"]] == [h.path for h in more[: len(structured["more"])]]


def test_format_search_cuts_long_snippets_so_the_tail_still_names_the_next_note():
    """hello-algo's English entries (long headings, a translation each, full 240-character snippets) filled the
    listing, so 31 of its 80 replies had no tail and the fifth note, often the answer, was not shown at all."""
    import kb_tools

    words = " ".join(f"word{i}" for i in range(60))
    hits = [
        _hit(f"en/chapter_{i}/a_long_section_name.md", 10 * i, snippet=f"…{words}"[:239] + "…", translation=f"zh/c{i}.md")
        for i in range(4)
    ]
    long = {"heading_path": "A Long Heading > Another Long Subheading", "ranges": ((5, 20), (40, 61), (90, 120))}
    hits = [replace(h, **long, translation_ranges=((7, 22), (44, 63))) for h in hits]
    more = [_hit(f"en/chapter_more/candidate{i}.md", 5, translation=f"zh/m{i}.md") for i in range(5)]
    text, structured = format_search(kb_search.SearchResult("q", "hybrid", hits, abstained=False, more=more), [], 20_000)
    listing = text.split("\n", 1)[1]
    assert len(listing) <= kb_tools.LISTING_CHARS
    assert "\n[9] en/chapter_more/candidate0.md:5-14\n[10] zh/m0.md · translation of [9]" in text, text
    snippets = [h["snippet"] for h in structured["hits"]]
    assert len(snippets) == 4 and all(120 <= len(s) < 240 and s.endswith("…") and " …" not in s for s in snippets)
    # Each is the snippet's own start cut between two words.
    assert all(s.rstrip("…") == s[:1] + words[: len(s) - 2] and words[len(s) - 2] == " " for s in snippets), snippets
    # Snippets that leave room already are not cut.
    short = [replace(h, snippet="short") for h in hits]
    text = format_search(kb_search.SearchResult("q", "hybrid", short, abstained=False, more=more), [], 20_000)[0]
    assert text.count("\nshort\n") == 4


def test_format_search_says_low_confidence_in_one_sentence_and_lists_the_same_notes():
    hits = [_hit("a.md", 1, snippet="alpha"), _hit("b.md", 3, snippet="beta")]
    sure = format_search(kb_search.SearchResult("q", "hybrid", hits, abstained=False), [], 20_000)[0]
    unsure, structured = format_search(kb_search.SearchResult("q", "hybrid", hits, abstained=True), [], 20_000)
    assert unsure.split("\n")[0].startswith('Low confidence for "q"') and structured["abstained"] is True
    assert sure.split("\n", 1)[1] == unsure.split("\n", 1)[1]  # the same entries below the first line


def test_format_search_with_no_candidate_says_the_notes_do_not_cover_it():
    text, structured = format_search(kb_search.SearchResult("q", "hybrid", [], abstained=True), [], 20_000)
    assert text.startswith('Nothing in the notes matches "q"') and structured["hits"] == [] == structured["more"]
