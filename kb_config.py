"""Configuration: defaults <- config.yaml <- environment variables, validated into a frozen Config.

Owns the KBError exception tree. Only this module reads config.yaml and os.environ.
Imports: nothing from the project.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# Folder holding the scripts; in a clone the default config.yaml and config.example.yaml live here.
APP_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG_FILE = APP_DIR / "config.yaml"
EXAMPLE_CONFIG_FILE = APP_DIR / "config.example.yaml"
# Per-user folders of an installed command (~/.config/<name>, ~/.local/share/<name>; %APPDATA%, %LOCALAPPDATA%).
APP_NAME = "second-brain-mcp"
CONFIG_FILE_NAME = "config.yaml"

# Environment variables (each overrides the config.yaml key beside it):
#   KB_CONFIG               which config file to read (entry scripts also take --config PATH)
#   XDG_CONFIG_HOME         where an installed command looks for second-brain-mcp/config.yaml (default ~/.config)
#   XDG_DATA_HOME           where an installed command keeps its index when data_dir is unset (~/.local/share)
#   XDG_RUNTIME_DIR         where the shared server's socket folder goes (else /tmp/second-brain-mcp-<uid>)
#   KB_DIR                  kb_dir
#   KB_DATA_DIR             data_dir
#   KB_TOP_K                search.top_k
#   KB_SEARCH_MODE          search.mode
#   KB_GATE_MARGIN          search.gate_margin
#   KB_CHUNK_TOKENS         chunking.chunk_tokens
#   KB_EMBED_MODEL          embedding.model
#   KB_EMBED_DEVICE         embedding.device
#   KB_EMBED_BATCH_SIZE     embedding.batch_size
#   KB_RERANK_MODEL         rerank.model
#   KB_BM25_INDEX_FILE      bm25.index_file
#   KB_SYNC_CHECK_INTERVAL  sync.check_interval
#   KB_SERVER_NAME          server.name
#   KB_LOG_LEVEL            server.log_level
#   KB_SERVER_TOKEN         server.token
#   KB_SERVER_AUTH          server.auth
#   KB_SERVER_PUBLIC_URL    server.public_url
#   KB_SERVER_REDACT        server.redact
#   KB_WRITABLE             write.writable (comma-separated)
#   KB_VECTOR_STORE         vector_store.mode
#   KB_CHROMA_HOST          vector_store.host
#   KB_CHROMA_PORT          vector_store.port
ENV_CONFIG = "KB_CONFIG"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SEARCH_MODES = ("hybrid", "keyword", "semantic")
# Keys earlier versions wrote into config.yaml: accepted with a warning, so an old config still loads.
RETIRED_KEYS = {
    "search.min_cosine": "the relevance gate calibrates itself per vault and model; see search.gate_margin",
    "search.semantic_weight": "reciprocal rank fusion depends only on the ratio of the weights; set search.keyword_weight "
    "(the keyword lists' weight against the models' lists)",
}
VECTOR_STORE_MODES = ("local", "http")
# How --transport http admits clients: the static bearer token, or OAuth 2.1 with the owner's sign-in (kb_oauth).
SERVER_AUTH_MODES = ("token", "oauth")
# When replies are masked for secrets (kb_redact): to remote (OAuth) clients only, to every client, or never.
REDACT_MODES = ("remote", "always", "never")
# A config with more opening brackets than this is parsed in pure Python: flow nesting can be no deeper than its count
# of brackets, and 256 levels stay far from where libyaml's recursion exhausts a stack (~25k levels on 8 MB; a 512 KB
# thread stack, macOS's default, would hold ~1.6k). A real config has a handful.
LIBYAML_MAX_OPENERS = 256


class KBError(Exception):
    """Base of every error this project raises on purpose; entry points print its message."""


class ConfigError(KBError):
    """The configuration is invalid; the message lists every violation."""


class PathOutsideVaultError(KBError):
    """A note path points outside the vault, into an ignored folder, or is malformed."""


class IndexFormatError(KBError):
    """An index file on disk cannot be read or was written by another format version."""


class ModelUnavailableError(KBError):
    """The configured embedding or rerank model cannot be loaded."""


class WriteRefusedError(KBError):
    """An append was refused (whitelist, size, heading); the disk is unchanged."""


class LockTimeoutError(KBError):
    """Another process held the index lock for longer than we may wait."""


class VectorStoreUnavailableError(KBError):
    """The vector store (a Chroma server) cannot be reached or failed; keyword search still works."""


@dataclass(frozen=True)
class _Field:
    key: str  # dotted key in config.yaml
    attr: str  # attribute on Config
    kind: type | tuple[type, ...]
    default: Any
    env: str | None = None
    check: Callable[[Any], str | None] | None = None  # returns a violation text or None


def _range(lo: float | None = None, hi: float | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if lo is not None and v < lo:
            return f"must be >= {lo}"
        if hi is not None and v > hi:
            return f"must be <= {hi}"
        return None

    return check


def _one_of(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"must be one of {', '.join(options)}"


def _extensions(v: list) -> str | None:
    bad = [e for e in v if not (isinstance(e, str) and e.startswith(".") and len(e) > 1)]
    return f"entries must look like '.md' (bad: {bad})" if bad or not v else None


def _str_list(v: list) -> str | None:
    return None if all(isinstance(e, str) and e.strip() for e in v) else "must be a list of non-empty strings"


def _str_map(v: dict) -> str | None:
    ok = all(isinstance(k, str) and k.strip() and isinstance(x, str) for k, x in v.items())
    return None if ok else "must map header names to strings, e.g. {Authorization: 'Bearer ...'}"


def _public_url(v: str) -> str | None:
    # The shape only; whether plain http is acceptable (loopback only) is decided when the OAuth server starts.
    if not v:
        return None
    try:
        parts = urlsplit(v)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
        ok = ok and not (parts.query or parts.fragment or parts.username or parts.password)
        ok = ok and (parts.port is None or parts.port > 0)  # .port raises ValueError when it is not a number
    except ValueError:
        ok = False
    return None if ok else "must be an origin like https://notes.example.com (no path: the connector URL adds /mcp)"


def _collection_prefix(v: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9._-]{0,40}", v) else "must be at most 40 of A-Z a-z 0-9 . _ -"


FIELDS: tuple[_Field, ...] = (
    _Field("kb_dir", "kb_dir", str, "", "KB_DIR"),
    _Field("data_dir", "data_dir", str, ".kb_data", "KB_DATA_DIR"),
    _Field("extensions", "extensions", list, [".md"], None, _extensions),
    _Field("ignore", "ignore", list, [], None, _str_list),
    _Field("max_file_bytes", "max_file_bytes", int, 2_000_000, None, _range(1)),
    _Field("chunking.chunk_tokens", "chunk_tokens", int, 200, "KB_CHUNK_TOKENS", _range(32, 2000)),
    _Field("chunking.overlap_tokens", "overlap_tokens", int, 60, None, _range(0, 500)),
    _Field("embedding.model", "embed_model", str, "use-multilingual,all-MiniLM-L6-v2", "KB_EMBED_MODEL"),
    _Field("embedding.device", "embed_device", str, "auto", "KB_EMBED_DEVICE"),
    _Field("embedding.batch_size", "embed_batch_size", int, 32, "KB_EMBED_BATCH_SIZE", _range(1, 4096)),
    _Field("bm25.index_file", "bm25_index_file", str, "", "KB_BM25_INDEX_FILE"),
    _Field("bm25.metadata_weight", "metadata_weight", int, 1, None, _range(0, 10)),
    _Field("search.top_k", "top_k", int, 4, "KB_TOP_K", _range(1, 50)),
    _Field("search.mode", "search_mode", str, "hybrid", "KB_SEARCH_MODE", _one_of(SEARCH_MODES)),
    _Field("search.candidates", "candidates", int, 40, None, _range(1, 1000)),
    _Field("search.rrf_k", "rrf_k", int, 10, None, _range(1, 1000)),
    _Field("search.keyword_weight", "keyword_weight", float, 1.0, None, _range(0.0, 10.0)),
    _Field("search.gate_margin", "gate_margin", float, 0.9, "KB_GATE_MARGIN", _range(0.0, 5.0)),
    _Field("search.snippet_chars", "snippet_chars", int, 240, None, _range(40, 5000)),
    _Field("search.max_response_chars", "max_response_chars", int, 12_000, None, _range(1000, 200_000)),
    _Field("rerank.model", "rerank_model", str, "", "KB_RERANK_MODEL"),
    _Field("rerank.candidates", "rerank_candidates", int, 20, None, _range(1, 200)),
    _Field("sync.check_interval", "check_interval_s", float, 0.0, "KB_SYNC_CHECK_INTERVAL", _range(0.0, 86400.0)),
    _Field("sync.lock_timeout", "lock_timeout_s", float, 30.0, None, _range(0.0, 3600.0)),
    _Field("server.name", "server_name", str, "second-brain", "KB_SERVER_NAME"),
    _Field("server.log_level", "log_level", str, "INFO", "KB_LOG_LEVEL", _one_of(LOG_LEVELS)),
    _Field("server.token", "server_token", str, "", "KB_SERVER_TOKEN"),
    _Field("server.allowed_hosts", "allowed_hosts", list, [], None, _str_list),
    _Field("server.auth", "server_auth", str, "token", "KB_SERVER_AUTH", _one_of(SERVER_AUTH_MODES)),
    _Field("server.public_url", "public_url", str, "", "KB_SERVER_PUBLIC_URL", _public_url),
    _Field("server.private_paths", "private_paths", list, [], None, _str_list),
    _Field("server.redact", "redact", str, "remote", "KB_SERVER_REDACT", _one_of(REDACT_MODES)),
    _Field("server.shared", "shared", bool, True),
    _Field("server.idle_exit", "idle_exit_s", float, 300.0, None, _range(0.0, 604800.0)),
    _Field("write.writable", "writable", list, ["inbox.md"], "KB_WRITABLE", _str_list),
    _Field("write.creatable", "creatable", list, [], None, _str_list),
    _Field("write.max_append_chars", "max_append_chars", int, 20_000, None, _range(1, 1_000_000)),
    _Field("write.dedupe_window", "dedupe_window_s", float, 600.0, None, _range(0.0, 86400.0)),
    _Field("vector_store.mode", "vector_mode", str, "local", "KB_VECTOR_STORE", _one_of(VECTOR_STORE_MODES)),
    _Field("vector_store.host", "chroma_host", str, "localhost", "KB_CHROMA_HOST"),
    _Field("vector_store.port", "chroma_port", int, 8000, "KB_CHROMA_PORT", _range(1, 65535)),
    _Field("vector_store.ssl", "chroma_ssl", bool, False),
    _Field("vector_store.headers", "chroma_headers", dict, {}, None, _str_map),
    _Field("vector_store.collection_prefix", "chroma_prefix", str, "sb-", None, _collection_prefix),
)
_BY_KEY = {f.key: f for f in FIELDS}
_PATH_ATTRS = ("kb_dir", "data_dir", "bm25_index_file")


@dataclass(frozen=True)
class Config:
    """Validated settings; paths are absolute. Build with load_config(), change with dataclasses.replace()."""

    kb_dir: Path
    data_dir: Path
    index_dir: Path  # data_dir/<vault>-<hash>: one index per vault, so vaults never mix
    bm25_index_file: Path
    extensions: tuple[str, ...] = (".md",)
    ignore: tuple[str, ...] = ()
    max_file_bytes: int = 2_000_000
    chunk_tokens: int = 200
    overlap_tokens: int = 60
    embed_model: str = "use-multilingual,all-MiniLM-L6-v2"  # both bundled: multilingual USE beside English MiniLM
    embed_device: str = "auto"
    embed_batch_size: int = 32
    metadata_weight: int = 1
    top_k: int = 4
    search_mode: str = "hybrid"
    candidates: int = 40
    rrf_k: int = 10
    keyword_weight: float = 1.0
    gate_margin: float = 0.9
    snippet_chars: int = 240
    max_response_chars: int = 12_000
    rerank_model: str = ""
    rerank_candidates: int = 20
    check_interval_s: float = 0.0
    lock_timeout_s: float = 30.0
    server_name: str = "second-brain"
    log_level: str = "INFO"
    server_token: str = field(default="", repr=False)  # bearer token for --transport http; never printed or logged
    allowed_hosts: tuple[str, ...] = ()
    server_auth: str = "token"  # --transport http: "token" (server.token) or "oauth" (kb_oauth, `auth init`)
    public_url: str = ""  # oauth: the https origin clients reach (a tunnel); the connector URL is public_url + /mcp
    private_paths: tuple[str, ...] = ()  # globs of notes only a client holding notes:private sees
    redact: str = "remote"  # when replies are masked for secrets: remote | always | never
    shared: bool = True  # stdio sessions attach to one shared server per vault and config (kb_relay, kb_shared)
    idle_exit_s: float = 300.0  # the shared server exits after this long with no session attached
    writable: tuple[str, ...] = ("inbox.md",)
    creatable: tuple[str, ...] = ()
    max_append_chars: int = 20_000
    dedupe_window_s: float = 600.0
    vector_mode: str = "local"
    chroma_host: str = "localhost"
    chroma_port: int = 8000
    chroma_ssl: bool = False
    chroma_headers: tuple[tuple[str, str], ...] = ()  # from the vector_store.headers mapping
    chroma_prefix: str = "sb-"
    source: str = field(default="defaults", compare=False)  # the config file used, for messages
    cache_dir: Path | None = field(default=None, compare=False)  # jieba's dictionary cache (user_cache_dir)
    runtime_dir: Path | None = field(default=None, compare=False)  # the shared servers' sockets (user_runtime_dir)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if v is None and any(f.key.startswith(key + ".") for f in FIELDS):
            continue  # a section whose keys are all commented out, as config.example.yaml has them
        if isinstance(v, Mapping) and not any(f.key == key for f in FIELDS):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def _coerce_env(f: _Field, raw: str) -> Any:
    if f.kind is list:
        return [p.strip() for p in raw.split(",") if p.strip()]
    if f.kind is int:
        return int(raw)
    if f.kind is float:
        return float(raw)
    return raw


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml  # local: only this function parses YAML

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    # libyaml's parser where PyYAML has it (its wheels do): every process reads the config, a session's relay before it
    # answers; config.example.yaml loads in ~1.5 ms against ~9 ms in pure Python. The same safe constructor builds the
    # values; an error is parsed again in pure Python, whose message quotes the line with a caret under the fault.
    # Defense in depth: libyaml's composer recurses in C and crashes the process on brackets nested ~25k deep (8 MB
    # stack); a file with more than LIBYAML_MAX_OPENERS of them is read in pure Python, which raises RecursionError.
    loader = yaml.SafeLoader
    if hasattr(yaml, "CSafeLoader") and text.count("[") + text.count("{") <= LIBYAML_MAX_OPENERS:
        loader = yaml.CSafeLoader
    try:
        data = yaml.load(text, Loader=loader)
    except (yaml.YAMLError, RecursionError):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}. Fix the file or start again from config.example.yaml.") from e
        except RecursionError as e:
            raise ConfigError(f"{path} nests its values too deep to read; start again from config.example.yaml.") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys (see config.example.yaml), got {type(data).__name__}")
    return data


def running_from_clone() -> bool:
    """True when the scripts run from a clone (config.example.yaml beside them), False for an installed command."""
    return EXAMPLE_CONFIG_FILE.is_file()


def user_config_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where an installed command looks for config.yaml: %APPDATA% on Windows, else $XDG_CONFIG_HOME or ~/.config."""
    env = os.environ if env is None else env
    if os.name == "nt" and env.get("APPDATA"):
        return Path(env["APPDATA"]) / APP_NAME
    return Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / APP_NAME


