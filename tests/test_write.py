"""kb_write.append_to_note: placement, encodings, whitelist and path refusals, retry de-duplication, concurrency.

Real files in tmp_path; every refusal also checks that nothing on disk changed. Over 500 lines for a reason: one test
per rule of the one write path, which the product's promise (notes are sacred) rests on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kb_fixtures import REPO_ROOT, make_config

from kb_config import KBError, PathOutsideVaultError, WriteRefusedError
from kb_write import append_to_note

SECTIONED = (
    "# Project\n\n## Decisions\n\nWe chose PostgreSQL.\n\n### Sub detail\n\nDetail text.\n\n## Risks\n\nRate limit is 50 rps.\n"
)


def _snapshot(root: Path) -> dict[str, object]:
    """Every file's bytes, every link's target and every folder under root (links are not followed).

    The index folder (root/data) is left out: a refusal found under the append lock may create the lock file there.
    """
    out: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        if Path(folder) == root and "data" in dirs:
            dirs.remove("data")
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    root = tmp_path / "vault"
    (root / "projects").mkdir(parents=True)
    (root / "inbox.md").write_text("# Inbox\n\n- first capture\n", encoding="utf-8")
    (root / "projects" / "alpha.md").write_text(SECTIONED, encoding="utf-8")
    return root


@pytest.fixture
def cfg_for(vault: Path, tmp_path: Path):
    def build(**overrides: object):
        overrides.setdefault("writable", ("inbox.md", "projects/alpha.md"))
        return make_config(vault, tmp_path / "data", **overrides)

    return build


# ---- placement ---------------------------------------------------------------------------------------------------


def test_append_adds_text_at_end_after_a_blank_line(vault, cfg_for):
    before = (vault / "inbox.md").read_bytes()
    result = append_to_note(cfg_for(), "inbox.md", "- call the vet\n- buy cat food")
    after = (vault / "inbox.md").read_bytes()
    assert after.startswith(before)
    assert after == before + b"\n- call the vet\n- buy cat food\n"
    assert (result.path, result.line_start, result.line_end) == ("inbox.md", 5, 6)
    assert not result.duplicate and not result.created_note and result.chars == len("- call the vet\n- buy cat food")
    lines = after.decode().split("\n")
    assert lines[result.line_start - 1 : result.line_end] == ["- call the vet", "- buy cat food"]


def test_append_ends_file_with_newline_when_note_lacked_one(vault, cfg_for):
    (vault / "inbox.md").write_bytes(b"# Inbox\n\n- no final newline")
    append_to_note(cfg_for(), "inbox.md", "- added")
    assert (vault / "inbox.md").read_bytes() == b"# Inbox\n\n- no final newline\n\n- added\n"


def test_append_into_empty_note_writes_only_the_text(vault, cfg_for):
    (vault / "inbox.md").write_bytes(b"")
    result = append_to_note(cfg_for(), "inbox.md", "\n\n- first\n\n")
    assert (vault / "inbox.md").read_bytes() == b"- first\n"
    assert (result.line_start, result.line_end) == (1, 1)


def test_append_under_heading_goes_to_end_of_section_including_subsections(vault, cfg_for):
    result = append_to_note(cfg_for(), "projects/alpha.md", "- use pgbouncer", heading="Decisions")
    text = (vault / "projects" / "alpha.md").read_text(encoding="utf-8")
    assert text == SECTIONED.replace("Detail text.\n\n## Risks", "Detail text.\n\n- use pgbouncer\n\n## Risks")
    assert text.split("\n")[result.line_start - 1] == "- use pgbouncer"
    assert result.heading == "Decisions" and not result.created_heading


@pytest.mark.parametrize("heading", ["## Decisions", "decisions", "  Decisions  "])
def test_append_matches_heading_ignoring_level_marks_case_and_spaces(vault, cfg_for, heading):
    append_to_note(cfg_for(), "projects/alpha.md", "- use pgbouncer", heading=heading)
    text = (vault / "projects" / "alpha.md").read_text(encoding="utf-8")
    assert text.index("- use pgbouncer") < text.index("## Risks")
    assert text.count("Decisions") == 1


def test_append_under_subsection_stops_at_next_higher_heading(vault, cfg_for):
    append_to_note(cfg_for(), "projects/alpha.md", "- more detail", heading="Sub detail")
    text = (vault / "projects" / "alpha.md").read_text(encoding="utf-8")
    assert "Detail text.\n\n- more detail\n\n## Risks" in text


def test_append_under_last_section_goes_to_end_of_note(vault, cfg_for):
    append_to_note(cfg_for(), "projects/alpha.md", "- vendor may raise it", heading="Risks")
    assert (vault / "projects" / "alpha.md").read_text(encoding="utf-8") == SECTIONED + "\n- vendor may raise it\n"


def test_append_rejects_ambiguous_heading_and_changes_nothing(vault, cfg_for, tmp_path):
    (vault / "inbox.md").write_text("# Inbox\n\n## TODO\n\n- a\n\n## Later\n\n## todo\n\n- b\n", encoding="utf-8")
    snap = _snapshot(tmp_path)
    with pytest.raises(WriteRefusedError, match="ambiguous") as exc:
        append_to_note(cfg_for(), "inbox.md", "- c", heading="TODO")
    assert "2 times" in str(exc.value) and "lines 3, 9" in str(exc.value)
    assert _snapshot(tmp_path) == snap


def test_append_rejects_missing_heading_unless_create_heading(vault, cfg_for, tmp_path):
    snap = _snapshot(tmp_path)
    with pytest.raises(WriteRefusedError, match="create_heading") as exc:
        append_to_note(cfg_for(), "inbox.md", "- call the vet", heading="TODO")
    assert "'TODO' is not in 'inbox.md'" in str(exc.value)
    assert _snapshot(tmp_path) == snap
    before = (vault / "inbox.md").read_bytes()
    result = append_to_note(cfg_for(), "inbox.md", "- call the vet", heading="TODO", create_heading=True)
    assert (vault / "inbox.md").read_bytes() == before + b"\n## TODO\n\n- call the vet\n"
    assert result.created_heading and result.heading == "TODO"
    # The created heading is found by the next append: no second heading.
    append_to_note(cfg_for(), "inbox.md", "- and the dentist", heading="TODO", create_heading=True)
    text = (vault / "inbox.md").read_text(encoding="utf-8")
    assert text.count("## TODO") == 1 and text.endswith("- call the vet\n\n- and the dentist\n")


def test_append_creates_heading_at_level_named_in_argument(vault, cfg_for):
    before = (vault / "inbox.md").read_bytes()
    append_to_note(cfg_for(), "inbox.md", "- idea", heading="### Ideas", create_heading=True)
    assert (vault / "inbox.md").read_bytes() == before + b"\n### Ideas\n\n- idea\n"


def test_append_finds_heading_ending_in_hash_sign(vault, cfg_for):
    # "C#" is the heading text: a closing '#' sequence needs a space before it (CommonMark).
    (vault / "inbox.md").write_text("# Inbox\n\n## C#\n\n- records\n\n## Go\n\n- slices\n", encoding="utf-8")
    append_to_note(cfg_for(), "inbox.md", "- pattern matching", heading="C#", create_heading=True)
    text = (vault / "inbox.md").read_text(encoding="utf-8")
    assert text == "# Inbox\n\n## C#\n\n- records\n\n- pattern matching\n\n## Go\n\n- slices\n"


def test_append_ignores_hash_lines_inside_fenced_code(vault, cfg_for):
    note = (
        "# Setup notes\n\n## Setup\n\n```bash\n# Install\npip install x\n## Risks\n```\n\n"
        "~~~\n# Install\n~~~\n\n## Install\n\nreal section\n"
    )
    (vault / "inbox.md").write_text(note, encoding="utf-8")
    cfg = cfg_for()
    append_to_note(cfg, "inbox.md", "- set PATH too", heading="Setup")
    append_to_note(cfg, "inbox.md", "- use a venv", heading="Install")  # one real "Install": not ambiguous
    text = (vault / "inbox.md").read_text(encoding="utf-8")
    assert text == note.replace("~~~\n\n## Install", "~~~\n\n- set PATH too\n\n## Install") + "\n- use a venv\n"


# ---- encodings, modes, links ---------------------------------------------------------------------------------------


def test_append_keeps_crlf_line_endings(vault, cfg_for):
    original = SECTIONED.replace("\n", "\r\n").encode("utf-8")
    (vault / "projects" / "alpha.md").write_bytes(original)
    cfg = cfg_for()
    append_to_note(cfg, "projects/alpha.md", "- one\n- two", heading="Decisions")
    append_to_note(cfg, "projects/alpha.md", "- at end\r\n- crlf input")
    append_to_note(cfg, "projects/alpha.md", "- new section", heading="Notes", create_heading=True)
    data = (vault / "projects" / "alpha.md").read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") and b"\r\r" not in data
    assert data.startswith(original.split(b"## Risks")[0].rstrip(b"\r\n"))
    assert data.endswith(b"\r\n\r\n## Notes\r\n\r\n- new section\r\n")
    assert b"Detail text.\r\n\r\n- one\r\n- two\r\n\r\n## Risks" in data


def test_append_preserves_existing_bytes_in_note_with_mixed_line_endings(vault, cfg_for):
    original = b"# Inbox\r\n\r\n- from windows\r\n- from linux\n- again windows\r\n"
    (vault / "inbox.md").write_bytes(original)
    append_to_note(cfg_for(), "inbox.md", "- added")
    data = (vault / "inbox.md").read_bytes()
    assert data.startswith(original)
    assert data == original + b"\r\n- added\r\n"


def test_append_keeps_utf8_bom(vault, cfg_for):
    (vault / "inbox.md").write_bytes(b"\xef\xbb\xbf# Inbox\n\n- first\n")
    append_to_note(cfg_for(), "inbox.md", "- 记一下：买猫粮")
    data = (vault / "inbox.md").read_bytes()
    assert data == b"\xef\xbb\xbf# Inbox\n\n- first\n\n" + "- 记一下：买猫粮\n".encode()


def test_append_keeps_gb18030_encoding(vault, cfg_for):
    original = "# 跑步\n\n周末长距离跑 18 公里。\n".encode("gb18030")
    (vault / "inbox.md").write_bytes(original)
    append_to_note(cfg_for(), "inbox.md", "- 记一下：配速 6 分 10 秒")
    data = (vault / "inbox.md").read_bytes()
    assert data.startswith(original)
    assert data.decode("gb18030") == "# 跑步\n\n周末长距离跑 18 公里。\n\n- 记一下：配速 6 分 10 秒\n"
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664])
def test_append_preserves_file_mode(vault, cfg_for, mode):
    os.chmod(vault / "inbox.md", mode)
    append_to_note(cfg_for(), "inbox.md", "- private")
    assert (vault / "inbox.md").stat().st_mode & 0o7777 == mode


@pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")
def test_append_through_symlink_inside_vault_writes_target_and_keeps_link(vault, cfg_for):
    (vault / "notes").mkdir()
    target = vault / "notes" / "real-inbox.md"
    target.write_text("# Real inbox\n", encoding="utf-8")
    (vault / "inbox.md").unlink()
    (vault / "inbox.md").symlink_to(Path("notes") / "real-inbox.md")
    append_to_note(cfg_for(writable=("inbox.md", "notes/real-inbox.md")), "inbox.md", "- via link")
    assert (vault / "inbox.md").is_symlink() and os.readlink(vault / "inbox.md") == str(Path("notes") / "real-inbox.md")
    assert target.read_text(encoding="utf-8") == "# Real inbox\n\n- via link\n"
    assert sorted(p.name for p in (vault / "notes").iterdir()) == ["real-inbox.md"]  # no temp file left


def test_append_rejects_whitelisted_symlink_to_note_outside_whitelist(vault, cfg_for):
    (vault / "notes").mkdir()
    target = vault / "notes" / "private.md"
    target.write_text("# Private\n", encoding="utf-8")
    (vault / "inbox.md").unlink()
    (vault / "inbox.md").symlink_to(Path("notes") / "private.md")
    with pytest.raises(WriteRefusedError, match="a link to notes/private.md"):
        append_to_note(cfg_for(writable=("inbox.md",)), "inbox.md", "- sneaky")
    assert target.read_text(encoding="utf-8") == "# Private\n"


def test_append_ignores_corrupt_journal_entries(vault, cfg_for):
    cfg = cfg_for()
    cfg.index_dir.mkdir(parents=True, exist_ok=True)
    (cfg.index_dir / "appends.json").write_text('[{"key": "x", "at": "not-a-number"}, 7]', encoding="utf-8")
    result = append_to_note(cfg, "inbox.md", "- still works")
    assert not result.duplicate and "- still works" in (vault / "inbox.md").read_text(encoding="utf-8")


# ---- refusals ----------------------------------------------------------------------------------------------------


def _outside_link(vault: Path) -> None:
    outside = vault.parent / "outside.md"
    outside.write_text("# Not in the vault\n", encoding="utf-8")
    (vault / "escape.md").symlink_to(outside)


def _hidden_note(vault: Path) -> None:
    (vault / ".private").mkdir()
    (vault / ".private" / "diary.md").write_text("# Diary\n", encoding="utf-8")


REFUSALS = [
    # (id, path, content, config overrides, setup, error class, message fragment)
    ("not-whitelisted", "projects/alpha.md", "- x", {"writable": ("inbox.md",)}, None, WriteRefusedError, "is not writable"),
    ("dotdot", "../outside.md", "- x", {}, None, PathOutsideVaultError, "'..' is not allowed"),
    ("dotdot-inside", "projects/../inbox.md", "- x", {}, None, PathOutsideVaultError, "'..' is not allowed"),
    ("absolute-outside", "<vault>-twin/inbox.md", "- x", {}, None, PathOutsideVaultError, "absolute path outside the vault"),
    ("symlink-escape", "escape.md", "- x", {"writable": ("escape.md",)}, _outside_link, PathOutsideVaultError, "symlink escape"),
    (
        "hidden-folder",
        ".private/diary.md",
        "- x",
        {"writable": (".private/diary.md",)},
        _hidden_note,
        PathOutsideVaultError,
        "hidden",
    ),
    ("not-markdown", "inbox.txt", "- x", {"writable": ("inbox.txt",)}, None, PathOutsideVaultError, "not a note"),
    ("empty", "inbox.md", "", {}, None, WriteRefusedError, "content is empty"),
    ("whitespace", "inbox.md", "  \n\t\r\n ", {}, None, WriteRefusedError, "content is empty"),
    ("too-long", "inbox.md", "x" * 51, {"max_append_chars": 50}, None, WriteRefusedError, "over write.max_append_chars (50)"),
    ("nul", "inbox.md", "a\x00b", {}, None, WriteRefusedError, "NUL"),
    ("missing-not-creatable", "new.md", "- x", {"writable": ("new.md",)}, None, WriteRefusedError, "does not exist"),
    (
        "missing-outside-creatable",
        "archive/new.md",
        "- x",
        {"creatable": ("inbox/",)},
        None,
        WriteRefusedError,
        "does not allow creating",
    ),
]


@pytest.mark.parametrize(
    ("path", "content", "overrides", "setup", "error", "fragment"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_append_refuses_with_reason_and_changes_nothing(
    vault, cfg_for, tmp_path, path, content, overrides, setup, error, fragment
):
    if setup is not None:
        if os.name == "nt" and setup is _outside_link:
            pytest.skip("symlinks need privileges on Windows")
        setup(vault)
    path = path.replace("<vault>", vault.as_posix())
    snap = _snapshot(tmp_path)
    with pytest.raises(error) as exc:
        append_to_note(cfg_for(**overrides), path, content)
    assert isinstance(exc.value, KBError)
    assert fragment in str(exc.value)
    assert _snapshot(tmp_path) == snap


@pytest.mark.parametrize(("creatable", "path"), [(("inbox/",), "inbox/2026-03-01.md"), (("journal/*.md",), "journal/today.md")])
def test_append_creates_note_and_folder_when_creatable_allows(vault, cfg_for, creatable, path):
    result = append_to_note(cfg_for(creatable=creatable), path, "- first line of a new note")
    assert result.created_note and (result.line_start, result.line_end) == (1, 1)
    assert (vault / path).read_bytes() == b"- first line of a new note\n"
    # Once created it stays appendable through the creatable rule.
    append_to_note(cfg_for(creatable=creatable), path, "- second")
    assert (vault / path).read_bytes() == b"- first line of a new note\n\n- second\n"


def test_append_glob_creatable_does_not_cross_folders(vault, cfg_for, tmp_path):
    snap = _snapshot(tmp_path)
    with pytest.raises(WriteRefusedError, match="does not allow creating"):
        append_to_note(cfg_for(creatable=("journal/*.md",)), "journal/deep/today.md", "- x")
    assert _snapshot(tmp_path) == snap


# ---- retries -----------------------------------------------------------------------------------------------------


def test_append_applies_retried_identical_text_once_within_window(vault, cfg_for):
    cfg = cfg_for(dedupe_window_s=600.0)
    first = append_to_note(cfg, "inbox.md", "- call the vet", now=1000.0)
    after_first = (vault / "inbox.md").read_bytes()
    retry = append_to_note(cfg, "inbox.md", "- call the vet\n", now=1300.0)
    assert retry.duplicate and retry.chars == 0
    assert (retry.line_start, retry.line_end) == (first.line_start, first.line_end)
    assert (vault / "inbox.md").read_bytes() == after_first


def test_append_applies_identical_text_again_after_window(vault, cfg_for):
    cfg = cfg_for(dedupe_window_s=600.0)
    append_to_note(cfg, "inbox.md", "- call the vet", now=1000.0)
    later = append_to_note(cfg, "inbox.md", "- call the vet", now=1000.0 + 601)
    assert not later.duplicate
    assert (vault / "inbox.md").read_text(encoding="utf-8").count("- call the vet") == 2


def test_append_applies_different_text_within_window(vault, cfg_for):
    cfg = cfg_for()
    append_to_note(cfg, "inbox.md", "- call the vet", now=1000.0)
    other = append_to_note(cfg, "inbox.md", "- call the dentist", now=1001.0)
    assert not other.duplicate
    text = (vault / "inbox.md").read_text(encoding="utf-8")
    assert text.endswith("- call the vet\n\n- call the dentist\n")


def test_append_applies_retry_again_when_user_deleted_the_text(vault, cfg_for):
    cfg = cfg_for()
    original = (vault / "inbox.md").read_bytes()
    append_to_note(cfg, "inbox.md", "- call the vet", now=1000.0)
    (vault / "inbox.md").write_bytes(original)  # the user removed it by hand
    retry = append_to_note(cfg, "inbox.md", "- call the vet", now=1001.0)
    assert not retry.duplicate
    assert (vault / "inbox.md").read_bytes() == original + b"\n- call the vet\n"


def test_append_dedupes_per_note(vault, cfg_for):
    cfg = cfg_for()
    append_to_note(cfg, "inbox.md", "- same text", now=1000.0)
    other = append_to_note(cfg, "projects/alpha.md", "- same text", now=1001.0)
    assert not other.duplicate
    assert (vault / "projects" / "alpha.md").read_text(encoding="utf-8").endswith("- same text\n")


# ---- concurrency -------------------------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from dataclasses import replace
    from kb_config import load_config
    from kb_write import append_to_note
    vault, data, tag, go = sys.argv[2], sys.argv[3], sys.argv[4], Path(sys.argv[5])
    cfg = replace(load_config(None, env={"KB_DIR": vault, "KB_DATA_DIR": data}), writable=("inbox.md",))
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    for i in range(20):
        append_to_note(cfg, "inbox.md", f"- writer {tag} line {i}")
    """
)


