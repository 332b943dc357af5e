"""Shared pieces of eval/faults.py: configs, real processes (own process groups, killed by pid), the SDK's stdio
client with bounded calls, file snapshots, and the index checks (state.json, vectors, BM25, top-5 vs a rebuild).

POSIX only (kill -9, process groups). Imports the project's modules for the in-process checks only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from harness import PYTHON, REPO_ROOT, child_env, launch, median, percentile, read_pid, serving_info

# embedding.model for fast runs: kb_vectors' deterministic token-hash embedder (no model to load).
HASH_MODEL = "hash-embedder"
# A server's first reply waits for the SDK import and the start-up sync (the real model: its load too).
START_TIMEOUT_S = 120.0
# A tool call that takes longer than this counts as a hang (issue 9: "no call over 5 s").
HANG_S = 5.0
# Longest we wait for one tool call before giving up on it (it is then counted as a hang and a timeout).
CALL_TIMEOUT_S = 60.0
# Text the server puts in a tool error for an exception it did not expect (mcp_server.build_server.run).
INTERNAL_MARK = "internal error"
# JSON-RPC "internal error" code: the SDK's answer to an exception that escaped the tool.
JSONRPC_INTERNAL = -32603
# The SDK client's error code for a request whose connection closed (the server died) before the reply.
CONNECTION_CLOSED = -32000
# Temp-file prefixes a killed writer may leave beside a note: kb_files' helper, and kb_write's older one.
TEMP_PREFIXES = (".kb-tmp-", ".kb-append-")
# Search modes compared between a killed-then-completed index and a fresh rebuild.
COMPARE_MODES = ("keyword", "semantic", "hybrid")
# Scores closer than this count as an exact tie when two indexes order hits differently.
TIE_EPS = 1e-6


def load_cfg(path: Path) -> Any:
    from kb_config import load_config

    return load_config(path, env={})


def make_test_embedder(cfg: Any) -> Any:
    """The embedder the CLIs build for cfg.embed_model, for this process's checks (nothing loads until used)."""
    from kb_vectors import config_embedder

    return config_embedder(cfg)


# ---- processes ------------------------------------------------------------------------------------------------


class Processes:
    """Every process this run starts, each in its own process group; `kill_all` ends the live ones by pid."""

    def __init__(self) -> None:
        self.pids: set[int] = set()

    def popen(self, args: Sequence[str], log: Path | None = None, **kw: Any) -> subprocess.Popen:
        """Start a child in a new session (its own process group), stdout/stderr to `log` unless given."""
        out: Any = open(log, "ab") if log else subprocess.DEVNULL
        try:
            kw.setdefault("stdout", out)
            kw.setdefault("stderr", out)
            p = subprocess.Popen(list(args), cwd=REPO_ROOT, env=kw.pop("env", None) or child_env(), start_new_session=True, **kw)
        finally:
            if log:
                out.close()
        self.pids.add(p.pid)
        return p

    def add(self, pid: int) -> None:
        self.pids.add(pid)

    def kill(self, pid: int) -> bool:
        """SIGKILL the process group led by `pid` (our child); True if it was still there."""
        try:
            os.killpg(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return False

    def kill_all(self) -> None:
        for pid in sorted(self.pids):
            self.kill(pid)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        self.pids.clear()


def run_cli(procs: Processes, args: Sequence[str], timeout_s: float, log: Path | None = None) -> tuple[int, str, float]:
    """Run one of the project's CLIs to completion (killed at `timeout_s`); returns (exit code, stdout, seconds).

    Exit code 124 means it ran past `timeout_s` and was killed.
    """
    t0 = time.perf_counter()
    p = procs.popen([PYTHON, *args], log=log, stdout=subprocess.PIPE)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        procs.kill(p.pid)
        out, _ = p.communicate()
        rc = 124
    return rc, out.decode("utf-8", "replace"), time.perf_counter() - t0


def tail(path: Path, chars: int = 600) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:].strip()
    except OSError:
        return ""


# ---- the MCP server over stdio -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One tool call as the client saw it. kind: ok | error (a tool or MCP error) | internal | timeout | disconnected."""

    tool: str
    kind: str
    text: str
    latency_s: float
    data: Any = None
    server: str = ""
    started: float = 0.0  # time.time() when the call was sent


