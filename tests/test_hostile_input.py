"""Hostile vault contents and tool arguments (issue 10): each probe finding, on real files in tmp_path.

Work that used to be quadratic or unbounded runs in a subprocess with a generous time limit, so a regression fails
instead of hanging the suite; the assertions are on the work done (token counts and lengths), never on timings.
Over 500 lines for a reason: one test per finding of the probe, in the order the issue lists them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kb_fixtures import BOUNDED_S, make_config, run_bounded

from kb_chunk import chunk_note, find_sections
from kb_config import Config, KBError, PathOutsideVaultError, WriteRefusedError
from kb_files import TEMP_PREFIX, TEMP_SUFFIX
from kb_frontmatter import parse_frontmatter
from kb_scan import note_rel_path, read_note_bytes, resolve_inside, scan_vault
from kb_state import decode_note
from kb_text import MAX_TOKEN_CHARS, content_hash, split_lines
from kb_write import MAX_APPEND_ATTEMPTS, append_to_note

# A YAML "billion laughs" (the probe's, one level deeper): about 300 bytes, 9^7 tags once aliases are followed.
ALIAS_BOMB = (
    "---\n"
    "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n"
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "tags: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "aliases: *f\n"
    "---\n"
    "# Bomb\n\nthe body is still indexed\n"
)
posix_only = pytest.mark.skipif(os.name == "nt", reason="FIFOs, symlinks and byte file names are POSIX features")


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    (root / "projects").mkdir(parents=True)
    (root / "inbox.md").write_text("# Inbox\n\n- first capture\n", encoding="utf-8")
    (root / "projects" / "alpha.md").write_text("# Alpha\n\n## Decisions\n\nPostgreSQL.\n\n## Risks\n\nRate limits.\n", "utf-8")
    return root


def _cfg(vault: Path, **overrides: object) -> Config:
    overrides.setdefault("writable", ("inbox.md", "projects/alpha.md"))
    return make_config(vault, vault.parent / "data", **overrides)


def _bytes_name_file(vault: Path, name: bytes, data: bytes = b"# x\n") -> str:
    """Create a file whose name is raw bytes; returns the name as Python sees it. Skips where the OS refuses it."""
    try:
        fd = os.open(os.fsencode(vault) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as e:
        pytest.skip(f"this file system refuses non-UTF-8 names ({e.strerror})")
    os.write(fd, data)
    os.close(fd)
    return os.fsdecode(name)


def _snapshot(root: Path) -> dict[str, object]:
    """Every file's bytes and every link under root, except the index folder (the append lock lives there)."""
    out: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d) != root / "data"]
        for name in dirs + files:
            p = Path(folder) / name
            out[str(p.relative_to(root))] = (
                ("link", os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
            )
    return out


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block blocks, e.g. on opening a FIFO."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for over {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _make_fifo(path: Path) -> None:
    try:
        os.mkfifo(path)
    except (AttributeError, OSError) as e:
        pytest.skip(f"cannot make a FIFO here ({e})")


# ---- 1. file names that are not UTF-8 ------------------------------------------------------------------------------


@posix_only
def test_scan_vault_skips_a_note_whose_name_is_not_utf8_and_lists_it(vault: Path) -> None:
    _bytes_name_file(vault, b"caf\xe9.md")
    os.mkdir(os.fsencode(vault) + b"/dossier-\xe9t\xe9")
    Path(os.fsdecode(os.fsencode(vault) + b"/dossier-\xe9t\xe9/note.md")).write_text("# x\n", encoding="utf-8")

    found = scan_vault(_cfg(vault))

    assert set(found) == {"inbox.md", "projects/alpha.md"}
    assert "not valid UTF-8" in found.skipped["caf\\xe9.md"]
    assert "folder name is not valid UTF-8" in found.skipped["dossier-\\xe9t\\xe9/"]
    json.dumps(found.skipped)  # the reasons can go into index_status as they are


@posix_only
def test_note_rel_path_skips_a_name_that_is_not_utf8(vault: Path) -> None:
    name = _bytes_name_file(vault, b"caf\xe9.md")

    assert note_rel_path(_cfg(vault), vault / name) is None
    with pytest.raises(PathOutsideVaultError, match="not valid UTF-8"):
        resolve_inside(_cfg(vault), name)


def test_content_hash_does_not_fail_on_lone_surrogates() -> None:
    name = os.fsdecode(b"caf\xe9.md") if os.name != "nt" else "caf\udce9.md"

    assert content_hash(name) != content_hash("café.md")
    assert len(content_hash("\ud800")) == 20


# ---- 2. tokenizing and chunking stay linear --------------------------------------------------------------------------


def test_tokenize_cuts_a_200k_character_run_to_one_bounded_token() -> None:
    count, longest = run_bounded(
        "import json; from kb_text import Tokenizer\n"
        "tokens = Tokenizer(use_jieba=False).tokenize('a' * 200_000)\n"
        "print(json.dumps([len(tokens), max(map(len, tokens))]))"
    )

    assert (count, longest) == (1, MAX_TOKEN_CHARS)


def test_tokenize_is_not_slowed_by_a_20k_token_appended_to_a_note() -> None:
    tokens = run_bounded(
        "import json; from kb_text import Tokenizer\n"
        "note = '# Backup\\n\\nThe nightly timer runs at 02:00.\\n\\n' + 'x9' * 10_000 + '\\n\\nafter the blob\\n'\n"
        "tk = Tokenizer(use_jieba=False)\n"
        "runs = [tk.tokenize(note) for _ in range(20)]  # every sync and search re-tokenizes it\n"
        "print(json.dumps(runs[-1]))"
    )

    assert {"backup", "nightly", "timer", "blob"} <= set(tokens)
    assert max(map(len, tokens)) == MAX_TOKEN_CHARS


def test_chunk_note_is_linear_on_long_space_backtick_and_fence_runs() -> None:
    chunk_counts = run_bounded(
        "import json; from kb_chunk import chunk_note\n"
        "notes = ['# x' + ' ' * 100_000 + 'y', '`' * 100_000, '```a\\n' * 20_000, '~~~~x\\n' * 16_000,\n"
        "         '# ' + ' \\t' * 50_000 + '#' * 50_000 + 'y']\n"
        "print(json.dumps([len(chunk_note(n, 'f', 200).chunks) for n in notes]))"
    )

    assert all(n >= 1 for n in chunk_counts[1:4])


def test_chunk_note_keeps_every_token_bounded_in_a_note_with_a_huge_word() -> None:
    from kb_text import Tokenizer

    note = chunk_note("# T\n\nalpha " + "z" * 50_000 + " omega\n", "f", 200)

    tokens = [t for c in note.chunks for t in Tokenizer(use_jieba=False).tokenize(c.text)]
    assert {"alpha", "omega"} <= set(tokens) and max(map(len, tokens)) <= MAX_TOKEN_CHARS


# ---- 3. FIFOs and other non-regular files ---------------------------------------------------------------------------


@posix_only
def test_scan_vault_skips_a_fifo_and_lists_it(vault: Path) -> None:
    _make_fifo(vault / "pipe.md")

    found = scan_vault(_cfg(vault))

    assert "pipe.md" not in found
    assert "FIFO" in found.skipped["pipe.md"] and "not a regular file" in found.skipped["pipe.md"]


@posix_only
def test_read_note_bytes_rejects_a_fifo_without_blocking(vault: Path) -> None:
    _make_fifo(vault / "pipe.md")

    with _deadline(BOUNDED_S), pytest.raises(ValueError, match="FIFO"):
        read_note_bytes(vault / "pipe.md", 1_000_000)


def test_read_note_bytes_rejects_a_note_over_the_limit(vault: Path) -> None:
    (vault / "big.md").write_bytes(b"x" * 101)

    with pytest.raises(ValueError, match=r"larger than max_file_bytes \(101 > 100 bytes\)"):
        read_note_bytes(vault / "big.md", 100)
    assert read_note_bytes(vault / "inbox.md", 100) == b"# Inbox\n\n- first capture\n"


@posix_only
def test_resolve_inside_rejects_a_fifo_as_not_a_regular_file(vault: Path) -> None:
    _make_fifo(vault / "pipe.md")

    with _deadline(BOUNDED_S), pytest.raises(PathOutsideVaultError, match="FIFO"):
        resolve_inside(_cfg(vault), "pipe.md")


# ---- 4. YAML alias bombs and other frontmatter that breaks the parser --------------------------------------------


def test_chunk_note_treats_a_yaml_alias_bomb_as_broken_frontmatter() -> None:
    error, tags, aliases, body = run_bounded(
        "import json; from kb_chunk import chunk_note\n"
        f"note = chunk_note({ALIAS_BOMB!r}, 'f', 200)\n"
        "print(json.dumps([note.frontmatter_error, note.tags, note.aliases, ' '.join(c.text for c in note.chunks)]))"
    )

    assert "expands to over" in error
    assert (tags, aliases) == ([], [])
    assert "the body is still indexed" in body and "lol" in body  # indexed as text, like any broken block


@pytest.mark.parametrize(
    ("frontmatter", "error"),
    [
        ("a: &a [*a]", "recursive YAML alias"),
        ("created: 2024-13-45", "not valid YAML (month must be in 1..12)"),
        ("a: " + "[" * 5_000 + "]" * 5_000, "nested too deeply"),
    ],
    ids=["recursive-alias", "impossible-date", "deep-nesting"],
)
def test_chunk_note_keeps_frontmatter_the_parser_cannot_build_as_text(frontmatter: str, error: str) -> None:
    note = chunk_note(f"---\n{frontmatter}\n---\nbody text\n", "fallback", 200)

    assert note.frontmatter_error is not None and error in note.frontmatter_error
    assert "body text" in note.chunks[-1].text


def test_parse_frontmatter_still_reads_anchors_and_merge_keys() -> None:
    meta, lines, error = parse_frontmatter("---\nbase: &b {owner: me}\nproject:\n  <<: *b\n  tags: [x, y]\n---\nbody\n")

    assert (meta["project"], lines, error) == ({"owner": "me", "tags": ["x", "y"]}, 6, None)


# ---- 5. appends through a dangling symlink -------------------------------------------------------------------------


@posix_only
def test_append_rejects_a_dangling_symlink_to_a_path_the_whitelist_does_not_name(vault: Path) -> None:
    (vault / "new").mkdir()
    (vault / "private").mkdir()
    (vault / "new" / "dangling_in.md").symlink_to(Path("..") / "private" / "created.md")
    before = _snapshot(vault.parent)

    with pytest.raises(WriteRefusedError, match="a link to private/created.md") as exc:
        append_to_note(_cfg(vault, creatable=("new/",)), "new/dangling_in.md", "- sneaky")

    assert "write.creatable (new/)" in str(exc.value)
    assert not (vault / "private" / "created.md").exists()
    assert _snapshot(vault.parent) == before


@posix_only
def test_append_rejects_a_dangling_symlink_into_a_hidden_folder(vault: Path) -> None:
    (vault / "new").mkdir()
    (vault / "new" / "x.md").symlink_to(Path("..") / ".obsidian" / "x.md")

    with pytest.raises(WriteRefusedError, match="hidden or ignored"):
        append_to_note(_cfg(vault, creatable=("new/", ".obsidian/")), "new/x.md", "- sneaky")
    assert not (vault / ".obsidian").exists()


@posix_only
def test_append_creates_the_target_of_a_dangling_symlink_the_whitelist_allows(vault: Path) -> None:
    (vault / "new").mkdir()
    (vault / "new" / "link.md").symlink_to("target.md")

    result = append_to_note(_cfg(vault, creatable=("new/",)), "new/link.md", "- first")

    assert result.created_note and (vault / "new" / "target.md").read_bytes() == b"- first\n"
    assert (vault / "new" / "link.md").is_symlink()


# ---- 6. encodings: decode only what is unambiguous ----------------------------------------------------------------

CP1252_NOTES = ["Ärger über Öl und Äpfel\n", "Café naïve, Señor Müller\n", "naïve façade\n"]


@pytest.mark.parametrize("text", CP1252_NOTES)
def test_decode_note_rejects_cp1252_text_instead_of_reading_it_as_gb18030(text: str) -> None:
    with pytest.raises(ValueError, match=r"not UTF-8 text \(looks like cp1252/Latin-1\); convert the note to UTF-8"):
        decode_note(text.encode("cp1252"))


@pytest.mark.parametrize(
    "text", ["# 跑步\n\n周末长距离跑 18 公里，配速 6 分 10 秒。\n", "会议纪要：讨论云仓项目的库存同步方案（第二版）。\n"]
)
def test_decode_note_decodes_chinese_gb18030(text: str) -> None:
    assert decode_note(text.encode("gb18030")) == (text, "gb18030")


@pytest.mark.parametrize(("codec", "name"), [("utf-16-le", "utf-16-le"), ("utf-16-be", "utf-16-be")])
def test_decode_note_decodes_utf16_with_a_byte_order_mark(codec: str, name: str) -> None:
    assert decode_note(("\ufeff# Notes\n\n中文 and English\n").encode(codec)) == ("# Notes\n\n中文 and English\n", name)


def test_decode_note_names_utf16_without_a_byte_order_mark() -> None:
    with pytest.raises(ValueError, match="UTF-16 text without a byte-order mark"):
        decode_note("# Notes\n\nplain English text\n".encode("utf-16-le"))


def test_append_rejects_a_cp1252_note_and_leaves_it_unchanged(vault: Path) -> None:
    original = "# Einkauf\n\nÄpfel und Öl\n".encode("cp1252")
    (vault / "inbox.md").write_bytes(original)

    with pytest.raises(WriteRefusedError, match="looks like cp1252/Latin-1"):
        append_to_note(_cfg(vault), "inbox.md", "- Brot")
    assert (vault / "inbox.md").read_bytes() == original


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_append_keeps_utf16_encoding_and_its_byte_order_mark(vault: Path, codec: str) -> None:
    original = "\ufeff# Alpha\r\n\r\n## Decisions\r\n\r\nPostgreSQL.\r\n\r\n## Risks\r\n\r\nRate limits.\r\n".encode(codec)
    (vault / "projects" / "alpha.md").write_bytes(original)

    append_to_note(_cfg(vault), "projects/alpha.md", "- at the end")
    append_to_note(_cfg(vault), "projects/alpha.md", "- use pgbouncer", heading="Decisions")

    data = (vault / "projects" / "alpha.md").read_bytes()
    assert data.decode(codec) == (
        "\ufeff# Alpha\r\n\r\n## Decisions\r\n\r\nPostgreSQL.\r\n\r\n- use pgbouncer\r\n\r\n## Risks\r\n\r\n"
        "Rate limits.\r\n\r\n- at the end\r\n"
    )


# ---- 7. over-long names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "problem"),
    [("n" * 300 + ".md", "name of 303 bytes, over the 255"), ("/".join(["d" * 100] * 50) + "/x.md", "over the 4096")],
    ids=["303-char-name", "5000-char-path"],
)
@pytest.mark.parametrize("must_exist", [True, False])
def test_resolve_inside_rejects_over_long_names_with_a_clear_message(
    vault: Path, rel: str, problem: str, must_exist: bool
) -> None:
    with pytest.raises(PathOutsideVaultError, match=problem) as exc:
        resolve_inside(_cfg(vault), rel, must_exist=must_exist)

    assert len(str(exc.value)) < 600  # quotes the start of the path, not all 5,000 characters


