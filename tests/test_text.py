"""Frontmatter and titles (kb_frontmatter), heading-aware chunking and tags (kb_chunk), and the BM25 tokenizer with
jieba and its fallback (kb_text)."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import pytest

import kb_text
from kb_chunk import HEADING_SEP, chunk_note
from kb_frontmatter import parse_frontmatter
from kb_text import Tokenizer, cjk_share, estimate_tokens, split_lines, vault_terms

# A Chinese paragraph of 30 sentences on one line, ending in each of 。！？； in turn (~660 tokens).
ZH_SENTENCES = [f"第{i}句话讲的是仓库库存同步方案的细节和问题{'。！？；'[i % 4]}" for i in range(30)]
ZH_PARAGRAPH = "".join(ZH_SENTENCES)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A shared jieba tokenizer without vault terms; tests that add terms build their own."""
    tk = Tokenizer()
    assert tk.uses_jieba
    return tk


def _slice(text: str, start: int, end: int) -> str:
    return "\n".join(text.split("\n")[start - 1 : end])


# ---- frontmatter and title ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frontmatter", "tags", "aliases"),
    [
        ("tags: [redis, cache]", ("redis", "cache"), ()),
        ("tags:\n  - redis\n  - '#cache'", ("redis", "cache"), ()),
        ("tags: redis, cache", ("redis", "cache"), ()),
        ("tags: '#redis #cache'", ("redis", "cache"), ()),
        ("tag: redis", ("redis",), ()),
        ("tags: [redis, redis]", ("redis",), ()),
        ("aliases: [Cache Notes, 缓存]", (), ("Cache Notes", "缓存")),
        ("aliases: 缓存笔记", (), ("缓存笔记",)),
        ("alias: 缓存", (), ("缓存",)),
        ("tags:\naliases:", (), ()),
    ],
)
def test_chunk_note_reads_tags_and_aliases_from_frontmatter(frontmatter: str, tags: tuple, aliases: tuple) -> None:
    note = chunk_note(f"---\ntitle: Redis\n{frontmatter}\n---\nbody\n", "fallback", 200)

    assert (note.title, note.tags, note.aliases, note.frontmatter_error) == ("Redis", tags, aliases, None)


def test_chunk_note_starts_line_numbers_after_the_frontmatter() -> None:
    text = "---\ntitle: T\n---\nfirst body line\n"

    note = chunk_note(text, "fallback", 200)

    assert parse_frontmatter(text) == ({"title": "T"}, 3, None)
    assert [(c.text, c.line_start, c.line_end) for c in note.chunks] == [("first body line", 4, 4)]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("---\ntitle: [unclosed\n---\nbody text\n", "frontmatter is not valid YAML"),
        ("---\n- a\n- b\n---\nbody text\n", "frontmatter is not a key: value mapping"),
        ("---\ntitle: x\nbody text\n", "frontmatter has no closing '---' line"),
    ],
)
def test_chunk_note_keeps_broken_frontmatter_as_text(text: str, error: str) -> None:
    note = chunk_note(text, "fallback", 200)

    assert note.frontmatter_error is not None and error in note.frontmatter_error
    assert note.title == "fallback"
    assert note.chunks[0].line_start == 1
    body = "\n".join(c.text for c in note.chunks)
    assert text.split("\n")[1] in body and "body text" in body  # the block is indexed as ordinary text


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("---\ntitle: From Meta\n---\n# From H1\n", "From Meta"),
        ("---\ntitle: ''\n---\n# From H1\n", "From H1"),
        ("intro\n\n# From H1\n\n# Second H1\n", "From H1"),
        ("## Only H2\n\ntext\n", "fallback"),
        ("#NoSpace is a tag\n", "fallback"),
        ("", "fallback"),
        ("# 中文标题 #\n", "中文标题"),
    ],
)
def test_chunk_note_takes_title_from_frontmatter_then_first_h1_then_fallback(text: str, title: str) -> None:
    assert chunk_note(text, "fallback", 200).title == title


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("```bash\n# install deps\npip install x\n```\n\n# Real Title\n", "Real Title"),
        ("~~~\n# just a comment\n~~~\n", "fallback"),
    ],
)
def test_chunk_note_ignores_comment_lines_in_code_when_finding_the_title(text: str, title: str) -> None:
    assert chunk_note(text, "fallback", 200).title == title


