"""Append-only write-back into whitelisted notes: the only code that modifies a note.

Every path goes through kb_scan.resolve_inside and the write.writable / write.creatable whitelist; the write is
atomic, keeps the note's encoding and line endings, and a retried identical append is applied once.
Imports kb_config, kb_scan, kb_state, kb_text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kb_config import Config, WriteRefusedError
from kb_scan import path_allowed, resolve_inside
from kb_state import FileLock, atomic_write_text, decode_note
from kb_text import find_sections, list_headings

# ATX heading line; an optional closing '#' run needs whitespace before it (CommonMark), so "## C#" is "C#".
# Level of a heading created by an append that names none ("## " prefix in the argument picks another).
DEFAULT_NEW_HEADING_LEVEL = 2
# Journal of recent appends (for retry de-duplication), kept in the index folder, never in the vault.
JOURNAL_NAME = "appends.json"


@dataclass(frozen=True)
class AppendResult:
    """What an append did: the note, where the text went (1-based lines), and whether it was a retried duplicate."""

    path: str
    line_start: int
    line_end: int
    heading: str | None
    created_note: bool
    created_heading: bool
    duplicate: bool
    chars: int


def parse_heading_arg(heading: str) -> tuple[int, str]:
    m = re.match(r"^(#{1,6})\s+(.*)$", heading.strip())
    return (len(m.group(1)), m.group(2).strip()) if m else (DEFAULT_NEW_HEADING_LEVEL, heading.strip())


def _check_allowed(cfg: Config, rel: str) -> tuple[Path, str, bool]:
    """Resolve and whitelist-check a path; returns (absolute real path, normalized path, exists)."""
    target, norm = resolve_inside(cfg, rel, must_exist=False)
    real = Path(os.path.realpath(target))
    exists = real.is_file()
    if real.exists() and not exists:
        raise WriteRefusedError(f"'{norm}' is not a regular file; appends go to notes only")
    rules = "write.writable: " + (", ".join(cfg.writable) or "(empty)")
    allowed = (*cfg.writable, *cfg.creatable)
    # Defense in depth: a whitelisted symlink must not lead to a note the whitelist does not name.
    real_rel = real.relative_to(os.path.realpath(cfg.kb_dir)).as_posix()
    if exists and not (path_allowed(norm, allowed) and path_allowed(real_rel, allowed)):
        shown = norm if real_rel == norm else f"{norm} (a link to {real_rel})"
        raise WriteRefusedError(
            f"'{shown}' is not writable: the config's whitelist ({rules}) does not include it. "
            "Ask the user to add it to write.writable in config.yaml, or append to an allowed note."
        )
    if not exists and not path_allowed(norm, cfg.creatable):
        allowed = ", ".join(cfg.creatable) or "(nothing)"
        raise WriteRefusedError(
            f"note '{norm}' does not exist and write.creatable ({allowed}) does not allow creating it; "
            "append to an existing allowed note instead"
        )
    return real, norm, exists


def _dedupe_key(norm: str, text: str) -> str:
    return hashlib.sha1(f"{norm}\x00{text.strip()}".encode()).hexdigest()


def _read_journal(path: Path, now: float, window_s: float) -> list[dict]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # a missing or torn journal only costs de-duplication of one retry
    out = []
    for e in entries if isinstance(entries, list) else []:
        try:
            if isinstance(e, dict) and now - float(e.get("at", 0)) <= window_s:
                out.append(e)
        except (TypeError, ValueError):
            continue
    return out


def append_to_note(
    cfg: Config, rel: str, content: str, heading: str | None = None, create_heading: bool = False, now: float | None = None
) -> AppendResult:
    """Append `content` to a whitelisted note, at its end or at the end of the section under `heading`.

    Never deletes or rewrites existing text. A heading found more than once is refused as ambiguous; a missing
    heading is added at the end only with `create_heading`. Raises WriteRefusedError / PathOutsideVaultError
    with the reason, leaving the disk unchanged.
    Example: append_to_note(cfg, "inbox.md", "- call the vet", heading="TODO", create_heading=True)
    """
    text = (content or "").replace("\r\n", "\n").replace("\r", "\n").strip("\n").rstrip()
    if not text.strip():
        raise WriteRefusedError("content is empty; pass the text to append")
    if len(text) > cfg.max_append_chars:
        raise WriteRefusedError(
            f"content has {len(text)} characters, over write.max_append_chars ({cfg.max_append_chars}); "
            "split it or append a summary"
        )
    if "\x00" in text:
        raise WriteRefusedError("content contains NUL characters; pass plain text")
    real, norm, exists = _check_allowed(cfg, rel)
    now = time.time() if now is None else now
    lock = FileLock(cfg.index_dir / "append.lock")  # serializes appends across server processes: no lost write
    lock.acquire(cfg.lock_timeout_s)
    try:
        journal_path = cfg.index_dir / JOURNAL_NAME
        journal = _read_journal(journal_path, now, cfg.dedupe_window_s)
        key = _dedupe_key(norm, text)
        if exists:
            raw = real.read_bytes()
            try:
                body, encoding = decode_note(raw)
            except ValueError as e:
                raise WriteRefusedError(f"'{norm}' cannot be appended to safely: {e}") from e
        else:
            body, encoding = "", "utf-8"
        if any(e.get("key") == key for e in journal) and text in body.replace("\r\n", "\n"):
            line = body.replace("\r\n", "\n")[: body.replace("\r\n", "\n").rfind(text)].count("\n") + 1
            return AppendResult(norm, line, line + text.count("\n"), heading, False, False, True, 0)
        newline = "\r\n" if "\r\n" in body else "\n"
        lines = body.replace("\r\n", "\n").split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the final newline
        # The same lines with their own endings: existing text is written back byte for byte, even with mixed endings.
        raw_lines = [r for r in re.split(r"(?<=\n)", body) if r]
        insert_at, created_heading, heading_text = len(lines), False, None
        block = text.split("\n")
        if heading and heading.strip():
            level, heading_text = parse_heading_arg(heading)
            found = find_sections(lines, heading_text)
            if len(found) > 1:
                where = ", ".join(str(i + 1) for i, _, _ in found)
                raise WriteRefusedError(
                    f"heading '{heading_text}' appears {len(found)} times in '{norm}' (lines {where}); "
                    "it is ambiguous, so nothing was written. Append without a heading or use a unique one."
                )
            if found:
                start, insert_at, _ = found[0]
                while insert_at > start + 1 and not lines[insert_at - 1].strip():
                    insert_at -= 1
            elif create_heading:
                block = ["#" * level + " " + heading_text, "", *block]
                created_heading = True
            else:
                existing = ", ".join(t for _, _, t in list_headings(lines)[:20]) or "none"
                raise WriteRefusedError(
                    f"heading '{heading_text}' is not in '{norm}' (headings: {existing}); nothing was "
                    "written. Pass create_heading=true to add it at the end, or append without a heading."
                )
        before, after = lines[:insert_at], lines[insert_at:]
        if before and before[-1].strip():
            block = ["", *block]
        if after and after[0].strip():
            block = [*block, ""]
        start_line = len(before) + (1 if block[0] == "" else 0) + 1
        head = "".join(raw_lines[:insert_at])
        if head and not head.endswith("\n"):
            head += newline  # the note lacked a final newline
        _atomic_write(real, head + "".join(b + newline for b in block) + "".join(raw_lines[insert_at:]), encoding)
        journal.append({"key": key, "path": norm, "at": now})
        atomic_write_text(journal_path, json.dumps(journal))
    finally:
        lock.release()
    return AppendResult(
        norm,
        start_line,
        start_line + len(text.split("\n")) - 1 + (2 if created_heading else 0),
        heading_text,
        not exists,
        created_heading,
        False,
        len(text),
    )


def _atomic_write(path: Path, text: str, encoding: str) -> None:
    """Replace the note in one step (temp file beside it, then rename), keeping its permissions."""
    data = text.encode(encoding)
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kb-append-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
