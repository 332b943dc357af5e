"""Append-only write-back into whitelisted notes: the only code that modifies a note.

Every path goes through kb_scan.resolve_inside and the write.writable / write.creatable whitelist (a link's target
too). Text added at the end of a note is written in place with O_APPEND, so lines another program appends at the
same moment are never lost; an insert inside a note replaces it atomically (kb_files) after checking it is unchanged.
Keeps the note's encoding and line endings; a retried identical append is applied once.
Imports: kb_chunk, kb_config, kb_files, kb_scan, kb_state, kb_text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from kb_chunk import find_sections, list_headings
from kb_config import Config, PathOutsideVaultError, WriteRefusedError
from kb_files import atomic_write_bytes, atomic_write_text
from kb_scan import path_allowed, read_note_bytes, resolve_inside
from kb_state import NOTE_ENCODINGS, FileLock, decode_note
from kb_text import split_lines

logger = logging.getLogger(__name__)

# Level of a heading created by an append that names none ("## " prefix in the argument picks another).
DEFAULT_NEW_HEADING_LEVEL = 2
# Longest heading an append may create; a longer one is a paragraph passed by mistake.
MAX_HEADING_CHARS = 200
# Journal of recent appends (for retry de-duplication), kept in the index folder, never in the vault.
JOURNAL_NAME = "appends.json"
# Times an append starts over when another program changed the note while the append was being prepared.
MAX_APPEND_ATTEMPTS = 10
# Permission bits of a new note before the umask, as an editor would create it.
NEW_NOTE_MODE = 0o666
# How much of a refused heading a message quotes.
SHOWN_HEADING_CHARS = 80
# Writes through these flags always land at the end of the file, whoever else appends; never block on a FIFO.
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
# A new note is created only if nobody created it meanwhile.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
# One line with its own ending (CRLF, CR or LF), the way kb_text.split_lines counts lines.
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


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


@dataclass(frozen=True)
class _Snapshot:
    """A note as read: its bytes, its (size, mtime_ns, inode) at that moment, and its permission bits."""

    raw: bytes
    identity: tuple[int, int, int]
    mode: int


@dataclass(frozen=True)
class _Placement:
    """A note's new text with the appended block, where the block starts (1-based), and the heading used."""

    body: str
    line_start: int
    heading: str | None
    created_heading: bool


class _NoteChanged(Exception):
    """Another program changed the note between our read and our write: start over on the fresh content."""


def parse_heading_arg(heading: str) -> tuple[int, str]:
    m = re.match(r"^(#{1,6})\s+(.*)$", heading.strip())
    return (len(m.group(1)), m.group(2).strip()) if m else (DEFAULT_NEW_HEADING_LEVEL, heading.strip())


def _clean_content(cfg: Config, content: str) -> str:
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
    if not _encodable(text):
        raise WriteRefusedError("content contains lone surrogate characters (invalid Unicode); pass plain text")
    return text


def _check_heading(heading: str | None, create_heading: bool) -> tuple[int, str] | None:
    """The parsed heading argument (level, text), or None; refuses headings no note line could hold."""
    if heading is None or not heading.strip():
        return None
    shown = heading.strip()[:SHOWN_HEADING_CHARS] + ("..." if len(heading.strip()) > SHOWN_HEADING_CHARS else "")
    if any(unicodedata.category(ch) == "Cc" for ch in heading.strip()) or not _encodable(heading):
        raise WriteRefusedError(
            f"heading {shown!r} contains a line break or control character; pass one line of heading text, e.g. 'TODO'"
        )
    level, text = parse_heading_arg(heading)
    if create_heading and len(text) > MAX_HEADING_CHARS:
        raise WriteRefusedError(
            f"heading {shown!r} has {len(text)} characters, over the {MAX_HEADING_CHARS} a created heading may have; "
            "pass a short heading and put the rest in the content"
        )
    return level, text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_allowed(cfg: Config, rel: str) -> tuple[Path, str, bool]:
    """Resolve and whitelist-check a path and, for a link, its target; returns (real path, normalized path, exists)."""
    target, norm = resolve_inside(cfg, rel, must_exist=False)
    real = Path(os.path.realpath(target))
    try:
        mode: int | None = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as e:
        raise WriteRefusedError(f"cannot open '{norm}': {e.strerror or e}; nothing was written") from e
    exists = mode is not None and stat.S_ISREG(mode)
    if mode is not None and not exists:
        raise WriteRefusedError(f"'{norm}' is not a regular file; appends go to notes only")
    real_rel = real.relative_to(os.path.realpath(cfg.kb_dir)).as_posix()
    shown = norm if real_rel == norm else f"{norm} (a link to {real_rel})"
    if real_rel != norm:
        # Defense in depth: a link, even a dangling one, must lead to a note path the resolver accepts.
        try:
            resolve_inside(cfg, real_rel, must_exist=False)
        except PathOutsideVaultError as e:
            raise WriteRefusedError(f"'{shown}' leads where appends may not go: {e}") from e
    if exists:
        allowed = (*cfg.writable, *cfg.creatable)
        if not (path_allowed(norm, allowed) and path_allowed(real_rel, allowed)):
            rules = "write.writable: " + (", ".join(cfg.writable) or "(empty)")
            raise WriteRefusedError(
                f"'{shown}' is not writable: the config's whitelist ({rules}) does not include it. "
                "Ask the user to add it to write.writable in config.yaml, or append to an allowed note."
            )
    elif not (path_allowed(norm, cfg.creatable) and path_allowed(real_rel, cfg.creatable)):
        creatable = ", ".join(cfg.creatable) or "(nothing)"
        raise WriteRefusedError(
            f"note '{shown}' does not exist and write.creatable ({creatable}) does not allow creating it; "
            "append to an existing allowed note instead"
        )
    _check_writable(real if exists else _existing_parent(real), shown)
    return real, norm, exists


