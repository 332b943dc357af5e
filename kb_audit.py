"""The audit log: one JSON line per tool call over HTTP and per auth event in `audit.jsonl`, rotated by size, every
string masked by an injected function (the wiring passes kb_redact.redact) and cut. Imports: nothing from the project.

Several processes may append to one log: each record is one `os.write` on an O_APPEND descriptor, made while holding
`audit.jsonl.lock` (flock / msvcrt), so the size check, the rotation and the append are one step and no line is lost or
interleaved. A writer that waits over LOCK_WAIT_S appends without rotating (the file may pass max_bytes once).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The log inside its folder; rotated copies add .1 (newest) ... .N (oldest).
LOG_NAME = "audit.jsonl"
# Serialises size check, rotation and append across processes.
LOCK_NAME = "audit.jsonl.lock"
# Longest string kept (after masking); the rest becomes a marker saying how much was cut.
MAX_ARG_CHARS = 200
# Most note paths kept per tool record; the rest are counted in `paths_more`.
MAX_PATHS = 50
# Most items kept per list or dict in arguments; the rest are counted in a marker.
MAX_ITEMS = 50
# Deepest nesting kept in arguments.
MAX_DEPTH = 6
# An auth field whose key contains one of these (case-insensitive) is withheld whatever its value.
SECRET_KEY_WORDS = ("passphrase", "password", "code", "token", "secret", "verifier", "totp")
# What a withheld field's value becomes.
WITHHELD = "[withheld]"
# Keys every record owns; auth fields may not reuse them.
RESERVED_KEYS = ("ts", "kind", "event")
# How long a writer waits for another process's lock, and how often it retries.
LOCK_WAIT_S = 2.0
LOCK_RETRY_S = 0.01
# Permissions of a folder this module creates and of the files it creates (POSIX; best effort on Windows).
DIR_MODE = 0o700
FILE_MODE = 0o600
# Paths format_record shows before "(+N more)".
FORMAT_PATHS = 3
# Characters of a client id format_record shows.
FORMAT_ID_CHARS = 8

_O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _cut(text: str) -> str:
    if len(text) <= MAX_ARG_CHARS:
        return text
    return f"{text[:MAX_ARG_CHARS]}…[cut {len(text) - MAX_ARG_CHARS} chars]"


def _names_secret(key: str) -> bool:
    low = key.lower()
    return any(word in low for word in SECRET_KEY_WORDS)


def _clean(value: Any, mask: Callable[[str], str], *, withhold: bool, depth: int = 0) -> Any:
    """`value` as JSON with every string masked and cut, long lists and deep nesting bounded."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _cut(mask(value))  # mask first: a secret straddling the cut is still found whole
    if depth >= MAX_DEPTH:
        return "[nested too deep]"
    if isinstance(value, Mapping):
        items = list(value.items())
        out: dict[str, Any] = {}
        for k, v in items[:MAX_ITEMS]:
            secret = withhold and _names_secret(str(k))
            out[_cut(mask(str(k)))] = WITHHELD if secret else _clean(v, mask, withhold=withhold, depth=depth + 1)
        if len(items) > MAX_ITEMS:
            out["[more]"] = len(items) - MAX_ITEMS
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = list(value)
        kept = [_clean(v, mask, withhold=withhold, depth=depth + 1) for v in seq[:MAX_ITEMS]]
        return kept + ([f"[+{len(seq) - MAX_ITEMS} more]"] if len(seq) > MAX_ITEMS else [])
    return _cut(mask(str(value)))


