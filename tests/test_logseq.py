"""Vault semantics (kb_frontmatter, kb_chunk): frontmatter and Logseq properties, note dates, outline detection and
block chunking (over examples/logseq_sample), Chinese included."""

from __future__ import annotations

import datetime as dt
import re
import textwrap
from pathlib import Path

import pytest
from kb_fixtures import run_bounded

from kb_chunk import HEADING_SEP, chunk_note
from kb_frontmatter import frontmatter_properties, iso_date, logseq_page_name, note_date, parse_property_line
from kb_text import estimate_tokens

REPO_ROOT = Path(__file__).resolve().parent.parent
LOGSEQ_SAMPLE = REPO_ROOT / "examples" / "logseq_sample"
SAMPLE_KB = REPO_ROOT / "examples" / "sample_kb"
SAMPLE_NOTES = sorted(p.relative_to(LOGSEQ_SAMPLE).as_posix() for p in LOGSEQ_SAMPLE.rglob("*.md"))
_PROPERTY_LINE = re.compile(r"[ \t]*(?:[-*+][ \t]+)?[\w\-]+::(?:[ \t].*)?$")


def _sample(rel: str, chunk_tokens: int = 200):
    text = (LOGSEQ_SAMPLE / rel).read_text("utf-8")
    return text, chunk_note(text, Path(rel).stem, chunk_tokens, rel_path=rel, logseq_graph=True)


# ---- frontmatter properties ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("status: active", {"status": ("active",)}),
        ("Status: Active", {"status": ("Active",)}),
        ("count: 3", {"count": ("3",)}),
        ("ratio: 0.25", {"ratio": ("0.25",)}),
        ("done: true", {"done": ("true",)}),
        ("done: no", {"done": ("false",)}),
        ("due: 2026-03-02", {"due": ("2026-03-02",)}),
        ("at: 2026-03-02 10:30:00", {"at": ("2026-03-02T10:30:00",)}),
        ("project: [Kestrel, 红隼]", {"project": ("Kestrel", "红隼")}),
        ("project:\n  - Kestrel\n  - Kestrel", {"project": ("Kestrel",)}),
        ("project:\n  name: Kestrel\n  owner:\n    name: 张伟", {"project.name": ("Kestrel",), "project.owner.name": ("张伟",)}),
        ("mixed: [1, true, 2026-01-05, [a, b], {k: v}]", {"mixed": ("1", "true", "2026-01-05", "a", "b")}),
        ('related: "[[Other Note]]"', {"related": ("Other Note",)}),
        ('related: ["[[A|label]]", "[[B]]"]', {"related": ("A", "B")}),
        ("empty:", {"empty": ()}),
        ("blank: ''", {"blank": ()}),
        ("none: []", {"none": ()}),
        ("状态: 进行中", {"状态": ("进行中",)}),
        ("1: one", {"1": ("one",)}),
    ],
)
def test_chunk_note_does_convert_each_frontmatter_property_type(yaml_text: str, expected: dict) -> None:
    note = chunk_note(f"---\n{yaml_text}\n---\nbody\n", "f", 200)

    assert note.properties == expected and note.frontmatter_error is None


def test_frontmatter_properties_does_flatten_nested_mappings_only_to_the_depth_limit() -> None:
    deep: dict = {"leaf": "x"}
    for i in range(20):
        deep = {f"k{i}": deep}

    props = frontmatter_properties({"top": "t", "deep": deep, "d": dt.date(2026, 3, 2), "t": dt.time(9, 30)})

    assert props["top"] == ("t",) and props["d"] == ("2026-03-02",) and props["t"] == ("09:30:00",)
    assert all(key.count(".") < 8 for key in props) and not any(key.endswith("leaf") for key in props)


def test_chunk_note_does_keep_tags_and_aliases_fields_beside_their_properties() -> None:
    note = chunk_note("---\ntags: [work, 项目]\naliases: [WMS]\nstatus: active\n---\nbody #inline\n", "f", 200)

    assert (note.tags, note.aliases) == (("work", "项目", "inline"), ("WMS",))
    assert note.properties == {"tags": ("work", "项目"), "aliases": ("WMS",), "status": ("active",)}


