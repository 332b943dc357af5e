"""Note discovery, ignore rules (built-in folders, config globs, .kbignore files), safe path resolution and
the one safe way to read a note's bytes.

`resolve_inside` is the one boundary every read and write of a user-named note passes; `read_note_bytes` never
blocks on a FIFO or reads past a size limit. Over 500 lines for a reason: discovery and the resolver must agree on
every rule (ignore files, hidden folders, symlinks, Unicode forms of a name), so the rules live in one module.
Imports: kb_config.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kb_config import Config, KBError, PathOutsideVaultError

logger = logging.getLogger(__name__)

# Folders never indexed, besides every hidden one (.git, .obsidian, .trash, .logseq, ...).
IGNORED_DIR_NAMES = frozenset({"node_modules", "__pycache__", ".git", ".obsidian", ".trash", ".logseq"})
# gitignore-style file read in any folder of the vault; its patterns apply below that folder.
KBIGNORE_NAME = ".kbignore"
# A Logseq graph's own folder at the vault root (config.edn, bak/ copies of pages, version files): never notes.
LOGSEQ_DIR = "logseq"
# Windows drive prefix such as "C:" in a user-supplied path.
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
# Percent-encoding such as "%2e" or "%20" in a path: a URL habit, never meant literally for a new note.
_PERCENT_RE = re.compile(r"%[0-9A-Fa-f]{2}")
# Longest file or folder name most file systems allow (NAME_MAX), in bytes of UTF-8.
MAX_NAME_BYTES = 255
# Longest whole path Linux allows (PATH_MAX), in bytes; Windows and macOS allow no more.
MAX_PATH_BYTES = 4096
# How much of a refused path a message quotes (a hostile path may be thousands of characters long).
SHOWN_PATH_CHARS = 120
# Flags for opening a note to read: never block on a FIFO, never let a terminal device become ours.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
# Bytes read per call while reading a note.
_READ_BLOCK_BYTES = 1 << 20
# (path, reason) pairs already logged as warnings: scan_vault runs before every search, so say each once.
_warned: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class IgnoreRule:
    """One gitignore-style pattern, anchored at `base` (a vault-relative folder, "" for the root)."""

    base: str
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    basename_only: bool  # a pattern without "/" matches the name at any depth


def _glob_to_regex(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern[i : i + 2] == "**":
                i += 2
                if i < n and pattern[i] == "/":
                    out.append("(?:.*/)?")  # "**/" matches zero or more folders
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_ignore_lines(lines: list[str], base: str = "") -> list[IgnoreRule]:
    """Compile gitignore-style lines (comments, blank lines, `!negation`, trailing `/` for folders)."""
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.strip("/") if dir_only else line
        anchored = line.startswith("/") or "/" in line
        line = line.lstrip("/")
        if not line:
            continue
        regex = re.compile(_glob_to_regex(line) + "$")
        rules.append(IgnoreRule(base, regex, negate, dir_only, basename_only=not anchored))
    return rules


def _is_ignored(rules: list[IgnoreRule], rel: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.base:
            if not rel.startswith(rule.base + "/"):
                continue
            sub = rel[len(rule.base) + 1 :]
        else:
            sub = rel
        target = sub.rsplit("/", 1)[-1] if rule.basename_only else sub
        if rule.regex.match(target):
            ignored = not rule.negate
    return ignored


def _read_kbignore(folder: Path, base: str) -> list[IgnoreRule]:
    try:
        text = (folder / KBIGNORE_NAME).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        logger.warning("cannot read %s: %s; its patterns are not applied", folder / KBIGNORE_NAME, e)
        return []
    return parse_ignore_lines(text.splitlines(), base)


def config_rules(cfg: Config) -> list[IgnoreRule]:
    """Ignore rules from the config's `ignore` globs (anchored at the vault root)."""
    return parse_ignore_lines(list(cfg.ignore), "")


