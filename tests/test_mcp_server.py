"""The MCP server end to end: the SDK's own client over stdio, the real bundled model, real files and Chroma.

The sample vault is indexed once per module with `ingest.py` (a template never served); each server gets a copy of
vault and index. One shared server (run with -vv and KB_LOG_LEVEL=DEBUG) answers the tests that do not need a
process of their own; every test that edits the shared vault touches only its own notes or text.
Over 500 lines for a reason: the tests share that one indexed server (a module-scoped fixture), which is what keeps
them fast; split, each file would index and start its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from kb_fixtures import REPO_ROOT, seed_sample_index, wait_until
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from kb_config import load_config
from kb_scan import scan_vault

# Generous: the first search loads the model, and this 2-core machine may be busy with other suites.
START_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 60.0
SNIPPET_CHARS = 160
MAX_RESPONSE_CHARS = 4000
TOOL_NAMES = {"search_my_knowledge_base", "update_knowledge_base", "read_note", "list_notes", "index_status", "related_notes"}
HIT_KEYS = {"path", "heading_path", "line_start", "line_end", "snippet", "score", "keyword_rank", "cosine"}


def _env(**extra: str) -> dict[str, str]:
    """The test process's environment without KB_* variables (they would override the config under test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(extra)
    return env


def _write_config(folder: Path, vault: Path, data: Path, **sections: Any) -> Path:
    cfg = {
        "kb_dir": str(vault),
        "data_dir": str(data),
        "write": {"writable": ["inbox.md"]},
        "sync": {"check_interval": 0},
        "search": {"snippet_chars": SNIPPET_CHARS, "max_response_chars": MAX_RESPONSE_CHARS},
        **sections,
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
    return path


def _hash_tree(root: Path) -> dict[str, str]:
    """sha256 of every file (and every link's target) under root; links are not followed."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture(scope="module")
def template(sample_index, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample vault and its index (built once per run by ingest.py, as a user would); copied, never served."""
    root = tmp_path_factory.mktemp("template")
    vault = root / "vault"
    shutil.copytree(sample_index[0], vault, symlinks=True)
    _write_config(root, vault, root / "data")
    seed_sample_index(sample_index, vault, root / "data")
    return root


def _clone(template: Path, dest: Path, **sections: Any) -> Path:
    """A private copy of the template's vault and index (moved to the index folder of the copy's path); its config."""
    dest.mkdir(parents=True, exist_ok=True)
    vault = dest / "vault"
    shutil.copytree(template / "vault", vault, symlinks=True)  # copy2 keeps mtimes: the index stays fresh
    config = _write_config(dest, vault, dest / "data", **sections)
    src_index = load_config(template / "config.yaml", env={}).index_dir
    shutil.copytree(src_index, load_config(config, env={}).index_dir)
    return config


class _ParseErrors(logging.Handler):
    """Collects the stdio client's complaints about stdout lines that are not JSON-RPC."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.getMessage()} {record.exc_info[1] if record.exc_info else ''}")


class Session:
    """A connected SDK client driven from sync tests through a blocking portal; every call is bounded."""

    def __init__(self, portal: Any, client: Client, errlog: Path, config: Path, stdout_errors: _ParseErrors) -> None:
        self.portal, self.client, self.errlog, self.config = portal, client, errlog, config
        self.vault = Path(load_config(config, env={}).kb_dir)
        self.stdout_errors = stdout_errors

    def _bounded(self, fn: Any, timeout: float) -> Any:
        async def run() -> Any:
            with anyio.fail_after(timeout):
                return await fn()

        return self.portal.call(run)

    def list_tools(self, timeout: float = CALL_TIMEOUT_S) -> Any:
        return self._bounded(self.client.list_tools, timeout)

    def call(self, tool: str, args: dict[str, Any] | None = None, timeout: float = CALL_TIMEOUT_S) -> Any:
        return self._bounded(lambda: self.client.call_tool(tool, args or {}), timeout)

    def ok(self, tool: str, args: dict[str, Any] | None = None, timeout: float = CALL_TIMEOUT_S) -> Any:
        result = self.call(tool, args, timeout)
        assert not result.is_error, result.content[0].text
        return result

    def search(self, query: str, **args: Any) -> dict[str, Any]:
        return self.ok("search_my_knowledge_base", {"query": query, **args}).structured_content


@contextlib.contextmanager
def mcp_session(config: Path, errlog: Path, *args: str, **env: str) -> Iterator[Session]:
    """Spawn `python mcp_server.py --config CONFIG ARGS` and connect the SDK's stdio client to it."""
    params = StdioServerParameters(
        command=sys.executable, args=["mcp_server.py", "--config", str(config), *args], cwd=str(REPO_ROOT), env=_env(**env)
    )
    parse_errors = _ParseErrors()
    stdio_logger = logging.getLogger("mcp.client.stdio")
    stdio_logger.addHandler(parse_errors)
    try:
        with errlog.open("w", encoding="utf-8") as err, start_blocking_portal() as portal:
            client = Client(stdio_client(params, errlog=err), read_timeout_seconds=START_TIMEOUT_S)
            with portal.wrap_async_context_manager(client) as connected:
                session = Session(portal, connected, errlog, config, parse_errors)
                # Warm up: the first search waits for the keyword view; then wait for the model (answers are
                # keyword-only while it loads), so every test sees the server as a user does a few seconds in.
                session.ok("search_my_knowledge_base", {"query": "warm up"}, timeout=START_TIMEOUT_S)
                loaded = _until(lambda: not session.ok("index_status").structured_content["model_loading"], START_TIMEOUT_S)
                assert loaded, "the model did not load"
                yield session
    finally:
        stdio_logger.removeHandler(parse_errors)


@pytest.fixture(scope="module")
def shared(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One server for the tests that don't need their own process, with debug logging on stderr."""
    root = tmp_path_factory.mktemp("shared")
    config = _clone(template, root)
    with mcp_session(config, root / "server.err", "-vv", KB_LOG_LEVEL="DEBUG") as session:
        yield session


def _paths(structured: dict[str, Any]) -> list[str]:
    return [h["path"] for h in structured["hits"]]


def _until(predicate: Callable[[], object], timeout_s: float = CALL_TIMEOUT_S) -> bool:
    return wait_until(predicate, timeout_s)


# ---- tools and schemas --------------------------------------------------------------------------------------------


def test_server_lists_exactly_the_six_tools_with_schemas(shared):
    tools = {t.name: t for t in shared.list_tools().tools}
    assert set(tools) == TOOL_NAMES
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object"
        assert "\n " not in tool.description  # the docstring's indentation is not sent to the model
    search = tools["search_my_knowledge_base"].input_schema
    assert search["required"] == ["query"]
    top_k = next(s for s in search["properties"]["top_k"]["anyOf"] if s.get("type") == "integer")
    assert (top_k["minimum"], top_k["maximum"]) == (1, 50)
    assert set(tools["update_knowledge_base"].input_schema["required"]) == {"path", "content"}
    assert tools["read_note"].input_schema["required"] == ["path"]
    assert not tools["index_status"].input_schema.get("required")
    assert tools["search_my_knowledge_base"].annotations.read_only_hint
    assert tools["update_knowledge_base"].annotations.read_only_hint is False


# ---- search -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "path"),
    [("restic retention policy for the NAS", "projects/homelab/Homelab.md"), ("红烧肉放多少冰糖", "resources/recipes/红烧肉.md")],
)
def test_search_finds_known_fact_in_top_3(shared, query, path):
    result = shared.ok("search_my_knowledge_base", {"query": query})
    data = result.structured_content
    assert not data["abstained"] and path in _paths(data)[:3]
    assert path in result.content[0].text
    for hit in data["hits"]:
        assert HIT_KEYS <= set(hit)
        assert 1 <= hit["line_start"] <= hit["line_end"]
        assert isinstance(hit["score"], float) and hit["heading_path"]
        assert 0 < len(hit["snippet"]) <= SNIPPET_CHARS + 2
        assert hit["keyword_rank"] is not None or hit["cosine"] is not None


def test_search_hit_lines_point_at_the_note_text(shared):
    data = shared.search("restic retention policy for the NAS", top_k=1)
    hit = data["hits"][0]
    lines = (shared.vault / hit["path"]).read_text(encoding="utf-8").split("\n")
    cited = "\n".join(lines[hit["line_start"] - 1 : hit["line_end"]])
    assert "restic forget" in cited


def test_search_marks_an_off_topic_query_low_confidence_and_still_shows_the_nearest_notes(shared):
    # How often abstaining happens is measured by eval/run_eval.py and eval/replies.py; this checks what it looks like:
    # one sentence the client reads, then the same entries as ever (the client judges; 6 of 15 answers the gate hid
    # were not among the 3 passages an abstention showed).
    result = shared.ok("search_my_knowledge_base", {"query": "who won the Champions League final last year"})
    data, text = result.structured_content, result.content[0].text
    assert data["abstained"] is True and data["hits"] and data["more"], text
    assert text.startswith('Low confidence for "who won the Champions League final last year"')
    assert "say the notes do not cover it" in text.split("\n")[0]


def test_search_puts_a_linked_note_first_and_says_where_the_link_leads(shared):
    result = shared.ok("search_my_knowledge_base", {"query": "[[Homelab]] what runs every night"})
    data, text = result.structured_content, result.content[0].text
    assert data["hits"][0]["path"] == "projects/homelab/Homelab.md"
    assert "[[Homelab]] is projects/homelab/Homelab.md" in text


def test_search_sees_edit_on_disk_without_restart(shared):
    note = shared.vault / "daily" / "2026-03-05.md"
    with note.open("a", encoding="utf-8") as f:
        f.write("\nOur quokka Bartholomew now takes xylophone lessons on Tuesdays.\n")
    data = shared.search("Bartholomew xylophone lessons")
    found = [(h["path"], h["keyword_rank"], h["cosine"]) for h in data["hits"]]
    assert "daily/2026-03-05.md" in _paths(data)[:3], (found, data["notes"])  # keyword_rank None: the edit was missed
    assert any("xylophone" in h["snippet"] for h in data["hits"])


def test_search_forgets_deleted_note_without_restart(shared):
    query = "promotion packet calibration meeting peer reviewers"
    path = "areas/career/Promotion criteria.md"
    assert path in _paths(shared.search(query))
    (shared.vault / path).unlink()
    assert path not in _paths(shared.search(query))
    assert path not in [n["path"] for n in shared.ok("list_notes", {"path_prefix": "areas/"}).structured_content["notes"]]


# ---- write-back ---------------------------------------------------------------------------------------------------


def test_update_knowledge_base_appends_and_next_search_finds_it(shared):
    text = "- Remember: the flamingo sanctuary renewal code is PINK-7734"
    inbox = shared.vault / "inbox.md"
    before = inbox.read_bytes()
    result = shared.ok("update_knowledge_base", {"path": "inbox.md", "content": text})
    assert result.structured_content["path"] == "inbox.md" and result.structured_content["duplicate"] is False
    assert "Appended" in result.content[0].text
    assert inbox.read_bytes() == before + f"\n{text}\n".encode()
    data = shared.search("flamingo sanctuary renewal code")
    assert _paths(data)[:1] == ["inbox.md"]
    # A client retrying the same call (e.g. after a timeout) does not add it twice.
    retry = shared.ok("update_knowledge_base", {"path": "inbox.md", "content": text})
    assert retry.structured_content["duplicate"] is True and "Not appended again" in retry.content[0].text
    assert inbox.read_text(encoding="utf-8").count("PINK-7734") == 1


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("projects/homelab/Homelab.md", "is not writable"),
        ("../x.md", "'..' is not allowed"),
        ("/tmp/x.md", "absolute path"),
        ("inbox.txt", "not a note"),
        (".obsidian/inbox.md", "hidden"),
    ],
)
def test_update_knowledge_base_refuses_with_reason_and_vault_unchanged(shared, path, fragment):
    outside = shared.vault.parent
    before = _hash_tree(outside)
    path = path.replace("<vault>", shared.vault.as_posix())
    result = shared.call("update_knowledge_base", {"path": path, "content": "- should never land"})
    assert result.is_error
    assert fragment in result.content[0].text
    after = _hash_tree(outside)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not {k for k in changed if k.startswith("vault")}, changed  # the whole vault, byte for byte
    assert not (outside / "x.md").exists()


