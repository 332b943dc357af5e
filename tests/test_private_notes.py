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
# Longest wait for a knowledge base's start-up (sync and embedding with the hash embedder: well under a second).
STARTUP_WAIT_S = 60
# Code both notes of a translated pair hold.
COMMANDS = "`kubectl rollout undo deployment/web` `kubectl rollout history deployment/web` `kubectl rollout status`"
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
    write_note(root, "Private/todo.md", f"# Todo\n\n- {PRIVATE_WORD} feeder\n")  # private by its path, and writable
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


def _translated_vault(root: Path) -> Path:
    """Forty other notes, an English note and its Chinese translation (same path in the other language's folder, same
    headings), the translation private by its properties (kb_background.translations pairs them)."""
    for i in range(40):
        words = " ".join(f"topic{i}word{j}" for j in range(2 + i % 16))
        write_note(root, f"note{i:02}.md", f"# Note {i}\n\nbroken release {i}: {words}\n")
    write_note(root, "en/rollback.md", f"# Roll back a release\n\nRoll back a broken release: {COMMANDS}\n")
    write_note(root, "zh/rollback.md", f"---\nvisibility: private\n---\n# 回滚\n\n发布失败时回滚到上一个版本：{COMMANDS}\n")
    return root


def _kb(tmp_path: Path, vault: Path | None = None, embedder: Any = None, **overrides: Any) -> KnowledgeBase:
    """The knowledge base over `vault` (default: _vault's notes), Private/** private, two private notes writable (one
    private by its path, one by its properties); `overrides` replace Config fields."""
    vault = vault or _vault(tmp_path / "vault")
    cfg = make_config(
        vault, tmp_path / "data", private_paths=("Private/**",), writable=("inbox.md", "Private/todo.md", "projects/diary.md")
    )
    cfg = replace(cfg, **overrides) if overrides else cfg
    return KnowledgeBase(cfg, embedder or HashEmbedder())


@contextlib.contextmanager
def _serve(
    tmp_path: Path, now: Callable[[], float] = time.time, vault: Path | None = None, embedder: Any = None, **overrides: Any
) -> Iterator[Served]:
    """build_server's real tools behind oauth_app on 127.0.0.1 (uvicorn in a thread); the store's events go to the audit
    log as kb_http wires them, its clock is `now`; `overrides` replace Config fields (e.g. redact)."""
    kb = _kb(tmp_path, vault, embedder, **overrides)
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


async def _each(client: Client, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, str, Any]]:
    out = []
    for name, args in calls:
        r = await client.call_tool(name, args)
        text = "\n".join(getattr(c, "text", "") for c in r.content)
        out.append((r.is_error, text, r.structured_content))
    return out


def _calls(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, str, Any]]:
    """Each (tool, arguments) called in one session with `token`: (is_error, text, structured content)."""

    async def go() -> list[tuple[bool, str, Any]]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await _each(client, calls)

    return anyio.run(go)


def _owner_calls(kb: KnowledgeBase, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, str, Any]]:
    """Each (tool, arguments) called as a stdio session calls it: build_server's tools with no access token (the
    owner, kb_remote.access_of(None, ...)), through the SDK's client in memory."""

    async def go() -> list[tuple[bool, str, Any]]:
        async with Client(mcp_server.build_server(kb), read_timeout_seconds=60) as client:
            return await _each(client, calls)

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
    owner = _owner_calls(
        served.kb,
        [
            ("search_my_knowledge_base", {"query": "kestrel launch code word"}),
            ("read_note", {"path": "Private/Secret plan.md"}),
            ("list_notes", {"path_prefix": "Private/"}),
            ("related_notes", {"path": "projects/kestrel.md"}),
        ],
    )
    assert not any(is_error for is_error, _, _ in owner), owner
    (_, found, _), (_, read, _), (_, listed, _), (_, related, _) = owner
    assert "Private/Secret plan.md" in found and PRIVATE_WORD in read
    assert "Private/Secret plan.md" in listed and "Private/Secret plan.md" in related


def test_append_needs_notes_append_and_never_reaches_a_private_note(served):
    reader, writer = served.token(READ), served.token(READ, APPEND)
    ((refused, text, _),) = _calls(served.url, reader, [("update_knowledge_base", {"path": "inbox.md", "content": "- x"})])
    assert refused and "notes:append" in text
    # The private note exists and is writable: only the private-note guard stands between it and the append.
    todo = served.kb.cfg.kb_dir / "Private" / "todo.md"
    before = todo.read_bytes()
    assert "Private/todo.md" in served.kb.cfg.writable
    (ok, done, _), (private, why, _) = _calls(
        served.url,
        writer,
        [
            ("update_knowledge_base", {"path": "inbox.md", "content": "- call the vet"}),
            ("update_knowledge_base", {"path": "Private/todo.md", "content": "- leak?"}),
        ],
    )
    assert not ok and "Appended" in done and private and "note 'Private/todo.md' does not exist" in why, why
    assert todo.read_bytes() == before


def test_replies_to_oauth_clients_mask_secrets_and_the_owner_sees_them(served):
    ((_, text, data),) = _calls(served.url, served.token(READ), [("read_note", {"path": "projects/kestrel.md"})])
    assert SECRET not in text + json.dumps(data) and "[redacted: anthropic key]" in text
    ((_, owner, _),) = _owner_calls(served.kb, [("read_note", {"path": "projects/kestrel.md"})])
    assert SECRET in owner and "[redacted" not in owner


@pytest.mark.parametrize(
    ("mode", "caller", "masked"),
    [
        ("remote", "owner", False),
        ("remote", "client", True),
        ("never", "owner", False),
        ("never", "client", False),
        ("always", "owner", True),
        ("always", "client", True),
    ],
)
def test_server_redact_masks_a_reply_only_when_the_mode_covers_its_caller(tmp_path, mode, caller, masked):
    read = [("read_note", {"path": "projects/kestrel.md"})]
    with _serve(tmp_path, redact=mode) as s:
        ((is_error, text, data),) = _owner_calls(s.kb, read) if caller == "owner" else _calls(s.url, s.token(READ), read)
    assert not is_error, text
    blob = text + json.dumps(data)
    assert (SECRET not in blob) is masked and ("[redacted: anthropic key]" in text) is masked, text


def test_search_never_names_a_private_translation_to_a_client_without_notes_private(tmp_path):
    """A found note's translation comes from the translation step (kb_background.translations, a multilingual model
    only), not from the filtered lists: it must be filtered there too."""
    vault = _translated_vault(tmp_path / "tr")
    query = [("search_my_knowledge_base", {"query": "roll back a broken release", "mode": "hybrid", "top_k": 5})]
    with _serve(tmp_path, vault=vault, embedder=HashEmbedder(name="multilingual-hash")) as s:
        s.kb.start()  # (once: the server's lifespan started it too) the step needs every note's vectors
        assert s.kb.live.startup_done.wait(STARTUP_WAIT_S) and s.kb.live.engine.pending_vectors == 0
        ((_, _, owner),) = _owner_calls(s.kb, query)
        ((_, _, allowed),) = _calls(s.url, s.token(READ, PRIVATE), query)
        ((is_error, text, data),) = _calls(s.url, s.token(READ), query)
    for seen in (owner, allowed):  # the step runs: the private note is the English one's translation
        assert (seen["hits"][0]["path"], seen["hits"][0]["translation"]) == ("en/rollback.md", "zh/rollback.md")
    assert not is_error and data["hits"][0]["path"] == "en/rollback.md"
    assert "zh/rollback.md" not in text + json.dumps(data, ensure_ascii=False) and "回滚" not in text


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
