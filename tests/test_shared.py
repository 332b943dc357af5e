"""The shared server and its relay: sessions attach to one server per vault and config, and each fault of issue 32
(a stale socket or lock, a kill -9 mid-session and mid-call, an append in flight, an unwritable runtime folder or a
full disk, a client that leaves mid-reply) ends in a working session or a JSON-RPC error, never a hang or a double.

Real processes (`mcp_server.py` as a client starts it), raw JSON-RPC lines over pipes, the hash embedder for speed;
each test has its own runtime folder and stops every server it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kb_fixtures import REPO_ROOT, wait_until

from kb_config import load_config
from kb_relay import (
    LOST_APPEND,
    Relay,
    SharedUnavailable,
    Upstream,
    _wait_gone,
    code_signature,
    connect,
    hello_line,
    identity_key,
    is_zombie,
    prepare_runtime_dir,
    shared_paths,
    stop_servers,
)

# Longest a single JSON-RPC answer may take here (a fresh server's start on a busy machine included).
ANSWER_S = 60.0
# What "never a hang" means for a call whose server was killed under it.
NO_HANG_S = 5.0
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Path]:
    """A short runtime folder of this test's own (XDG_RUNTIME_DIR); every server in it is stopped at the end."""
    root = Path(tempfile.mkdtemp(prefix="sbs-", dir="/tmp"))
    try:
        yield root
    finally:
        with contextlib.suppress(OSError):
            stop_servers(root / "second-brain-mcp")
        shutil.rmtree(root, ignore_errors=True)


def write_config(folder: Path, vault: Path | None = None, **server: Any) -> Path:
    vault = vault or folder / "vault"
    if not vault.exists():
        vault.mkdir(parents=True)
        (vault / "inbox.md").write_text("# Inbox\n\n- first capture\n", encoding="utf-8")
        (vault / "backup.md").write_text("# Backup\n\nThe NAS backup timer runs nightly at 02:00.\n", encoding="utf-8")
        (vault / "long.md").write_text(
            "# Long\n\n" + "\n".join(f"line {i} " + "word " * 30 for i in range(400)), encoding="utf-8"
        )
    cfg = {
        "kb_dir": str(vault),
        "data_dir": str(folder / "data"),
        "embedding": {"model": "hash-embedder"},
        "server": {"idle_exit": 60, **server},
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def child_env(runtime: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


class Session:
    """`mcp_server.py --config CONFIG` with JSON-RPC lines on its stdin and stdout, as a client drives it."""

    def __init__(self, config: Path, runtime: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.err_path = config.parent / f"relay-{time.monotonic_ns()}.err"
        self._err = self.err_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "mcp_server.py"), "--config", str(config), *args],
            cwd=REPO_ROOT,
            env=env or child_env(runtime),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
        )
        self._next = 0
        self._buffer = b""

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float = ANSWER_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"no line within {timeout_s} s; relay stderr: {self.stderr()[-2000:]}")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError(f"the relay closed stdout; stderr: {self.stderr()[-2000:]}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def request(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = ANSWER_S) -> dict[str, Any]:
        self._next += 1
        rid = self._next
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        reply = self.read(timeout_s)
        assert reply.get("id") == rid, f"expected the reply to {rid}, got {reply}"
        return reply

    def initialize(self) -> dict[str, Any]:
        reply = self.request("initialize", INIT)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def call(self, tool: str, args: dict[str, Any] | None = None, timeout_s: float = ANSWER_S) -> dict[str, Any]:
        return self.request("tools/call", {"name": tool, "arguments": args or {}}, timeout_s)

    def serving(self) -> dict[str, Any]:
        reply = self.call("index_status")
        return reply["result"]["structuredContent"]["serving"]

    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> int:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()


@contextlib.contextmanager
def session(config: Path, runtime: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Session]:
    s = Session(config, runtime, *args, env=env)
    try:
        yield s
    finally:
        s.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, os.WNOHANG)[0] != pid
    return Path(f"/proc/{pid}").exists() and not is_zombie(pid)