# A note's change signature: (mtime_ns, size, ctime_ns, inode). Size and mtime alone miss an edit that keeps both
# (`rsync -t`, backup restores and some sync clients set mtime back); ctime cannot be set back by a user and an
# editor's save-by-rename gives a new inode, as git's index also compares them. A differing signature only means
# "read it again": the md5 decides whether anything is re-chunked or re-embedded.
Stat = tuple[int, int, int, int]


def note_stat(st: os.stat_result) -> Stat:
    """The change signature of a stat result (see Stat)."""
    return (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)


class VaultScan(dict[str, Stat]):
    """scan_vault's result: {relative posix path: Stat} for every note, plus `skipped`:
    {path: reason} for entries named like notes that cannot be indexed (a name that is not UTF-8, a FIFO or other
    non-regular file, a dangling or looping symlink, a link out of the vault). Ignored files are not listed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[str, str] = {}

    def skip(self, rel: str, reason: str) -> None:
        """Record why an entry is not indexed, and log it (once per process: the scan runs before every search)."""
        shown = shown_name(rel)
        self.skipped[shown] = reason
        if (shown, reason) not in _warned:
            _warned.add((shown, reason))
            logger.warning("skipping %s: %s", shown, reason)


def shown_name(name: str) -> str:
    """A file name safe to print and store as JSON: bytes that are not UTF-8 appear as \\xNN escapes.

    Example: shown_name(os.fsdecode(b"caf\\xe9.md")) -> "caf\\\\xe9.md"
    """
    if _is_utf8(name):
        return name
    try:
        raw = name.encode("utf-8", "surrogateescape")  # undecodable bytes as the OS gave them
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("ascii")  # other lone surrogates, e.g. from JSON
    return raw.decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    """False for a name with undecodable bytes (the OS hands them over as lone surrogates)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _file_kind(mode: int) -> str:
    """What a file that is not a regular file is ("a FIFO (named pipe)", "a folder", ...), for messages."""
    kinds = [
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ]
    return next((kind for test, kind in kinds if test(mode)), "a special file")


def _stat_failure(entry: os.DirEntry[str], e: OSError) -> str | None:
    """Why a note entry cannot be stat'ed, for the skipped list; None when it simply vanished mid-scan."""
    if entry.is_symlink():
        if e.errno == errno.ELOOP:
            return "symlink loop (the link leads back to itself); fix or remove the link"
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "dangling symlink (its target does not exist); fix or remove the link"
    if e.errno == errno.ENOENT:
        return None
    return f"cannot stat it ({e.strerror or e})"


def scan_vault(cfg: Config) -> VaultScan:
    """Walk the vault and return {relative posix path: Stat} for every note not ignored.

    Only regular files are notes; entries named like notes that cannot be indexed are in the result's `skipped`.
    Stat pairs are plain tuples and the loop is kept lean: this walk runs before every search (about 30 ms for
    9,000 notes here). Symlinked folders are not followed; a symlinked note counts only if it stays in the vault.
    """
    root = cfg.kb_dir
    exts = tuple(cfg.extensions)
    out = VaultScan()
    stack: list[tuple[str, str, list[IgnoreRule]]] = [(str(root), "", config_rules(cfg))]
    root_real = os.path.realpath(root)
    skip = IGNORED_DIR_NAMES
    graph = is_logseq_graph(root)
    while stack:
        folder, prefix, rules = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            logger.warning("cannot list folder %s: %s; its notes are skipped", folder, e.strerror)
            continue
        if any(e.name == KBIGNORE_NAME for e in entries):
            rules = rules + _read_kbignore(Path(folder), prefix.rstrip("/"))
        for entry in entries:
            name = entry.name
            if name[0] == "." or name in skip:
                continue
            rel = prefix + name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if (rules and _is_ignored(rules, rel, True)) or (graph and rel == LOGSEQ_DIR):
                        continue
                    if _is_utf8(name):
                        stack.append((entry.path, rel + "/", rules))
                    else:
                        out.skip(rel + "/", "folder name is not valid UTF-8, so its notes are skipped; rename the folder")
                    continue
                if not (name.endswith(exts) or name.lower().endswith(exts)):
                    continue
                if rules and _is_ignored(rules, rel, False):
                    continue
                if not _is_utf8(name):
                    out.skip(rel, "file name is not valid UTF-8; rename the note")
                    continue
                st = entry.stat()
            except OSError as e:
                reason = _stat_failure(entry, e)
                if reason:
                    out.skip(rel, reason)
                continue
            if not stat.S_ISREG(st.st_mode):
                kind = _file_kind(st.st_mode)
                what = f"a symlink to {kind.removeprefix('a ')}" if entry.is_symlink() else kind
                out.skip(rel, f"{what}, not a regular file; only regular files are notes")
                continue
            if entry.is_symlink() and not _inside(os.path.realpath(entry.path), root_real):
                out.skip(rel, "symlink to a file outside the vault; the index does not follow it")
                continue
            out[rel] = note_stat(st)
    return out


