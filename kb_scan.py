"""Note discovery, ignore rules (built-in folders, config globs, .kbignore files) and safe path resolution.

`resolve_inside` is the one boundary every read and write of a user-named note passes. Imports kb_config only.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kb_config import Config, PathOutsideVaultError

logger = logging.getLogger(__name__)

# Folders never indexed, besides every hidden one (.git, .obsidian, .trash, .logseq, ...).
IGNORED_DIR_NAMES = frozenset({"node_modules", "__pycache__", ".git", ".obsidian", ".trash", ".logseq"})
# gitignore-style file read in any folder of the vault; its patterns apply below that folder.
KBIGNORE_NAME = ".kbignore"
# Windows drive prefix such as "C:" in a user-supplied path.
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


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


def scan_vault(cfg: Config) -> dict[str, tuple[int, int]]:
    """Walk the vault and return {relative posix path: (mtime_ns, size)} for every note not ignored.

    Stat pairs are plain tuples and the loop is kept lean: this walk runs before every search (about 30 ms for
    9,000 notes here). Symlinked folders are not followed; a symlinked note counts only if it stays in the vault.
    """
    root = cfg.kb_dir
    exts = tuple(cfg.extensions)
    out: dict[str, tuple[int, int]] = {}
    stack: list[tuple[str, str, list[IgnoreRule]]] = [(str(root), "", config_rules(cfg))]
    root_real = os.path.realpath(root)
    skip = IGNORED_DIR_NAMES
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
            try:
                if entry.is_dir(follow_symlinks=False):
                    child = prefix + name
                    if not (rules and _is_ignored(rules, child, True)):
                        stack.append((entry.path, child + "/", rules))
                    continue
                if not (name.endswith(exts) or name.lower().endswith(exts)):
                    continue
                if entry.is_symlink() and (entry.is_dir() or not _inside(os.path.realpath(entry.path), root_real)):
                    logger.debug("skipping symlink %s%s", prefix, name)
                    continue
                if rules and _is_ignored(rules, prefix + name, False):
                    continue
                st = entry.stat()
            except OSError as e:
                logger.warning("cannot stat %s%s: %s; skipped", prefix, name, e.strerror)
                continue
            out[prefix + name] = (st.st_mtime_ns, st.st_size)
    return out


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

    Refuses empty paths, absolute paths, `..`, hidden or ignored folders, non-note extensions and symlinks
    that leave the vault, raising PathOutsideVaultError with the reason and what to pass instead.
    Example: resolve_inside(cfg, "projects/x.md") -> (Path("/home/u/notes/projects/x.md"), "projects/x.md")
    """
    vault = cfg.kb_dir
    if not isinstance(rel, str) or not rel.strip() or "\x00" in rel:
        raise PathOutsideVaultError(f"note path {rel!r} is empty or malformed; pass a path relative to the vault {vault}")
    text = rel.strip().replace("\\", "/")
    if text.startswith(("/", "~")) or _DRIVE_RE.match(text):
        raise PathOutsideVaultError(f"'{rel}' is an absolute path; pass a path relative to the vault {vault}, e.g. 'inbox.md'")
    parts = tuple(p for p in PurePosixPath(text).parts if p not in ("", "."))
    if not parts or ".." in parts:
        raise PathOutsideVaultError(f"'{rel}' leaves the vault {vault} ('..' is not allowed); pass a path relative to the vault")
    for p in parts:
        if p.startswith(".") or p in IGNORED_DIR_NAMES:
            raise PathOutsideVaultError(
                f"'{rel}' is in a hidden or ignored folder/file ('{p}'); only notes the index sees are allowed"
            )
    norm = "/".join(parts)
    if PurePosixPath(norm).suffix.lower() not in cfg.extensions:
        raise PathOutsideVaultError(f"'{rel}' is not a note: allowed extensions are {', '.join(cfg.extensions)}")
    rules = _rules_along(cfg, parts)
    for i in range(1, len(parts) + 1):
        if _is_ignored(rules, "/".join(parts[:i]), i < len(parts)):
            raise PathOutsideVaultError(f"'{rel}' is excluded by the ignore rules (config 'ignore' or a .kbignore file)")
    target = vault / Path(*parts)
    real = Path(os.path.realpath(target))
    if not _inside(str(real), os.path.realpath(vault)):
        raise PathOutsideVaultError(f"'{rel}' resolves to {real}, outside the vault {vault} (symlink escape); refused")
    # Defense in depth: scan_vault never follows folder symlinks, and one could rename a hidden or ignored folder.
    for i in range(1, len(parts)):
        if (vault / Path(*parts[:i])).is_symlink():
            link = "/".join(parts[:i])
            raise PathOutsideVaultError(
                f"'{rel}' goes through the symlinked folder '{link}', which the index does not follow; pass the real path"
            )
    if must_exist and not real.is_file():
        raise PathOutsideVaultError(
            f"note '{norm}' does not exist in the vault {vault}; use list_notes or search to find the path"
        )
    return target, norm


def note_rel_path(cfg: Config, path: str | Path) -> str | None:
    """Map an absolute path (e.g. from a file watcher) to its vault-relative note path, or None if not a note."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(cfg.kb_dir)
    except ValueError:
        return None
    try:
        return resolve_inside(cfg, rel.as_posix(), must_exist=False)[1]
    except PathOutsideVaultError:
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
