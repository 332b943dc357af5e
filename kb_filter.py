"""The one note filter of the tools: folder (path_prefix), tag, modified within N days, properties (`where`), note
dates and, for a remote client without the notes:private scope, private notes; validated once from the tool's arguments
and then asked per note by search and list_notes (read_note, related_notes and index_status ask PrivateNotes alone).

Pure: records in, booleans out (the current time is read once, when the filter is built).
Imports: kb_config, kb_frontmatter, kb_scan, kb_state.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kb_config import KBError
from kb_frontmatter import iso_date
from kb_scan import modified_cutoff, normalize_prefix, under_prefix
from kb_state import FileRecord

# Property keys named in a bad-filter error, at most.
KEYS_IN_ERROR = 40
# The property that makes one note private (server.private_paths makes whole folders private), and its value.
VISIBILITY_KEY, PRIVATE_VALUE = "visibility", "private"


def _glob_pattern(glob: str) -> re.Pattern[str]:
    """A server.private_paths glob as a regular expression over vault paths: `**` any depth (`**/` none too), `*` and
    `?` within one folder; a folder name alone or with a trailing `/` covers everything in it; case-insensitive (a
    case-insensitive file system would serve `private/x.md` for `Private/x.md`)."""
    g = glob.strip().replace("\\", "/").lstrip("/")
    while g.startswith("./"):
        g = g[2:]
    if g.endswith("/") or not any(c in g for c in "*?") and "." not in g.rsplit("/", 1)[-1]:
        g = g.rstrip("/") + "/**"
    out, i = [], 0
    while i < len(g):
        if g.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif g.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            out.append({"*": "[^/]*", "?": "[^/]"}.get(g[i]) or re.escape(g[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class PrivateNotes:
    """The notes a remote client without notes:private never sees: `visibility: private` in a note's properties, or a
    path that one of server.private_paths' globs covers.

    Example: PrivateNotes.of(["Private/**", "journal/"]).covers("journal/2026-03-02.md", rec) -> True
    """

    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def of(cls, globs: Iterable[str]) -> PrivateNotes:
        return cls(tuple(_glob_pattern(g) for g in globs if g and g.strip()))

    def covers(self, path: str, rec: FileRecord | None) -> bool:
        if rec is not None and any(v.strip().lower() == PRIVATE_VALUE for v in rec.properties.get(VISIBILITY_KEY, ())):
            return True
        return any(p.match(path) for p in self.patterns)


@dataclass(frozen=True)
class NoteFilter:
    """Which notes a tool call looks at. Build it with NoteFilter.of(...) (which validates); `accepts(path, record)`.

    Example: NoteFilter.of(path_prefix="./projects/", tag="#work", property_keys=["status"], where={"status": "done"})
    """

    folder: str = ""  # normalized path_prefix ("" for the whole vault)
    tag: str | None = None  # lower-cased, without '#'; a tag also matches its nested tags ("work" matches "work/x")
    since: float | None = None  # epoch seconds the note's time must reach (modified_within_days)
    where: dict[str, frozenset[str]] | None = None  # lower-cased property key -> accepted values
    date_from: str | None = None  # ISO dates the note's day must lie between (both included)
    date_to: str | None = None
    private: PrivateNotes | None = None  # notes hidden from this call (None: the owner, who sees every note)

    @classmethod
    def of(
        cls,
        path_prefix: str | None = None,
        tag: str | None = None,
        modified_within_days: float | None = None,
        where: Mapping[str, Any] | None = None,
        date_from: str | None = None,
        date_to: str | None = None,
        property_keys: Iterable[str] = (),
        private: PrivateNotes | None = None,
    ) -> NoteFilter:
        """The filter of a tool call's arguments; raises KBError saying what is wrong with one (and what is valid)."""
        tag_norm = tag.strip().lstrip("#").lower() if tag and tag.strip() else None
        return cls(
            normalize_prefix(path_prefix),
            tag_norm or None,
            modified_cutoff(modified_within_days),
            check_where(where, property_keys),
            check_date("date_from", date_from),
            check_date("date_to", date_to),
            private,
        )

    @property
    def active(self) -> bool:
        """Whether it rules out any note at all."""
        return bool(self.folder or self.tag or self.where) or any(
            v is not None for v in (self.since, self.date_from, self.date_to, self.private)
        )

    def accepts(self, path: str, rec: FileRecord | None) -> bool:
        if rec is None or not under_prefix(path, self.folder):
            return False
        if self.private is not None and self.private.covers(path, rec):
            return False
        if self.tag and not any(t.lower() == self.tag or t.lower().startswith(self.tag + "/") for t in rec.tags):
            return False
        if self.since is not None and note_time(rec) < self.since:
            return False
        if self.where is not None and not matches_where(rec, self.where):
            return False
        if self.date_from is None and self.date_to is None:
            return True
        day = note_day(rec)
        return (self.date_from is None or day >= self.date_from) and (self.date_to is None or day <= self.date_to)


def check_where(where: Mapping[str, Any] | None, property_keys: Iterable[str]) -> dict[str, frozenset[str]] | None:
    """Validate a `where` filter into {lower-cased key: accepted values}. Raises KBError naming the valid keys.

    Values are compared as text ("3", "true", "2026-03-02"); a list value accepts any of its items.
    """
    if not where:
        return None
    known = set(property_keys)
    out: dict[str, frozenset[str]] = {}
    for key, value in where.items():
        k = str(key).strip().lower()
        if k not in known:
            shown = ", ".join(sorted(known)[:KEYS_IN_ERROR]) or "none (no note has properties)"
            raise KBError(f"where: no note has the property '{key}'; the vault's property keys are: {shown}")
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) or v is None for v in values):
            raise KBError(f"where: '{key}' needs a text, number or boolean value, or a list of them (got {value!r})")
        out[k] = frozenset(_as_text(v) for v in values)
    return out


def _as_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def matches_where(rec: FileRecord, where: Mapping[str, Iterable[str]]) -> bool:
    """Exact match on a single value, membership on a list; case-insensitive."""
    for key, wanted in where.items():
        have = {v.lower() for v in rec.properties.get(key, ())}
        if not have & {w.lower() for w in wanted}:
            return False
    return True


def check_date(name: str, value: str | None) -> str | None:
    """A `date_from`/`date_to` argument as an ISO date, or a KBError saying the form."""
    if value is None or not str(value).strip():
        return None
    day = iso_date(str(value).strip())
    if day is None:
        raise KBError(f"{name} must be a date like 2026-03-02 (got {value!r})")
    return day


def note_day(rec: FileRecord) -> str:
    """The note's date: a journal's or daily note's own date, else the day it was last modified (local time)."""
    return rec.date or time.strftime("%Y-%m-%d", time.localtime(rec.mtime_ns / 1e9))


def note_time(rec: FileRecord) -> float:
    """Seconds since the epoch for "modified within N days": a journal's date (its end of day), else its mtime."""
    if rec.date:
        try:
            return time.mktime(time.strptime(rec.date, "%Y-%m-%d")) + 86_399
        except (ValueError, OverflowError):
            pass
    return rec.mtime_ns / 1e9