@pytest.mark.parametrize("rel", ["n" * 300 + ".md", "new/" + "/".join(["d" * 100] * 50) + "/x.md"])
def test_append_rejects_over_long_names_as_a_tool_error(vault: Path, rel: str) -> None:
    with pytest.raises(KBError, match="that file systems allow"):
        append_to_note(_cfg(vault, creatable=("new/", "*.md")), rel, "- x")


def test_append_turns_an_os_error_into_a_tool_error(vault: Path) -> None:
    with pytest.raises(WriteRefusedError, match="cannot append to 'inbox.md/x.md'"):  # a file where a folder must be
        append_to_note(_cfg(vault, creatable=("inbox.md/",)), "inbox.md/x.md", "- x")
    assert (vault / "inbox.md").read_text(encoding="utf-8") == "# Inbox\n\n- first capture\n"


@posix_only
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_append_turns_a_permission_error_into_a_tool_error(vault: Path) -> None:
    (vault / "locked").mkdir()
    os.chmod(vault / "locked", 0o500)
    try:
        with pytest.raises(WriteRefusedError, match="Permission denied"):
            append_to_note(_cfg(vault, creatable=("locked/",)), "locked/new.md", "- x")
    finally:
        os.chmod(vault / "locked", 0o700)


# ---- 8. percent-encoding, '.', headings, links, CR-only line endings -----------------------------------------------