@pytest.mark.parametrize(
    "frontmatter",
    ["title: [unclosed", "created: 2024-13-45", "a: &a [*a]", "- a\n- b"],
    ids=["invalid", "impossible-date", "recursive-alias", "not-a-mapping"],
)
def test_chunk_note_skips_properties_of_broken_frontmatter(frontmatter: str) -> None:
    note = chunk_note(f"---\n{frontmatter}\n---\nbody text\n", "f", 200)

    assert note.frontmatter_error is not None and note.properties == {}


def test_chunk_note_skips_properties_of_a_yaml_alias_bomb_in_bounded_time() -> None:
    bomb = "---\na: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(6)
    )
    props, error = run_bounded(
        "import json; from kb_chunk import chunk_note\n"
        f"note = chunk_note({bomb + 'tags: *g' + chr(10) + '---' + chr(10) + 'body' + chr(10)!r}, 'f', 200)\n"
        "print(json.dumps([note.properties, note.frontmatter_error]))"
    )

    assert props == {} and "expands to over" in error


# ---- Logseq properties -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("status:: active", ("status", ("active",))),
        ("Status:: Active", ("status", ("Active",))),
        ("tags:: work, [[Data, Platform]], #ops, #[[multi word]]", ("tags", ("work", "Data, Platform", "ops", "multi word"))),
        ("owner:: [[Alice Chen]]", ("owner", ("Alice Chen",))),
        ("alias:: 红隼项目, Kestrel", ("alias", ("红隼项目", "Kestrel"))),
        ("title:: Kestrel, the project", ("title", ("Kestrel, the project",))),
        ("- status:: done", ("status", ("done",))),
        ("\t\tid:: 65f0c1a2-0000-4000-8000-000000000001", ("id", ("65f0c1a2-0000-4000-8000-000000000001",))),
        ("collapsed:: true", ("collapsed", ("true",))),
        ("empty::", ("empty", ())),
        ("spaces::   a ,  , b  ", ("spaces", ("a", "b"))),
        ("中文键:: 值一, 值二", ("中文键", ("值一", "值二"))),
        ("due-date:: [[Mar 2nd, 2026]]", ("due-date", ("Mar 2nd, 2026",))),
    ],
)
def test_parse_property_line_does_read_logseq_values(line: str, expected: tuple) -> None:
    assert parse_property_line(line) == expected


@pytest.mark.parametrize(
    "line", ["std::vector<int> v;", "a :: b", "http://example.com", "no colon", "k::v", ":: value", "key: value"]
)
def test_parse_property_line_rejects_lines_that_are_not_properties(line: str) -> None:
    assert parse_property_line(line) is None


def test_chunk_note_does_read_logseq_page_properties_and_block_properties() -> None:
    _, note = _sample("pages/Kestrel Project.md")

    assert note.properties == {
        "alias": ("Kestrel", "红隼项目"),
        "status": ("active", "done"),  # the page's, then a block's
        "owner": ("Alice Chen",),
        "tags": ("project", "Data Platform"),
        "started": ("Mar 2nd, 2026",),
        "decided": ("Mar 2nd, 2026",),
    }
    assert note.aliases == ("Kestrel", "红隼项目")
    assert note.tags == ("project", "Data Platform", "risk", "data quality")


def test_chunk_note_does_keep_block_ids_on_chunks_not_on_the_note() -> None:
    text, note = _sample("pages/Kestrel Project.md", 30)

    decisions = next(c for c in note.chunks if "Use Kafka" in c.text)
    assert decisions.properties["id"] == ("65f0c1a2-0000-4000-8000-000000000001",)
    assert decisions.properties["status"] == ("done",)
    assert "id" not in note.properties and "collapsed" not in note.properties
    assert all("::" not in c.text for c in note.chunks)


def test_chunk_note_does_read_page_properties_written_as_the_first_block() -> None:
    text = "- type:: person\n  role:: 技术总监\n- 负责 [[红隼项目]]\n- 喜欢先看数据\n"

    note = chunk_note(text, "张伟", 200)

    assert note.outline and note.properties == {"type": ("person",), "role": ("技术总监",)}
    assert [(c.text, c.line_start, c.line_end) for c in note.chunks] == [("- 负责 [[红隼项目]]\n- 喜欢先看数据", 3, 4)]


