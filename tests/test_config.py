"""kb_config: precedence, path resolution, env coercion, validation messages and first-run config file."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT

import kb_config
from kb_config import ConfigError, ensure_config_file, load_config


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    path = tmp_path / "notes"
    path.mkdir()
    return path


def _write_config(folder: Path, text: str, name: str = "c.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _config_error(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    return str(info.value)


# ---- defaults and precedence ----------------------------------------------------------------------------


def test_load_config_uses_defaults_when_only_kb_dir_is_given(vault: Path) -> None:
    cfg = load_config(None, env={"KB_DIR": str(vault)})

    assert cfg.kb_dir == vault.resolve()
    assert (cfg.chunk_tokens, cfg.top_k, cfg.search_mode, cfg.extensions) == (200, 4, "hybrid", (".md",))
    assert cfg.writable == ("inbox.md",)
    assert (cfg.server_auth, cfg.public_url, cfg.private_paths, cfg.redact) == ("token", "", (), "remote")
    assert cfg.source == "defaults"


def test_load_config_reads_the_env_mapping_not_os_environ(vault: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_TOP_K", "9")

    cfg = load_config(None, env={"KB_DIR": str(vault)})

    assert cfg.top_k == 4


@pytest.mark.parametrize(
    ("in_file", "in_env", "in_override", "expected"),
    [
        (False, False, False, 4),
        (True, False, False, 7),
        (True, True, False, 9),
        (False, True, False, 9),
        (True, True, True, 11),
        (True, False, True, 11),
    ],
)
def test_load_config_applies_defaults_then_file_then_env_then_overrides(
    tmp_path: Path, vault: Path, in_file: bool, in_env: bool, in_override: bool, expected: int
) -> None:
    text = f"kb_dir: {vault}\n" + ("search:\n  top_k: 7\n" if in_file else "")
    path = _write_config(tmp_path / "cfg", text)
    env = {"KB_TOP_K": "9"} if in_env else {}
    overrides = {"search.top_k": 11} if in_override else None

    cfg = load_config(path, env=env, overrides=overrides)

    assert cfg.top_k == expected


def test_load_config_keeps_lower_layer_when_override_is_none_or_env_is_empty(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nsearch:\n  top_k: 7\n")

    cfg = load_config(path, env={"KB_TOP_K": ""}, overrides={"search.top_k": None})

    assert cfg.top_k == 7


def test_load_config_names_the_layer_that_set_a_bad_value(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nsearch:\n  top_k: 7\n")

    message = _config_error(path, env={}, overrides={"search.top_k": 99})

    assert "search.top_k must be <= 50 (got 99 from command line)" in message


# ---- paths -----------------------------------------------------------------------------------------------


def test_load_config_resolves_relative_paths_against_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_dir = tmp_path / "cfg"
    (cfg_dir / "notes").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = _write_config(cfg_dir, "kb_dir: notes\ndata_dir: data\nbm25:\n  index_file: idx/bm25.pkl.gz\n")

    cfg = load_config(path, env={})

    assert cfg.kb_dir == (cfg_dir / "notes").resolve()
    assert cfg.data_dir == (cfg_dir / "data").resolve()
    assert cfg.bm25_index_file == (cfg_dir / "idx" / "bm25.pkl.gz").resolve()
    assert cfg.source == str(path.resolve())


def test_load_config_resolves_relative_paths_against_cwd_without_a_config_file(
    tmp_path: Path, vault: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    cfg = load_config(None, env={"KB_DIR": "notes"})

    assert cfg.kb_dir == vault.resolve()
    assert cfg.data_dir == (tmp_path / ".kb_data").resolve()


def test_load_config_expands_home_in_paths(tmp_path: Path, vault: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))

    cfg = load_config(None, env={"KB_DIR": "~/notes"})

    assert cfg.kb_dir == vault.resolve()


def test_load_config_puts_the_bm25_file_in_a_per_vault_index_dir(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "notes", tmp_path / "b" / "notes"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    data = str(tmp_path / "data")

    cfg_a = load_config(None, env={"KB_DIR": str(first), "KB_DATA_DIR": data})
    cfg_b = load_config(None, env={"KB_DIR": str(second), "KB_DATA_DIR": data})

    assert cfg_a.index_dir.parent == cfg_a.data_dir == (tmp_path / "data").resolve()
    assert cfg_a.bm25_index_file == cfg_a.index_dir / "bm25.pkl.gz"
    assert cfg_a.index_dir != cfg_b.index_dir  # same folder name, different vaults: never mixed


# ---- KB_CONFIG ---------------------------------------------------------------------------------------------


def test_load_config_reads_the_file_named_by_kb_config(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nsearch:\n  top_k: 7\n")

    cfg = load_config(None, env={"KB_CONFIG": str(path)})

    assert cfg.top_k == 7
    assert cfg.source == str(path.resolve())


def test_load_config_prefers_an_explicit_path_over_kb_config(tmp_path: Path, vault: Path) -> None:
    explicit = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nsearch:\n  top_k: 7\n", "explicit.yaml")
    from_env = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nsearch:\n  top_k: 3\n", "env.yaml")

    cfg = load_config(explicit, env={"KB_CONFIG": str(from_env)})

    assert cfg.top_k == 7


@pytest.mark.parametrize(
    ("explicit", "kb_config_env", "named_source"),
    [
        ("missing.yaml", None, "--config"),
        (None, "missing.yaml", "KB_CONFIG"),
        ("missing.yaml", "present.yaml", "--config"),
    ],
)
def test_load_config_rejects_a_missing_config_file_naming_where_it_came_from(
    tmp_path: Path, explicit: str | None, kb_config_env: str | None, named_source: str
) -> None:
    _write_config(tmp_path, "kb_dir: .\n", "present.yaml")
    env = {"KB_CONFIG": str(tmp_path / kb_config_env)} if kb_config_env else {}
    path = tmp_path / explicit if explicit else None

    message = _config_error(path, env=env)

    assert "missing.yaml does not exist" in message
    assert f"(from {named_source})" in message


# ---- env coercion ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "raw", "attr", "expected"),
    [
        ("KB_TOP_K", "9", "top_k", 9),
        ("KB_CHUNK_TOKENS", " 300 ", "chunk_tokens", 300),
        ("KB_GATE_MARGIN", "0.5", "gate_margin", 0.5),
        ("KB_SYNC_CHECK_INTERVAL", "3", "check_interval_s", 3.0),
        ("KB_WRITABLE", "a.md, daily/b.md,,", "writable", ("a.md", "daily/b.md")),
        ("KB_SEARCH_MODE", "keyword", "search_mode", "keyword"),
        ("KB_LOG_LEVEL", "DEBUG", "log_level", "DEBUG"),
        ("KB_EMBED_MODEL", "my-model", "embed_model", "my-model"),
        ("KB_SERVER_AUTH", "oauth", "server_auth", "oauth"),
        ("KB_SERVER_PUBLIC_URL", "https://notes.example.com", "public_url", "https://notes.example.com"),
        ("KB_SERVER_REDACT", "never", "redact", "never"),
    ],
)
def test_load_config_coerces_env_values_to_the_key_type(vault: Path, var: str, raw: str, attr: str, expected: object) -> None:
    cfg = load_config(None, env={"KB_DIR": str(vault), var: raw})

    value = getattr(cfg, attr)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("var", "raw", "expected"),
    [
        ("KB_TOP_K", "ten", "search.top_k must be int (got 'ten' from KB_TOP_K)"),
        ("KB_CHUNK_TOKENS", "1.5", "chunking.chunk_tokens must be int (got '1.5' from KB_CHUNK_TOKENS)"),
        ("KB_GATE_MARGIN", "high", "search.gate_margin must be float (got 'high' from KB_GATE_MARGIN)"),
        ("KB_CHUNK_TOKENS", "-5", "chunking.chunk_tokens must be >= 32 (got -5 from KB_CHUNK_TOKENS)"),
        ("KB_SEARCH_MODE", "fuzzy", "search.mode must be one of hybrid, keyword, semantic (got 'fuzzy' from KB_SEARCH_MODE)"),
        ("KB_SERVER_AUTH", "oath", "server.auth must be one of token, oauth (got 'oath' from KB_SERVER_AUTH)"),
        (
            "KB_SERVER_REDACT",
            "sometimes",
            "server.redact must be one of remote, always, never (got 'sometimes' from KB_SERVER_REDACT)",
        ),
        ("KB_SERVER_PUBLIC_URL", "notes.example.com", "server.public_url must be an origin like https://notes.example.com"),
    ],
)
def test_load_config_rejects_bad_env_value_naming_the_variable(vault: Path, var: str, raw: str, expected: str) -> None:
    message = _config_error(None, env={"KB_DIR": str(vault), var: raw})

    assert expected in message


# ---- validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("search:\n  top_k: '7'\n", "search.top_k must be int (got '7' from c.yaml)"),
        ("search:\n  top_k: true\n", "search.top_k must be int (got True from c.yaml)"),
        ("search:\n  top_k: 0\n", "search.top_k must be >= 1 (got 0 from c.yaml)"),
        ("search:\n  top_k: 51\n", "search.top_k must be <= 50 (got 51 from c.yaml)"),
        ("chunking:\n  chunk_tokens: 5\n", "chunking.chunk_tokens must be >= 32 (got 5 from c.yaml)"),
        ("search:\n  gate_margin: 7.5\n", "search.gate_margin must be <= 5.0 (got 7.5 from c.yaml)"),
        ("search:\n  mode: fuzzy\n", "search.mode must be one of hybrid, keyword, semantic"),
        ("server:\n  log_level: loud\n", "server.log_level must be one of DEBUG, INFO, WARNING, ERROR"),
        ("extensions: [md]\n", "entries must look like '.md'"),
        ("extensions: []\n", "extensions entries must look like '.md'"),
        ("ignore: ['']\n", "ignore must be a list of non-empty strings"),
        ("write:\n  writable: inbox.md\n", "write.writable must be list (got 'inbox.md' from c.yaml)"),
        ("embedding:\n  model: null\n", "embedding.model must be str (got None from c.yaml)"),
        ("chunking:\n  chunk_size: 300\n", "unknown key 'chunking.chunk_size' in c.yaml"),
        ("kb_dri: /x\n", "unknown key 'kb_dri' in c.yaml"),
        ("server:\n  public_url: https://notes.example.com/mcp\n", "server.public_url must be an origin like"),
        ("server:\n  private_paths: Private/**\n", "server.private_paths must be list (got 'Private/**' from c.yaml)"),
        ("server:\n  private_paths: ['']\n", "server.private_paths must be a list of non-empty strings"),
    ],
)
def test_load_config_rejects_invalid_file_value_naming_the_file(
    tmp_path: Path, vault: Path, yaml_text: str, expected: str
) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\n" + yaml_text)

    message = _config_error(path, env={})

    assert expected in message


def test_load_config_lists_every_violation_in_one_error(tmp_path: Path) -> None:
    path = _write_config(
        tmp_path / "cfg",
        "kb_dir: no-such-folder\nchunking:\n  chunk_tokens: 5\n  bogus: 1\nsearch:\n  top_k: '7'\n",
    )

    message = _config_error(path, env={"KB_GATE_MARGIN": "abc"})

    expected = [
        "unknown key 'chunking.bogus' in c.yaml",
        "chunking.chunk_tokens must be >= 32 (got 5 from c.yaml)",
        "search.top_k must be int (got '7' from c.yaml)",
        "search.gate_margin must be float (got 'abc' from KB_GATE_MARGIN)",
        "no-such-folder is not a folder (from c.yaml)",
    ]
    assert [e for e in expected if e not in message] == []
    assert message.count("\n  - ") == len(expected)


def test_load_config_rejects_a_missing_kb_dir(tmp_path: Path) -> None:
    message = _config_error(None, env={})

    assert "kb_dir is missing" in message


@pytest.mark.parametrize("kind", ["absent", "file"])
def test_load_config_rejects_kb_dir_that_is_not_a_folder_naming_the_source(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "notes"
    if kind == "file":
        target.write_text("not a folder", encoding="utf-8")

    from_file = _config_error(_write_config(tmp_path / "cfg", f"kb_dir: {target}\n"), env={})
    from_env = _config_error(None, env={"KB_DIR": str(target)})

    assert f"kb_dir {target} is not a folder (from c.yaml)" in from_file
    assert f"kb_dir {target} is not a folder (from KB_DIR)" in from_env


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("kb_dir: [unclosed\n", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping of keys"),
        ("just a string\n", "must hold a mapping of keys"),
    ],
)
def test_load_config_rejects_a_file_that_is_not_a_yaml_mapping(tmp_path: Path, yaml_text: str, expected: str) -> None:
    path = _write_config(tmp_path / "cfg", yaml_text)

    message = _config_error(path, env={})

    assert expected in message
    assert "c.yaml" in message


def test_load_config_quotes_the_faulty_line_of_a_yaml_error_under_libyaml_too(tmp_path: Path) -> None:
    """The config is parsed with libyaml's parser where PyYAML has it; its errors give only a line and column, so an
    error is parsed again in pure Python, whose message shows the line with a caret under the fault."""
    path = _write_config(tmp_path / "cfg", "data_dir: .kb_data\nsearch:\n  mode: [hybrid\n")

    message = _config_error(path, env={})

    assert "line 3, column 9:" in message and "  mode: [hybrid\n" in message and "^" in message, message


def test_load_config_says_a_file_nests_too_deep_instead_of_crashing(tmp_path: Path) -> None:
    """Brackets nested 100,000 deep would crash libyaml's composer (it recurses in C), so a file with that many is read
    in pure Python, which stops with a clear error. From a process of its own: a regression kills it (SIGSEGV)."""
    depth = 100_000
    path = _write_config(tmp_path / "cfg", "kb_dir: " + "[" * depth + "]" * depth + "\n")

    out = subprocess.run(
        [sys.executable, "-c", "import sys; from kb_config import load_config; load_config(sys.argv[1])", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert out.returncode == 1 and "nests its values too deep to read" in out.stderr, (out.returncode, out.stderr[-500:])


def test_load_config_reads_the_example_file_alike_with_libyaml_and_pure_python() -> None:
    import yaml

    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("this PyYAML has no libyaml: the config is parsed in pure Python only")
    text = kb_config.EXAMPLE_CONFIG_FILE.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.safe_load(text)


def test_load_config_accepts_an_empty_file(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", "# nothing set yet\n")

    cfg = load_config(path, env={"KB_DIR": str(vault)})

    assert cfg.top_k == 4


def test_load_config_accepts_a_section_whose_keys_are_all_commented_out(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nrerank:\n  # model: BAAI/bge-reranker-base\n")

    cfg = load_config(path, env={})

    assert cfg.rerank_model == ""


def test_load_config_rejects_an_unknown_override_key(vault: Path) -> None:
    message = _config_error(None, env={"KB_DIR": str(vault)}, overrides={"search.topk": 3})

    assert "unknown override key 'search.topk'" in message


def test_load_config_normalizes_ints_to_floats_and_extensions_to_lowercase(tmp_path: Path, vault: Path) -> None:
    path = _write_config(tmp_path / "cfg", f"kb_dir: {vault}\nextensions: ['.MD', '.Txt']\nsearch:\n  keyword_weight: 2\n")

    cfg = load_config(path, env={})

    assert cfg.extensions == (".md", ".txt")
    assert cfg.keyword_weight == 2.0 and isinstance(cfg.keyword_weight, float)


def test_config_rejects_attribute_assignment(vault: Path) -> None:
    cfg = load_config(None, env={"KB_DIR": str(vault)})

    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.top_k = 9  # type: ignore[misc]


# ---- ensure_config_file ------------------------------------------------------------------------------------


@pytest.fixture
def app_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Point the default and example config files at tmp paths (the repo's real config.yaml is never touched)."""
    default, example = tmp_path / "app" / "config.yaml", tmp_path / "app" / "config.example.yaml"
    default.parent.mkdir()
    monkeypatch.setattr(kb_config, "DEFAULT_CONFIG_FILE", default)
    monkeypatch.setattr(kb_config, "EXAMPLE_CONFIG_FILE", example)
    return default, example


