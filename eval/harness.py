"""What the eval scripts share, once: the repository's paths, percentiles, the environment and config.yaml a child
process gets, the MCP server launched through the SDK's own stdio client, a process spinning one core, the bench's
queries and vault copy.

bench.py, bench_mcp.py, bench_store.py, bench_embed.py, run_eval.py and the faults_* drills import this; it imports none
of them. Imports: nothing from the project (kb_config lazily, for errors).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# The interpreter that runs the CLIs (this one: the project's venv when started as .venv/bin/python).
PYTHON = sys.executable
# Children never reach Hugging Face: a missing model must fail at once, not retry over the network.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# Shell prelude that records the server's pid in $1, then execs the rest (so the pid is the server's own).
PIDFILE_SH = 'echo $$ > "$1"; shift; exec "$@"'
# Longest wait for a launched server's initialize reply (the SDK import; the first sync runs after it).
INITIALIZE_TIMEOUT_S = 120.0
# The process spinning a core with Busy is never alive past this, even if the bench is killed.
BUSY_MAX_S = 1800
# Generic queries any vault may or may not answer: latency is measured on hits and abstentions alike.
QUERIES = (
    "how to list files",
    "backup",
    "git undo last commit",
    "check disk usage",
    "find large files",
    "network connection failed",
    "ssh permission denied publickey",
    "install a python package",
    "docker container logs",
    "compress a folder",
    "schedule a cron job",
    "meeting notes",
    "project plan",
    "kill the process using a port",
    "change file permissions",
    "search text in files",
    "python virtual environment",
    "reading list",
    "网络连接失败怎么办",
    "压缩文件",
    "如何查看磁盘空间",
    "备份数据库",
    "撤销上一次提交",
    "会议记录",
    "学习计划",
    "查找文件",
    "修改文件权限",
    "服务器配置",
    "git 撤销 commit",
    "docker 容器日志",
    "python 虚拟环境",
    "定时任务 cron",
)


def say(tag: str, msg: str) -> None:
    """Progress on stderr (stdout carries only a table or JSON)."""
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (q in (0, 1]): the smallest value at least q of the values are at or below."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment minus KB_* (they would override the config under test), offline, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(OFFLINE_ENV)
    env.update(extra)
    return env


def write_config(path: Path, kb_dir: Path, data_dir: Path, model: str | None = None, **sections: Any) -> Path:
    """A config.yaml (JSON is YAML) for one run; `model` None keeps the configured default model; `sections` are
    further top-level keys, e.g. search={"mode": "keyword"}."""
    cfg: dict[str, Any] = {"kb_dir": str(kb_dir), "data_dir": str(data_dir), **sections}
    if model:
        cfg.setdefault("embedding", {})["model"] = model
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


@dataclass
class Launched:
    """A server launched by `launch`: the connected SDK client, when it was launched, how long initialize took, and
    its pid when a pidfile was asked for."""

    client: Any
    started: float  # time.perf_counter() at launch
    initialize_s: float
    pid: int | None = None


@contextlib.asynccontextmanager
async def launch(
    config: Path,
    errlog: Any,
    *,
    pidfile: Path | None = None,
    read_timeout_s: float = INITIALIZE_TIMEOUT_S,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Launched]:
    """`mcp_server.py --config CONFIG` through the SDK's stdio client (as Claude Code launches it), connected and
    initialized; closed (stdin closed, process ended by the SDK) when the block ends. With `pidfile`, the server's
    pid is recorded there and in Launched.pid (a shell prelude execs the server, so the pid is its own). In stdio
    mode that process is the session's relay to the shared server (`extra_args=["--no-shared"]`: a server of its own).
    """
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    server = [PYTHON, str(REPO_ROOT / "mcp_server.py"), "--config", str(config), *extra_args]
    if pidfile is not None:
        pidfile.unlink(missing_ok=True)
        command, args = "/bin/sh", ["-c", PIDFILE_SH, "sh", str(pidfile), *server]
    else:
        command, args = server[0], server[1:]
    params = StdioServerParameters(command=command, args=args, cwd=str(REPO_ROOT), env=child_env())
    t0 = time.perf_counter()
    client = Client(stdio_client(params, errlog=errlog), read_timeout_seconds=read_timeout_s, cache=None)
    # No cancel scope around this: the client's own task group must nest in the caller's scopes.
    async with client as connected:
        yield Launched(connected, t0, time.perf_counter() - t0, read_pid(pidfile))


@contextlib.contextmanager
def private_runtime() -> Any:
    """A runtime folder of this run's own (XDG_RUNTIME_DIR, inherited by every child): the shared servers the
    relays start live there, never beside the user's, and every one is stopped when the block ends."""
    import tempfile

    from kb_relay import stop_servers

    root = Path(tempfile.mkdtemp(prefix="sbrt-", dir="/tmp"))  # short: a socket's path has 107 bytes at most
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(root)
    try:
        yield root / "second-brain-mcp"
    finally:
        stop_servers(root / "second-brain-mcp")
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
        shutil.rmtree(root, ignore_errors=True)


