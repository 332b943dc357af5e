"""A server started on an unindexed vault (issue 34): how soon its semantic lists cover every chunk, and whether every
reply says how much they cover until then.

Copies the vault into --out-dir, launches `mcp_server.py` there with an empty index through the SDK's stdio client (as
Claude Code does), then searches (hybrid) and asks index_status every --interval seconds until every model covers
its chunks. Reports when the multilingual model covered every chunk and when all models did (seconds after launch),
how many replies came before full coverage and how many of them said how much was covered, search latency meanwhile,
and the server's peak memory. The user's notes and index are never touched.
Usage: python eval/bench_first_index.py --kb-dir ../shared/corpora/hello-algo --out-dir /tmp/first [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from harness import QUERIES, launch, peak_memory_mb, percentile, prepare_vault, say, write_config

from kb_config import KBError

# Seconds between two rounds of search + index_status.
DEFAULT_INTERVAL_S = 5.0
# Longest the run waits for full coverage.
DEFAULT_TIMEOUT_S = 1800.0
# Longest one call may take.
CALL_TIMEOUT_S = 120.0
# What a reply says while the semantic lists cover part of the vault (kb_embedrun.coverage_note).
COVERAGE_PREFIX = "semantic results cover"


async def _call(session: Any, tool: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(tool, args)
    if result.is_error:
        raise KBError(f"{tool} failed: {result.content[0].text}")
    return result.content[0].text, result.structured_content or {}


def _covered(status: dict[str, Any]) -> list[bool]:
    """Per model, whether its vectors cover every chunk it embeds (none: the notes are not committed yet)."""
    coverage = status.get("semantic_coverage") or {}
    if not status.get("chunks") or not coverage or status.get("chunks_without_vector"):
        return [m["embedded"] >= m["of"] > 0 for m in coverage.values()][:1] + [False] * max(0, len(coverage) - 1)
    return [m["embedded"] >= m["of"] for m in coverage.values()]


async def run(config: Path, errlog: Any, interval_s: float, timeout_s: float, pidfile: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    first_full: float | None = None
    all_full: float | None = None
    peak: float | None = None
    # A server of its own (--no-shared): its pid is the one that indexes, so its peak memory is the one measured.
    async with launch(config, errlog, pidfile=pidfile, read_timeout_s=CALL_TIMEOUT_S, extra_args=["--no-shared"]) as server:
        session, t0 = server.client, server.started
        i = 0
        while time.perf_counter() - t0 < timeout_s:
            q0 = time.perf_counter()
            text, data = await _call(session, "search_my_knowledge_base", {"query": QUERIES[i % len(QUERIES)]})
            search_s = time.perf_counter() - q0
            _, status = await _call(session, "index_status", {})
            at = time.perf_counter() - t0
            covered = _covered(status) if data.get("mode") != "keyword" else []
            rounds.append(
                {
                    "at_s": round(at, 1),
                    "search_ms": round(search_s * 1000, 1),
                    "mode": data.get("mode"),
                    "says_coverage": COVERAGE_PREFIX in text,
                    "coverage": status.get("semantic_coverage"),
                    "seconds_left": status.get("indexing_seconds_left"),
                    "note": next((n for n in data.get("notes", []) if n.startswith(COVERAGE_PREFIX)), None),
                }
            )
            if covered and covered[0] and first_full is None:
                first_full = at
            if covered and all(covered):
                all_full = at
                break
            say("first-index", f"{at:6.1f} s: {status.get('semantic_coverage')} ({rounds[-1]['note']})")
            i += 1
            await anyio.sleep(max(0.0, interval_s - (time.perf_counter() - q0)))
        if server.pid is not None:
            peak = peak_memory_mb(server.pid)[0]
    return summarize(rounds, first_full, all_full, peak)


def summarize(
    rounds: list[dict[str, Any]], first_full: float | None, all_full: float | None, peak: float | None
) -> dict[str, Any]:
    """The run's numbers from its rounds: when each coverage was reached, how many semantic replies came before full
    coverage and how many of them said how much was covered, their latency."""
    before = [r for r in rounds[:-1] if r["mode"] != "keyword"] if all_full is not None else rounds
    latencies = [r["search_ms"] for r in before]
    return {
        "multilingual_full_s": first_full,
        "all_models_full_s": all_full,
        "replies_before_full": len(before),
        "replies_saying_coverage": sum(1 for r in before if r["says_coverage"]),
        "keyword_only_replies": sum(1 for r in rounds if r["mode"] == "keyword"),
        "search_ms_p50": percentile(latencies, 0.5) if latencies else None,
        "search_ms_p95": percentile(latencies, 0.95) if latencies else None,
        "peak_rss_mb": round(peak) if peak else None,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_first_index.py",
        description="Launch the server on a copy of a vault with no index and time its first index: when the "
        "multilingual model's vectors cover every chunk, when every model's do, and whether every reply before says "
        "how much is covered.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="example: python eval/bench_first_index.py --kb-dir ../shared/corpora/hello-algo --out-dir /tmp/first",
    )
    parser.add_argument("--kb-dir", type=Path, required=True, help="the vault to copy (never written to)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the copy, its index and the log go")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between rounds")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="longest wait for full coverage, s")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (with every round)")
    args = parser.parse_args(argv)
    out = args.out_dir.resolve()
    try:
        vault, _ = prepare_vault(out, args.kb_dir, None)
        data = out / "data"
        shutil.rmtree(data, ignore_errors=True)
        config = write_config(out / "config.yaml", vault, data)
        with (out / "server.log").open("w", encoding="utf-8") as errlog:
            result = anyio.run(run, config, errlog, args.interval, args.timeout, out / "server.pid")
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=1))
    else:
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    return 0 if result["all_models_full_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
