"""File events -> the notes to re-check: the change collector and the watchdog observer the server and watcher.py share.

The operating system reports what changed (inotify, FSEvents, ReadDirectoryChangesW; polling on request), so a
caller re-checks just those paths instead of walking the vault. A folder deleted or moved away is reported as that
folder alone; `expand_folders` turns it into the notes indexed under it. What events cannot settle (an ignore file
changed, the kernel dropped events) asks for a full walk. Imports: nothing from the project
(watchdog lazily).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

logger = logging.getLogger(__name__)

# gitignore-style file whose change alters what is indexed anywhere below it (kb_scan.KBIGNORE_NAME; kept apart so
# this module imports nothing from the project).
KBIGNORE_NAME = ".kbignore"
# Never hold debounced changes longer than this, even while events keep coming (watcher.py).
MAX_DELAY_S = 10.0
# Default rescan interval of the polling observer.
DEFAULT_POLL_INTERVAL_S = 2.0
# How long watchdog's inotify emitter may hold a rename's first half to pair it with the second (its default 0.5 s
# delayed every rename, and every event behind it, past the next search; see _unhold_moves).
MOVE_PAIRING_DELAY_S = 0.0
# watchdog logs this (logger below) when the kernel's inotify queue overflowed and events were lost; it has no
# callback for it, so the log record is the signal.
_OVERFLOW_LOGGER = "watchdog.observers.inotify_c"
_OVERFLOW_TEXT = "overflow"


@dataclass
class Changes:
    """What happened since the last take: files touched, folders gone, or a full walk needed (and why)."""

    paths: set[str] = field(default_factory=set)  # absolute: created, modified, deleted, moved from or to
    folders: set[str] = field(default_factory=set)  # absolute: deleted or moved away (their notes left with them)
    full: bool = False
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.paths or self.folders or self.full)

    def merge(self, other: Changes) -> None:
        self.paths |= other.paths
        self.folders |= other.folders
        if other.full and not self.full:
            self.full, self.reason = True, other.reason


class ChangeCollector:
    """Collects changes from watchdog events (observer thread); callers take them whole (server) or debounced (watcher)."""

    def __init__(self, kb_dir: Path, extensions: Sequence[str] = ()) -> None:
        self.kb_dir = kb_dir
        self._extensions = tuple(e.lower() for e in extensions)  # empty: keep every file
        self._lock = threading.Lock()
        self._pending = Changes()
        self._first_at: float | None = None
        self._last_at = 0.0
        self.events = 0  # events seen since start (index_status shows it)
        self.wake = threading.Event()

    def _is_candidate(self, path: str) -> bool:
        name = PurePath(path).name
        if name == KBIGNORE_NAME or not self._extensions:
            return True
        return name.lower().endswith(self._extensions)

    def on_event(self, event: Any) -> None:
        """watchdog callback (its observer thread): record what the event touched."""
        kind = event.event_type
        if kind in ("opened", "closed_no_write"):
            return
        src = _text(event.src_path)
        dest = _text(getattr(event, "dest_path", "") or "")
        with self._lock:
            pending = self._pending
            if event.is_directory:
                # A new folder's files and a moved folder's files come as events of their own (watchdog walks them);
                # a folder deleted or moved out of the vault comes alone: its notes are found in the index.
                if kind in ("deleted", "moved") and src:
                    pending.folders.add(src)
            else:
                for p in (src, dest):
                    if not p:
                        continue
                    if PurePath(p).name == KBIGNORE_NAME:
                        pending.full, pending.reason = True, f"ignore rules changed ({p})"
                    if self._is_candidate(p):
                        pending.paths.add(p)
            self._touch()

    def mark_full(self, reason: str) -> None:
        """Ask for a full walk (events were lost, or cannot be trusted)."""
        with self._lock:
            self._pending.full, self._pending.reason = True, reason
            self._touch()

    def _touch(self) -> None:
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        self._last_at = now
        self.events += 1
        self.wake.set()

    @property
    def pending(self) -> bool:
        """Whether changes are waiting to be taken."""
        with self._lock:
            return bool(self._pending)

    @property
    def last_event_at(self) -> float:
        """time.monotonic() of the latest event (0.0: none yet)."""
        return self._last_at

    def take(self, debounce_s: float = 0.0) -> Changes | None:
        """The collected changes once quiet for `debounce_s` (or held MAX_DELAY_S); None if none or not yet quiet."""
        with self._lock:
            if self._first_at is None or not self._pending:
                return None
            now = time.monotonic()
            if now - self._last_at < debounce_s and now - self._first_at < MAX_DELAY_S:
                return None
            taken, self._pending, self._first_at = self._pending, Changes(), None
            self.wake.clear()
            return taken

    def put_back(self, changes: Changes) -> None:
        """Return changes a caller could not apply (the index was busy), to be taken again with any newer ones."""
        if not changes:
            return
        with self._lock:
            self._pending.merge(changes)
            if self._first_at is None:
                self._first_at = time.monotonic()
            self.wake.set()


def paths_to_check(changes: Changes, kb_dir: Path, indexed: Iterable[str]) -> list[str] | None:
    """The paths a batch of changes asks to re-check: the changed files plus every indexed note (vault-relative)
    under a folder gone; None when the whole vault must be walked (a full-walk request, or the vault folder itself
    among the folders gone)."""
    if changes.full:
        return None
    paths = set(changes.paths)
    prefixes = []
    for folder in changes.folders:
        try:
            rel = Path(folder).relative_to(kb_dir).as_posix()
        except ValueError:
            continue
        if rel in ("", "."):
            return None
        prefixes.append(rel + "/")
    if prefixes:
        starts = tuple(prefixes)
        paths.update(p for p in indexed if p.startswith(starts))
    return sorted(paths)


class _OverflowHook(logging.Handler):
    """Turns watchdog's "queue overflowed" log record into a full-walk request on every live collector."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.collectors: set[ChangeCollector] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if _OVERFLOW_TEXT in record.getMessage().lower():
            for c in list(self.collectors):
                c.mark_full("the operating system dropped file events (inotify queue overflow)")


