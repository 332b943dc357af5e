"""Broken notes for eval/faults.py part `hostile`: one file per class issue 10 lists (encodings, BOMs, binary, NULs,
odd YAML, an alias bomb, line endings, huge files and lines, FIFOs, symlinks, odd names), and what ingest must do
with each: index it, or list it as skipped with a reason.

Every file name starts with its class tag ("b07-..."), so the index's entry is found however the name is stored.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# max_file_bytes of the broken-notes config: the 5 MB note fits, the over-max one does not.
BROKEN_MAX_FILE_BYTES = 6_000_000
# What must become of a class: indexed, skipped (listed with a reason), either, or absent (not a note at all).
INDEXED, SKIPPED, EITHER, ABSENT_OR_SKIPPED = "indexed", "skipped", "indexed or skipped", "absent or skipped"
# Characters of the long-line, letter-run and alias-bomb classes.
LONG_LINE_CHARS = 200_000
# Headings of the many-headings note, lines of the long-fence note.
MANY_HEADINGS = 20_000
FENCE_LINES = 20_000
# Size of the big note (under BROKEN_MAX_FILE_BYTES) and of the over-max note.
BIG_NOTE_BYTES = 5_000_000
OVER_MAX_BYTES = BROKEN_MAX_FILE_BYTES + 100_000
# Text outside the vault that a symlinked note points at: must never become searchable.
CANARY_TOKEN = "canarytokenzq"
# A YAML "billion laughs": 9 levels of 9 aliases each (9^8 items once expanded), 300-odd bytes.
ALIAS_BOMB = (
    "---\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "tags: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "aliases: [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "---\n# Alias bomb\n\nbody\n"
)


@dataclass(frozen=True)
class BrokenNote:
    """One class of broken note: its tag, what must become of it, whether --quick includes it, and its maker."""

    tag: str
    name: str
    expect: str
    quick: bool
    make: Callable[[Path, Path], None]  # (path in the vault, canary folder) -> writes it
    reason_has: str = ""  # if skipped, the reason must say this (case-insensitive)


def _bytes(data: bytes) -> Callable[[Path, Path], None]:
    return lambda p, _c: p.write_bytes(data)


def _text(text: str, encoding: str = "utf-8") -> Callable[[Path, Path], None]:
    return lambda p, _c: p.write_bytes(text.encode(encoding))


def _binary(p: Path, _c: Path) -> None:
    p.write_bytes(random.Random(7).randbytes(4096))


def _big(p: Path, _c: Path) -> None:
    para = "Lorem ipsum backup restore network " * 20 + "\n\n"
    with p.open("w", encoding="utf-8") as f:
        written = 0
        i = 0
        while written < BIG_NOTE_BYTES:
            block = f"## Section {i}\n\n{para}"
            f.write(block)
            written += len(block)
            i += 1


def _over_max(p: Path, _c: Path) -> None:
    with p.open("wb") as f:
        f.write(b"# over max\n")
        f.truncate(OVER_MAX_BYTES)  # a sparse tail: costs no disk; ingest must skip the note by its size


def _fifo(p: Path, _c: Path) -> None:
    os.mkfifo(p)


def _folder(p: Path, _c: Path) -> None:
    p.mkdir()
    (p / "inner.md").write_text("# inside a folder named like a note\n", encoding="utf-8")


def _link(target: str) -> Callable[[Path, Path], None]:
    return lambda p, _c: os.symlink(target, p)


def _link_out(p: Path, canary: Path) -> None:
    (canary / "secret.md").write_text(f"# secret\n\n{CANARY_TOKEN}\n", encoding="utf-8")
    os.symlink(canary / "secret.md", p)


def broken_notes() -> list[BrokenNote]:
    """Every class, in tag order."""
    crème = "# Crème brûlée\n\nCafé au lait, naïve façade, 10 € ‘quoted’.\n"
    return [
        BrokenNote("b01", "b01-cp1252.md", EITHER, True, _text(crème, "cp1252")),
        BrokenNote(
            "b02", "b02-utf16-bom.md", EITHER, True, _text("\ufeff# UTF-16 note\n\nhello utf16 text\n", "utf-16-le"), "UTF-16"
        ),
        BrokenNote(
            "b03", "b03-utf16-nobom.md", EITHER, True, _text("# UTF-16 no BOM\n\nhello utf16 text\n", "utf-16-le"), "UTF-16"
        ),
        BrokenNote("b04", "b04-gb18030.md", INDEXED, True, _text("# 中文笔记\n\n数据库迁移需要先备份。\n", "gb18030")),
        BrokenNote("b05", "b05-utf8-bom.md", INDEXED, True, _text("\ufeff# BOM note\n\nbomtoken text\n")),
        BrokenNote("b06", "b06-binary.md", SKIPPED, True, _binary),
        BrokenNote("b07", "b07-nul-early.md", SKIPPED, True, _bytes(b"# nul\n\x00\x01\x02 early")),
        BrokenNote("b08", "b08-nul-late.md", EITHER, True, _bytes(b"# nul late\n\n" + b"words here " * 2000 + b"\x00 tail")),
        BrokenNote("b09", "b09-empty.md", EITHER, True, _bytes(b"")),
        BrokenNote("b10", "b10-frontmatter-only.md", INDEXED, True, _text("---\ntitle: Only front\ntags: [a, b]\n---\n")),
        BrokenNote("b11", "b11-broken-yaml.md", INDEXED, True, _text("---\ntitle: [unclosed\n: : :\n---\n# Body\n\ntext\n")),
        BrokenNote("b12", "b12-odd-yaml.md", INDEXED, True, _text("---\n- a list\n- not a map\n---\n# Odd\n\ntext\n")),
        BrokenNote(
            "b13", "b13-yaml-tags.md", INDEXED, True, _text("---\ntitle: !!python/object:os.system x\ndate: 2024-13-45\n---\nt\n")
        ),
        BrokenNote("b14", "b14-alias-bomb.md", EITHER, True, _text(ALIAS_BOMB)),
        BrokenNote("b15", "b15-unterminated-fm.md", INDEXED, True, _text("---\ntitle: never closed\n# Heading\n\ntext\n")),
        BrokenNote("b16", "b16-crlf.md", INDEXED, True, _text("# CRLF\r\n\r\nline one\r\nline two crlftoken\r\n")),
        BrokenNote("b17", "b17-cr-only.md", INDEXED, True, _text("# CR only\r\rline one\rline two\rline three crtoken\r")),
        BrokenNote("b18", "b18-5mb.md", INDEXED, False, _big),
        BrokenNote("b19", "b19-over-max.md", SKIPPED, True, _over_max, "max_file_bytes"),
        BrokenNote(
            "b20", "b20-long-lines.md", INDEXED, True, _text("# Long\n\n" + ("word " * (LONG_LINE_CHARS // 5) + "\n") * 3)
        ),
        BrokenNote("b21", "b21-letter-run.md", INDEXED, True, _text("# Run\n\n" + "ACGT" * (LONG_LINE_CHARS // 4) + "\n")),
        BrokenNote("b22", "b22-digit-run.md", INDEXED, False, _text("# Digits\n\n" + "a1b2-" * (LONG_LINE_CHARS // 5) + "\n")),
        BrokenNote("b23", "b23-20k-headings.md", INDEXED, False, _text("".join(f"# h{i}\n" for i in range(MANY_HEADINGS)))),
        BrokenNote("b24", "b24-20k-fence.md", INDEXED, True, _text("```\n" + "code line\n" * FENCE_LINES + "```\n")),
        BrokenNote("b25", "b25-unclosed-fence.md", INDEXED, True, _text("# Fence\n\n```python\nprint(1)\n\n# not a heading\n")),
        BrokenNote("b26", "b26-folder.md", ABSENT_OR_SKIPPED, True, _folder),
        BrokenNote("b27", "b27-pipe.md", ABSENT_OR_SKIPPED, True, _fifo),
        BrokenNote("b28", "b28-loop.md", SKIPPED, True, _link("b28-loop.md")),
        BrokenNote("b29", "b29-dangling.md", SKIPPED, True, _link("no-such-note.md")),
        BrokenNote("b30", "b30-alias.md", EITHER, True, _link("b04-gb18030.md")),
        BrokenNote("b31", "b31-link-out.md", ABSENT_OR_SKIPPED, True, _link_out),
        BrokenNote("b32", "b32-new\nline.md", INDEXED, True, _text("# Newline name\n\ntext\n")),
        BrokenNote("b33", "b33-ünïcödé 名字 🙂\u202e.md", INDEXED, True, _text("# Unicode name\n\ntext\n")),
        BrokenNote("b34", "b34-" + "é" * 118 + ".md", INDEXED, True, _text("# 243-byte name\n\ntext\n")),
        BrokenNote("b35", "b35-caf\udce9.md", SKIPPED, True, _text("# x\n")),  # the bytes b"caf\xe9": not UTF-8
        BrokenNote("b36", "b36-whitespace.md", EITHER, True, _text("   \n\n\t\n")),
        BrokenNote("b37", "b37-latin1-bytes.md", EITHER, True, _bytes(b"# Mixed\n\ncaf\xe9 ok and caf\xc3\xa9 too\n")),
        BrokenNote("b38", "b38-long-heading.md", INDEXED, True, _text("# " + "h" * 10_000 + "\n\ntext\n")),
        BrokenNote("b39", "b39-utf32.md", EITHER, True, _text("# UTF-32\n", "utf-32")),
        BrokenNote("b40", "b40-deep-yaml.md", EITHER, True, _text("---\nx: " + "[" * 5000 + "]" * 5000 + "\n---\nt\n")),
    ]


def write_broken_vault(vault: Path, canary: Path, quick: bool) -> list[BrokenNote]:
    """Write every class (the quick subset with `quick`) into `vault`; returns the classes written."""
    vault.mkdir(parents=True, exist_ok=True)
    canary.mkdir(parents=True, exist_ok=True)
    (vault / "ok.md").write_text("# A normal note\n\nbackup restore okaytoken\n", encoding="utf-8")
    written = []
    for note in broken_notes():
        if quick and not note.quick:
            continue
        note.make(vault / note.name, canary)  # a lone surrogate in a name becomes its raw byte (surrogateescape)
        written.append(note)
    return written


def vault_bytes(vault: Path, max_file_bytes: int) -> int:
    """Bytes of the regular files ingest reads (those over max_file_bytes are skipped by their size)."""
    total = 0
    for dirpath, _, files in os.walk(vault):
        for f in files:
            p = Path(dirpath) / f
            try:
                if p.is_file() and not p.is_symlink() and p.stat().st_size <= max_file_bytes:
                    total += p.stat().st_size
            except OSError:
                continue
    return total
