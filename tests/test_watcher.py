"""kb_watch + watcher.py: event collection (debounced or whole), and the real watchdog loop applying edits, atomic saves,
moves and deletions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from kb_fixtures import wait_until

import kb_watch
import watcher
from kb_vectors import HashEmbedder
from kb_watch import ChangeCollector, Changes, paths_to_check

WAIT_S = 20.0


def _event(kind: str, src: str, dest: str = "", is_dir: bool = False) -> SimpleNamespace:
    return SimpleNamespace(event_type=kind, src_path=src, dest_path=dest, is_directory=is_dir)


def _until(predicate: Callable[[], object], timeout_s: float = WAIT_S) -> bool:
    return wait_until(predicate, timeout_s)


def test_collector_waits_for_quiet_before_returning_changes(tmp_path):
    c = ChangeCollector(tmp_path, [".md"])
    assert c.take(0.2) is None
    c.on_event(_event("modified", str(tmp_path / "a.md")))
    c.on_event(_event("moved", str(tmp_path / ".a.md.swp"), str(tmp_path / "a.md")))
    assert c.take(0.2) is None  # still inside the debounce window
    time.sleep(0.25)
    changes = c.take(0.2)
    assert changes.paths == {str(tmp_path / "a.md")} and not changes.full and not changes.folders
    assert c.take(0.2) is None


def test_collector_keeps_only_notes_and_ignore_files(tmp_path):
    c = ChangeCollector(tmp_path, [".md"])
    for name in ("a.md", "B.MD", ".obsidian/workspace.json", "pic.png", "sub/.kbignore"):
        c.on_event(_event("modified", str(tmp_path / name)))
    changes = c.take()
    assert changes.paths == {str(tmp_path / p) for p in ("a.md", "B.MD", "sub/.kbignore")}
    assert changes.full and ".kbignore" in changes.reason


@pytest.mark.parametrize(
    ("event", "folders", "full"),
    [
        (_event("deleted", "/v/folder", is_dir=True), {"/v/folder"}, False),
        (_event("moved", "/v/old", "/v/new", is_dir=True), {"/v/old"}, False),
        (_event("created", "/v/new", is_dir=True), None, None),  # nothing yet: its notes send their own events
        (_event("modified", "/v/sub/.kbignore"), set(), True),
        (_event("created", "/v/note.md"), set(), False),
    ],
)
def test_collector_reports_folders_gone_and_asks_full_walk_only_for_ignore_files(tmp_path, event, folders, full):
    c = ChangeCollector(tmp_path, [".md"])
    c.on_event(event)
    changes = c.take()
    if folders is None:
        assert changes is None
    else:
        assert changes is not None and changes.folders == folders and changes.full is full


def test_paths_to_check_adds_the_indexed_notes_under_a_folder_gone(tmp_path):
    changes = Changes(paths={str(tmp_path / "x.md")}, folders={str(tmp_path / "proj")})
    indexed = ["proj/a.md", "proj/sub/b.md", "project.md", "other/c.md"]
    assert paths_to_check(changes, tmp_path, indexed) == sorted([str(tmp_path / "x.md"), "proj/a.md", "proj/sub/b.md"])
    assert paths_to_check(Changes(folders={str(tmp_path)}), tmp_path, indexed) is None  # the vault itself: walk it
    assert paths_to_check(Changes(paths={str(tmp_path / "x.md")}, full=True), tmp_path, indexed) is None


def test_collector_put_back_merges_with_newer_changes(tmp_path):
    c = ChangeCollector(tmp_path, [".md"])
    c.on_event(_event("modified", str(tmp_path / "a.md")))
    taken = c.take()
    c.on_event(_event("deleted", str(tmp_path / "b.md")))
    c.put_back(taken)
    assert c.take().paths == {str(tmp_path / "a.md"), str(tmp_path / "b.md")}


def test_collector_turns_watchdog_overflow_log_into_full_walk(tmp_path):
    import logging

    c = ChangeCollector(tmp_path, [".md"])
    observer = kb_watch.start_observer(tmp_path, c)
    try:
        logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed; filesystem events were lost")
        changes = c.take()
        assert changes.full and "overflow" in changes.reason
    finally:
        kb_watch.stop_observer(observer, c)


def test_collector_flushes_after_max_delay_despite_constant_events(tmp_path, monkeypatch):
    monkeypatch.setattr(kb_watch, "MAX_DELAY_S", 0.3)
    c = ChangeCollector(tmp_path, [".md"])
    deadline = time.monotonic() + 2
    got = None
    while time.monotonic() < deadline and got is None:
        c.on_event(_event("modified", str(tmp_path / "busy.md")))
        got = c.take(10.0)
        time.sleep(0.02)
    assert got is not None


@pytest.fixture(params=[False, True], ids=["inotify", "polling"])
def running_watcher(request, small_vault, make_engine):
    engine = make_engine(small_vault, HashEmbedder())
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=watcher.watch,
        args=(engine, stop),
        kwargs={"debounce_s": 0.2, "poll": request.param, "poll_interval_s": 0.3, "ready": ready},
        daemon=True,
    )
    thread.start()
    assert ready.wait(WAIT_S), "the watcher's initial sync did not finish"
    yield engine, small_vault
    stop.set()
    thread.join(timeout=WAIT_S)
    assert not thread.is_alive()


def _texts(engine) -> str:
    with engine.mutex:
        return "\n".join(c.text for c in engine.chunks.values())


def test_watcher_indexes_new_edited_and_deleted_notes(running_watcher):
    engine, vault = running_watcher
    (vault / "new.md").write_text("# New\n\nThe okapi sighting was on Tuesday.\n", encoding="utf-8")
    assert _until(lambda: "okapi" in _texts(engine))
    (vault / "new.md").write_text("# New\n\nThe pangolin sighting was on Friday.\n", encoding="utf-8")
    assert _until(lambda: "pangolin" in _texts(engine) and "okapi" not in _texts(engine))
    (vault / "new.md").unlink()
    assert _until(lambda: "new.md" not in engine.files)


def test_watcher_handles_atomic_save_and_rename(running_watcher):
    engine, vault = running_watcher
    tmp = vault / ".inbox.md.tmp"
    tmp.write_text("# Inbox\n\n- axolotl tank temperature 18C\n", encoding="utf-8")
    os.replace(tmp, vault / "inbox.md")  # how many editors save
    assert _until(lambda: "axolotl" in _texts(engine))
    (vault / "projects" / "alpha.md").rename(vault / "projects" / "beta.md")
    assert _until(lambda: "projects/beta.md" in engine.files and "projects/alpha.md" not in engine.files)
    (vault / "projects").rename(vault / "archive")
    assert _until(lambda: "archive/beta.md" in engine.files and not any(p.startswith("projects/") for p in engine.files))


def test_watcher_ignores_ignored_folders(running_watcher):
    engine, vault = running_watcher
    (vault / ".obsidian").mkdir(exist_ok=True)
    (vault / ".obsidian" / "notes.md").write_text("# Hidden\n\nquetzal\n", encoding="utf-8")
    (vault / "visible.md").write_text("# Visible\n\nnarwhal\n", encoding="utf-8")
    assert _until(lambda: "narwhal" in _texts(engine))
    assert "quetzal" not in _texts(engine)


def test_watcher_saves_view_on_stop(small_vault, make_engine):
    engine = make_engine(small_vault, HashEmbedder())
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=watcher.watch, args=(engine, stop), kwargs={"debounce_s": 0.1, "ready": ready}, daemon=True)
    thread.start()
    assert ready.wait(WAIT_S)
    stop.set()
    thread.join(timeout=WAIT_S)
    assert Path(engine.cfg.bm25_index_file).is_file()
