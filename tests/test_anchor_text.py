"""Links in ranking (issue 12): the words other notes link to a note with count as its keywords (anchor text), kept
current through edits, renames, deletions and name take-overs; a [[link]] in a query puts that note's passages first.

Real engine, files, jieba and BM25; the hash embedder stands in for the model (keyword mode decides these).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from kb_fixtures import write_note

from kb_links import split_query_links
from kb_search import Searcher
from kb_vectors import HashEmbedder
from kb_view import MAX_ANCHORS


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    v = tmp_path / "v"
    write_note(v, "ops/Kubernetes 故障排查手册.md", "# Kubernetes 故障排查手册\n\nCrashLoopBackOff: read the previous logs.\n")
    write_note(v, "index.md", "# Index\n\nOn call, open [[Kubernetes 故障排查手册|k8s runbook]] first.\n")
    write_note(v, "other.md", "# Other\n\nThe garden needs water on Friday.\n")
    for i, topic in enumerate(["sourdough starter", "tax return", "bike chain", "piano scales", "tent poles"]):
        write_note(v, f"misc/{i}.md", f"# Misc {i}\n\nA note about the {topic}.\n")  # a background for the word weights
    return v


def _paths(searcher: Searcher, query: str, **kw: object) -> list[str]:
    return [h.path for h in searcher.search(query, mode="keyword", **kw).hits]


def test_a_note_is_found_by_the_label_other_notes_link_it_with(vault, make_engine):
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    assert engine.view.anchor_text.by_note == {"ops/Kubernetes 故障排查手册.md": ("k8s runbook",)}
    assert "ops/Kubernetes 故障排查手册.md" in _paths(Searcher(engine), "k8s runbook")


def test_anchor_text_off_leaves_the_note_unfound_by_that_label(vault, make_engine, monkeypatch):
    import kb_view

    monkeypatch.setattr(kb_view, "ANCHOR_TEXT_WEIGHT", 0)
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    assert _paths(Searcher(engine), "k8s runbook") == ["index.md"]  # the note's own words do not say it


def test_anchor_text_follows_edits_deletions_and_renames(vault, make_engine):
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    searcher = Searcher(engine)
    target = "ops/Kubernetes 故障排查手册.md"

    write_note(vault, "index.md", "# Index\n\nOn call, open [[Kubernetes 故障排查手册|pod triage guide]] first.\n")
    engine.sync_all()
    assert target not in _paths(searcher, "k8s runbook")
    assert target in _paths(searcher, "pod triage guide")

    (vault / "index.md").unlink()
    engine.sync_all()
    assert engine.view.anchor_text.by_note == {}
    assert _paths(searcher, "pod triage guide") == []

    write_note(vault, "index.md", "# Index\n\n[[Kubernetes 故障排查手册|k8s runbook]]\n")
    (vault / "ops" / "Kubernetes 故障排查手册.md").rename(vault / "ops" / "runbook.md")  # the link now leads nowhere
    engine.sync_all()
    assert engine.view.anchor_text.by_note == {}


def test_a_new_note_that_takes_over_a_name_takes_its_anchors(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "a.md", "# A\n\nsee [[Later|the quokka plan]]\n")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    assert engine.view.anchor_text.by_note == {}
    write_note(vault, "x/Later.md", "# Later\n\nnothing about marsupials here\n")
    engine.sync_all()
    assert engine.view.anchor_text.by_note == {"x/Later.md": ("the quokka plan",)}
    assert "x/Later.md" in _paths(Searcher(engine), "quokka plan")


def test_anchors_leave_out_what_the_note_says_of_itself_and_keep_the_most_used(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "Target.md", "---\naliases: [tgt]\n---\n# Target title\n")
    links = ["[[Target]]", "[[tgt]]", "[[Target|Target Title]]", "[[Target|popular]]", "[[Target|popular]]"]
    links += [f"[[Target|label{i:02d}]]" for i in range(MAX_ANCHORS + 5)]
    write_note(vault, "src.md", "# Src\n\n" + "\n".join(links) + "\n")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    anchors = engine.view.anchor_text.by_note["Target.md"]
    assert anchors[0] == "popular" and len(anchors) == MAX_ANCHORS
    assert not {"Target", "tgt", "Target Title"} & set(anchors)


def test_incremental_anchors_equal_a_fresh_index_after_random_edits(tmp_path, make_engine):
    rng = random.Random(7)
    vault = tmp_path / "v"
    names = [f"n{i}" for i in range(12)]
    targets = names + ["al0", "al1", "al2"]  # aliases some notes take, and links use
    present: dict[str, str] = {}

    def save(name: str, folder: str | None = None) -> None:
        rel = f"{folder}{name}.md" if folder is not None else present.get(name, f"{rng.choice(['', 'sub/'])}{name}.md")
        alias = f"---\naliases: [al{rng.randrange(3)}]\n---\n" if rng.random() < 0.3 else ""
        links = " ".join(f"[[{rng.choice(targets)}|w{rng.randrange(4)}]]" for _ in range(rng.randrange(4)))
        write_note(vault, rel, f"{alias}# {name}\n\n{links}\n")
        present[name] = rel

    for name in names[:8]:
        save(name)
    engine = make_engine(vault, HashEmbedder(), data_dir=tmp_path / "data")
    engine.sync_all()
    for step in range(25):
        name = rng.choice(names)
        roll = rng.random()
        if name in present and roll < 0.25:
            (vault / present.pop(name)).unlink()
        elif name in present and roll < 0.4:  # moved to the other folder: same name, new path
            old = present.pop(name)
            (vault / old).unlink()
            save(name, "" if "/" in old else "sub/")
        else:
            save(name)
        engine.sync_all()
        fresh = make_engine(vault, HashEmbedder(), data_dir=tmp_path / f"fresh{step}")
        fresh.sync_all()
        assert engine.view.anchor_text.by_note == fresh.view.anchor_text.by_note, f"step {step}"
        query = engine.tokenizer.tokenize("w0 w1 w2 w3")
        scores = dict(engine.bm25.search(query, 50))  # same chunks, same scores (up to float summation order)
        assert scores == pytest.approx(dict(fresh.bm25.search(query, 50)), rel=1e-9), f"step {step}"


def test_anchors_survive_a_restart_from_the_saved_keyword_index(vault, tmp_path, make_engine):
    engine = make_engine(vault, HashEmbedder(), data_dir=tmp_path / "data")
    engine.sync_all()
    engine.save_view()
    again = make_engine(vault, HashEmbedder(), data_dir=tmp_path / "data")
    again.sync_all()
    assert again.view.anchor_text.by_note == engine.view.anchor_text.by_note
    assert "ops/Kubernetes 故障排查手册.md" in _paths(Searcher(again), "k8s runbook")


# ---- [[links]] in a query --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "text", "targets"),
    [
        ("rollback in [[库存同步方案#回滚|sync plan]]", "rollback in sync plan", ["库存同步方案"]),
        ("[[Homelab]] backup", "Homelab backup", ["Homelab"]),
        ("see ![[Note#Part]]", "see Note Part", ["Note"]),
        ("[[#only a heading]] and [x](y.md)", "[[#only a heading]] and [x](y.md)", []),
        ("no links", "no links", []),
    ],
)
def test_split_query_links_returns_words_and_targets(query, text, targets):
    got_text, links = split_query_links(query)
    assert got_text == text and [link.target for link in links] == targets


def test_a_linked_note_comes_first_even_where_other_notes_match_the_words_better(vault, make_engine):
    write_note(vault, "logs.md", "# Logs\n\nprevious logs previous logs previous logs CrashLoopBackOff previous logs\n")
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    searcher = Searcher(engine)
    assert _paths(searcher, "previous logs")[0] == "logs.md"
    result = searcher.search("[[Kubernetes 故障排查手册]] previous logs", mode="keyword")
    assert result.hits[0].path == "ops/Kubernetes 故障排查手册.md"
    assert [h.score for h in result.hits] == sorted((h.score for h in result.hits), reverse=True)
    assert any("is ops/Kubernetes 故障排查手册.md" in n for n in result.notes)


def test_a_query_that_is_only_a_link_leads_to_the_note_and_does_not_abstain(vault, make_engine):
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    for mode in ("keyword", "hybrid"):
        result = Searcher(engine).search("[[other]] zyzzyva", mode=mode)
        assert not result.abstained and result.hits[0].path == "other.md", mode


def test_a_linked_note_outside_the_filter_stays_out(vault, make_engine):
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    assert "other.md" not in _paths(Searcher(engine), "[[other]] logs", path_prefix="ops/")


def test_an_unresolved_query_link_is_searched_as_words_and_said(vault, make_engine):
    engine = make_engine(vault, HashEmbedder())
    engine.sync_all()
    result = Searcher(engine).search("[[garden]] water", mode="keyword")
    assert result.hits[0].path == "other.md"
    assert any("[[garden]] names no note" in n for n in result.notes)