# ---- chunking ------------------------------------------------------------------------------------------------

SECTIONED_NOTE = """# Project

intro words here about the project and more words to pad it out nicely

## Decisions

We decided to use postgres for storage because it is reliable and boring.

### Storage

Details about storage layer, replication and backups every night.

## Risks

Risk text covers vendor lock-in and cost.
"""


def test_chunk_note_splits_at_headings_with_joined_heading_paths_and_line_ranges() -> None:
    note = chunk_note(SECTIONED_NOTE, "fallback", 20)

    assert [(c.heading_path, c.line_start, c.line_end) for c in note.chunks] == [
        ("Project", 1, 3),
        (f"Project{HEADING_SEP}Decisions", 5, 7),
        (f"Project{HEADING_SEP}Decisions{HEADING_SEP}Storage", 9, 11),
        (f"Project{HEADING_SEP}Risks", 13, 15),
    ]
    assert [c.text for c in note.chunks] == [_slice(SECTIONED_NOTE, c.line_start, c.line_end) for c in note.chunks]


def test_chunk_note_merges_small_sections_under_their_common_heading_path() -> None:
    note = chunk_note(SECTIONED_NOTE, "fallback", 200)

    assert [(c.heading_path, c.line_start, c.line_end) for c in note.chunks] == [("Project", 1, 15)]
    assert note.chunks[0].text.split("\n") == SECTIONED_NOTE.rstrip("\n").split("\n")


def test_chunk_note_counts_lines_alike_for_crlf_and_bom() -> None:
    windows = "\ufeff" + SECTIONED_NOTE.replace("\n", "\r\n")

    expected = [(c.heading_path, c.line_start, c.line_end, c.text) for c in chunk_note(SECTIONED_NOTE, "f", 20).chunks]

    assert [(c.heading_path, c.line_start, c.line_end, c.text) for c in chunk_note(windows, "f", 20).chunks] == expected


@pytest.mark.parametrize("fence", ["```", "~~~", "````"])
def test_chunk_note_does_not_treat_hash_lines_in_fenced_code_as_headings(fence: str) -> None:
    text = (
        "# Setup\n\nInstall the tools first.\n\n"
        f"{fence}bash\n# not a heading\n## nor this\n{fence}\n\n"
        "More setup prose after the code block.\n"
    )

    note = chunk_note(text, "fallback", 200)

    assert note.title == "Setup"
    assert [c.heading_path for c in note.chunks] == ["Setup"]
    assert "# not a heading" in note.chunks[0].text


def test_chunk_note_keeps_a_code_block_whole_when_it_fits() -> None:
    code = "```python\ndef f(x):\n    return x + 1\n\n\ndef g(y):\n    return y * 2\n```"
    prose = "This paragraph explains the two helper functions used by the nightly backup job."
    text = f"# Code\n\n{prose}\n\n{code}\n\n{prose}\n"
    limit = estimate_tokens(code) + 2

    note = chunk_note(text, "fallback", limit)

    assert estimate_tokens(prose) * 2 + estimate_tokens(code) > limit  # the section has to split
    assert code in [c.text for c in note.chunks]
    whole = next(c for c in note.chunks if c.text == code)
    assert _slice(text, whole.line_start, whole.line_end) == code


def test_chunk_note_splits_an_oversize_code_block_at_line_ends() -> None:
    code_lines = [f"echo step {i} && run_task --id {i} --verbose" for i in range(40)]
    text = "# Script\n\n```bash\n" + "\n".join(code_lines) + "\n```\n"

    note = chunk_note(text, "fallback", 40)

    assert len(note.chunks) > 1
    chunk_lines = [line for c in note.chunks for line in c.text.split("\n")]
    assert [line for line in chunk_lines if line.startswith("echo")] == code_lines  # no line lost or cut
    for c in note.chunks:
        assert all(line in _slice(text, c.line_start, c.line_end).split("\n") for line in c.text.split("\n"))


