"""kb_scan: what scan_vault indexes, and what resolve_inside / note_rel_path accept or refuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kb_config import Config, PathOutsideVaultError, load_config
from kb_scan import note_rel_path, resolve_inside, scan_vault

SAMPLE_KB = Path(__file__).resolve().parent.parent / "examples" / "sample_kb"


def _make_vault(root: Path, files: dict[str, str] | list[str]) -> Path:
    """Write files (vault-relative posix paths) under root/vault and return the vault folder."""
    vault = root / "vault"
    vault.mkdir(exist_ok=True)
    items = files.items() if isinstance(files, dict) else ((f, f"# {f}\n\nbody\n") for f in files)
    for rel, text in items:
        path = vault / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return vault


def _config(vault: Path, **overrides: object) -> Config:
    data_dir = vault.parent / "data"
    return load_config(None, env={}, overrides={"kb_dir": str(vault), "data_dir": str(data_dir), **overrides})


def _refusal(cfg: Config, rel: str, **kwargs: bool) -> str:
    with pytest.raises(PathOutsideVaultError) as info:
        resolve_inside(cfg, rel, **kwargs)
    return str(info.value)


# ---- scan_vault --------------------------------------------------------------------------------------------


def test_scan_vault_returns_each_note_with_its_change_signature(tmp_path: Path) -> None:
    vault = _make_vault(tmp_path, {"inbox.md": "hello\n", "a/b/deep.md": "# 深\n"})

    found = scan_vault(_config(vault))

    assert set(found) == {"inbox.md", "a/b/deep.md"}
    st = (vault / "a" / "b" / "deep.md").stat()
    assert found["a/b/deep.md"] == (st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino)


@pytest.mark.parametrize(
    "skipped",
    [
        ".git/x.md",
        ".obsidian/x.md",
        ".trash/x.md",
        ".logseq/pages/x.md",
        "node_modules/pkg/x.md",
        "sub/node_modules/x.md",
        "__pycache__/x.md",
        ".hidden/x.md",
        "sub/.hidden/x.md",
        ".dotfile.md",
        "sub/.dotfile.md",
    ],
)
def test_scan_vault_skips_hidden_and_builtin_ignored_folders(tmp_path: Path, skipped: str) -> None:
    vault = _make_vault(tmp_path, ["keep.md", "sub/keep.md", skipped])

    assert set(scan_vault(_config(vault))) == {"keep.md", "sub/keep.md"}


@pytest.mark.parametrize(
    ("extensions", "expected"),
    [
        ([".md"], {"a.md", "upper.MD"}),
        ([".md", ".txt"], {"a.md", "upper.MD", "b.txt"}),
        ([".txt"], {"b.txt"}),
    ],
)
def test_scan_vault_skips_files_without_a_note_extension(tmp_path: Path, extensions: list[str], expected: set[str]) -> None:
    vault = _make_vault(tmp_path, ["a.md", "upper.MD", "b.txt", "c.csv", "noext", "md", "pic.md.png"])

    assert set(scan_vault(_config(vault, extensions=extensions))) == expected


def test_scan_vault_skips_config_ignore_globs(tmp_path: Path) -> None:
    vault = _make_vault(tmp_path, ["keep.md", "drafts/x.md", "a/drafts/y.md", "x.tmp.md", "a/z.tmp.md", "archive/2020/old.md"])

    found = scan_vault(_config(vault, ignore=["drafts/", "*.tmp.md", "/archive"]))

    assert set(found) == {"keep.md"}


# Each case: .kbignore files {folder: text}, notes that must be ignored, notes that must be kept.
KBIGNORE_CASES = [
    pytest.param({"": "# secret.md\n\n"}, [], ["secret.md"], id="comment-and-blank-lines"),
    pytest.param({"": "secret.md\n"}, ["secret.md", "a/b/secret.md"], ["secret2.md"], id="bare-name-any-depth"),
    pytest.param({"": "*.md\n!keep.md\n"}, ["x.md", "a/y.md"], ["keep.md", "a/keep.md"], id="negation"),
    pytest.param({"": "!keep.md\n*.md\n"}, ["x.md", "keep.md"], [], id="last-match-wins"),
    pytest.param({"": "old.md/\n"}, ["sub/old.md/n.md"], ["old.md", "sub/old.md.md"], id="trailing-slash-folder-only"),
    pytest.param({"": "drafts/\n"}, ["drafts/a.md", "x/drafts/b.md"], ["drafts.md"], id="folder-any-depth"),
    pytest.param({"": "/top.md\n"}, ["top.md"], ["sub/top.md"], id="leading-slash-anchors"),
    pytest.param({"": "docs/private.md\n"}, ["docs/private.md"], ["x/docs/private.md"], id="inner-slash-anchors"),
    pytest.param({"": "**/secret.md\n"}, ["secret.md", "a/b/secret.md"], ["secret-not.md"], id="leading-double-star"),
    pytest.param({"": "a/**/z.md\n"}, ["a/z.md", "a/b/c/z.md"], ["b/a/z.md", "a/y.md"], id="middle-double-star"),
    pytest.param({"": "logs/**\n"}, ["logs/x.md", "logs/2024/y.md"], ["logs.md", "x/logs/z.md"], id="trailing-double-star"),
    pytest.param({"": "?.md\n[ab]c.md\n"}, ["x.md", "ac.md", "bc.md"], ["xy.md", "cc.md"], id="question-and-class"),
    pytest.param({"": "*.md\n!*.md\n"}, [], ["x.md"], id="negation-undoes-star"),
    pytest.param(
        {"sub": "*.md\n!keep.md\n"},
        ["sub/x.md", "sub/deeper/y.md"],
        ["top.md", "sub/keep.md", "other/x.md"],
        id="nested-kbignore-applies-below-its-folder",
    ),
    pytest.param({"sub": "/x.md\n"}, ["sub/x.md"], ["x.md", "sub/deeper/x.md"], id="nested-anchored-to-its-folder"),
    pytest.param({"sub": "sub/\n"}, [], ["sub/a.md"], id="nested-cannot-ignore-its-own-folder-by-name"),
    pytest.param(
        {"": "private/\n", "pub": "!private/\n"},
        ["private/a.md"],
        ["pub/c.md", "pub/private/b.md"],
        id="nested-negation-overrides-root-rule",
    ),
]


@pytest.mark.parametrize(("kbignores", "ignored", "kept"), KBIGNORE_CASES)
def test_scan_vault_skips_notes_matched_by_kbignore(
    tmp_path: Path, kbignores: dict[str, str], ignored: list[str], kept: list[str]
) -> None:
    vault = _make_vault(tmp_path, ignored + kept)
    for folder, text in kbignores.items():
        (vault / folder).mkdir(parents=True, exist_ok=True)
        (vault / folder / ".kbignore").write_text(text, encoding="utf-8")

    found = set(scan_vault(_config(vault)))

    assert found == set(kept)


@pytest.mark.parametrize(("kbignores", "ignored", "kept"), KBIGNORE_CASES)
def test_resolve_inside_agrees_with_scan_vault_on_kbignore(
    tmp_path: Path, kbignores: dict[str, str], ignored: list[str], kept: list[str]
) -> None:
    vault = _make_vault(tmp_path, ignored + kept)
    for folder, text in kbignores.items():
        (vault / folder).mkdir(parents=True, exist_ok=True)
        (vault / folder / ".kbignore").write_text(text, encoding="utf-8")
    cfg = _config(vault)

    accepted = [rel for rel in kept if resolve_inside(cfg, rel)[1] == rel]
    refusals = [_refusal(cfg, rel) for rel in ignored]

    assert accepted == kept
    assert all("excluded by the ignore rules" in m for m in refusals)


def test_scan_vault_does_not_follow_symlinked_folders(tmp_path: Path) -> None:
    vault = _make_vault(tmp_path, ["keep.md", "projects/p.md"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("secret", encoding="utf-8")
    (vault / "linked-out").symlink_to(outside, target_is_directory=True)
    (vault / "linked-in").symlink_to(vault / "projects", target_is_directory=True)

    assert set(scan_vault(_config(vault))) == {"keep.md", "projects/p.md"}


def test_scan_vault_skips_a_symlinked_note_that_points_outside_the_vault(tmp_path: Path) -> None:
    vault = _make_vault(tmp_path, ["real.md"])
    outside = tmp_path / "secret.md"
    outside.write_text("secret", encoding="utf-8")
    (vault / "leak.md").symlink_to(outside)
    (vault / "alias.md").symlink_to(vault / "real.md")
    (vault / "dangling.md").symlink_to(vault / "gone.md")

    assert set(scan_vault(_config(vault))) == {"real.md", "alias.md"}


def test_scan_vault_indexes_the_sample_vault_without_ignored_files(tmp_path: Path) -> None:
    cfg = load_config(None, env={}, overrides={"kb_dir": str(SAMPLE_KB), "data_dir": str(tmp_path / "data")})

    found = set(scan_vault(cfg))

    assert {"inbox.md", "projects/homelab/Homelab.md", "resources/interviews/米哈游面试复盘.md"} <= found
    assert ".trash/old-note.md" not in found
    assert [p for p in found if p.startswith(("templates/", ".obsidian/", ".trash/", "attachments/"))] == []
    assert all(p.endswith(".md") for p in found)
    assert (SAMPLE_KB / ".trash" / "old-note.md").is_file()  # the exclusions above are real files
    assert (SAMPLE_KB / "templates" / "daily-template.md").is_file()


# ---- resolve_inside ------------------------------------------------------------------------------------------


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    return _make_vault(
        tmp_path,
        [
            "inbox.md",
            "projects/homelab/Homelab.md",
            "resources/interviews/米哈游面试复盘.md",
            "areas/career/1-1 notes.md",
            "drafts/wip.md",
            "templates/daily.md",
            ".obsidian/x.md",
        ],
    )


@pytest.mark.parametrize(
    ("rel", "problem"),
    [
        ("", "is empty or malformed"),
        ("   ", "is empty or malformed"),
        ("inbox\x00.md", "is empty or malformed"),
        ("/etc/passwd.md", "is an absolute path"),
        ("/inbox.md", "is an absolute path"),
        ("C:\\notes\\x.md", "is an absolute path"),
        ("c:/x.md", "is an absolute path"),
        ("C:x.md", "is an absolute path"),
        ("~/x.md", "is an absolute path"),
        ("\\\\server\\share\\x.md", "is an absolute path"),
        ("../x.md", "'..' is not allowed"),
        ("projects/../../x.md", "'..' is not allowed"),
        ("projects/../inbox.md", "'..' is not allowed"),
        ("projects\\..\\..\\x.md", "'..' is not allowed"),
        (".obsidian/x.md", "hidden or ignored folder/file ('.obsidian')"),
        (".git/config.md", "hidden or ignored folder/file ('.git')"),
        ("a/.trash/x.md", "hidden or ignored folder/file ('.trash')"),
        ("node_modules/x.md", "hidden or ignored folder/file ('node_modules')"),
        ("projects/.secret.md", "hidden or ignored folder/file ('.secret.md')"),
        ("inbox.txt", "is not a note"),
        ("projects/homelab", "is not a note"),
        ("Homelab.md.bak", "is not a note"),
        ("templates/daily.md", "excluded by the ignore rules"),
        ("templates/new.md", "excluded by the ignore rules"),
        ("drafts/wip.md", "excluded by the ignore rules"),
    ],
)
def test_resolve_inside_rejects_paths_it_must_not_touch(vault: Path, rel: str, problem: str) -> None:
    (vault / ".kbignore").write_text("templates/\n", encoding="utf-8")
    cfg = _config(vault, ignore=["drafts/"])

    message = _refusal(cfg, rel, must_exist=False)

    assert problem in message
    assert str(vault) in message or rel in message  # says which path, or which vault, it refused


@pytest.mark.parametrize(
    ("rel", "norm"),
    [
        ("inbox.md", "inbox.md"),
        ("projects/homelab/Homelab.md", "projects/homelab/Homelab.md"),
        ("resources/interviews/米哈游面试复盘.md", "resources/interviews/米哈游面试复盘.md"),
        ("areas/career/1-1 notes.md", "areas/career/1-1 notes.md"),
        ("projects\\homelab\\Homelab.md", "projects/homelab/Homelab.md"),
        ("./projects//homelab/./Homelab.md", "projects/homelab/Homelab.md"),
        ("  inbox.md\n", "inbox.md"),
    ],
)
def test_resolve_inside_accepts_notes_in_the_vault(vault: Path, rel: str, norm: str) -> None:
    path, got = resolve_inside(_config(vault), rel)

    assert got == norm
    assert path == vault / norm
    assert path.is_file()


def test_resolve_inside_accepts_a_case_variant_extension(vault: Path) -> None:
    (vault / "UPPER.MD").write_text("x", encoding="utf-8")

    assert resolve_inside(_config(vault), "UPPER.MD")[1] == "UPPER.MD"


def test_resolve_inside_rejects_a_missing_note_when_it_must_exist(vault: Path) -> None:
    message = _refusal(_config(vault), "projects/new.md")

    assert "note 'projects/new.md' does not exist" in message


def test_resolve_inside_accepts_a_missing_note_when_it_need_not_exist(vault: Path) -> None:
    path, norm = resolve_inside(_config(vault), "projects/new/idea.md", must_exist=False)

    assert (path, norm) == (vault / "projects" / "new" / "idea.md", "projects/new/idea.md")
    assert not path.exists()  # resolving never creates anything


def test_resolve_inside_rejects_a_folder_named_like_a_note(vault: Path) -> None:
    (vault / "folder.md").mkdir()

    assert "does not exist" in _refusal(_config(vault), "folder.md")


@pytest.mark.parametrize("must_exist", [True, False])
def test_resolve_inside_rejects_a_note_symlink_escaping_the_vault(tmp_path: Path, vault: Path, must_exist: bool) -> None:
    outside = tmp_path / "secret.md"
    outside.write_text("secret", encoding="utf-8")
    (vault / "leak.md").symlink_to(outside)

    message = _refusal(_config(vault), "leak.md", must_exist=must_exist)

    assert "outside the vault" in message and "symlink escape" in message


@pytest.mark.parametrize("rel", ["linked/secret.md", "linked/new-note.md", "projects/linked/secret.md"])
def test_resolve_inside_rejects_a_folder_symlink_escaping_the_vault(tmp_path: Path, vault: Path, rel: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("secret", encoding="utf-8")
    (vault / "linked").symlink_to(outside, target_is_directory=True)
    (vault / "projects" / "linked").symlink_to(outside, target_is_directory=True)

    message = _refusal(_config(vault), rel, must_exist=False)

    assert "symlink escape" in message
    assert not (outside / "new-note.md").exists()


def test_resolve_inside_rejects_a_symlink_to_a_sibling_folder_sharing_the_vault_prefix(tmp_path: Path, vault: Path) -> None:
    sibling = tmp_path / (vault.name + "-private")  # "vault-private" starts with "vault"
    sibling.mkdir()
    (sibling / "secret.md").write_text("secret", encoding="utf-8")
    (vault / "twin.md").symlink_to(sibling / "secret.md")

    assert "symlink escape" in _refusal(_config(vault), "twin.md")


@pytest.mark.parametrize(
    ("link", "target", "rel"),
    [("cfg", ".obsidian", "cfg/x.md"), ("tpl", "templates", "tpl/daily.md"), ("alias", "projects", "alias/homelab/Homelab.md")],
)
def test_resolve_inside_rejects_a_path_through_a_folder_symlink_inside_the_vault(
    vault: Path, link: str, target: str, rel: str
) -> None:
    (vault / ".kbignore").write_text("templates/\n", encoding="utf-8")
    (vault / link).symlink_to(vault / target, target_is_directory=True)
    cfg = _config(vault)
    assert (vault / rel).is_file()  # reachable through the link on disk

    message = _refusal(cfg, rel, must_exist=False)

    assert f"symlinked folder '{link}'" in message
    assert rel not in scan_vault(cfg)  # the index never sees it either


def test_resolve_inside_accepts_a_note_symlink_inside_the_vault(vault: Path) -> None:
    (vault / "alias.md").symlink_to(vault / "inbox.md")

    path, norm = resolve_inside(_config(vault), "alias.md")

    assert (path, norm) == (vault / "alias.md", "alias.md")


# ---- note_rel_path ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        ("inbox.md", "inbox.md"),
        ("projects/homelab/Homelab.md", "projects/homelab/Homelab.md"),
        ("projects/new-note.md", "projects/new-note.md"),
        ("projects/homelab/../../inbox.md", "inbox.md"),
        ("resources/interviews/米哈游面试复盘.md", "resources/interviews/米哈游面试复盘.md"),
        (".obsidian/x.md", None),
        ("notes.txt", None),
        ("templates/daily.md", None),
        ("", None),
        ("../outside.md", None),
    ],
)
def test_note_rel_path_maps_absolute_paths_to_note_paths(vault: Path, rel: str, expected: str | None) -> None:
    (vault / ".kbignore").write_text("templates/\n", encoding="utf-8")
    cfg = _config(vault)
    absolute = os.path.join(str(vault), rel) if rel else str(vault)

    assert note_rel_path(cfg, absolute) == expected
    assert note_rel_path(cfg, Path(absolute)) == expected
