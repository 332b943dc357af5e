"""The one atomic-write helper (temp file, fsync, rename, fsync of the folder) and the sweep of its leftovers.

Every file the project writes (state.json, the BM25 view, vector segments, appended notes) goes through here; and
WordTableFile, the cache of jieba's dictionary.
Imports: nothing from the project.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

# Temp files start with this, so a crash's leftovers are recognisable (and hidden: the scanner skips dot-files).
TEMP_PREFIX = ".kb-tmp-"
TEMP_SUFFIX = ".tmp"
# A leftover temp file older than this belongs to no live writer (writes finish in well under a minute).
STALE_TEMP_S = 600.0


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable where the OS supports opening folders (POSIX); a no-op elsewhere."""
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (e.g. network mounts) refuse fsync on a folder; the rename itself is still atomic
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None, durable: bool = True) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a part of one.

    `mode` sets the new file's permission bits (e.g. a note's own); `durable=False` skips the fsyncs for
    caches that are cheap to rebuild.
    """
    atomic_write_with(path, lambda f: f.write(data), mode=mode, durable=durable)


def atomic_write_with(path: Path, write: Callable[[BinaryIO], object], *, mode: int | None = None, durable: bool = True) -> None:
    """atomic_write_bytes for a writer that streams into the file (`write(f)`), so a large file never has to be
    held in memory whole first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, mode: int | None = None, durable: bool = True) -> None:
    """atomic_write_bytes for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)


def drop_older_caches(folder: Path, prefix: str, current: str) -> None:
    """Delete the files in `folder` named `prefix*` but not `current*`: caches an earlier package or layout wrote,
    which nothing reads any more (a file another process still maps, on Windows, is left for next time)."""
    for old in folder.glob(f"{prefix}*"):
        if not old.name.startswith(current):
            with contextlib.suppress(OSError):
                old.unlink()


def sweep_temp_files(folder: Path, *, older_than_s: float = STALE_TEMP_S, recursive: bool = False) -> list[Path]:
    """Delete temp files a killed writer left in `folder` (only ours, only old ones); returns what was removed."""
    removed: list[Path] = []
    cutoff = time.time() - older_than_s
    pattern = f"**/{TEMP_PREFIX}*{TEMP_SUFFIX}" if recursive else f"{TEMP_PREFIX}*{TEMP_SUFFIX}"
    try:
        candidates = list(folder.glob(pattern))
    except OSError:
        return removed
    for p in candidates:
        try:
            if p.is_file() and not p.is_symlink() and p.stat().st_mtime < cutoff:
                p.unlink()
                removed.append(p)
        except OSError as e:
            logger.debug("could not remove leftover temp file %s: %s", p, e)
    if removed:
        logger.info("removed %d temp files left by an interrupted write in %s", len(removed), folder)
    return removed


class WordTableFile:
    """A word -> count table (jieba's prefix dictionary) in one file: read in ~0.3 s where jieba's own marshal cache
    takes 1.1-1.4 s here. A cache: written atomically, and any file that does not match is ignored (None) and rewritten.

    Format: a JSON header line (FORMAT, the caller's `key`, total, word count, bytes of words), the words joined by
    newlines in UTF-8, then the counts as little-endian int64.
    """

    FORMAT = "kb-word-table-1"

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, key: str) -> tuple[dict[str, int], int] | None:
        """The table and its total if the file holds one written under `key`, else None (logged when unusable)."""
        try:
            with self.path.open("rb") as f:
                header = json.loads(f.readline())
                if header.get("format") != self.FORMAT or header.get("key") != key:
                    return None
                words = f.read(int(header["words_bytes"])).decode("utf-8").split("\n")
                counts = array("q")
                counts.frombytes(f.read())
            count, total = int(header["count"]), int(header["total"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            logger.info("ignoring the word table cache %s (%s: %s); it is rebuilt", self.path, type(e).__name__, e)
            return None
        if len(words) != count or len(counts) != count:
            logger.info("ignoring the word table cache %s: it is truncated; it is rebuilt", self.path)
            return None
        if sys.byteorder != "little":
            counts.byteswap()
        return dict(zip(words, counts.tolist())), total

    def write(self, key: str, table: dict[str, int], total: int) -> None:
        """Store `table` under `key` (best effort: a cache that cannot be written is logged, not raised)."""
        words = "\n".join(table)
        if len(table) and words.count("\n") != len(table) - 1:
            logger.info("not caching a word table whose words hold newlines")
            return
        raw = words.encode("utf-8")
        counts = array("q", table.values())
        if sys.byteorder != "little":
            counts.byteswap()
        header = {"format": self.FORMAT, "key": key, "total": total, "count": len(table), "words_bytes": len(raw)}
        try:
            atomic_write_bytes(self.path, json.dumps(header).encode("utf-8") + b"\n" + raw + counts.tobytes(), durable=False)
        except OSError as e:
            logger.info("could not write the word table cache %s: %s", self.path, e)