def test_chunk_note_does_read_inline_properties_of_a_markdown_note_and_keeps_its_text() -> None:
    text = "# Meeting\n\nstatus:: active\nproject:: [[Kestrel]]\n\nNotes here.\n\n```\nfake:: in code\n```\n"

    note = chunk_note(text, "f", 200)

    assert not note.outline and note.properties == {"status": ("active",), "project": ("Kestrel",)}
    assert "status:: active" in note.chunks[0].text


def test_chunk_note_does_take_the_title_from_a_title_property_then_the_page_name() -> None:
    titled = chunk_note("title:: 红隼项目\n\n- a\n- b\n", "Kestrel", 200, rel_path="pages/Kestrel.md", logseq_graph=True)
    _, namespaced = _sample("pages/Kestrel Project___Roadmap.md")
    _, escaped = _sample("pages/Meetings%2FWeekly sync.md")

    assert (titled.title, namespaced.title, escaped.title) == ("红隼项目", "Kestrel Project/Roadmap", "Meetings/Weekly sync")


@pytest.mark.parametrize(
    ("stem", "name"),
    [
        ("Kestrel Project___Roadmap", "Kestrel Project/Roadmap"),
        ("Meetings%2FWeekly sync", "Meetings/Weekly sync"),
        ("a___b___c", "a/b/c"),
        ("What%3F", "What?"),
        ("项目___规划", "项目/规划"),
        ("plain", "plain"),
    ],
)
def test_logseq_page_name_does_decode_file_name_escaping(stem: str, name: str) -> None:
    assert logseq_page_name(stem) == name


def test_chunk_note_does_count_logseq_hash_and_bracket_refs_as_tags() -> None:
    _, note = _sample("pages/数据平台.md")

    assert note.tags == ("平台", "基础设施", "流式 计算")  # tags:: first, then #[[流式 计算]]


def test_chunk_note_skips_tags_in_outline_code_blocks() -> None:
    text = "- C snippet\n\t- ```c\n\t  #include <stdio.h>\n\t  ```\n- real #tag\n"

    assert chunk_note(text, "f", 200).tags == ("tag",)


# ---- dates -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-03-02", "2026-03-02"),
        ("2026-3-2", "2026-03-02"),
        ("2026/03/02", "2026-03-02"),
        ("2026.03.02", "2026-03-02"),
        ("2026_03_02", "2026-03-02"),
        ("2026-03-02T10:30:00", "2026-03-02"),
        ("2026年3月2日", "2026-03-02"),
        ("Mar 2nd, 2026", "2026-03-02"),
        ("March 2, 2026", "2026-03-02"),
        ("Sept 21st, 2026", "2026-09-21"),
        ("[[Mar 2nd, 2026]]", "2026-03-02"),
        ("2026-02-30", None),
        ("2026-13-01", None),
        ("Foo 2, 2026", None),
        ("next week", None),
        ("20260302", None),
        ("2026-03-02-extra", "2026-03-02"),
    ],
)
def test_iso_date_does_read_each_format_and_rejects_impossible_dates(value: str, expected: str | None) -> None:
    assert iso_date(value) == expected


@pytest.mark.parametrize(
    ("rel_path", "properties", "expected"),
    [
        ("journals/2026_03_02.md", {}, "2026-03-02"),
        ("daily/2026-03-02.md", {}, "2026-03-02"),
        ("daily/2026-03-02 Monday.md", {}, "2026-03-02"),
        ("meetings/2026-03-04 云仓WMS 周会.md", {}, "2026-03-04"),
        ("notes/Plan.md", {"date": ("2026-03-05",)}, "2026-03-05"),
        ("notes/Plan.md", {"date": ("Mar 5th, 2026",)}, "2026-03-05"),
        ("notes/Plan.md", {"date": ("soon", "2026年3月5日")}, "2026-03-05"),
        ("notes/Plan.md", {"created": ("2026-03-05",)}, None),
        ("notes/Plan.md", {}, None),
        ("daily/2026-02-30.md", {}, None),
        ("daily/2026.03.02.md", {}, None),
        ("journals/2026_03_02.md", {"date": ("2026-04-01",)}, "2026-03-02"),
        ("", {"date": ("2026-04-01",)}, "2026-04-01"),
    ],
)
def test_note_date_does_use_the_file_name_then_the_date_property(rel_path: str, properties: dict, expected: str | None) -> None:
    assert note_date(rel_path, properties) == expected


