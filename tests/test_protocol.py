"""The MCP protocol in-process: the SDK's own client connected to build_server's MCPServer in memory (STYLE section 8),
for what a subprocess is not the point of: schemas, argument limits, alternatives, tool errors, the vault profile.
A counting hash embedder stands in for the model; real files, real jieba and the real index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kb_fixtures import make_config

import mcp_server
from kb_search import MAX_ALTERNATIVE_CHARS, MAX_ALTERNATIVES
from kb_vectors import HashEmbedder

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(sample_vault: Path, tmp_path: Path) -> AsyncIterator[Any]:
    from mcp import Client

    cfg = make_config(sample_vault, tmp_path / "data", writable=("inbox.md",))
    kb = mcp_server.KnowledgeBase(cfg, embedder=HashEmbedder())
    try:
        async with Client(mcp_server.build_server(kb), read_timeout_seconds=60) as connected:
            yield connected
    finally:
        kb.shutdown()


async def _ok(client: Any, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def _error(client: Any, tool: str, args: dict[str, Any]) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool}({args}) answered instead of refusing"
    return result.content[0].text


async def test_search_schema_invites_alternatives_with_their_limits(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    alternatives = tools["search_my_knowledge_base"].input_schema["properties"]["alternatives"]
    described = alternatives["description"].lower()
    assert "other language" in described and "keyword" in described  # what the calling model is asked to write
    assert str(MAX_ALTERNATIVES) in alternatives["description"]


@pytest.mark.parametrize(
    "alternatives, fragment",
    [
        (["a", "b", "c", "d", "e"], f"at most {MAX_ALTERNATIVES}"),
        (["x" * (MAX_ALTERNATIVE_CHARS + 1)], f"{MAX_ALTERNATIVE_CHARS} characters"),
    ],
    ids=["too-many", "too-long"],
)
async def test_search_refuses_alternatives_over_the_limit_with_a_tool_error_that_says_it(client, alternatives, fragment):
    text = await _error(client, "search_my_knowledge_base", {"query": "backup", "alternatives": alternatives})
    assert fragment in text
    assert (await _ok(client, "index_status"))["notes"] > 0  # the server keeps answering


async def test_search_with_alternatives_says_which_strings_found_each_hit(client):
    data = await _ok(
        client,
        "search_my_knowledge_base",
        {"query": "备份策略", "alternatives": ["backup strategy", "restic"], "mode": "keyword"},
    )
    assert data["alternatives"] == ["backup strategy", "restic"]
    assert data["hits"], data
    found_by = {s for h in data["hits"] for s in h["found_by"]}
    assert found_by & {"alt 1", "alt 2"}  # the English strings found notes too


async def test_index_status_describes_the_vault_for_the_client(client):
    vault = (await _ok(client, "index_status"))["vault"]
    assert set(vault["languages"]) == {"en", "zh"}  # the sample vault is bilingual
    assert vault["folders"] and all(n > 0 for n in vault["folders"].values())


async def test_an_append_is_found_by_the_next_search_in_process(client):
    await _ok(client, "update_knowledge_base", {"path": "inbox.md", "content": "- the okapi enclosure needs a new gate"})
    data = await _ok(client, "search_my_knowledge_base", {"query": "okapi enclosure", "mode": "keyword"})
    assert [h["path"] for h in data["hits"]][:1] == ["inbox.md"]
    text = await _error(client, "update_knowledge_base", {"path": "projects/homelab/Homelab.md", "content": "- no"})
    assert "whitelist" in text and "not writable" in text


@pytest.mark.parametrize("collector_on", [True, False])
def test_build_server_freezes_the_sdks_objects_and_leaves_the_collector_as_it_was(sample_vault, tmp_path, collector_on):
    import gc

    kb = mcp_server.KnowledgeBase(make_config(sample_vault, tmp_path / "data"), embedder=HashEmbedder())
    frozen = gc.get_freeze_count()
    if not collector_on:
        gc.disable()
    try:
        mcp_server.build_server(kb)
        assert gc.isenabled() is collector_on  # a collector left off would grow the server's memory for good
        assert gc.get_freeze_count() > frozen  # the tools' schemas, out of every later collection's walk
    finally:
        gc.enable()
        gc.unfreeze()
        kb.shutdown()