def test_append_rejects_percent_encoded_paths_and_creates_no_folder(vault: Path) -> None:
    before = _snapshot(vault.parent)

    with pytest.raises(PathOutsideVaultError, match=r"percent-encoding \('%2e'\)"):
        append_to_note(_cfg(vault, creatable=("new/",)), "new/%2e%2e/%2e%2e/canary/x.md", "- x")
    assert _snapshot(vault.parent) == before


def test_resolve_inside_accepts_an_existing_note_with_percent_in_its_name(vault: Path) -> None:
    (vault / "100%25 done.md").write_text("# x\n", encoding="utf-8")

    assert resolve_inside(_cfg(vault), "100%25 done.md")[1] == "100%25 done.md"


@pytest.mark.parametrize("rel", [".", "./", "././", "<vault>"])
def test_resolve_inside_rejects_the_vault_folder_itself_with_its_own_message(vault: Path, rel: str) -> None:
    with pytest.raises(PathOutsideVaultError, match="names the vault folder itself, not a note") as exc:
        resolve_inside(_cfg(vault), rel.replace("<vault>", str(vault)), must_exist=False)
    assert "'..'" not in str(exc.value)


@pytest.mark.parametrize(
    ("heading", "problem"),
    [("TODO\n# Injected", "line break"), ("TODO\rmore", "line break"), ("x" * 201, "over the 200")],
    ids=["newline", "carriage-return", "too-long"],
)
def test_append_rejects_a_heading_no_note_line_could_hold(vault: Path, heading: str, problem: str) -> None:
    before = _snapshot(vault.parent)

    with pytest.raises(WriteRefusedError, match=problem):
        append_to_note(_cfg(vault), "inbox.md", "- x", heading=heading, create_heading=True)
    assert _snapshot(vault.parent) == before


