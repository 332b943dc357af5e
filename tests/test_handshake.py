"""The start-up handshake: answered from the recorded SDK answers while the SDK imports, then handed to the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
TIMEOUT_S = 120


@pytest.fixture
def config_file(small_vault: Path, tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"kb_dir": str(small_vault), "data_dir": str(tmp_path / "data")}), encoding="utf-8")
    return path


class Raw:
    """The server as a subprocess spoken to in raw JSON-RPC lines (what any client sends)."""

    def __init__(self, config: Path, prelude: str = "") -> None:
        code = f"{prelude}\nimport runpy, sys\nsys.argv = ['mcp_server.py', '--config', {str(config)!r}]\nrunpy.run_path('mcp_server.py', run_name='__main__')"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[bytes] = []

    def send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, rid: int, method: str, params: dict | None = None) -> dict:
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params is not None else {})})
        while True:
            line = self.proc.stdout.readline()
            assert line, f"server closed stdout; stderr: {self.proc.stderr.read().decode()[-2000:]}"
            self.lines.append(line)
            msg = json.loads(line)  # every stdout line must be protocol
            if msg.get("id") == rid:
                return msg

    def handshake(self, first_id: int) -> tuple[dict, dict]:
        init = self.request(first_id, "initialize", INIT)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return init, self.request(first_id + 1, "tools/list")

    def close(self) -> str:
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT_S)
        rest = self.proc.stdout.read()
        assert not rest.strip(), f"unexpected stdout after close: {rest[:200]!r}"
        return self.proc.stderr.read().decode()


def test_second_start_answers_handshake_from_cache_identically(config_file, tmp_path):
    cold = Raw(config_file)
    init1, tools1 = cold.handshake(1)
    cold.close()
    cache = tmp_path / "data" / "mcp-handshake.json"
    assert cache.is_file() and len(json.loads(cache.read_text(encoding="utf-8"))) == 2

    warm = Raw(config_file)
    init2, tools2 = warm.handshake(7)
    assert init2["id"] == 7 and tools2["id"] == 8
    assert init2["result"] == init1["result"] and tools2["result"] == tools1["result"]
    status = warm.request(9, "tools/call", {"name": "index_status", "arguments": {}})  # the SDK took over
    assert "notes:" in status["result"]["content"][0]["text"]
    warm.close()
    assert [json.loads(line)["id"] for line in warm.lines] == [7, 8, 9]  # the SDK's duplicate answers were dropped


def test_unknown_request_shape_waits_for_the_sdk_instead_of_the_cache(config_file):
    first = Raw(config_file)
    first.handshake(1)
    first.close()
    other = Raw(config_file)
    reply = other.request(1, "initialize", dict(INIT, protocolVersion="2024-11-05"))
    assert reply["result"]["protocolVersion"] == "2024-11-05"  # negotiated by the SDK, not replayed
    other.close()


def test_stray_print_during_start_up_goes_to_stderr(config_file):
    prelude = "import threading\nthreading.Timer(0.3, lambda: print('STRAY LINE', flush=True)).start()"
    raw = Raw(config_file, prelude)
    time.sleep(0.6)
    raw.handshake(1)
    stderr = raw.close()
    assert "STRAY LINE" in stderr
    assert all(json.loads(line) for line in raw.lines)


def test_server_exits_when_client_leaves_before_sdk_is_ready(config_file):
    raw = Raw(config_file)
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
    raw.proc.stdin.close()
    assert raw.proc.wait(timeout=30) == 0
