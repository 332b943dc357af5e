"""Incremental index engine (whole-vault sync, per-path apply, several processes on one index) and the ingest CLI.

Imports kb_config, kb_scan, kb_text, kb_state, bm25_index, kb_vectors. Never imports mcp_server or watcher.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bm25_index import BM25Index, load_index, save_index
from kb_config import (
    Config,
    IndexFormatError,
    KBError,
    LockTimeoutError,
    ModelUnavailableError,
    add_common_args,
    load_cli_config,
    setup_logging,
)
from kb_scan import note_rel_path, scan_vault
from kb_state import (
    ChunkRecord,
    FileLock,
    FileRecord,
    SyncReport,
    decode_note,
    file_identity,
    read_state_file,
    write_state_file,
)
from kb_text import CHUNKER_VERSION, Tokenizer, chunk_context, chunk_note, cjk_share, content_hash
from kb_vectors import MULTILINGUAL_SUGGESTION, Embedder, SentenceTransformerEmbedder, VectorStore, is_english_only

logger = logging.getLogger(__name__)

# Chunks written per lock-hold in a big sync: bounds how long another process waits for the lock.
BATCH_CHUNKS = 256
# A vault whose chunk text is at least this share CJK counts as mostly Chinese (English-only model warning).
CHINESE_VAULT_SHARE = 0.5
# Distinct metadata strings whose tokens are cached (cleared when full or when the dictionary changes).
META_TOKEN_CACHE = 50_000
# Chunks sampled to estimate the vault's language.
LANGUAGE_SAMPLE_CHUNKS = 2000
# Embed each chunk with its note's aliases and tags (measured in docs/retrieval.md).
EMBED_LABELS = True
# Parameters that decide chunk boundaries; a change re-chunks every note (vectors of unchanged text are reused).
CHUNK_PARAMS = ("chunker", "embed_labels", "chunk_tokens", "overlap_tokens")

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


def _chroma_meta(c: ChunkRecord, state: dict[str, FileRecord]) -> dict[str, Any]:
    """Metadata stored with a vector: where the chunk is, and the content hash used to reuse its vector."""
    rec = state.get(c.path)
    return {
        "path": c.path,
        "heading": c.heading_path,
        "line_start": c.line_start,
        "line_end": c.line_end,
        "mtime": rec.mtime_ns // 1_000_000_000 if rec else 0,
        "tags": ",".join(rec.tags) if rec else "",
        "content": c.content,
    }


class Engine:
    """One vault's index as this process sees it, kept equal to the notes on disk by sync_all / apply_file_changes.

    On disk (cfg.index_dir): state.json (the commit point: per-note stat, md5, chunk ids, index parameters), the
    Chroma store (one vector per chunk) and the BM25 pickle (this view, so the next process starts fast).
    Writers serialize on a file lock; every process re-reads state.json and reopens Chroma when it changed.
    In memory: `files`, `chunks` and `bm25` (the view searched), guarded by `mutex`.
    """

    def __init__(self, cfg: Config, embedder: Embedder | None = None, *, tokenizer: Tokenizer | None = None) -> None:
        self.cfg = cfg
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder(cfg.embed_model, cfg.embed_device, cfg.embed_batch_size)
        self.tokenizer = tokenizer or Tokenizer()
        self.vectors = VectorStore(cfg.index_dir / "chroma")
        self.state_path = cfg.index_dir / "state.json"
        self.params: dict[str, Any] = {
            "chunker": CHUNKER_VERSION,
            "embed_labels": EMBED_LABELS,
            "chunk_tokens": cfg.chunk_tokens,
            "overlap_tokens": cfg.overlap_tokens,
            "model": self.embedder.name,
            "tokenizer": self.tokenizer.signature,
            "metadata_weight": cfg.metadata_weight,
        }
        self.mutex = threading.RLock()  # the view, against the server's search threads
        self.files: dict[str, FileRecord] = {}
        self.chunks: dict[str, ChunkRecord] = {}
        self.bm25 = BM25Index()
        self.model_error: str | None = None  # set once the model failed to load: keyword-only from then on
        self.last_report: SyncReport | None = None
        self.last_sync_at: float | None = None
        self.progress: tuple[int, int] | None = None  # (chunks done, total) while a sync embeds
        self._sync_lock = threading.Lock()  # one sync at a time in this process
        self._file_lock = FileLock(cfg.index_dir / "lock")  # one writer at a time across processes
        self._view_loaded = False
        self._state: dict[str, FileRecord] | None = None  # state.json as last read (None: not yet)
        self._state_stats: dict[str, tuple[int, int]] = {}
        self._state_rework = False  # some record must be re-read (its chunking parameters changed)
        self._view_version = 0  # bumped on every view change; keys the cached stat map below
        self._saved_view_version = -1  # the view version the BM25 pickle on disk holds
        self._view_stats: tuple[int, dict[str, tuple[int, int]]] = (-1, {})
        self._meta_tokens: dict[str, list[str]] = {}
        self._state_meta: dict[str, Any] = {}
        self._state_id: tuple | None = None
        self._reset_vectors = False
        self.cancel = False  # set by a shutting-down server: stop after the current batch

    # ---- public API ------------------------------------------------------------------------------------------

    @property
    def syncing(self) -> bool:
        return self._sync_lock.locked()

    def sync_all(self, *, rebuild: bool = False, progress: ProgressFn | None = None, write: bool = True) -> SyncReport:
        """Reconcile the whole vault. `write=False` updates only this process's keyword view (no model, no lock)."""
        with self._sync_lock:
            return self._sync(None, rebuild=rebuild, progress=progress, write=write)

    def apply_file_changes(self, paths: Iterable[str | Path], *, write: bool = True) -> SyncReport:
        """Reconcile only these notes (absolute or vault-relative; a deleted one leaves the index)."""
        with self._sync_lock:
            return self._sync(list(paths), write=write)

    def try_sync(self, wait_s: float, paths: Iterable[str | Path] | None = None) -> SyncReport | None:
        """sync_all (or apply_file_changes for `paths`), unless another thread's sync is still running after
        `wait_s` seconds: then None, and the caller answers from the current view."""
        if not self._sync_lock.acquire(timeout=wait_s):
            return None
        try:
            return self._sync(None if paths is None else list(paths), write=self.model_error is None)
        finally:
            self._sync_lock.release()

    @property
    def view_changed(self) -> bool:
        """Whether the view differs from the BM25 pickle on disk (loaded or last saved by this process)."""
        return self._view_version != self._saved_view_version

    def save_view(self) -> None:
        """Persist this process's view as the BM25 pickle (atomic), so the next process starts from it."""
        with self.mutex:
            self._saved_view_version = self._view_version
            meta = {
                "params": self._view_params(),
                "files": dict(self.files),
                "chunks": dict(self.chunks),
                "user_terms": sorted(self.tokenizer.user_terms),
            }
            save_index(self.bm25, self.cfg.bm25_index_file, meta)

    def skipped_files(self) -> dict[str, str]:
        with self.mutex:
            return {p: r.skipped for p, r in self.files.items() if r.skipped}

    def model_warning(self) -> str | None:
        """A warning when the model is English-only and the vault mostly Chinese, naming what to use instead."""
        if not is_english_only(self.embedder.name):
            return None
        with self.mutex:
            sample = [c.text for c in itertools.islice(self.chunks.values(), LANGUAGE_SAMPLE_CHUNKS)]
        share = cjk_share("".join(sample))
        if share < CHINESE_VAULT_SHARE:
            return None
        return (
            f"the vault's text is {share:.0%} Chinese but embedding.model '{self.embedder.name}' is English-only, so "
            f"semantic search on Chinese will be weak (keyword search is unaffected). Where you can download it, "
            f"set embedding.model to {MULTILINGUAL_SUGGESTION} and run ingest.py again."
        )

    # ---- the sync ----------------------------------------------------------------------------------------------

    def _sync(
        self, paths: list[str | Path] | None, *, rebuild: bool = False, progress: ProgressFn | None = None, write: bool = True
    ) -> SyncReport:
        t0 = time.perf_counter()
        report = SyncReport()
        full = paths is None
        if not self._view_loaded:
            self._load_view()
        if rebuild:
            self._rebuild(report)
        disk = scan_vault(self.cfg) if full else self._stat_paths(paths or [])
        write = write and self.model_error is None
        if write:
            try:
                self._write_sync(disk, full, report, progress)
            except ModelUnavailableError as e:
                self.model_error = str(e)
                write = False
                logger.warning("%s. Keyword search stays current meanwhile.", e)
            except LockTimeoutError as e:
                write = False
                report.reasons.append(str(e))
            finally:
                self.progress = None
        report.vectors = write
        self._reconcile_view(disk, full, report)
        present = sum(1 for s in disk.values() if s is not None)
        report.unchanged = max(0, present - report.added - report.changed - report.touched - report.skipped)
        report.elapsed_ms = (time.perf_counter() - t0) * 1000
        self.last_report, self.last_sync_at = report, time.time()
        for reason in report.reasons:
            logger.info("%s", reason)
        (logger.info if report.did_work else logger.debug)("sync: %s", report.summary())
        return report

    def _stat_paths(self, paths: Iterable[str | Path]) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for p in paths:
            rel = note_rel_path(self.cfg, p if Path(p).is_absolute() else self.cfg.kb_dir / p)
            if rel is None:
                logger.debug("not a note of this vault, ignored: %s", p)
                continue
            try:
                st = os.stat(self.cfg.kb_dir / rel)
                out[rel] = (st.st_mtime_ns, st.st_size)
            except OSError:
                out[rel] = None
        return out

    def _rebuild(self, report: SyncReport) -> None:
        self._file_lock.acquire(self.cfg.lock_timeout_s)
        try:
            self.vectors.reset()
            self.cfg.bm25_index_file.unlink(missing_ok=True)
            self._set_state({})
            self._state_meta = {"generation": self._state_meta.get("generation", 0)}
            self._commit_state()
            with self.mutex:
                self.files, self.chunks, self.bm25 = {}, {}, BM25Index()
                self._view_version += 1
                self.tokenizer.set_user_terms(())
            report.reasons.append("rebuild requested: the index of this vault was cleared")
        finally:
            self._file_lock.release()

    # ---- state.json ---------------------------------------------------------------------------------------------

    def _read_state(self, reasons: list[str]) -> None:
        """Load state.json; if the index parameters changed, mark what must be redone and say why."""
        self._state_id = file_identity(self.state_path)
        try:
            data = read_state_file(self.state_path)
        except ValueError as e:
            reasons.append(
                f"state file {self.state_path} is unusable ({e}); re-indexing from the notes "
                "(vectors of unchanged text are reused)"
            )
            data = None
        if data is None:
            self._set_state({})
            self._state_meta = {"generation": 0}
            return
        files: dict[str, FileRecord] = data.pop("files")
        old = data.get("params", {})
        if old.get("model") != self.params["model"]:
            reasons.append(
                f"embedding model changed from {old.get('model')!r} to {self.params['model']!r}: re-embedding every chunk"
            )
            self._reset_vectors = True
            files = {}
        elif any(old.get(k) != self.params[k] for k in CHUNK_PARAMS):
            changes = ", ".join(f"{k} {old.get(k)} -> {self.params[k]}" for k in CHUNK_PARAMS if old.get(k) != self.params[k])
            reasons.append(f"chunking changed ({changes}): re-chunking every note; vectors of unchanged text are reused")
            files = {p: replace(r, md5="") for p, r in files.items()}  # md5 "" forces a re-read
        self._set_state(files)
        self._state_meta = data

    def _set_state(self, files: dict[str, FileRecord]) -> None:
        """Adopt a state table, with the stat map the no-change fast path compares against."""
        self._state = files
        self._state_stats = {p: (r.mtime_ns, r.size) for p, r in files.items()}
        self._state_rework = any(not (r.md5 or r.skipped) for r in files.values())

    def _commit_state(self) -> None:
        meta = dict(self._state_meta, params=self.params, generation=int(self._state_meta.get("generation", 0)) + 1)
        write_state_file(self.state_path, meta, self._state or {})
        self._state_meta = meta
        self._state_id = file_identity(self.state_path)

    def _refresh_state(self, reasons: list[str]) -> bool:
        """Re-read state.json if another process replaced it; True if it did (vectors were reopened)."""
        if self._state is not None and file_identity(self.state_path) == self._state_id:
            return False
        first = self._state is None
        self._read_state(reasons)
        if not first:
            self.vectors.reopen()
        return not first

    # ---- the writer: notes -> state.json + vectors ------------------------------------------------------------

    def _write_sync(
        self, disk: dict[str, tuple[int, int] | None], full: bool, report: SyncReport, progress: ProgressFn | None
    ) -> None:
        self._refresh_state(report.reasons)
        assert self._state is not None
        if self._reset_vectors:
            # Prove the new model loads before dropping the old vectors: a typo in embedding.model must lose nothing.
            self.embedder.embed_query("model check")
        work = self._work_list(disk, full)
        plans: list[_Plan] = []
        removed: list[str] = []
        for i, (path, stat) in enumerate(work, 1):
            if stat is None:
                removed.append(path)
            else:
                plans.append(self._plan(path, stat, self._state.get(path)))
            if progress and (i % 100 == 0 or i == len(work)):
                progress("read", i, len(work))
        with self.mutex:
            self._refresh_user_terms(adding=[p.record for p in plans if p.chunks])
        total = sum(len(p.chunks) for p in plans)
        batch: list[_Plan] = []
        done = 0
        for n, plan in enumerate(plans, 1):
            if self.cancel:
                report.reasons.append("sync cancelled; the next sync resumes where this one stopped")
                return
            batch.append(plan)
            size = sum(len(p.chunks) for p in batch)
            if size >= BATCH_CHUNKS or n == len(plans):
                self._commit_batch(batch, removed if n == len(plans) else [], report)
                done += size
                self.progress = (done, total)
                if progress:
                    progress("embed", done, total)
                batch = []
        if not plans and (removed or self._reset_vectors):
            self._commit_batch([], removed, report)
        if full and work:  # orphans come from a crash or a lost state.json, both of which leave work to do
            self._drop_orphans(report)

    def _work_list(self, disk: dict[str, tuple[int, int] | None], full: bool) -> list[tuple[str, tuple[int, int] | None]]:
        if full and not self._state_rework and disk == self._state_stats:
            return []  # the common case before a search: one dict comparison instead of a loop over every note
        state = self._state or {}
        work: list[tuple[str, tuple[int, int] | None]] = []
        for path, stat in disk.items():
            old = state.get(path)
            if stat is None:
                if old is not None:
                    work.append((path, None))
            elif old is None or (old.mtime_ns, old.size) != stat or not (old.md5 or old.skipped):
                work.append((path, stat))
        if full:
            work.extend((p, None) for p in state if p not in disk)
        return work

    def _plan(self, path: str, stat: tuple[int, int], old: FileRecord | None) -> _Plan:
        """Read a note once: same md5 as `old` -> touched; else chunked; unreadable -> a record with a skip reason."""
        try:
            if stat[1] > self.cfg.max_file_bytes:
                raise ValueError(f"larger than max_file_bytes ({stat[1]} > {self.cfg.max_file_bytes} bytes)")
            raw = (self.cfg.kb_dir / path).read_bytes()
            md5 = hashlib.md5(raw).hexdigest()
            if old is not None and old.md5 == md5 and not old.skipped:
                return _Plan(path, replace(old, mtime_ns=stat[0], size=stat[1]), [], touched=True)
            text, encoding = decode_note(raw)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            logger.warning("skipping %s: %s", path, reason)
            return _Plan(path, FileRecord(stat[0], stat[1], "", skipped=reason), [])
        parsed = chunk_note(text, Path(path).stem, self.cfg.chunk_tokens, self.cfg.overlap_tokens)
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
        record = FileRecord(
            stat[0], stat[1], md5, tuple(c.id for c in chunks), parsed.title, parsed.tags, parsed.aliases, encoding
        )
        return _Plan(path, record, chunks)

    def _commit_batch(self, batch: list[_Plan], removed: list[str], report: SyncReport) -> None:
        """Write one batch under the inter-process lock: vectors first, then state.json (the commit point)."""
        counts: dict[str, int] = {"added": 0, "changed": 0, "removed": 0, "touched": 0, "skipped": 0}
        details: list[tuple[str, str]] = []
        self._file_lock.acquire(self.cfg.lock_timeout_s)
        try:
            self._refresh_state(report.reasons)
            state = dict(self._state or {})  # applied to self._state only once the batch is committed
            if self._reset_vectors:
                self.vectors.reset()
                self._reset_vectors = False
            new: list[ChunkRecord] = []
            moved: list[ChunkRecord] = []  # same text as before, possibly at new lines
            stale: set[str] = set()
            done: list[_Plan] = []
            for plan in batch:
                cur = state.get(plan.path)
                if cur is not None and cur.md5 and cur.md5 == plan.record.md5:
                    if not plan.touched and cur.mtime_ns == plan.record.mtime_ns:
                        done.append(plan)  # another process indexed this exact content already
                        continue
                    state[plan.path] = replace(cur, mtime_ns=plan.record.mtime_ns, size=plan.record.size)
                    counts["touched"] += 1
                    details.append((plan.path, "touched"))
                    continue
                if plan.touched:
                    continue  # state moved on since we read it; the next sync re-reads this note
                old_ids = set(cur.chunks) if cur else set()
                stale |= old_ids - set(plan.record.chunks)
                for c in plan.chunks:
                    (moved if c.id in old_ids else new).append(c)
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
            self._store_vectors(new, moved, state, report)
            if stale:
                self.vectors.delete(sorted(stale))
                report.chunks_deleted += len(stale)
            self._set_state(state)
            self._commit_state()
        finally:
            self._file_lock.release()
        for kind, n in counts.items():
            setattr(report, kind, getattr(report, kind) + n)
        report.details.extend(details)
        with self.mutex:
            for plan in done:
                self._view_put(plan.path, plan.record, plan.chunks)
            for path in removed:
                self._view_put(path, None, ())

    def _store_vectors(
        self, new: list[ChunkRecord], moved: list[ChunkRecord], state: dict[str, FileRecord], report: SyncReport
    ) -> None:
        """Give each new chunk a vector: already stored, reused by content hash, or embedded (never twice)."""
        present = self.vectors.existing([c.id for c in new]) if new else set()
        refresh = moved + [c for c in new if c.id in present]
        if refresh:
            self.vectors.update_metadata([c.id for c in refresh], [_chroma_meta(c, state) for c in refresh])
        need = [c for c in new if c.id not in present]
        report.chunks_reused += len(new) - len(need)
        if not need:
            return
        vectors = self.vectors.vectors_by_content(sorted({c.content for c in need}))
        todo = list({c.content: c for c in need if c.content not in vectors}.values())
        if todo:
            embedded = self.embedder.embed_documents([embed_text(c, state.get(c.path)) for c in todo])
            vectors.update({c.content: v for c, v in zip(todo, embedded)})
            report.chunks_embedded += len(todo)
        report.chunks_reused += len(need) - len(todo)
        self.vectors.upsert([c.id for c in need], [vectors[c.content] for c in need], [_chroma_meta(c, state) for c in need])

    def _drop_orphans(self, report: SyncReport) -> None:
        """After a full sync, delete vectors no note references (left by a crash or a lost state file)."""
        state = self._state or {}
        if self.vectors.count() == sum(len(r.chunks) for r in state.values()):
            return
        self._file_lock.acquire(self.cfg.lock_timeout_s)
        try:
            known = {cid for r in state.values() for cid in r.chunks}
            orphans = [cid for cid in self.vectors.all_ids() if cid not in known]
            if orphans:
                self.vectors.delete(orphans)
                report.chunks_deleted += len(orphans)
                report.reasons.append(f"removed {len(orphans)} vectors that no note references")
        finally:
            self._file_lock.release()

    # ---- the view: notes -> this process's BM25 ------------------------------------------------------------

    def _view_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k != "model"}

    def _load_view(self) -> None:
        """Start from the BM25 pickle when it was built with the same parameters; else from empty."""
        self._view_loaded = True
        try:
            index, meta = load_index(self.cfg.bm25_index_file)
        except FileNotFoundError:
            return
        except IndexFormatError as e:
            logger.warning("%s", e)
            return
        if meta.get("params") != self._view_params():
            logger.info("the BM25 index was built with other parameters; rebuilding it from the notes")
            return
        with self.mutex:
            self.bm25, self.files, self.chunks = index, meta["files"], meta["chunks"]
            self._view_version += 1
            self._saved_view_version = self._view_version
            self.tokenizer.set_user_terms(meta.get("user_terms", ()))

    def _tokens(self, c: ChunkRecord, rec: FileRecord | None) -> list[str]:
        meta = " ".join([c.context, *(rec.tags if rec else ()), *(rec.aliases if rec else ())])
        meta_tokens = self._meta_tokens.get(meta)
        if meta_tokens is None:  # every chunk of a section repeats its title, heading path and tags: tokenize once
            if len(self._meta_tokens) > META_TOKEN_CACHE:
                self._meta_tokens.clear()
            meta_tokens = self._meta_tokens[meta] = self.tokenizer.tokenize(meta)
        return self.tokenizer.tokenize(c.text) + meta_tokens * self.cfg.metadata_weight

    def _view_stat_map(self) -> dict[str, tuple[int, int]]:
        version, stats = self._view_stats
        if version != self._view_version:
            stats = {p: (r.mtime_ns, r.size) for p, r in self.files.items()}
            self._view_stats = (self._view_version, stats)
        return stats

    def _view_set(self, path: str, record: FileRecord) -> None:
        """Replace a note's record in the view without touching its chunks (same content, new stat)."""
        self.files[path] = record
        self._view_version += 1

    def _view_put(self, path: str, record: FileRecord | None, chunks: Sequence[ChunkRecord]) -> None:
        self._view_version += 1
        old = self.files.pop(path, None)
        for cid in old.chunks if old else ():
            self.bm25.remove(cid)
            self.chunks.pop(cid, None)
        if record is None:
            return
        self.files[path] = record
        for c in chunks:
            self.chunks[c.id] = c
            self.bm25.add(c.id, self._tokens(c, record))

    def _reconcile_view(self, disk: dict[str, tuple[int, int] | None], full: bool, report: SyncReport) -> None:
        """Make this process's view match the notes: take records another process committed, re-chunk the rest."""
        self._refresh_state([] if report.vectors else report.reasons)
        state = self._state or {}
        with self.mutex:
            if full and disk == self._view_stat_map():  # nothing differs: the no-change fast path
                if report.did_work:
                    self._refresh_user_terms()
                return
            gone = [p for p, s in disk.items() if s is None and p in self.files]
            if full:
                gone += [p for p in self.files if p not in disk]
            todo = [
                (p, s)
                for p, s in disk.items()
                if s is not None and (p not in self.files or (self.files[p].mtime_ns, self.files[p].size) != s)
            ]
        changed = bool(gone)
        with self.mutex:
            for path in gone:
                self._view_put(path, None, ())
                if not report.vectors:
                    report.removed += 1
        plans: list[tuple[_Plan, FileRecord | None]] = []
        for path, stat in todo:
            mine = self.files.get(path)
            shared = state.get(path)
            if mine and shared and mine.md5 and shared.md5 == mine.md5 and (shared.mtime_ns, shared.size) == stat:
                with self.mutex:
                    self._view_set(path, replace(mine, mtime_ns=stat[0], size=stat[1]))
                continue
            plans.append((self._plan(path, stat, mine), mine))
        with self.mutex:
            if plans:
                self._refresh_user_terms(adding=[p.record for p, _ in plans if p.chunks])
            for plan, mine in plans:
                if plan.touched:
                    self._view_set(plan.path, plan.record)
                    continue
                self._view_put(plan.path, plan.record, plan.chunks)
                changed = True
                if not report.vectors:
                    kind = "skipped" if plan.record.skipped else "changed" if mine else "added"
                    setattr(report, kind, getattr(report, kind) + 1)
        if changed or report.did_work:
            with self.mutex:
                self._refresh_user_terms()

    def _refresh_user_terms(self, adding: Iterable[FileRecord] = ()) -> None:
        """Vault titles, aliases and tags become single jieba tokens; re-tokenize only the chunks they occur in.

        With `adding`, the terms of notes about to be indexed join the dictionary first (none leave), so a big sync
        tokenizes its new chunks once with the final dictionary instead of twice.
        """
        records = list(adding)
        if records:
            terms = set(self.tokenizer.user_terms) | {t for r in records for t in (r.title, *r.aliases, *r.tags) if t}
        else:
            terms = {t for r in self.files.values() for t in (r.title, *r.aliases, *r.tags) if t}
        changed = self.tokenizer.set_user_terms(terms)
        if not changed:
            return
        self._meta_tokens.clear()
        pattern = re.compile("|".join(re.escape(t) for t in sorted(changed, key=len, reverse=True)))
        for cid, c in list(self.chunks.items()):
            rec = self.files.get(c.path)
            hay = " ".join([c.text, c.context, *(rec.tags if rec else ()), *(rec.aliases if rec else ())]).lower()
            if pattern.search(hay):
                self.bm25.add(cid, self._tokens(c, rec))