def _existing_parent(path: Path) -> Path:
    """The nearest folder above a note to be created that exists (where its folders would be made)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _check_writable(path: Path, shown: str) -> None:
    """Refuse before writing anything when the note (or the folder a new note goes in) is read-only: a read-only
    mount, or permissions. Checked up front because an insert replaces the note by rename, which a folder's
    permissions allow even over a note its owner made read-only."""
    if os.access(path, os.W_OK):
        return
    try:
        mounted_ro = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        mounted_ro = False
    why = "the disk holding it is mounted read-only" if mounted_ro else "its permissions do not allow writing"
    what = "is read-only" if path.is_file() else f"cannot be created: its folder '{path.name}' is read-only"
    raise WriteRefusedError(
        f"'{shown}' {what} ({why}); nothing was written. Tell the user; appends work again once it is writable."
    )


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
    heading is added at the end only with `create_heading`. Every failure is a KBError (WriteRefusedError,
    PathOutsideVaultError, LockTimeoutError) with the reason; a refused append leaves the disk unchanged.
    Example: append_to_note(cfg, "inbox.md", "- call the vet", heading="TODO", create_heading=True)
    """
    text = _clean_content(cfg, content)
    wanted = _check_heading(heading, create_heading)
    real, norm, exists = _check_allowed(cfg, rel)
    now = time.time() if now is None else now
    lock = FileLock(cfg.index_dir / "append.lock")  # serializes appends across server processes: no lost write
    try:
        lock.acquire(cfg.lock_timeout_s)
    except OSError as e:
        raise WriteRefusedError(f"cannot take the append lock in {cfg.index_dir}: {e.strerror or e}; nothing was written") from e
    try:
        journal_path = cfg.index_dir / JOURNAL_NAME
        journal = _read_journal(journal_path, now, cfg.dedupe_window_s)
        key = _dedupe_key(norm, text)
        for _ in range(MAX_APPEND_ATTEMPTS):
            try:
                result = _append_once(cfg, real, norm, exists, text, wanted, create_heading, journal, key)
                break
            except _NoteChanged:
                continue
            except OSError as e:
                raise WriteRefusedError(f"cannot append to '{norm}': {e.strerror or e}; check the note and the disk") from e
        else:
            raise WriteRefusedError(
                f"'{norm}' changed {MAX_APPEND_ATTEMPTS} times while the append was being written (another program "
                "keeps writing to it); nothing was written. Try again in a moment."
            )
        if not result.duplicate:
            journal.append({"key": key, "path": norm, "at": now})
            try:
                atomic_write_text(journal_path, json.dumps(journal), durable=False)
            except OSError as e:  # the note is written; only de-duplication of a retry is lost
                logger.warning("could not record the append in %s: %s", journal_path, e)
    finally:
        lock.release()
    return result


def _append_once(
    cfg: Config,
    real: Path,
    norm: str,
    existed: bool,
    text: str,
    wanted: tuple[int, str] | None,
    create_heading: bool,
    journal: list[dict],
    key: str,
) -> AppendResult:
    """One attempt: read the note, place the text, write it; raises _NoteChanged if the note moved under us."""
    snap = _read_snapshot(real, cfg.max_file_bytes, norm)
    if snap is None and existed:
        raise WriteRefusedError(f"'{norm}' was deleted while appending; nothing was written")
    body, encoding = "", "utf-8"
    if snap is not None:
        try:
            body, encoding = decode_note(snap.raw)
        except ValueError as e:
            raise WriteRefusedError(f"'{norm}' cannot be appended to safely: {e}") from e
    flat = "\n".join(split_lines(body))
    if any(e.get("key") == key for e in journal) and text in flat:
        line = flat[: flat.rfind(text)].count("\n") + 1
        return AppendResult(
            norm,
            line,
            line + text.count("\n"),
            wanted[1] if wanted else None,
            created_note=False,
            created_heading=False,
            duplicate=True,
            chars=0,
        )
    placed = _place(body, text, wanted, create_heading, norm)
    codec, bom = NOTE_ENCODINGS[encoding]
    if snap is None:
        _create(real, placed.body.encode(codec))
    elif placed.body.startswith(body):
        _append_in_place(real, snap, placed.body[len(body) :].encode(codec))
    else:
        _replace(real, snap, bom + placed.body.encode(codec), cfg.max_file_bytes)
    line_end = placed.line_start + text.count("\n") + (2 if placed.created_heading else 0)
    return AppendResult(
        norm,
        placed.line_start,
        line_end,
        placed.heading,
        created_note=snap is None,
        created_heading=placed.created_heading,
        duplicate=False,
        chars=len(text),
    )