@pytest.mark.parametrize("limit", [40, 60, 200])
def test_chunk_note_splits_long_chinese_paragraph_at_sentence_ends(limit: int) -> None:
    text = "# 库存同步\n\n" + ZH_PARAGRAPH + "\n"

    note = chunk_note(text, "fallback", limit)

    assert len(note.chunks) > 1
    assert all(estimate_tokens(c.text) <= limit for c in note.chunks)
    joined = "".join(c.text for c in note.chunks)
    assert [s for s in ZH_SENTENCES if s not in joined] == []
    assert all(re.search(r"[。！？；]$", c.text) for c in note.chunks if "句" in c.text)  # ends at a sentence end
    assert all(c.line_end == 3 for c in note.chunks if "句" in c.text)  # the paragraph's own line


def test_chunk_note_hard_splits_a_sentence_longer_than_the_limit_without_losing_text() -> None:
    sentence = "仓库库存同步方案" * 20  # 160 CJK characters, no punctuation
    note = chunk_note(sentence, "fallback", 50)

    assert len(note.chunks) > 1
    assert all(estimate_tokens(c.text) <= 50 for c in note.chunks)
    assert "".join(c.text for c in note.chunks) == sentence


def test_chunk_note_starts_a_split_chunk_with_the_previous_chunks_last_sentence_when_overlapping() -> None:
    text = "# 库存同步\n\n" + ZH_PARAGRAPH + "\n"

    plain = chunk_note(text, "fallback", 60).chunks
    overlapped = chunk_note(text, "fallback", 60, overlap_tokens=25).chunks

    last_sentence = re.findall(r"[^。！？；\n]+[。！？；]", overlapped[0].text)[-1]
    assert overlapped[1].text.startswith(last_sentence + "\n")
    assert not plain[1].text.startswith(last_sentence)  # without overlap nothing repeats
    for prev, cur in zip(overlapped, overlapped[1:]):
        assert cur.text.startswith(re.findall(r"[^。！？；\n]+[。！？；]", prev.text)[-1])


def _outside_lines(text: str, note: Any) -> list[tuple[int, int, str]]:
    """Each chunk line (whitespace aside) that its chunk's line range does not hold: (start, end, the line)."""
    lines = text.split("\n")
    out = []
    for c in note.chunks:
        span = re.sub(r"\s+", "", "".join(lines[c.line_start - 1 : c.line_end]))
        out += [(c.line_start, c.line_end, x) for x in c.text.split("\n") if re.sub(r"\s+", "", x) not in span]
    return out


CODE_NOTE = "# Loops\n\n" + "\n\n".join(
    f"Step {i} keeps the counter in range. It stops at {i}.\n\n```c\nfor (;;) {{\n  if (n > {i}) {{\n    break;\n  }}\n}}\n```"
    for i in range(12)
)


@pytest.mark.parametrize("name", ["1-1 notes", "a list of bullets", "code whose lines repeat"])
def test_chunk_note_gives_each_overlapping_chunk_the_lines_of_everything_it_shows(name: str) -> None:
    """A hit is cited as path:lines, so a chunk that starts with the previous chunk's last sentences starts at their
    line: "areas/career/1-1 notes.md:17" showed lines 15-17 (48% of the three dev vaults' chunks started too late)."""
    from kb_fixtures import SAMPLE_KB

    text = {
        "1-1 notes": (SAMPLE_KB / "areas" / "career" / "1-1 notes.md").read_text(encoding="utf-8"),
        "a list of bullets": "# Inbox\n\n" + "\n".join(f"- item {i}: ship part {i}. Then check it." for i in range(60)),
        "code whose lines repeat": CODE_NOTE,
    }[name]

    note = chunk_note(text, "fallback", 200, overlap_tokens=60)

    assert len(note.chunks) > 1 and note.chunks != chunk_note(text, "fallback", 200).chunks  # chunks do overlap
    assert _outside_lines(text, note) == []