@pytest.mark.parametrize(
    ("text", "rel_path", "expected"),
    [
        ("---\ndate: 2026-03-07\n---\nbody\n", "notes/x.md", "2026-03-07"),
        ("date:: [[Mar 8th, 2026]]\n\n- a\n- b\n", "pages/x.md", "2026-03-08"),
        ("# 周一\n\nbody\n", "daily/2026-03-02 周一.md", "2026-03-02"),
        ("# x\n", "notes/x.md", None),
    ],
)
def test_chunk_note_does_set_the_notes_date_from_each_source(text: str, rel_path: str, expected: str | None) -> None:
    assert chunk_note(text, "x", 200, rel_path=rel_path).date == expected


def test_chunk_note_does_date_the_journals_and_dated_pages_of_the_sample() -> None:
    dates = {rel: _sample(rel)[1].date for rel in SAMPLE_NOTES}

    assert {rel: d for rel, d in dates.items() if d} == {
        "journals/2026_03_02.md": "2026-03-02",
        "journals/2026_03_03.md": "2026-03-03",
        "journals/2026_03_05.md": "2026-03-05",
        "journals/2026_03_10.md": "2026-03-10",
        "pages/Incident 2026-03 late events.md": "2026-03-10",  # its date:: property
    }


# ---- outline detection -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel_path", "text", "logseq_graph", "expected"),
    [
        ("pages/Anything.md", "# A heading\n\nprose\n", True, True),
        ("journals/2026_03_02.md", "plain text\n", True, True),
        ("pages/Anything.md", "# A heading\n\nprose\n", False, False),
        ("notes/x.md", "- a\n- b\n\t- c\n", False, True),
        ("notes/x.md", "title:: X\nalias:: Y\n\n- a\n- b\n", False, True),
        ("notes/x.md", "- a\n  continued line\n- b\n", False, True),
        ("notes/x.md", "---\ntags: [x]\n---\n- a\n- b\n", False, True),
        ("notes/x.md", "# Inbox\n\nSome prose.\n\n- a\n- b\n- c\n", False, False),
        ("notes/x.md", "# Plan\n\n" + "- item\n" * 30, False, False),
        ("notes/x.md", "- a\n- b\n\n## Later\n\n- c\n", False, False),
        ("notes/x.md", "- # Logseq heading block\n- b\n", False, True),
        ("notes/x.md", "- only one\n", False, False),
        ("notes/x.md", "prose\n", False, False),
        ("notes/x.md", "", False, False),
        ("notes/x.md", "```\n- a\n- b\n```\n", False, False),
        ("notes/x.md", "---\n\n- a\n- b\n", False, False),
        ("other/pages.md", "# x\n", True, False),
    ],
)
def test_chunk_note_detects_outlines_by_folder_or_text(rel_path: str, text: str, logseq_graph: bool, expected: bool) -> None:
    assert chunk_note(text, "t", 200, rel_path=rel_path, logseq_graph=logseq_graph).outline is expected
    assert chunk_note(text, "f", 200, rel_path=rel_path, logseq_graph=logseq_graph).outline is expected


def test_chunk_note_finds_no_outline_in_the_markdown_sample_vault() -> None:
    """The golden sets run over sample_kb: its heading-aware chunks must not change."""
    notes = [p for p in SAMPLE_KB.rglob("*.md") if ".trash" not in p.parts]

    outlines = [
        p.name for p in notes if chunk_note(p.read_text("utf-8"), "t", 200, rel_path=p.relative_to(SAMPLE_KB).as_posix()).outline
    ]

    assert len(notes) > 25 and outlines == []


# ---- outline chunking ------------------------------------------------------------------------------------------------

OUTLINE = """- Summary
\t- On March 10 the revenue total was low.
\t- The streaming path counted correctly.
- Timeline
\t- 00:05 batch starts
\t\tid:: 1111
\t- 00:40 late events arrive
\t\t- from mobile clients
\t\t- buffered offline
\t- 09:10 finance reports the gap
- Follow-ups
\t- TODO add a watermark
"""