# ---- bad arguments ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"query": "backup", "top_k": 0}, "top_k"),
        ({"query": "backup", "top_k": 500}, "top_k"),
        ({"query": "backup", "mode": "fuzzy"}, "mode"),
        ({"top_k": 3}, "query"),
        ({"query": ""}, "query"),
    ],
)
def test_search_rejects_bad_arguments_and_server_keeps_answering(shared, args, fragment):
    result = shared.call("search_my_knowledge_base", args)
    assert result.is_error and fragment in result.content[0].text
    assert not shared.search("backup timer")["abstained"]


def test_read_note_rejects_missing_note_and_path_outside(shared):
    for path, fragment in [("nope/missing.md", "does not exist"), ("../config.yaml", "'..' is not allowed")]:
        result = shared.call("read_note", {"path": path})
        assert result.is_error and fragment in result.content[0].text


# ---- read_note, list_notes, index_status ---------------------------------------------------------------------------


def test_read_note_returns_one_section_including_subsections(shared):
    lines = (shared.vault / "projects/homelab/Homelab.md").read_text(encoding="utf-8").split("\n")
    first = lines.index("## Nightly backup") + 1
    nxt = lines.index("## Lessons learned") + 1  # the "# /etc/..." line in between is inside a code fence
    result = shared.ok("read_note", {"path": "projects/homelab/Homelab.md", "heading": "Nightly backup"})
    data = result.structured_content
    assert (data["line_start"], data["line_end"], data["truncated"]) == (first, nxt - 1, False)
    assert data["text"] == "\n".join(lines[first - 1 : nxt - 1])
    assert "### Retention policy" in data["text"] and "Lessons learned" not in data["text"]
    assert result.content[0].text.startswith(f"projects/homelab/Homelab.md lines {first}-{nxt - 1} of ")


