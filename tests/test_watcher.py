"""watcher.py: debounced event collection, and the real watchdog loop applying edits, atomic saves, moves, deletions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

import watcher
from kb_vectors import HashEmbedder

WAIT_S = 20.0


def _event(kind: str, src: str, dest: str = "", is_dir: bool = False) -> SimpleNamespace:
    return SimpleNamespace(event_type=kind, src_path=src, dest_path=dest, is_directory=is_dir)


def _until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_collector_waits_for_quiet_before_returning_changes(tmp_path):
    c = watcher.ChangeCollector(tmp_path)
    assert c.take(0.2) is None
    c.on_event(_event("modified", str(tmp_path / "a.md")))
    c.on_event(_event("moved", str(tmp_path / ".a.md.swp"), str(tmp_path / "a.md")))
    assert c.take(0.2) is None  # still inside the debounce window
    time.sleep(0.25)
    paths, full = c.take(0.2)
    assert paths == sorted({str(tmp_path / "a.md"), str(tmp_path / ".a.md.swp")}) and full is False
    assert c.take(0.2) is None


@pytest.mark.parametrize(
    ("event", "full"),
    [
        (_event("deleted", "/v/folder", is_dir=True), True),
        (_event("moved", "/v/old", "/v/new", is_dir=True), True),
        (_event("modified", "/v/sub/.kbignore"), True),
        (_event("modified", "/v/folder", is_dir=True), False),
        (_event("created", "/v/note.md"), False),
    ],
)
def test_collector_asks_full_sync_for_folder_and_ignore_file_events(tmp_path, event, full):
    c = watcher.ChangeCollector(tmp_path)
    c.on_event(event)
    time.sleep(0.02)
    assert c.take(0.0)[1] is full


def test_collector_flushes_after_max_delay_despite_constant_events(tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "MAX_DELAY_S", 0.3)
    c = watcher.ChangeCollector(tmp_path)
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
