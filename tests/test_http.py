"""`--transport http`: streamable HTTP with a bearer token, tested with the SDK's own HTTP client and plain curl
against a real server process (issue 11, "Streamable HTTP, never open by accident")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from kb_fixtures import REPO_ROOT, HttpServer, free_port, server_config

# A server process may take this long to import, index the sample vault and open its port.
START_TIMEOUT_S = 90
CURL = shutil.which("curl")


def _config(tmp: Path, **server: Any) -> Path:
    return server_config(tmp, ("inbox.md",), **server)


def _cli(config: Path, *args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "mcp_server.py", "--config", str(config), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, str, Path]]:
    tmp = tmp_path_factory.mktemp("http")
    config = _config(tmp)
    made = _cli(config, "--print-token")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    token_file = tmp / "data" / "server-token"
    assert token_file.read_text(encoding="utf-8").strip() == token
    assert token_file.stat().st_mode & 0o777 == 0o600
    server = HttpServer(config, free_port(), tmp / "server.log")
    try:
        yield server, token, tmp
    finally:
        server.stop()


async def _session(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    out: list[Any] = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            out.append(await client.list_tools())
            for name, args in calls:
                out.append(await client.call_tool(name, args))
    return out


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _search_until(url: str, token: str, query: str, path: str) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        [_, result] = anyio.run(_session, url, token, [("search_my_knowledge_base", {"query": query, "mode": "keyword"})])
        if any(h["path"] == path for h in (result.structured_content or {}).get("hits", [])):
            return True
        time.sleep(0.5)
    return False


def test_sdk_http_client_searches_appends_and_a_second_session_sees_the_append(served):
    server, token, tmp = served
    assert _search_until(server.url, token, "nightly backup timer", "projects/homelab/Homelab.md")

    tools, appended = anyio.run(
        _session, server.url, token, [("update_knowledge_base", {"path": "inbox.md", "content": "- quetzal over http"})]
    )
    assert "related_notes" in {t.name for t in tools.tools}
    assert not appended.is_error and "Appended" in _text(appended)
    assert _search_until(server.url, token, "quetzal", "inbox.md")  # another session, the same index
    assert "quetzal over http" in (tmp / "vault" / "inbox.md").read_text(encoding="utf-8")


def test_http_writes_follow_the_whitelist(served):
    server, token, tmp = served
    note = tmp / "vault" / "projects" / "homelab" / "Homelab.md"
    before = note.read_bytes()
    calls = [
        ("update_knowledge_base", {"path": "projects/homelab/Homelab.md", "content": "x"}),
        ("update_knowledge_base", {"path": "../outside.md", "content": "x"}),
    ]
    _, not_listed, outside = anyio.run(_session, server.url, token, calls)

    assert not_listed.is_error and "writable" in _text(not_listed)
    assert outside.is_error and "leaves the vault" in _text(outside)
    assert note.read_bytes() == before and not (tmp / "outside.md").exists()


def test_sessions_at_once_all_get_answers(served):
    server, token, _ = served

    async def many() -> list[Any]:
        results: list[Any] = []

        async def one(q: str) -> None:
            results.extend(await _session(server.url, token, [("search_my_knowledge_base", {"query": q})]))

        async with anyio.create_task_group() as tg:
            for q in ("backup", "红烧肉", "WMS 库存", "restic"):
                tg.start_soon(one, q)
        return results

    results = anyio.run(many)
    calls = [r for r in results if hasattr(r, "is_error")]
    assert len(calls) == 4 and not any(r.is_error for r in calls)


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
@pytest.mark.parametrize(("header", "status"), [(None, "401"), ("Bearer wrong-token", "401"), ("token", "200")])
def test_curl_gets_401_without_the_right_token_and_200_with_it(served, header, status):
    server, token, tmp = served
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "curl", "version": "1"}},
        }
    )
    args = [CURL, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", server.url]
    args += ["-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream", "-d", body]
    if header:
        args += ["-H", f"Authorization: {f'Bearer {token}' if header == 'token' else header}"]

    got = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout

    assert got == status
    assert token not in (tmp / "server.log").read_text(encoding="utf-8")  # nothing of the token is logged


def test_server_refuses_to_serve_http_without_a_token(tmp_path):
    config = _config(tmp_path)

    for host in ("0.0.0.0", "127.0.0.1"):
        out = _cli(config, "--transport", "http", "--host", host, "--port", str(free_port()), timeout=60)
        assert out.returncode == 1
        assert "without a token" in out.stderr and "--print-token" in out.stderr
    assert "non-loopback" in _cli(config, "--transport", "http", "--host", "0.0.0.0", timeout=60).stderr


def test_claude_code_registers_the_http_server_and_lists_it_connected(served, tmp_path):
    from test_register import CLAUDE, CLAUDE_ENV, CLAUDE_TIMEOUT_S

    if CLAUDE is None:
        pytest.skip("the claude CLI is not installed (.ci/run installs it into .ci/node)")
    server, token, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "CLAUDE_"))}
    env.update(CLAUDE_ENV, HOME=str(tmp_path))

    def claude(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLAUDE), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLAUDE_TIMEOUT_S
        )

    added = claude("mcp", "add", "--transport", "http", "sb-http", server.url, "--header", f"Authorization: Bearer {token}")
    assert added.returncode == 0, added.stderr
    listed = claude("mcp", "list")
    line = next(x for x in listed.stdout.splitlines() if x.startswith("sb-http:"))
    assert "Connected" in line, listed.stdout


def test_every_tool_call_over_http_with_the_static_token_leaves_an_audit_line(served):
    """Issue 51: one audit line per tool call over HTTP, the static token's too (transport http-token, no client)."""
    server, token, tmp = served
    anyio.run(_session, server.url, token, [("search_my_knowledge_base", {"query": "zebra audit probe", "mode": "keyword"})])
    done = _cli(tmp / "config.yaml", "auth", "log", "-n", "200", "--json")
    assert done.returncode == 0, done.stderr
    probes = [r for r in json.loads(done.stdout) if r.get("kind") == "tool" and "zebra audit probe" in json.dumps(r.get("args"))]
    assert probes and probes[-1]["transport"] == "http-token" and probes[-1]["client_id"] is None
    assert token not in done.stdout
