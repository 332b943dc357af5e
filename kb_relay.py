"""The relay: what `mcp_server.py` runs in stdio mode (server.shared on). It attaches to the one shared server for this
user, vault, resolved config and code version, starting it detached if none runs, and passes the client's
newline-delimited JSON-RPC both ways over a Unix socket. Also what the shared server reuses: the private runtime
folder, the identity key, the socket's paths and hello, the peer check.

Once it has the config's identity key, mcp_server replaces its process with this file run as a script on a bare
interpreter (`exec_pump`), which attaches (or starts the server) and relays: the process that stays up for the
session holds ~13 MB instead of the ~22 MB the config and YAML took, and a cold start overlaps the server's.
Standard library only, and nothing from the project (the pump imports nothing it does not use).
Imports: nothing from the project.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, BinaryIO, NoReturn

logger = logging.getLogger("kb_relay")  # not __name__: the pump runs this file as __main__

# Version of the hello line relay and server exchange before the JSON-RPC (a mismatch is refused, never guessed at).
PROTOCOL = 1
# Hex digits of the identity key in the socket's file name: short, for the 107-byte limit on a socket's path.
NAME_HEX = 20
# Longest path bind() and connect() take for a Unix socket (sun_path is 108 bytes with the closing NUL).
MAX_SOCKET_PATH_BYTES = 107
# How long a relay tries to get a shared server (waiting for the start lock, the start, the hello) before it serves
# in-process: a cold start imports the SDK (1.1-1.4 s here), twice that on a busy machine.
START_TIMEOUT_S = 10.0
# Between two connection attempts while a server starts.
CONNECT_POLL_S = 0.02
# How long a relay waits for a new server's answer to the session's replayed `initialize`.
REPLAY_TIMEOUT_S = 10.0
# After the client's last message, how long the relay waits for the server's last replies before it exits.
CLOSE_WAIT_S = 2.0
# Longest hello line either side reads.
MAX_HELLO_BYTES = 65_536
# JSON-RPC error code of a call the relay answers itself (its server went away): "internal error".
RELAY_ERROR_CODE = -32603
# The modules whose files make the code version (a clone's `git pull`, an upgraded install: a new shared server).
CODE_FILES = ("mcp_server.py", "bm25_index.py", "ingest.py", "watcher.py")
CODE_PREFIX = "kb_"
# The folder of the project's modules (a clone, or site-packages of an install).
CODE_DIR = Path(__file__).resolve().parent
# The flag that makes this file, run as a script, the session's pump.
PUMP_FLAG = "--pump"

APPEND_TOOL = "update_knowledge_base"
LOST_CALL = (
    "the shared second-brain server stopped while this call ran; it was not retried (a new server is starting): call again"
)
LOST_APPEND = (
    "the shared second-brain server stopped while this append ran; it was not retried, and it either landed whole or "
    "not at all: read_note the note before appending again (an identical append within write.dedupe_window is applied "
    "once)"
)


class SharedUnavailable(RuntimeError):
    """No shared server can be had (runtime folder, socket, start); the session is served in-process instead.

    Not a kb_config.KBError: this module imports nothing from the project, so the pump stays small; mcp_server
    catches it by name."""


class SharedPaths:
    """A shared server's files in the runtime folder, all named after its identity key."""

    __slots__ = ("folder", "socket", "lock", "pid", "log")

    def __init__(self, runtime_dir: Path, key: str) -> None:
        stem = key[:NAME_HEX]
        self.folder = runtime_dir
        self.socket = runtime_dir / f"{stem}.sock"
        self.lock = runtime_dir / f"{stem}.lock"  # flock()ed around check-connect-or-start; a crash leaves it, harmless
        self.pid = runtime_dir / f"{stem}.pid"  # JSON: pid, key, vault, log (for people and --stop-shared)
        self.log = runtime_dir / f"{stem}.log"


def shared_paths(runtime_dir: Path, key: str) -> SharedPaths:
    return SharedPaths(runtime_dir, key)