def test_read_note_continues_long_note_with_start_line(shared):
    path = "tech/Kubernetes 故障排查手册.md"
    content = (shared.vault / path).read_text(encoding="utf-8")
    expected = content.removesuffix("\n").split("\n")
    got: list[str] = []
    start, calls = 1, 0
    while True:
        calls += 1
        assert calls <= 20
        data = shared.ok("read_note", {"path": path, "start_line": start}).structured_content
        assert data["line_start"] == start and data["total_lines"] == len(expected)
        assert len(data["text"]) <= MAX_RESPONSE_CHARS
        got += data["text"].split("\n")
        if not data["truncated"]:
            break
        assert data["next_start_line"] == data["line_end"] + 1
        start = data["next_start_line"]
    assert calls > 1  # the note is longer than the response budget
    assert got == expected


def test_read_note_rejects_start_line_past_the_end(shared):
    path = "projects/homelab/Homelab.md"
    n = len((shared.vault / path).read_text(encoding="utf-8").splitlines())
    last = shared.ok("read_note", {"path": path, "start_line": n}).structured_content
    assert (last["line_start"], last["line_end"], last["total_lines"]) == (n, n, n)
    result = shared.call("read_note", {"path": path, "start_line": n + 1})
    assert result.is_error and f"start_line {n + 1} is past the end" in result.content[0].text