def test_every_chunk_of_the_sample_vault_holds_only_its_own_lines() -> None:
    from kb_fixtures import SAMPLE_KB

    outside = {}
    for path in sorted(SAMPLE_KB.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        note = chunk_note(text, path.stem, 200, overlap_tokens=60)
        found = _outside_lines("\n".join(split_lines(text.lstrip("\ufeff"))), note)
        if found:
            outside[path.name] = found[0]
    assert outside == {}


@pytest.mark.parametrize(
    "text",
    ["", "   \n\n\t\n", "---\ntitle: Only Meta\ntags: [x]\n---\n", "# Heading only\n", "\ufeff"],
)
def test_chunk_note_returns_no_chunks_for_an_empty_note(text: str) -> None:
    assert chunk_note(text, "fallback", 200).chunks == ()


# ---- tags ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tags"),
    [
        ("We use #redis and #cache/local here.", ("redis", "cache/local")),
        ("中文标签 #库存 也算", ("库存",)),
        ("#start-of-line tag", ("start-of-line",)),
        ("# Heading is not a tag", ()),
        ("issue#12 and a#b and https://x.org/page#section", ()),
        ("#123 is a number, #2024-review is a tag", ("2024-review",)),
        ("```\n#incode\n```\n~~~\n#tilde\n~~~\n#real", ("real",)),
        ("#dup #dup", ("dup",)),
    ],
)
def test_chunk_note_collects_inline_tags_outside_code(body: str, tags: tuple) -> None:
    assert chunk_note(body, "fallback", 200).tags == tags


def test_chunk_note_puts_frontmatter_tags_before_inline_tags_without_duplicates() -> None:
    note = chunk_note("---\ntags: [b, a]\n---\ntext #a #c\n", "fallback", 200)

    assert note.tags == ("b", "a", "c")


def test_chunk_note_skips_tags_in_inline_code() -> None:
    assert chunk_note("Run `grep #todo` to list them.", "fallback", 200).tags == ()


# ---- estimate_tokens ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("hello world", 2), ("你好世界", 4), ("a.b", 3), ("redis 缓存!", 4), ("snake_case_name", 1)],
)
def test_estimate_tokens_counts_words_cjk_characters_and_symbols(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


# ---- tokenizer -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Hello WORLD", ["hello", "world"]),
        ("The quick fox is on the table", ["quick", "fox", "table"]),
        ("backup-nightly.timer", ["backup-nightly.timer", "backup", "nightly", "timer"]),
        ("edit settings.local.json", ["settings.local.json", "edit", "settings", "local", "json"]),
        ("ERR_CONN_RESET", ["err_conn_reset", "err", "conn", "reset"]),
        ("C++ and C#", ["c++", "c#"]),
        ("ＡＢＣ full-width", ["full-width", "abc", "full", "width"]),
        ("version 2 of 3", ["version", "2", "3"]),
        ("a b c x", []),
    ],
)
def test_tokenize_lowercases_latin_drops_stopwords_and_keeps_compounds_whole_and_split(
    tokenizer: Tokenizer, text: str, tokens: list[str]
) -> None:
    assert tokenizer.tokenize(text) == tokens


def test_tokenize_handles_mixed_chinese_and_english(tokenizer: Tokenizer) -> None:
    tokens = tokenizer.tokenize("我们的云仓WMS项目用Redis缓存, see backup-nightly.timer")

    assert {"redis", "wms", "项目", "缓存", "backup-nightly.timer", "timer"} <= set(tokens)
    assert not {"我们", "的"} & set(tokens)


@pytest.mark.parametrize(
    "query",
    ["", "   ", "the and of", "What is this?", "的 了 是", "请问 怎么 的", "我们的", "!!! ??? ...", "Please tell me"],
)
def test_tokenize_returns_nothing_for_a_query_of_only_stopwords(tokenizer: Tokenizer, query: str) -> None:
    assert tokenizer.tokenize(query) == []


@pytest.mark.parametrize("query", ["I don't know", "don't"])
def test_tokenize_returns_nothing_for_stopword_contractions(tokenizer: Tokenizer, query: str) -> None:
    assert tokenizer.tokenize(query) == []


def test_set_user_terms_makes_vault_names_single_tokens_and_returns_changes() -> None:
    tk = Tokenizer()
    assert "米哈游" not in tk.tokenize("米哈游面试") and "云仓wms" not in tk.tokenize("云仓WMS上线")

    changed = tk.set_user_terms(["米哈游", "云仓WMS 项目"])

    assert changed == {"米哈游", "云仓wms", "项目"}
    assert "米哈游" in tk.tokenize("米哈游面试")
    assert "云仓wms" in tk.tokenize("云仓WMS上线")
    assert tk.set_user_terms(["米哈游", "云仓WMS 项目"]) == frozenset()
    assert tk.set_user_terms(["云仓WMS 项目"]) == {"米哈游"}
    assert "米哈游" not in tk.tokenize("米哈游面试")


