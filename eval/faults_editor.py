"""The storm's external editor: a separate process that creates, edits, renames and deletes notes under `storm/`
and appends numbered lines to inbox.md, the way a user's editor and scripts do, logging each finished operation.

Usage: python eval/faults_editor.py VAULT LOG SECONDS SEED MAX_OPS [PAUSE_SCALE]. PAUSE_SCALE multiplies the pause
between operations (the soak's editor works at a person's pace). Standard library only; bounded in time and ops.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

# Folder (inside the vault) that holds the editor's own notes.
STORM_DIR = "storm"
# The note both the editor (external lines) and the servers (tool appends) append to.
INBOX = "inbox.md"
# Operations and their weights: appends to inbox.md are the commonest, as with a quick-capture script.
OPS = {"create": 18, "edit": 25, "rename": 8, "delete": 9, "ext": 40}
# Pause between operations, seconds (uniform).
PAUSE_S = (0.02, 0.12)
# Notes the editor keeps at most (creates give way to edits beyond this).
MAX_NOTES = 60
# Filler words of the notes' text.
WORDS = "backup restore network timeout docker python meeting decision budget travel schedule review".split()


def note_token(note_id: int, version: int) -> str:
    """The word only this version of this note holds (letters and digits: one search token)."""
    return f"stormtok{note_id}v{version}"


def ext_line(n: int) -> str:
    return f"- ext line {n} exttok{n}"


def _text(rng: random.Random, note_id: int, version: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
    return f"# Storm note {note_id}\n\n{note_token(note_id, version)} {body}\n\n## Details\n\n{body[::-1]}\n"


def _save(path: Path, text: str, rng: random.Random) -> None:
    """Half the time an editor's atomic save (hidden temp file, then rename), else an in-place rewrite."""
    if rng.random() < 0.5:
        tmp = path.with_name(f".{path.name}.swp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    else:
        path.write_text(text, encoding="utf-8")


def pause_until(deadline: float, pause_s: float) -> float:
    """A loop's pause, cut short at `deadline` (time.monotonic()): a person's pauses (the soak's, up to 20 s) drawn in
    full after the deadline kept the drill running past its time."""
    return min(pause_s, max(0.0, deadline - time.monotonic()))


def run_editor(vault: Path, log_path: Path, seconds: float, seed: int, max_ops: int, pause_scale: float = 1.0) -> int:
    rng = random.Random(seed)
    folder = vault / STORM_DIR
    folder.mkdir(parents=True, exist_ok=True)
    notes: dict[int, tuple[str, int]] = {}  # id -> (vault-relative path, version)
    next_id = ext_n = 0
    deadline = time.monotonic() + seconds
    ops = 0
    with log_path.open("a", encoding="utf-8") as log:

        def record(**entry: object) -> None:
            log.write(json.dumps({"t": round(time.time(), 3), **entry}) + "\n")
            log.flush()

        while ops < max_ops and time.monotonic() < deadline:
            op = rng.choices(list(OPS), weights=list(OPS.values()))[0]
            if op in ("edit", "rename", "delete") and not notes:
                op = "create"
            if op == "create" and len(notes) >= MAX_NOTES:
                op = "edit"
            if op == "create":
                next_id += 1
                rel = f"{STORM_DIR}/n{next_id}.md"
                _save(vault / rel, _text(rng, next_id, 0), rng)
                notes[next_id] = (rel, 0)
                record(op=op, path=rel, token=note_token(next_id, 0))
            elif op == "edit":
                nid = rng.choice(sorted(notes))
                rel, version = notes[nid]
                _save(vault / rel, _text(rng, nid, version + 1), rng)
                notes[nid] = (rel, version + 1)
                record(op=op, path=rel, token=note_token(nid, version + 1), old_token=note_token(nid, version))
            elif op == "rename":
                nid = rng.choice(sorted(notes))
                rel, version = notes[nid]
                new = f"{STORM_DIR}/n{nid}-r{ops}.md"
                os.replace(vault / rel, vault / new)
                notes[nid] = (new, version)
                record(op=op, path=new, old_path=rel, token=note_token(nid, version))
            elif op == "delete":
                nid = rng.choice(sorted(notes))
                rel, version = notes.pop(nid)
                (vault / rel).unlink()
                record(op=op, path=rel, token=note_token(nid, version))
            else:
                ext_n += 1
                with (vault / INBOX).open("a", encoding="utf-8") as f:
                    f.write(ext_line(ext_n) + "\n")
                record(op=op, n=ext_n)
            ops += 1
            time.sleep(pause_until(deadline, pause_scale * rng.uniform(*PAUSE_S)))
        record(op="done", ops=ops, notes={rel: note_token(nid, v) for nid, (rel, v) in notes.items()}, ext=ext_n)
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7):
        sys.exit("usage: python eval/faults_editor.py VAULT LOG SECONDS SEED MAX_OPS [PAUSE_SCALE]")
    vault, log, seconds, seed, max_ops = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    sys.exit(run_editor(vault, log, seconds, seed, max_ops, float(sys.argv[6]) if len(sys.argv) == 7 else 1.0))