def test_list_notes_filters_by_path_prefix_newest_first(shared):
    daily = sorted(p.relative_to(shared.vault).as_posix() for p in (shared.vault / "daily").glob("*.md"))
    data = shared.ok("list_notes", {"path_prefix": "daily/"}).structured_content
    assert data["total"] == len(daily) and sorted(n["path"] for n in data["notes"]) == daily
    stamps = [n["modified"] for n in data["notes"]]
    assert stamps == sorted(stamps, reverse=True)
    assert shared.ok("list_notes", {"path_prefix": "no-such-folder"}).structured_content["total"] == 0


def test_index_status_reports_notes_and_chunks(shared):
    result = shared.ok("index_status")
    data = result.structured_content
    on_disk = scan_vault(load_config(shared.config, env={}))
    assert data["notes"] == len(on_disk) and data["chunks"] >= data["notes"]
    assert data["semantic_search"] is True and data["writable"] == ["inbox.md"]
    assert f"notes: {data['notes']}" in result.content[0].text


# ---- replies within budget, tool errors, freshness -------------------------------------------------------------------


def test_read_note_cuts_a_line_longer_than_the_budget_and_says_so(shared):
    note = shared.vault / "long-lines" / "minified.md"
    note.parent.mkdir(exist_ok=True)
    note.write_text("x" * 20_000 + "\nsecond line\n", encoding="utf-8")
    result = shared.ok("read_note", {"path": "long-lines/minified.md"})
    data, text = result.structured_content, result.content[0].text
    assert len(text) <= MAX_RESPONSE_CHARS
    assert data["line_cut"]["line"] == 1 and data["line_cut"]["total_chars"] == 20_000 and data["truncated"]
    assert data["next_start_line"] == 2 and "start_line=2" in text and "20,000 characters" in text
    assert shared.ok("read_note", {"path": "long-lines/minified.md", "start_line": 2}).structured_content["text"] == "second line"


