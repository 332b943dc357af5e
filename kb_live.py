"""The server's live index: the engine built in a background thread (a keyword answer first, the model after), and
freshness: file events name the notes a search re-checks, a full stat walk is the fallback and a periodic audit.

Imports: kb_config, kb_scan, kb_state; lazily: kb_engine, kb_search, kb_vectors, kb_watch, kb_kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from kb_config import Config, KBError
from kb_scan import Stat, note_stat
from kb_state import SyncReport, file_identity

if TYPE_CHECKING:  # imported for real in the start-up thread (they pull numpy, jieba, the models)
    from kb_engine import Engine
    from kb_search import Searcher, SearchResult
    from kb_vectors import Embedder
    from kb_watch import ChangeCollector

logger = logging.getLogger(__name__)

# How long a search with changes to apply waits for a sync another thread is running before answering from what is
# indexed (a search with nothing to apply never waits).
SYNC_WAIT_S = 20.0
# How long a mode="semantic" search waits for the model still loading at start-up (hybrid never waits: it answers
# with keywords and says semantic results join shortly).
MODEL_WAIT_S = 60.0
# Said with keyword-only answers while the model loads after a start.
SEMANTIC_LOADING_NOTE = (
    "semantic results join shortly: the embedding model is still loading, so this answer is keyword search only "
    "(if nothing relevant was found, search again in a few seconds)"
)
# How long a search waits for the start-up thread's first keyword view before saying "still starting".
STARTUP_WAIT_S = 60.0
# On shutdown, how long to let a running sync finish its current batch before exiting.
SHUTDOWN_WAIT_S = 3.0
# Save this process's keyword view to disk at most this often (it is the next process's fast start).
SAVE_VIEW_DELAY_S = 10.0
# glibc's mallopt parameter for the number of heaps (malloc.h's M_ARENA_MAX).
M_ARENA_MAX = -8
# Model and BLAS threads in the server (torch, numpy's BLAS). It embeds one short query at a time, where a second
# thread saves ~10 ms on an idle 2-core machine but, measured here, turned 15 ms into ~490 ms (torch) when the other
# core was busy (e.g. the client itself); numpy's own BLAS threads did the same to every vector scan.
SERVER_MODEL_THREADS = 1
# Threads that embed chunks side by side in the background (a first index, a git pull), each one model call on one
# core at a time, pausing while a search runs (kb_embedrun.SearchGate): every core, as the user waits for the index.
SERVER_EMBED_WORKERS = os.cpu_count() or 1
# Before taking the changed paths, a search sleeps this long so watchdog's threads hand over events the kernel has
# already queued: anything saved before the request was sent is queued by then, and inotify -> handler took
# p50 0.2 ms, p99 4 ms, max 4.2 ms here (200 writes, idle and with one core busy). Residual risk: a handler delayed
# past this (a heavily overloaded machine) is picked up by the next search; hits themselves are re-checked by stat.
EVENT_SETTLE_S = 0.002
# If events are still arriving after that (a burst: many files saved at once, a git checkout), the search waits until
# they pause this long, at most EVENT_BURST_MAX_S, so it takes the whole burst rather than part of it. CI once took 32
# of 60 files written just before the request: the handler was still delivering them on a loaded machine. Costs
# nothing when no event came in the last EVENT_QUIET_S, which is every question a person types after saving.
EVENT_QUIET_S = 0.05
EVENT_BURST_MAX_S = 1.0
# While searches come in, a full stat walk runs in the background this often, as an audit of the events (a folder
# past the inotify watch limit is silently unwatched, network file systems send no events). No search waits for it.
SAFETY_WALK_S = 30.0
# Audits in a row that must find changes no event reported before the server stops trusting events and walks the
# vault before every search (one alone may be an edit racing the walk).
MISSED_AUDITS_TO_FALLBACK = 2


def load_model(engine: Engine) -> None:
    """Load the engine's model now, so no search pays for it; a failure leaves keyword search, with the reason."""
    if engine.model_error is not None:
        return
    try:
        engine.embedder.load()
    except KBError as e:
        engine.model_error = str(e)
        logger.warning("%s", e)


