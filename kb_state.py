"""The index's records and files on disk: per-note and per-chunk records, the sync report, state.json,
the inter-process lock and atomic writes. Imports kb_config only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kb_config import LockTimeoutError

# Bump when state.json's layout changes; an older state is rebuilt from the vault.
STATE_FORMAT = 2
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
    vectors: bool = True  # False when the model was unavailable and only the keyword index was updated

    @property
    def did_work(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.touched or self.skipped or self.chunks_deleted)

    def summary(self) -> str:
        return (
            f"files: {self.added} added, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged + self.touched} unchanged, {self.skipped} skipped; "
            f"chunks: {self.chunks_embedded} embedded, {self.chunks_reused} reused, {self.chunks_deleted} deleted; "
            f"{self.elapsed_ms / 1000:.2f} s" + ("" if self.vectors else " (keyword index only: model unavailable)")
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["details"] = [{"path": p, "action": a} for p, a in self.details]
        return d


class FileLock:
    """Inter-process lock on a file (fcntl on POSIX, msvcrt on Windows), re-entrant within one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._depth = 0

    def acquire(self, timeout_s: float) -> None:
        if self._depth:
            self._depth += 1
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout_s
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
                    raise LockTimeoutError(
                        f"another process (ingest, watcher or a server) has held the index lock {self.path} for over "
                        f"{timeout_s:.0f} s; wait for it to finish, or raise sync.lock_timeout"
                    ) from None
                time.sleep(0.05)
        self._fd = fd
        self._depth = 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth or self._fd is None:
            return
        if os.name == "nt":
            import msvcrt

            os.lseek(self._fd, 0, 0)
            msvcrt.locking(self._fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