def test_index_status_bounds_the_skipped_list_and_says_where_the_rest_is(shared):
    junk = shared.vault / "junk"
    junk.mkdir(exist_ok=True)
    for i in range(60):
        (junk / f"{i:02d}-{'n' * 150}.md").write_bytes(b"\x00\x01binary\x00" * 10)
    # This test is about the reply's budget; that a burst of saves is taken whole is tests/test_freshness.py's.
    seen: dict[str, Any] = {}
    assert _until(lambda: seen.update(r=shared.ok("index_status")) or seen["r"].structured_content["skipped_total"] >= 60)
    result = seen["r"]
    data, text = result.structured_content, result.content[0].text
    assert len(text) <= MAX_RESPONSE_CHARS
    assert data["skipped_total"] >= 60 and 0 < len(data["skipped_files"]) < data["skipped_total"]
    assert "more, cut to fit the response budget" in text and "list_notes" in text


@pytest.mark.parametrize(
    ("tool", "args", "fragment"),
    [
        ("search_my_knowledge_base", {"query": "backup", "modified_within_days": 1e308}, "36500"),
        ("search_my_knowledge_base", {"query": "backup", "modified_within_days": "inf"}, "36500"),
        ("search_my_knowledge_base", {"query": "backup", "modified_within_days": 0}, "modified_within_days"),
        ("list_notes", {"modified_within_days": 1e308}, "36500"),
        ("read_note", {"path": "n" * 303 + ".md"}, "n" * 20),
        ("read_note", {"path": "deep/" * 1000 + "x.md"}, "deep/"),
        ("update_knowledge_base", {"path": "n" * 303 + ".md", "content": "- x"}, "n" * 20),
    ],
    ids=["days-1e308", "days-inf", "days-0", "list-days-1e308", "name-303", "path-5000", "append-name-303"],
)
def test_out_of_range_arguments_are_tool_errors_not_internal_errors(shared, tool, args, fragment):
    result = shared.call(tool, args)
    text = result.content[0].text
    assert result.is_error and fragment in text
    assert "internal error" not in text and len(text) <= MAX_RESPONSE_CHARS
    assert not shared.search("backup timer")["abstained"]  # and the server keeps answering


def test_every_tool_reply_parses_when_notes_hold_unicode_line_separators(template, tmp_path):
    # U+2028, U+2029 and U+0085 are line breaks to str.splitlines() but plain characters inside a JSON string: a
    # transport that re-splits replies on them sends clients broken JSON lines. A server of its own: index_status
    # must list this test's skipped note within its budget.
    seps = "\u2028\u2029\u0085"
    config = _clone(template, tmp_path)
    vault = Path(load_config(config, env={}).kb_dir)
    folder = vault / "seps"
    folder.mkdir()
    (folder / "zebu.md").write_text(
        f"# Zebu{seps[0]}caravan\n\nThe zebu{seps[0]}caravan{seps[1]}rests at the{seps[2]}oasis at dusk.\n", encoding="utf-8"
    )
    (folder / f"bin{seps}ary.md").write_bytes(b"\x00binary\x00" * 10)  # listed by index_status as skipped
    with mcp_session(config, tmp_path / "server.err") as session:
        replies = [
            session.ok("search_my_knowledge_base", {"query": "zebu caravan oasis", "mode": "keyword"}),
            session.ok("read_note", {"path": "seps/zebu.md"}),
            session.ok("list_notes", {"path_prefix": "seps/"}),
            session.ok("index_status"),
            session.call("update_knowledge_base", {"path": "inbox.md", "content": f"- zebu{seps}log", "heading": f"Zebu{seps}"}),
        ]
        texts = [r.content[0].text for r in replies]
        assert "seps/zebu.md" in texts[0]
        assert all(ch in texts[1] for ch in seps) and seps[0] in texts[2]
        assert f"bin{seps}ary.md" in texts[3]
        assert session.stdout_errors.messages == []  # the client parsed every line the server wrote


