"""Optional watcher: keeps the index built ahead of searches by applying file events as they happen.

Uses watchdog (inotify / FSEvents / ReadDirectoryChangesW, or polling with --poll) and ingest.Engine.
Safe beside the server and the ingest CLI: all writers share the engine's inter-process lock.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kb_config import KBError, ModelUnavailableError, add_common_args, load_cli_config, setup_logging

logger = logging.getLogger("watcher")

# Default quiet time after the last event before changes are applied (editors save in bursts).
DEFAULT_DEBOUNCE_S = 1.0
# Never hold changes longer than this, even while events keep coming.
MAX_DELAY_S = 10.0
# Save the keyword view for the next process's fast start at most this often.
SAVE_VIEW_EVERY_S = 60.0
# Default rescan interval of the polling observer.
DEFAULT_POLL_INTERVAL_S = 2.0


class ChangeCollector:
    """Collects note paths from file events; a folder event or an ignore-file change asks for a full sync."""

    def __init__(self, kb_dir: Path) -> None:
        self.kb_dir = kb_dir
        self._lock = threading.Lock()
        self._paths: set[str] = set()
        self._full = False
        self._first_at: float | None = None
        self._last_at = 0.0
        self.wake = threading.Event()

    def on_event(self, event: Any) -> None:
        """watchdog callback (its observer thread): record what the event touched."""
        if event.event_type in ("opened", "closed_no_write"):
            return
        paths = [event.src_path] + ([event.dest_path] if getattr(event, "dest_path", "") else [])
        paths = [p.decode() if isinstance(p, bytes) else p for p in paths]
        full = event.is_directory and event.event_type in ("moved", "deleted", "created")
        full = full or any(Path(p).name == ".kbignore" for p in paths)
        with self._lock:
            now = time.monotonic()
            if self._first_at is None:
                self._first_at = now
            self._last_at = now
            self._full |= full
            if not event.is_directory:
                self._paths.update(paths)
        self.wake.set()

    def take(self, debounce_s: float) -> tuple[list[str], bool] | None:
        """The collected changes once quiet for `debounce_s` (or held MAX_DELAY_S), else None."""
        with self._lock:
            if self._first_at is None:
                return None
            now = time.monotonic()
            if now - self._last_at < debounce_s and now - self._first_at < MAX_DELAY_S:
                return None
            paths, full = sorted(self._paths), self._full
            self._paths, self._full, self._first_at = set(), False, None
            self.wake.clear()
            return paths, full


def make_observer(kb_dir: Path, collector: ChangeCollector, poll: bool, poll_interval_s: float) -> Any:
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event: Any) -> None:
            collector.on_event(event)

    observer = PollingObserver(timeout=poll_interval_s) if poll else Observer()
    observer.schedule(Handler(), str(kb_dir), recursive=True)
    return observer


def apply_changes(engine: Any, paths: list[str], full: bool, verbose: bool) -> Any:
    """Apply collected changes through the engine; prints each handled file with --verbose."""
    report = engine.sync_all() if full else engine.apply_file_changes(paths)
    if verbose:
        for path, action in report.details:
            print(f"{action:<9} {path}", flush=True)
    if report.did_work or report.reasons:
        logger.info("%s", report.summary())
    return report


def watch(
    engine: Any,
    stop: threading.Event,
    *,
    debounce_s: float = DEFAULT_DEBOUNCE_S,
    poll: bool = False,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    verbose: bool = False,
    ready: threading.Event | None = None,
) -> None:
    """Run until `stop` is set: an initial full sync, then debounced event batches."""
    collector = ChangeCollector(engine.cfg.kb_dir)
    observer = make_observer(engine.cfg.kb_dir, collector, poll, poll_interval_s)
    observer.start()  # before the first sync, so no edit made during it is missed
    try:
        apply_changes(engine, [], True, verbose)
        if engine.model_error:
            raise ModelUnavailableError(engine.model_error)
        if ready is not None:
            ready.set()
        last_save = time.monotonic()
        while not stop.is_set():
            collector.wake.wait(timeout=min(debounce_s, 0.5))
            batch = collector.take(debounce_s)
            if batch is None:
                if engine.view_changed and time.monotonic() - last_save > SAVE_VIEW_EVERY_S:
                    engine.save_view()
                    last_save = time.monotonic()
                stop.wait(0.05)
                continue
            try:
                apply_changes(engine, *batch, verbose)
            except KBError as e:  # a lock held too long, a model error: keep watching, retry on the next event
                logger.warning("could not apply changes: %s", e)
    finally:
        observer.stop()
        observer.join(timeout=5)
        if engine.view_changed:
            engine.save_view()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="watcher.py",
        description="Optional: watch the notes folder and index every change as it happens, so searches never wait. "
        "The server stays fresh without it; run it for large vaults or slow disks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python watcher.py -v\n  python watcher.py --poll --debounce 5   # network drive or synced folder",
    )
    add_common_args(parser)
    parser.add_argument(
        "--debounce",
        type=float,
        default=DEFAULT_DEBOUNCE_S,
        metavar="SECONDS",
        help=f"quiet time after the last change before indexing (default {DEFAULT_DEBOUNCE_S})",
    )
    parser.add_argument(
        "--poll", action="store_true", help="poll the folder instead of OS events (network drives, shared folders)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL_S,
        metavar="SECONDS",
        help=f"rescan interval with --poll (default {DEFAULT_POLL_INTERVAL_S})",
    )
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    try:
        cfg = load_cli_config(args)
        from ingest import Engine
        from kb_vectors import SentenceTransformerEmbedder

        engine = Engine(
            cfg, SentenceTransformerEmbedder(cfg.embed_model, cfg.embed_device, cfg.embed_batch_size, allow_download=True)
        )
        print(f"watching {cfg.kb_dir} (Ctrl+C to stop)", file=sys.stderr)
        watch(
            engine,
            threading.Event(),
            debounce_s=args.debounce,
            poll=args.poll,
            poll_interval_s=args.poll_interval,
            verbose=bool(args.verbose),
        )
    except KeyboardInterrupt:
        return 0
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
