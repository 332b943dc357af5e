"""Conventions that keep the project honest: import direction, stdout hygiene, and documentation that matches the code."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kb_config import FIELDS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")

# Which project modules each module may import (STYLE.md section 1). Entry scripts may import anything below them.
ALLOWED = {
    "kb_config": set(),
    "kb_watch": set(),
    "kb_files": set(),
    "kb_scan": {"kb_config"},
    "kb_text": {"kb_config", "kb_files"},
    "kb_frontmatter": {"kb_config"},
    "kb_chunk": {"kb_config", "kb_text", "kb_frontmatter"},
    "kb_links": {"kb_config", "kb_text", "kb_chunk", "kb_frontmatter"},
    "kb_state": {"kb_config", "kb_files"},
    "kb_vectors": {"kb_config", "kb_minilm", "kb_use"},
    "kb_kernels": {"kb_files"},
    "kb_redact": set(),
    "kb_audit": set(),
    "kb_authstore": {"kb_config", "kb_files"},
    "kb_oauth": {"kb_authstore", "kb_config", "kb_oauth_pages"},
    "kb_oauth_pages": {"kb_authstore"},
    "kb_remote": {"kb_filter", "kb_redact"},
    "kb_minilm": {"kb_config", "kb_files", "kb_kernels"},
    "kb_use": {"kb_config", "kb_files", "kb_kernels"},
    "kb_store": {"kb_config", "kb_files", "kb_kernels"},
    "kb_embedrun": {"kb_text", "kb_vectors"},
    "kb_chroma": {"kb_config"},
    "kb_http": {"kb_config", "kb_files", "kb_oauth", "kb_authstore", "kb_audit", "kb_redact"},
    # `mcp_server.py auth ...`: a CLI over the transport's store and audit log (it prints, so not SERVER_SIDE).
    "kb_authcli": {"kb_config", "kb_http", "kb_authstore", "kb_audit"},
    # The relay stays light (standard library only); the shared server reuses its paths and hello.
    "kb_relay": set(),
    "kb_shared": {"kb_config", "kb_relay"},
    "bm25_index": {"kb_config", "kb_files", "kb_text"},
    "kb_view": {"kb_config", "kb_state", "kb_text", "bm25_index", "kb_links"},
    "kb_engine": {
        "kb_config",
        "kb_files",
        "kb_scan",
        "kb_text",
        "kb_state",
        "bm25_index",
        "kb_vectors",
        "kb_embedrun",
        "kb_store",
        "kb_chroma",
        "kb_view",
        "kb_links",
        "kb_chunk",
    },
    "kb_graph": {"kb_config", "kb_scan", "kb_state", "kb_text", "kb_engine"},
    "kb_filter": {"kb_config", "kb_scan", "kb_state", "kb_frontmatter"},
    "kb_background": {"kb_text", "kb_vectors", "kb_view"},
    "kb_search": {
        "kb_config",
        "kb_scan",
        "kb_text",
        "kb_state",
        "bm25_index",
        "kb_vectors",
        "kb_engine",
        "kb_graph",
        "kb_links",
        "kb_background",
        "kb_filter",
        "kb_view",
    },
    "kb_write": {"kb_config", "kb_files", "kb_scan", "kb_text", "kb_chunk", "kb_state"},
    "kb_live": {"kb_config", "kb_scan", "kb_state", "kb_engine", "kb_search", "kb_vectors", "kb_watch", "kb_kernels"},
    # The tools' logic: everything below the entry scripts, never the transport.
    "kb_tools": {
        "kb_config",
        "kb_live",
        "kb_filter",
        "kb_frontmatter",
        "kb_graph",
        "kb_links",
        "kb_scan",
        "kb_state",
        "kb_text",
        "kb_chunk",
        "kb_write",
        "kb_search",
        "kb_vectors",
    },
    "ingest": {"kb_config", "kb_engine", "kb_vectors"},
    "mcp_server": {
        "kb_config",
        "kb_scan",
        "kb_text",
        "kb_state",
        "bm25_index",
        "kb_vectors",
        "kb_engine",
        "kb_search",
        "kb_write",
        "kb_watch",
        "kb_links",
        "kb_graph",
        "kb_http",
        "kb_authcli",
        "kb_live",
        "kb_tools",
        "kb_relay",
        "kb_shared",
        "kb_filter",
        "kb_remote",
    },
    "watcher": {"kb_config", "kb_scan", "kb_text", "kb_state", "bm25_index", "kb_vectors", "kb_engine", "kb_watch"},
}
# Entry scripts: nothing imports them.
ENTRY_SCRIPTS = {"ingest", "mcp_server", "watcher"}
PROJECT = set(ALLOWED)
# Imported by the server process: nothing here may print to stdout (it is the MCP protocol).
SERVER_SIDE = [
    "kb_config",
    "kb_files",
    "kb_store",
    "kb_embedrun",
    "kb_chroma",
    "kb_links",
    "kb_watch",
    "kb_view",
    "kb_engine",
    "kb_scan",
    "kb_text",
    "kb_state",
    "kb_vectors",
    "kb_kernels",
    "kb_redact",
    "kb_audit",
    "kb_authstore",
    "kb_oauth",
    "kb_oauth_pages",
    "kb_remote",
    "kb_minilm",
    "kb_use",
    "bm25_index",
    "ingest",
    "kb_search",
    "kb_background",
    "kb_graph",
    "kb_http",
    "kb_write",
    "kb_live",
    "kb_filter",
    "kb_tools",
    "kb_chunk",
    "kb_frontmatter",
    "kb_relay",
    "kb_shared",
]


def _tree(module: str) -> ast.Module:
    return ast.parse((REPO / f"{module}.py").read_text(encoding="utf-8"))


def _imports(module: str) -> set[str]:
    found = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & PROJECT


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_module_imports_only_layers_below_it(module):
    assert _imports(module) <= ALLOWED[module], f"{module} imports {_imports(module) - ALLOWED[module]}"


def test_no_module_imports_an_entry_script():
    offenders = {m: _imports(m) & ENTRY_SCRIPTS for m in ALLOWED if _imports(m) & ENTRY_SCRIPTS}
    assert not offenders


def test_every_top_level_module_is_in_the_layer_table():
    modules = {p.stem for p in REPO.glob("*.py")}
    assert modules == PROJECT


@pytest.mark.parametrize("module", SERVER_SIDE)
def test_server_side_module_never_prints_to_stdout(module):
    """print() is allowed only with file=sys.stderr, or inside a CLI main() (never run by the server)."""
    tree = _tree(module)
    mains = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "main"]
    in_main = {id(n) for m in mains for n in ast.walk(m)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and id(node) not in in_main:
            target = next((ast.unparse(k.value) for k in node.keywords if k.arg == "file"), "")
            assert target == "sys.stderr", f"{module}.py:{node.lineno} prints to stdout"


def test_every_config_key_is_in_example_file_and_readme():
    example = yaml.safe_load((REPO / "config.example.yaml").read_text(encoding="utf-8"))

    leaves = {f.key for f in FIELDS}

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and f"{prefix}{k}" not in leaves:
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    keys = {f.key for f in FIELDS}
    assert set(flat(example)) == keys
    missing = [k for k in keys if f"`{k}`" not in README]
    assert not missing, f"README lacks config keys {missing}"


def test_every_env_var_is_documented():
    from kb_config import ENV_CONFIG

    names = {f.env for f in FIELDS if f.env} | {ENV_CONFIG}
    comment = (REPO / "kb_config.py").read_text(encoding="utf-8")
    assert not [n for n in names if f"`{n}`" not in README], "README lacks an environment variable"
    assert not [n for n in names if f"#   {n}" not in comment], "kb_config's comment block lacks an environment variable"


@pytest.mark.parametrize(
    "script",
    [
        "ingest.py",
        "mcp_server.py",
        "watcher.py",
        "eval/run_eval.py",
        "eval/bench.py",
        "eval/bench_store.py",
        "eval/bench_links.py",
        "eval/plant_identifiers.py",
        "eval/replies.py",
        "eval/knobs.py",
    ],
)
def test_every_cli_flag_is_documented(script):
    out = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", out.stdout)) - {"--help"}
    assert flags
    missing = sorted(f for f in flags if f not in README)
    assert not missing, f"README lacks {script} flags {missing}"


def test_every_tool_and_tool_argument_is_documented(small_vault, tmp_path):
    import anyio
    from kb_fixtures import make_config

    import mcp_server
    from kb_tools import KnowledgeBase

    server = mcp_server.build_server(KnowledgeBase(make_config(small_vault, tmp_path / "data")))
    tools = anyio.run(server.list_tools)
    assert len(tools) == 6
    for tool in tools:
        assert f"`{tool.name}`" in README
        row = next(line for line in README.splitlines() if line.startswith(f"| `{tool.name}`"))
        assert all(f"`{arg}" in row for arg in tool.input_schema.get("properties", {})), tool.name


def test_readme_quick_start_has_install_and_test_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.+?)\n```", quick, re.S)
    assert len(blocks) == 2
    install, test = blocks
    assert "pip install -r requirements.txt" in install and "ingest.py" in install and "--search" in install
    assert "pytest" in test
    assert test.strip() in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_longest_first_order_names_only_test_files_that_exist():
    from conftest import SLOW_FILES_FIRST  # a misspelt name would be ignored without a word, and its file run last

    missing = [name for name in SLOW_FILES_FIRST if not (REPO / "tests" / name).is_file()]
    assert not missing and len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST), missing


def _declared_imports(module: str) -> tuple[set[str], set[str]]:
    """The project modules a module's docstring says it imports: its line `Imports: a, b; lazily: c.`"""
    doc = ast.get_docstring(_tree(module)) or ""
    found = re.search(r"Imports: ([^.]*)\.", doc)
    assert found, f"{module}.py: no 'Imports: ...' line in its docstring"
    said = re.sub(r"\([^)]*\)", "", " ".join(found.group(1).split()))
    top, _, lazy = said.partition("; lazily:")

    def names(part: str) -> set[str]:
        return set() if part.strip() == "nothing from the project" else {n.strip() for n in part.split(",") if n.strip()}

    return names(top), names(lazy)


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_module_docstring_says_what_it_imports(module):
    tree = _tree(module)
    top = set()
    for node in tree.body:  # imports at module level; anything else is imported where it is used
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top.add(node.module.split(".")[0])
    top &= PROJECT
    assert _declared_imports(module) == (top, _imports(module) - top)