def test_chunk_note_does_keep_children_with_their_parent_while_they_fit() -> None:
    note = chunk_note(OUTLINE, "f", 200)

    assert note.outline and len(note.chunks) == 1
    chunk = note.chunks[0]
    assert (chunk.heading_path, chunk.line_start, chunk.line_end) == ("", 1, 12)
    assert chunk.text == OUTLINE.strip().replace("\t\tid:: 1111\n", "")
    assert chunk.properties == {"id": ("1111",)}


def test_chunk_note_does_chunk_an_outline_at_block_boundaries_with_parent_paths() -> None:
    note = chunk_note(OUTLINE, "f", 20)

    assert [(c.heading_path, c.line_start, c.line_end, c.text) for c in note.chunks] == [
        ("", 1, 3, "- Summary\n\t- On March 10 the revenue total was low.\n\t- The streaming path counted correctly."),
        ("", 4, 5, "- Timeline\n\t- 00:05 batch starts"),
        ("Timeline", 7, 9, "- 00:40 late events arrive\n\t- from mobile clients\n\t- buffered offline"),
        ("Timeline", 10, 10, "- 09:10 finance reports the gap"),
        ("", 11, 12, "- Follow-ups\n\t- TODO add a watermark"),
    ]


def test_chunk_note_does_name_every_parent_in_a_deep_chunks_heading_path() -> None:
    text = (
        "- 数据平台\n\t- 组件\n\t\t- Kafka 集群\n\t\t\t- "
        + "消息保留七天。" * 8
        + "\n\t\t\t- "
        + "关键主题保留三十天。" * 6
        + "\n"
    )

    note = chunk_note(text, "f", 70)

    # a parent's line opens the chunk of its first children; lone parent lines live on in the paths
    assert [(c.heading_path, c.line_start, c.line_end) for c in note.chunks] == [
        ("数据平台 > 组件", 3, 4),
        ("数据平台 > 组件 > Kafka 集群", 5, 5),
    ]
    assert note.chunks[0].text.startswith("- Kafka 集群\n\t- 消息保留七天。")


def test_chunk_note_does_shorten_long_parent_text_in_heading_paths() -> None:
    parent = "A very long parent block that goes on and on about the migration plan"
    text = f"- {parent}\n\t- " + "child words " * 30 + "\n\t- " + "more words " * 30 + "\n"

    paths = {c.heading_path for c in chunk_note(text, "f", 70).chunks}

    assert paths >= {parent[:39].rstrip() + "…"}
    assert any(parent in c.text for c in chunk_note(text, "f", 70).chunks)  # a shortened parent keeps its line


def test_chunk_note_does_split_one_oversize_block_at_sentence_ends() -> None:
    sentences = [f"第{i}句讲库存同步。" for i in range(40)]
    text = "- 长段落\n\t- " + "".join(sentences) + "\n- 下一个\n"

    note = chunk_note(text, "f", 50)

    first, *rest, last = note.chunks
    assert (first.line_start, first.line_end, first.text.split("\n")[0]) == (1, 2, "- 长段落")
    assert rest and all((c.heading_path, c.line_start, c.line_end) == ("长段落", 2, 2) for c in rest)
    pieces = [first.text.split("\n", 1)[1].strip(), *(c.text for c in rest)]
    assert "".join(p.removeprefix("- ") for p in pieces) == "".join(sentences)  # nothing lost or repeated
    assert (last.text, last.line_start) == ("- 下一个", 3)
    assert all(estimate_tokens(c.text) <= 50 for c in note.chunks)


def test_chunk_note_does_not_treat_bullets_inside_outline_code_as_blocks() -> None:
    _, note = _sample("pages/Redis 缓存.md", 40)

    code = next(c for c in note.chunks if "redis-cli" in c.text)
    assert "- not a bullet: this line is inside the code block" in code.text and code.text.count("```") == 2
    assert (code.line_start, code.line_end, code.text.split("\n")[0]) == (6, 10, "- 常用命令")


def test_chunk_note_does_keep_property_and_bullet_lines_inside_outline_code() -> None:
    text = "- 配置示例\n\t- ```yaml\n\t  retries:: 3\n- not a block\n\t  ```\n- 下一个\n"

    note = chunk_note(text, "f", 200)

    assert note.outline and note.properties == {}
    assert [(c.line_start, c.line_end) for c in note.chunks] == [(1, 6)]
    assert "retries:: 3\n- not a block" in note.chunks[0].text


