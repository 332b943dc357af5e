"""The tools over the vault's structure (issue 12): related_notes, property and date filters on list_notes, and
read_note with embeds expanded. In-process KnowledgeBase, real files, the hash embedder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT, make_config, write_note

import mcp_server
from kb_config import KBError
from kb_vectors import HashEmbedder

WAIT_S = 30.0
LOGSEQ_SAMPLE = REPO_ROOT / "examples" / "logseq_sample"


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    v = tmp_path / "v"
    write_note(
        v,
        "projects/kestrel.md",
        "---\nstatus: active\nproject: [Kestrel]\n---\n# Kestrel\n\nSee [[Osprey]] for the rival plan.\n",
    )
    write_note(v, "projects/Osprey.md", "---\nstatus: paused\n---\n# Osprey\n\n## Plan\n\nShip the ledger.\n\n## Later\n\nmore\n")
    write_note(v, "daily/2026-03-02.md", "# Monday\n\nTalked about [[kestrel]] at standup.\n")
    write_note(v, "daily/2026-03-09.md", "# Monday\n\n![[Osprey#Plan]]\n\n![[loop]]\n")
    write_note(v, "loop.md", "# Loop\n\n![[2026-03-09]]\n")
    return v


def _kb(vault: Path, data: Path) -> mcp_server.KnowledgeBase:
    kb = mcp_server.KnowledgeBase(make_config(vault, data), embedder=HashEmbedder())
    kb.start()
    assert kb.live.startup_done.wait(WAIT_S)
    return kb


@pytest.fixture
def kb(vault: Path, tmp_path: Path) -> Iterator[mcp_server.KnowledgeBase]:
    kb = _kb(vault, tmp_path / "data")
    yield kb
    kb.shutdown()


def test_related_notes_lists_links_backlinks_with_their_lines_and_nearest(kb):
    text, data = kb.related("projects/kestrel.md", 10)

    assert [h["path"] for h in data["outgoing"]] == ["projects/Osprey.md"]
    assert data["outgoing"][0]["context"] == "See [[Osprey]] for the rival plan."
    assert [(h["path"], h["line"]) for h in data["backlinks"]] == [("daily/2026-03-02.md", 3)]
    assert "Talked about [[kestrel]]" in text
    assert data["nearest"] and all(n["path"] != "projects/kestrel.md" for n in data["nearest"])


def test_related_notes_rejects_a_path_that_is_not_an_indexed_note(kb):
    with pytest.raises(KBError, match="does not exist"):
        kb.related("nothing.md", 5)
    with pytest.raises(KBError, match="leaves the vault"):
        kb.related("../x.md", 5)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"status": "active"}, ["projects/kestrel.md"]),
        ({"status": ["active", "paused"]}, ["projects/Osprey.md", "projects/kestrel.md"]),
        ({"project": "kestrel"}, ["projects/kestrel.md"]),  # membership on a list, case-insensitive
        ({"status": "active", "project": "Osprey"}, []),
    ],
)
def test_list_notes_filters_by_properties(kb, where, expected):
    _, data = kb.list_notes(None, None, where)

    assert sorted(n["path"] for n in data["notes"]) == expected


def test_list_notes_rejects_an_unknown_property_naming_the_valid_keys(kb):
    with pytest.raises(KBError, match=r"no note has the property 'colour'.*project, status"):
        kb.list_notes(None, None, {"colour": "red"})


def test_list_notes_filters_and_sorts_by_journal_date(kb, vault):
    (vault / "daily" / "2026-03-02.md").touch()  # the newest file time, but the oldest journal date

    _, data = kb.list_notes("daily", None, None, "2026-03-01", "2026-03-31", "date")

    assert [n["path"] for n in data["notes"]] == ["daily/2026-03-09.md", "daily/2026-03-02.md"]
    only = kb.list_notes(None, None, None, "2026-03-05", "2026-03-31")[1]["notes"]
    assert [n["path"] for n in only] == ["daily/2026-03-09.md"]  # other notes are dated by their last change
    with pytest.raises(KBError, match="date_from must be a date like 2026-03-02"):
        kb.list_notes(None, None, None, "last tuesday", None)


def test_read_note_expands_embeds_of_a_section_and_stops_at_a_cycle(kb):
    text, data = kb.read_note("daily/2026-03-09.md", None, 1, True)

    assert "Ship the ledger." in data["text"] and "more" not in data["text"]  # only the Plan section
    assert "cycle" in data["text"]
    assert "embeds expanded" in text
    plain = kb.read_note("daily/2026-03-09.md", None, 1)[1]["text"]
    assert "![[Osprey#Plan]]" in plain


def test_logseq_sample_answers_property_filters_and_backlinks(tmp_path):
    graph = tmp_path / "graph"
    shutil.copytree(LOGSEQ_SAMPLE, graph)
    kb = _kb(graph, tmp_path / "data")
    try:
        _, data = kb.list_notes(None, None, {"type": "person"})
        assert "pages/张伟.md" in [n["path"] for n in data["notes"]]
        _, rel = kb.related("pages/Kestrel Project.md", 20)
        assert "journals/2026_03_02.md" in [h["path"] for h in rel["backlinks"]]
    finally:
        kb.shutdown()


def test_search_filters_by_properties_and_journal_dates(kb):
    _, active = kb.search("plan", mode="keyword", where={"status": "active"})
    _, dated = kb.search("Monday", mode="keyword", date_from="2026-03-05", date_to="2026-03-31")

    assert {h["path"] for h in active["hits"]} == {"projects/kestrel.md"}
    assert {h["path"] for h in dated["hits"]} == {"daily/2026-03-09.md"}
    with pytest.raises(KBError, match="property keys are: project, status"):
        kb.search("plan", where={"owner": "me"})
