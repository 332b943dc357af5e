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

from kb_fixtures import make_engine, sample_index, sample_vault, small_vault  # noqa: E402,F401  (fixtures for every test module)

# Tests never reach Hugging Face: a model that is not on disk must fail fast, not retry over the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# The longest files run first (longest-first scheduling over the xdist workers): started late, one of them kept a
# worker busy while the other sat idle at the end of the run.
SLOW_FILES_FIRST = ("test_faults.py", "test_minilm.py", "test_mcp_server.py", "test_bench.py", "test_eval_baseline.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES_FIRST)))  # stable: the rest keep their order