def test_chunk_note_does_read_two_space_indentation() -> None:
    _, note = _sample("pages/Reading list.md", 25)

    assert [(c.heading_path, c.line_start, c.line_end) for c in note.chunks] == [
        ("", 1, 1),
        ("Designing Data-Intensive Applications,…", 4, 4),  # a long parent, shortened; its own chunk keeps it whole
        ("", 5, 7),
    ]
    assert note.chunks[0].properties == {"author": ("Martin Kleppmann",), "status": ("reading",)}
    assert note.chunks[2].properties == {"status": ("queued",)}


def _text_lines(text: str) -> list[str]:
    return [line.strip() for line in text.split("\n") if line.strip()]


@pytest.mark.parametrize("chunk_tokens", [40, 80, 400])
@pytest.mark.parametrize("rel", SAMPLE_NOTES)
def test_chunk_note_does_give_exact_line_ranges_for_every_sample_chunk(rel: str, chunk_tokens: int) -> None:
    text, note = _sample(rel, chunk_tokens)
    lines = text.split("\n")

    assert note.outline and note.chunks
    prev_end = 0
    covered: set[int] = set()
    for c in note.chunks:
        assert prev_end < c.line_start <= c.line_end  # in order, no overlap
        prev_end = c.line_end
        span = [ln for ln in lines[c.line_start - 1 : c.line_end] if not _PROPERTY_LINE.match(ln)]
        assert _text_lines(c.text) == _text_lines("\n".join(span))  # the range holds exactly the chunk's lines
        assert c.text.split("\n")[0].strip() == lines[c.line_start - 1].strip()
        assert c.text == textwrap.dedent(c.text)
        assert estimate_tokens(c.text) <= chunk_tokens
        covered.update(range(c.line_start, c.line_end + 1))
    paths = HEADING_SEP.join(c.heading_path for c in note.chunks)
    for n, line in enumerate(lines, 1):  # every content line is in a chunk, or names its children's chunks
        if line.strip() and not _PROPERTY_LINE.match(line) and n not in covered:
            assert line.strip().lstrip("- ").split(" #")[0].replace("[[", "").replace("]]", "") in paths, (n, line)


def test_chunk_note_does_chunk_the_chinese_sample_page_by_its_blocks() -> None:
    _, note = _sample("pages/数据平台.md", 60)

    assert [(c.heading_path, c.line_start, c.line_end) for c in note.chunks] == [
        ("", 4, 4),
        ("", 5, 7),
        ("组件", 8, 9),
        ("", 10, 12),
    ]
    assert (
        note.chunks[2].text == "- Flink：作业统一跑在 Kubernetes 上。 #[[流式 计算]]\n\t- 检查点间隔 60 秒，状态后端用 RocksDB。"
    )


def test_chunk_note_does_keep_markdown_notes_chunked_by_headings() -> None:
    text = "# Plan\n\n- a\n- b\n\n## Risks\n\n- c\n"

    note = chunk_note(text, "f", 200)

    assert not note.outline and note.title == "Plan"


def test_chunk_note_is_linear_on_hostile_outlines() -> None:
    counts = run_bounded(
        "import json; from kb_chunk import chunk_note\n"
        "n = 200_000\n"
        "deep = ''.join('\\t' * i + '- x\\n' for i in range(600))\n"
        "notes = [deep, '- a\\n' + '  k:: v\\n' * (n // 8), '- a\\n' + ''.join(f'  k{i}:: v\\n' for i in range(n // 10)),\n"
        "         '- ' + ' ' * n + 'x\\n- y\\n', '- k' * (n // 3) + ':\\n- y\\n', '\\n' * n + '- a\\n- b\\n',\n"
        "         '- a\\n' * (n // 4), '- ' + 'w ' * (n // 2) + '\\n- b\\n', '- ```\\n' + '  - x\\n' * (n // 6)]\n"
        "print(json.dumps([len(chunk_note(t, 'f', 200, rel_path='pages/x.md', logseq_graph=True).chunks) for t in notes]))"
    )

    assert all(n >= 1 for n in counts)
