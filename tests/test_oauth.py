"""kb_oauth over real HTTP on loopback: the whole OAuth flow with the SDK's own client, then each refusal an attacker
would try (RFC 9700 as the checklist), each checked by status and by what the answer leaves out."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html.parser
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import anyio
import httpx2
import pytest
from kb_fixtures import Clock, free_port, serving
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

import kb_authstore
from kb_authstore import TOTP_STEP_S, AuthStore, totp_code
from kb_config import ConfigError
from kb_oauth import SCOPES, check_public_url, current_client, oauth_app

PASSPHRASE = "correct horse battery staple"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
# Never listened on: the test browser reads the code from the Location header instead of following it.
REDIRECT_URI = "http://127.0.0.1:9/callback"
EXPECTED_CSP_PREFIX = "default-src 'none'; style-src 'unsafe-inline';"

pytestmark = pytest.mark.usefixtures("cheap_scrypt")


def _mcp_server() -> MCPServer:
    server = MCPServer(name="oauth-test", log_level="WARNING")

    @server.tool()
    def whoami() -> dict[str, Any]:
        """The calling OAuth client and its scopes."""
        found = current_client()
        return {"client_id": found[0], "scopes": found[1]} if found else {"client_id": None, "scopes": []}

    @server.tool()
    def echo(text: str) -> str:
        """The text, back."""
        return text

    return server


@dataclass
class Served:
    """A running oauth_app: where it listens, what it calls itself, its store, clock, the owner's TOTP secret and the
    store's audit events."""

    local: str
    public: str
    store: AuthStore
    clock: Clock
    secret: str
    requests: list[tuple[str, str, int, str | None]] = field(default_factory=list)
    events: list[tuple[str, dict]] = field(default_factory=list)

    def next_code(self) -> str:
        """A TOTP code not used before: one step later than the last one."""
        self.clock.advance(TOTP_STEP_S)
        return totp_code(self.secret, self.clock())


@contextlib.contextmanager
def _serve(tmp_path: Path, public_url: str | None = None) -> Iterator[Served]:
    """oauth_app on 127.0.0.1 (uvicorn in a thread); `public_url` defaults to the local address."""
    port = free_port()
    local = f"http://127.0.0.1:{port}"
    clock, events = Clock(), []
    store = AuthStore(tmp_path / "auth", now=clock, on_event=lambda name, detail: events.append((name, detail)))
    served = Served(local, public_url or local, store, clock, store.set_owner(PASSPHRASE).secret_b32, events=events)
    app = oauth_app(_mcp_server(), store, served.public, "127.0.0.1", on_request=lambda *seen: served.requests.append(seen))
    with serving(app, port):
        yield served


@pytest.fixture
def served(tmp_path):
    with _serve(tmp_path) as s:
        yield s


@pytest.fixture
def tunnel(tmp_path):
    """Served on loopback while calling itself https://notes.example.com, as behind an https tunnel."""
    with _serve(tmp_path, "https://notes.example.com") as s:
        yield s


# --- the test browser: our pages parsed as a browser would ---


