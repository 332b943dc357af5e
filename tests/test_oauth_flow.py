"""The whole OAuth flow (issue 51, "Done means") over real HTTP on loopback, with the SDK's own OAuth client, against the
real tools of mcp_server.build_server: discovery from a 401, registration, sign-in with passphrase and TOTP, consent to
notes:read only, a real search, a forced refresh, revocation, and the audit log it leaves (names, events, no secrets)."""

from __future__ import annotations

import time

import anyio
import httpx2
import pytest
from kb_fixtures import Clock
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata, OAuthToken
from test_oauth import INIT, MCP_HEADERS, PASSPHRASE, REDIRECT_URI, Browser, MemoryStorage, _initialize
from test_oauth import Served as Owner
from test_private_notes import APPEND, PRIVATE, PRIVATE_WORD, _serve

CLIENT_NAME = "Flow test client"
TOOLS = {"search_my_knowledge_base", "update_knowledge_base", "read_note", "list_notes", "related_notes", "index_status"}

pytestmark = pytest.mark.usefixtures("cheap_scrypt")


def test_oauth_flow_serves_the_real_tools_and_audits_without_secrets(tmp_path):
    clock = Clock()
    with _serve(tmp_path, now=clock) as served:
        base = served.url.removesuffix("/mcp")
        # The owner's browser: signs in with a fresh TOTP code computed from the secret, ticks notes:read only.
        browser = Browser(Owner(base, base, served.store, clock, served.secret), untick=[APPEND, PRIVATE])
        storage = MemoryStorage()
        issued: list[OAuthToken] = []

        async def main() -> None:
            async with httpx2.AsyncClient(timeout=10) as raw:
                r = await raw.post(served.url, json=INIT, headers=MCP_HEADERS)
                assert r.status_code == 401
                assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in r.headers["www-authenticate"]
            metadata = OAuthClientMetadata(
                client_name=CLIENT_NAME,
                redirect_uris=[REDIRECT_URI],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="client_secret_post",
            )
            oauth = OAuthClientProvider(
                server_url=served.url,
                client_metadata=metadata,
                storage=storage,
                redirect_handler=browser.redirect_handler,
                callback_handler=browser.callback_handler,
            )
            async with httpx2.AsyncClient(auth=oauth, timeout=30) as http:
                async with Client(streamable_http_client(served.url, http_client=http)) as client:
                    assert {t.name for t in (await client.list_tools()).tools} == TOOLS
                    assert browser.logins == 1 and storage.tokens is not None and storage.client_info is not None
                    assert storage.tokens.scope == "notes:read"
                    issued.append(storage.tokens)
                    found = await client.call_tool("search_my_knowledge_base", {"query": "kestrel launch code word"})
                    text = found.content[0].text
                    assert not found.is_error and "projects/kestrel.md" in text and PRIVATE_WORD not in text

                    oauth.context.token_expiry_time = time.time() - 1  # the client refreshes only on its own expiry
                    listed = await client.call_tool("list_notes", {})
                    assert not listed.is_error and "inbox.md" in listed.content[0].text
                    assert storage.tokens.access_token != issued[0].access_token
                    assert storage.tokens.refresh_token != issued[0].refresh_token
                    assert browser.logins == 1  # refreshed, not signed in again
                    issued.append(storage.tokens)

                    info = storage.client_info
                    async with httpx2.AsyncClient(timeout=10) as raw:
                        revoke = {"token": storage.tokens.refresh_token, "token_type_hint": "refresh_token"}
                        r = await raw.post(
                            base + "/revoke", data={**revoke, "client_id": info.client_id, "client_secret": info.client_secret}
                        )
                        assert r.status_code == 200
                        r = await _initialize(raw, served.url, storage.tokens.access_token)
                        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]

                    # The SDK client's next call is refused too: it signs in again (only a 401 sends it to the browser).
                    again = await client.call_tool("index_status", {})
                    assert not again.is_error and browser.logins == 2
                    issued.append(storage.tokens)

        anyio.run(main)
        info = storage.client_info
        assert info is not None and info.client_secret
        records = served.audit.tail(10_000)
        raw_bytes = b"".join(p.read_bytes() for p in served.audit.folder.glob("audit.jsonl*"))

    searches = [r for r in records if r["kind"] == "tool" and r["tool"] == "search_my_knowledge_base"]
    assert [(r["client_id"], r["client_name"], r["ok"]) for r in searches] == [(info.client_id, CLIENT_NAME, True)]
    assert "projects/kestrel.md" in searches[0]["paths"] and searches[0]["transport"] == "http"
    events = [r for r in records if r["kind"] == "auth"]
    assert [r["event"] for r in events] == ["registration", "login", "consent", "revocation", "login", "consent"]
    assert events[0]["client_id"] == info.client_id and events[0]["client_name"] == CLIENT_NAME
    assert events[3]["client_id"] == info.client_id
    consents = [(r["client_id"], r["client_name"], r["scopes"]) for r in events if r["event"] == "consent"]
    assert consents == [(info.client_id, CLIENT_NAME, ["notes:read"])] * 2  # what was granted, never the code
    assert [sorted(r) for r in events if r["event"] == "login"] == [["event", "kind", "ts"]] * 2  # no TOTP code, nothing
    secrets = [PASSPHRASE, info.client_secret, *browser.codes]
    secrets += [t for pair in issued for t in (pair.access_token, pair.refresh_token) if t]
    assert len(secrets) == 2 + 2 + 3 * 2
    assert not [s for s in secrets if s.encode() in raw_bytes]
