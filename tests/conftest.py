"""Shared test setup: make the repository root importable (tests import kb_config, kb_scan, ... directly)."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402
from kb_fixtures import cheap_scrypt, make_engine, sample_index, sample_vault, small_vault  # noqa: E402,F401  (fixtures for every test module)

# Tests never reach Hugging Face: a model that is not on disk must fail fast, not retry over the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# The longest files run first (longest-first scheduling over the xdist workers): started late, one of them kept a
# worker busy while the other sat idle at the end of the run. Measured wall per file on 2 workers as CI runs them (with
# the claude CLI), longest first, every file over 3 s: test_register.py (14 s with claude) once ran last, and a core sat
# idle for the run's last 8 s. The fault drills go first all the same: three processes side by side, beside
# test_shared's waiting.
SLOW_FILES_FIRST = (
    "test_faults.py",
    "test_shared.py",
    "test_mcp_server.py",
    "test_embedders.py",
    "test_bench.py",
    "test_package.py",
    "test_register.py",
    "test_concurrency.py",
    "test_rerank.py",
    "test_minilm.py",
    "test_eval_baseline.py",
    "test_chroma_http.py",
    "test_architecture.py",
    "test_text.py",
    "test_links.py",
    "test_ingest.py",
    "test_watcher.py",
    "test_http.py",
    "test_store.py",
    "test_search.py",
    "test_logseq.py",
    "test_protocol.py",
    "test_hostile_input.py",
    "test_freshness.py",
)


# The project's own modules, compiled once per run where the environment says not to write bytecode
# (PYTHONDONTWRITEBYTECODE, as in this project's CI container): each of the ~150 Python processes the suite starts
# (servers, relays, ingests) compiled them again from source, ~0.25 s of CPU each. Python still reads a .pyc it did
# not write, and checks it against its source's size and time.
COMPILED_FOLDERS = (REPO_ROOT, REPO_ROOT / "eval", TESTS_DIR)


def pytest_configure(config):
    # pytest-xdist reorders --dist loadfile's files by their count of tests (its --loadscope-reorder, on by default),
    # which undid the order below: the fault drills, six tests and the longest file, started 144 s into a 264 s run.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if sys.dont_write_bytecode and not os.environ.get("PYTEST_XDIST_WORKER"):
        import compileall

        for folder in COMPILED_FOLDERS:
            compileall.compile_dir(folder, maxlevels=0, quiet=2)  # best effort: a read-only checkout compiles nothing


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES_FIRST)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def shared_runtime_dir():
    """The shared servers this worker's tests start (mcp_server.py in stdio mode is a relay) live in a runtime folder
    of its own, never the user's, short enough for a socket's path; every one of them is stopped at the end."""
    from kb_relay import stop_servers

    root = Path(tempfile.mkdtemp(prefix="sbrt-", dir="/tmp"))
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(root)  # children inherit it: the tests' env helpers copy os.environ
    folder = root / "second-brain-mcp"
    try:
        yield folder
    finally:
        left = [line for line in stop_servers(folder) if "stopped" not in line and "not running" not in line]
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"shared servers left running: {left}"


@pytest.fixture(autouse=True)
def stop_idle_shared_servers(shared_runtime_dir):
    """A test's shared servers with no session left exit with it, not after server.idle_exit (a module's open
    session keeps its own)."""
    yield
    from kb_relay import stop_servers

    stop_servers(shared_runtime_dir, only_idle=True)