class _Form(html.parser.HTMLParser):
    """A page's form: its action, hidden inputs, scope checkboxes and those ticked (and enabled)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.action, self.hidden, self.boxes, self.ticked = "", {}, [], []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.action = a.get("action") or ""
        elif tag == "input" and a.get("type") == "hidden":
            self.hidden[a["name"] or ""] = a.get("value") or ""
        elif tag == "input" and a.get("type") == "checkbox":
            self.boxes.append(a["value"] or "")
            if "checked" in a and "disabled" not in a:
                self.ticked.append(a["value"] or "")


async def _sign_in(http: httpx2.AsyncClient, served: Served, login_url: str, code: str | None = None) -> httpx2.Response:
    page = await http.get(login_url)
    assert page.status_code == 200, page.text
    form = _Form(page.text)
    return await http.post(form.action, data={**form.hidden, "passphrase": PASSPHRASE, "code": code or served.next_code()})


async def _consent(
    http: httpx2.AsyncClient, consent_url: str, decision: str = "allow", untick: Sequence[str] = (), add: Sequence[str] = ()
) -> httpx2.Response:
    page = await http.get(consent_url)
    assert page.status_code == 200, page.text
    form = _Form(page.text)
    scopes = [s for s in form.ticked if s not in untick] + list(add)
    return await http.post(form.action, data={**form.hidden, "scope": scopes, "decision": decision})


async def _start(http: httpx2.AsyncClient, authorize_url: str) -> str:
    """GET /authorize; the sign-in page URL it redirects to."""
    r = await http.get(authorize_url)
    assert r.status_code == 302, r.text
    return r.headers["location"]


async def _authorize_in_browser(
    http: httpx2.AsyncClient, served: Served, authorize_url: str, untick: Sequence[str] = (), add: Sequence[str] = ()
) -> dict[str, str]:
    """Sign in and allow; the query of the redirect back to the client (code, state, iss)."""
    r = await _sign_in(http, served, await _start(http, authorize_url))
    assert r.status_code == 303, r.text
    r = await _consent(http, r.headers["location"], untick=untick, add=add)
    assert r.status_code == 302, r.text
    return _query(r.headers["location"])


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Browser:
    """The SDK client's redirect_handler + callback_handler: the owner signs in and allows, unticking `untick`."""

    def __init__(self, served: Served, untick: Sequence[str] = ()) -> None:
        self.served, self.untick, self.logins, self.codes = served, untick, 0, []
        self.result: AuthorizationCodeResult | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
            q = await _authorize_in_browser(http, self.served, authorization_url, untick=self.untick)
        self.logins += 1
        self.codes.append(q["code"])
        self.result = AuthorizationCodeResult(code=q["code"], state=q.get("state"), iss=q.get("iss"))

    async def callback_handler(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result


# --- raw OAuth and MCP requests ---


async def _register(http: httpx2.AsyncClient, served: Served, redirect_uri: str = REDIRECT_URI) -> dict[str, Any]:
    body = {
        "client_name": "raw client",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_post",
    }
    r = await http.post(served.local + "/register", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


def _authorize_url(served: Served, client: dict[str, Any], challenge: str, **extra: str) -> str:
    q = {
        "response_type": "code",
        "client_id": client["client_id"],
        "redirect_uri": REDIRECT_URI,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "s1",
        "resource": served.public + "/mcp",
    }
    return served.local + "/authorize?" + urlencode({**q, **extra})


async def _code(http: httpx2.AsyncClient, served: Served, client: dict[str, Any], **extra: str) -> tuple[str, str]:
    """(authorization code, its PKCE verifier), through sign-in and consent."""
    verifier, challenge = _pkce()
    q = await _authorize_in_browser(http, served, _authorize_url(served, client, challenge, **extra))
    assert q["state"] == "s1" and q["iss"] == served.public
    return q["code"], verifier


async def _exchange(
    http: httpx2.AsyncClient, served: Served, client: dict[str, Any], code: str, verifier: str
) -> httpx2.Response:
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": REDIRECT_URI,
        "client_id": client["client_id"],
        "client_secret": client["client_secret"],
    }
    return await http.post(served.local + "/token", data=data)


async def _refresh(http: httpx2.AsyncClient, served: Served, client: dict[str, Any], refresh_token: str) -> httpx2.Response:
    data = {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "client_id": client["client_id"],
        "client_secret": client["client_secret"],
    }
    return await http.post(served.local + "/token", data=data)


async def _initialize(http: httpx2.AsyncClient, url: str, token: str, **headers: str) -> httpx2.Response:
    return await http.post(url, json=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {token}", **headers})


def _stored_client(served: Served, client_id: str) -> str:
    served.store.register_client({"client_id": client_id, "client_name": client_id, "redirect_uris": [REDIRECT_URI]})
    return client_id


def _security_headers_ok(r: httpx2.Response, consent: bool = False) -> None:
    """The pages' headers; the consent page has no form-action (its answer leaves for the client, whose own callback
    may redirect on to an app's scheme: claude:// for the Claude apps)."""
    form_action = "" if consent else " form-action 'self';"
    csp = f"{EXPECTED_CSP_PREFIX}{form_action} frame-ancestors 'none'; base-uri 'none'"
    assert r.headers["content-security-policy"] == csp
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"


# --- the whole flow ---


def test_oauth_flow_runs_end_to_end_with_the_sdk_client(served, caplog):
    caplog.set_level(logging.INFO)
    mcp_url = served.local + "/mcp"

    async def main() -> tuple[MemoryStorage, OAuthToken, list[str]]:
        async with httpx2.AsyncClient(timeout=10) as raw:
            r = await raw.post(mcp_url, json=INIT, headers=MCP_HEADERS)
            assert r.status_code == 401
            assert (
                f'resource_metadata="{served.public}/.well-known/oauth-protected-resource/mcp"' in r.headers["www-authenticate"]
            )
        storage, browser = MemoryStorage(), Browser(served, untick=["notes:private"])
        metadata = OAuthClientMetadata(
            client_name="<b>SDK</b> client",
            redirect_uris=[REDIRECT_URI],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="client_secret_post",
        )
        oauth = OAuthClientProvider(
            server_url=mcp_url,
            client_metadata=metadata,
            storage=storage,
            redirect_handler=browser.redirect_handler,
            callback_handler=browser.callback_handler,
        )
        async with httpx2.AsyncClient(auth=oauth, timeout=30) as http:
            async with Client(streamable_http_client(mcp_url, http_client=http)) as client:
                tools = await client.list_tools()
                assert {t.name for t in tools.tools} == {"whoami", "echo"}
                who = await client.call_tool("whoami", {})
                assert storage.client_info is not None and storage.tokens is not None
                # Registered with all three scopes (PRM scopes_supported); the owner unticked notes:private.
                assert storage.client_info.scope == " ".join(SCOPES)
                assert who.structured_content == {
                    "client_id": storage.client_info.client_id,
                    "scopes": ["notes:read", "notes:append"],
                }
                first = storage.tokens
                oauth.context.token_expiry_time = time.time() - 1  # the client refreshes only on its own expiry
                echoed = await client.call_tool("echo", {"text": "after refresh"})
                assert echoed.content[0].text == "after refresh"
                assert storage.tokens.access_token != first.access_token
                assert storage.tokens.refresh_token != first.refresh_token
                assert browser.logins == 1  # refreshed, not re-authorized
        info, tokens = storage.client_info, storage.tokens
        async with httpx2.AsyncClient(timeout=10) as raw:
            assert (await _initialize(raw, mcp_url, tokens.access_token)).status_code == 200
            revoke = {"token": tokens.refresh_token, "token_type_hint": "refresh_token"}
            r = await raw.post(
                served.local + "/revoke", data={**revoke, "client_id": info.client_id, "client_secret": info.client_secret}
            )
            assert r.status_code == 200
            assert (await _initialize(raw, mcp_url, tokens.access_token)).status_code == 401
            assert (await _initialize(raw, mcp_url, first.access_token)).status_code == 401
        return storage, first, browser.codes

    storage, first, codes = anyio.run(main)
    assert storage.client_info and storage.tokens
    assert ("POST", "/mcp", 200, storage.client_info.client_id) in served.requests
    leaks = [
        PASSPHRASE,
        *codes,
        storage.tokens.access_token,
        storage.tokens.refresh_token,
        first.access_token,
        first.refresh_token,
    ]
    assert not [s for s in leaks + [storage.client_info.client_secret] if s and s in caplog.text]


# --- refusals at /authorize and /token ---


def test_token_refuses_a_wrong_pkce_verifier(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            code, _ = await _code(http, served, client)
            r = await _exchange(http, served, client, code, "w" * 43)
            assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
            assert "access_token" not in r.text

    anyio.run(main)


def test_authorize_refuses_plain_pkce(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            r = await http.get(_authorize_url(served, client, "x" * 43, code_challenge_method="plain"))
            assert r.status_code == 302
            assert r.headers["location"].startswith(REDIRECT_URI)
            assert _query(r.headers["location"])["error"] == "invalid_request"

    anyio.run(main)


def test_authorize_refuses_another_resource_and_defaults_a_missing_one(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            r = await http.get(_authorize_url(served, client, "x" * 43, resource="https://other.example/mcp"))
            assert r.status_code == 302 and _query(r.headers["location"])["error"] == "invalid_target"
            for resource in (served.public + "/mcp/", None):
                url = _authorize_url(served, client, "x" * 43, **({"resource": resource} if resource else {}))
                if resource is None:
                    url = url.replace("&resource=" + quote(served.public + "/mcp", safe=""), "")
                r = await http.get(url)
                assert r.status_code == 302 and r.headers["location"].startswith(served.public + "/login?req=")

    anyio.run(main)


def test_code_replay_is_refused_and_revokes_the_tokens_it_gave(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            code, verifier = await _code(http, served, client)
            r = await _exchange(http, served, client, code, verifier)
            assert r.status_code == 200
            tokens = r.json()
            assert (await _initialize(http, served.local + "/mcp", tokens["access_token"])).status_code == 200
            r = await _exchange(http, served, client, code, verifier)
            assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
            assert (await _initialize(http, served.local + "/mcp", tokens["access_token"])).status_code == 401
            assert (await _refresh(http, served, client, tokens["refresh_token"])).status_code == 400

    anyio.run(main)


def test_refresh_reuse_revokes_the_whole_family(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            first = (await _exchange(http, served, client, *await _code(http, served, client))).json()
            r = await _refresh(http, served, client, first["refresh_token"])
            assert r.status_code == 200
            second = r.json()
            assert (await _initialize(http, served.local + "/mcp", second["access_token"])).status_code == 200
            r = await _refresh(http, served, client, first["refresh_token"])  # stolen and replayed
            assert r.status_code == 400 and r.json()["error"] == "invalid_grant"
            assert (await _initialize(http, served.local + "/mcp", second["access_token"])).status_code == 401
            assert (await _refresh(http, served, client, second["refresh_token"])).status_code == 400

    anyio.run(main)


def test_token_refuses_an_unknown_client_with_401(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            code, verifier = await _code(http, served, client)
            r = await _exchange(http, served, {"client_id": "nope", "client_secret": "x"}, code, verifier)
            assert r.status_code == 401 and r.json()["error"] == "invalid_client"
            r = await _exchange(http, served, {**client, "client_secret": "wrong"}, code, verifier)
            assert r.status_code == 401 and r.json()["error"] == "invalid_client"

    anyio.run(main)


def test_consent_grants_only_offered_scopes_and_always_read(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            verifier, challenge = _pkce()
            # Asked for append only; the form is tampered with to add notes:private, which was never offered.
            url = _authorize_url(served, client, challenge, scope="notes:append")
            q = await _authorize_in_browser(http, served, url, add=["notes:private"])
            consent = [(d["client_id"], d["client_name"], d["scopes"]) for name, d in served.events if name == "consent"]
            assert consent == [(client["client_id"], "raw client", ["notes:read", "notes:append"])]
            assert q["code"] not in repr(served.events)
            r = await _exchange(http, served, client, q["code"], verifier)
            assert r.status_code == 200 and r.json()["scope"] == "notes:read notes:append"

    anyio.run(main)


def test_consent_deny_redirects_with_access_denied_and_spends_the_request(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            r = await _sign_in(http, served, await _start(http, _authorize_url(served, client, "x" * 43)))
            consent_url = r.headers["location"]
            r = await _consent(http, consent_url, decision="deny")
            assert r.status_code == 302
            assert _query(r.headers["location"]) == {"error": "access_denied", "state": "s1", "iss": served.public}
            assert (await http.get(consent_url)).status_code == 400
            decided = [(name, detail["client_id"]) for name, detail in served.events if name.startswith("consent")]
            assert decided == [("consent_denied", client["client_id"])]

    anyio.run(main)


# --- refusals at /mcp ---


def test_mcp_refuses_a_token_for_another_resource(served):
    async def main() -> None:
        client_id = _stored_client(served, "c-a")
        ours = served.store.issue_tokens(client_id, ["notes:read"], served.public + "/mcp")
        other = served.store.issue_tokens(client_id, ["notes:read"], "https://other.example/mcp")
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await _initialize(http, served.local + "/mcp", ours.access_token)).status_code == 200
            assert (await _initialize(http, served.local + "/mcp", other.access_token)).status_code == 401

    anyio.run(main)


def test_mcp_refuses_an_expired_access_token(served):
    async def main() -> None:
        pair = served.store.issue_tokens(_stored_client(served, "c-a"), ["notes:read"], served.public + "/mcp")
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await _initialize(http, served.local + "/mcp", pair.access_token)).status_code == 200
            served.clock.advance(kb_authstore.ACCESS_TTL_S + 1)
            r = await _initialize(http, served.local + "/mcp", pair.access_token)
            assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]

    anyio.run(main)


def test_mcp_refuses_a_token_without_notes_read(served):
    async def main() -> None:
        pair = served.store.issue_tokens(_stored_client(served, "c-a"), ["notes:append"], served.public + "/mcp")
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await _initialize(http, served.local + "/mcp", pair.access_token)
            assert r.status_code == 403 and 'error="insufficient_scope"' in r.headers["www-authenticate"]

    anyio.run(main)


def test_session_refuses_another_clients_token(served):
    async def main() -> None:
        a = served.store.issue_tokens(_stored_client(served, "c-a"), ["notes:read"], served.public + "/mcp")
        b = served.store.issue_tokens(_stored_client(served, "c-b"), ["notes:read"], served.public + "/mcp")
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await _initialize(http, served.local + "/mcp", a.access_token)
            session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
            as_b = {**MCP_HEADERS, **session, "Authorization": f"Bearer {b.access_token}"}
            assert (await http.post(served.local + "/mcp", json=listing, headers=as_b)).status_code == 404
            as_a = {**MCP_HEADERS, **session, "Authorization": f"Bearer {a.access_token}"}
            assert (await http.post(served.local + "/mcp", json=listing, headers=as_a)).status_code == 200

    anyio.run(main)


def test_mcp_with_trailing_slash_is_served_not_redirected(served):
    async def main() -> None:
        pair = served.store.issue_tokens(_stored_client(served, "c-a"), ["notes:read"], served.public + "/mcp")
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.post(served.local + "/mcp/", json=INIT, headers=MCP_HEADERS)).status_code == 401
            assert (await _initialize(http, served.local + "/mcp/", pair.access_token)).status_code == 200

    anyio.run(main)


# --- refusals at sign-in and consent ---


def test_login_locks_after_five_failures_even_for_the_right_passphrase(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            page = await http.get(await _start(http, _authorize_url(served, client, "x" * 43)))
            form = _Form(page.text)
            for attempt in range(5):
                r = await http.post(form.action, data={**form.hidden, "passphrase": "hunter2-not-it", "code": "123456"})
                if attempt < 4:
                    assert r.status_code == 401 and "wrong passphrase or code" in r.text
                    assert "hunter2-not-it" not in r.text and "123456" not in r.text
            assert r.status_code == 429
            r = await http.post(form.action, data={**form.hidden, "passphrase": PASSPHRASE, "code": served.next_code()})
            assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
            assert "Try again in about" in r.text and "location" not in r.headers

    anyio.run(main)


def test_login_refuses_a_totp_code_used_before(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            code = served.next_code()
            r = await _sign_in(http, served, await _start(http, _authorize_url(served, client, "x" * 43)), code=code)
            assert r.status_code == 303
            r = await _sign_in(http, served, await _start(http, _authorize_url(served, client, "x" * 43)), code=code)
            assert r.status_code == 401 and "wrong passphrase or code" in r.text

    anyio.run(main)


def test_login_and_consent_refuse_a_wrong_csrf_token(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            login_url = await _start(http, _authorize_url(served, client, "x" * 43))
            form = _Form((await http.get(login_url)).text)
            good = {**form.hidden, "passphrase": PASSPHRASE, "code": served.next_code()}
            assert (await http.post(form.action, data={**good, "csrf": "x" * 43})).status_code == 403
            async with httpx2.AsyncClient(timeout=10) as stranger:  # the right field, but no cookie
                assert (await stranger.post(form.action, data=good)).status_code == 403
            r = await http.post(form.action, data={**good, "code": served.next_code()})
            assert r.status_code == 303
            consent = _Form((await http.get(r.headers["location"])).text)
            r = await http.post(consent.action, data={**consent.hidden, "csrf": "x" * 43, "decision": "allow"})
            assert r.status_code == 403 and "location" not in r.headers

    anyio.run(main)


def test_consent_refuses_a_browser_that_did_not_sign_in_for_that_request(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as owner, httpx2.AsyncClient(timeout=10) as attacker:
            client = await _register(owner, served)
            r = await _sign_in(owner, served, await _start(owner, _authorize_url(served, client, "x" * 43)))
            consent_url = r.headers["location"]
            # Another browser, holding its own valid CSRF pair (from the same request's sign-in page).
            assert (await attacker.get(consent_url)).status_code == 403
            form = _Form((await attacker.get(consent_url.replace("/consent", "/login"))).text)
            r = await attacker.post(served.local + "/consent", data={**form.hidden, "decision": "allow"})
            assert r.status_code == 403 and "location" not in r.headers
            # The owner's browser, signed in for the first request only, cannot consent to a second one.
            other = await _start(owner, _authorize_url(served, client, "y" * 43))
            assert (await owner.get(other.replace("/login", "/consent"))).status_code == 403
            r = await _consent(owner, consent_url)
            assert r.status_code == 302 and "code" in _query(r.headers["location"])

    anyio.run(main)


# --- registration ---


def test_register_refuses_an_http_redirect_off_loopback(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            body = {
                "redirect_uris": ["http://evil.example/cb"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
            }
            r = await http.post(served.local + "/register", json=body)
            assert r.status_code == 400 and r.json()["error"] == "invalid_redirect_uri"
            assert served.store.list_clients() == []

    anyio.run(main)


def test_register_refuses_the_101st_client_without_naming_server_paths(served):
    for n in range(kb_authstore.MAX_CLIENTS):
        _stored_client(served, f"c{n}")

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            body = {"redirect_uris": [REDIRECT_URI], "grant_types": ["authorization_code"], "response_types": ["code"]}
            r = await http.post(served.local + "/register", json=body)
            assert r.status_code == 400 and r.json()["error"] == "invalid_client_metadata"
            assert str(served.store.folder) not in r.text

    anyio.run(main)


# --- metadata, pages and configuration ---


def test_metadata_urls_come_from_public_url_not_the_host_header(tunnel):
    public = "https://notes.example.com"

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            for host in ("notes.example.com", "evil.example"):
                asm = (await http.get(tunnel.local + "/.well-known/oauth-authorization-server", headers={"Host": host})).json()
                assert asm["issuer"] == public
                assert [
                    asm[k] for k in ("authorization_endpoint", "token_endpoint", "registration_endpoint", "revocation_endpoint")
                ] == [public + p for p in ("/authorize", "/token", "/register", "/revoke")]
                prm = (await http.get(tunnel.local + "/.well-known/oauth-protected-resource/mcp", headers={"Host": host})).json()
                assert prm["resource"] == public + "/mcp" and prm["authorization_servers"] == [public]
                assert prm["scopes_supported"] == list(SCOPES)
                r = await http.post(tunnel.local + "/mcp", json=INIT, headers={**MCP_HEADERS, "Host": host})
                assert r.status_code == 401
                assert f'resource_metadata="{public}/.well-known/oauth-protected-resource/mcp"' in r.headers["www-authenticate"]

    anyio.run(main)


def test_protected_resource_metadata_is_served_with_and_without_the_mcp_suffix(tunnel):
    public = "https://notes.example.com"

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            got = []
            for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
                r = await http.get(tunnel.local + path, headers={"Host": "evil.example"})
                assert r.status_code == 200, (path, r.status_code)
                got.append(r.json())
            assert got[0] == got[1]
            assert got[0]["resource"] == public + "/mcp" and got[0]["authorization_servers"] == [public]

    anyio.run(main)


def test_mcp_behind_a_tunnel_accepts_only_the_public_host(tunnel):
    async def main() -> None:
        pair = tunnel.store.issue_tokens(_stored_client(tunnel, "c-a"), ["notes:read"], tunnel.public + "/mcp")
        async with httpx2.AsyncClient(timeout=10) as http:
            mcp_url = tunnel.local + "/mcp"
            assert (await _initialize(http, mcp_url, pair.access_token, Host="notes.example.com")).status_code == 200
            r = await _initialize(http, mcp_url, pair.access_token, Host="notes.example.com", Origin="https://evil.example")
            assert r.status_code == 403
            assert (await _initialize(http, mcp_url, pair.access_token, Host=urlsplit(tunnel.local).netloc)).status_code == 421

    anyio.run(main)


def test_pages_behind_https_set_secure_host_cookies_and_public_actions(tunnel):
    async def main() -> None:
        client = {"client_id": _stored_client(tunnel, "c-a")}
        async with httpx2.AsyncClient(timeout=10) as http:
            login_url = await _start(http, _authorize_url(tunnel, client, "x" * 43))
            assert login_url.startswith("https://notes.example.com/login?req=")
            r = await http.get(tunnel.local + "/login?" + urlsplit(login_url).query)
            assert r.status_code == 200 and _Form(r.text).action == "https://notes.example.com/login"
            cookie = r.headers["set-cookie"]
            assert cookie.startswith("__Host-kb_csrf=") and "Secure" in cookie and "HttpOnly" in cookie
            assert "samesite=lax" in cookie.lower() and "Path=/" in cookie

    anyio.run(main)


def test_pages_carry_the_security_headers(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            client = await _register(http, served)
            login_url = await _start(http, _authorize_url(served, client, "x" * 43))
            page = await http.get(login_url)
            _security_headers_ok(page)
            assert '<meta name="viewport"' in page.text and 'autocomplete="one-time-code"' in page.text
            assert 'inputmode="numeric"' in page.text
            assert not [tag for tag in ("<script", "<link", "<img", "src=") if tag in page.text]
            for cookie in page.headers.get_list("set-cookie"):
                assert "HttpOnly" in cookie and "samesite=lax" in cookie.lower() and "Secure" not in cookie
            r = await _sign_in(http, served, login_url)
            assert r.headers["cache-control"] == "no-store"
            login_cookie = [c for c in r.headers.get_list("set-cookie") if c.startswith("kb_login=")]
            assert login_cookie and "HttpOnly" in login_cookie[0] and "samesite=lax" in login_cookie[0].lower()
            consent = await http.get(r.headers["location"])
            _security_headers_ok(consent, consent=True)
            assert "raw client" in consent.text and "127.0.0.1:9" in consent.text
            assert _Form(consent.text).boxes == list(SCOPES)
            _security_headers_ok(await http.get(served.local + "/login?req=unknown"))

    anyio.run(main)


def test_consent_page_escapes_the_client_name(served):
    async def main() -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            body = {
                "client_name": '<script>alert("x")</script>',
                "redirect_uris": [REDIRECT_URI],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
            }
            client = (await http.post(served.local + "/register", json=body)).json()
            login_url = await _start(http, _authorize_url(served, client, "x" * 43))
            assert "<script>" not in (await http.get(login_url)).text
            r = await _sign_in(http, served, login_url)
            consent = await http.get(r.headers["location"])
            assert "<script>" not in consent.text and "&lt;script&gt;" in consent.text

    anyio.run(main)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("https://Notes.Example.com/", "https://notes.example.com"),
        ("https://notes.example.com:443", "https://notes.example.com"),
        ("https://notes.example.com:8443", "https://notes.example.com:8443"),
        ("http://127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("http://localhost:8765", "http://localhost:8765"),
    ],
)
def test_check_public_url_normalises_an_origin(given, expected):
    assert check_public_url(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        "http://notes.example.com",
        "http://192.168.1.5:8765",
        "https://notes.example.com/notes",
        "ftp://notes.example.com",
        "notes",
    ],
)
def test_oauth_app_refuses_a_public_url_that_is_not_https_or_loopback(tmp_path, given):
    with pytest.raises(ConfigError, match="public_url"):
        oauth_app(None, AuthStore(tmp_path / "auth"), given, "127.0.0.1")


def test_current_client_is_none_outside_an_oauth_request():
    assert current_client() is None
