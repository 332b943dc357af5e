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


# ---- the mapped word table (jieba's dictionary, USE's pieces) --------------------------------------------------


def test_a_mapped_word_table_finds_every_word_and_no_other(tmp_path):
    import random

    from kb_files import MappedWords, WordTableFile

    rng = random.Random(3)
    alphabet = "ab仓库测试\u00e9\U0001f600"
    words = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))): rng.randint(0, 2**31 - 1) for _ in range(5000)}
    words |= {"": 5, "\ud800lone": 9, "x" * 300: 1}  # the empty word, a lone surrogate (a file name), a long one
    table = WordTableFile(tmp_path / "t.bin")
    table.write("k", words, 123)
    mapped, total = table.read("k")
    assert isinstance(mapped, MappedWords) and total == 123 and len(mapped) == len(words)
    assert all(mapped.get(w) == c for w, c in words.items()) and dict(mapped) == words
    others = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(5000)} - set(words)
    assert others and not any(w in mapped for w in others) and mapped.get("nope", -1) == -1
    with pytest.raises(KeyError):
        mapped["nope"]


def test_word_counts_keep_their_own_words_over_a_shared_table_whatever_the_memo_holds(monkeypatch):
    import kb_files
    from kb_files import WordCounts

    monkeypatch.setattr(kb_files, "WORD_MEMO_SIZE", 4)
    shared = {"仓": 0, "仓库": 7, "a": 1}
    mine, theirs = WordCounts(shared), WordCounts(shared)
    mine["仓库同步"], mine["仓库"] = 2000, 0
    for w in ("x1", "x2", "x3", "x4", "x5", "a"):  # lookups that overflow the memo, twice
        mine.get(w)
    assert mine.get("仓库同步") == 2000 and mine["仓库"] == 0 and mine["a"] == 1 and "x1" not in mine
    assert "仓库同步" not in theirs and theirs["仓库"] == 7 and shared == {"仓": 0, "仓库": 7, "a": 1}
    assert len(mine) == 4 and dict(mine) == {"仓": 0, "仓库": 0, "a": 1, "仓库同步": 2000}
