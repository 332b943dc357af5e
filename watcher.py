"""Optional watcher: keeps the index built ahead of searches by applying file events as they happen.

Uses kb_watch (watchdog: inotify / FSEvents / ReadDirectoryChangesW, or polling with --poll) and the engine, like the
server does before each search. Safe beside the server and the ingest CLI: all writers share the engine's
inter-process lock.

Imports: kb_config, kb_watch; lazily: kb_engine, kb_vectors.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any

from kb_config import KBError, ModelUnavailableError, add_common_args, load_cli_config, pin_blas_threads, setup_logging
from kb_watch import DEFAULT_POLL_INTERVAL_S, ChangeCollector, Changes, paths_to_check, start_observer, stop_observer

logger = logging.getLogger("watcher")

# Default quiet time after the last event before changes are applied (editors save in bursts).
DEFAULT_DEBOUNCE_S = 1.0
# Save the keyword view for the next process's fast start at most this often.
SAVE_VIEW_EVERY_S = 60.0


def apply_changes(engine: Any, changes: Changes | None, verbose: bool) -> Any:
    """Apply collected changes through the engine (None: a full sync); prints each handled file with --verbose."""
    paths = None if changes is None else paths_to_check(changes, engine.cfg.kb_dir, engine.view.paths())
    report = engine.sync_all() if paths is None else engine.apply_file_changes(paths)
    if report.pending_vectors and engine.model_error is None:  # a big batch (a git pull): embed it all now
        engine.embed_pending()
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
    collector = ChangeCollector(engine.cfg.kb_dir, engine.cfg.extensions)
    observer = start_observer(engine.cfg.kb_dir, collector, poll=poll, poll_interval_s=poll_interval_s)
    try:  # the observer runs before the first sync, so no edit made during it is missed
        apply_changes(engine, None, verbose)
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
                apply_changes(engine, batch, verbose)
            except KBError as e:  # a lock held too long, a model error: keep watching, retry with the next events
                logger.warning("could not apply changes: %s", e)
                collector.put_back(batch)
    finally:
        stop_observer(observer, collector)
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
    pin_blas_threads()  # before kb_engine imports numpy
    try:
        cfg = load_cli_config(args)
        from kb_engine import Engine
        from kb_vectors import config_embedder

        embedder = config_embedder(cfg, allow_download=True)
        engine = Engine(cfg, embedder)
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