@posix_only
def test_scan_vault_lists_dangling_looping_and_escaping_symlinks_as_skipped(vault: Path) -> None:
    (vault / "dangling.md").symlink_to("gone.md")
    (vault / "loop.md").symlink_to("loop.md")
    (vault.parent / "outside.md").write_text("secret", encoding="utf-8")
    (vault / "leak.md").symlink_to(vault.parent / "outside.md")

    found = scan_vault(_cfg(vault))

    assert set(found) == {"inbox.md", "projects/alpha.md"}
    assert "dangling symlink" in found.skipped["dangling.md"]
    assert "symlink loop" in found.skipped["loop.md"]
    assert "outside the vault" in found.skipped["leak.md"]


def test_chunk_note_and_split_lines_agree_on_cr_only_line_endings() -> None:
    note = "# Old Mac\r\rfirst paragraph\r\r## Part two\r\rsecond paragraph\r"
    lines = split_lines(note)

    chunks = chunk_note(note, "f", 5).chunks

    assert len(lines) == 8
    assert [(c.line_start, c.line_end) for c in chunks] == [(1, 3), (7, 7)]
    for c in chunks:  # the lines a hit cites are the lines read_note shows, when both split with split_lines
        assert (lines[c.line_start - 1], lines[c.line_end - 1]) == (c.text.split("\n")[0], c.text.split("\n")[-1])