def wait_gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def kill_server(s: Session, pid: int) -> None:
    """kill -9 the shared server between two calls: the next call must find a new one. Waits until the relay saw the
    connection end (a thread of the dying server can hold the socket open a moment after its leader is a zombie; a
    call sent then is in flight at the kill, which test_call_in_flight_at_a_kill_gets_an_error... covers)."""
    seen = s.stderr().count("lost shared server")
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    deadline = time.monotonic() + 10
    while s.stderr().count("lost shared server") == seen and time.monotonic() < deadline:
        time.sleep(0.02)


def folder(runtime: Path) -> Path:
    return runtime / "second-brain-mcp"


# ---- attaching, identity ----------------------------------------------------------------------------------------


def test_second_session_attaches_to_the_running_shared_server_over_a_private_socket(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as a, session(config, runtime) as b:
        assert "serverInfo" in a.initialize()["result"]
        assert "serverInfo" in b.initialize()["result"]
        hit = b.call("search_my_knowledge_base", {"query": "backup timer"})["result"]["structuredContent"]["hits"][0]
        assert hit["path"] == "backup.md"
        first, second = a.serving(), b.serving()
        assert first["mode"] == second["mode"] == "shared"
        assert first["pid"] == second["pid"] and second["sessions_attached"] == 2
        # Security: the folder is this user's alone and the socket only ours to open.
        assert (folder(runtime).stat().st_mode & 0o777) == 0o700
        assert (Path(first["socket"]).stat().st_mode & 0o777) == 0o600
    files = sorted(p.suffix for p in folder(runtime).iterdir())
    assert files.count(".sock") == 1  # one server, one socket


def test_first_index_runs_once_in_the_shared_server_and_every_session_sees_its_coverage(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as a:
        a.initialize()
        a.call("search_my_knowledge_base", {"query": "backup timer"})
        # The first search may answer before the background embedding is done: wait for full coverage.
        statuses = []

        def covered() -> bool:
            statuses.append(a.call("index_status")["result"]["structuredContent"])
            coverage = statuses[-1]["semantic_coverage"]["hash-embedder"]
            return coverage["embedded"] == coverage["of"] > 0

        wait_until(covered, 30)
        first = statuses[-1]
        coverage = first["semantic_coverage"]["hash-embedder"]
        with session(config, runtime) as b:
            b.initialize()
            second = b.call("index_status")["result"]["structuredContent"]
    assert first["serving"]["pid"] == second["serving"]["pid"]
    assert first["semantic_coverage"] == second["semantic_coverage"]
    assert coverage["embedded"] == coverage["of"] > 0
    # One first index: the second session's server did not sync again.
    assert first["last_sync"] == second["last_sync"] and first["last_sync_summary"] == second["last_sync_summary"]


def test_two_relays_starting_at_once_end_up_with_one_server(tmp_path, runtime):
    config = write_config(tmp_path)
    sessions = [Session(config, runtime) for _ in range(3)]
    try:
        for s in sessions:
            s.initialize()
        pids = {s.serving()["pid"] for s in sessions}
        assert len(pids) == 1
    finally:
        for s in sessions:
            s.close()


def test_identity_key_changes_with_the_config_and_the_code_version(tmp_path):
    cfg = load_config(write_config(tmp_path), env={})
    code = code_signature()
    assert code and all(name.endswith(".py") for name, _, _ in code)
    key = identity_key(cfg, code)
    assert identity_key(load_config(write_config(tmp_path), env={}), code) == key  # same settings, same server
    assert identity_key(load_config(write_config(tmp_path, idle_exit=61), env={}), code) != key
    upgraded = [(name, size + 1, mtime) if name == "kb_search.py" else (name, size, mtime) for name, size, mtime in code]
    assert identity_key(cfg, upgraded) != key


def test_relay_never_attaches_to_a_server_started_for_an_older_config(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as a:
        a.initialize()
        old = a.serving()["pid"]
        write_config(tmp_path, idle_exit=600)  # the user edits config.yaml while a session is open
        with session(config, runtime) as b:
            b.initialize()
            assert b.serving()["pid"] != old
            assert alive(old)  # the old one still serves its session
    assert wait_gone(old, 10.0), "the superseded server did not leave with its last session"


def test_shared_server_exits_after_idle_exit_with_no_session(tmp_path, runtime):
    config = write_config(tmp_path, idle_exit=1)
    with session(config, runtime) as s:
        s.initialize()
        pid = s.serving()["pid"]
    assert wait_gone(pid, 10.0)
    assert not list(folder(runtime).glob("*.sock")) and not list(folder(runtime).glob("*.pid"))


def test_stop_shared_stops_the_server_and_clears_its_files(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        pid = s.serving()["pid"]
    out = subprocess.run(
        [sys.executable, "mcp_server.py", "--stop-shared"], cwd=REPO_ROOT, env=child_env(runtime), capture_output=True, text=True
    )
    assert out.returncode == 0 and f"pid {pid} stopped" in out.stdout
    assert not alive(pid) and not list(folder(runtime).glob("*.sock"))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_stop_counts_a_server_that_exited_but_is_not_yet_reaped_as_stopped():
    """A detached server's parent is init, which may reap it late (~1.5 s in this VM): --stop-shared waited for that."""
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(30)\n"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())  # type: ignore[union-attr]
        started = time.monotonic()
        assert _wait_gone(zombie, 5.0)
        assert time.monotonic() - started < 1.0
    finally:
        parent.kill()
        parent.wait()


def test_relay_path_imports_no_sdk_numpy_or_jieba(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as warm:
        warm.initialize()  # the server runs: the relay below only attaches
        env = dict(child_env(runtime), PYTHONPROFILEIMPORTTIME="1")
        with session(config, runtime, env=env) as s:
            s.initialize()
            assert s.serving()["mode"] == "shared"
            imported = {line.split("|")[-1].strip().split(".")[0] for line in s.stderr().splitlines() if "import time:" in line}
    assert "kb_relay" in imported and "kb_config" in imported
    heavy = imported & {"mcp", "mcp_types", "anyio", "pydantic", "numpy", "jieba", "torch", "kb_live", "kb_tools", "kb_engine"}
    assert not heavy, f"the relay imported {heavy}"


# ---- faults -----------------------------------------------------------------------------------------------------


def test_relay_starts_a_server_over_the_stale_socket_lock_and_pid_file_of_a_crash(tmp_path, runtime):
    """A crash (or a reboot that kept /tmp) leaves the socket file, the lock file and a pid file naming a dead or
    reused pid; none of them may stop the next session, and none may make anything signal that pid."""
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        pid = s.serving()["pid"]
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid)
    sock = next(folder(runtime).glob("*.sock"))
    assert sock.exists() and sock.with_suffix(".lock").exists()  # what the crash left
    record = json.loads(sock.with_suffix(".pid").read_text())
    record["pid"] = os.getpid()  # a reboot: the pid is now another live process (this test)
    sock.with_suffix(".pid").write_text(json.dumps(record))
    with session(config, runtime) as s:
        s.initialize()
        serving = s.serving()
        assert serving["mode"] == "shared" and serving["pid"] not in (pid, os.getpid())


def test_relay_replays_initialize_to_a_new_server_after_a_kill(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        old = s.serving()["pid"]
        kill_server(s, old)
        reply = s.call("search_my_knowledge_base", {"query": "backup timer"})  # the next call: a new server
        assert reply["result"]["structuredContent"]["hits"][0]["path"] == "backup.md"
        serving = s.serving()
        assert serving["mode"] == "shared" and serving["pid"] != old
        assert s.request("tools/list")["result"]["tools"]  # the replayed handshake left the session usable


class FakeServer:
    """One end of a socketpair playing the server: records every line it gets, answers what it is told to."""

    def __init__(self) -> None:
        self.relay_end, self.mine = socket.socketpair()
        self.rfile = self.mine.makefile("rb")
        self.lines: list[dict[str, Any]] = []

    def upstream(self) -> Upstream:
        sock = self.relay_end

        def close() -> None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

        return Upstream(sock.sendall, sock.makefile("rb"), close, "fake server")

    def take(self) -> dict[str, Any]:
        msg = json.loads(self.rfile.readline())
        self.lines.append(msg)
        return msg

    def answer(self, msg: dict[str, Any], result: dict[str, Any]) -> None:
        self.mine.sendall(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode() + b"\n")

    def crash(self) -> None:
        self.mine.shutdown(socket.SHUT_RDWR)
        self.mine.close()


def test_call_in_flight_at_a_kill_gets_an_error_and_is_never_resent():
    """The relay answers a call its server died under with a JSON-RPC error at once, and the new server gets the
    replayed handshake and the next call, never the lost append (resending it could append twice)."""
    first, second = FakeServer(), FakeServer()
    client_r, relay_stdin = os.pipe()
    relay_stdout, client_w = os.pipe()
    stdin, stdout = os.fdopen(client_r, "rb"), os.fdopen(client_w, "wb")
    to_relay, from_relay = os.fdopen(relay_stdin, "wb"), os.fdopen(relay_stdout, "rb")
    relay = Relay(first.upstream(), lambda: second.upstream(), stdin, stdout, on_client_gone=lambda: None)
    threading.Thread(target=relay.run, daemon=True).start()

    def send(msg: dict[str, Any]) -> None:
        to_relay.write(json.dumps(msg).encode() + b"\n")
        to_relay.flush()

    send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT})
    first.answer(first.take(), {"serverInfo": {"name": "fake"}})
    assert json.loads(from_relay.readline())["id"] == 0
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    append = {"name": "update_knowledge_base", "arguments": {"path": "inbox.md", "content": "- once"}}
    send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": append})
    assert first.take()["method"] == "notifications/initialized"
    assert first.take()["id"] == 1  # the server has it in flight ...
    t0 = time.monotonic()
    first.crash()  # ... and dies
    error = json.loads(from_relay.readline())
    assert error["id"] == 1 and error["error"]["message"] == LOST_APPEND
    assert time.monotonic() - t0 < NO_HANG_S
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "index_status", "arguments": {}}})
    replayed = second.take()
    assert replayed["method"] == "initialize" and replayed["params"] == INIT and replayed["id"] != 0
    second.answer(replayed, {"serverInfo": {"name": "fake"}})  # swallowed: the client had its reply
    assert second.take()["method"] == "notifications/initialized"
    call = second.take()
    assert call["id"] == 2 and call["params"]["name"] == "index_status"
    second.answer(call, {"content": []})
    assert json.loads(from_relay.readline())["id"] == 2  # the next line the client sees answers its next call
    assert relay.reattached == 1
    assert [m.get("id") for m in second.lines if m.get("method") == "tools/call"] == [2]  # the append never resent
    to_relay.close()


