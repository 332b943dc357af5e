"""`mcp_server.py auth ...` and `--transport http` with server.auth: oauth, as a user runs them: real subprocesses on a
config in tmp_path (issue 51). The OAuth flow itself is tested in tests/test_oauth.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from kb_fixtures import REPO_ROOT, HttpServer, free_port, server_config

from kb_audit import AuditLog
from kb_authstore import AuthStore, totp_code
from kb_config import load_config
from kb_http import auth_folder

PASSPHRASE = "correct horse battery staple"
PUBLIC_URL = "https://notes.example.com"
# One auth command: imports, one scrypt (~0.1 s), a file write.
CLI_TIMEOUT_S = 60
CALLBACK = "https://claude.ai/api/mcp/auth_callback"


def _config(tmp: Path, **server: Any) -> Path:
    return server_config(tmp, **server)


def _run(config: Path, *args: str, stdin: str | None = None, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """mcp_server.py with a piped standard input (not a terminal: `auth init` reads one line of it)."""
    return subprocess.run(
        [sys.executable, "mcp_server.py", "--config", str(config), *args],
        cwd=REPO_ROOT,
        input=stdin or "",
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


def _folder(config: Path) -> Path:
    return auth_folder(load_config(config, env={}))


def _secret(stdout: str) -> str:
    found = re.search(r"otpauth://totp/second-brain-mcp:vault\?secret=([A-Z2-7]+)&", stdout)
    assert found, stdout
    return found.group(1)


def _register(store: AuthStore, client_id: str, name: str) -> None:
    store.register_client({"client_id": client_id, "client_name": name, "redirect_uris": [CALLBACK]})


@pytest.fixture
def initialised(tmp_path: Path) -> tuple[Path, str]:
    """A config whose vault ran `auth init` (passphrase from stdin); returns it and the printed TOTP secret."""
    config = _config(tmp_path)
    done = _run(config, "auth", "init", stdin=PASSPHRASE + "\n")
    assert done.returncode == 0, done.stderr
    return config, _secret(done.stdout)


# ---- auth init -------------------------------------------------------------------------------------------------


def test_auth_init_reads_stdin_and_prints_the_url_the_secret_and_a_qr_code(tmp_path: Path) -> None:
    config = _config(tmp_path)

    done = _run(config, "auth", "init", stdin=PASSPHRASE + "\n")

    assert done.returncode == 0, done.stderr
    secret = _secret(done.stdout)
    grouped = re.search(r"secret:\s+([A-Z2-7 ]+)\n", done.stdout)
    assert grouped and grouped.group(1).replace(" ", "") == secret
    assert sum("█" in line for line in done.stdout.splitlines()) >= 21  # the smallest QR code has 21 rows of modules
    assert f"{PUBLIC_URL}/mcp" in done.stdout and "cloudflared tunnel --url" in done.stdout
    assert PASSPHRASE not in done.stdout + done.stderr
    folder = _folder(config)
    assert folder == tmp_path / "data" / "auth" / load_config(config, env={}).index_dir.name
    assert (folder.stat().st_mode & 0o777, (folder / "auth.json").stat().st_mode & 0o777) == (0o700, 0o600)
    assert PASSPHRASE not in (folder / "auth.json").read_text(encoding="utf-8")
    # The printed secret and the piped passphrase are what the server will check.
    assert AuthStore(folder).check_login(PASSPHRASE, totp_code(secret, time.time())).ok


def test_auth_init_refuses_to_run_twice_and_names_reset(initialised: tuple[Path, str]) -> None:
    config, secret = initialised

    again = _run(config, "auth", "init", stdin="another long passphrase\n")

    assert again.returncode == 1
    assert "--reset" in again.stderr and "revokes every grant" in again.stderr
    assert "otpauth://" not in again.stdout
    assert AuthStore(_folder(config)).check_login(PASSPHRASE, totp_code(secret, time.time())).ok


def test_auth_init_reset_sets_a_new_secret_and_revokes_every_client(initialised: tuple[Path, str]) -> None:
    config, old_secret = initialised
    _register(AuthStore(_folder(config)), "client-a", "Claude")

    reset = _run(config, "auth", "init", "--reset", stdin="a brand new passphrase\n")

    assert reset.returncode == 0, reset.stderr
    assert "revoked" in reset.stdout
    store = AuthStore(_folder(config))
    assert store.list_clients() == []
    assert _secret(reset.stdout) != old_secret
    assert store.check_login("a brand new passphrase", totp_code(_secret(reset.stdout), time.time())).ok
    events = [(r.get("event"), r.get("via")) for r in AuditLog(_folder(config)).tail(10)]
    assert ("revocation", "cli") in events and ("owner_set", "cli") in events


@pytest.mark.parametrize("given", ["too short", ""])
def test_auth_init_refuses_a_short_passphrase(tmp_path: Path, given: str) -> None:
    config = _config(tmp_path)

    done = _run(config, "auth", "init", stdin=given + "\n")

    assert done.returncode == 1
    assert "at least 12 characters" in done.stderr
    assert "otpauth://" not in done.stdout
    assert not AuthStore(_folder(config)).is_initialised()


# ---- clients, revoke, log --------------------------------------------------------------------------------------


def test_auth_clients_lists_registered_clients_as_a_table_and_json(initialised: tuple[Path, str]) -> None:
    config, _ = initialised
    store = AuthStore(_folder(config))
    _register(store, "client-a", "Claude")
    _register(store, "client-b", "evil\x1b[2Jname")  # a client names itself: no escape sequence reaches the terminal
    store.issue_tokens("client-a", ["notes:read", "notes:append"], f"{PUBLIC_URL}/mcp")

    table = _run(config, "auth", "clients")
    as_json = _run(config, "auth", "clients", "--json")

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["CLIENT", "ID", "NAME", "SCOPES", "CREATED", "LAST", "USED"]
    row_a = next(line for line in lines if line.startswith("client-a"))
    assert "Claude" in row_a and "notes:append notes:read" in row_a and "never" not in row_a
    row_b = next(line for line in lines if line.startswith("client-b"))
    assert "\x1b" not in table.stdout and "evil?[2Jname" in row_b and row_b.rstrip().endswith("never")
    listed = json.loads(as_json.stdout)
    assert [(c["client_id"], c["scopes"]) for c in listed] == [("client-a", ["notes:append", "notes:read"]), ("client-b", [])]


def test_auth_clients_says_no_clients_on_an_empty_store(initialised: tuple[Path, str]) -> None:
    done = _run(initialised[0], "auth", "clients")

    assert (done.returncode, done.stdout.strip()) == (0, "no clients")


def test_auth_revoke_removes_a_client_at_once_for_a_store_already_open(initialised: tuple[Path, str]) -> None:
    config, _ = initialised
    server_side = AuthStore(_folder(config))  # as a running server holds it
    _register(server_side, "client-a", "Claude")
    _register(server_side, "client-b", "Claude on iPhone")
    pair = server_side.issue_tokens("client-a", ["notes:read"], f"{PUBLIC_URL}/mcp")
    assert server_side.load_access(pair.access_token) is not None

    done = _run(config, "auth", "revoke", "client-a")

    assert done.returncode == 0, done.stderr
    assert "client-a" in done.stdout
    assert server_side.load_access(pair.access_token) is None  # the file changed: the open store reread it
    assert [c.client_id for c in server_side.list_clients()] == ["client-b"]


def test_auth_revoke_refuses_an_unknown_client_and_needs_an_id_or_all(initialised: tuple[Path, str]) -> None:
    config, _ = initialised

    unknown = _run(config, "auth", "revoke", "nobody")
    neither = _run(config, "auth", "revoke")
    both = _run(config, "auth", "revoke", "nobody", "--all")

    assert unknown.returncode == 1 and "auth clients" in unknown.stderr
    assert neither.returncode == 2 and both.returncode == 2  # argparse's usage errors


def test_auth_revoke_all_removes_every_client_and_keeps_the_login(initialised: tuple[Path, str]) -> None:
    config, secret = initialised
    store = AuthStore(_folder(config))
    for i in range(3):
        _register(store, f"client-{i}", f"app {i}")

    done = _run(config, "auth", "revoke", "--all")

    assert done.returncode == 0, done.stderr
    assert "revoked 3 client(s)" in done.stdout
    assert store.list_clients() == []
    assert store.check_login(PASSPHRASE, totp_code(secret, time.time())).ok


def test_auth_log_shows_the_newest_records_as_lines_and_json(initialised: tuple[Path, str]) -> None:
    config, _ = initialised
    audit = AuditLog(_folder(config))
    store = AuthStore(_folder(config), on_event=lambda event, detail: audit.record_auth(event, **detail))
    _register(store, "client-a", "Claude")
    audit.record_tool(
        transport="http", client_id="client-a", client_name="Claude", tool="search", arguments={"query": "q"}, ok=True, ms=4
    )
    assert _run(config, "auth", "revoke", "client-a").returncode == 0

    lines = _run(config, "auth", "log")
    last_two = _run(config, "auth", "log", "-n", "2", "--json")

    assert lines.returncode == 0, lines.stderr
    shown = lines.stdout.splitlines()
    assert [line.split()[3] for line in shown] == ["owner_set", "registration", "search", "revocation"]
    assert "client_name=Claude" in shown[1] and "via=cli" in shown[3]
    records = json.loads(last_two.stdout)
    assert [r.get("event") or r.get("tool") for r in records] == ["search", "revocation"]


def test_auth_log_says_so_when_empty_and_refuses_n_below_one(tmp_path: Path) -> None:
    config = _config(tmp_path)

    empty = _run(config, "auth", "log")
    zero = _run(config, "auth", "log", "-n", "0")

    assert empty.returncode == 0 and "no audit records yet" in empty.stdout
    assert zero.returncode == 1 and "-n must be at least 1" in zero.stderr


def test_auth_help_lists_every_subcommand(tmp_path: Path) -> None:
    done = _run(_config(tmp_path), "auth", "--help")

    assert done.returncode == 0
    assert all(name in done.stdout for name in ("init", "clients", "revoke", "log", "status"))


def test_every_auth_command_and_flag_is_in_the_readme() -> None:
    import argparse

    from kb_authcli import build_parser

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        assert f"`{name}" in readme and all(f"`{f}" in readme for f in flags), name


# ---- serving with server.auth: oauth ---------------------------------------------------------------------------


def _serve(config: Path, port: int, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return _run(config, "--transport", "http", "--port", str(port), timeout=timeout)


def test_oauth_server_refuses_to_start_before_auth_init(tmp_path: Path) -> None:
    config = _config(tmp_path, auth="oauth", public_url=PUBLIC_URL)

    done = _serve(config, free_port())

    assert done.returncode == 1
    assert f"python mcp_server.py auth init --config {config}" in done.stderr  # the config it was started with


@pytest.mark.parametrize(
    ("public_url", "expected"),
    [("http://example.com", "plain http on a non-loopback host"), ("", "server.public_url is empty")],
)
def test_oauth_server_refuses_a_public_url_that_is_not_https(
    initialised: tuple[Path, str], public_url: str, expected: str
) -> None:
    config = _config(initialised[0].parent, auth="oauth", public_url=public_url)

    done = _serve(config, free_port())

    assert done.returncode == 1
    assert expected in done.stderr


def _get(url: str, method: str = "GET", token: str = "") -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    headers |= {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_oauth_server_serves_metadata_from_public_url_and_401s_mcp(initialised: tuple[Path, str], tmp_path: Path) -> None:
    config = _config(initialised[0].parent, auth="oauth", public_url=PUBLIC_URL)
    port = free_port()
    log = tmp_path / "server.log"
    server = HttpServer(config, port, log)
    try:
        local = f"http://127.0.0.1:{port}"

        status, _, body = _get(local + "/.well-known/oauth-protected-resource/mcp")
        refused, headers, _ = _get(local + "/mcp", method="POST")

        assert status == 200
        metadata = json.loads(body)
        assert metadata["resource"] == f"{PUBLIC_URL}/mcp"
        assert [u.rstrip("/") for u in metadata["authorization_servers"]] == [PUBLIC_URL]
        assert refused == 401
        challenge = {k.lower(): v for k, v in headers.items()}["www-authenticate"]
        assert f'resource_metadata="{PUBLIC_URL}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert f"connector URL: {PUBLIC_URL}/mcp" in log.read_text(encoding="utf-8")

        # A client the running server never saw: registered and granted in the store's file, as after a sign-in.
        store = AuthStore(_folder(config))
        _register(store, "client-a", "Claude")
        pair = store.issue_tokens("client-a", ["notes:read"], f"{PUBLIC_URL}/mcp")
        result = anyio.run(_search, local + "/mcp", pair.access_token)
        assert not result.is_error
        before_revoke, _, _ = _get(local + "/mcp", method="POST", token=pair.access_token)
        assert before_revoke == 421  # past the token check; then refused for its Host (127.0.0.1, not the public host)
        assert _run(config, "auth", "revoke", "client-a").returncode == 0
        after_revoke, _, _ = _get(local + "/mcp", method="POST", token=pair.access_token)
        shown = _run(config, "auth", "log").stdout
    finally:
        server.stop()
    assert after_revoke == 401  # revoked from the CLI, refused by the running server at its next request
    tool_line = next(line for line in shown.splitlines() if " tool search_my_knowledge_base " in line)
    assert "Claude (client-a)" in tool_line


async def _search(url: str, token: str) -> Any:
    """One search through the SDK's client, as claude.ai reaches us through the tunnel (Host: the public host)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}", "Host": PUBLIC_URL.removeprefix("https://")}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool("search_my_knowledge_base", {"query": "nightly backup timer", "mode": "keyword"})


def test_auth_status_shows_a_lockout_and_auth_unlock_lifts_it(initialised: tuple[Path, str]) -> None:
    config, secret = initialised
    store = AuthStore(_folder(config))
    for _ in range(5):
        store.check_login("not the passphrase", "000000")
    assert store.check_login(PASSPHRASE, totp_code(secret, time.time())).locked

    status = _run(config, "auth", "status")
    assert "locked for 15 more min" in status.stdout and "auth unlock" in status.stdout
    done = _run(config, "auth", "unlock")

    assert done.returncode == 0 and "sign-in unlocked" in done.stdout
    assert "sign-in:" in _run(config, "auth", "status").stdout and "open" in _run(config, "auth", "status").stdout
    assert AuthStore(_folder(config)).check_login(PASSPHRASE, totp_code(secret, time.time() + 30)).ok
    assert "login_unlocked" in _run(config, "auth", "log").stdout