def use_one_malloc_arena() -> None:
    """Let every thread allocate from glibc's main heap; call before the server starts threads. Python runs one thread
    at a time, so a heap per thread bought nothing, and what a background thread freed (a save of the view: 41 MB on
    tldr) stayed in its own heap, where malloc_trim could not return it. Linux with glibc only."""
    mallopt = _libc("mallopt")
    if mallopt:
        mallopt(M_ARENA_MAX, 1)


def _return_freed_memory() -> None:
    """Give the OS back the memory a save of the view or a commit just freed: glibc's malloc keeps it in the process
    (on tldr 50 MB after a save, for the server's life, and the next commit's peak came on top of it). The models'
    runtime arena goes first: a note's chunks grew it to 16 MB that the server's queries never use."""
    from kb_kernels import release_arena  # numpy's import: by now the view has made it

    release_arena()
    trim = _libc("malloc_trim")
    if trim:
        trim(0)


def _libc(name: str) -> Any:
    """glibc's function `name`, or None without glibc (macOS, Windows, musl): then memory is left to the allocator."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None


@contextlib.contextmanager
def collector_paused(collect: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off while the keyword view or the models load, then what loaded moved out of
    its reach (`collect`: after one pass over it, which frees the cycles the load left).

    The view (and the models' tokenizers) are hundreds of thousands of container objects (288k on tldr): the collector
    walked them again and again as they were made, 0.4 s of the keyword view's 0.8 s and 0.3 s of the models' 0.6 s
    there, with the SDK's own objects walked each time too. Frozen, later collections skip them. Loading the view
    leaves no cycles (a pass over it freed 0 objects, in 50-60 ms), loading the models a few (164, in 6-7 ms; a
    sentence-transformers model more): only the models get that pass. The MCP SDK's import and the tools' schemas
    (mcp_server.build_server) get none: the cycles they leave (~1,400 objects, 0.4 MB) stay, as a pass over them
    would take 60-75 ms of the ~150 ms the pause saves a server's start."""
    was_enabled = gc.isenabled()  # nested, or under a caller that keeps it off: left as it was
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        if collect:
            gc.collect(0)  # everything made while paused is still in the youngest generation
        gc.freeze()