def prepare_runtime_dir(folder: Path) -> None:
    """Create the runtime folder 0700 and check it is this user's alone (defense in depth: the socket serves notes)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise SharedUnavailable(f"cannot create the runtime folder {folder} ({e.strerror or e})") from e
    if not stat.S_ISDIR(st.st_mode):
        raise SharedUnavailable(f"the runtime folder {folder} is not a folder (a symlink or a file)")
    if st.st_uid != os.getuid():
        raise SharedUnavailable(f"the runtime folder {folder} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o077:
        try:
            os.chmod(folder, 0o700)
        except OSError as e:
            raise SharedUnavailable(f"the runtime folder {folder} is mode {st.st_mode & 0o777:o} and cannot be made 0700") from e
    if len(os.fsencode(folder / ("x" * NAME_HEX + ".sock"))) > MAX_SOCKET_PATH_BYTES:
        raise SharedUnavailable(
            f"the runtime folder {folder} is too long for a Unix socket's path ({MAX_SOCKET_PATH_BYTES} bytes); "
            "set XDG_RUNTIME_DIR to a shorter folder"
        )


def code_signature(code_dir: Path = CODE_DIR) -> list[tuple[str, int, int]]:
    """Name, size and modification time of each of the project's modules: a changed file means a new code version."""
    out = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(code_dir):
            if entry.name.endswith(".py") and (entry.name.startswith(CODE_PREFIX) or entry.name in CODE_FILES):
                st = entry.stat()
                out.append((entry.name, st.st_size, st.st_mtime_ns))
    return sorted(out)


def identity_key(cfg: Any, code: list[tuple[str, int, int]] | None = None) -> str:
    """The shared server's identity: user, interpreter, code version and every setting of the resolved config (a
    kb_config.Config).

    Two sessions share a server only when their keys are equal; an edited config or upgraded code gives a new key.
    """
    from dataclasses import fields

    try:
        from _sha256 import sha256  # CPython's own: no OpenSSL to load on a session's start
    except ImportError:
        from hashlib import sha256

    settings = {f.name: repr(getattr(cfg, f.name)) for f in fields(cfg) if f.compare}
    ident = {
        "protocol": PROTOCOL,
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "python": [sys.executable, sys.version],
        "code": code_signature() if code is None else code,
        "config": settings,
    }
    return sha256(json.dumps(ident, sort_keys=True).encode("utf-8")).hexdigest()


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED); None where it cannot be read."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[1]


def hello_line(key: str, op: str = "session", **extra: Any) -> bytes:
    return json.dumps({"relay": PROTOCOL, "key": key, "op": op, "pid": os.getpid(), **extra}).encode("utf-8") + b"\n"


# ---- connecting, starting --------------------------------------------------------------------------------------


class Upstream:
    """Where the session's JSON-RPC goes: the shared server's socket, or a private in-process server's pipes."""

    def __init__(
        self,
        send: Callable[[bytes], None],
        rfile: BinaryIO,
        close: Callable[[], None],
        what: str,
        info: dict | None = None,
        half_close: Callable[[], None] | None = None,
    ) -> None:
        self.send = send
        self.rfile = rfile
        self.close = close
        self.what = what  # for messages: "shared server pid N" or "in-process server pid N"
        self.info = info or {}  # the server's hello reply
        self.half_close = half_close  # end of the client's messages; replies may still come