def test_append_from_two_processes_loses_no_write(vault, tmp_path):
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(REPO_ROOT), str(vault), str(tmp_path / "data"), tag, str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for tag in ("A", "B")
    ]
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    text = (vault / "inbox.md").read_text(encoding="utf-8")
    assert text.startswith("# Inbox\n\n- first capture\n")
    for tag in ("A", "B"):
        for i in range(20):
            assert text.count(f"- writer {tag} line {i}\n") == 1, (tag, i)
    assert sorted(p.name for p in vault.iterdir()) == ["inbox.md", "projects"]  # no temp files left behind


# ---- a full disk -------------------------------------------------------------------------------------------------


def _failing_write(after_bytes: int):
    """os.write that writes `after_bytes` bytes, then fails as a full disk does (ENOSPC)."""
    import errno

    real_write = os.write
    budget = {"left": after_bytes}

    def write(fd: int, data) -> int:
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, bytes(data[: budget["left"]]))
        budget["left"] -= n
        return n

    return write


def test_append_on_a_full_disk_leaves_the_note_as_it_was_and_says_so(vault, cfg_for, monkeypatch):
    before = (vault / "inbox.md").read_bytes()
    monkeypatch.setattr(os, "write", _failing_write(100))  # the disk fills 100 bytes into a 5,000-byte block
    with pytest.raises(WriteRefusedError, match="No space left on device; nothing was appended"):
        append_to_note(cfg_for(), "inbox.md", "x" * 5000 + "\n")
    monkeypatch.undo()
    assert (vault / "inbox.md").read_bytes() == before  # no torn block at its end
    result = append_to_note(cfg_for(), "inbox.md", "x" * 5000 + "\n")  # the same text again, once space is freed
    assert not result.duplicate  # the failed attempt was not recorded as done
    assert (vault / "inbox.md").read_bytes() == before + b"\n" + b"x" * 5000 + b"\n"