# ---- CLI ---------------------------------------------------------------------------------------------------------


def _progress_bar(enabled: bool) -> tuple[ProgressFn | None, Callable[[], None]]:
    """A tqdm bar per stage on stderr (files read, chunks embedded) with rate and ETA."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(
                total=total,
                unit="files" if stage == "read" else "chunks",
                file=sys.stderr,
                desc="reading notes" if stage == "read" else "embedding",
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
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet, default="WARNING")
    try:
        cfg = load_cli_config(args)
        embedder = SentenceTransformerEmbedder(cfg.embed_model, cfg.embed_device, cfg.embed_batch_size, allow_download=True)
        engine = Engine(cfg, embedder)
        progress, close = _progress_bar(not args.quiet and sys.stderr.isatty())
        try:
            report = engine.sync_all(rebuild=args.rebuild, progress=progress)
        finally:
            close()
        if engine.model_error:
            raise ModelUnavailableError(engine.model_error)
        if engine.view_changed:
            engine.save_view()
        warning = engine.model_warning()
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        if args.verbose > 1:
            raise
        return 1
    for reason in report.reasons:
        print(reason, file=sys.stderr)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        out = report.as_dict()
        out.update(
            kb_dir=str(cfg.kb_dir),
            index_dir=str(cfg.index_dir),
            notes=len(engine.files),
            chunks=len(engine.chunks),
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
    print(f"{cfg.kb_dir}: {report.summary()}; index holds {len(engine.files)} notes, {len(engine.chunks)} chunks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