def test_append_in_flight_at_a_kill_lands_whole_or_fails_and_is_never_doubled(tmp_path, runtime):
    config = write_config(tmp_path)
    inbox = tmp_path / "vault" / "inbox.md"
    with session(config, runtime) as s:
        s.initialize()
        pid = s.serving()["pid"]
        text = "- kill marker " + "x" * 4000 + " end-of-append"
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 99,
                "method": "tools/call",
                "params": {"name": "update_knowledge_base", "arguments": {"path": "inbox.md", "content": text}},
            }
        )
        os.kill(pid, signal.SIGKILL)  # the append is in flight, or just done
        t0 = time.monotonic()
        reply = s.read(NO_HANG_S)
        assert reply["id"] == 99 and time.monotonic() - t0 < NO_HANG_S
        body = inbox.read_text(encoding="utf-8")
        assert body.count("kill marker") <= 1
        if "kill marker" in body:
            assert text in body  # whole, never a torn line
        if "error" in reply:
            assert reply["error"]["message"] == LOST_APPEND
        # The model retries, as the error tells it to: the note holds the text exactly once either way.
        again = s.call("update_knowledge_base", {"path": "inbox.md", "content": text})
        assert not again["result"].get("isError"), again
        assert inbox.read_text(encoding="utf-8").count(text) == 1


