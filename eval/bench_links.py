"""Time the link work a sync does for anchor text (kb_view.AnchorText) on a synthetic link graph: the first build,
one edited note, a new note, a new note that takes over a linked name. Prints a table, or JSON with --json.

Records are generated in memory (no files, no model): this isolates what links add to a sync.
Example: python eval/bench_links.py --notes 10000 --links-per-note 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kb_state import FileRecord, LinkRow
from kb_view import AnchorText, make_resolver

# Seed of the generated graph, so runs are comparable.
SEED = 1
# Share of links written with a label (the rest use the note's name, which adds no anchor).
LABELLED_SHARE = 0.3
# Timed repetitions of the per-change cases.
REPEATS = 30


def _record(i: int, notes: int, links: int, rng: random.Random) -> FileRecord:
    rows = tuple(
        LinkRow(
            f"Note {rng.randrange(notes)}",
            "",
            "",
            f"label {rng.randrange(100)}" if rng.random() < LABELLED_SHARE else "",
            False,
            3,
        )
        for _ in range(links)
    )
    return FileRecord(1, 1, "md5", (), f"Note {i}", links=rows)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def run(notes: int, links: int) -> dict[str, float]:
    rng = random.Random(SEED)
    paths = [f"folder{i % 50}/Note {i}.md" for i in range(notes)]
    files = {p: _record(i, notes, links, rng) for i, p in enumerate(paths)}
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    resolver = make_resolver(files)
    out["resolver_build_ms"] = _ms(t0)
    anchors = AnchorText()
    t0 = time.perf_counter()
    anchors.update(files, resolver, set())
    out["first_build_ms"] = _ms(t0)
    edits = []
    for _ in range(REPEATS):
        i = rng.randrange(notes)
        files[paths[i]] = _record(i, notes, links, rng)
        t0 = time.perf_counter()
        anchors.update(files, resolver, {paths[i]})
        edits.append(_ms(t0))
    out["edit_p50_ms"] = statistics.median(edits)
    added = []
    for k in range(REPEATS):
        path = f"new/Brand {k}.md"
        files[path] = _record(notes + k, notes, links, rng)
        t0 = time.perf_counter()
        resolver = make_resolver(files)
        anchors.update(files, resolver, {path})
        added.append(_ms(t0))
    out["new_note_p50_ms"] = statistics.median(added)
    path = "zz/Note 7.md"  # shorter than folder7/Note 7.md: every [[Note 7]] now leads here
    files[path] = FileRecord(1, 1, "md5", (), "Note 7")
    t0 = time.perf_counter()
    resolver = make_resolver(files)
    anchors.update(files, resolver, {path})
    out["takeover_ms"] = _ms(t0)
    fresh = AnchorText()
    fresh.update(files, resolver, set())
    out["incremental_equals_fresh"] = float(fresh.by_note == anchors.by_note)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--notes", type=int, default=10_000, help="notes in the generated vault")
    parser.add_argument("--links-per-note", type=int, default=5, help="links each note makes")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.notes < 10 or args.links_per_note < 1:
        parser.error("--notes needs at least 10 and --links-per-note at least 1")
    result = run(args.notes, args.links_per_note)
    if args.json:
        print(json.dumps({"notes": args.notes, "links": args.notes * args.links_per_note, **result}))
    else:
        print(f"{args.notes} notes, {args.notes * args.links_per_note} links")
        for key, value in result.items():
            print(f"  {key:26} {value:9.2f}")
    return 0 if result["incremental_equals_fresh"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