def test_set_user_terms_keeps_the_parts_of_a_mixed_term_searchable() -> None:
    tk = Tokenizer()
    tk.set_user_terms(["云仓WMS 项目"])

    tokens = tk.tokenize("云仓WMS上线")

    assert "wms" in tokens and "云仓" in tokens


@pytest.mark.parametrize(
    ("names", "terms"),
    [
        (["云仓WMS 项目", "Homelab"], {"云仓wms", "项目"}),
        (["米"], set()),
        (["一二三四五六七八九十一二三"], set()),
        (["redis", "Alice Chen"], set()),
        (["Ｍｉｈｏｙｏ米哈游"], {"mihoyo米哈游"}),
    ],
)
def test_vault_terms_keeps_runs_with_cjk_within_length_limits(names: list[str], terms: set[str]) -> None:
    assert vault_terms(names) == terms


def test_tokenize_without_jieba_gives_cjk_unigrams_and_bigrams() -> None:
    tk = Tokenizer(use_jieba=False)

    assert not tk.uses_jieba
    assert tk.tokenize("米哈游") == ["米", "哈", "游", "米哈", "哈游"]
    assert tk.tokenize("云仓wms项目 Redis") == ["云", "仓", "云仓", "wms", "项", "目", "项目", "redis"]
    assert tk.tokenize("我们的") == ["们", "们的"]  # stopwords 我, 的, 我们 dropped


def test_tokenizer_falls_back_and_warns_when_jieba_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "jieba", None)  # makes `import jieba` raise ImportError

    with caplog.at_level(logging.WARNING, logger="kb_text"):
        tk = Tokenizer()

    assert not tk.uses_jieba
    assert tk.tokenize("米哈游") == Tokenizer(use_jieba=False).tokenize("米哈游")
    assert any("jieba" in r.getMessage() and "pip install jieba" in r.getMessage() for r in caplog.records)


def test_tokenizer_signature_differs_between_jieba_and_fallback(tokenizer: Tokenizer) -> None:
    fallback = Tokenizer(use_jieba=False)

    assert tokenizer.signature != fallback.signature
    assert tokenizer.signature == Tokenizer().signature  # stable across instances
    assert all(s.startswith(f"tok{kb_text.TOKENIZER_VERSION}-") for s in (tokenizer.signature, fallback.signature))


def test_tokenize_with_jieba_writes_nothing_to_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    tk = Tokenizer()

    tk.tokenize("第一次分词会加载词典")

    assert capfd.readouterr().out == ""


@pytest.mark.parametrize(
    ("text", "chinese"),
    [
        # A Chinese note of commands: its code outweighs its captions in characters, not in words (half of tldr's
        # Chinese pages read as English when characters were counted).
        ("# tar\n\n- 创建归档:\n\n`tar cf {{path/to/target.tar}} {{path/to/file1 path/to/file2 ...}}`\n", True),
        ("```bash\nkubectl rollout undo deployment/web --to-revision=3\n```\n回滚到上一个版本。\n", True),
        ("git reset --hard 和 --soft 有什么区别", True),  # a mixed question is mostly Chinese words
        ("How do I read the logs of a Docker container?", False),
        ("What is 容器 in Docker, and how do I list every one of them?", False),  # one Chinese term
        ("`kubectl get pods`", False),  # only code: judged on the code
        ("", False),
        ("12345 67", False),
    ],
)
def test_cjk_share_reads_the_language_of_the_words_not_of_the_code(text: str, chinese: bool) -> None:
    assert (cjk_share(text) >= 0.5) is chinese


# ---- one read of jieba's dictionary per process -----------------------------------------------------------------