def read_note_bytes(path: Path, max_bytes: int) -> bytes:
    """A note's bytes, read without ever blocking: only a regular file of at most `max_bytes` is read.

    Checks with stat before opening (an ordinary open of a FIFO blocks), opens non-blocking, and checks the opened
    file again (it may have been swapped meanwhile). Raises OSError (cannot read) or ValueError (not a regular
    file, or too large), each with a message fit for the skipped list.
    """
    _check_readable(os.stat(path), max_bytes)
    fd = os.open(path, _READ_FLAGS)
    try:
        _check_readable(os.fstat(fd), max_bytes)
        parts: list[bytes] = []
        left = max_bytes + 1  # one byte more than allowed tells a file that grew past the limit
        while left > 0:
            block = os.read(fd, min(left, _READ_BLOCK_BYTES))
            if not block:
                break
            parts.append(block)
            left -= len(block)
    finally:
        os.close(fd)
    data = b"".join(parts)
    if len(data) > max_bytes:
        raise ValueError(f"larger than max_file_bytes (grew past {max_bytes} bytes while being read)")
    return data


def _check_readable(st: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{_file_kind(st.st_mode)}, not a regular file; only regular files are notes")
    if st.st_size > max_bytes:
        raise ValueError(f"larger than max_file_bytes ({st.st_size} > {max_bytes} bytes)")


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _rules_along(cfg: Config, parts: tuple[str, ...]) -> list[IgnoreRule]:
    rules = config_rules(cfg)
    folder = cfg.kb_dir
    for i in range(len(parts)):
        if (folder / KBIGNORE_NAME).is_file():
            rules += _read_kbignore(folder, "/".join(parts[:i]))
        folder = folder / parts[i]
    return rules


def resolve_inside(cfg: Config, rel: str, *, must_exist: bool = True) -> tuple[Path, str]:
    """Resolve a user-supplied note path to (absolute path, normalized vault-relative posix path).

    Accepts a path relative to the vault, or an absolute one that lies inside it. Refuses empty, over-long,
    percent-encoded or non-UTF-8 paths, `..`, hidden or ignored folders, non-note extensions, files that are not
    regular files and symlinks that leave the vault, raising PathOutsideVaultError with the reason and what to pass
    instead; it never lets an OSError through.
    Example: resolve_inside(cfg, "projects/x.md") -> (Path("/home/u/notes/projects/x.md"), "projects/x.md")
    """
    vault = cfg.kb_dir
    if not isinstance(rel, str) or not rel.strip() or "\x00" in rel:
        raise PathOutsideVaultError(f"note path {rel!r} is empty or malformed; pass a path relative to the vault {vault}")
    shown = _shown_path(rel)
    if not _is_utf8(rel):
        raise PathOutsideVaultError(f"note path '{shown}' is not valid UTF-8; rename the file to a UTF-8 name")
    text = rel.strip().replace("\\", "/")
    if text.startswith(("/", "~")) or _DRIVE_RE.match(text):
        text = _relative_to_vault(text, vault, shown)
    raw_parts = PurePosixPath(text).parts
    if ".." in raw_parts:
        raise PathOutsideVaultError(
            f"'{shown}' leaves the vault {vault} ('..' is not allowed); pass a path relative to the vault"
        )
    parts = tuple(p for p in raw_parts if p not in ("", "."))
    if not parts:
        raise PathOutsideVaultError(f"'{shown}' names the vault folder itself, not a note; pass a note path such as 'inbox.md'")
    _check_length(vault, parts, shown)
    for p in parts:
        if p.startswith(".") or p in IGNORED_DIR_NAMES:
            raise PathOutsideVaultError(
                f"'{shown}' is in a hidden or ignored folder/file ('{p}'); only notes the index sees are allowed"
            )
    if len(parts) > 1 and parts[0] == LOGSEQ_DIR and is_logseq_graph(vault):
        raise PathOutsideVaultError(f"'{shown}' is in the Logseq graph's own folder ('{LOGSEQ_DIR}/'), which holds no notes")
    norm = "/".join(parts)
    if PurePosixPath(norm).suffix.lower() not in cfg.extensions:
        raise PathOutsideVaultError(f"'{shown}' is not a note: allowed extensions are {', '.join(cfg.extensions)}")
    try:
        return _resolve_on_disk(cfg, parts, norm, shown, must_exist)
    except OSError as e:  # e.g. EACCES on a folder, or a name the file system refuses
        raise PathOutsideVaultError(
            f"cannot open '{shown}' in the vault {vault}: {e.strerror or e}; pass another note path"
        ) from e


def _resolve_on_disk(cfg: Config, parts: tuple[str, ...], norm: str, shown: str, must_exist: bool) -> tuple[Path, str]:
    """resolve_inside's checks that look at the disk: ignore rules, links, what the path is."""
    vault = cfg.kb_dir
    target = vault / Path(*parts)
    percent = _PERCENT_RE.search(norm)
    if percent and not os.path.lexists(target):  # an existing note may carry '%20' in its name; a new one may not
        raise PathOutsideVaultError(
            f"'{shown}' contains percent-encoding ('{percent.group(0)}'); pass the path as plain text, "
            "e.g. 'my note.md' rather than 'my%20note.md'"
        )
    rules = _rules_along(cfg, parts)
    for i in range(1, len(parts) + 1):
        if _is_ignored(rules, "/".join(parts[:i]), i < len(parts)):
            raise PathOutsideVaultError(f"'{shown}' is excluded by the ignore rules (config 'ignore' or a .kbignore file)")
    real = Path(os.path.realpath(target))
    if not _inside(str(real), os.path.realpath(vault)):
        raise PathOutsideVaultError(f"'{shown}' resolves to {real}, outside the vault {vault} (symlink escape); refused")
    # Defense in depth: scan_vault never follows folder symlinks, and one could rename a hidden or ignored folder.
    for i in range(1, len(parts)):
        if (vault / Path(*parts[:i])).is_symlink():
            link = "/".join(parts[:i])
            raise PathOutsideVaultError(
                f"'{shown}' goes through the symlinked folder '{link}', which the index does not follow; pass the real path"
            )
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise PathOutsideVaultError(f"'{norm}' is {_file_kind(mode)}, not a regular file; only regular files are notes")
    if must_exist and not (mode is not None and stat.S_ISREG(mode)):
        raise missing_note_error(cfg, norm)
    return target, norm


def missing_note_error(cfg: Config, norm: str) -> PathOutsideVaultError:
    """What reading a note that is not there raises (also a private note, to a client that must not see it)."""
    return PathOutsideVaultError(
        f"note '{norm}' does not exist in the vault {cfg.kb_dir}; use list_notes or search to find the path"
    )


def _shown_path(rel: str) -> str:
    """A user-supplied path as a message quotes it: printable, and cut if very long."""
    shown = shown_name(rel)
    if len(shown) <= SHOWN_PATH_CHARS:
        return shown
    return f"{shown[:SHOWN_PATH_CHARS]}... ({len(shown)} characters)"


def _relative_to_vault(text: str, vault: Path, shown: str) -> str:
    """The vault-relative part of an absolute path (or ~ path) that lies inside the vault; refuses any other."""
    candidate = Path(os.path.expanduser(text))
    if candidate.is_absolute():
        for base in (vault, Path(os.path.realpath(vault))):
            try:
                return candidate.relative_to(base).as_posix()
            except ValueError:
                continue
    raise PathOutsideVaultError(
        f"'{shown}' is an absolute path outside the vault {vault}; pass a path relative to the vault, e.g. 'inbox.md'"
    )


def _check_length(vault: Path, parts: tuple[str, ...], shown: str) -> None:
    """Refuse names and paths longer than file systems allow, before any system call sees them."""
    for p in parts:
        size = len(p.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise PathOutsideVaultError(
                f"'{shown}' has a file or folder name of {size} bytes, over the {MAX_NAME_BYTES} that file systems "
                "allow; pass a shorter name"
            )
    size = len(os.fsencode(vault)) + sum(len(p.encode("utf-8")) + 1 for p in parts)
    if size > MAX_PATH_BYTES:
        raise PathOutsideVaultError(
            f"'{shown}' makes a path of {size} bytes in the vault {vault}, over the {MAX_PATH_BYTES} that file "
            "systems allow; pass a shorter path"
        )


def is_logseq_graph(root: Path) -> bool:
    """A Logseq graph keeps its settings in logseq/config.edn at its root."""
    return (root / LOGSEQ_DIR / "config.edn").is_file()


def note_rel_path(cfg: Config, path: str | Path) -> str | None:
    """Map an absolute path (e.g. from a file watcher) to its vault-relative note path, or None if not a note."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(cfg.kb_dir)
    except ValueError:
        return None
    try:
        return resolve_inside(cfg, rel.as_posix(), must_exist=False)[1]
    except PathOutsideVaultError as e:
        logger.debug("not a note path: %s", e)
        return None


def path_allowed(norm: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Does a normalized vault-relative note path match a whitelist entry?

    Entries are exact files ("inbox.md"), folders ("daily/": anything below) or globs ("daily/*.md", "**/inbox.md").
    """
    for raw in patterns:
        entry = raw.strip().replace("\\", "/").lstrip("/")
        if not entry:
            continue
        if entry.endswith("/"):
            if norm.startswith(entry):
                return True
        elif any(ch in entry for ch in "*?["):
            if re.fullmatch(_glob_to_regex(entry), norm):
                return True
        elif norm == entry:
            return True
    return False


# Longest look-back a "modified within N days" filter takes: 100 years (a bigger number means "any time").
MAX_MODIFIED_WITHIN_DAYS = 36_500
_SECONDS_PER_DAY = 86_400


def normalize_prefix(prefix: str | None) -> str:
    """A folder filter as a user or model writes it -> vault-relative posix folder ("" for the whole vault).

    Example: normalize_prefix("\\\\projects\\\\alpha/") -> "projects/alpha"; normalize_prefix("./") -> "".
    """
    if not prefix:
        return ""
    parts = [p for p in PurePosixPath(prefix.strip().replace("\\", "/")).parts if p not in ("", ".", "/")]
    return "/".join(parts)


def under_prefix(path: str, prefix: str) -> bool:
    """Is the vault-relative note `path` in the folder `prefix` (from normalize_prefix; "" holds everything)?"""
    return not prefix or path == prefix or path.startswith(prefix + "/")


def modified_cutoff(days: float | None, now: float | None = None) -> float | None:
    """Epoch seconds a note's mtime must reach to count as modified within `days` (None: no filter).

    Raises KBError for a value that is not a number of days in (0, MAX_MODIFIED_WITHIN_DAYS].
    Example: modified_cutoff(7) -> time.time() - 604800.
    """
    if days is None:
        return None
    try:
        value = float(days)
    except (TypeError, ValueError):
        value = math.nan
    if not (0 < value <= MAX_MODIFIED_WITHIN_DAYS):  # also rejects NaN and infinities
        raise KBError(
            f"modified_within_days must be a number of days above 0 and at most {MAX_MODIFIED_WITHIN_DAYS} "
            f"(got {days!r}); leave it out to search notes of any age"
        )
    return (time.time() if now is None else now) - value * _SECONDS_PER_DAY
