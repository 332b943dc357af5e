"""The index's records and files on disk: per-note and per-chunk records, the sync report, state.json,
the inter-process lock and atomic writes. Imports kb_config only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kb_config import LockTimeoutError
from kb_files import atomic_write_text

# Bump when state.json's layout changes; an older state is rebuilt from the vault.
STATE_FORMAT = 2
# How often a process waiting for the index lock tries again.
LOCK_POLL_S = 0.05
# Encodings tried, in order, for a note that is not UTF-8 (GB18030 covers GBK-era Chinese notes).
NOTE_ENCODINGS = ("utf-8", "gb18030")


@dataclass(frozen=True)
class FileRecord:
    """What the index holds for one note: its stat, md5, chunk ids and metadata; or why it was skipped."""

    mtime_ns: int
    size: int
    md5: str
    chunks: tuple[str, ...] = ()
    title: str = ""
    tags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    encoding: str = "utf-8"
    skipped: str = ""  # reason, when the note could not be indexed


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """A chunk as search shows it: where it lives, its heading path and text."""

    id: str
    path: str
    heading_path: str
    line_start: int
    line_end: int
    text: str
    context: str  # note title + heading path, indexed and embedded with the text
    content: str  # hash of the embedded text: reuse a vector wherever the same text appears again


@dataclass
class SyncReport:
    """What one sync did; `summary()` is the CLI's one-line report."""

    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    touched: int = 0  # stat changed, content did not
    skipped: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    chunks_deleted: int = 0
    elapsed_ms: float = 0.0
    reasons: list[str] = field(default_factory=list)
    details: list[tuple[str, str]] = field(default_factory=list)  # (path, what happened)
    vectors: bool = True  # False when nothing was committed (model unavailable, or lock busy): keyword view only
    lock_timeout: bool = False  # the index lock stayed busy: nothing was committed
    pending_vectors: int = 0  # committed chunks still without a vector (embedding in the background)

    @property
    def did_work(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.touched or self.skipped or self.chunks_deleted)

    def summary(self) -> str:
        return (
            f"files: {self.added} added, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged + self.touched} unchanged, {self.skipped} skipped; "
            f"chunks: {self.chunks_embedded} embedded, {self.chunks_reused} reused, {self.chunks_deleted} deleted; "
            f"{self.elapsed_ms / 1000:.2f} s"
            + (" (not committed: the index lock was busy)" if self.lock_timeout else "")
            + ("" if self.vectors or self.lock_timeout else " (keyword index only: model unavailable)")
            + (f"; {self.pending_vectors} chunks still to embed" if self.pending_vectors else "")
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["details"] = [{"path": p, "action": a} for p, a in self.details]
        return d


class FileLock:
    """Inter-process lock on a file (fcntl on POSIX, msvcrt on Windows) that also excludes this process's other
    threads; re-entrant only for the thread that holds it.

    Example: `with lock.hold(timeout_s=30): ...` (raises LockTimeoutError saying who to wait for).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._depth = 0
        self._owner: int | None = None
        self._threads = threading.Lock()  # held by the owning thread for as long as it holds the file lock

    def acquire(self, timeout_s: float) -> None:
        if not self._try(timeout_s):
            raise LockTimeoutError(
                f"another process (ingest, watcher or a server) has held the index lock {self.path} for over "
                f"{timeout_s:.0f} s; wait for it to finish, or raise sync.lock_timeout"
            )

    def try_acquire(self) -> bool:
        """Take the lock only if it is free right now."""
        return self._try(0.0)

    def _try(self, timeout_s: float) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        deadline = time.monotonic() + timeout_s
        got = self._threads.acquire(timeout=timeout_s) if timeout_s > 0 else self._threads.acquire(blocking=False)
        if not got:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            self._threads.release()
            raise
        while True:
            try:
                if os.name == "nt":
                    import msvcrt

                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                else:
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    self._threads.release()
                    return False
                time.sleep(LOCK_POLL_S)
        self._fd, self._owner, self._depth = fd, me, 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError(f"{self.path}: released by a thread that does not hold it")
        self._depth -= 1
        if self._depth:
            return
        fd, self._fd, self._owner = self._fd, None, None
        try:
            if fd is not None:
                if os.name == "nt":
                    import msvcrt

                    os.lseek(fd, 0, 0)
                    msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
                else:
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        finally:
            self._threads.release()

    @contextlib.contextmanager
    def hold(self, timeout_s: float) -> Iterator[None]:
        """The lock for the body of a `with` block."""
        self.acquire(timeout_s)
        try:
            yield
        finally:
            self.release()


def decode_note(raw: bytes) -> tuple[str, str]:
    """Decode note bytes as UTF-8 (BOM allowed) or GB18030; returns (text, encoding). Raises ValueError."""
    if b"\x00" in raw[:8192]:
        raise ValueError("binary file (NUL bytes)")
    if raw.startswith(b"\xef\xbb\xbf"):
        return raw[3:].decode("utf-8"), "utf-8-sig"
    for enc in NOTE_ENCODINGS:
        try:
            return raw.decode(enc), enc
        except UnicodeDecodeError:
            continue
    raise ValueError("not UTF-8 or GB18030 text; convert the note to UTF-8")


def read_state_file(path: Path) -> dict[str, Any] | None:
    """The parsed state.json with FileRecords under "files"; None if absent. Raises ValueError if unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(str(e)) from e
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise ValueError(f"format {data.get('format') if isinstance(data, dict) else '?'}, expected {STATE_FORMAT}")
    data["files"] = {
        p: FileRecord(**{**r, "chunks": tuple(r["chunks"]), "tags": tuple(r["tags"]), "aliases": tuple(r["aliases"])})
        for p, r in data["files"].items()
    }
    return data


def write_state_file(path: Path, meta: dict[str, Any], files: dict[str, FileRecord]) -> None:
    """Replace state.json atomically: the commit point of every sync."""
    # r.__dict__, not dataclasses.asdict: asdict deep-copies and took ~0.5 s per write at 9,000 notes
    payload = dict(meta, format=STATE_FORMAT, files={p: r.__dict__ for p, r in files.items()})
    atomic_write_text(path, json.dumps(payload, ensure_ascii=False, separators=(",", ":")))


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of a file, or None: tells whether another process replaced it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
