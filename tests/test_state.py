"""kb_state.IndexState: this process's copy of state.json, the commit point (real files in tmp_path)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import kb_state
from kb_state import FileRecord, IndexState

PARAMS = {"model": "model-a", "chunk_tokens": 400}


def _record(md5: str = "abc") -> FileRecord:
    return FileRecord(mtime_ns=1, size=2, md5=md5, chunks=("c1",), ctime_ns=3, inode=4)


def test_index_state_commit_round_trips_and_counts_generations(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    writer = IndexState(path, PARAMS)
    writer.read([], ("chunk_tokens",))
    assert writer.files == {} and not writer.model_switch and writer.is_current() is True
    writer.adopt({"a.md": _record()})
    writer.commit(("seg-1.npz",), ())
    reader = IndexState(path, PARAMS)
    assert not reader.is_current()  # never read
    reader.read([], ("chunk_tokens",))
    assert reader.files == {"a.md": _record()} and reader.stats == {"a.md": (1, 2, 3, 4)}
    assert reader.segments == ("seg-1.npz",) and reader.meta["generation"] == 1 and reader.is_current()
    writer.commit(None, ("ignored.npz",))  # None keeps the list state.json names
    assert not reader.is_current()  # another copy committed since
    reader.read([], ("chunk_tokens",))
    assert reader.segments == ("seg-1.npz",) and reader.meta["generation"] == 2


def test_index_state_marks_records_for_a_re_read_when_chunking_or_model_changed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    old = IndexState(path, PARAMS)
    old.adopt({"a.md": _record()})
    old.commit((), ())
    new = IndexState(path, {"model": "model-b", "chunk_tokens": 200})
    reasons: list[str] = []
    new.read(reasons, ("chunk_tokens",))
    assert new.model_switch and new.stored_model == "model-a"
    assert new.files["a.md"].md5 == "" and new.rework
    assert reasons == ["chunking changed (chunk_tokens 400 -> 200): re-chunking every note; vectors of unchanged text are reused"]


def test_index_state_treats_an_unusable_file_as_empty_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json", encoding="utf-8")
    state = IndexState(path, PARAMS)
    reasons: list[str] = []
    state.read(reasons, ())
    assert state.files == {} and state.segments == () and "is unusable" in reasons[0]


def test_index_state_failed_commit_is_not_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    state = IndexState(path, PARAMS)
    state.read([], ())
    version = state.version

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kb_state, "write_state_file", full)
    state.adopt({"a.md": _record()})
    with pytest.raises(OSError):
        state.commit((), ())
    assert not state.is_current() and state.version > version  # the next refresh re-reads what is really committed
    assert not path.exists()


def test_first_sync_that_cannot_commit_is_redone_once_the_disk_has_room(
    small_vault: Path, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No state.json yet and the first commit fails: the next sync commits every note (a missing state.json must not
    look like the one this process wrote)."""
    engine = make_engine(small_vault)
    real = kb_state.write_state_file

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kb_state, "write_state_file", full)
    with pytest.raises(OSError):
        engine.sync_all()
    assert not engine.state_path.exists()
    monkeypatch.setattr(kb_state, "write_state_file", real)
    engine.sync_all()
    committed = kb_state.read_state_file(engine.state_path)
    assert committed is not None and sorted(committed["files"]) == sorted(engine.view.files)
