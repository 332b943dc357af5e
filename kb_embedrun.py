"""How an index's chunks get their vectors: which models embed which chunks (an English-only model leaves mostly Chinese
text to a multilingual one beside it), in what order (the multilingual model first, so a first index answers
semantically early), on how many threads (one task per worker, each model on one BLAS thread), pausing while searches
run; and how far it has got (coverage per model, an estimate of the time left).

The engine (kb_engine) owns the index and calls these (threadpoolctl is imported where used). Imports: kb_text, kb_vectors.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kb_text import cjk_share
from kb_vectors import Embedder, embedder_parts, is_english_only

logger = logging.getLogger(__name__)

# An English-only model beside a multilingual one leaves a chunk to the multilingual one when the chunk is mostly
# Chinese (at least this CJK: the search's own test for a Chinese query, kb_search.Tuning.cjk_share, which then gives
# that model only the query's Latin words)...
CHINESE_TEXT_SHARE = 0.3
# ...and holds fewer Latin words than this (names, commands, code identifiers: what that model can read of it). The
# dev sets' rankings, measured per threshold, are in docs/performance.md (issue 34): skipping every mostly Chinese
# chunk lost 0.07 NDCG@5 on the sample vault, whose English questions find Chinese notes by their English terms.
MIN_LATIN_WORDS = 10
# Latin words as the search takes them from a Chinese query for an English-only model (kb_search._LATIN_WORD_RE).
_LATIN_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
# Texts per model call inside one task: between calls the run pauses for searches (a call takes ~0.1 s for USE,
# ~0.5 s for MiniLM on one core). Both models pack a call's tokens without padding, so small calls cost nothing.
EMBED_SLICE_TEXTS = 16
# Longest one pause for searches lasts before the run goes on (a storm of searches must not stop indexing).
SEARCH_YIELD_MAX_S = 2.0
# Whether worker w starts with model w (USE on one core, MiniLM on the other) instead of every worker taking the
# multilingual model's chunks first. Measured in docs/performance.md (issue 34).
SPREAD_MODELS_OVER_WORKERS = False
# ModelPlan.index of an embedder that gives whole rows (one model, or every model at once).
WHOLE_ROW = -1
# Seconds per minute, for the time left as people read it.
MINUTE_S = 60
# How worker processes start (embed_processes): forked after the models load, they share the weights' pages and load
# nothing. Where fork is missing (Windows), the workers are threads.
PROCESS_START_METHOD = "fork"

# The models a forked worker process embeds with, set in the parent just before it forks (see forked_models).
_CHILD_PLANS: dict[int, Embedder] = {}


@dataclass(frozen=True)
class ModelPlan:
    """One model of the index: where its vector sits in a row (`index`, kb_store's part; -1: the embedder gives
    whole rows, every model at once), and whether it leaves mostly Chinese chunks to a multilingual model beside it."""

    index: int
    embedder: Embedder
    skips_chinese: bool = False

    @property
    def whole(self) -> bool:
        return self.index < 0

    @property
    def name(self) -> str:
        return self.embedder.name


def plan_models(embedder: Embedder, per_model: bool = True) -> list[ModelPlan]:
    """The index's models in the order a first index embeds them: multilingual ones first (they serve every
    question), then English-only ones, each skipping mostly Chinese chunks when a multilingual model is there. One
    model, or a store that takes only whole rows (`per_model` False): one plan for the whole embedder."""
    parts = embedder_parts(embedder)
    if len(parts) < 2 or not per_model:
        return [ModelPlan(WHOLE_ROW, embedder)]
    english = [is_english_only(p.name) for p in parts]
    beside = not all(english)
    plans = [ModelPlan(i, p, english[i] and beside) for i, p in enumerate(parts)]
    return sorted(plans, key=lambda p: (is_english_only(p.name), p.index))


def task_order(plans: Sequence[ModelPlan], worker: int) -> list[ModelPlan]:
    """The models in the order worker `worker` takes their chunks (see SPREAD_MODELS_OVER_WORKERS)."""
    if not SPREAD_MODELS_OVER_WORKERS or not plans:
        return list(plans)
    first = worker % len(plans)
    return [*plans[first:], *plans[:first]]


def policy_signature(plans: Sequence[ModelPlan]) -> str:
    """What decides which chunks each model embeds; state.json keeps the one its vectors follow."""
    rule = f"skip-if-cjk>={CHINESE_TEXT_SHARE}-and-latin<{MIN_LATIN_WORDS}"
    return ";".join(f"{p.name}:{rule if p.skips_chinese else 'all'}" for p in plans)


def embeds(plan: ModelPlan, text: str) -> bool:
    """Whether model `plan` embeds a chunk of this text: every model does, but an English-only model beside a
    multilingual one skips a mostly Chinese chunk with fewer than MIN_LATIN_WORDS Latin words."""
    if not plan.skips_chinese or cjk_share(text) < CHINESE_TEXT_SHARE:
        return True
    return sum(1 for _ in itertools.islice(_LATIN_WORD_RE.finditer(text), MIN_LATIN_WORDS)) >= MIN_LATIN_WORDS


class SearchGate:
    """Counts the searches running, so an embedding run can pause between model calls while one is."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self.pauses = 0  # model calls that waited for a search (a count for tests and index_status)

    @contextlib.contextmanager
    def searching(self) -> Iterator[None]:
        with self._cond:
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    def wait_idle(self, max_s: float = SEARCH_YIELD_MAX_S) -> None:
        """Return once no search runs, or after `max_s`."""
        with self._cond:
            if self._running:
                self.pauses += 1
                self._cond.wait_for(lambda: not self._running, timeout=max_s)