def _place(body: str, text: str, wanted: tuple[int, str] | None, create_heading: bool, norm: str) -> _Placement:
    """Where `text` goes in `body` (at the end, or at the end of the wanted section) and the resulting note text."""
    newline = "\r\n" if "\r\n" in body else "\r" if "\r" in body and "\n" not in body else "\n"
    lines = split_lines(body)
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    # The same lines with their own endings: existing text is written back byte for byte, even with mixed endings.
    raw_lines = _LINE_RE.findall(body)
    insert_at, created_heading, heading_text = len(lines), False, None
    block = text.split("\n")
    if wanted is not None:
        level, heading_text = wanted
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
    line_start = len(before) + (1 if block[0] == "" else 0) + 1
    head = "".join(raw_lines[:insert_at])
    if head and not head.endswith(("\n", "\r")):
        head += newline  # the note lacked a final newline
    new_body = head + "".join(b + newline for b in block) + "".join(raw_lines[insert_at:])
    return _Placement(new_body, line_start, heading_text, created_heading)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _read_snapshot(real: Path, max_bytes: int, norm: str) -> _Snapshot | None:
    """The note's bytes and identity, or None if there is no such file; _NoteChanged if it changed while read."""
    try:
        before = os.stat(real)
    except FileNotFoundError:
        return None
    try:
        raw = read_note_bytes(real, max_bytes)
    except ValueError as e:  # not a regular file, or over max_file_bytes
        raise WriteRefusedError(f"'{norm}' cannot be appended to: {e}") from e
    if _identity(os.stat(real)) != _identity(before):
        raise _NoteChanged
    return _Snapshot(raw, _identity(before), stat.S_IMODE(before.st_mode))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _append_in_place(real: Path, snap: _Snapshot, data: bytes) -> None:
    """Add bytes at the end of the note. O_APPEND puts them after whatever another program wrote meanwhile, so
    nothing is lost; if the note changed since it was read, start over so the placement stays right."""
    fd = os.open(real, _APPEND_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or _identity(st) != snap.identity:
            raise _NoteChanged
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as e:
            _roll_back(fd, real, st.st_size, len(data), e)
    finally:
        os.close(fd)


def _roll_back(fd: int, real: Path, size: int, length: int, error: OSError) -> None:
    """An append failed part-way (a full disk, a quota): cut the note back to its size before it, so it never ends
    in half a block, and raise saying so. Only our own bytes are cut: if the note grew by more than we wrote
    (another program appended meanwhile), it is left as it is and the error says what may remain."""
    reason = error.strerror or str(error)
    try:
        now = os.fstat(fd).st_size
        if size <= now <= size + length:
            os.ftruncate(fd, size)
            os.fsync(fd)
            raise WriteRefusedError(
                f"cannot append to '{real.name}': {reason}; nothing was appended (the note is as it was). "
                "Free some space on that disk and try again"
            ) from error
    except OSError as e:
        raise WriteRefusedError(
            f"cannot append to '{real.name}': {reason}, and cutting the partial text back failed ({e.strerror or e}); "
            f"the note may end with part of the text: check its end"
        ) from error
    raise WriteRefusedError(
        f"cannot append to '{real.name}': {reason}; another program wrote to the note meanwhile, so it was left as "
        "it is: check its end"
    ) from error


def _replace(real: Path, snap: _Snapshot, data: bytes, max_bytes: int) -> None:
    """Replace the note with its new content (an insert inside it), if it is still what was read.

    Known window: a write another program makes between this check and the rename inside atomic_write_bytes (the
    time to write and fsync the temp copy, milliseconds) is lost. Appends at the end of a note, the common case,
    go through _append_in_place and have no such window.
    """
    if _identity(os.stat(real)) != snap.identity or read_note_bytes(real, max_bytes) != snap.raw:
        raise _NoteChanged
    atomic_write_bytes(real, data, mode=snap.mode)


def _create(real: Path, data: bytes) -> None:
    """Create a new note; if one appeared meanwhile, start over and append to it instead."""
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(real, _CREATE_FLAGS, NEW_NOTE_MODE)
    except FileExistsError:
        raise _NoteChanged from None
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as e:  # a full disk: leave no half-written new note behind
        os.close(fd)
        real.unlink(missing_ok=True)
        raise WriteRefusedError(
            f"cannot create '{real.name}': {e.strerror or e}; nothing was written. Free some space and try again"
        ) from e
    else:
        os.close(fd)