def test_ensure_config_file_returns_an_explicit_existing_path(tmp_path: Path, app_files: tuple[Path, Path]) -> None:
    explicit = _write_config(tmp_path, "kb_dir: .\n", "mine.yaml")

    assert ensure_config_file(explicit) == (explicit, False)
    assert not app_files[0].exists()


def test_ensure_config_file_rejects_a_missing_explicit_path(tmp_path: Path, app_files: tuple[Path, Path]) -> None:
    app_files[1].write_text("kb_dir: .\n", encoding="utf-8")

    with pytest.raises(ConfigError, match="mine.yaml does not exist"):
        ensure_config_file(tmp_path / "mine.yaml")
    assert not app_files[0].exists()  # an explicit path is never created from the example


def test_ensure_config_file_copies_the_example_on_first_run_only(app_files: tuple[Path, Path]) -> None:
    default, example = app_files
    example.write_text("kb_dir: ./examples/sample_kb  # edit me\n", encoding="utf-8")

    first = ensure_config_file()
    default.write_text("kb_dir: /my/notes\n", encoding="utf-8")
    second = ensure_config_file()

    assert first == (default, True)
    assert second == (default, False)
    assert default.read_text(encoding="utf-8") == "kb_dir: /my/notes\n"  # the user's edit survives