class RunMeter:
    """Per model, the chunks embedded and the thread-seconds it took in this process: the time left from that."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, tuple[int, float]] = {}
        self.workers = 1

    def record(self, model: str, chunks: int, seconds: float) -> None:
        with self._lock:
            n, s = self._done.get(model, (0, 0.0))
            self._done[model] = (n + chunks, s + seconds)

    def seconds_left(self, remaining: dict[str, int]) -> float | None:
        """Seconds until every model has embedded its `remaining` chunks at the rates seen so far, spread over the
        run's workers; None while a model with work left has no rate yet."""
        with self._lock:
            thread_s = 0.0
            for model, left in remaining.items():
                if not left:
                    continue
                n, s = self._done.get(model, (0, 0.0))
                if not n:
                    return None
                thread_s += left * s / n
        return thread_s / max(1, self.workers)


@dataclass(frozen=True)
class Coverage:
    """How many of the chunks a model embeds have its vector (`total` excludes the `skipped` it leaves to another)."""

    model: str
    embedded: int
    total: int
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"embedded": self.embedded, "of": self.total} | ({"skipped_chinese": self.skipped} if self.skipped else {})


def coverage_note(coverage: Sequence[Coverage], seconds_left: float | None, running: bool) -> str | None:
    """What a search reply says while chunks lack vectors (None once every model covers its chunks).

    Example: "semantic results cover 1,024 of 7,889 passages (all-MiniLM-L6-v2: 0 of the 3,402 it embeds);
    indexing, about 6 min left"
    """
    if not coverage or all(c.embedded >= c.total for c in coverage):
        return None
    first, rest = coverage[0], coverage[1:]
    head = (
        f"semantic results cover all {first.total:,} passages"
        if first.embedded >= first.total
        else f"semantic results cover {first.embedded:,} of {first.total:,} passages"
    )
    others = [f"{c.model}: {c.embedded:,} of the {c.total:,} it embeds" for c in rest if c.embedded < c.total]
    text = head + (f" ({'; '.join(others)})" if others else "")
    if not running:
        return text + "; the rest is being indexed"
    if seconds_left is None:
        return text + "; indexing"
    return text + f"; indexing, {_time_left(seconds_left)} left"


