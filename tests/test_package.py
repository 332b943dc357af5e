"""The installable package: the wheel holds every flat module and the three commands, and the installed
`second-brain-mcp` works from any folder with per-user config and data folders (issue 11, "Install like a tool")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT, SAMPLE_KB

# What a wheel is built from: the flat modules and the files pyproject.toml reads.
PACKAGE_FILES = ("pyproject.toml", "README.md", "requirements.txt")


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
    assert "hits for" in out.stdout and "Homelab" in out.stdout
    assert (tmp_path / "xdg-data" / "second-brain-mcp").is_dir()  # the index went to the per-user data folder
    assert not list(work.iterdir())  # nothing written where the command ran
    for command in ("second-brain-ingest", "second-brain-watch"):
        assert subprocess.run([command, "--help"], env=env, capture_output=True, timeout=120).returncode == 0


def test_installed_command_without_a_config_says_where_to_put_kb_dir(installed: Path, tmp_path: Path) -> None:
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    out = subprocess.run(["second-brain-ingest"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert out.returncode == 1
    assert "kb_dir is missing" in out.stderr and str(tmp_path / "cfg" / "second-brain-mcp" / "config.yaml") in out.stderr