class LiveIndex:
    """The engine (created in the background) kept current with the notes: what every tool searches or reads."""

    def __init__(self, cfg: Config, embedder: Embedder | None = None) -> None:
        self.cfg = cfg
        self.engine: Engine = None  # type: ignore[assignment]  # set by the start-up thread; ready_engine() waits
        self.searcher: Searcher = None  # type: ignore[assignment]
        self._embedder = embedder  # None: the configured model (tests pass a small fake)
        self._view_ready = threading.Event()  # engine built and its keyword view current: searches may answer
        self.model_ready = threading.Event()  # the model loaded, or failed (engine.model_error says why)
        self.startup_done = threading.Event()  # the start-up thread finished (synced, vectors embedded)
        self._init_error: BaseException | None = None
        self._started = False
        self._save_timer: threading.Timer | None = None
        self._save_lock = threading.Lock()
        # Freshness: file events when they work, else a stat walk before each search.
        self.changes: ChangeCollector | None = None  # once watching
        self._observer: Any = None
        self._walk_reason: str | None = None  # why searches walk the vault (None: file events are trusted)
        self._last_walk = 0.0  # time.monotonic() of the last full walk that completed
        self._audit_running = threading.Lock()
        self._embedding = threading.Lock()  # held while a background embed_pending runs
        self._missed_audits = 0
        # state.json's identity when this process last synced (others commit there)
        self._state_seen: tuple[int, int, int] | None = None
        self.sync_error: str | None = None  # why the last sync could not write the index (None: it could)
        self.counts = {
            "event_syncs": 0,  # searches that applied changed paths from file events
            "state_checks": 0,  # searches with no event, checking only whether another process committed
            "full_walks_before_search": 0,  # searches that walked the whole vault first (fallback, lost events)
            "full_walks_in_background": 0,  # start-up and audit walks, which no search waits for
            "changes_missed_by_events": 0,  # notes an audit walk found changed without an event
            "late_event_syncs": 0,  # searches that found events come in while they ran (applied, then run again)
        }

    # ---- start-up -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Build the engine, watch the vault, load the view, jieba and the model in a background thread (once)."""
        if self._started:
            return
        self._started = True
        threading.Thread(target=self._startup, name="kb-startup", daemon=True).start()

    def _startup(self) -> None:
        """The start-up thread: everything in the order that gets a first answer soonest."""
        try:
            self._load_in_order()
        finally:
            self.startup_done.set()

    def _load_in_order(self) -> None:
        try:
            from threadpoolctl import threadpool_limits

            from kb_engine import Engine
            from kb_search import Searcher
            from kb_vectors import config_embedder

            # Every BLAS call of this process (the vector scan, the translation step, the gate), not only the models:
            # OpenBLAS's second thread spins after each call and took the core the client (or anything else) needed.
            threadpool_limits(SERVER_MODEL_THREADS)
            cfg = self.cfg
            embedder = self._embedder or config_embedder(cfg, threads=SERVER_MODEL_THREADS)
            self.engine = Engine(cfg, embedder, embed_workers=SERVER_EMBED_WORKERS)
            self.searcher = Searcher(self.engine)
        except BaseException as e:  # reported by every tool call
            self._init_error = e
            logger.exception("start-up failed")
            self._view_ready.set()
            self.model_ready.set()
            return
        engine = self.engine
        engine.defer_vectors()  # the first keyword answer needs the view only; the segments load with the model
        self._start_watching()  # before the first walk, so no edit made during it is missed
        try:
            with collector_paused():
                engine.sync_all(write=False)  # the keyword view, current with the notes: all a first answer needs
            self._walked(background=True)
        except Exception:
            logger.exception("start-up sync of the keyword view failed; the next search retries")
        # Searches may answer now: jieba opens its dictionary next, before the model (mapped from the per-user word
        # table in ~1 ms; the first start of a user's first server reads jieba's own, ~1.2 s). A Chinese search that
        # comes meanwhile waits for it (the dictionary's lock); English words never touch jieba, so an English first
        # answer never waits for it.
        self._view_ready.set()
        try:
            engine.view.load_dictionary()
        except Exception:
            logger.exception("loading jieba's dictionary failed; the first Chinese search retries")
        try:
            engine.load_vectors()
        except Exception:
            logger.exception("loading the vector segments failed; the next sync retries")
        with collector_paused(collect=True):
            load_model(engine)
            try:
                self.searcher.warm_up()  # the relevance gate's background sample, not in the first semantic search
            except Exception:
                logger.exception("warming up the relevance gate failed; the first search does it")
        self.model_ready.set()
        try:
            engine.sync_all(embed_limit=0)  # commit what changed while no server ran (its vectors: just below)
            if engine.view_changed:
                self._schedule_save()
            if engine.model_error is None:
                engine.embed_pending()
            _return_freed_memory()  # the load's and the warm-up's transient memory, and the notes' runs' arena
        except Exception:
            logger.exception("start-up sync failed; the next search retries")

    def _start_watching(self) -> None:
        from kb_watch import ChangeCollector, start_observer

        self.changes = ChangeCollector(self.cfg.kb_dir, self.cfg.extensions)
        try:
            self._observer = start_observer(self.cfg.kb_dir, self.changes)
        except Exception as e:  # no inotify instance left, no watchdog, an unwatchable folder: walk instead
            self._walk_reason = f"file events unavailable ({type(e).__name__}: {e})"
            logger.warning("%s; the vault is walked before each search instead", self._walk_reason)
        else:
            logger.info("watching %s for changes (%s)", self.cfg.kb_dir, type(self._observer).__name__)

    def shutdown(self) -> None:
        """Stop watching and let a running sync end its batch (bounded): the process exits right after."""
        if self._observer is not None:
            self._observer.stop()  # not joined: the process is about to exit
        engine = self.engine
        if engine is not None and engine.syncing:
            engine.cancel = True
            deadline = time.monotonic() + SHUTDOWN_WAIT_S
            while engine.syncing and time.monotonic() < deadline:
                time.sleep(0.05)

    def ready_engine(self) -> Engine:
        """The engine once its keyword view is current (waits for start-up, at most STARTUP_WAIT_S); KBError if it
        could not start."""
        if not self._view_ready.wait(timeout=STARTUP_WAIT_S):
            raise KBError("the index is still starting up; try again in a few seconds")
        if self._init_error is not None:
            raise KBError(f"the knowledge base could not start: {self._init_error}")
        return self.engine

    def _schedule_save(self) -> None:
        with self._save_lock:
            if self._save_timer is None or not self._save_timer.is_alive():
                self._save_timer = threading.Timer(SAVE_VIEW_DELAY_S, self._save_view)
                self._save_timer.daemon = True
                self._save_timer.start()

    def _save_view(self) -> None:
        try:
            self.engine.save_view()
            _return_freed_memory()
        except Exception:
            logger.exception("could not save the keyword index cache (harmless: the next start rebuilds it)")

    # ---- freshness ------------------------------------------------------------------------------------------

    def _walked(self, background: bool) -> None:
        self._last_walk = time.monotonic()
        self.counts["full_walks_in_background" if background else "full_walks_before_search"] += 1

    def ensure_fresh(self, ahead: tuple[str, Sequence[str] | None, str] | None = None) -> list[str]:
        """Make the view match the notes before a search; returns notes for the reply.

        With file events: apply the paths they named (nothing else is read), or, with none, only check whether
        another process committed. Without events, or after lost ones: one stat walk of the vault. `ahead`: the search
        to come (query, alternatives, mode), whose query vectors (they never depend on the index) are embedded while
        the file events settle, in place of that much of the wait, once the model is loaded.
        """
        engine = self.ready_engine()
        notes: list[str] = []
        t0 = time.monotonic()
        if ahead is not None and self.model_ready.is_set():
            try:
                self.searcher.embed_ahead(*ahead)
            except Exception as e:  # the search itself embeds again and reports what fails
                logger.debug("embedding ahead of a search failed: %s", e)
        if self._walk_reason is not None:
            if time.monotonic() - self._last_walk >= self.cfg.check_interval_s:
                self._sync(engine, None, notes)
        else:
            self._wait_for_events_to_settle(time.monotonic() - t0)
            self._apply_events(engine, notes)
        if engine.model_error:
            notes.append(f"semantic search is off: {engine.model_error}")
        return notes

    def _wait_for_events_to_settle(self, waited_s: float = 0.0) -> None:
        """Sleep what is left of EVENT_SETTLE_S after `waited_s` of other work (the query's embedding: onnxruntime
        runs without the GIL, so watchdog's threads run meanwhile as they do in a sleep), then out any burst."""
        time.sleep(max(0.0, EVENT_SETTLE_S - waited_s))  # sleep(0) still hands the GIL to a waiting thread
        deadline = time.monotonic() + EVENT_BURST_MAX_S
        while True:
            now = time.monotonic()
            quiet_for = now - self.changes.last_event_at
            if quiet_for >= EVENT_QUIET_S or now >= deadline:
                return
            time.sleep(min(EVENT_QUIET_S - quiet_for, deadline - now))

    def _apply_events(self, engine: Engine, notes: list[str]) -> bool:
        """Apply the changes file events named (none: check only whether another process committed); True if some
        were applied."""
        from kb_watch import paths_to_check

        changes = self.changes.take()
        if changes is None:
            self.counts["state_checks"] += 1
            if file_identity(engine.state_path) != self._state_seen:  # a commit since this process last synced
                # Another process's commit names notes to take in (the sync adds them): wait for a running sync, as
                # with events. This process's own commits (its vectors) never make a search wait.
                self._sync(engine, [], notes, wait_s=SYNC_WAIT_S if engine.others_committed() else 0.0)
            return False
        paths = paths_to_check(changes, self.cfg.kb_dir, engine.view.paths())
        if paths is None:
            logger.info("walking the vault before this search: %s", changes.reason or "the vault folder itself changed")
        else:
            self.counts["event_syncs"] += 1
        if not self._sync(engine, paths, notes):
            self.changes.put_back(changes)  # not applied (busy or failed): the next search tries again
            return False
        return True

    def apply_late_events(self, notes: list[str]) -> bool:
        """Apply the file events that came in while a search ran; True if the search should run again.

        watchdog hands an event through three threads: under load (a sync or the model holding the GIL) an edit saved
        just before the request can reach the collector after the settle wait, and the search answers without it. A
        search lasts long enough for it to arrive, so it is looked for once more at the end.
        """
        if self._walk_reason is not None or self.changes is None or not self.changes.pending:
            return False
        self.counts["late_event_syncs"] += 1
        logger.info("file events came in during a search: applying them and searching again")
        return self._apply_events(self.engine, notes)

    def search_mode(self, mode: str, notes: list[str]) -> str:
        """The mode a search can run in now: while the model loads, hybrid answers with keywords (and says so) and
        semantic waits for it (at most MODEL_WAIT_S)."""
        if mode == "keyword" or self.model_ready.is_set():
            return mode
        if mode == "semantic":
            if not self.model_ready.wait(MODEL_WAIT_S):
                raise KBError(
                    f"the embedding model is still loading after {MODEL_WAIT_S:.0f} s; try again shortly, or "
                    "search with mode='keyword'"
                )
            return mode
        notes.append(SEMANTIC_LOADING_NOTE)
        return "keyword"

    def search(self, query: str, mode: str, notes: list[str], **options: Any) -> SearchResult:
        """Searcher.search (after ensure_fresh) in the mode the model allows now, holding every edit saved before it
        was asked: run again if file events came in while it ran, or if a hit's note changed on disk after the events
        were taken. `options`: Searcher.search's keyword arguments; `notes` gets what the reply should say."""
        mode = self.search_mode(mode, notes)

        def run() -> SearchResult:
            with self.engine.search_gate.searching():  # a first index's embedding pauses meanwhile
                result = self.searcher.search(query, mode=mode, **options)
            if mode != "keyword":
                covered = self.engine.coverage_note()  # while chunks lack vectors: how much the semantic lists cover
                if covered:
                    result.notes.append(covered)
            return result

        result = run()
        if self.apply_late_events(notes):
            result = run()
        stale = self._stale_hits(result)
        if stale:
            logger.info("re-checking %d hit notes changed on disk: %s", len(stale), stale[:3])
            if self._sync(self.engine, stale, notes):
                result = run()
        self._after_search()
        return result

    def _sync(self, engine: Engine, paths: list[str] | None, notes: list[str], wait_s: float = SYNC_WAIT_S) -> bool:
        """engine.try_sync with the reply's notes; True if it ran."""
        try:
            report = self.try_sync(wait_s, paths)
        except KBError as e:
            notes.append(f"the index could not be refreshed ({e}); results may miss recent edits")
            return False
        if report is None:
            if wait_s > 0 or engine.progress:
                done = engine.progress
                notes.append(
                    "indexing is still running"
                    + (f" ({done[0]}/{done[1]} chunks)" if done else "")
                    + "; results cover what is indexed so far"
                )
            return False
        self._state_seen = file_identity(engine.state_path)
        if paths is None:
            self._walked(background=False)
        if engine.view_changed:
            self._schedule_save()
        return True

    def try_sync(self, wait_s: float, paths: list[str] | None) -> SyncReport | None:
        """engine.try_sync, never loading the model on a search's path: before the model is ready, changes are
        committed without vectors (keyword search has them at once); vectors the engine leaves to embed are embedded
        in the background. The index's folder failing a write (a full disk, a quota, a read-only mount) is a KBError
        saying so, kept in `sync_error` for index_status until a sync succeeds; searches go on from what is held."""
        engine = self.engine
        try:
            if self.model_ready.is_set():
                report = engine.try_sync(wait_s, paths)
            else:
                report = engine.try_sync(wait_s, paths, embed_limit=0)
        except OSError as e:
            self.sync_error = (
                f"the index in {self.cfg.index_dir} cannot be written ({e.strerror or e}): searches answer from what "
                "was indexed before, and edits since are not indexed until space is freed there (nothing is lost)"
            )
            logger.warning("%s", self.sync_error)
            raise KBError(self.sync_error) from e
        if report is not None:
            self.sync_error = None
            if report.did_work:  # a commit rewrote state.json (and re-chunked): its transient memory is freed
                _return_freed_memory()
        if report is not None and report.pending_vectors and self.model_ready.is_set() and engine.model_error is None:
            if self._embedding.acquire(blocking=False):
                threading.Thread(target=self._embed_pending, name="kb-embed", daemon=True).start()
        return report

    def _embed_pending(self) -> None:
        try:
            self.engine.embed_pending()
            _return_freed_memory()
        except Exception:
            logger.exception("embedding the changed notes failed; the next sync retries")
        finally:
            self._embedding.release()

    def _after_search(self) -> None:
        """Start the background audit walk when one is due (only while searches come in)."""
        if self._walk_reason is not None or time.monotonic() - self._last_walk < SAFETY_WALK_S:
            return
        if self._audit_running.acquire(blocking=False):
            threading.Thread(target=self._audit, name="kb-audit", daemon=True).start()

    def _audit(self) -> None:
        """A full walk after the events were applied: whatever it still finds changed, the events missed."""
        try:
            engine = self.engine
            self._last_walk = time.monotonic()
            ignored: list[str] = []
            self._apply_events(engine, ignored)
            report = self.try_sync(SYNC_WAIT_S, None)
            if report is None:
                return
            self._walked(background=True)
            missed = report.added + report.changed + report.removed if report.committed else 0
            self.counts["changes_missed_by_events"] += missed
            self._missed_audits = self._missed_audits + 1 if missed else 0
            if missed:
                logger.warning("the audit walk found %d changed notes that no file event reported", missed)
            if self._missed_audits >= MISSED_AUDITS_TO_FALLBACK:
                self._walk_reason = (
                    f"{MISSED_AUDITS_TO_FALLBACK} audit walks in a row found changes file events had not reported "
                    "(e.g. folders past the inotify watch limit, or a network file system)"
                )
                logger.warning("%s; walking the vault before each search from now on", self._walk_reason)
        except KBError as e:  # e.g. the index's disk is full: said by try_sync, in sync_error and the log
            logger.info("the audit walk could not sync: %s", e)
        except Exception:
            logger.exception("the audit walk failed; the next one retries")
        finally:
            self._audit_running.release()

    def change_detection(self) -> str:
        """How the index learns of edits, as index_status reports it."""
        if self._walk_reason is not None:
            return f"stat walk of the vault before each search: {self._walk_reason}"
        if self._observer is None:
            return "starting"
        return (
            f"file events ({type(self._observer).__name__}); a full walk audits them every {SAFETY_WALK_S:.0f} s "
            "while searches come in"
        )

    def _stale_hits(self, result: SearchResult) -> list[str]:
        """Notes the reply names (hits, their translations, the tail) whose file no longer matches the index (an event
        still in flight): one stat per note."""
        engine = self.engine
        stale = []
        for path in result.ranked_notes():
            rec = engine.view.record(path)
            try:
                st = os.stat(self.cfg.kb_dir / path)
                now: Stat | None = note_stat(st)
            except OSError:
                now = None
            if rec is None or now != rec.stat:
                stale.append(path)
        return stale
