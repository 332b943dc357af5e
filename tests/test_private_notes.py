"""Scopes, private notes, secret redaction and the audit log (issue 51, parts 2-4), through the real tools of
mcp_server.build_server behind kb_oauth over real HTTP on loopback: a client without notes:private never sees a private
note in any tool; one without notes:append cannot append; an OAuth client's replies mask secrets; every call leaves an
audit line. The owner (no OAuth token: stdio, the static token) sees everything, unmasked."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from kb_fixtures import free_port, make_config, serving, write_note
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_oauth import PASSPHRASE

import mcp_server
from kb_audit import AuditLog
from kb_authstore import AuthStore
from kb_oauth import oauth_app
from kb_redact import redact
from kb_tools import KnowledgeBase
from kb_vectors import HashEmbedder

# A secret shaped like an Anthropic key, built here so no literal key sits in the source.
SECRET = "sk-ant-api03-" + "Q7x" * 30 + "AA"
PRIVATE_WORD = "albatross"  # only in private notes: finding it anywhere in a reply is a leak
READ, APPEND, PRIVATE = "notes:read", "notes:append", "notes:private"

pytestmark = pytest.mark.usefixtures("cheap_scrypt")


def _vault(root: Path) -> Path:
    write_note(root, "inbox.md", "# Inbox\n\n- buy kestrel feeder\n")
    write_note(
        root,
        "projects/kestrel.md",
        "# Kestrel launch\n\nThe kestrel launch plan is in [[Secret plan]]; see also [[Launch log]].\n\n"
        "![[Secret plan]]\n\nThe staging key is api_key = " + SECRET + "\n",
    )
    write_note(root, "projects/launch log.md", "# Launch log\n\nKestrel launch went well. Back to [[Kestrel launch]].\n")
    write_note(root, "Private/Secret plan.md", f"# Secret plan\n\nKestrel launch code word: {PRIVATE_WORD}.\n")
    write_note(
        root,
        "projects/diary.md",
        f"---\nvisibility: private\n---\n# Kestrel diary\n\nKestrel launch nerves; code word {PRIVATE_WORD}. See [[Kestrel launch]].\n",
    )
    return root


class Served:
    """The running server: its /mcp URL, auth store, audit log, knowledge base and the owner's TOTP secret."""

    def __init__(self, url: str, store: AuthStore, audit: AuditLog, kb: KnowledgeBase, secret: str) -> None:
        self.url, self.store, self.audit, self.kb, self.secret = url, store, audit, kb, secret

    def token(self, *scopes: str, name: str = "Claude") -> str:
        """An access token of a newly registered client holding `scopes`."""
        client_id = f"client-{len(self.store.list_clients())}"
        self.store.register_client(
            {"client_id": client_id, "client_name": name, "redirect_uris": ["https://claude.ai/api/mcp/auth_callback"]}
        )
        return self.store.issue_tokens(client_id, list(scopes), self.url).access_token


@contextlib.contextmanager
def _serve(tmp_path: Path, now: Callable[[], float] = time.time) -> Iterator[Served]:
    """build_server's real tools behind oauth_app on 127.0.0.1 (uvicorn in a thread); the store's events go to the audit
    log as kb_http wires them, its clock is `now`."""
    vault = _vault(tmp_path / "vault")
    cfg = replace(make_config(vault, tmp_path / "data"), private_paths=("Private/**",), writable=("inbox.md", "Private/todo.md"))
    kb = KnowledgeBase(cfg, HashEmbedder())
    audit = AuditLog(tmp_path / "auth", mask=redact)
    store = AuthStore(tmp_path / "auth", now=now, on_event=lambda event, detail: audit.record_auth(event, **detail))
    secret = store.set_owner(PASSPHRASE).secret_b32
    names = {}

    def client_name(client_id: str) -> str | None:
        if client_id not in names:
            info = store.get_client(client_id)
            names[client_id] = info.get("client_name") if info else None
        return names[client_id]

    server = mcp_server.build_server(kb, audit=audit, client_name=client_name)
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    app = oauth_app(server, store, public, "127.0.0.1")
    with serving(app, port):
        yield Served(public + "/mcp", store, audit, kb, secret)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    with _serve(tmp_path_factory.mktemp("private")) as s:
        yield s


def _calls(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, str, Any]]:
    """Each (tool, arguments) called in one session with `token`: (is_error, text, structured content)."""

    async def go() -> list[tuple[bool, str, Any]]:
        out = []
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                for name, args in calls:
                    r = await client.call_tool(name, args)
                    text = "\n".join(getattr(c, "text", "") for c in r.content)
                    out.append((r.is_error, text, r.structured_content))
        return out

    return anyio.run(go)


