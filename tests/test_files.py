"""kb_files: the one atomic write (old or new file, never a part) and the sweep of a killed writer's temp files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import kb_files
from kb_files import TEMP_PREFIX, TEMP_SUFFIX, atomic_write_bytes, atomic_write_text, sweep_temp_files


def test_atomic_write_replaces_the_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")

    assert path.read_text(encoding="utf-8") == "two"
    assert os.listdir(path.parent) == ["state.json"]


def test_atomic_write_sets_the_requested_mode(tmp_path: Path) -> None:
    path = tmp_path / "note.md"
    atomic_write_bytes(path, b"x", mode=0o600)

    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("failing", ["write", "replace"])
def test_atomic_write_keeps_the_old_file_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "state.json"
    atomic_write_text(path, "old")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(kb_files.os, "replace" if failing == "replace" else "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    monkeypatch.undo()

    assert path.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_sweep_removes_only_old_temp_files_of_ours(tmp_path: Path) -> None:
    (tmp_path / "deep").mkdir()
    old = tmp_path / "deep" / f"{TEMP_PREFIX}abc{TEMP_SUFFIX}"
    fresh = tmp_path / f"{TEMP_PREFIX}def{TEMP_SUFFIX}"
    note = tmp_path / "note.tmp"
    for p in (old, fresh, note):
        p.write_text("x", encoding="utf-8")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    os.utime(note, (hour_ago, hour_ago))

    removed = sweep_temp_files(tmp_path, recursive=True)

    assert removed == [old]
    assert not old.exists() and fresh.exists() and note.exists()
