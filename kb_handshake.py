"""Answer the MCP handshake (initialize, tools/list) at once from a cache while the SDK is still importing.

Importing the MCP SDK takes about a second on a 2-core machine, and a client waits for `initialize` before anything
else. The first launch records the SDK's own answers; later launches replay them for byte-identical requests, then
hand the stream to the SDK, which sees every message in order and whose duplicate answers are dropped. Any request
not in the cache simply waits for the SDK. Imports only the standard library (anyio once the SDK is loaded).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import tempfile
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Requests answered from the cache before the SDK is ready.
FAST_METHODS = ("initialize", "tools/list")
# Cached answers kept per file (one per client request shape and code version).
MAX_ENTRIES = 32
_EOF = None


def code_key(*parts: str | Path) -> str:
    """A key that changes with our server code and the SDK version: cached answers never outlive either."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            try:
                st = part.stat()
                h.update(f"{part}:{st.st_size}:{st.st_mtime_ns}".encode())
            except OSError:
                h.update(f"{part}:missing".encode())
        else:
            h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


class HandshakeFront:
    """Owns the process's stdin and stdout while the SDK loads, then serves as the SDK's transport streams."""

    def __init__(self, cache_path: Path, key: str) -> None:
        self.cache_path = cache_path
        self.key = key
        self.cache: dict[str, Any] = self._load()
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.replay: list[bytes | None] = []  # read before the SDK took over, handed to it in order
        self.answered: dict[str, tuple[str, Any]] = {}  # request id -> (fingerprint, result sent); SDK's answer dropped
        self.pending: dict[str, str] = {}  # request id -> fingerprint whose SDK answer should be cached
        self._init_fp = ""
        self._write_lock = threading.Lock()
        self._out_fd = -1

    # ---- the cache ----------------------------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self) -> None:
        entries = list(self.cache.items())[-MAX_ENTRIES:]
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.cache_path.name + ".", dir=self.cache_path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(entries), f)
            os.replace(tmp, self.cache_path)
        except OSError as e:  # a cache we cannot write only costs the next start its head start
            logger.debug("cannot write the handshake cache %s: %s", self.cache_path, e)

    def _fingerprint(self, msg: dict[str, Any]) -> str:
        params = dict(msg.get("params") or {})
        params.pop("clientInfo", None)  # the answer does not depend on who asks
        params.pop("_meta", None)
        base = self._init_fp if msg["method"] == "tools/list" else ""
        return hashlib.sha256(json.dumps([self.key, base, msg["method"], params], sort_keys=True).encode()).hexdigest()[:24]

    # ---- the pipes ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Take stdin and stdout: protocol output on a private descriptor, stray prints (fd 1) to stderr."""
        self._out_fd = os.dup(1)
        os.dup2(2, 1)
        in_fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # child processes read EOF, never the protocol
        os.close(null)
        threading.Thread(target=self._read, args=(in_fd,), name="stdin", daemon=True).start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                if line.strip():
                    self.lines.put(line)
        self.lines.put(_EOF)

    def write_line(self, text: str) -> None:
        data = (text.rstrip("\n") + "\n").encode("utf-8")
        with self._write_lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._out_fd, view) :]

    # ---- before the SDK is ready --------------------------------------------------------------------------

    def answer_until(self, ready: threading.Event) -> bool:
        """Answer cached handshake requests until `ready` is set; False if the client hung up first."""
        while not ready.is_set():
            try:
                line = self.lines.get(timeout=0.02)
            except queue.Empty:
                continue
            self.replay.append(line)
            if line is _EOF:
                return False
            self._inspect(line, answer=True)
        return True

    def _inspect(self, line: bytes, answer: bool) -> None:
        if not any(m.encode() in line for m in FAST_METHODS):
            return
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if not isinstance(msg, dict) or msg.get("method") not in FAST_METHODS or "id" not in msg:
            return
        if msg["method"] == "tools/list" and not self._init_fp:
            return
        fp = self._fingerprint(msg)
        if msg["method"] == "initialize":
            self._init_fp = fp
        rid = json.dumps(msg["id"])
        cached = self.cache.get(fp)
        if answer and cached is not None:
            self.write_line(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": cached}, ensure_ascii=False))
            self.answered[rid] = (fp, cached)
        else:
            self.pending[rid] = fp

    # ---- the SDK's transport ------------------------------------------------------------------------------

    def sdk_streams(self) -> tuple[Any, Any]:
        """(stdin, stdout) objects for mcp.server.stdio.stdio_server: the replayed lines first, then live ones."""
        return _Stdin(self), _Stdout(self)

    def on_sdk_output(self, line: str) -> None:
        """Pass the SDK's output on, dropping answers already sent from the cache and caching new handshake answers."""
        msg: Any = None
        if '"id"' in line and ('"result"' in line or '"error"' in line):
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
        if isinstance(msg, dict):
            rid = json.dumps(msg.get("id"))
            if rid in self.answered:
                fp, sent = self.answered.pop(rid)
                if "result" in msg and msg["result"] != sent:  # stale entry under an unchanged key: fix it for next time
                    self.cache[fp] = msg["result"]
                    self._save()
                return  # the client already has its answer
            fp = self.pending.pop(rid, "")
            if fp and "result" in msg:
                self.cache[fp] = msg["result"]
                self._save()
        self.write_line(line)


class _Stdin:
    def __init__(self, front: HandshakeFront) -> None:
        self.front = front

    def __aiter__(self) -> _Stdin:
        return self

    async def __anext__(self) -> str:
        import anyio

        front = self.front
        if front.replay:
            line = front.replay.pop(0)
        else:
            line = await anyio.to_thread.run_sync(front.lines.get, abandon_on_cancel=True)
            if line is not _EOF:
                front._inspect(line, answer=False)
        if line is _EOF:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _Stdout:
    def __init__(self, front: HandshakeFront) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                self.front.on_sdk_output(line)

    async def flush(self) -> None:
        return None