EVERY_TOOL = [
    ("search_my_knowledge_base", {"query": "kestrel launch code word", "alternatives": ["code word", "Secret plan"]}),
    ("search_my_knowledge_base", {"query": "[[Secret plan]] code word"}),
    ("search_my_knowledge_base", {"query": "kestrel", "mode": "keyword", "top_k": 10}),
    ("list_notes", {}),
    ("list_notes", {"path_prefix": "Private/"}),
    ("related_notes", {"path": "projects/kestrel.md"}),
    ("related_notes", {"path": "projects/launch log.md"}),
    ("read_note", {"path": "projects/kestrel.md", "expand_embeds": True}),
    ("index_status", {}),
]


def test_a_client_without_notes_private_sees_no_private_note_through_any_tool(served):
    replies = _calls(served.url, served.token(READ), EVERY_TOOL)
    for (name, args), (is_error, text, data) in zip(EVERY_TOOL, replies):
        assert not is_error, (name, text)
        blob = text + json.dumps(data, ensure_ascii=False)
        for leak in (PRIVATE_WORD, "Secret plan.md", "Secret%20plan", "diary.md"):
            assert leak not in blob, (name, args, leak, text)
    status = replies[-1][2]
    assert status["notes"] == 3 and "Private" not in json.dumps(status["vault"])
    assert "projects/kestrel.md" in replies[0][1]  # the public notes are found as before


def test_reading_a_private_note_answers_as_a_missing_note_does(served):
    token = served.token(READ)
    got = _calls(
        served.url,
        token,
        [
            ("read_note", {"path": "Private/Secret plan.md"}),
            ("read_note", {"path": "projects/diary.md"}),
            ("read_note", {"path": "Private/no such note.md"}),
            ("related_notes", {"path": "Private/Secret plan.md"}),
            ("related_notes", {"path": "Private/no such note.md"}),
        ],
    )
    (e1, private, _), (e2, by_property, _), (e3, missing, _), (e4, rel_private, _), (e5, rel_missing, _) = got
    assert e1 and e2 and e3 and e4 and e5
    assert private == missing.replace("no such note", "Secret plan")
    assert by_property == missing.replace("Private/no such note", "projects/diary")
    assert rel_private == rel_missing.replace("no such note", "Secret plan")


def test_a_client_with_notes_private_and_the_owner_see_private_notes(served):
    token = served.token(READ, PRIVATE)
    (_, found, _), (_, read, _) = _calls(
        served.url,
        token,
        [("search_my_knowledge_base", {"query": "kestrel launch code word"}), ("read_note", {"path": "Private/Secret plan.md"})],
    )
    assert "Private/Secret plan.md" in found and PRIVATE_WORD in read
    owner, _ = served.kb.read_note("Private/Secret plan.md", None, 1)  # stdio: no token, the owner
    assert PRIVATE_WORD in owner


def test_append_needs_notes_append_and_never_reaches_a_private_note(served):
    reader, writer = served.token(READ), served.token(READ, APPEND)
    ((refused, text, _),) = _calls(served.url, reader, [("update_knowledge_base", {"path": "inbox.md", "content": "- x"})])
    assert refused and "notes:append" in text
    (ok, done, _), (private, why, _) = _calls(
        served.url,
        writer,
        [
            ("update_knowledge_base", {"path": "inbox.md", "content": "- call the vet"}),
            ("update_knowledge_base", {"path": "Private/todo.md", "content": "- leak?"}),
        ],
    )
    assert not ok and "Appended" in done and private and "does not exist" in why
    assert not (served.kb.cfg.kb_dir / "Private" / "todo.md").exists()


def test_replies_to_oauth_clients_mask_secrets_and_the_owner_sees_them(served):
    ((_, text, data),) = _calls(served.url, served.token(READ), [("read_note", {"path": "projects/kestrel.md"})])
    assert SECRET not in text + json.dumps(data) and "[redacted: anthropic key]" in text
    owner, _ = served.kb.read_note("projects/kestrel.md", None, 1)
    assert SECRET in owner


def test_every_tool_call_leaves_one_audit_line_without_secrets(served):
    token = served.token(READ, name="Phone")
    before = len(served.audit.tail(10_000))
    _calls(
        served.url,
        token,
        [
            ("search_my_knowledge_base", {"query": "staging key " + SECRET}),
            ("read_note", {"path": "Private/Secret plan.md"}),
        ],
    )
    lines = served.audit.tail(10_000)[before:]
    assert [(r["tool"], r["ok"], r["client_name"]) for r in lines] == [
        ("search_my_knowledge_base", True, "Phone"),
        ("read_note", False, "Phone"),
    ]
    assert "projects/kestrel.md" in lines[0]["paths"] and lines[0]["ms"] > 0
    raw = "".join(p.read_text(encoding="utf-8") for p in served.audit.folder.glob("audit.jsonl*"))
    assert SECRET not in raw and token not in raw
