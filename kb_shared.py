"""The shared server: one process per user, vault, resolved config and code version (kb_relay.identity_key) that
serves each relay's socket connection as its own MCP session through the SDK, over one engine, one model, one
watcher and one writer. It exits after server.idle_exit seconds with no session attached, at once when its last
session leaves and the config or code it was started for has changed, and on `--stop-shared`.

Imports: kb_config, kb_relay (anyio and the MCP SDK where used).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb_config import Config, KBError
from kb_relay import MAX_HELLO_BYTES, NAME_HEX, PROTOCOL, START_TIMEOUT_S, SharedPaths, peer_uid

logger = logging.getLogger(__name__)

# Pending connections the socket queues while the server is busy (every open session's relay reconnects at once
# after a crash).
BACKLOG = 64
# How often the server checks whether it has been idle long enough, or lost its socket file.
IDLE_CHECK_S = 1.0
# Longest a connection may take to send its hello line.
HELLO_TIMEOUT_S = 5.0
# Longest JSON-RPC line a session may send (an append is at most write.max_append_chars, ~4 bytes a character).
MAX_LINE_BYTES = 64 * 2**20


class SharedServer:
    """The socket, the sessions attached to it and when to leave. `serve(mcp_server)` runs until then."""

    def __init__(self, cfg: Config, key: str, paths: SharedPaths, still_current: Callable[[], bool]) -> None:
        self.cfg = cfg
        self.key = key
        self.paths = paths
        self._still_current = still_current  # False once the config or code changed (a new key)
        self.sessions = 0
        self.sessions_served = 0
        self.started = time.monotonic()
        self._idle_since = time.monotonic()
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._leave: Any = None  # the cancel scope that ends serve()
        self.exit_reason = ""

    def describe(self) -> dict[str, Any]:
        """What index_status says about how this session is served."""
        return {
            "mode": "shared",
            "pid": os.getpid(),
            "sessions_attached": self.sessions,
            "sessions_served": self.sessions_served,
            "idle_exit_s": self.cfg.idle_exit_s,
            "socket": str(self.paths.socket),
            "log": str(self.paths.log),
        }

    # ---- the socket and the pid file ----------------------------------------------------------------------------

    def bind(self) -> None:
        """Listen on the socket (0600 in the 0700 runtime folder); KBError if another live server holds it."""
        path = str(self.paths.socket)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a socket file a crash or a reboot left behind
            else:
                raise KBError(f"another shared server already listens on {path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600: no window in which another user could connect
        try:
            sock.bind(path)
        except OSError as e:
            sock.close()
            raise KBError(f"cannot create the shared server's socket {path} ({e.strerror or e})") from e
        finally:
            os.umask(old)
        sock.listen(BACKLOG)
        st = os.stat(path)
        self._sock, self._inode = sock, (st.st_dev, st.st_ino)
        self._write_pid_file()
        logger.info("shared server pid %d listening on %s (idle exit after %.0f s)", os.getpid(), path, self.cfg.idle_exit_s)

    def _write_pid_file(self) -> None:
        record = {
            "pid": os.getpid(),
            "key": self.key,
            "kb_dir": str(self.cfg.kb_dir),
            "config": self.cfg.source,
            "log": str(self.paths.log),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        try:  # not needed to serve (the socket is the truth): a full disk must not stop the server
            self.paths.pid.write_text(json.dumps(record) + "\n", encoding="utf-8")
        except OSError as e:
            logger.warning("cannot write the pid file %s (%s); --stop-shared still finds the socket", self.paths.pid, e)

    def _socket_is_ours(self) -> bool:
        try:
            st = os.stat(self.paths.socket)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._inode

    def cleanup(self) -> None:
        """Remove the socket and pid file if they are still this server's (a successor may have replaced them)."""
        if self._socket_is_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.paths.socket)
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(self.paths.pid.read_text(encoding="utf-8"))["pid"] == os.getpid():
                os.unlink(self.paths.pid)
        if self._sock is not None:
            self._sock.close()

    # ---- serving --------------------------------------------------------------------------------------------

    def serve(self, mcp_server: Any) -> str:
        """Serve sessions until it is time to leave; returns why it left. `bind()` first."""
        import anyio

        async def main() -> None:
            from anyio.abc import SocketListener

            assert self._sock is not None
            listener = await SocketListener.from_socket(self._sock)
            async with anyio.create_task_group() as tg:
                self._leave = tg.cancel_scope
                tg.start_soon(self._watch_idle)
                while True:
                    stream = await listener.accept()
                    tg.start_soon(self._serve_connection, stream, mcp_server)

        anyio.run(main)
        return self.exit_reason

    def _stop(self, reason: str) -> None:
        if not self.exit_reason:
            self.exit_reason = reason
            logger.info("shared server exits: %s", reason)
        self._leave.cancel()

    async def _watch_idle(self) -> None:
        import anyio

        while True:
            await anyio.sleep(IDLE_CHECK_S)
            if self.sessions:
                continue
            idle_s = time.monotonic() - self._idle_since
            # Before its first session a new server waits at least as long as the relay that started it may take.
            wait_s = self.cfg.idle_exit_s if self.sessions_served else max(self.cfg.idle_exit_s, START_TIMEOUT_S)
            if idle_s >= wait_s:
                self._stop(f"no session for {idle_s:.0f} s (server.idle_exit {self.cfg.idle_exit_s:.0f} s)")
            elif not self._socket_is_ours():
                self._stop("its socket file was removed or replaced, so no relay can reach it")

    def _answer_hello(self, hello: Any) -> dict[str, Any]:
        if not isinstance(hello, dict) or hello.get("relay") != PROTOCOL:
            return {"ok": False, "error": f"expected a hello of protocol {PROTOCOL}, got {str(hello)[:120]}"}
        key = str(hello.get("key", ""))
        op = hello.get("op")
        if op == "stop" and len(key) >= NAME_HEX and self.key.startswith(key):
            if hello.get("only_idle") and self.sessions:
                return {"ok": True, "key": self.key, "pid": os.getpid(), "stopping": False, "sessions": self.sessions}
            return {"ok": True, "key": self.key, "pid": os.getpid(), "stopping": True, "sessions": self.sessions}
        if key != self.key:
            return {"ok": False, "error": "this server serves another configuration or code version"}
        if op != "session":
            return {"ok": False, "error": f"unknown op {op!r}"}
        return {"ok": True, "key": self.key, "pid": os.getpid(), "sessions": self.sessions + 1}

    async def _serve_connection(self, stream: Any, mcp_server: Any) -> None:
        import anyio
        from anyio.abc import SocketAttribute
        from anyio.streams.buffered import BufferedByteReceiveStream

        async with stream:
            uid = peer_uid(stream.extra(SocketAttribute.raw_socket))
            if uid is not None and uid != os.getuid():  # defense in depth: the folder is 0700 and the socket 0600
                logger.warning("refused a connection from uid %d", uid)
                return
            buffered = BufferedByteReceiveStream(stream)
            try:
                with anyio.fail_after(HELLO_TIMEOUT_S):
                    hello = json.loads(await buffered.receive_until(b"\n", MAX_HELLO_BYTES))
            except Exception as e:
                logger.info("dropped a connection without a valid hello (%s)", type(e).__name__)
                return
            reply = self._answer_hello(hello)
            try:
                await stream.send(json.dumps(reply).encode("utf-8") + b"\n")
            except Exception:
                return
            if reply.get("stopping"):
                self._stop(f"asked to stop by pid {hello.get('pid')} (--stop-shared)")
                return
            if not reply["ok"] or hello.get("op") != "session":
                return
            self.sessions += 1
            self.sessions_served += 1
            logger.info("session from relay pid %s attached (%d attached)", hello.get("pid"), self.sessions)
            try:
                await self._run_session(buffered, stream, mcp_server)
            except Exception as e:  # the client went away mid-reply, a broken line: this session only
                logger.info("session from relay pid %s ended: %s", hello.get("pid"), _describe(e))
            finally:
                self.sessions -= 1
                self._idle_since = time.monotonic()
                logger.info("session from relay pid %s left (%d attached)", hello.get("pid"), self.sessions)
            if not self.sessions and not self._still_current():
                self._stop("its last session left and the config or code it was started for has changed")

    async def _run_session(self, buffered: Any, stream: Any, mcp_server: Any) -> None:
        """One MCP session over the connection: the SDK's own stdio transport, over the socket's lines."""
        from mcp.server.stdio import stdio_server

        # MCPServer has no public handle on its low-level server (the SDK's own in-memory transport reaches for it
        # the same way, with a TODO to make it public); run() is the low-level server's public per-connection API.
        lowlevel = mcp_server._lowlevel_server
        async with stdio_server(stdin=_Lines(buffered), stdout=_Sender(stream)) as (read, write):  # type: ignore[arg-type]
            await lowlevel.run(read, write, lowlevel.create_initialization_options())


class _Lines:
    """The connection's lines as the async text iterator the SDK's stdio transport reads its stdin from."""

    def __init__(self, buffered: Any) -> None:
        self._buffered = buffered

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        import anyio

        try:
            line = await self._buffered.receive_until(b"\n", MAX_LINE_BYTES)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise StopAsyncIteration from None
        return line.decode("utf-8", errors="replace")


class _Sender:
    """The connection as the text file the SDK's stdio transport writes its stdout to."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def write(self, text: str) -> None:
        await self._stream.send(text.encode("utf-8"))

    async def flush(self) -> None:
        pass


def _describe(e: BaseException) -> str:
    inner = getattr(e, "exceptions", None)
    if inner:
        return "; ".join(_describe(x) for x in inner)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def runtime_paths(cfg: Config, key: str) -> SharedPaths:
    from kb_relay import shared_paths

    assert cfg.runtime_dir is not None
    return shared_paths(Path(cfg.runtime_dir), key)