def connect(paths: SharedPaths, key: str, timeout_s: float, op: str = "session", **extra: Any) -> Upstream:
    """Connect to the server at paths.socket and exchange the hello; raises OSError (none there, refused, gone) or
    SharedUnavailable (a server that is not ours: another user, another key)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(timeout_s, 0.05))
        sock.connect(str(paths.socket))
        uid = peer_uid(sock)
        if uid is not None and uid != os.getuid():
            raise SharedUnavailable(f"the socket {paths.socket} is served by uid {uid}, not by this user; refusing it")
        sock.sendall(hello_line(key, op, **extra))
        rfile = sock.makefile("rb")
        line = rfile.readline(MAX_HELLO_BYTES)
        if not line:
            raise ConnectionResetError(f"the server at {paths.socket} closed the connection before its hello")
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise SharedUnavailable(f"the server at {paths.socket} answered something else than a hello: {line[:80]!r}") from e
        if not reply.get("ok"):
            raise SharedUnavailable(f"the shared server refused the session: {reply.get('error', reply)}")
        if not str(reply.get("key", "")).startswith(key):
            raise SharedUnavailable(f"the server at {paths.socket} serves another configuration; refusing it")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return socket_upstream(sock, rfile, reply)


def socket_upstream(sock: socket.socket, rfile: BinaryIO, reply: dict) -> Upstream:
    def close() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def half_close() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    return Upstream(sock.sendall, rfile, close, f"shared server pid {reply.get('pid')}", reply, half_close)


@contextlib.contextmanager
def start_lock(paths: SharedPaths, deadline: float) -> Iterator[None]:
    """flock() on the lock file: one relay at a time checks, connects or starts (the kernel drops it with its holder,
    so a lock file a crash left behind blocks nobody)."""
    import fcntl

    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise SharedUnavailable(f"cannot open the start lock {paths.lock} ({e.strerror})") from e
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SharedUnavailable(f"another relay held the start lock {paths.lock} too long") from None
                time.sleep(CONNECT_POLL_S)
        yield
    finally:
        os.close(fd)


def spawn_server(argv: list[str], log: Path) -> Any:
    """Start the shared server detached (its own session, stdin from /dev/null, output to its log file)."""
    import subprocess

    with contextlib.suppress(OSError):
        if log.stat().st_size:
            os.replace(log, log.with_name(log.name + ".1"))  # the previous run's log, kept once
    try:
        out = open(log, "ab")
    except OSError as e:
        raise SharedUnavailable(f"cannot open the shared server's log {log} ({e.strerror})") from e
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True)
    except OSError as e:
        raise SharedUnavailable(f"cannot start the shared server ({e.strerror or e})") from e
    finally:
        out.close()


def attach(paths: SharedPaths, key: str, server_argv: list[str], timeout_s: float = START_TIMEOUT_S) -> Upstream:
    """The shared server for `key`: connect to the running one, else (under the start lock) clear a stale socket and
    start one. Raises SharedUnavailable when none answers within timeout_s."""
    deadline = time.monotonic() + timeout_s
    with start_lock(paths, deadline):
        try:
            return connect(paths, key, deadline - time.monotonic())
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # no server, or a socket file a crash or reboot left behind
        except OSError as e:
            logger.info("the shared server at %s did not answer (%s); starting a new one", paths.socket, e)
        try:
            os.unlink(paths.socket)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise SharedUnavailable(f"cannot remove the stale socket {paths.socket} ({e.strerror or e})") from e
        proc = spawn_server(server_argv, paths.log)
        while True:
            try:
                return connect(paths, key, deadline - time.monotonic())
            except (TimeoutError, FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
                pass
            code = proc.poll()
            if code is not None:
                raise SharedUnavailable(f"the shared server exited at start (code {code}); see {paths.log}")
            if time.monotonic() >= deadline:
                proc.kill()  # a server that comes up after we gave up would only sit there until idle_exit
                raise SharedUnavailable(f"no shared server answered within {timeout_s:.0f} s; see {paths.log}")
            time.sleep(CONNECT_POLL_S)


def start_if_absent(paths: SharedPaths, server_argv: list[str], timeout_s: float = START_TIMEOUT_S) -> None:
    """A cold start's head start: when no socket file exists, start the server under the start lock and wait until
    it has bound its socket (before its SDK import), so the rest of its start overlaps the pump's. A live server, a
    stale socket or any failure is left to attach(), which decides."""
    if paths.socket.exists():
        return
    deadline = time.monotonic() + timeout_s
    try:
        with start_lock(paths, deadline):
            if paths.socket.exists():
                return
            proc = spawn_server(server_argv, paths.log)
            while not paths.socket.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(CONNECT_POLL_S)
    except SharedUnavailable as e:
        logger.info("no head start for the shared server (%s); the relay tries again", e)


def child_upstream(argv: list[str]) -> Upstream:
    """A private in-process server (mcp_server.py --no-shared) over pipes: the relay's last resort mid-session."""
    import subprocess

    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None

    def send(data: bytes) -> None:
        proc.stdin.write(data)  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def close() -> None:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]

    return Upstream(send, proc.stdout, close, f"in-process server pid {proc.pid}", {"pid": proc.pid}, close)


