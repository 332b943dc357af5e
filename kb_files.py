"""The one atomic-write helper (temp file, fsync, rename, fsync of the folder) and the sweep of its leftovers.

Every file the project writes (state.json, the BM25 view, vector segments, appended notes) goes through here; and
WordTableFile, the per-user word tables (jieba's dictionary, USE's pieces) every process maps instead of holding its
own copy (MappedWords, WordCounts).
Imports: nothing from the project.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import mmap
import os
import sys
import tempfile
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any, BinaryIO

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


def drop_older_caches(folder: Path, prefix: str, current: str | None = None) -> None:
    """Delete the files in `folder` named `prefix*` but not `current*` (every one without `current`): caches an earlier
    package or layout wrote, which nothing reads any more (a file another process still maps, on Windows, is left for
    next time)."""
    for old in folder.glob(f"{prefix}*"):
        if current is None or not old.name.startswith(current):
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


class MappedWords(Mapping[str, int]):
    """A read-only word -> count table in a WordTableFile, looked up in the mapped file: open addressing over the
    words' CRC-32, the words' UTF-8 bytes compared on a hit. Nothing is read into the process up front, and the pages
    lookups touch are shared with every other process mapping the same file: jieba's 500k-word dictionary is a 12 MB
    file, where a dict of it is ~56 MB of each process's private memory."""

    def __init__(self, mapped: mmap.mmap, start: int, slots: int, count: int) -> None:
        self._map = mapped  # kept open for the table's life
        view = memoryview(mapped)
        self._keys = view[start : start + 8 * slots].cast("Q")  # (word offset + 1) << 16 | its bytes; 0: empty slot
        self._counts = view[start + 8 * slots : start + 12 * slots].cast("i")
        self._words = view[start + 12 * slots - 1 :]  # offsets count from 1
        self._slots = slots
        self._count = count

    def get(self, word: str, default: Any = None) -> Any:  # type: ignore[override]  # the hot path: no exceptions
        raw = word.encode("utf-8", "surrogatepass")
        n = len(raw)
        keys, slots, words = self._keys, self._slots, self._words
        i = zlib.crc32(raw) % slots
        while key := keys[i]:
            if key & 0xFFFF == n and words[key >> 16 : (key >> 16) + n] == raw:
                return self._counts[i]
            i = i + 1 if i + 1 < slots else 0
        return default

    def __getitem__(self, word: str) -> int:
        count = self.get(word)
        if count is None:
            raise KeyError(word)
        return count

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and self.get(word) is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        words = self._words
        for key in self._keys:
            if key:
                yield bytes(words[key >> 16 : (key >> 16) + (key & 0xFFFF)]).decode("utf-8", "surrogatepass")


# Words a WordCounts remembers from its table: enough for a long note's, bounded so a long-lived server's stays ~2 MB.
WORD_MEMO_SIZE = 16_384

_UNSEEN = object()


class WordCounts(MutableMapping[str, int]):
    """A shared, read-only word table (a MappedWords, or a dict) with one user's own words on top: jieba's FREQ for one
    kb_text.Tokenizer (jieba's add_word writes here, never into the shared table), USE's piece table. Lookups are
    memoised: a mapped table costs ~1 us a word, and tokenizers ask for the same substrings again and again."""

    def __init__(self, table: Mapping[str, int]) -> None:
        self._table = table
        self._own: dict[str, int] = {}
        self._known: dict[str, int | None] = {}  # memo: the own words, then words looked up (None: absent)

    def get(self, word: str, default: Any = None) -> Any:  # type: ignore[override]  # jieba's hot path
        count = self._known.get(word, _UNSEEN)
        if count is _UNSEEN:
            count = self._table.get(word)
            if len(self._known) >= WORD_MEMO_SIZE:
                self._known = dict(self._own)
            self._known[word] = count
        return default if count is None else count

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and self.get(word) is not None

    def __getitem__(self, word: str) -> int:
        count = self.get(word)
        if count is None:
            raise KeyError(word)
        return count

    def __setitem__(self, word: str, count: int) -> None:
        self._own[word] = count
        self._known[word] = count

    def __delitem__(self, word: str) -> None:
        raise TypeError("jieba's dictionary is shared: set a word's count to 0 instead (jieba's del_word)")

    def __len__(self) -> int:
        return len(self._table) + sum(1 for w in self._own if w not in self._table)

    def __iter__(self) -> Iterator[str]:
        yield from self._table
        yield from (w for w in self._own if w not in self._table)


class WordTableFile:
    """A word -> count table (jieba's prefix dictionary) in one file, mapped rather than read (MappedWords): opened in
    ~1 ms where jieba's own marshal cache takes 1.1-1.4 s here and a dict of it ~56 MB per process. A cache: written
    atomically, and any file that does not match is ignored (None) and rewritten.

    Format: a JSON header line (FORMAT, the caller's `key`, total, word count, slots, bytes of words) padded to a
    multiple of 8 bytes; the slots' keys as little-endian uint64, their counts as int32, then the words in UTF-8.
    Small on purpose: a process's lookups soon touch every page of it (the kernel maps 64 KB around each page read).
    """

    FORMAT = "kb-word-table-2"
    # Slots filled at most: a lookup probes ~2.5 slots on a hit, ~8 on a miss, most in the same cache line.
    LOAD = 0.75

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, key: str) -> tuple[Mapping[str, int], int] | None:
        """The table and its total if the file holds one written under `key`, else None (logged when unusable)."""
        if sys.byteorder != "little":
            return None  # written little-endian; a big-endian machine keeps jieba's own dictionary
        try:
            with self.path.open("rb") as f:
                header = json.loads(f.readline(4096))
                if header.get("format") != self.FORMAT or header.get("key") != key:
                    return None
                start, slots, count = f.tell(), int(header["slots"]), int(header["count"])
                size = os.fstat(f.fileno()).st_size
                if count >= slots or size != start + 12 * slots + int(header["words_bytes"]):
                    logger.info("ignoring the word table cache %s: it is truncated; it is rebuilt", self.path)
                    return None
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            return MappedWords(mapped, start, slots, count), int(header["total"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            logger.info("ignoring the word table cache %s (%s: %s); it is rebuilt", self.path, type(e).__name__, e)
            return None

    def write(self, key: str, table: Mapping[str, int], total: int) -> None:
        """Store `table` under `key` (best effort: a cache that cannot be written is logged, not raised)."""
        slots = math.ceil(len(table) / self.LOAD) + 1
        keys, counts, words = array("Q", bytes(8 * slots)), array("i", bytes(4 * slots)), bytearray()
        for word, count in table.items():
            raw = word.encode("utf-8", "surrogatepass")
            if len(raw) > 0xFFFF or not -(2**31) <= count < 2**31:
                logger.info("not caching a word table holding %r: %d bytes, count %d", word[:40], len(raw), count)
                return
            i = zlib.crc32(raw) % slots
            while keys[i]:
                i = i + 1 if i + 1 < slots else 0
            keys[i], counts[i] = (len(words) + 1) << 16 | len(raw), count
            words += raw
        if sys.byteorder != "little":
            return
        header = {"format": self.FORMAT, "key": key, "total": total, "count": len(table), "slots": slots}
        line = json.dumps(header | {"words_bytes": len(words)}).encode("utf-8")
        line += b" " * (-(len(line) + 1) % 8) + b"\n"

        def write(f: BinaryIO) -> None:
            for part in (line, keys, counts, words):
                f.write(part)

        try:
            atomic_write_with(self.path, write, durable=False)
        except OSError as e:
            logger.info("could not write the word table cache %s: %s", self.path, e)
