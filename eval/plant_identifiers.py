"""Exact evidence on a real vault: an identifier planted in one note, look-alikes planted in new notes beside it, each
searched in hybrid mode with the configured models; the note that holds the identifier must come first (issue 18).

Works on a copy of the vault and of its index (one built by `run_eval.py --index-dir`, or by ingest.py: pass its
data dir), so only the planted notes are embedded and the vault itself is never written. The first round is the
issue's reproduction when the vault has pages/common/tar.md (tldr): `marker zq0e3ba105b1` appended to tar.md, two
notes holding `zq1ebabdf863` and `zqd17f683628`. Prints a table, or JSON with --json; exits 2
when a planted note was not first, 1 on an error. Imports the project modules.

Usage: python eval/plant_identifiers.py --kb-dir DIR [--index-dir DIR] --out-dir DIR [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import prepare_vault, say

from kb_config import KBError, load_config, setup_logging

# The reproduction on tldr: the note, its identifier and the two look-alikes.
TAR_NOTE, TAR_TOKEN, TAR_LOOKALIKES = "pages/common/tar.md", "zq0e3ba105b1", ("zq1ebabdf863", "zqd17f683628")
# Rounds after it, each a random note of the vault with a fresh identifier and two fresh look-alikes.
DEFAULT_ROUNDS = 10
# Seed of the notes and identifiers picked, so two runs plant the same.
SEED = 18
# How each identifier is asked: alone, inside an English question, inside a Chinese one.
QUESTIONS = ("{t}", "what is {t} about", "{t} 那个是什么")


def _token(rng: random.Random) -> str:
    return "zq" + "".join(rng.choice("0123456789abcdef") for _ in range(10))


def copy_vault_and_index(kb_dir: Path, index_dir: Path | None, out_dir: Path) -> Any:
    """The config of a copy of the vault in out_dir/vault, with a copy of its index (if given) where that copy's index
    lives, so a sync of the copy embeds nothing it already has. Replaces out_dir/vault and out_dir/data only."""
    out_dir = out_dir.expanduser().resolve()
    vault, _ = prepare_vault(out_dir, kb_dir, None)
    data = out_dir / "data"
    shutil.rmtree(data, ignore_errors=True)
    cfg = load_config(None, env={}, overrides={"kb_dir": str(vault), "data_dir": str(data)})
    if index_dir is not None:
        source = load_config(None, env={}, overrides={"kb_dir": str(kb_dir.resolve()), "data_dir": str(index_dir)})
        if not (source.index_dir / "state.json").is_file():
            raise KBError(f"no index of {kb_dir} under {index_dir}; build one with eval/run_eval.py --index-dir first")
        shutil.copytree(source.index_dir, cfg.index_dir)
    return cfg


def plant_rounds(vault: Path, notes: list[str], rounds: int) -> list[tuple[str, str, tuple[str, ...]]]:
    """(note, identifier, look-alikes) for each round: the issue's tar.md first when the vault has it."""
    rng = random.Random(SEED)
    out = [(TAR_NOTE, TAR_TOKEN, TAR_LOOKALIKES)] if (vault / TAR_NOTE).is_file() else []
    for note in rng.sample(notes, min(rounds, len(notes))):
        if note != TAR_NOTE:
            out.append((note, _token(rng), (_token(rng), _token(rng))))
    return out[: max(rounds, 1)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kb_engine import Engine
    from kb_search import Searcher
    from kb_vectors import HashEmbedder, config_embedder

    cfg = copy_vault_and_index(args.kb_dir, args.index_dir, args.out_dir)
    embedder = HashEmbedder(name="multilingual-hash") if args.fake_embedder else config_embedder(cfg)
    engine = Engine(cfg, embedder)
    say("plant", f"syncing the copy in {args.out_dir} (only new or changed notes are embedded)")
    engine.sync_all()
    searcher = Searcher(engine)
    vault = cfg.kb_dir
    notes = sorted(p for p, r in engine.files.items() if r.chunks)
    rows: list[dict[str, Any]] = []
    for i, (note, token, lookalikes) in enumerate(plant_rounds(vault, notes, args.rounds)):
        with (vault / note).open("a", encoding="utf-8") as f:
            f.write(f"\n\nmarker {token}\n")
        for j, other in enumerate(lookalikes):
            (vault / f"fresh-{i}-{j}.md").write_text(f"# Fresh {i} {j}\n\nfresh {other}\n", encoding="utf-8")
        engine.sync_all()
        for question in QUESTIONS:
            query = question.format(t=token)
            hits = searcher.search(query, mode="hybrid", top_k=5).hits
            first = hits[0].path if hits else None
            rows.append({"note": note, "query": query, "first": first, "ok": first == note})
            say("plant", f"{'ok  ' if first == note else 'MISS'} {query!r}: {first} (planted in {note})")
    return {
        "vault": str(args.kb_dir),
        "model": engine.embedder.name,
        "rounds": len(rows) // len(QUESTIONS),
        "searches": len(rows),
        "first": sum(r["ok"] for r in rows),
        "misses": [r for r in rows if not r["ok"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="plant_identifiers.py",
        description="Plant identifiers and look-alikes in a copy of a vault and check the note holding each comes first.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python eval/plant_identifiers.py --kb-dir ../shared/corpora/tldr --index-dir /tmp/kbeval/tldr "
        "--out-dir /tmp/plant-tldr",
    )
    parser.add_argument("--kb-dir", type=Path, required=True, help="the vault (read only: a copy is planted)")
    parser.add_argument("--index-dir", type=Path, help="the data dir of an index of that vault, copied so nothing is re-embedded")
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="where the copy and its index go (its vault/ and data/ are replaced)"
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help=f"notes planted (default: {DEFAULT_ROUNDS})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--fake-embedder", action="store_true", help="a hash embedder instead of the models (tests)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds needs at least 1")
    setup_logging(0, True)
    try:
        result = run(args)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print(
            f"{result['vault']} ({result['model']}): the planted note first in {result['first']} of {result['searches']} "
            f"searches ({result['rounds']} identifiers, each with two look-alikes)"
        )
        for miss in result["misses"]:
            print(f"  miss: {miss['query']!r} -> {miss['first']} (planted in {miss['note']})")
    return 0 if result["first"] == result["searches"] else 2


if __name__ == "__main__":
    sys.exit(main())