def test_a_later_tokenizer_shares_jiebas_dictionary_without_the_first_ones_vault_terms(monkeypatch):
    """Every tokenizer after the process's first starts from jieba's own dictionary, shared (reading jieba's cache
    again took ~1 s per engine: most of the test suite's time) and without another tokenizer's vault terms."""
    import jieba

    text = "云仓WMS 项目的米哈游面试复盘和库存同步"
    first = Tokenizer()
    first.set_user_terms(["云仓WMS 项目", "米哈游面试复盘"])
    assert "米哈游面试复盘" in first.tokenize(text)  # its vault terms are in its jieba dictionary
    reads: list[object] = []
    real_initialize = jieba.Tokenizer.initialize
    monkeypatch.setattr(jieba.Tokenizer, "initialize", lambda tk, *a: reads.append(tk) or real_initialize(tk, *a))
    later = Tokenizer()
    later.set_user_terms(["库存同步"])
    tokens = later.tokenize(text)
    assert reads == []  # shared, not read again
    assert "米哈游面试复盘" not in tokens and "库存同步" in tokens
    fresh = jieba.Tokenizer()
    real_initialize(fresh)
    plain = Tokenizer()
    plain.tokenize("预热")
    assert plain._jieba.FREQ == fresh.FREQ and plain._jieba.total == fresh.total  # exactly what jieba itself reads


_CACHED_PROCESS = """
import json, sys
from pathlib import Path
import jieba
from kb_files import WordTableFile
from kb_text import Tokenizer
cache = Path(sys.argv[1])
if sys.argv[2] == "cached":  # jieba must not read its own cache or dictionary: the word table is all there is
    jieba.Tokenizer.initialize = lambda *a, **k: (_ for _ in ()).throw(AssertionError("jieba read its dictionary"))
def private_mb():  # this process's own memory (Linux; 0 elsewhere)
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return sum(int(line.split()[1]) for line in lines if line.startswith("RssAnon:")) / 1024
before = private_mb()
tk = Tokenizer(cache_dir=cache, word_table=WordTableFile(cache / "table.bin"))
tokens = tk.tokenize("米哈游面试复盘和库存同步 with English")
grew = private_mb() - before
print(json.dumps({"tokens": tokens, "entries": len(tk._jieba.FREQ), "total": tk._jieba.total, "grew_mb": grew}))
"""


def test_the_first_tokenizer_of_a_process_reads_jiebas_dictionary_from_the_word_table_once_written(tmp_path):
    """A server's first tokenizer maps jieba's dictionary from our word table (~1 ms) instead of reading jieba's marshal
    cache (~1.2 s here): the first process writes it (and no marshal cache), the next maps it and gets the same
    dictionary and tokens."""
    import json
    import subprocess

    from kb_fixtures import REPO_ROOT

    def run(how: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", _CACHED_PROCESS, str(tmp_path), how],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    (tmp_path / "jieba.cache").write_bytes(b"an earlier version's marshal cache")
    written = run("jieba")
    assert (tmp_path / "table.bin").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.bin"]  # jieba's own 9 MB cache: neither kept nor written
    (tmp_path / "jieba.cache").write_bytes(b"an earlier version wrote it beside the table")
    cached = run("cached")
    assert not (tmp_path / "jieba.cache").exists()  # removed by a process that maps the table, too
    grew_mb, _ = cached.pop("grew_mb"), written.pop("grew_mb")
    assert cached == written and written["entries"] > 300_000
    assert grew_mb < 8  # mapped, not read into the process: as a dict it was ~56 MB of each process's own memory


def test_a_word_table_that_does_not_match_is_ignored_and_rewritten(tmp_path, caplog):
    from kb_files import WordTableFile

    table = WordTableFile(tmp_path / "table.bin")
    assert table.read("k") is None  # no file yet
    table.write("k", {"仓库": 7, "仓": 0, "a": 2**31 - 1}, 2**40 + 7)
    assert table.read("k") == ({"仓库": 7, "仓": 0, "a": 2**31 - 1}, 2**40 + 7)
    assert table.read("another jieba") is None  # written for another dictionary
    raw = (tmp_path / "table.bin").read_bytes()
    header_only = b'{"format": "kb-word-table-2", "key": "k", "words_bytes": 0}\n'  # parses; no slots, no count
    for broken in (raw[:-3], raw[: raw.index(b"\n") + 2], b"not json\n", b"", header_only):
        (tmp_path / "table.bin").write_bytes(broken)
        with caplog.at_level(logging.INFO, logger="kb_files"):
            assert table.read("k") is None, broken[:40]
    assert "rebuilt" in caplog.text
    table.write("k", {"x": 1}, 1)
    assert table.read("k") == ({"x": 1}, 1)
    table.write("k", {"x": 2**31}, 1)  # a count the file cannot hold: not cached (the caller keeps its dict)
    assert table.read("k") == ({"x": 1}, 1)