def test_search_applies_file_events_without_walking_the_vault(shared):
    def freshness() -> dict[str, int]:
        return shared.ok("index_status").structured_content["freshness"]

    before = freshness()
    folder = shared.vault / "areas" / "zoo-fresh"
    folder.mkdir(parents=True)
    (folder / "tapir.md").write_text("# Tapir\n\nThe tapir enclosure gets a mud bath on Fridays.\n", encoding="utf-8")
    assert _until(lambda: freshness()["file_events"] > before["file_events"])  # the event reached the server
    seen = freshness()["file_events"]
    tmp = folder / ".tapir.md.tmp"
    tmp.write_text("# Tapir\n\nThe tapir enclosure gets a sand bath on Mondays.\n", encoding="utf-8")
    os.replace(tmp, folder / "tapir.md")
    assert _until(lambda: freshness()["file_events"] > seen)
    data = shared.search("tapir enclosure sand bath Mondays")
    assert _paths(data)[:1] == ["areas/zoo-fresh/tapir.md"] and any("sand bath" in h["snippet"] for h in data["hits"])
    after = freshness()
    assert after["full_walks_before_search"] == before["full_walks_before_search"] == 0
    assert after["event_syncs"] > before["event_syncs"]


# ---- protocol hygiene and process life ------------------------------------------------------------------------------


def test_a_keyword_search_labels_its_scores_as_scores_not_as_a_fusion(shared):
    """Keyword mode (also hybrid while the model loads) ranks by BM25 alone: its hits must not read "fused"."""
    keyword = shared.ok("search_my_knowledge_base", {"query": "红烧肉", "mode": "keyword"})
    assert "fused" not in keyword.content[0].text and keyword.structured_content["hits"][0]["score"] > 0


def test_server_stdout_carries_only_protocol_with_debug_logging(shared):
    # The shared server runs with -vv and KB_LOG_LEVEL=DEBUG: one round of every tool. While serving, the SDK points
    # fd 1 at stderr, so a stray print breaks the stream only before that (imports, start-up thread); the client logs
    # such a line (and goes on), which stdout_errors collects from the server's first byte.
    shared.list_tools()
    shared.ok("search_my_knowledge_base", {"query": "backup timer", "top_k": 3})
    shared.ok("search_my_knowledge_base", {"query": "红烧肉", "mode": "keyword"})
    shared.ok("update_knowledge_base", {"path": "inbox.md", "content": "- debug round note"})
    shared.ok("read_note", {"path": "inbox.md"})
    shared.ok("list_notes")
    serving = shared.ok("index_status").structured_content["serving"]
    assert shared.stdout_errors.messages == []  # the client parsed every stdout line as JSON-RPC
    # The relay logs to the client's stderr; the shared server it started (with the same -vv) to its own log file.
    assert serving["mode"] == "shared"
    log = shared.errlog.read_text(encoding="utf-8") + Path(serving["log"]).read_text(encoding="utf-8")
    assert " DEBUG " in log and " INFO " in log