def test_relay_serves_in_process_when_the_runtime_folder_cannot_be_made(tmp_path, runtime):
    config = write_config(tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the runtime folder should be")
    with session(config, runtime, env=child_env(blocker)) as s:
        assert "serverInfo" in s.initialize()["result"]
        serving = s.serving()
        assert serving["mode"] == "in-process" and "cannot create the runtime folder" in serving["reason"]
        assert "serving this session in-process" in s.stderr()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to hand a folder to another user")
def test_relay_refuses_a_runtime_folder_another_user_owns(tmp_path, runtime):
    config = write_config(tmp_path)
    folder(runtime).mkdir(mode=0o700)
    os.chown(folder(runtime), 65534, 65534)
    with session(config, runtime) as s:
        s.initialize()
        serving = s.serving()
        assert serving["mode"] == "in-process" and "belongs to uid 65534" in serving["reason"]


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    opts = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "") + ",mode=0700"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            stop_servers(path / "second-brain-mcp")
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(folder_path: Path) -> None:
    with contextlib.suppress(OSError), (folder_path / "filler").open("wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_shared_server_serves_with_its_disk_full_and_the_relay_falls_back_when_no_socket_fits(tmp_path, runtime):
    config = write_config(tmp_path)
    mount = Path(tempfile.mkdtemp(prefix="sbf-", dir="/tmp"))
    try:
        with tiny_tmpfs(mount, "64k") as rt:
            (rt / "second-brain-mcp").mkdir(mode=0o700)
            _fill(rt / "second-brain-mcp")  # no byte left: the log and the pid file cannot be written
            with session(config, rt) as s:
                s.initialize()
                serving = s.serving()
                assert serving["mode"] == "shared"  # the socket needs an inode, not a byte
                assert s.call("search_my_knowledge_base", {"query": "backup timer"})["result"]["structuredContent"]["hits"]
        with tiny_tmpfs(mount, "64k", inodes=3) as rt:
            (rt / "second-brain-mcp").mkdir(mode=0o700)
            for i in range(10):  # take every inode left
                with contextlib.suppress(OSError):
                    (rt / "second-brain-mcp" / f"f{i}").write_text("")
            t0 = time.monotonic()
            with session(config, rt) as s:
                s.initialize()
                serving = s.serving()
                assert serving["mode"] == "in-process" and "no shared server" in serving["reason"]
            assert time.monotonic() - t0 < 30
    finally:
        shutil.rmtree(mount, ignore_errors=True)


def test_relay_falls_back_to_a_private_server_when_no_new_shared_one_can_start(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        pid = s.serving()["pid"]
        kill_server(s, pid)
        shutil.rmtree(folder(runtime))
        folder(runtime).write_text("the runtime folder is gone, a file stands in its way")
        reply = s.call("index_status")  # the next call: a private in-process server, with the handshake replayed
        assert "result" in reply, (reply, s.stderr()[-3000:])
        serving = reply["result"]["structuredContent"]["serving"]
        assert serving["mode"] == "in-process" and "no new one could be had" in serving["reason"]
        assert s.call("search_my_knowledge_base", {"query": "backup timer"})["result"]["structuredContent"]["hits"]
    (folder(runtime)).unlink()


def test_server_keeps_serving_when_a_client_disconnects_mid_reply(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        serving = s.serving()
        paths = shared_paths(folder(runtime), Path(serving["socket"]).stem)
        key = json.loads(paths.pid.read_text())["key"]
        for _ in range(3):  # a relay that sends a call with a long reply and leaves before reading it
            up = connect(paths, key, 5.0)
            up.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}).encode() + b"\n")
            up.rfile.readline()
            up.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode() + b"\n")
            read = {"name": "read_note", "arguments": {"path": "long.md"}}
            up.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": read}).encode() + b"\n")
            up.close()
        # A client that closes the relay's stdout mid-reply: the relay exits, the server stays.
        with session(config, runtime) as gone:
            gone.initialize()
            gone.send(
                {
                    "jsonrpc": "2.0",
                    "id": 5,
                    "method": "tools/call",
                    "params": {"name": "read_note", "arguments": {"path": "long.md"}},
                }
            )
            gone.proc.stdout.close()  # type: ignore[union-attr]
            gone.proc.stdin.close()  # type: ignore[union-attr]
            assert gone.proc.wait(timeout=10) == 0
        assert s.call("search_my_knowledge_base", {"query": "backup timer"})["result"]["structuredContent"]["hits"]
        deadline = time.monotonic() + 10
        while s.serving()["sessions_attached"] != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = s.serving()
        assert after["pid"] == serving["pid"] and after["sessions_attached"] == 1