def stop_servers(runtime_dir: Path, only_idle: bool = False, wait_s: float = 5.0) -> list[str]:
    """Ask every shared server in the runtime folder to exit (only_idle: those with no session attached); clear the
    files of dead ones. Returns one line per server, saying what happened."""
    done = []
    with contextlib.suppress(FileNotFoundError):
        sockets = sorted(runtime_dir.glob("*.sock"))
        for sock_path in sockets:
            paths = shared_paths(runtime_dir, sock_path.stem)
            pid = _pid_of(paths)
            key = _key_of(paths) or sock_path.stem
            try:
                up = connect(paths, key, 2.0, op="stop", only_idle=only_idle)
            except SharedUnavailable as e:
                done.append(f"{sock_path.name}: {e}")
                continue
            except OSError:
                for p in (paths.socket, paths.pid):
                    with contextlib.suppress(OSError):
                        p.unlink()
                done.append(f"{sock_path.name}: not running (stale files removed)")
                continue
            up.close()
            if not up.info.get("stopping"):
                done.append(f"{sock_path.name}: pid {pid} kept ({up.info.get('sessions')} sessions attached)")
                continue
            gone = _wait_gone(pid, wait_s)
            done.append(f"{sock_path.name}: pid {pid} " + ("stopped" if gone else f"still running after {wait_s:.0f} s"))
    return done


def _pid_of(paths: SharedPaths) -> int | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        return int(json.loads(paths.pid.read_text(encoding="utf-8"))["pid"])
    return None


def _key_of(paths: SharedPaths) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads(paths.pid.read_text(encoding="utf-8"))["key"])
    return None


def _wait_gone(pid: int | None, wait_s: float) -> bool:
    if pid is None:
        return True
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child (a relay that started it, a test)
                return True
        if is_zombie(pid):  # exited, not yet reaped by its parent (init reaps at its own pace: ~1.5 s in a VM here)
            return True
        time.sleep(0.02)
    return False