def test_creating_a_note_on_a_full_disk_leaves_no_half_note(vault, cfg_for, monkeypatch):
    monkeypatch.setattr(os, "write", _failing_write(10))
    with pytest.raises(WriteRefusedError, match="nothing was written"):
        append_to_note(cfg_for(creatable=("notes/",)), "notes/new.md", "y" * 3000)
    monkeypatch.undo()
    assert not (vault / "notes" / "new.md").exists()


# ---- a read-only vault or note --------------------------------------------------------------------------------------


def _mount_read_only(root: Path) -> bool:
    """Put root's files on a tmpfs mounted over it, then remount it read-only (root only); False if not possible."""
    files = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root)]).returncode:
        return False
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return subprocess.run(["mount", "-o", "remount,ro", str(root)]).returncode == 0


@pytest.fixture(params=["mount", "permissions"])
def read_only_vault(request, vault: Path):
    """The vault made read-only as a user meets it: a read-only mount (needs root), or permissions (needs a user
    other than root, whom permissions do not stop)."""
    if request.param == "mount":
        if not _mount_read_only(vault):
            subprocess.run(["umount", str(vault)], capture_output=True)
            pytest.skip("mounting needs root and mount(8)")
        yield vault
        subprocess.run(["umount", str(vault)], check=True)
        return
    if os.geteuid() == 0:
        pytest.skip("root writes through permissions")
    paths = [vault, *vault.rglob("*")]
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)
    yield vault
    for p in paths:
        p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.mark.parametrize(
    "path, heading, create_heading",
    [("inbox.md", None, False), ("projects/alpha.md", "Decisions", False), ("notes/new.md", None, False)],
    ids=["append", "insert-under-heading", "create"],
)
def test_a_read_only_vault_refuses_appends_with_the_reason_and_changes_nothing(
    read_only_vault, cfg_for, path, heading, create_heading
):
    before = _snapshot(read_only_vault)
    cfg = cfg_for(creatable=("notes/",))
    with pytest.raises(WriteRefusedError, match=r"read-only \((the disk holding it is mounted read-only|its perm)"):
        append_to_note(cfg, path, "- a thought", heading=heading, create_heading=create_heading)
    assert _snapshot(read_only_vault) == before


def test_a_read_only_vault_is_indexed_and_searched_as_usual(read_only_vault, cfg_for):
    from kb_engine import Engine
    from kb_search import Searcher
    from kb_vectors import HashEmbedder

    engine = Engine(cfg_for(), HashEmbedder())
    report = engine.sync_all()
    assert report.added == 2 and not report.skipped
    assert [h.path for h in Searcher(engine).search("PostgreSQL", mode="keyword").hits][:1] == ["projects/alpha.md"]