def _time_left(seconds: float) -> str:
    if seconds < MINUTE_S / 2:
        return "less than a minute"
    return f"about {max(1, math.ceil(seconds / MINUTE_S))} min"


@contextlib.contextmanager
def single_blas_thread() -> Iterator[None]:
    """One BLAS thread for the process while workers embed side by side: parallelism comes from the workers, and a
    model's own limit, restored when its call ends, must not hand another worker's call a second thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        logger.warning("threadpoolctl is not installed, so BLAS threads are not capped; run: pip install threadpoolctl")
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def run_workers(workers: int, work: Callable[[int], None], stop: threading.Event) -> None:
    """Run `work(worker)` on `workers` threads (inline for one) until each returns; the first exception sets `stop`
    (the others end after their task) and is raised here once all have ended."""
    if workers <= 1:
        work(0)
        return
    errors: list[BaseException] = []

    def run(worker: int) -> None:
        try:
            work(worker)
        except BaseException as e:  # re-raised in the caller below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=run, args=(w,), name=f"kb-embed-{w}", daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# A model call: a plan's vectors for some texts (in this thread, or in a worker process).
EmbedCall = Callable[[ModelPlan, list[str]], Sequence[Any]]


def embed_here(plan: ModelPlan, texts: list[str]) -> Sequence[Any]:
    """The model call in this thread."""
    return plan.embedder.embed_documents(texts)


def _embed_in_child(index: int, texts: list[str]) -> Any:
    import numpy as np

    return np.asarray(_CHILD_PLANS[index].embed_documents(texts))  # one array pickles faster than lists of floats


@contextlib.contextmanager
def forked_models(plans: Sequence[ModelPlan], workers: int) -> Iterator[EmbedCall]:
    """A model call that runs in one of `workers` processes forked now, with the models already loaded here.

    Threads of one process embed at most ~1.3 cores' worth on 2 cores (both models hold the GIL between their numpy
    calls: USE's 240 texts took 4.3 s on one thread and 4.3 s on two, 2.6 s in two processes); processes use them
    all. Fork after the models load: the children share their weights' pages. Only for a process that forks before
    it starts threads of its own (the ingest CLI); the server embeds on threads (fork with threads running risks a
    child stuck on a lock another thread held). Where fork is missing, model calls stay in this thread.
    """
    if workers <= 1 or PROCESS_START_METHOD not in multiprocessing.get_all_start_methods():
        yield embed_here
        return
    for plan in plans:
        plan.embedder.embed_documents(["load"])  # loaded before the fork, so no child loads its own copy
    _CHILD_PLANS.clear()
    _CHILD_PLANS.update({p.index: p.embedder for p in plans})
    pool = multiprocessing.get_context(PROCESS_START_METHOD).Pool(workers)
    try:

        def call(plan: ModelPlan, texts: list[str]) -> Sequence[Any]:
            return pool.apply(_embed_in_child, (plan.index, texts))

        yield call
    finally:
        pool.terminate()
        pool.join()
        _CHILD_PLANS.clear()


def embed_sliced(
    plan: ModelPlan,
    texts: Sequence[str],
    gate: SearchGate | None,
    meter: RunMeter,
    stop: Callable[[], bool],
    call: EmbedCall = embed_here,
) -> list[Any] | None:
    """A model's vectors for `texts`, EMBED_SLICE_TEXTS per `call`, pausing for searches between calls; None if
    `stop` turned true meanwhile (the run is cancelled: nothing is committed)."""
    out: list[Any] = []
    for start in range(0, len(texts), EMBED_SLICE_TEXTS):
        if stop():
            return None
        if gate is not None:
            gate.wait_idle()
        piece = texts[start : start + EMBED_SLICE_TEXTS]
        t0 = time.perf_counter()
        out.extend(call(plan, list(piece)))
        meter.record(plan.name, len(piece), time.perf_counter() - t0)
    return out