def test_append_under_a_heading_in_a_cr_only_note_keeps_cr_endings(vault: Path) -> None:
    (vault / "inbox.md").write_bytes(b"# Inbox\r\r## TODO\r\r- a\r\r## Later\r\r- b\r")

    result = append_to_note(_cfg(vault), "inbox.md", "- c", heading="TODO")

    data = (vault / "inbox.md").read_bytes()
    assert data == b"# Inbox\r\r## TODO\r\r- a\r\r- c\r\r## Later\r\r- b\r"
    assert split_lines(data.decode())[result.line_start - 1] == "- c"


# ---- 9. absolute paths inside the vault ----------------------------------------------------------------------------


def test_resolve_inside_accepts_an_absolute_path_inside_the_vault(vault: Path) -> None:
    cfg = _cfg(vault)

    assert resolve_inside(cfg, str(vault / "projects" / "alpha.md")) == (vault / "projects" / "alpha.md", "projects/alpha.md")
    with pytest.raises(PathOutsideVaultError, match="'..' is not allowed"):
        resolve_inside(cfg, f"{vault}/projects/../../outside.md", must_exist=False)


def test_append_accepts_an_absolute_path_inside_the_vault(vault: Path) -> None:
    result = append_to_note(_cfg(vault), str(vault / "inbox.md"), "- via absolute path")

    assert result.path == "inbox.md"
    assert (vault / "inbox.md").read_text(encoding="utf-8").endswith("\n- via absolute path\n")


