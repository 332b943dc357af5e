"""The index's records and files on disk: per-note and per-chunk records, the sync report, state.json and this
process's copy of it (IndexState), the inter-process lock and atomic writes. Imports: kb_config, kb_files.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from kb_config import LockTimeoutError
from kb_files import atomic_write_text

# Bump when state.json's layout changes; an older state is rebuilt from the vault.
STATE_FORMAT = 3
# How often a process waiting for the index lock tries again.
LOCK_POLL_S = 0.05
# Encodings decode_note may return: name -> (codec of the text, byte-order mark a note in it starts with). Appends
# encode only the codec; a whole rewritten note gets the mark back. GB18030 covers GBK-era Chinese notes.
NOTE_ENCODINGS = {
    "utf-8": ("utf-8", b""),
    "utf-8-sig": ("utf-8", b"\xef\xbb\xbf"),
    "utf-16-le": ("utf-16-le", b"\xff\xfe"),
    "utf-16-be": ("utf-16-be", b"\xfe\xff"),
    "gb18030": ("gb18030", b""),
}


class LinkRow(NamedTuple):
    """One outgoing link as stored (kb_links.Link without its kind); "" where absent. A tuple in state.json."""

    target: str
    heading: str
    block: str
    label: str
    embed: bool
    line: int


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
    properties: dict[str, tuple[str, ...]] = field(default_factory=dict)  # frontmatter and Logseq key:: value
    date: str = ""  # ISO date of a journal or daily note (file name or `date` property), else ""
    links: tuple[LinkRow, ...] = ()  # outgoing links as written, resolved against the vault when read
    headings: tuple[int, ...] = ()  # levels of its headings in order (kb_text.heading_levels): what a translation keeps
    ctime_ns: int = 0  # with inode, the rest of the change signature (kb_scan.Stat); 0 in indexes written before it
    inode: int = 0

    @property
    def stat(self) -> tuple[int, int, int, int]:
        """The change signature it was indexed at, in kb_scan.Stat's order."""
        return (self.mtime_ns, self.size, self.ctime_ns, self.inode)

    def with_stat(self, stat: tuple[int, int, int, int]) -> FileRecord:
        """The same record at a new change signature (content unchanged)."""
        return replace(self, mtime_ns=stat[0], size=stat[1], ctime_ns=stat[2], inode=stat[3])


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
    committed: bool = True  # False when nothing was committed (model unavailable, or lock busy): keyword view only
    lock_timeout: bool = False  # the index lock stayed busy: nothing was committed
    pending_vectors: int = 0  # committed chunks still without a vector (embedding in the background)
    embedded_by_model: dict[str, int] = field(default_factory=dict)  # chunks each model embedded (several models)

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
            + ("" if self.committed or self.lock_timeout else " (keyword index only: model unavailable)")
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
    """Decode a note whose encoding is unambiguous; returns (text without byte-order mark, a NOTE_ENCODINGS key).

    UTF-8 (BOM allowed), UTF-16 with a BOM, and GB18030 only when the bytes read as Chinese: nearly every double-byte
    character in the GB2312 range (hanzi and CJK punctuation) and no private-use characters. Anything else raises
    ValueError saying what the note looks like (cp1252/Latin-1, UTF-16 without a BOM, binary), so the note is
    skipped and appends to it refused, instead of being mis-decoded and then written back in the wrong encoding.
    """
    import re

    # Share of GB18030 multi-byte characters that must be GB2312 hanzi or punctuation for the note to read as Chinese.
    gb2312_min_share = 0.9
    # Bytes looked at for NULs (binary files, UTF-16 without a byte-order mark).
    head_bytes = 8192
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        raise ValueError("UTF-32 text, which notes may not use; convert the note to UTF-8")
    for name, (codec, bom) in NOTE_ENCODINGS.items():
        if bom and raw.startswith(bom):
            try:
                return raw[len(bom) :].decode(codec), name
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"starts with a {name.upper()} byte-order mark but is not valid {codec.upper()} ({e.reason} at "
                    f"byte {e.start + len(bom)}); convert the note to UTF-8"
                ) from e
    head = raw[:head_bytes]
    if b"\x00" in head:
        # UTF-16 of mostly ASCII text has a NUL in nearly every other byte, all on the same side.
        fewer, more = sorted((head[0::2].count(0), head[1::2].count(0)))
        if more >= 0.4 * (len(head) // 2) and fewer <= 0.05 * (len(head) // 2):
            raise ValueError("looks like UTF-16 text without a byte-order mark; save the note as UTF-8")
        raise ValueError("binary file (NUL bytes)")
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        text = raw.decode("gb18030")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        # One match per multi-byte character (ASCII is skipped over); group 1 is set only for a GB2312 pair.
        gb_char = rb"([\xa1-\xa9\xb0-\xf7][\xa1-\xfe])|[\x81-\xfe](?:[\x30-\x39][\x81-\xfe][\x30-\x39]|[\x40-\xfe])"
        chars = re.findall(gb_char, raw)
        gb2312 = len(chars) - chars.count(b"")
        if gb2312 >= gb2312_min_share * len(chars) and not re.search("[\ue000-\uf8ff]", text):
            return text, "gb18030"
    # Accented Latin text has mostly single high bytes between ASCII letters; CJK legacy encodings have long runs.
    runs = re.findall(rb"[\x80-\xff]+", raw)
    single = sum(1 for r in runs if len(r) == 1)
    guess = "looks like cp1252/Latin-1" if 2 * single >= len(runs) else "a legacy 8-bit encoding such as Big5 or Shift-JIS"
    raise ValueError(f"not UTF-8 text ({guess}); convert the note to UTF-8")


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
    data["files"] = {p: _record(r) for p, r in data["files"].items()}
    return data


def _record(r: dict[str, Any]) -> FileRecord:
    """A FileRecord from its JSON form (lists back to tuples)."""
    return FileRecord(
        **{
            **r,
            "chunks": tuple(r["chunks"]),
            "tags": tuple(r["tags"]),
            "aliases": tuple(r["aliases"]),
            "properties": {k: tuple(v) for k, v in r.get("properties", {}).items()},
            "links": tuple(LinkRow(*x) for x in r.get("links", ())),
            "headings": tuple(r.get("headings", ())),
        }
    )


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


class IndexState:
    """This process's copy of state.json, the commit point: every note's record and the index's metadata (its
    parameters, generation and the vector segments it names), and whether the file is still the one this process
    read or wrote. A writer commits while it holds the index's FileLock; `lock` lets this process's threads re-read
    it one at a time.

    Example: state = IndexState(path, params); state.read(reasons, ("chunk_tokens",)); state.files["inbox.md"].md5
    """

    def __init__(self, path: Path, params: dict[str, Any]) -> None:
        self.path = path
        self.params = params
        self.files: dict[str, FileRecord] = {}
        self.stats: dict[str, tuple[int, int, int, int]] = {}  # path -> change signature: the no-change fast path
        self.rework = False  # some record must be re-read (its chunking parameters changed)
        self.meta: dict[str, Any] = {}  # everything but the records: params, generation, segments
        self.model_switch = False  # state.json names another model: check ours loads, then re-embed everything
        self.loaded = False  # False until the first read
        self.version = 0  # counts every change of what this copy holds (caches derived from it compare it)
        self.lock = threading.RLock()
        self._identity: tuple[int, int, int] | None = None  # file_identity at the last read or commit
        self._stale = False  # True after a failed commit: re-read even when state.json looks unchanged (or absent)

    @property
    def segments(self) -> tuple[str, ...]:
        """The vector segments state.json names."""
        return tuple(self.meta.get("segments", ()))

    @property
    def stored_model(self) -> str | None:
        return self.meta.get("params", {}).get("model")

    def is_current(self) -> bool:
        """True while state.json is the file this process last read or wrote (no other process committed since)."""
        return self.loaded and not self._stale and file_identity(self.path) == self._identity

    def forget(self) -> None:
        """Make `is_current` False until the next read or commit: what this process holds may not be what state.json
        says."""
        self._stale = True
        self.version += 1

    def read(self, reasons: list[str], chunk_params: tuple[str, ...]) -> None:
        """Load state.json. A record indexed with other `chunk_params` than ours is marked for a re-read; an unusable
        file is treated as empty; each is said in `reasons`."""
        self._identity = file_identity(self.path)
        self.loaded, self._stale = True, False
        try:
            data = read_state_file(self.path)
        except ValueError as e:
            reasons.append(f"state file {self.path} is unusable ({e}); re-indexing from the notes (vectors are re-embedded)")
            data = None
        if data is None:
            self.clear()
            return
        files: dict[str, FileRecord] = data.pop("files")
        old = data.get("params", {})
        self.model_switch = old.get("model") != self.params["model"]
        changed = [k for k in chunk_params if old.get(k) != self.params[k]]
        if changed:
            changes = ", ".join(f"{k} {old.get(k)} -> {self.params[k]}" for k in changed)
            reasons.append(f"chunking changed ({changes}): re-chunking every note; vectors of unchanged text are reused")
            files = {p: replace(r, md5="") for p, r in files.items()}  # md5 "" forces a re-read
        self.adopt(files)
        self.meta = data

    def clear(self) -> None:
        """No records and no segments (no state.json yet, an unusable one, a rebuild); the generation counts on."""
        self.adopt({})
        self.meta = {"generation": self.meta.get("generation", 0)}
        self.model_switch = False

    def adopt(self, files: dict[str, FileRecord]) -> None:
        """Take a new table of records (committed by `commit`)."""
        self.files = files
        self.version += 1
        self.stats = {p: r.stat for p, r in files.items()}
        self.rework = any(not (r.md5 or r.skipped) for r in files.values())

    def commit(self, segments: Sequence[str] | None, loaded_segments: Sequence[str]) -> None:
        """Replace state.json with the records held. `segments` replaces the list of vector segments it names; None
        keeps the list, or names `loaded_segments` (what the store holds) when the file named none yet."""
        meta = dict(self.meta, params=self.params, generation=int(self.meta.get("generation", 0)) + 1)
        if segments is not None:
            meta["segments"] = list(segments)
        meta.setdefault("segments", list(loaded_segments))
        try:
            write_state_file(self.path, meta, self.files)
        except BaseException:
            # Not committed (a full disk, a quota, a kill): what this process holds is not the index; the next sync
            # reads state.json again and redoes what it lacks, instead of taking its own uncommitted records as done.
            self.forget()
            raise
        self.meta = meta
        self.version += 1
        self._identity, self._stale = file_identity(self.path), False