# ---- security, platforms ----------------------------------------------------------------------------------------


def test_prepare_runtime_dir_rejects_a_folder_path_too_long_for_a_socket(tmp_path):
    with pytest.raises(SharedUnavailable, match="too long for a Unix socket"):
        prepare_runtime_dir(tmp_path / ("x" * 110))


@pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED") or os.geteuid() != 0, reason="needs Linux and root to switch uid")
def test_server_refuses_a_peer_of_another_uid(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime) as s:
        s.initialize()
        sock = Path(s.serving()["socket"])
        key = json.loads(sock.with_suffix(".pid").read_text())["key"]
        for guard in (runtime, folder(runtime)):  # take away the folders' guard to reach the check behind it
            os.chmod(guard, 0o755)
        os.chmod(sock, 0o666)
        probe = (
            "import socket,sys\ns=socket.socket(socket.AF_UNIX);s.settimeout(5);s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(sys.argv[2].encode());print(repr(s.recv(4096)))\n"
            "except (ConnectionResetError, BrokenPipeError):\n    print(repr(b''))"
        )
        hello = hello_line(key).decode()
        python = shutil.which("python3", path="/usr/bin:/bin") or pytest.skip("no system python3 another user may run")
        out = subprocess.run([python, "-c", probe, str(sock), hello], capture_output=True, text=True, user=65534, timeout=30)
        assert out.stdout.strip() == "b''", out  # closed without a hello
        assert s.serving()["mode"] == "shared"
        assert "refused a connection from uid 65534" in Path(s.serving()["log"]).read_text(encoding="utf-8")


def test_windows_sessions_run_in_process(monkeypatch, tmp_path):
    import mcp_server

    cfg = load_config(write_config(tmp_path), env={})
    assert mcp_server.shared_off_reason(cfg, no_shared=False) == ""
    assert mcp_server.shared_off_reason(cfg, no_shared=True) == "--no-shared"
    monkeypatch.setattr(mcp_server.os, "name", "nt")
    assert "Windows" in mcp_server.shared_off_reason(cfg, no_shared=False)


def test_no_shared_flag_serves_in_process(tmp_path, runtime):
    config = write_config(tmp_path)
    with session(config, runtime, "--no-shared") as s:
        s.initialize()
        assert s.serving() == {"mode": "in-process", "reason": "--no-shared"}
    assert not folder(runtime).exists()