# ---- 10. another program writing to the note at the same moment ----------------------------------------------------

# Times the concurrent-append test retries an append refused because the note kept changing under it.
REFUSED_APPEND_RETRIES = 20
EXTERNAL_WRITER = """
import sys, time
from pathlib import Path
note, stop, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
i = 0
while not stop.exists() or i < 50:
    with open(note, "a", encoding="utf-8") as f:  # O_APPEND, one write per line, like a shell's >>
        f.write(f"- external line {i}\\n")
    i += 1
    time.sleep(0.0005)
print(i)
"""


def test_append_loses_no_line_another_program_appends_at_the_same_time(vault: Path, tmp_path: Path) -> None:
    cfg = _cfg(vault)
    stop, ready = tmp_path / "stop", tmp_path / "ready"
    writer = subprocess.Popen(
        [sys.executable, "-c", EXTERNAL_WRITER, str(vault / "inbox.md"), str(stop), str(ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + BOUNDED_S
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        for i in range(60):
            # On a loaded machine the writer can change the note through every one of an append's attempts: the
            # append is then refused with nothing written and "try again", which a client does (CI saw it 3 times).
            for _ in range(REFUSED_APPEND_RETRIES):
                try:
                    append_to_note(cfg, "inbox.md", f"- server line {i}")
                    break
                except WriteRefusedError as e:
                    assert "nothing was written" in str(e)
    finally:
        stop.touch()
        written = int(writer.communicate(timeout=BOUNDED_S)[0])

    lines = (vault / "inbox.md").read_text(encoding="utf-8").split("\n")
    missing_external = [i for i in range(written) if lines.count(f"- external line {i}") != 1]
    missing_server = [i for i in range(60) if lines.count(f"- server line {i}") != 1]
    assert (missing_external, missing_server) == ([], [])


@contextlib.contextmanager
def _another_program_appends_while_placing(note: Path, times: int) -> Iterator[list[int]]:
    """While an append works out where its text goes (between reading the note and writing it), another program
    appends a line, `times` times. A profile hook on find_sections is the moment; nothing of ours is replaced."""
    done: list[int] = []

    def hook(frame: object, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is find_sections.__code__ and len(done) < times:
            with open(note, "a", encoding="utf-8") as f:
                f.write(f"- external line {len(done)}\n")
            done.append(1)

    sys.setprofile(hook)
    try:
        yield done
    finally:
        sys.setprofile(None)


def test_append_inside_a_note_starts_over_when_another_program_changed_it(vault: Path) -> None:
    note = vault / "projects" / "alpha.md"

    with _another_program_appends_while_placing(note, times=1) as done:
        result = append_to_note(_cfg(vault), "projects/alpha.md", "- use pgbouncer", heading="Decisions")

    text = note.read_text(encoding="utf-8")
    assert len(done) == 1 and text.endswith("Rate limits.\n- external line 0\n")
    assert "PostgreSQL.\n\n- use pgbouncer\n\n## Risks" in text
    assert text.split("\n")[result.line_start - 1] == "- use pgbouncer"


def test_append_gives_up_with_a_clear_error_when_the_note_keeps_changing(vault: Path) -> None:
    note = vault / "projects" / "alpha.md"

    with _another_program_appends_while_placing(note, times=1000), pytest.raises(WriteRefusedError) as exc:
        append_to_note(_cfg(vault), "projects/alpha.md", "- use pgbouncer", heading="Decisions")

    assert f"changed {MAX_APPEND_ATTEMPTS} times" in str(exc.value) and "nothing was written" in str(exc.value)
    assert "pgbouncer" not in note.read_text(encoding="utf-8")


# ---- 11. no hidden copy of a note left behind ----------------------------------------------------------------------


def test_append_inside_a_note_writes_its_temp_copy_under_the_shared_temp_prefix(
    vault: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renamed: list[str] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:  # a crash just before the rename would leave `src` behind
        renamed.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    append_to_note(_cfg(vault), "projects/alpha.md", "- use pgbouncer", heading="Decisions")

    assert renamed and all(n.startswith(TEMP_PREFIX) and n.endswith(TEMP_SUFFIX) for n in renamed)
    assert sorted(p.name for p in (vault / "projects").iterdir()) == ["alpha.md"]


# ---- the engine on a vault full of the above ---------------------------------------------------------------------


@posix_only
def test_sync_indexes_the_rest_of_a_vault_with_hostile_files(vault: Path, make_engine) -> None:
    _bytes_name_file(vault, b"caf\xe9.md")
    _make_fifo(vault / "pipe.md")
    (vault / "bomb.md").write_text(ALIAS_BOMB, encoding="utf-8")
    (vault / "latin.md").write_bytes("Ärger über Öl\n".encode("cp1252"))
    (vault / "dangling.md").symlink_to("gone.md")
    engine = make_engine(vault)
    try:
        with _deadline(BOUNDED_S):
            engine.sync_all()
    finally:
        with contextlib.suppress(OSError):  # a reader stuck on the FIFO (a regression) gets EOF and lets go
            os.close(os.open(vault / "pipe.md", os.O_WRONLY | os.O_NONBLOCK))

    assert {"inbox.md", "projects/alpha.md", "bomb.md"} <= set(engine.files)
    assert "looks like cp1252" in engine.skipped_files()["latin.md"]
    assert not any(stat.S_ISFIFO(os.stat(vault / p).st_mode) for p in engine.files)