_overflow_hook = _OverflowHook()


def start_observer(
    kb_dir: Path, collector: ChangeCollector, *, poll: bool = False, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
) -> Any:
    """A started watchdog observer feeding `collector` with events under `kb_dir` (recursive).

    Raises OSError (or ImportError without watchdog) when the folder cannot be watched, e.g. the inotify instance
    limit is reached: the caller then falls back to walking the vault. Stop it with stop_observer.
    """
    from watchdog.events import (
        DirDeletedEvent,
        DirMovedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
        FileSystemEventHandler,
    )
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event: Any) -> None:
            collector.on_event(event)

    # Only what can change a note's content or place: no open/read events, so reading notes causes no events.
    kinds = [
        FileCreatedEvent,
        FileModifiedEvent,
        FileClosedEvent,
        FileDeletedEvent,
        FileMovedEvent,
        DirDeletedEvent,
        DirMovedEvent,
    ]
    if not poll:
        _unhold_moves()
    observer = PollingObserver(timeout=poll_interval_s) if poll else Observer()
    observer.schedule(Handler(), str(kb_dir), recursive=True, event_filter=kinds)
    logging.getLogger(_OVERFLOW_LOGGER).addHandler(_overflow_hook)
    _overflow_hook.collectors.add(collector)
    try:
        observer.start()
    except BaseException:
        _overflow_hook.collectors.discard(collector)
        raise
    return observer


def _unhold_moves() -> None:
    """Make watchdog's inotify emitter pass renames on at once instead of holding them for pairing.

    watchdog holds each IN_MOVED_FROM up to `InotifyMoveEventGrouper.delay` (0.5 s) to pair it with its IN_MOVED_TO,
    and every later event waits behind it: an editor's atomic save (write a temp file, rename it over the note) then
    reached us ~0.5 s late, after the next search. We never need the pair (both paths are re-checked, a folder that
    left is expanded from the index), so an unpaired move arrives as a deletion plus a creation, which is the same to
    us. Set before the observer starts: each watch reads it when created.
    """
    try:
        from watchdog.observers.inotify_move_event_grouper import InotifyMoveEventGrouper
    except ImportError:  # another platform, or another watchdog layout: moves are merely later there
        return
    InotifyMoveEventGrouper.delay = MOVE_PAIRING_DELAY_S


def stop_observer(observer: Any, collector: ChangeCollector, timeout_s: float = 5.0) -> None:
    """Stop an observer from start_observer and wait (bounded) for its threads."""
    _overflow_hook.collectors.discard(collector)
    try:
        observer.stop()
        observer.join(timeout=timeout_s)
    except RuntimeError:  # never started
        pass


def _text(path: Any) -> str:
    return path.decode(errors="surrogateescape") if isinstance(path, bytes) else str(path)
