"""register_mcp.sh against the real `claude` CLI: registers a server that connects, re-runs idempotently, and
prints a JSON snippet for other clients when claude is missing.

Every run uses a throwaway HOME and a config in tmp_path, so the real ~/.claude.json and config.yaml are untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from kb_fixtures import seed_sample_index

from kb_config import load_config, user_cache_dir

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "register_mcp.sh"
SERVER_PY = REPO / "mcp_server.py"
SAMPLE_KB = REPO / "examples" / "sample_kb"
# Where .ci/run installs the CLI: npm install --prefix .ci/node @anthropic-ai/claude-code
LOCAL_CLAUDE = REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"
INSTALL_HINT = (
    "the claude CLI is not installed; run `npm install --prefix .ci/node @anthropic-ai/claude-code` in the repo "
    "(or `npm install -g @anthropic-ai/claude-code`)"
)
SERVER_NAME = "sb-test"
# `claude mcp list` starts the server and waits for its initialize answer (about 2 s here; generous for slow CI).
CLAUDE_TIMEOUT_S = 90
# Keeps claude offline and quiet in the throwaway HOME: no update checks, no telemetry.
CLAUDE_ENV = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def _find_claude() -> Path | None:
    if LOCAL_CLAUDE.is_file() and os.access(LOCAL_CLAUDE, os.X_OK):
        return LOCAL_CLAUDE
    found = shutil.which("claude")
    return Path(found) if found else None


CLAUDE = _find_claude()
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="register_mcp.sh needs bash (Windows uses register_mcp.bat)")
needs_claude = pytest.mark.skipif(CLAUDE is None, reason=INSTALL_HINT)


@dataclass(frozen=True)
class Sandbox:
    home: Path
    config: Path  # its folder name has a space, to prove the paths survive quoting
    workdir: Path  # cwd for the script and claude (the "project" for --scope local)
    env: dict[str, str]


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "my config" / "config.yaml"
    config.parent.mkdir()
    # JSON strings are valid YAML scalars, so paths with spaces or backslashes need no further quoting.
    config.write_text(
        f"kb_dir: {json.dumps(str(SAMPLE_KB))}\n"
        f"data_dir: {json.dumps(str(tmp_path / 'kb data'))}\n"
        f"server:\n  name: {SERVER_NAME}\n",
        encoding="utf-8",
    )
    workdir = tmp_path / "project"
    workdir.mkdir()
    # Drop settings that would point claude or the server elsewhere (a real config dir, another vault or name); keep
    # XDG_RUNTIME_DIR, the test run's own folder for the shared servers the relays start (conftest stops them).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "CLAUDE_", "XDG_")) or k == "XDG_RUNTIME_DIR"}
    env.update(CLAUDE_ENV, HOME=str(home))
    if CLAUDE is not None:
        env["PATH"] = f"{CLAUDE.parent}{os.pathsep}{env.get('PATH', '')}"
    return Sandbox(home, config, workdir, env)


@pytest.fixture
def indexed_sandbox(sandbox: Sandbox, sample_index: tuple[Path, Path]) -> Sandbox:
    """The sandbox as a registered vault usually is: already indexed, and the models' per-user cache warm. The server
    claude starts opens the index and embeds nothing, and maps the models from the cache: in the throwaway HOME it
    embedded the vault with both models and built the models' cache again, ~3 CPU-s a server for nothing the test
    reads. Only our cache folder is linked (where the system allows a link; else the cache is built as before);
    claude's own files stay in the throwaway HOME."""
    seed_sample_index(sample_index, SAMPLE_KB, load_config(sandbox.config, env={}).data_dir)
    cache = user_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    (sandbox.home / ".cache").mkdir()
    with contextlib.suppress(OSError):
        (sandbox.home / ".cache" / cache.name).symlink_to(cache, target_is_directory=True)
    return sandbox


def _run_script(box: Sandbox, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT), *args],
        cwd=box.workdir,
        env=box.env if env is None else env,
        capture_output=True,
        text=True,
        timeout=CLAUDE_TIMEOUT_S * 2,
    )


def _registrations(box: Sandbox, name: str) -> list[dict]:
    """Every entry called `name` in the throwaway ~/.claude.json: user scope and each project's local scope."""
    data = json.loads((box.home / ".claude.json").read_text(encoding="utf-8"))
    scopes = [data.get("mcpServers", {})] + [p.get("mcpServers", {}) for p in data.get("projects", {}).values()]
    return [servers[name] for servers in scopes if name in servers]


def _listed_lines(listing: str, name: str) -> list[str]:
    return [line for line in listing.splitlines() if line.startswith(f"{name}:")]