def is_zombie(pid: int) -> bool:
    """Whether the process has exited and waits only to be reaped (Linux's /proc; elsewhere False)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


# ---- the pump --------------------------------------------------------------------------------------------------


class _Call:
    """A client request the relay has passed on and not seen answered."""

    __slots__ = ("id", "method", "tool", "sending")

    def __init__(self, request_id: Any, method: str, tool: str | None) -> None:
        self.id = request_id
        self.method = method
        self.tool = tool
        self.sending = True  # until its line is wholly written to the upstream


def _id_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _error(request_id: Any, message: str) -> bytes:
    reply = {"jsonrpc": "2.0", "id": request_id, "error": {"code": RELAY_ERROR_CODE, "message": message}}
    return json.dumps(reply).encode("utf-8") + b"\n"


class Relay:
    """Pass one client session's JSON-RPC lines to an upstream and back.

    Remembers the session's `initialize` (and `notifications/initialized`) and the requests in flight. When the
    upstream goes away, every request in flight gets a JSON-RPC error at once (never resent: an append must not
    land twice), and the next message from the client attaches a new upstream (`reattach`: the shared server, else
    a private in-process one) and replays the handshake to it first.
    """

    def __init__(
        self,
        upstream: Upstream,
        reattach: Callable[[], Upstream],
        stdin: BinaryIO,
        stdout: BinaryIO,
        on_client_gone: Callable[[], None] | None = None,
    ) -> None:
        self._reattach = reattach
        self._stdin = stdin
        self._stdout = stdout
        self._on_client_gone = on_client_gone or (lambda: os._exit(0))
        self._lock = threading.Lock()  # upstream and inflight
        self._out_lock = threading.Lock()  # one writer of stdout at a time
        self._inflight: dict[str, _Call] = {}  # by id
        self._replays: dict[str, threading.Event] = {}
        self._init_line: bytes | None = None
        self._initialized_line: bytes | None = None
        self._replayed = 0
        self._closing = False  # the client closed stdin: the upstream's end is expected
        self.upstream: Upstream | None = None
        self.reattached = 0  # upstreams attached after the first (tests, logs)
        self._start_reader(upstream)

    def run(self) -> int:
        """Until the client closes stdin; then close the upstream (the server sees the session end)."""
        for line in iter(self._stdin.readline, b""):
            if line.strip():
                self._from_client(line)
        self._closing = True
        up = self.upstream
        if up is not None and up.half_close is not None:
            up.half_close()  # the server ends the session: its last replies, then end of stream
            self._reader_done.wait(CLOSE_WAIT_S)
        with self._lock:
            up, self.upstream = self.upstream, None
        if up is not None:
            up.close()
        return 0

    def _start_reader(self, up: Upstream) -> None:
        self.upstream = up
        self._reader_done = threading.Event()
        threading.Thread(target=self._read, args=(up,), name="relay-reader", daemon=True).start()

    def _from_client(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None  # forwarded as it is: the server answers a parse error
        rid, entry = None, None
        if isinstance(msg, dict) and isinstance(msg.get("method"), str):
            method = msg["method"]
            if method == "initialize":
                self._init_line = line
            elif method == "notifications/initialized":
                self._initialized_line = line
            elif method == "notifications/cancelled":
                with self._lock:
                    self._inflight.pop(_id_key((msg.get("params") or {}).get("requestId")), None)
            if "id" in msg:
                tool = (msg.get("params") or {}).get("name") if method == "tools/call" else None
                rid = _id_key(msg["id"])
                entry = _Call(msg["id"], method, tool)
                with self._lock:
                    self._inflight[rid] = entry
        for attempt in range(2):
            up = self.upstream or self._attach_again()
            if up is None:
                self._fail_one(rid)  # no server to be had (a no-op if _attach_again answered it already)
                return
            try:
                up.send(line)
            except OSError as e:
                # Invariant: a send that failed never delivered the line's closing newline, and a server acts on
                # whole lines only, so this (and only this) may go once more to a new upstream.
                self._lost(up, e)
                if attempt == 0:
                    continue
                self._fail_one(rid)
                return
            with self._lock:
                if entry is not None:
                    entry.sending = False
                lost_meanwhile = self.upstream is not up
            if lost_meanwhile:
                self._fail_one(rid)  # delivered, and the server went away: in flight at the kill (a no-op if answered)
            return

    def _attach_again(self) -> Upstream | None:
        """A new upstream with the session's handshake replayed; None (requests in flight failed) if none."""
        try:
            up = self._reattach()
        except Exception as e:
            logger.error("no server for this session: %s", e)
            self._fail_inflight(f"no second-brain server could be started ({e}); see the client's log for the relay's")
            return None
        self.reattached += 1
        logger.warning("attached to %s; replaying the session's initialize", up.what)
        with self._lock:
            self._start_reader(up)
        try:
            if self._init_line is not None:
                self._replay(up)
        except (OSError, TimeoutError) as e:
            self._lost(up, e)
            return None
        return up

    def _replay(self, up: Upstream) -> None:
        msg = json.loads(self._init_line or b"{}")
        self._replayed += 1
        msg["id"] = f"relay-replay-{self._replayed}"
        done = threading.Event()
        self._replays[_id_key(msg["id"])] = done
        up.send(json.dumps(msg).encode("utf-8") + b"\n")
        if not done.wait(REPLAY_TIMEOUT_S):
            raise TimeoutError(f"{up.what} did not answer the replayed initialize within {REPLAY_TIMEOUT_S:.0f} s")
        if self._initialized_line is not None:
            up.send(self._initialized_line)

    def _read(self, up: Upstream) -> None:
        done = self._reader_done
        reason: BaseException | str = "the server closed the connection"
        try:
            for line in iter(up.rfile.readline, b""):
                rid = _response_id(line)
                if rid is not None:
                    replay = self._replays.pop(rid, None)
                    if replay is not None:
                        replay.set()  # the client already has its initialize reply
                        continue
                    with self._lock:
                        self._inflight.pop(rid, None)
                self._to_client(line)
        except (OSError, ValueError) as e:
            reason = e
        done.set()
        self._lost(up, reason)

    def _lost(self, up: Upstream, reason: BaseException | str) -> None:
        with self._lock:
            if self.upstream is not up:
                return  # already handled (reader and writer both noticed)
            self.upstream = None
        if not self._closing:
            logger.warning("lost %s (%s); the next message starts or attaches a new one", up.what, reason)
        up.close()
        self._fail_inflight()

    def _fail_inflight(self, message: str | None = None) -> None:
        """Answer every request in flight with an error, except those still being sent (their sender decides)."""
        with self._lock:
            lost = [c for c in self._inflight.values() if not c.sending or message]
            self._inflight = {k: c for k, c in self._inflight.items() if c.sending and not message}
        for call in lost:
            self._answer_lost(call, message)

    def _fail_one(self, rid: str | None) -> None:
        with self._lock:
            call = self._inflight.pop(rid, None) if rid is not None else None
        if call is not None:
            self._answer_lost(call)

    def _answer_lost(self, call: _Call, message: str | None = None) -> None:
        text = message or (LOST_APPEND if call.tool == APPEND_TOOL else LOST_CALL)
        logger.warning("answering %s (id %s) with an error: its server went away", call.tool or call.method, call.id)
        self._to_client(_error(call.id, text))

    def _to_client(self, line: bytes) -> None:
        try:
            with self._out_lock:
                self._stdout.write(line)
                self._stdout.flush()
        except (OSError, ValueError):
            logger.info("the client went away mid-reply; closing the session")
            with self._lock:
                up, self.upstream = self.upstream, None
            if up is not None:
                up.close()
            self._on_client_gone()


