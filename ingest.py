"""The ingest CLI: index a vault once in the foreground (the server and the watcher keep it fresh afterwards).

The engine lives in kb_engine; this module only parses flags, shows progress and prints the summary.

Imports: kb_config, kb_engine, kb_vectors.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from kb_config import (
    KBError,
    LockTimeoutError,
    ModelUnavailableError,
    add_common_args,
    load_cli_config,
    pin_blas_threads,
    setup_logging,
)

pin_blas_threads()  # before kb_engine imports numpy: the embedding workers are the parallelism
from kb_engine import Engine, ProgressFn  # noqa: E402
from kb_vectors import config_embedder  # noqa: E402

# Threads that embed side by side here (a foreground job: every core), each running one model call on one BLAS thread
# (kb_embedrun): a second BLAS thread for USE went 94 -> 37 texts/s with a core busy, where workers degrade
# gracefully. The server uses every core too, pausing while a search runs; the watcher keeps one.
INGEST_WORKERS = os.cpu_count() or 1

# ---- CLI ---------------------------------------------------------------------------------------------------------


def _progress_bar(enabled: bool) -> tuple[ProgressFn | None, Callable[[], None]]:
    """A tqdm bar per stage on stderr (files read, chunks embedded by each model) with rate and ETA."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            model = stage.partition(":")[2]  # "embed:<model>": one bar per model
            bar = bars[stage] = tqdm(
                total=total,
                unit="files" if stage == "read" else "chunks",
                file=sys.stderr,
                desc="reading notes" if stage == "read" else f"embedding ({model})" if model else "embedding",
                dynamic_ncols=True,
            )
        bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ingest.py",
        description="Index a folder of Markdown notes for second-brain-mcp. Only notes whose content changed are re-read, "
        "re-chunked and re-embedded; runs offline with the bundled model.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python ingest.py                   # kb_dir from config.yaml (first run: the sample vault)\n"
        "  python ingest.py --kb-dir ~/notes  # your own vault\n  python ingest.py --rebuild --json   # from scratch, JSON summary",
    )
    add_common_args(parser)
    parser.add_argument("--rebuild", action="store_true", help="delete this vault's index and build it from scratch")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument(
        "--allow-mass-delete",
        action="store_true",
        help="confirm that most of the vault's notes are really gone: without it, a sync that would remove more than "
        "half of the indexed notes (or all) keeps the index and says why (an unplugged drive, an unsynced folder)",
    )
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet, default="WARNING")
    try:
        cfg = load_cli_config(args)
        embedder = config_embedder(cfg, allow_download=True)
        engine = Engine(cfg, embedder, embed_workers=INGEST_WORKERS, embed_processes=True)
        engine.allow_mass_delete = args.allow_mass_delete
        progress, close = _progress_bar(not args.quiet and sys.stderr.isatty())
        try:
            report = engine.sync_all(rebuild=args.rebuild, progress=progress)
        finally:
            close()
        if engine.model_error:
            raise ModelUnavailableError(engine.model_error)
        if report.lock_timeout:
            raise LockTimeoutError(" ".join(report.reasons))
        if engine.view_changed:
            engine.save_view()
        warning = engine.model_warning()
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        if args.verbose > 1:
            raise
        return 1
    except OSError as e:
        if e.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        print(
            f"error: the disk holding the index ({cfg.index_dir}) is full ({e.strerror}). Nothing already indexed was "
            "lost: free some space there and run `python ingest.py` again; it redoes only what is missing.",
            file=sys.stderr,
        )
        return 1
    if engine.held_deletions:
        print(f"error: nothing was removed: {engine.held_deletions}", file=sys.stderr)
        return 1
    for reason in report.reasons:
        print(reason, file=sys.stderr)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    notes, chunks = engine.view.size()
    if args.json:
        out = report.as_dict()
        out.update(
            kb_dir=str(cfg.kb_dir),
            index_dir=str(cfg.index_dir),
            notes=notes,
            chunks=chunks,
            model=engine.embedder.name,
            warning=warning,
        )
        if not args.verbose:
            out.pop("details")
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    if args.verbose:
        for path, action in report.details:
            print(f"  {action:<9} {path}")
    print(f"{cfg.kb_dir}: {report.summary()}; index holds {notes} notes, {chunks} chunks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