def test_ensure_config_file_copies_the_example_verbatim(app_files: tuple[Path, Path]) -> None:
    default, example = app_files
    example.write_text("# 笔记库\nkb_dir: ./notes\n", encoding="utf-8")

    ensure_config_file()

    assert default.read_bytes() == example.read_bytes()


# ---- an installed command (no config.example.yaml beside the modules) -------------------------------------


@pytest.fixture
def installed(tmp_path: Path, app_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """As after `pipx install .`: no example beside the modules, a working folder and per-user folders in tmp."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg-config"), "XDG_DATA_HOME": str(tmp_path / "xdg-data")}


def test_installed_command_finds_no_config_and_creates_none(installed: dict[str, str], app_files: tuple[Path, Path]) -> None:
    assert ensure_config_file(env=installed) == (None, False)
    assert not app_files[0].exists()


def test_installed_command_prefers_the_working_folder_config_over_the_user_one(tmp_path: Path, installed: dict[str, str]) -> None:
    user = Path(installed["XDG_CONFIG_HOME"]) / "second-brain-mcp" / "config.yaml"
    user.parent.mkdir(parents=True)
    user.write_text("kb_dir: .\n", encoding="utf-8")

    assert ensure_config_file(env=installed) == (user, False)
    here = Path.cwd() / "config.yaml"
    here.write_text("kb_dir: .\n", encoding="utf-8")
    assert ensure_config_file(env=installed) == (here, False)


def test_installed_command_keeps_its_index_in_the_user_data_folder(tmp_path: Path, installed: dict[str, str]) -> None:
    cfg = load_config(None, env={**installed, "KB_DIR": str(tmp_path)})

    assert cfg.data_dir == (Path(installed["XDG_DATA_HOME"]) / "second-brain-mcp").resolve()
    explicit = load_config(None, env={**installed, "KB_DIR": str(tmp_path), "KB_DATA_DIR": str(tmp_path / "d")})
    assert explicit.data_dir == (tmp_path / "d").resolve()


def test_installed_command_without_kb_dir_names_the_user_config_file(installed: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"second-brain-mcp/config\.yaml"):
        load_config(None, env=installed)


@pytest.mark.parametrize("key", ["min_cosine: 0.25", "semantic_weight: 1.5"])
def test_config_of_an_earlier_version_with_a_retired_key_still_loads_with_a_warning(tmp_path: Path, caplog, key) -> None:
    path = _write_config(tmp_path, f"kb_dir: {json.dumps(str(tmp_path))}\nsearch:\n  {key}\n  top_k: 3\n")

    cfg = load_config(path, env={})

    assert cfg.top_k == 3
    assert f"search.{key.split(':')[0]}" in caplog.text and "no longer used" in caplog.text