def _response_id(line: bytes) -> str | None:
    """The id of a response (a line with an id and a result or an error, no method); None for anything else."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if isinstance(msg, dict) and "id" in msg and "method" not in msg:
        return _id_key(msg["id"])
    return None


# ---- the session's process: exec into the pump, attach, relay -------------------------------------------------------


def make_reattach(paths: SharedPaths, key: str, server_argv: list[str], fallback_argv: list[str]) -> Callable[[], Upstream]:
    """What a Relay calls when its upstream went away: the shared server again (a new one if it died), else a private
    in-process server (`fallback_argv` plus --fallback-reason), saying so on stderr."""

    def reattach() -> Upstream:
        try:
            return attach(paths, key, server_argv)
        except SharedUnavailable as e:
            reason = f"the shared server went away and no new one could be had: {e}"
            print(f"second-brain-mcp: serving this session in-process ({reason})", file=sys.stderr, flush=True)
            return child_upstream([*fallback_argv, "--fallback-reason", reason])

    return reattach


def exec_pump(plan: dict[str, Any]) -> NoReturn:
    """Replace this process with a bare interpreter (-S: no site-packages) running only the relay (`run_relay`), so
    the config, YAML and argparse this process loaded are not held for the session; raises OSError if the exec
    fails (the caller then relays from this process)."""
    plan = dict(plan, log_level=logging.getLogger().getEffectiveLevel())
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-S", str(Path(__file__).resolve()), PUMP_FLAG, json.dumps(plan)])


def run_relay(plan: dict[str, Any]) -> int:
    """Attach to the shared server (starting it if none runs) and relay the session until the client leaves. If no
    shared server can be had, a private in-process server (`fallback_argv`) serves the session, and says so."""
    paths = shared_paths(Path(plan["runtime_dir"]), plan["key"])
    try:
        up = attach(paths, plan["key"], plan["server_argv"])
        logger.info("relaying to the %s (%s sessions attached)", up.what, up.info.get("sessions"))
    except SharedUnavailable as e:
        reason = f"no shared server could be had: {e}"
        print(f"second-brain-mcp: serving this session in-process ({reason})", file=sys.stderr, flush=True)
        up = child_upstream([*plan["fallback_argv"], "--fallback-reason", reason])
    reattach = make_reattach(paths, plan["key"], plan["server_argv"], plan["fallback_argv"])
    return Relay(up, reattach, sys.stdin.buffer, sys.stdout.buffer).run()


def _run_pump(plan_json: str) -> int:
    plan = json.loads(plan_json)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(int(plan.get("log_level", logging.INFO)))
    return run_relay(plan)


if __name__ == "__main__":  # only as mcp_server's relay execs it: `python -S kb_relay.py --pump PLAN`
    if len(sys.argv) != 3 or sys.argv[1] != PUMP_FLAG:
        print("kb_relay.py is started by mcp_server.py's relay, not by hand", file=sys.stderr)
        sys.exit(2)
    sys.exit(_run_pump(sys.argv[2]))