class Server:
    """`mcp_server.py --config CONFIG` driven by the SDK's stdio client; every call bounded and timed.

    The process launched is the session's relay; the shared server it attached to (shared_pid, its log in
    shared_log) serves every Server of the same config. `kill()` sends SIGKILL to both: a server killed mid-call.
    Use as `async with Server(...) as s: await s.call(...)`.
    """

    def __init__(self, procs: Processes, config: Path, workdir: Path, name: str) -> None:
        self.procs, self.config, self.name = procs, config, name
        self.errlog = workdir / f"{name}.err"
        self.pidfile = workdir / f"{name}.pid"
        self.pid: int | None = None
        self.shared_pid: int | None = None  # None when the session runs in-process
        self.shared_log: Path | None = None
        self.calls: list[Outcome] = []
        self._stack: AsyncExitStack | None = None
        self.client: Any = None

    async def __aenter__(self) -> Server:
        self._stack = AsyncExitStack()
        err = self._stack.enter_context(self.errlog.open("a", encoding="utf-8"))
        try:
            launched = await self._stack.enter_async_context(
                launch(self.config, err, pidfile=self.pidfile, read_timeout_s=START_TIMEOUT_S)
            )
            self.client = launched.client
        except BaseException:
            self._record_pid()
            await self._stack.aclose()
            raise
        self._record_pid()
        serving = await serving_info(self.client, START_TIMEOUT_S)
        if serving.get("mode") == "shared":
            self.shared_pid, self.shared_log = serving["pid"], Path(serving["log"])
            self.procs.add(self.shared_pid)  # kill_all ends it with the part (it leads its own process group)
        return self

    def _record_pid(self) -> None:
        self.pid = read_pid(self.pidfile)
        if self.pid is not None:
            self.procs.add(self.pid)

    async def __aexit__(self, *exc: Any) -> None:
        if self._stack is not None:
            await self._stack.aclose()  # the SDK bounds its own shutdown (close stdin, wait, kill the tree)
        if self.pid is not None:
            self.procs.kill(self.pid)

    def kill(self) -> bool:
        """SIGKILL the shared server (what a kill mid-call means) and the session's relay; True if one was there."""
        server = self.shared_pid is not None and self.procs.kill(self.shared_pid)
        return (self.pid is not None and self.procs.kill(self.pid)) or server

    async def call(self, tool: str, args: dict[str, Any] | None = None, timeout_s: float = CALL_TIMEOUT_S) -> Outcome:
        """Call a tool; never raises (failures come back as the Outcome's kind)."""
        from mcp.shared.exceptions import MCPError

        t0, started = time.perf_counter(), time.time()
        try:
            with anyio.fail_after(timeout_s):
                result = await self.client.call_tool(tool, args or {})
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            kind = ("internal" if INTERNAL_MARK in text.lower() else "error") if result.is_error else "ok"
            out = Outcome(tool, kind, text, time.perf_counter() - t0, result.structured_content)
        except TimeoutError:
            out = Outcome(tool, "timeout", f"no reply within {timeout_s:.0f} s", time.perf_counter() - t0)
        except MCPError as e:
            internal = e.code == JSONRPC_INTERNAL or INTERNAL_MARK in str(e).lower()
            kind = "disconnected" if e.code == CONNECTION_CLOSED else "internal" if internal else "error"
            out = Outcome(tool, kind, f"MCPError {e.code}: {e}", time.perf_counter() - t0)
        except Exception as e:  # the connection went away (a killed or crashed server)
            out = Outcome(tool, "disconnected", f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        out.server, out.started = self.name, started
        self.calls.append(out)
        return out


def latency_figures(calls: Iterable[Outcome]) -> dict[str, Any]:
    """Count, p50, p95 and max latency per tool, and calls over HANG_S, over every outcome given."""
    by_tool: dict[str, list[float]] = {}
    hangs = 0
    for c in calls:
        by_tool.setdefault(c.tool, []).append(c.latency_s)
        hangs += c.latency_s > HANG_S
    out: dict[str, Any] = {"hangs": hangs, "max_latency_s": round(max((max(v) for v in by_tool.values()), default=0.0), 3)}
    for tool, v in sorted(by_tool.items()):
        out[tool] = {
            "calls": len(v),
            "p50_s": round(median(v) or 0.0, 3),
            "p95_s": round(percentile(v, 0.95), 3),
            "max_s": round(max(v), 3),
        }
    return out


# ---- files --------------------------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (sha256 or 'link:target' or 'dir' or 'other', size)} of everything under root, links not followed."""
    out: dict[str, tuple[str, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = os.path.relpath(p, root)
            try:
                st = p.lstat()
                if p.is_symlink():
                    out[rel] = ("link:" + os.readlink(p), 0)
                elif p.is_dir():
                    out[rel] = ("dir", 0)
                elif p.is_file():
                    out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_size)
                else:
                    out[rel] = ("other", 0)
            except OSError as e:
                out[rel] = (f"unreadable:{e.errno}", 0)
    return out


def changed_bytes(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> dict[str, int]:
    """Paths whose content differs between two snapshots, with the bytes at stake (the larger of the two sizes, >= 1)."""
    out: dict[str, int] = {}
    for rel in set(before) | set(after):
        a, b = before.get(rel), after.get(rel)
        if a != b:
            out[rel] = max(1, (a or ("", 0))[1], (b or ("", 0))[1])
    return out


def temp_leftovers(folder: Path) -> list[Path]:
    """Temp files a killed writer may have left anywhere under `folder`."""
    found: list[Path] = []
    for dirpath, _, files in os.walk(folder):
        found += [Path(dirpath) / f for f in files if f.startswith(TEMP_PREFIXES)]
    return found


# ---- the index: facts and the comparison with a fresh rebuild -------------------------------------------------------


@dataclass
class IndexFacts:
    """What one index holds, read from disk and through a fresh in-process Engine (the server's own code)."""

    chunk_ids: dict[str, tuple[str, ...]]
    md5: dict[str, str]
    skipped: dict[str, str]
    segments_named: list[str]
    segments_on_disk: list[str]
    pending_vectors: int
    contents_missing: int
    view_chunks: int
    bm25_docs: int
    view_ids_match_state: bool
    temp_files: int
    engine: Any = field(repr=False, default=None)

    @property
    def chunks(self) -> int:
        return sum(len(c) for c in self.chunk_ids.values())


def read_index(cfg: Any, embedder: Any, engine: Any = None) -> IndexFacts:
    """Open the index in this process (no write, no lock), or read `engine`'s (open on it already), and gather what
    the consistency checks compare."""
    from kb_engine import Engine, content_of

    state = json.loads((cfg.index_dir / "state.json").read_text(encoding="utf-8"))
    files = state.get("files", {})
    engine = engine or Engine(cfg, embedder)
    engine.sync_all(write=False)
    ids = {p: tuple(r.get("chunks", ())) for p, r in files.items()}
    contents = {content_of(cid) for cids in ids.values() for cid in cids}
    seg_dir = cfg.index_dir / "vectors"
    with engine.mutex:
        view_ids = set(engine.chunks)
        bm25_docs = len(engine.bm25)
    return IndexFacts(
        chunk_ids=ids,
        md5={p: r.get("md5", "") for p, r in files.items()},
        skipped={p: r.get("skipped", "") for p, r in files.items() if r.get("skipped")},
        segments_named=sorted(state.get("segments", [])),
        segments_on_disk=sorted(p.name for p in seg_dir.glob("seg-*.npz")) if seg_dir.is_dir() else [],
        pending_vectors=engine.pending_vectors,
        contents_missing=sum(1 for c in contents if c not in engine.store),
        view_chunks=len(view_ids),
        bm25_docs=bm25_docs,
        view_ids_match_state=view_ids == {cid for cids in ids.values() for cid in cids},
        temp_files=len(temp_leftovers(cfg.index_dir)),
        engine=engine,
    )


def pending_on_disk(index_dir: Path) -> int:
    """Chunk contents state.json references that no segment it names holds (a cheap read, no Engine)."""
    import numpy as np

    state = json.loads((index_dir / "state.json").read_text(encoding="utf-8"))
    contents = {cid.split("-", 2)[1] for r in state.get("files", {}).values() for cid in r.get("chunks", ())}
    stored: set[str] = set()
    for name in state.get("segments", []):
        try:
            with np.load(index_dir / "vectors" / name, allow_pickle=False) as data:
                stored.update(str(k) for k in data["keys"])
        except OSError:
            continue  # compacted away since state.json was read: the caller reads again
    return len(contents - stored)


def index_problems(facts: IndexFacts) -> list[str]:
    """Inconsistencies inside one index: chunks without vectors, unnamed segments, BM25 != chunks."""
    out = []
    if facts.pending_vectors:
        out.append(f"{facts.pending_vectors} chunks without a vector (engine.pending_vectors)")
    if facts.contents_missing:
        out.append(f"{facts.contents_missing} chunk contents of state.json missing from the vector store")
    if facts.segments_named != facts.segments_on_disk:
        extra = sorted(set(facts.segments_on_disk) - set(facts.segments_named))
        gone = sorted(set(facts.segments_named) - set(facts.segments_on_disk))
        out.append(f"vector segments on disk != state.json's list (unnamed on disk: {extra}, named but missing: {gone})")
    if not (facts.bm25_docs == facts.view_chunks == facts.chunks):
        out.append(f"BM25 docs {facts.bm25_docs}, view chunks {facts.view_chunks}, state.json chunks {facts.chunks} differ")
    elif not facts.view_ids_match_state:
        out.append("the view's chunk ids differ from state.json's")
    return out


def compare_with_rebuild(got: IndexFacts, ref: IndexFacts, queries: Sequence[str], top_k: int = 5) -> tuple[list[str], int]:
    """Differences between an index and a fresh rebuild of the same notes; returns (problems, top-k lists that
    differ only by exact ties)."""
    from kb_search import Searcher

    problems: list[str] = []
    if got.chunk_ids != ref.chunk_ids:
        notes = sorted(p for p in set(got.chunk_ids) | set(ref.chunk_ids) if got.chunk_ids.get(p) != ref.chunk_ids.get(p))
        problems.append(f"chunk ids differ from a fresh rebuild in {len(notes)} notes, e.g. {notes[:3]}")
    if got.md5 != ref.md5:
        notes = sorted(p for p in set(got.md5) | set(ref.md5) if got.md5.get(p) != ref.md5.get(p))
        problems.append(f"per-note md5 differs from a fresh rebuild in {len(notes)} notes, e.g. {notes[:3]}")
    if set(got.skipped) != set(ref.skipped):
        problems.append(f"skipped notes differ: {sorted(set(got.skipped) ^ set(ref.skipped))[:5]}")
    ties = 0
    a, b = Searcher(got.engine), Searcher(ref.engine)
    for mode in COMPARE_MODES:
        for q in queries:
            ha = [(h.chunk_id, h.score) for h in a.search(q, top_k=top_k, mode=mode).hits]
            hb = [(h.chunk_id, h.score) for h in b.search(q, top_k=top_k, mode=mode).hits]
            if [c for c, _ in ha] == [c for c, _ in hb]:
                continue
            if _tie_only(ha, hb) or _same_inputs(got.engine, ref.engine, q, {c for c, _ in ha + hb}):
                ties += 1
            else:
                problems.append(f"top-{top_k} of {q!r} ({mode}) differs: {[c for c, _ in ha]} vs rebuild {[c for c, _ in hb]}")
    return problems, ties


def _tie_only(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    """Same scores rank by rank, and every position where the ids differ holds a score that ties with another."""
    if len(a) != len(b) or any(abs(x[1] - y[1]) > TIE_EPS for x, y in zip(a, b)):
        return False
    scores = [s for _, s in a]
    for i, ((ca, sa), (cb, _)) in enumerate(zip(a, b)):
        if ca == cb:
            continue
        tied = sum(1 for s in scores if abs(s - sa) <= TIE_EPS) > 1 or i == len(a) - 1
        if not tied:
            return False
    return True


def _same_inputs(a: Any, b: Any, query: str, ids: set[str]) -> bool:
    """Do both engines give every chunk in `ids` the same BM25 score and cosine? Then orders differ only where exact
    ties were broken differently (a keyword tie at rank 2 moves a chunk's fused score, not its evidence)."""
    scores = []
    for engine in (a, b):
        with engine.mutex:
            tokens = engine.tokenizer.tokenize(query)
            kw = dict(engine.bm25.search(tokens, max(1, len(engine.bm25))))
        cos = engine.view.cosines(engine.embedder.embed_query(query), sorted(ids))
        scores.append({i: (kw.get(i, 0.0), cos.get(i)) for i in ids})
    for i in ids:
        (ka, ca), (kb, cb) = scores[0][i], scores[1][i]
        if abs(ka - kb) > TIE_EPS or (ca is None) != (cb is None) or (ca is not None and abs(ca - cb) > TIE_EPS):
            return False
    return True


def build_reference(cfg: Any, embedder: Any) -> IndexFacts:
    """A fresh rebuild of cfg's vault in cfg's (separate) data dir, in this process; its facts."""
    from kb_engine import Engine

    engine = Engine(cfg, embedder)
    engine.sync_all(rebuild=True)
    return read_index(cfg, embedder, engine)  # a second Engine would tokenize every note again (no view is saved)


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    """`with timer() as t: ...` then t[0] holds the seconds the block took."""
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0