def _lock_fd(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _unlock_fd(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)


class AuditLog:
    """Appends audit records to `folder / audit.jsonl` and reads the newest back.

    Deliberately, recording never raises into the caller on disk errors (full disk, permissions): an audit failure must
    not break a search. The first failure logs one warning; when writing works again a second one says how many lines
    were lost.
    """

    def __init__(
        self,
        folder: Path,
        *,
        mask: Callable[[str], str] = lambda s: s,
        max_bytes: int = 2_000_000,
        backups: int = 3,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOG_NAME
        self.max_bytes = max_bytes
        self.backups = backups
        self._mask = mask
        self._now = now
        self._lock = threading.Lock()
        self._lost = 0

    def record_tool(
        self,
        *,
        transport: str,
        client_id: str | None,
        client_name: str | None,
        tool: str,
        arguments: Mapping[str, Any],
        ok: bool,
        ms: float,
        paths: list[str] | tuple[str, ...] = (),
        error: str | None = None,
    ) -> None:
        """Record one tool call: who, which tool, masked arguments, outcome, time, the note paths it returned."""
        try:
            clean = lambda v: _clean(v, self._mask, withhold=False)  # noqa: E731
            rec = {
                "ts": self._timestamp(),
                "kind": "tool",
                "transport": transport,
                "client_id": clean(client_id),
                "client_name": clean(client_name),
                "tool": clean(tool),
                "args": clean(dict(arguments)),
                "ok": bool(ok),
                "ms": round(float(ms), 1),
                "paths": [clean(p) for p in list(paths)[:MAX_PATHS]],
                "error": clean(error),
            }
            if len(paths) > MAX_PATHS:
                rec["paths_more"] = len(paths) - MAX_PATHS
        except Exception as e:  # a masking bug drops the line (never writes it unmasked) and never fails the call
            self._failed(e)
            return
        self._append(rec)

    def record_auth(self, event: str, /, **fields: Any) -> None:
        """Record one auth event; fields named like a secret (token, code, passphrase, ...) are withheld.

        Example: `log.record_auth("login_failure", client_id=cid, failures=3, passphrase=pw)` keeps no passphrase.
        """
        clash = [k for k in fields if k in RESERVED_KEYS]
        if clash:
            raise ValueError(f"audit field names {clash} are reserved ({', '.join(RESERVED_KEYS)}); rename them")
        try:
            rec = {"ts": self._timestamp(), "kind": "auth", "event": _clean(event, self._mask, withhold=True)}
            rec.update(_clean(fields, self._mask, withhold=True))
        except Exception as e:
            self._failed(e)
            return
        self._append(rec)

    def tail(self, n: int = 50) -> list[dict[str, Any]]:
        """The last `n` records across the log and its rotated copies, oldest first; torn lines are skipped."""
        if n <= 0 or not self.folder.is_dir():
            return []
        newest_first: list[dict[str, Any]] = []
        with self._lock, self._held():
            for path in [self.path, *(self._backup(i) for i in range(1, self.backups + 1))]:
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                skipped = 0
                for raw in reversed(data.split(b"\n")):
                    if not raw.strip():
                        continue
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        rec = None
                    if not isinstance(rec, dict):
                        skipped += 1
                        continue
                    newest_first.append(rec)
                    if len(newest_first) >= n:
                        break
                if skipped:
                    logger.warning("skipped %d unreadable line(s) in %s (a write torn by a crash?)", skipped, path)
                if len(newest_first) >= n:
                    break
        return newest_first[::-1]

    def _timestamp(self) -> str:
        return datetime.fromtimestamp(self._now(), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def _backup(self, i: int) -> Path:
        return self.folder / f"{LOG_NAME}.{i}"

    @contextlib.contextmanager
    def _held(self) -> Iterator[bool]:
        """Hold the inter-process lock; yields False (holding nothing) if it cannot be opened or stays busy."""
        try:
            fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | _O_BINARY, FILE_MODE)
        except OSError:
            yield False
            return
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            got = False
            while not got:
                try:
                    _lock_fd(fd)
                    got = True
                except OSError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(LOCK_RETRY_S)
            try:
                yield got
            finally:
                if got:
                    _unlock_fd(fd)
        finally:
            os.close(fd)

    def _append(self, rec: dict[str, Any]) -> None:
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            try:
                if not self.folder.is_dir():
                    self.folder.mkdir(parents=True, mode=DIR_MODE)
                    if os.name != "nt":
                        os.chmod(self.folder, DIR_MODE)  # mkdir's mode passes through the umask
                with self._held() as locked:
                    self._write_line(line, locked)
            except OSError as e:
                self._failed(e)
                return
            if self._lost:
                logger.warning("audit log %s is writable again; %d record(s) were lost", self.path, self._lost)
                self._lost = 0

    def _write_line(self, line: bytes, locked: bool) -> None:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _O_BINARY
        fd = os.open(self.path, flags, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            if locked and size and size + len(line) > self.max_bytes:
                os.close(fd)
                fd = -1
                self._rotate()
                fd = os.open(self.path, flags, FILE_MODE)
                size = os.fstat(fd).st_size
            if locked and size:
                os.lseek(fd, size - 1, os.SEEK_SET)
                if os.read(fd, 1) != b"\n":
                    line = b"\n" + line  # end a line torn by a crash, so it cannot swallow this record
            os.write(fd, line)  # one write on O_APPEND: lines from several processes never interleave
        finally:
            if fd >= 0:
                os.close(fd)

    def _rotate(self) -> None:
        """audit.jsonl -> .1 -> ... -> .N; the oldest is dropped. Runs only under the inter-process lock."""
        if self.backups <= 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups - 1, 0, -1):
            if self._backup(i).exists():
                os.replace(self._backup(i), self._backup(i + 1))
        os.replace(self.path, self._backup(1))

    def _failed(self, err: Exception) -> None:
        self._lost += 1
        if self._lost == 1:
            logger.warning(
                "cannot write the audit log %s (%s); records are dropped until it is writable again (calls go on)",
                self.path,
                err,
            )


def _printable(text: str) -> str:
    # A client picks its own name: no terminal escape sequences reach the owner's screen.
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _show(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def format_record(rec: Mapping[str, Any]) -> str:
    """One human-readable line for `auth log`.

    Example: `2026-12-07 10:31:02Z tool search ok 41ms Claude (a1b2c3d4) -> notes/x.md, notes/y.md`.
    """
    ts = str(rec.get("ts") or "")
    when = ts[:19].replace("T", " ") + "Z" if len(ts) >= 19 else ts or "?"
    kind = rec.get("kind")
    if kind == "tool":
        parts = [when, "tool", str(rec.get("tool")), "ok" if rec.get("ok") else "error", f"{float(rec.get('ms') or 0):.0f}ms"]
        name, cid = rec.get("client_name"), rec.get("client_id")
        if name:
            parts.append(str(name))
        if cid:
            parts.append(f"({str(cid)[:FORMAT_ID_CHARS]})")
        if rec.get("transport") not in (None, "http"):
            parts.append(f"via {rec['transport']}")
        line = " ".join(parts)
        if rec.get("error"):
            line += f": {rec['error']}"
        paths = list(rec.get("paths") or [])
        more = max(0, len(paths) - FORMAT_PATHS) + int(rec.get("paths_more") or 0)
        if paths:
            line += " -> " + ", ".join(str(p) for p in paths[:FORMAT_PATHS]) + (f" (+{more} more)" if more > 0 else "")
    elif kind == "auth":
        rest = " ".join(f"{k}={_show(v)}" for k, v in rec.items() if k not in RESERVED_KEYS)
        line = f"{when} auth {rec.get('event')}" + (f" {rest}" if rest else "")
    else:
        rest = {k: v for k, v in rec.items() if k not in ("ts", "kind")}
        line = f"{when} {kind} {json.dumps(rest, ensure_ascii=False)}"
    return _printable(line)
