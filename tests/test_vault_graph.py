"""The vault's own structure in the index (issue 12): links and backlinks kept current through edits, renames and
deletions; properties and journal dates on each note; a Logseq graph chunked at its outline blocks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT, write_note

LOGSEQ_SAMPLE = REPO_ROOT / "examples" / "logseq_sample"


@pytest.fixture
def logseq_graph(tmp_path: Path) -> Path:
    dest = tmp_path / "graph"
    shutil.copytree(LOGSEQ_SAMPLE, dest)
    bak = dest / "logseq" / "bak" / "pages" / "Kestrel Project"
    bak.mkdir(parents=True)
    (bak / "2026-03-01.md").write_text("- an old copy Logseq keeps of [[Kestrel Project]]\n", encoding="utf-8")
    return dest


def test_backlinks_follow_edits_renames_and_deletions(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "a.md", "# A\n\nSee [[B]] and [[B#Plan|the plan]].\n")
    write_note(vault, "notes/B.md", "# B\n\n## Plan\n\nShip it.\n")
    write_note(vault, "c.md", "# C\n\nAlso [b](notes/B.md).\n")
    engine = make_engine(vault)
    engine.sync_all()

    graph = engine.view.link_graph()
    assert sorted(src for src, _ in graph.backlinks["notes/B.md"]) == ["a.md", "a.md", "c.md"]
    assert [(row.heading, row.label) for row, _ in graph.outgoing["a.md"]] == [("", ""), ("Plan", "the plan")]

    write_note(vault, "a.md", "# A\n\nNo links now.\n")  # an edit re-derives only a.md's links
    engine.sync_all()
    assert [src for src, _ in engine.view.link_graph().backlinks["notes/B.md"]] == ["c.md"]

    (vault / "notes" / "B.md").rename(vault / "notes" / "B2.md")
    engine.sync_all()
    graph = engine.view.link_graph()
    assert "notes/B.md" not in graph.backlinks and "notes/B2.md" not in graph.backlinks
    assert [row.target for row in graph.unresolved["c.md"]] == ["notes/B.md"]  # reported, not dangling

    (vault / "c.md").unlink()
    engine.sync_all()
    graph = engine.view.link_graph()
    assert not graph.backlinks and not graph.unresolved


def test_a_new_note_takes_over_an_unresolved_name(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "a.md", "# A\n\n[[Later]]\n")
    engine = make_engine(vault)
    engine.sync_all()
    assert "a.md" in engine.view.link_graph().unresolved

    write_note(vault, "x/Later.md", "# Later\n")
    engine.sync_all()

    graph = engine.view.link_graph()
    assert not graph.unresolved and [s for s, _ in graph.backlinks["x/Later.md"]] == ["a.md"]


def test_ambiguous_names_are_reported_with_their_notes(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "a/Note.md", "# one\n")
    write_note(vault, "b/c/Note.md", "# two\n")
    write_note(vault, "x.md", "[[Note]]\n")
    engine = make_engine(vault)
    engine.sync_all()

    graph = engine.view.link_graph()
    assert graph.ambiguous["note"] == ("a/Note.md", "b/c/Note.md")
    assert [s for s, _ in graph.backlinks["a/Note.md"]] == ["x.md"]  # shortest path wins, as in Obsidian


def test_sample_vault_links_resolve_to_its_notes(sample_vault, make_engine):
    engine = make_engine(sample_vault)
    engine.sync_all()

    graph = engine.view.link_graph()
    assert "inbox.md" in {s for s, _ in graph.backlinks["projects/homelab/Homelab.md"]}
    assert "projects/cloud-wms/云仓WMS 项目.md" in {s for s, _ in graph.backlinks["projects/cloud-wms/库存同步方案.md"]}


def test_properties_and_journal_dates_reach_the_index(tmp_path, make_engine):
    vault = tmp_path / "v"
    write_note(vault, "p.md", "---\nstatus: active\nproject: [Kestrel, Osprey]\ndue: 2026-04-01\n---\n# P\n\nbody\n")
    write_note(vault, "daily/2026-03-02.md", "# Monday\n\nstandup\n")
    engine = make_engine(vault)
    engine.sync_all()

    rec = engine.files["p.md"]
    assert rec.properties["status"] == ("active",) and rec.properties["project"] == ("Kestrel", "Osprey")
    assert rec.properties["due"] == ("2026-04-01",)
    assert engine.files["daily/2026-03-02.md"].date == "2026-03-02"
    fresh = make_engine(vault)
    fresh.sync_all(write=False)
    assert fresh.files["p.md"].properties == rec.properties  # through state.json and the saved view alike


def test_logseq_graph_is_chunked_at_blocks_and_its_own_folder_is_skipped(logseq_graph, make_engine):
    engine = make_engine(logseq_graph, chunk_tokens=32)
    engine.sync_all()

    assert not any(p.startswith("logseq/") for p in engine.files)
    kestrel = engine.files["pages/Kestrel Project.md"]
    assert "active" in kestrel.properties["status"] and "Kestrel" in kestrel.aliases
    assert engine.files["journals/2026_03_02.md"].date == "2026-03-02"
    lines = (logseq_graph / "pages" / "Kestrel Project.md").read_text(encoding="utf-8").split("\n")
    chunks = [c for c in engine.chunks.values() if c.path == "pages/Kestrel Project.md"]
    assert len(chunks) > 2 and all(lines[c.line_start - 1].lstrip().startswith("- ") for c in chunks)  # block starts
    assert not any("status::" in c.text for c in chunks)  # properties are kept as properties, not text
    graph = engine.view.link_graph()
    assert "journals/2026_03_02.md" in {s for s, _ in graph.backlinks["pages/Kestrel Project.md"]}
    assert "pages/张伟.md" in {s for s, _ in graph.backlinks["pages/Kestrel Project.md"]}  # [[红隼项目]] is an alias


def test_a_view_saved_with_plain_tuple_links_loads_with_link_rows(tmp_path, make_engine):
    """BM25 pickles written before links were LinkRow records hold plain tuples: the view still reads them by name."""
    from dataclasses import replace

    from kb_state import LinkRow

    vault = tmp_path / "v"
    write_note(vault, "a.md", "# A\n\nSee [[B|bee]].\n")
    write_note(vault, "B.md", "# B\n")
    engine = make_engine(vault)
    engine.sync_all()
    view = engine.view
    view.files["a.md"] = replace(view.files["a.md"], links=tuple(tuple(r) for r in view.files["a.md"].links))
    engine.save_view()
    fresh = make_engine(vault)
    fresh.sync_all()
    links = fresh.view.record("a.md").links
    assert links and all(isinstance(r, LinkRow) for r in links) and links[0].label == "bee"
    assert [src for src, _ in fresh.view.link_graph().backlinks["B.md"]] == ["a.md"]