def test_server_exits_when_stdin_closes(template, tmp_path):
    config = _clone(template, tmp_path)
    with (tmp_path / "server.err").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "mcp_server.py", "--config", str(config)],
            cwd=REPO_ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
            }
            proc.stdin.write((json.dumps(init) + "\n").encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no answer to initialize within 60 s"
            reply = json.loads(proc.stdout.readline())
            assert reply["id"] == 1 and "serverInfo" in reply["result"]
            proc.stdin.close()  # the client went away, start-up work still running
            t0 = time.monotonic()
            assert proc.wait(timeout=10) == 0
            assert time.monotonic() - t0 < 5
            for line in proc.stdout.read().decode("utf-8").splitlines():
                json.loads(line)  # nothing but protocol on stdout, before or after
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_two_servers_on_one_index_see_each_others_appends(shared, tmp_path):
    with mcp_session(shared.config, tmp_path / "server_b.err") as other:
        first = "- The narwhal choir rehearses on Thursdays in hall Q-88"
        shared.ok("update_knowledge_base", {"path": "inbox.md", "content": first})
        found = other.search("narwhal choir rehearses")
        assert _paths(found)[:1] == ["inbox.md"]
        second = "- The walrus orchestra tunes up every Saturday in hall Z-19"
        other.ok("update_knowledge_base", {"path": "inbox.md", "content": second})
        found = shared.search("walrus orchestra tunes up")
        assert _paths(found)[:1] == ["inbox.md"]
        assert not found["notes"], found["notes"]  # no degraded search (e.g. a vector store read failure)
        text = (shared.vault / "inbox.md").read_text(encoding="utf-8")
        assert text.count("narwhal choir") == 1 and text.count("walrus orchestra") == 1
        for s in (shared, other):
            assert s.ok("index_status").structured_content["notes"] == len(scan_vault(load_config(s.config, env={})))
        assert other.stdout_errors.messages == []


# ---- the --search self-test ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def self_test_config(template, tmp_path_factory) -> Path:
    return _clone(template, tmp_path_factory.mktemp("selftest"))


def _self_test(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "mcp_server.py", *args], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )


def test_self_test_prints_json_hits(self_test_config):
    proc = _self_test("--config", str(self_test_config), "--search", "backup timer", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["query"] == "backup timer" and not data["abstained"]
    assert data["hits"][0]["path"] == "projects/homelab/Homelab.md"
    assert HIT_KEYS <= set(data["hits"][0])
    assert data["notes_indexed"] == len(scan_vault(load_config(self_test_config, env={})))


def test_self_test_prints_readable_hits(self_test_config):
    proc = _self_test("--config", str(self_test_config), "--search", "backup timer", "--mode", "keyword")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("vault ")
    assert 'notes for "backup timer" (keyword)' in proc.stdout
    assert "[1] projects/homelab/Homelab.md:" in proc.stdout


@pytest.mark.parametrize(
    ("config_text", "fragment"),
    [
        ('{"kb_dir": "<tmp>/no-such-vault"}', "is not a folder"),
        ('{"kb_dir": "<tmp>", "search": {"top_k": 0}}', "search.top_k"),
        ("kb_dir: [unclosed", "not valid YAML"),
    ],
)
def test_self_test_exits_1_on_invalid_config(tmp_path, config_text, fragment):
    config = tmp_path / "bad.yaml"
    config.write_text(config_text.replace("<tmp>", tmp_path.as_posix()), encoding="utf-8")
    proc = _self_test("--config", str(config), "--search", "backup timer", "--json")
    assert proc.returncode == 1
    assert fragment in proc.stderr and proc.stderr.startswith("error: ")
    assert proc.stdout == ""


# ---- degradation ----------------------------------------------------------------------------------------------------


def test_server_without_model_keeps_keyword_search_and_says_how_to_fix(template, tmp_path):
    """The configured model is not on disk: hybrid answers from keywords with a note, semantic mode is a clear error.

    Where sentence-transformers (opt-in) is missing, the fix the server names is installing it."""
    config = _clone(template, tmp_path / "nomodel", embedding={"model": "no-such-org/no-such-model"})
    fix = "local folder" if importlib.util.find_spec("sentence_transformers") else "pip install -r requirements-st.txt"
    with mcp_session(config, tmp_path / "server.err") as session:
        result = session.ok("search_my_knowledge_base", {"query": "backup-nightly.timer"})
        text = result.content[0].text
        assert _paths(result.structured_content)[0] == "projects/homelab/Homelab.md"
        assert "semantic search" in text and fix in text
        failed = session.call("search_my_knowledge_base", {"query": "backup-nightly.timer", "mode": "semantic"})
        assert failed.is_error and "no-such-model" in failed.content[0].text and fix in failed.content[0].text
        status = session.ok("index_status").structured_content
        assert status["semantic_search"] is False and status["notes"] == 30