async def serving_info(client: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """index_status's `serving`: shared (with the shared server's pid, sessions and log) or in-process."""
    import anyio

    with anyio.fail_after(timeout_s):
        status = await client.call_tool("index_status", {})
    return (status.structured_content or {}).get("serving") or {}


def read_pid(pidfile: Path | None) -> int | None:
    if pidfile is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        return int(pidfile.read_text().strip())
    return None


def _proc_status_mb(pid: int, *keys: str) -> list[float] | None:
    """The named fields of /proc/PID/status (kB values) in MB, or None where /proc is absent or lacks one."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines())
        return [int(fields[k].split()[0]) / 1024 for k in keys]
    except (OSError, KeyError, ValueError):
        return None


def peak_memory_mb(pid: int) -> tuple[float | None, str]:
    """Peak resident memory (MB) of a live process: /proc VmHWM (Linux), else psutil's current RSS."""
    peak = _proc_status_mb(pid, "VmHWM")
    if peak is not None:
        return peak[0], "VmHWM from /proc"
    try:
        import psutil
    except ImportError:
        return None, ""
    return psutil.Process(pid).memory_info().rss / 2**20, "RSS from psutil (current, not peak)"


def proportional_memory_mb(pid: int) -> float | None:
    """Proportional set size (MB) from /proc/PID/smaps_rollup: shared pages split among the processes mapping them,
    so the PSS of several processes adds up to the memory they take together. None where /proc lacks it."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="utf-8").splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def resident_memory_mb(pid: int) -> tuple[float | None, float | None]:
    """(resident, of it anonymous) MB of a live process now, from /proc (VmRSS, RssAnon); (None, None) elsewhere.
    Anonymous memory is the process's own; the rest are file pages (mapped models, libraries) other processes share."""
    found = _proc_status_mb(pid, "VmRSS", "RssAnon")
    return (found[0], found[1]) if found is not None else (None, None)


class Busy:
    """A process spinning one core for the duration of a `with` block (and never longer than BUSY_MAX_S)."""

    def __enter__(self) -> Busy:
        code = f"import time\nend = time.monotonic() + {BUSY_MAX_S}\nwhile time.monotonic() < end:\n    pass\n"
        self.proc = subprocess.Popen([PYTHON, "-c", code])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass(frozen=True)
class Metric:
    """One reported number; `embedder` labels what produced it (fake-embedder numbers say so)."""

    key: str
    value: float | int | bool | str | None
    unit: str
    embedder: str
    note: str = ""


def _say(msg: str) -> None:
    """Progress on stderr (stdout carries only the table or the JSON)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def prepare_vault(out_dir: Path, kb_dir: Path | None, synthetic: int | None) -> tuple[Path, str]:
    """The vault to benchmark, always under out_dir: a copy of kb_dir (never written to) or a generated one."""
    from synthetic_vault import SEED, write_synthetic_vault

    from kb_config import KBError

    dest = out_dir / "vault"
    if kb_dir is not None:
        src = kb_dir.expanduser().resolve()
        if not src.is_dir():
            raise KBError(f"--kb-dir {src} is not a folder; pass your notes folder")
        if out_dir == src or src in out_dir.parents:
            raise KBError(
                f"--out-dir {out_dir} is inside the vault {src}; pick an out dir outside it (the vault is never written)"
            )
        if src == dest or dest in src.parents:
            raise KBError(
                f"--kb-dir {src} lies in {dest}, which the benchmark replaces; copy it elsewhere or pick another --out-dir"
            )
    if dest.exists():
        shutil.rmtree(dest)
    if kb_dir is not None:
        shutil.copytree(src, dest, symlinks=True)
        return dest, f"copy of {src}"
    dest.mkdir(parents=True)
    write_synthetic_vault(dest, synthetic or 0)
    return dest, f"synthetic, {synthetic} notes, seed {SEED}"