# A search followed from its tool (kb_tools) to the hits crosses at most this many modules on any call path (issue 20).
SEARCH_PATH_MODULES = 6


def _call_paths(run) -> set[tuple[str, ...]]:
    """Every chain of project modules on the call stack while `run()` runs, from kb_tools down (a module's own calls
    collapsed; generator expressions a caller hands down are its data, not calls)."""
    paths: set[tuple[str, ...]] = set()

    def module_of(frame) -> str | None:
        path = Path(frame.f_code.co_filename)
        if path.parent != REPO or path.stem not in PROJECT or frame.f_code.co_name == "<genexpr>":
            return None
        return path.stem

    def profile(frame, event, arg) -> None:
        if event != "call" or module_of(frame) is None:
            return
        chain: list[str] = []
        f = frame
        while f is not None:
            m = module_of(f)
            if m is not None and (not chain or chain[-1] != m):
                chain.append(m)
            f = f.f_back
        chain.reverse()
        if "kb_tools" in chain:
            paths.add(tuple(chain[chain.index("kb_tools") :]))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return paths


def test_a_search_crosses_at_most_six_modules_from_the_tool_and_never_climbs_back(sample_index, tmp_path):
    """A hybrid search with an alternative, with the default models (the translation step and the gate run): on every
    call path from the tool's logic to the hits, each module is entered once (no module calls back into one that
    called it) and at most SEARCH_PATH_MODULES modules are crossed."""
    import shutil

    from kb_fixtures import make_config, seed_sample_index

    from kb_tools import KnowledgeBase

    vault = tmp_path / "vault"
    shutil.copytree(sample_index[0], vault)
    seed_sample_index(sample_index, vault, tmp_path / "data")
    kb = KnowledgeBase(make_config(vault, tmp_path / "data"))
    kb.start()
    try:
        assert kb.live.startup_done.wait(300)
        kb.search("homelab backup", ["家庭服务器 备份"])  # warm: the gate's sample and the notes' vectors
        paths = _call_paths(lambda: kb.search("how do I back up the homelab", ["家庭服务器 备份"], mode="hybrid"))
    finally:
        kb.shutdown()
    modules = {m for p in paths for m in p}
    assert {"kb_live", "kb_search", "kb_view", "kb_background", "bm25_index", "kb_vectors"} <= modules, modules
    climbs = sorted(p for p in paths if len(set(p)) < len(p))
    assert not climbs, f"a module called back into one above it: {climbs[:3]}"
    longest = max(paths, key=len)
    assert len(longest) <= SEARCH_PATH_MODULES, " -> ".join(longest)


def test_readme_layout_names_every_module():
    """The README's Layout section names each top-level module: five were missing before this test existed."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("\n## Layout") :]
    missing = sorted(p.name for p in REPO.glob("*.py") if f"`{p.name}`" not in layout)
    assert not missing, f"add these to README.md's Layout section: {missing}"