def user_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The per-user cache (jieba's dictionary and USE's pieces as kb_files.WordTableFile, USE's table, MiniLM's
    layers: each written once, then mapped by every process): %LOCALAPPDATA% on Windows, else $XDG_CACHE_HOME or
    ~/.cache."""
    env = os.environ if env is None else env
    if os.name == "nt" and env.get("LOCALAPPDATA"):
        return Path(env["LOCALAPPDATA"]) / APP_NAME / "cache"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / APP_NAME


def user_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The index folder of an installed command when data_dir is unset: %LOCALAPPDATA%, else $XDG_DATA_HOME or
    ~/.local/share."""
    env = os.environ if env is None else env
    if os.name == "nt" and env.get("LOCALAPPDATA"):
        return Path(env["LOCALAPPDATA"]) / APP_NAME
    return Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / APP_NAME


def user_runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the shared servers' sockets, locks, pid files and logs live (kb_relay checks it is private): a folder in
    $XDG_RUNTIME_DIR, else /tmp/second-brain-mcp-<uid> (short: a Unix socket's path is limited to 107 bytes)."""
    env = os.environ if env is None else env
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / APP_NAME
    uid = os.getuid() if hasattr(os, "getuid") else 0  # Windows serves in-process (kb_relay) and never uses it
    return Path(f"/tmp/{APP_NAME}-{uid}")


def config_candidates(env: Mapping[str, str] | None = None) -> list[Path]:
    """Config files looked for, in order, when neither --config nor KB_CONFIG names one.

    From a clone: config.yaml beside the scripts (created from config.example.yaml on first run). Installed:
    ./config.yaml, then the per-user config folder.
    """
    if running_from_clone():
        return [DEFAULT_CONFIG_FILE]
    return [Path.cwd() / CONFIG_FILE_NAME, user_config_dir(env) / CONFIG_FILE_NAME]


def ensure_config_file(path: Path | None = None, env: Mapping[str, str] | None = None) -> tuple[Path | None, bool]:
    """Return the config file to use, creating config.yaml from config.example.yaml on a clone's first run.

    Returns (path, created); path is None for an installed command that has no config file yet (defaults and
    environment variables apply). An explicit path must exist.
    """
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass an existing file or omit --config")
        return path, False
    for candidate in config_candidates(env):
        if candidate.is_file():
            return candidate, False
    if not running_from_clone():
        return None, False
    shutil.copyfile(EXAMPLE_CONFIG_FILE, DEFAULT_CONFIG_FILE)
    return DEFAULT_CONFIG_FILE, True


def _vault_slug(kb_dir: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", kb_dir.name)[:40] or "vault"
    return f"{name}-{hashlib.sha1(str(kb_dir).encode('utf-8')).hexdigest()[:8]}"


def load_config(
    path: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Load and validate settings: defaults <- config file <- env <- overrides (CLI flags, dotted keys).

    `env` defaults to os.environ; pass a dict in tests. `path` None means KB_CONFIG, else no file.
    Raises ConfigError listing every violation.
    """
    env = os.environ if env is None else env
    from_env = path is None and bool(env.get(ENV_CONFIG))
    if from_env:
        path = env[ENV_CONFIG]
    cfg_path = Path(path).expanduser().resolve() if path else None
    base_dir = cfg_path.parent if cfg_path else Path.cwd()

    values: dict[str, Any] = {f.key: f.default for f in FIELDS}
    sources: dict[str, str] = {f.key: "defaults" for f in FIELDS}
    errors: list[str] = []

    if cfg_path is not None:
        if not cfg_path.is_file():
            raise ConfigError(f"config file {cfg_path} does not exist (from {'KB_CONFIG' if from_env else '--config'})")
        for key, v in _flatten(_read_yaml(cfg_path)).items():
            if key in RETIRED_KEYS:
                logger.warning("%s: '%s' is no longer used (%s); delete it", cfg_path.name, key, RETIRED_KEYS[key])
                continue
            if key not in _BY_KEY:
                errors.append(f"unknown key '{key}' in {cfg_path.name}; valid keys are listed in config.example.yaml")
                continue
            values[key] = v
            sources[key] = cfg_path.name
    for f in FIELDS:
        if f.env and env.get(f.env, "") != "":
            try:
                values[f.key] = _coerce_env(f, env[f.env])
            except ValueError:
                errors.append(f"{f.key} must be {f.kind.__name__} (got {env[f.env]!r} from {f.env})")
                continue
            sources[f.key] = f.env
    for key, v in (overrides or {}).items():
        if key not in _BY_KEY:
            raise ConfigError(f"unknown override key '{key}'")
        if v is not None:
            values[key] = v
            sources[key] = "command line"

    out: dict[str, Any] = {}
    for f in FIELDS:
        v, src = values[f.key], sources[f.key]
        if f.kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if f.kind is bool and isinstance(v, str) and v.lower() in ("true", "false"):
            v = v.lower() == "true"
        if v is None or (isinstance(v, bool) and f.kind is not bool) or not isinstance(v, f.kind):
            errors.append(f"{f.key} must be {f.kind.__name__} (got {v!r} from {src})")
            continue
        problem = f.check(v) if f.check else None
        if problem:
            errors.append(f"{f.key} {problem} (got {v!r} from {src})")
            continue
        out[f.attr] = tuple(v) if isinstance(v, list) else tuple(sorted(v.items())) if isinstance(v, dict) else v

    if sources["data_dir"] == "defaults" and not running_from_clone():
        out["data_dir"] = str(user_data_dir(env))  # an installed command keeps its index in the per-user folder
    for attr in _PATH_ATTRS:
        raw = out.get(attr)  # absent when its value was invalid (already in errors)
        if raw:
            p = Path(os.path.expandvars(raw)).expanduser()
            out[attr] = (p if p.is_absolute() else base_dir / p).resolve()
    if not values["kb_dir"]:
        where = "config.yaml" if running_from_clone() else f"{user_config_dir(env) / CONFIG_FILE_NAME}"
        errors.append(f"kb_dir is missing: set kb_dir in {where}, KB_DIR, or pass --kb-dir PATH to your notes folder")
    elif isinstance(out.get("kb_dir"), Path) and not out["kb_dir"].is_dir():
        # Checked before raising so this is listed with every other violation, not found on the next run.
        errors.append(
            f"kb_dir {out['kb_dir']} is not a folder (from {sources['kb_dir']}); "
            "point kb_dir in config.yaml, KB_DIR or --kb-dir at your notes folder"
        )
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(dict.fromkeys(errors)))

    kb_dir: Path = out["kb_dir"]
    out["index_dir"] = out["data_dir"] / _vault_slug(kb_dir)
    if not out["bm25_index_file"]:
        out["bm25_index_file"] = out["index_dir"] / "bm25.pkl.gz"
    out["extensions"] = tuple(e.lower() for e in out["extensions"])
    out["source"] = str(cfg_path) if cfg_path else "defaults"
    out["cache_dir"] = user_cache_dir(env)
    out["runtime_dir"] = user_runtime_dir(env)
    return Config(**out)


# ---- helpers shared by the entry scripts (argparse flags, first-run config, stderr logging) ----------------

# Third-party loggers that are chatty at INFO; they only speak at WARNING and above.
NOISY_LOGGERS = ("chromadb", "httpx", "urllib3", "sentence_transformers", "transformers", "huggingface_hub", "jieba", "mcp")


def add_common_args(parser: Any) -> None:
    """--config, --kb-dir and -v/-q, shared by every entry script."""
    parser.add_argument(
        "--config",
        type=Path,
        help="config file (default: $KB_CONFIG, else config.yaml beside the scripts; installed: ./config.yaml, "
        "else ~/.config/second-brain-mcp/config.yaml)",
    )
    parser.add_argument("--kb-dir", type=Path, help="notes folder (overrides kb_dir / KB_DIR)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more detail on stderr (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr")


def load_cli_config(args: Any, env: Mapping[str, str] | None = None) -> Config:
    """Config for an entry script: --config, else KB_CONFIG, else the first of config_candidates() (a clone creates
    config.yaml from the example on first run)."""
    import sys

    env = os.environ if env is None else env
    path = args.config
    if path is None and not env.get(ENV_CONFIG):
        path, created = ensure_config_file(env=env)
        if created:
            print(f"created {path} from config.example.yaml (edit kb_dir there to index your own notes)", file=sys.stderr)
    overrides = {"kb_dir": str(Path(args.kb_dir).expanduser().resolve())} if getattr(args, "kb_dir", None) else {}
    return load_config(path, env=env, overrides=overrides)


def setup_logging(verbose: int = 0, quiet: bool = False, default: str = "INFO") -> None:
    """Log to stderr only (stdout is the MCP protocol in server mode)."""
    import logging
    import sys

    level = (
        logging.WARNING if quiet else logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.getLevelName(default)
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


# BLAS threads of a process that embeds on several threads of its own, set before numpy loads: OpenBLAS's pool of idle
# threads (2 here, whatever threadpoolctl allows later) kept a core busy beside one embedding thread and made two
# run slower than one (docs/performance.md, issue 34). A user's own setting wins.
BLAS_THREADS_ENV = {"OPENBLAS_NUM_THREADS": "1"}


def pin_blas_threads() -> None:
    """One BLAS thread per thread in this process (entry points call this before anything imports numpy)."""
    for key, value in BLAS_THREADS_ENV.items():
        os.environ.setdefault(key, value)