def _snippet(output: str) -> dict:
    """The JSON object the script prints last, parsed."""
    start = output.index('{\n  "mcpServers"')
    data, _ = json.JSONDecoder().raw_decode(output[start:])
    return data


def _path_without_claude(tmp_path: Path) -> str:
    """A PATH of one folder linking every command on the current PATH except claude."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not Path(folder).is_dir():
            continue
        for entry in Path(folder).iterdir():
            link = bin_dir / entry.name
            if entry.name == "claude" or link.exists() or link.is_symlink():
                continue
            if entry.is_file() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return str(bin_dir)


@needs_claude
def test_register_script_adds_server_that_connects(indexed_sandbox: Sandbox) -> None:
    sandbox = indexed_sandbox
    result = _run_script(sandbox, sys.executable, "--config", str(sandbox.config))
    assert result.returncode == 0, result.stdout + result.stderr
    # The script ends with `claude mcp list`, a claude process of its own that reads the saved registration and
    # starts the server (a second listing here cost ~1 s of CPU and proved nothing more).
    lines = _listed_lines(result.stdout, SERVER_NAME)
    assert len(lines) == 1 and "Connected" in lines[0], result.stdout + result.stderr

    [entry] = _registrations(sandbox, SERVER_NAME)
    assert entry["command"] == sys.executable
    assert entry["args"] == [str(SERVER_PY), "--config", str(sandbox.config)]


@needs_claude
def test_register_script_replaces_entry_when_run_twice(indexed_sandbox: Sandbox) -> None:
    sandbox = indexed_sandbox
    args = (sys.executable, "--config", str(sandbox.config), "--scope", "local")
    first = _run_script(sandbox, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    second = _run_script(sandbox, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "replaced the existing" in second.stdout

    assert len(_registrations(sandbox, SERVER_NAME)) == 1
    lines = _listed_lines(second.stdout, SERVER_NAME)  # the second run's own `claude mcp list`
    assert len(lines) == 1 and "Connected" in lines[0], second.stdout + second.stderr


def test_register_script_prints_json_snippet_when_claude_missing(sandbox: Sandbox, tmp_path: Path) -> None:
    env = dict(sandbox.env, PATH=_path_without_claude(tmp_path))
    result = _run_script(sandbox, "--config", str(sandbox.config), env=env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "'claude' CLI (Claude Code) is not on PATH" in result.stdout
    assert "npm install -g @anthropic-ai/claude-code" in result.stdout
    server = _snippet(result.stdout)["mcpServers"][SERVER_NAME]
    command = Path(server["command"])
    assert command.is_absolute() and command.exists()
    if (REPO / ".venv" / "bin" / "python").exists():
        assert command == REPO / ".venv" / "bin" / "python"  # the default interpreter, unresolved
    assert server["args"] == [str(SERVER_PY), "--config", str(sandbox.config)]
    assert not (sandbox.home / ".claude.json").exists()


def test_register_script_warns_when_the_python_lacks_the_requirements(sandbox: Sandbox, tmp_path: Path) -> None:
    """A python without mcp gets a warning naming the install command (checked without importing mcp, which takes
    over a second); the venv's python, which has them, gets none."""
    bare = shutil.which("python3", path="/usr/bin:/bin")
    probe = "import importlib.util as u, sys; sys.exit(not u.find_spec('yaml') or bool(u.find_spec('mcp')))"
    if bare is None or subprocess.run([bare, "-c", probe], capture_output=True).returncode != 0:
        pytest.skip("no system python3 without mcp (and with yaml, for the config loader) here")
    env = dict(sandbox.env, PATH=_path_without_claude(tmp_path))
    for python, warned in ((bare, True), (sys.executable, False)):
        result = _run_script(sandbox, python, "--config", str(sandbox.config), env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ("has no mcp or yaml installed" in result.stderr) is warned, result.stderr
        assert ("-m pip install -r" in result.stderr) is warned


def test_register_script_takes_name_from_config_loader(sandbox: Sandbox, tmp_path: Path) -> None:
    env = dict(sandbox.env, PATH=_path_without_claude(tmp_path), KB_SERVER_NAME="sb-from-env")
    result = _run_script(sandbox, sys.executable, "--config", str(sandbox.config), env=env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert list(_snippet(result.stdout)["mcpServers"]) == ["sb-from-env"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--scope", "global"), "--scope must be local, user or project"),
        (("--config", "no-such.yaml"), "does not exist"),
        (("--verbose",), "unknown option"),
    ],
)
def test_register_script_rejects_bad_arguments(sandbox: Sandbox, args: tuple[str, ...], message: str) -> None:
    result = _run_script(sandbox, *args)

    assert result.returncode == 2
    assert message in result.stderr
