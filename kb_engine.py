"""The incremental index engine: keeps one vault's index equal to its notes, safely with several processes at once.

On disk (cfg.index_dir): state.json, the commit point (per-note stat, md5, chunk ids, index parameters, and the list
of vector segments); the vector segments (kb_store); the BM25 pickle (a process's view, so the next one starts fast).
A sync first commits what the notes say (records and chunk ids, no model needed), then embeds the chunks that have
no vector yet, in batches, outside the lock; each batch is one new segment named by one more commit. Every process
re-reads state.json when another one committed. Over 500 lines for a reason: every step of a sync (scan, plan,
commit, embed, reconcile the view) is a step of one protocol under one lock, and reads best in one file; state.json's
copy is kb_state.IndexState.
Imports: kb_chunk, kb_config, kb_embedrun, kb_files, kb_links, kb_scan, kb_state, kb_store, kb_text, kb_vectors, kb_view;
lazily: kb_chroma.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kb_chunk import CHUNKER_VERSION, chunk_context, chunk_note, heading_levels
from kb_config import Config, KBError, LockTimeoutError, ModelUnavailableError, VectorStoreUnavailableError
from kb_embedrun import (
    CHINESE_TEXT_SHARE,
    MIN_LATIN_WORDS,
    Coverage,
    ModelPlan,
    RunMeter,
    SearchGate,
    coverage_note,
    embed_here,
    embed_sliced,
    embeds,
    forked_models,
    plan_models,
    policy_signature,
    run_workers,
    single_blas_thread,
    task_order,
)
from kb_files import WordTableFile, sweep_temp_files
from kb_links import parse_links
from kb_scan import Stat, is_logseq_graph, note_rel_path, note_stat, read_note_bytes, scan_vault
from kb_state import (
    ChunkRecord,
    FileLock,
    FileRecord,
    IndexState,
    LinkRow,
    SyncReport,
    decode_note,
)
from kb_store import VectorStore, pack_revisions
from kb_text import Tokenizer, cjk_share, content_hash
from kb_vectors import MULTILINGUAL_SUGGESTION, Embedder, config_embedder, is_english_only, vector_revisions
from kb_view import IndexView

logger = logging.getLogger(__name__)

# jieba's dictionary as a hash table every process maps (kb_files.WordTableFile), in Config.cache_dir.
JIEBA_TABLE_FILE = "jieba-dictionary.bin"
# Notes' chunks committed to state.json per lock-hold while reading a big vault (no embedding happens under the lock).
COMMIT_CHUNKS = 4096
# Chunks embedded per batch; each batch is one segment and one commit, so a killed ingest loses at most one batch.
EMBED_BATCH = 256
# A sync that finds at most this many chunks without a vector embeds them before it returns (an append, an edit);
# more (a git pull, a first index) are embedded by embed_pending, in the background in the server.
INLINE_EMBED_CHUNKS = 64
# A vault whose chunk text is at least this share CJK counts as mostly Chinese (English-only model warning).
CHINESE_VAULT_SHARE = 0.5
# Chunks sampled, evenly spaced over the index, to estimate the vault's language (the first ones alone were one
# folder: tldr's English pages, so index_status called a vault with 1,535 Chinese pages English-only).
LANGUAGE_SAMPLE_CHUNKS = 2000
# A chunk at least this CJK counts as Chinese in the vault's profile (as a search counts a query).
CHINESE_CHUNK_SHARE = 0.3
# Embed each chunk with its note's aliases and tags (measured in docs/retrieval.md).
EMBED_LABELS = True
# Parameters that decide chunk boundaries; a change re-chunks every note (vectors of unchanged text are reused).
CHUNK_PARAMS = ("chunker", "embed_labels", "chunk_tokens", "overlap_tokens")
# Times state.json is re-read when it names a segment another process just compacted away.
STATE_RETRIES = 5
# How often a process waiting for another's embedding run checks whether it finished.
EMBED_WAIT_POLL_S = 0.5
# A full sync that would remove more than this share of the indexed notes at once, and at least MASS_DELETE_MIN_NOTES
# of them (or every note: the vault folder looks empty), keeps them instead and says why: an unplugged drive, a cloud
# folder not synced yet or a renamed vault must not empty the index. `allow_mass_delete` (ingest --allow-mass-delete)
# confirms a real deletion.
MASS_DELETE_SHARE = 0.5
MASS_DELETE_MIN_NOTES = 20

# state.json's record of which chunks each model embeds (kb_embedrun.policy_signature) its vectors follow.
VECTOR_POLICY_KEY = "vector_policy"

ProgressFn = Callable[[str, int, int], None]


@dataclass
class _Plan:
    """A note read from disk: a new record with its chunks, or `touched` (same md5, new stat: nothing to redo)."""

    path: str
    record: FileRecord
    chunks: list[ChunkRecord]
    touched: bool = False


def _labels(aliases: Sequence[str], tags: Sequence[str]) -> str:
    return " · ".join([*aliases, *tags]) if EMBED_LABELS else ""


def _embed_text(context: str, labels: str, text: str) -> str:
    return "\n".join([context, labels, text] if labels else [context, text])


def embed_text(c: ChunkRecord, rec: FileRecord | None) -> str:
    """What the model embeds for a chunk: title and heading path, the note's aliases and tags, then the text.

    Aliases and tags are often in the other language of a bilingual vault, which gives an English-only
    model a handle on Chinese notes. The chunk's content hash covers exactly this text.
    """
    return _embed_text(c.context, _labels(rec.aliases, rec.tags) if rec else "", c.text)


def content_of(chunk_id: str) -> str:
    """The content hash inside a chunk id ("<path key>-<content hash>[-n]")."""
    return chunk_id.split("-", 2)[1]


def open_vector_store(cfg: Config, model: str) -> Any:
    """The vector store `vector_store.mode` names: segment files beside state.json (local), or a Chroma server."""
    if cfg.vector_mode == "http":
        from kb_chroma import ChromaVectorStore

        return ChromaVectorStore(cfg, model)
    return VectorStore(cfg.index_dir)


class Engine:
    """One vault's index as this process sees it, kept equal to the notes on disk by sync_all / apply_file_changes.

    `view` (files, chunks, bm25, and the vectors in chunk terms) is what searches read; `store` holds the vectors.
    Writers serialize on a file lock held only for commits, never while embedding.
    """

    def __init__(
        self,
        cfg: Config,
        embedder: Embedder | None = None,
        *,
        tokenizer: Tokenizer | None = None,
        embed_workers: int = 1,
        embed_processes: bool = False,
    ) -> None:
        """`embed_workers`: threads that embed side by side, each running one model call at a time (the ingest CLI
        and the server: every core; the server's pause while a search runs). `embed_processes`: each thread's model
        calls run in a process forked for the run (kb_embedrun.forked_models; only where nothing else runs threads)."""
        self.cfg = cfg
        self.embedder: Embedder = embedder or config_embedder(cfg)
        self.embed_workers = embed_workers
        self.embed_processes = embed_processes
        self.search_gate = SearchGate()  # searches running: the embedding run pauses between model calls meanwhile
        self.meter = RunMeter()  # each model's embedding rate in this process: the time left of a first index
        self.tokenizer = tokenizer or Tokenizer(
            cache_dir=cfg.cache_dir, word_table=WordTableFile(cfg.cache_dir / JIEBA_TABLE_FILE)
        )
        self.store = open_vector_store(cfg, self.embedder.name)
        # The models in the order a first index embeds them; model by model where the store keeps rows with some
        # models only (the local store), else whole rows (a Chroma server).
        self._per_model_store = hasattr(self.store, "write_part")  # the local store (rows with some models, revisions)
        self.plans = plan_models(self.embedder, per_model=self._per_model_store)
        self.view = IndexView(self.tokenizer, cfg.metadata_weight, self.store)
        self.state_path = cfg.index_dir / "state.json"
        self.params: dict[str, Any] = {
            "chunker": CHUNKER_VERSION,
            "embed_labels": EMBED_LABELS,
            "chunk_tokens": cfg.chunk_tokens,
            "overlap_tokens": cfg.overlap_tokens,
            "model": self.embedder.name,
            "tokenizer": self.tokenizer.signature,
            "metadata_weight": cfg.metadata_weight,
            "anchor_text": self.view.anchor_weight,
        }
        self.model_error: str | None = None  # set once the model failed to load: keyword-only from then on
        self.last_report: SyncReport | None = None
        self.last_sync_at: float | None = None
        self.progress: tuple[int, int] | None = None  # (chunks done, total) while embedding
        self.cancel = False  # set by a shutting-down server: stop after the current batch
        self.allow_mass_delete = False  # True: a full sync may remove most of the vault's notes at once (ingest flag)
        self.held_deletions: str | None = None  # why the last full sync kept notes it did not find (else None)
        self._sync_lock = threading.Lock()  # one sync at a time in this process
        self._embed_lock = threading.Lock()  # one embedding run at a time in this process
        self._file_lock = FileLock(cfg.index_dir / "lock")  # one writer at a time across processes
        self._embed_claim = FileLock(cfg.index_dir / "embed.lock")  # one embedding run at a time across processes
        self._view_loaded = False
        self._vectors_deferred = False  # defer_vectors: the segments state.json names are not loaded yet
        self._swept = False
        self.state = IndexState(self.state_path, self.params)  # state.json as this process last read or wrote it
        self._others_read = 0  # state.version just after the last read of a state.json another process wrote
        self._others_taken = 0  # the _others_read whose commits the view has taken in (see _notes_others_committed)
        self._pending: tuple[Any, list[str]] = (None, [])  # (state/segments key, contents without a vector)
        self._pending_parts: dict[int, tuple[Any, list[str], int]] = {}  # model -> (key, its pending, skipped count)
        self._contents: tuple[int, list[str]] = (-1, [])  # (state version, every content state.json references)
        self._skipped: dict[str, bool] = {}  # content -> an English-only model leaves it (content-addressed)
        self._segments_swept = False
        self._scan_skipped: dict[str, str] = {}
        self._logseq_graph = is_logseq_graph(cfg.kb_dir)  # outline notes chunk at blocks

    # ---- the view, for readers ---------------------------------------------------------------------------------

    @property
    def mutex(self) -> threading.RLock:
        return self.view.mutex

    @property
    def files(self) -> dict[str, FileRecord]:
        return self.view.files

    @property
    def chunks(self) -> dict[str, ChunkRecord]:
        return self.view.chunks

    @property
    def bm25(self) -> Any:
        return self.view.bm25

    @property
    def syncing(self) -> bool:
        return self._sync_lock.locked() or self._embed_lock.locked()

    @property
    def view_changed(self) -> bool:
        """Whether the view differs from the BM25 pickle on disk (loaded or last saved by this process)."""
        return self.view.changed_since_save

    def save_view(self) -> None:
        """Persist this process's view as the BM25 pickle (atomic), so the next process starts from it."""
        self.view.save(self.cfg.bm25_index_file, self._view_params())

    def skipped_files(self) -> dict[str, str]:
        """Every file left out of the index and why: unreadable notes, and what the scan could not take as a note."""
        with self.mutex:
            return {**self._scan_skipped, **{p: r.skipped for p, r in self.files.items() if r.skipped}}

    @property
    def pending_vectors(self) -> int:
        """Chunks committed to the index that have no vector yet (being embedded, or waiting for the model); 0 until
        load_vectors when deferred (not known yet)."""
        if self._vectors_deferred:
            return 0
        try:
            return len(self._pending_contents())
        except VectorStoreUnavailableError:
            return 0  # unknown while the Chroma server is away; said in the sync's reasons

    def vault_profile(self, folders: int = 5, visible: Callable[[str, FileRecord | None], bool] | None = None) -> dict[str, Any]:
        """What the vault holds, for the client to write its search alternatives: languages by share of (a sample
        of) chunks, and the largest top-level folders by notes; `visible`: of the notes it accepts only. Example:
        {"languages": {"en": 0.62, "zh": 0.38}, "folders": {"pages": 7425, "pages.zh": 1535}}"""
        with self.mutex:
            sample = self._language_sample(visible)
            tops: dict[str, int] = {}
            for p, r in self.files.items():
                if visible is not None and not visible(p, r):
                    continue
                top = p.split("/", 1)[0] if "/" in p else "(top level)"
                tops[top] = tops.get(top, 0) + 1
        zh = sum(1 for t in sample if cjk_share(t) >= CHINESE_CHUNK_SHARE) / len(sample) if sample else 0.0
        languages = {k: round(v, 2) for k, v in sorted({"zh": zh, "en": 1.0 - zh}.items(), key=lambda kv: -kv[1]) if v >= 0.01}
        largest = dict(sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))[:folders])
        return {"languages": languages if sample else {}, "folders": largest}

    def _language_sample(self, visible: Callable[[str, FileRecord | None], bool] | None = None) -> list[str]:
        """The texts of at most LANGUAGE_SAMPLE_CHUNKS chunks, evenly spaced over the index (of the notes `visible`
        accepts; under the mutex)."""
        step = max(1, -(-len(self.chunks) // LANGUAGE_SAMPLE_CHUNKS))  # ceiling division: at most the sample size
        chunks = itertools.islice(self.chunks.values(), 0, None, step)
        return [c.text for c in chunks if visible is None or visible(c.path, self.files.get(c.path))]

    def model_warning(self) -> str | None:
        """A warning when the model is English-only and the vault mostly Chinese, naming what to use instead."""
        if not is_english_only(self.embedder.name):
            return None
        with self.mutex:
            sample = self._language_sample()
        share = cjk_share("".join(sample))
        if share < CHINESE_VAULT_SHARE:
            return None
        return (
            f"the vault's text is {share:.0%} Chinese but embedding.model '{self.embedder.name}' is English-only, so "
            f"semantic search on Chinese will be weak (keyword search is unaffected). Set embedding.model to "
            f"{MULTILINGUAL_SUGGESTION} and run ingest.py again."
        )

    # ---- syncing -----------------------------------------------------------------------------------------------

    def sync_all(
        self,
        *,
        rebuild: bool = False,
        progress: ProgressFn | None = None,
        write: bool = True,
        embed_limit: int | None = None,
    ) -> SyncReport:
        """Reconcile the whole vault, then embed chunks without a vector.

        `write=False` updates only this process's keyword view (no model, no lock). `embed_limit`: embed everything
        now (None), nothing (0), or only if at most that many chunks lack a vector (the rest: `embed_pending`).
        """
        with self._sync_lock:
            return self._sync(None, rebuild=rebuild, progress=progress, write=write, embed_limit=embed_limit)

    def apply_file_changes(
        self, paths: Iterable[str | Path], *, write: bool = True, embed_limit: int | None = INLINE_EMBED_CHUNKS
    ) -> SyncReport:
        """Reconcile only these notes (absolute or vault-relative; a deleted one leaves the index)."""
        with self._sync_lock:
            return self._sync(list(paths), write=write, embed_limit=embed_limit)

    def try_sync(
        self, wait_s: float, paths: Iterable[str | Path] | None = None, *, embed_limit: int | None = INLINE_EMBED_CHUNKS
    ) -> SyncReport | None:
        """sync_all (or apply_file_changes for `paths`), unless another thread's sync is still running after
        `wait_s` seconds: then None, and the caller answers from the current view."""
        if not self._sync_lock.acquire(timeout=wait_s):
            return None
        try:
            return self._sync(None if paths is None else list(paths), write=self.model_error is None, embed_limit=embed_limit)
        finally:
            self._sync_lock.release()

    def _sync(
        self,
        paths: list[str | Path] | None,
        *,
        rebuild: bool = False,
        progress: ProgressFn | None = None,
        write: bool = True,
        embed_limit: int | None = None,
    ) -> SyncReport:
        t0 = time.perf_counter()
        report = SyncReport()
        full = paths is None
        if not self._view_loaded:
            self._view_loaded = True
            self.view.load(self.cfg.bm25_index_file, self._view_params())
        if full and not self._swept:
            self._swept = True
            sweep_temp_files(self.cfg.kb_dir, recursive=True)  # hidden copies of notes a killed append left
            sweep_temp_files(self.cfg.index_dir, recursive=True)  # half-written state, views and segments
        if rebuild:
            self._rebuild(report)
        if full:
            others = self._others_read  # the scan takes in every commit read before it (and only those)
            disk = scan_vault(self.cfg)
            self._scan_skipped = dict(getattr(disk, "skipped", {}))  # names no note can have, FIFOs, broken links
            self._hold_mass_deletion(disk, report)
        else:
            elsewhere, others = self._notes_others_committed(report)
            disk = self._stat_paths([*(paths or []), *elsewhere])
        committed = False
        planned: dict[str, _Plan] = {}  # the notes this sync committed, as chunked: the view takes them as they are
        if write:
            self.load_vectors()  # a commit names the segments, and reuse by content looks vectors up
            try:
                self._write_sync(disk, full, report, progress, planned)
                committed = True
            except ModelUnavailableError as e:
                self._model_failed(e)
            except LockTimeoutError as e:
                report.lock_timeout = True
                report.reasons.append(f"{e}; nothing was committed, so this process searches its own keyword view")
        report.committed = committed
        self._reconcile_view(disk, full, report, planned)
        self._others_taken = max(self._others_taken, others)
        if committed and embed_limit != 0 and self.model_error is None:
            try:
                self._apply_vector_policy(report)
            except ModelUnavailableError as e:
                self._model_failed(e)
            except (LockTimeoutError, VectorStoreUnavailableError) as e:
                report.reasons.append(f"{e}; the vectors are brought in line by the next sync")
        if committed and embed_limit != 0:
            try:
                pending = self._pending_contents()
            except VectorStoreUnavailableError as e:
                report.reasons.append(str(e))
                pending = []
            if pending and (embed_limit is None or len(pending) <= embed_limit):
                self._embed_reporting(report, progress, wait=embed_limit is None)
        if full:
            present = sum(1 for s in disk.values() if s is not None)
            report.unchanged = max(0, present - report.added - report.changed - report.touched - report.skipped)
        else:  # the notes the index holds that this sync left as they were, not only among the paths it was given:
            # index_status shows the last sync, mostly one of a few paths, and "0 unchanged" read as an empty vault
            report.unchanged = max(0, self.view.size()[0] - report.added - report.changed - report.touched)
        report.pending_vectors = self.pending_vectors if self.model_error is None else 0
        report.elapsed_ms = (time.perf_counter() - t0) * 1000
        self.last_report, self.last_sync_at = report, time.time()
        for reason in report.reasons:
            logger.info("%s", reason)
        (logger.info if report.did_work else logger.debug)("sync: %s", report.summary())
        return report

    def _hold_mass_deletion(self, disk: dict[str, Stat | None], report: SyncReport) -> None:
        """Keep the indexed notes a full scan did not find when they are most of the vault (see MASS_DELETE_SHARE),
        unless allow_mass_delete: they stay in `disk` with their indexed stat, so nothing is removed."""
        try:
            self._refresh_state(report.reasons)  # a new process: what the index holds is in state.json
        except KBError:
            pass  # the sync's own read of state.json reports it
        with self.mutex:
            known = {p: r.stat for p, r in self.view.files.items()}
        for p, r in self.state.files.items():
            known.setdefault(p, r.stat)
        missing = [p for p in known if p not in disk]
        held = (
            bool(missing)
            and not self.allow_mass_delete
            and (
                len(missing) == len(known)
                or (len(missing) >= MASS_DELETE_MIN_NOTES and len(missing) > MASS_DELETE_SHARE * len(known))
            )
        )
        if not held:
            self.held_deletions = None
            return
        self.held_deletions = (
            f"{len(missing)} of the {len(known)} indexed notes are missing from {self.cfg.kb_dir} (an unplugged drive, "
            "a cloud folder not synced yet, a moved vault?); the index keeps them. If they were really deleted, run "
            "`python ingest.py --allow-mass-delete` once"
        )
        report.reasons.append(self.held_deletions)
        logger.warning("%s", self.held_deletions)
        for p in missing:
            disk[p] = known[p]

    def _stat_paths(self, paths: Iterable[str | Path]) -> dict[str, Stat | None]:
        out: dict[str, Stat | None] = {}
        for p in paths:
            rel = note_rel_path(self.cfg, p if Path(p).is_absolute() else self.cfg.kb_dir / p)
            if rel is None:
                logger.debug("not a note of this vault, ignored: %s", p)
                continue
            try:
                st = os.stat(self.cfg.kb_dir / rel)
                out[rel] = note_stat(st)
            except OSError:
                out[rel] = None
        return out

    def _rebuild(self, report: SyncReport) -> None:
        self._vectors_deferred = False  # the store is emptied below: nothing is left to load
        with self._locked():
            self.cfg.bm25_index_file.unlink(missing_ok=True)
            self.state.clear()
            self._commit_state(segments=())
            self.store.clear()
            self.store.load(())
            self.view.clear()
            report.reasons.append("rebuild requested: the index of this vault was cleared")

    def _locked(self) -> Any:
        return self._file_lock.hold(self.cfg.lock_timeout_s)

    # ---- state.json ---------------------------------------------------------------------------------------------

    def defer_vectors(self) -> None:
        """Leave the vector segments unloaded until load_vectors: a server's first keyword answer needs the view only
        (loading tldr's segments took 0.5-1.4 s of it). Every write and every embedding loads them first."""
        self._vectors_deferred = True

    def load_vectors(self) -> None:
        """Load the segments state.json names if defer_vectors left them for later; a no-op otherwise."""
        for _ in range(STATE_RETRIES):
            with self.state.lock:
                if not self._vectors_deferred:
                    return
                try:
                    self._load_segments()
                    self._vectors_deferred = False
                    return
                except _Retry:
                    pass
            self._refresh_state([])  # deferred still: reads state.json only
        raise KBError(f"the index at {self.cfg.index_dir} keeps changing under this process; try again")

    def _read_state(self, reasons: list[str]) -> None:
        """Load state.json and, unless it names another model (or defer_vectors), the vector segments it names."""
        self.state.read(reasons, CHUNK_PARAMS)
        if not self._vectors_deferred:
            self._load_segments()

    def _load_segments(self) -> None:
        """Load the vector segments state.json names (none while it names another model); _Retry if one is gone."""
        if self.state.model_switch:
            return
        try:
            self.store.load(self.state.segments)
        except FileNotFoundError:
            # compacted by another process between our read of state.json and now: its new state names the rest
            self.state.forget()
            raise _Retry() from None

    def _commit_state(self, segments: Sequence[str] | None = None) -> None:
        """Replace state.json (the commit point); `segments` replaces the list of vector segments it names."""
        # Defense in depth: a store that never loaded would commit an empty segment list and orphan every vector.
        if self._vectors_deferred:
            raise RuntimeError("state.json commit before the vector segments were loaded (Engine.load_vectors)")
        self.state.commit(segments, self.store.segments)

    def _refresh_state(self, reasons: list[str]) -> bool:
        """Re-read state.json if another process replaced it; True if it did."""
        for _ in range(STATE_RETRIES):
            with self.state.lock:
                if self.state.is_current():
                    return False
                try:
                    self._read_state(reasons)
                    self._others_read = self.state.version
                    return True
                except _Retry:
                    continue
        raise KBError(f"the index at {self.cfg.index_dir} keeps changing under this process; try again")

    def others_committed(self) -> bool:
        """Whether state.json changed since this process last read or wrote it: another process committed."""
        with self.state.lock:
            return not self.state.is_current()

    def _notes_others_committed(self, report: SyncReport) -> tuple[list[str], int]:
        """The notes whose record another process committed differs from this view's, and the read of state.json
        they come from (the sync records it as taken in once its view has them): computed once per such read.

        A sync of a few paths takes them in too: an append another server acknowledged is then searchable here before
        this process's file events for it arrive (under load they came after the search had answered). Notes another
        process removed are left to their events and to the search's check of its hits."""
        try:
            self._refresh_state(report.reasons)
        except KBError:
            return [], self._others_taken  # the sync's own read of state.json says why
        others = self._others_read
        if others == self._others_taken:
            return [], others
        with self.state.lock:
            committed = [(p, r.md5, r.stat) for p, r in self.state.files.items()]
        with self.mutex:
            held = self.view.files
            changed = [p for p, md5, stat in committed if (mine := held.get(p)) is None or (mine.md5, mine.stat) != (md5, stat)]
        return changed, others

    # ---- the writer: notes -> state.json ----------------------------------------------------------------------------

    def _write_sync(
        self, disk: dict[str, Stat | None], full: bool, report: SyncReport, progress: ProgressFn | None, planned: dict[str, _Plan]
    ) -> None:
        """Commit what the notes say to state.json, in batches; each committed note's plan goes into `planned`."""
        self._refresh_state(report.reasons)
        if self.state.model_switch:
            self._adopt_model(report)
        work = self._work_list(disk, full)
        plans: list[_Plan] = []
        removed: list[str] = []
        for i, (path, stat) in enumerate(work, 1):
            if stat is None:
                removed.append(path)
            else:
                plans.append(self._plan(path, stat, self.state.files.get(path)))
            if progress and (i % 100 == 0 or i == len(work)):
                progress("read", i, len(work))
        adding = [p.record for p in plans if p.chunks]
        if adding:  # with nothing to add this would recompute every note's terms (~4 ms at 9,000 notes)
            with self.mutex:
                self.view.refresh_user_terms(adding=adding)
        batch: list[_Plan] = []
        size = 0
        for n, plan in enumerate(plans, 1):
            batch.append(plan)
            size += len(plan.chunks)
            if size >= COMMIT_CHUNKS or n == len(plans):
                self._commit_batch(batch, removed if n == len(plans) else [], report, planned)
                batch, size = [], 0
        if not plans and removed:
            self._commit_batch([], removed, report, planned)

    def _adopt_model(self, report: SyncReport) -> None:
        """state.json names another model: prove ours loads before dropping a single old vector, then re-embed all."""
        old = self.state.stored_model
        self.embedder.embed_query("model check")  # raises ModelUnavailableError: nothing is dropped
        with self._locked():
            self._refresh_state(report.reasons)
            if not self.state.model_switch:
                return  # another process switched meanwhile
            self._commit_state(segments=())
            self.store.clear()
            self.store.load(())
            self.state.model_switch = False
        report.reasons.append(f"embedding model changed from {old!r} to {self.params['model']!r}: re-embedding every chunk")

    def _work_list(self, disk: dict[str, Stat | None], full: bool) -> list[tuple[str, Stat | None]]:
        if full and not self.state.rework and disk == self.state.stats:
            return []  # the common case before a search: one dict comparison instead of a loop over every note
        state = self.state.files
        work: list[tuple[str, Stat | None]] = []
        for path, stat in disk.items():
            old = state.get(path)
            if stat is None:
                if old is not None:
                    work.append((path, None))
            elif old is None or old.stat != stat or not (old.md5 or old.skipped):
                work.append((path, stat))
        if full:
            work.extend((p, None) for p in state if p not in disk)
        return work

    def _plan(self, path: str, stat: Stat, old: FileRecord | None) -> _Plan:
        """Read a note once: same md5 as `old` -> touched; else chunked; unreadable -> a record with a skip reason."""
        try:
            if stat[1] > self.cfg.max_file_bytes:
                raise ValueError(f"larger than max_file_bytes ({stat[1]} > {self.cfg.max_file_bytes} bytes)")
            raw = read_note_bytes(self.cfg.kb_dir / path, self.cfg.max_file_bytes)  # never blocks on a FIFO
            md5 = hashlib.md5(raw).hexdigest()
            if old is not None and old.md5 == md5 and not old.skipped:
                return _Plan(path, old.with_stat(stat), [], touched=True)
            text, encoding = decode_note(raw)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            logger.warning("skipping %s: %s", path, reason)
            return _Plan(path, FileRecord(stat[0], stat[1], "", skipped=reason, ctime_ns=stat[2], inode=stat[3]), [])
        parsed = chunk_note(
            text,
            Path(path).stem,
            self.cfg.chunk_tokens,
            self.cfg.overlap_tokens,
            rel_path=path,
            logseq_graph=self._logseq_graph,
        )
        if parsed.frontmatter_error:
            logger.info("%s: %s; its frontmatter is indexed as text", path, parsed.frontmatter_error)
        path_key = content_hash(path)[:8]
        seen: dict[str, int] = {}
        chunks: list[ChunkRecord] = []
        labels = _labels(parsed.aliases, parsed.tags)
        for ch in parsed.chunks:
            ctx = chunk_context(parsed.title, ch.heading_path)
            content = content_hash(_embed_text(ctx, labels, ch.text))
            n = seen[content] = seen.get(content, -1) + 1  # identical chunks within one note stay distinct
            cid = f"{path_key}-{content}" + (f"-{n}" if n else "")
            chunks.append(ChunkRecord(cid, path, ch.heading_path, ch.line_start, ch.line_end, ch.text, ctx, content))
        links = tuple(
            LinkRow(k.target, k.heading or "", k.block or "", k.label or "", k.embed, k.line) for k in parse_links(text)
        )
        record = FileRecord(
            stat[0],
            stat[1],
            md5,
            tuple(c.id for c in chunks),
            parsed.title,
            parsed.tags,
            parsed.aliases,
            encoding,
            properties=parsed.properties,
            date=parsed.date or "",
            links=links,
            headings=heading_levels(text),
            ctime_ns=stat[2],
            inode=stat[3],
        )
        return _Plan(path, record, chunks)

    def _commit_batch(self, batch: list[_Plan], removed: list[str], report: SyncReport, planned: dict[str, _Plan]) -> None:
        """Commit one batch of notes' records to state.json under the inter-process lock (no embedding here); the
        committed plans go into `planned` (the view takes them in _reconcile_view, the one way into the view)."""
        counts: dict[str, int] = {"added": 0, "changed": 0, "removed": 0, "touched": 0, "skipped": 0}
        details: list[tuple[str, str]] = []
        done: list[_Plan] = []
        with self._locked():
            self._refresh_state(report.reasons)
            state = dict(self.state.files)  # adopted before the commit; a failed commit makes it re-read
            stale: set[str] = set()
            for plan in batch:
                cur = state.get(plan.path)
                if cur is not None and cur.md5 and cur.md5 == plan.record.md5:
                    if not plan.touched and cur.stat == plan.record.stat:
                        done.append(plan)  # another process indexed this exact content already
                        continue
                    state[plan.path] = cur.with_stat(plan.record.stat)
                    counts["touched"] += 1
                    details.append((plan.path, "touched"))
                    continue
                if plan.touched:
                    continue  # state moved on since we read it; the next sync re-reads this note
                stale |= set(cur.chunks if cur else ()) - set(plan.record.chunks)
                kind = "skipped" if plan.record.skipped else "changed" if cur else "added"
                counts[kind] += 1
                details.append((plan.path, f"skipped: {plan.record.skipped}" if plan.record.skipped else kind))
                state[plan.path] = plan.record
                done.append(plan)
            for path in removed:
                cur = state.pop(path, None)
                if cur is not None:
                    stale |= set(cur.chunks)
                    counts["removed"] += 1
                    details.append((path, "removed"))
            live = {content_of(cid) for r in state.values() for cid in r.chunks}
            report.chunks_deleted += len(stale)
            self.state.adopt(state)
            try:
                report.chunks_reused += sum(1 for p in done for c in p.chunks if c.content in self.store)
                segments = self.store.compacted(live) if stale else None
            except VectorStoreUnavailableError as e:  # the notes' records still commit; vectors catch up later
                report.reasons.append(str(e))
                segments = None
            self._commit_state(segments)
            self._sweep_segments(force=segments is not None)
            if segments is not None:
                self.store.load(segments)
        for kind, n in counts.items():
            setattr(report, kind, getattr(report, kind) + n)
        report.details.extend(details)
        planned.update((plan.path, plan) for plan in done)

    def _sweep_segments(self, force: bool = False) -> None:
        """Remove segment files state.json does not name (once per process, or after a compaction).

        Only under the index lock: every writer writes its segment and names it in one lock-hold, so an unnamed
        file then is a crashed writer's or a replaced one.
        """
        if force or not self._segments_swept:
            self._segments_swept = True
            self.store.remove_unlisted(self.state.segments)

    # ---- vectors: chunks without one get embedded ---------------------------------------------------------------

    def _pending_contents(self) -> list[str]:
        """Content hashes that state.json's chunks reference and that lack a vector of some model that embeds them
        (cached per state and segments), the first model's first."""
        key = (self.state.version, self.store.segments, len(self.store))
        if self._pending[0] != key:
            self._pending = (key, list(dict.fromkeys(c for plan in self.plans for c in self._pending_for(plan))))
        return self._pending[1]

    def _state_contents(self) -> list[str]:
        """Every content hash state.json's chunks reference, once each, in note order (cached per state)."""
        if self._contents[0] != self.state.version:
            state = self.state.files
            self._contents = (
                self.state.version,
                list(dict.fromkeys(content_of(cid) for r in state.values() for cid in r.chunks)),
            )
        return self._contents[1]

    def _pending_for(self, plan: ModelPlan) -> list[str]:
        """The contents model `plan` embeds (state.json's, less the mostly Chinese ones it leaves to another model)
        that have no vector of it yet (cached per state and segments)."""
        revs = self._revisions()
        key = (self.state.version, self.store.segments, len(self.store), revs)
        cached = self._pending_parts.get(plan.index)
        if cached is None or cached[0] != key:
            contents = self._state_contents()
            part = None if plan.whole else plan.index
            if revs is None:  # a Chroma server: whole rows, no revisions
                missing = self.store.missing(contents)
            else:
                missing = self.store.missing(contents, part, revs)
            skipped = [c for c in missing if self._leaves(plan, c)] if plan.skips_chinese else []
            if skipped:
                gone = set(skipped)
                missing = [c for c in missing if c not in gone]
            cached = self._pending_parts[plan.index] = (key, missing, len(skipped))
        return cached[1]

    def _revisions(self) -> int | None:
        """The revisions mask of the vectors the models make now (kb_store: a stored vector of another revision is
        embedded again, once); None for a store that keeps no revisions (a Chroma server)."""
        return pack_revisions(vector_revisions(self.embedder)) if self._per_model_store else None

    def _leaves(self, plan: ModelPlan, content: str) -> bool:
        """Whether model `plan` leaves this content to another model (kb_embedrun.embeds); False while its text is
        not in this view (its chunk is then embedded once the view has it)."""
        if not plan.skips_chinese:
            return False
        known = self._skipped.get(content)
        if known is None:
            text = self._texts_for([content]).get(content)
            if text is None:
                return False
            known = self._skipped[content] = not embeds(plan, text)
        return known

    def coverage(self) -> list[Coverage]:
        """For each model, in the order a first index embeds them, how many of the chunks it embeds have its vector
        (empty when the model failed or the vectors are not loaded yet). Before a first index commits the notes it
        read (the keyword view already answers), the first model covers none of the view's chunks."""
        if self.model_error is not None or self._vectors_deferred:
            return []
        if not self.state.files and self.view.chunk_count():
            return [Coverage(self.plans[0].name, 0, self.view.chunk_count())]
        try:
            total = len(self._state_contents())
            out = []
            for plan in self.plans:
                pending = len(self._pending_for(plan))
                skipped = self._pending_parts[plan.index][2]
                out.append(Coverage(plan.name, total - skipped - pending, total - skipped, skipped))
            return out
        except VectorStoreUnavailableError:
            return []

    def coverage_note(self) -> str | None:
        """What a search reply says while chunks lack vectors, e.g. "semantic results cover 1,024 of 7,889 passages;
        indexing, about 6 min left" (None when every model covers its chunks)."""
        coverage = self.coverage()
        remaining = {c.model: c.total - c.embedded for c in coverage}
        return coverage_note(coverage, self.meter.seconds_left(remaining), self._embed_lock.locked())

    def seconds_left(self) -> float | None:
        """Estimated seconds until every chunk has every vector it gets (None: unknown, or nothing left)."""
        remaining = {c.model: c.total - c.embedded for c in self.coverage()}
        return self.meter.seconds_left(remaining) if any(remaining.values()) else None

    def embed_pending(self, progress: ProgressFn | None = None, *, wait: bool = True) -> SyncReport:
        """Embed every committed chunk that has no vector (after a bulk change, a crash, or another process's
        commit), in batches, each one a new segment and a commit. With another process already embedding this
        index: wait for it (`wait`) or return at once. The server runs this in the background."""
        report = SyncReport()
        self._embed_reporting(report, progress, wait=wait)
        report.pending_vectors = self.pending_vectors if self.model_error is None else 0
        return report

    def _apply_vector_policy(self, report: SyncReport) -> None:
        """Bring the vectors in line with which chunks each model embeds (kb_embedrun) and record that in state.json:
        an index built before drops an English-only model's vectors of mostly Chinese chunks (nothing is
        re-embedded; the search then ranks them as a fresh index would). A no-op once recorded."""
        signature = policy_signature(self.plans)
        if self.plans[0].whole or self.state.meta.get(VECTOR_POLICY_KEY) == signature:
            return
        if not len(self.store) or not any(p.skips_chinese for p in self.plans):
            self.state.meta[VECTOR_POLICY_KEY] = signature  # nothing to drop: the next commit records it
            return
        dims = self._dims()
        with self._locked():
            self._refresh_state(report.reasons)
            if self.state.model_switch or self.state.meta.get(VECTOR_POLICY_KEY) == signature:
                return
            segments: tuple[str, ...] | None = None
            for plan in self.plans:
                if not plan.skips_chinese or len(self.store) == 0:
                    continue
                held = set(self._state_contents()) - set(self.store.missing(self._state_contents(), plan.index))
                chinese = [c for c in held if self._leaves(plan, c)]
                if chinese:
                    segments = self.store.without_part(plan.index, dims, chinese)
                    self.store.load(segments)  # the next model's rows build on these
                    report.reasons.append(
                        f"{plan.name} no longer embeds chunks at least {CHINESE_TEXT_SHARE:.0%} Chinese with fewer "
                        f"than {MIN_LATIN_WORDS} Latin words (the multilingual model covers them): dropped its vectors "
                        f"of {len(chinese)} such chunks; nothing was re-embedded"
                    )
            self.state.meta[VECTOR_POLICY_KEY] = signature
            if segments is not None:
                self._commit_state(segments)

    def _model_failed(self, e: ModelUnavailableError) -> None:
        """Keyword-only from now on in this process, saying why once."""
        self.model_error = str(e)
        logger.warning("%s. Keyword search stays current meanwhile.", e)

    def _embed_reporting(self, report: SyncReport, progress: ProgressFn | None, *, wait: bool) -> None:
        """_embed, with a model that cannot load or a busy lock turned into the report's words (nothing is lost:
        the chunks stay pending for the next sync)."""
        if self.model_error is not None:
            return
        self.load_vectors()  # what has a vector already
        try:
            self._apply_vector_policy(report)
            self._embed(report, progress, wait=wait)
        except ModelUnavailableError as e:
            self._model_failed(e)
        except LockTimeoutError as e:
            report.lock_timeout = True
            report.reasons.append(f"{e}; the chunks still without a vector are embedded by the next sync")
        except VectorStoreUnavailableError as e:
            report.reasons.append(str(e))

    def _embed(self, report: SyncReport, progress: ProgressFn | None, *, wait: bool) -> None:
        if not self._embed_lock.acquire(blocking=wait):
            return
        try:
            while not self._embed_claim.try_acquire():  # another process embeds this index: never embed twice
                if not wait:
                    return
                time.sleep(EMBED_WAIT_POLL_S)
                self._refresh_state(report.reasons)
                if not self._pending_contents():
                    return
            try:
                self._embed_claimed(report, progress)
            finally:
                self._embed_claim.release()
        finally:
            self._embed_lock.release()
            self.progress = None

    def _embed_claimed(self, report: SyncReport, progress: ProgressFn | None) -> None:
        """Embed model by model (kb_embedrun): tasks of EMBED_BATCH chunks for one model, the multilingual model's
        first, on `embed_workers` threads, pausing between model calls while a search runs; each task is one segment
        of rows gaining that model (or whole rows), and one commit, so a killed run loses at most a task per worker."""
        self._refresh_state(report.reasons)
        plans = self.plans
        totals = {p.index: len(self._pending_for(p)) for p in plans}
        done = dict.fromkeys(totals, 0)
        taken: set[tuple[int, str]] = set()  # (model, content) handed to a worker in this run
        embedded: set[str] = set()
        scheduling = threading.Lock()
        stop = threading.Event()
        switched = threading.Event()
        workers = max(1, self.embed_workers)
        self.meter.workers = workers
        dims = () if plans[0].whole else self._dims()

        def next_task(worker: int) -> tuple[ModelPlan, dict[str, str]] | None:
            with scheduling:
                for plan in task_order(plans, worker):
                    texts = self._texts_for([c for c in self._pending_for(plan) if (plan.index, c) not in taken], EMBED_BATCH)
                    if texts:
                        taken.update((plan.index, c) for c in texts)
                        return plan, {c: t for c, t in texts.items() if not self._leaves(plan, c)}
            return None

        def work(worker: int) -> None:
            while not (self.cancel or stop.is_set()):
                task = next_task(worker)
                if task is None:
                    return
                plan, texts = task
                vectors = embed_sliced(
                    plan, list(texts.values()), self.search_gate, self.meter, lambda: self.cancel or stop.is_set(), call
                )
                if vectors is None:
                    return
                if not self._commit_part(plan, dims, dict(zip(texts, vectors)), report):
                    switched.set()
                    stop.set()
                    return
                with scheduling:
                    embedded.update(texts)
                    done[plan.index] += len(texts)
                    report.embedded_by_model[plan.name] = report.embedded_by_model.get(plan.name, 0) + len(texts)
                    self.progress = (sum(done.values()), max(sum(totals.values()), sum(done.values())))
                    if progress:
                        stage = "embed" if plan.whole else f"embed:{plan.name}"
                        progress(stage, done[plan.index], max(totals[plan.index], done[plan.index]))

        forked = forked_models(plans, workers) if self.embed_processes else contextlib.nullcontext(embed_here)
        try:
            with single_blas_thread() if workers > 1 else contextlib.nullcontext(), forked as call:
                run_workers(workers, work, stop)
        finally:
            report.chunks_embedded += len(embedded)
        if self.cancel:
            report.reasons.append("embedding stopped early; the next sync resumes where this one stopped")
        elif not switched.is_set():
            left = len(self._pending_contents())
            if left:
                logger.debug("%d chunks without a vector are not in this view yet; the next sync embeds them", left)
            self._compact()

    def _dims(self) -> tuple[int, ...]:
        """Each model's vector size, in the order of a row (embeds a probe once where not known)."""
        dims = getattr(self.embedder, "dims", None)
        if dims is not None:
            return tuple(dims())
        return (len(self.embedder.embed_query("dimension probe")),)

    def _commit_part(
        self, plan: ModelPlan, dims: tuple[int, ...], vectors: dict[str, Sequence[float]], report: SyncReport
    ) -> bool:
        """Commit one task's vectors as rows gaining that model (or whole rows); False if another process moved the
        index to another model meanwhile (these vectors are not wanted)."""
        with self._locked():
            self._refresh_state(report.reasons)
            if self.state.model_switch:
                return False
            self._sweep_segments()
            revs = self._revisions()
            if revs is None:
                segments = self.store.write_segment(vectors)
            elif plan.whole:
                segments = self.store.write_segment(vectors, revs)
            else:  # as MultiEmbedder lays a row out: each model's unit vector over sqrt(models)
                scale = 1.0 / math.sqrt(len(dims))
                segments = self.store.write_part(
                    plan.index, dims, {k: np.asarray(v, dtype=np.float64) * scale for k, v in vectors.items()}, revs
                )
            if segments != self.store.segments:
                self._commit_state(segments)
                self.store.load(segments)
        return True

    def _compact(self) -> None:
        """After an embedding run: drop vectors no chunk references when they are many (a deletion's compaction
        may have failed, e.g. while a Chroma server was away)."""
        with self._locked():
            self._refresh_state([])
            live = {content_of(cid) for r in self.state.files.values() for cid in r.chunks}
            segments = self.store.compacted(live)
            if segments is not None:
                self._commit_state(segments)
                self._sweep_segments(force=True)
                self.store.load(segments)

    def _texts_for(self, contents: Sequence[str], limit: int | None = None) -> dict[str, str]:
        """The text to embed for each content hash (the first `limit` that are in this view), from a chunk of the
        view holding it."""
        out: dict[str, str] = {}
        with self.mutex:
            for content in contents:
                ids = self.view.content_ids.get(content)
                if ids:
                    c = self.view.chunks[min(ids)]
                    out[content] = embed_text(c, self.view.files.get(c.path))
                    if limit is not None and len(out) >= limit:
                        break
        return out

    # ---- the view: notes -> this process's BM25 ------------------------------------------------------------

    def _view_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k != "model"}

    def _reconcile_view(self, disk: dict[str, Stat | None], full: bool, report: SyncReport, planned: dict[str, _Plan]) -> None:
        """Make this process's view match the notes, the one way notes enter it: what this sync committed as it was
        chunked (`planned`), a new stat where the text is unchanged, and the rest (another process's commits, a sync
        that could not write) chunked here."""
        try:
            self._refresh_state([] if report.committed else report.reasons)
        except KBError as e:
            report.reasons.append(str(e))
        state = self.state.files
        view = self.view
        with self.mutex:
            if full and disk == view.stat_map():  # nothing differs: the no-change fast path
                if report.did_work:
                    view.refresh_user_terms()
                    view.refresh_anchors()
                return
            gone = [p for p, s in disk.items() if s is None and p in view.files]
            if full:
                gone += [p for p in view.files if p not in disk]
            todo = [(p, s) for p, s in disk.items() if s is not None and (p not in view.files or view.files[p].stat != s)]
        changed = bool(gone)
        with self.mutex:
            for path in gone:
                view.put(path, None, ())
                if not report.committed:
                    report.removed += 1
        plans: list[tuple[_Plan, FileRecord | None]] = []
        fresh: list[FileRecord] = []  # records chunked here, whose titles the tokenizer has not learnt yet
        for path, stat in todo:
            mine = view.files.get(path)
            shared = state.get(path)
            if mine and shared and mine.md5 and shared.md5 == mine.md5 and shared.stat == stat:
                with self.mutex:
                    view.set_record(path, mine.with_stat(stat))
                continue
            plan = planned.get(path)
            if plan is None or plan.record != shared:  # another process committed this note since
                plan = self._plan(path, stat, mine)
                fresh.append(plan.record)
            plans.append((plan, mine))
        with self.mutex:
            if fresh:
                view.refresh_user_terms(adding=[r for r in fresh if r.chunks])
            for plan, mine in plans:
                if plan.touched:
                    view.set_record(plan.path, plan.record)
                    continue
                view.put(plan.path, plan.record, plan.chunks)
                changed = True
                if not report.committed:
                    kind = "skipped" if plan.record.skipped else "changed" if mine else "added"
                    setattr(report, kind, getattr(report, kind) + 1)
        if changed or report.did_work:
            with self.mutex:
                view.refresh_user_terms()
                view.refresh_anchors()


class _Retry(Exception):
    """state.json named a segment that is already gone: read state.json again."""
