"""Fixtures shared by the engine, search, server and watcher tests (loaded by conftest.py as a plugin)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kb_config import Config, load_config
from kb_vectors import HashEmbedder

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = REPO_ROOT / "examples" / "sample_kb"


def make_config(kb_dir: Path, data_dir: Path, **overrides: object) -> Config:
    """A validated Config for a vault and index folder in tmp_path, with attribute overrides."""
    cfg = load_config(None, env={"KB_DIR": str(kb_dir), "KB_DATA_DIR": str(data_dir)})
    return replace(cfg, **overrides) if overrides else cfg


@pytest.fixture
def sample_vault(tmp_path: Path) -> Path:
    """A private copy of the bundled sample vault (tests may edit it)."""
    dest = tmp_path / "vault"
    shutil.copytree(SAMPLE_KB, dest, symlinks=True)
    return dest


@pytest.fixture
def small_vault(tmp_path: Path) -> Path:
    """A tiny vault: an English note, a Chinese note and a long note with sections."""
    root = tmp_path / "small"
    (root / "projects").mkdir(parents=True)
    (root / "projects" / "alpha.md").write_text(
        "---\ntitle: Alpha\ntags: [work]\n---\n# Alpha\n\n## Decisions\n\nWe chose PostgreSQL for the ledger.\n\n"
        "## Risks\n\nThe vendor API rate limit is 50 requests per second.\n",
        encoding="utf-8",
    )
    (root / "笔记.md").write_text("# 跑步\n\n周末长距离跑 18 公里，配速 6 分 10 秒。\n", encoding="utf-8")
    sections = "\n\n".join(f"## Section {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(120)) for i in range(6))
    (root / "long.md").write_text("# Long\n\n" + sections + "\n", encoding="utf-8")
    (root / "inbox.md").write_text("# Inbox\n\n- first capture\n", encoding="utf-8")
    return root


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[..., object]:
    """Build Engines over a vault with a HashEmbedder (pass embedder= to share or replace it)."""
    from kb_engine import Engine

    def build(vault: Path, embedder: object | None = None, data_dir: Path | None = None, **overrides: object):
        cfg = make_config(vault, data_dir or tmp_path / "data", **overrides)
        return Engine(cfg, embedder or HashEmbedder())

    return build


# Generous: ingest.py embeds the sample vault with both real models (~30 s here), maybe beside other suites.
SAMPLE_INDEX_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sample vault and its index with the default models, built by ingest.py once per test run: (vault, data_dir).

    Under pytest-xdist the first worker to ask builds it and the others wait for it (embedding it twice was ~30 s of
    the suite). Read only: copy it with seed_sample_index.
    """
    from kb_state import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder, common to its workers
    root = shared / "sample-index"
    with FileLock(shared / "sample-index.lock").hold(SAMPLE_INDEX_TIMEOUT_S):
        if not (root / "built").is_file():
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(SAMPLE_KB, root / "vault", symlinks=True)
            # Its own config with the defaults: a developer's config.yaml (another model) must not build it.
            config = root / "config.yaml"
            config.write_text(json.dumps({"kb_dir": str(root / "vault"), "data_dir": str(root / "data")}), encoding="utf-8")
            env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
            proc = subprocess.run(
                [sys.executable, "ingest.py", "--config", str(config), "-q"],
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=SAMPLE_INDEX_TIMEOUT_S,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            (root / "built").write_text("ok\n", encoding="utf-8")
    return root / "vault", root / "data"


def seed_sample_index(sample_index: tuple[Path, Path], vault: Path, data_dir: Path) -> None:
    """Copy the built sample index to where an index of `vault` in `data_dir` lives (a copied vault keeps its notes'
    text, so nothing is embedded again)."""
    src_vault, src_data = sample_index
    src = load_config(None, env={"KB_DIR": str(src_vault), "KB_DATA_DIR": str(src_data)}).index_dir
    dest = load_config(None, env={"KB_DIR": str(vault), "KB_DATA_DIR": str(data_dir)}).index_dir
    shutil.copytree(src, dest)


def write_note(vault: Path, rel: str, text: str) -> None:
    """Write a note at `rel` inside `vault`, creating its folders."""
    (vault / rel).parent.mkdir(parents=True, exist_ok=True)
    (vault / rel).write_text(text, encoding="utf-8")


# How often wait_until checks its condition.
POLL_S = 0.02


def wait_until(predicate: Callable[[], object], timeout_s: float) -> bool:
    """Poll `predicate` until it holds (True) or `timeout_s` passes (False): for what happens asynchronously, such as a
    file event reaching the server."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(POLL_S)
    return False


# A hostile input must be handled within this many seconds; a regression (quadratic parsing) runs into it.
BOUNDED_S = 60


def run_bounded(code: str) -> object:
    """Run `code` in a fresh interpreter with the repository importable; return the JSON it prints last.

    The timeout turns a quadratic blow-up into a failure instead of a hung suite.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n{code}"],
        capture_output=True,
        text=True,
        timeout=BOUNDED_S,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def server_config(tmp: Path, writable: tuple[str, ...] = (), **server: object) -> Path:
    """A config.yaml in `tmp` for a server process over a copy of the sample vault (`tmp/vault`, copied once) with the
    fast hash embedder, its index in `tmp/data`: `writable` notes, `server` keys as given."""
    vault = tmp / "vault"
    if not vault.exists():
        shutil.copytree(SAMPLE_KB, vault)
    cfg: dict[str, object] = {"kb_dir": str(vault), "data_dir": str(tmp / "data"), "embedding": {"model": "hash-embedder"}}
    if writable:
        cfg["write"] = {"writable": list(writable)}
    cfg["server"] = server
    path = tmp / "config.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def free_port() -> int:
    """A TCP port free on loopback now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """`mcp_server.py --transport http` on loopback `port` for a test, started and waited for (its stderr in `log`)."""

    # A server process may take this long to import, index the sample vault and open its port.
    START_TIMEOUT_S = 90

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "mcp_server.py"),
                "--config",
                str(config),
                "--transport",
                "http",
                "--port",
                str(port),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w", encoding="utf-8"),
        )

        def listening() -> bool:
            assert self.proc.poll() is None, log.read_text(encoding="utf-8")  # it exited: say why
            return answers(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.5).close())

        if not wait_until(listening, self.START_TIMEOUT_S):
            self.stop()
            pytest.fail(f"the HTTP server did not open port {port}: {log.read_text(encoding='utf-8')}")

    def stop(self) -> None:
        stop_process(self.proc, 15)


def answers(probe: Callable[[], object]) -> bool:
    """Whether `probe` (a connection, a request) goes through, rather than raising OSError."""
    try:
        probe()
    except OSError:
        return False
    return True


def stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """Terminate a server a test started, killing it if it is still there after `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Clock:
    """A clock tests move by hand (kb_authstore, kb_audit take `now=`); it starts at `t`, else at the real time (the
    SDK checks a token's expiry with time.time())."""

    def __init__(self, t: float | None = None) -> None:
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def cheap_scrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    """scrypt at N=2**10 keeps the auth tests fast; the cost is stored with each hash, so checks use what was set.
    A module takes it with `pytestmark = pytest.mark.usefixtures("cheap_scrypt")`."""
    import kb_authstore

    monkeypatch.setattr(kb_authstore, "SCRYPT_N", 2**10)


# Seconds an ASGI app served in a test may take to start listening (a real server's lifespan indexes a small vault).
SERVE_START_S = 20


@contextlib.contextmanager
def serving(app: object, port: int) -> Iterator[None]:
    """`app` served by uvicorn on 127.0.0.1:`port` in a thread, from listening until the block ends."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVE_START_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
