"""`vector_store.mode: http`: the engine's guarantees against a real `chroma run` server started here.

The engine tests of test_ingest.py run again with their vectors in the server (same code, other store), then what
only a server can do: be down, come back, and be shared by two processes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kb_fixtures import answers, free_port, make_config, stop_process, wait_until
from test_ingest import (  # noqa: F401  (collected here, with this module's make_engine)
    assert_consistent,
    test_rebuild_clears_and_reindexes,
    test_second_process_sees_first_process_writes_without_embedding,
    test_sync_embeds_nothing_when_unchanged,
    test_sync_reembeds_everything_when_model_changes,
    test_sync_reembeds_only_the_edited_section,
    test_sync_removes_chunks_of_deleted_note,
    test_sync_reuses_vectors_when_note_renamed,
)

from kb_engine import Engine
from kb_vectors import HashEmbedder

CHROMA = Path(sys.executable).parent / "chroma"
# How long `chroma run` may take to answer its heartbeat.
START_TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(
    not CHROMA.exists() and shutil.which("chroma") is None, reason="the chroma CLI (pip install chromadb) is missing"
)


class ChromaServer:
    """A `chroma run` subprocess on a free port with its data in a temp folder; stop() and start() again."""

    def __init__(self, path: Path) -> None:
        self.path, self.port = path, free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = str(CHROMA) if CHROMA.exists() else shutil.which("chroma")
        self.proc = subprocess.Popen(
            [exe, "run", "--path", str(self.path), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        heartbeat = f"http://127.0.0.1:{self.port}/api/v2/heartbeat"
        if not wait_until(lambda: answers(lambda: urllib.request.urlopen(heartbeat, timeout=1).read()), START_TIMEOUT_S):
            self.stop()
            pytest.fail(f"chroma run did not answer on port {self.port} within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)
            self.proc = None


@pytest.fixture(scope="module")
def chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    server = ChromaServer(tmp_path_factory.mktemp("chroma"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_engine(tmp_path: Path, chroma: ChromaServer, request: pytest.FixtureRequest) -> Callable[..., Engine]:
    """Engines whose vectors live in the module's Chroma server, one collection prefix per test."""
    prefix = f"t{abs(hash(request.node.name)) % 10**8}-"

    def build(vault: Path, embedder: object | None = None, data_dir: Path | None = None, **overrides: object) -> Engine:
        cfg = make_config(
            vault,
            data_dir or tmp_path / "data",
            vector_mode="http",
            chroma_host="127.0.0.1",
            chroma_port=chroma.port,
            chroma_prefix=prefix,
            **overrides,
        )
        return Engine(cfg, embedder or HashEmbedder())

    return build


def test_http_mode_keeps_vectors_in_the_server_not_on_disk(small_vault, make_engine):
    engine = make_engine(small_vault)
    engine.sync_all()

    assert not (engine.cfg.index_dir / "vectors").exists()
    assert len(engine.store) == len({c.content for c in engine.chunks.values()}) > 0
    found = engine.view.nearest(HashEmbedder().embed_query("PostgreSQL ledger"), 1)
    assert found and engine.chunks[found[0][0]].path == "projects/alpha.md"


def test_search_degrades_to_keyword_while_the_server_is_down_and_sync_catches_up(small_vault, make_engine, chroma):
    from kb_search import Searcher

    engine = make_engine(small_vault)
    engine.sync_all()
    chroma.stop()
    try:
        (small_vault / "inbox.md").write_text("# Inbox\n\n- wombat census notes\n", encoding="utf-8")
        report = engine.sync_all()
        assert report.changed == 1 and any("Chroma server" in r for r in report.reasons)
        result = Searcher(engine).search("wombat census", mode="hybrid")
        assert result.hits and result.hits[0].path == "inbox.md"
        assert any("keyword" in n for n in result.notes)
    finally:
        chroma.start()
    caught_up = engine.sync_all()
    assert caught_up.chunks_embedded >= 1
    assert_consistent(engine)


def test_two_processes_share_one_collection_and_embed_once(small_vault, make_engine, tmp_path):
    a_emb, b_emb = HashEmbedder(), HashEmbedder()
    a = make_engine(small_vault, a_emb)
    a.sync_all()
    b = make_engine(small_vault, b_emb, data_dir=tmp_path / "other-machine")  # its own state, the same server
    b.sync_all()

    assert b_emb.embedded == 0 and a_emb.embedded == len({c.content for c in a.chunks.values()})
    assert_consistent(b)
