"""kb_links: parsing every link form, resolving targets by Obsidian's and Logseq's rules, and expanding embeds.

Over 500 lines for a reason: most tests are tables of link forms and what each resolves to.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from kb_fixtures import run_bounded

from kb_chunk import chunk_note
from kb_config import KBError
from kb_links import LinkResolver, Resolution, expand_embeds, journal_titles, parse_links

REPO_ROOT = Path(__file__).resolve().parent.parent
LOGSEQ_SAMPLE = REPO_ROOT / "examples" / "logseq_sample"


def _links(text: str) -> list[tuple]:
    """Each link as (target, heading, block, label, embed, line, kind), for compact expectations."""
    return [(k.target, k.heading, k.block, k.label, k.embed, k.line, k.kind) for k in parse_links(text)]


# ---- parse_links -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[Note]]", ("Note", None, None, None, False, 1, "wiki")),
        ("[[Note|the label]]", ("Note", None, None, "the label", False, 1, "wiki")),
        ("[[Note#Heading]]", ("Note", "Heading", None, None, False, 1, "wiki")),
        ("[[Note#Heading|label]]", ("Note", "Heading", None, "label", False, 1, "wiki")),
        ("[[Note#^block-1]]", ("Note", None, "block-1", None, False, 1, "wiki")),
        ("![[Embedded]]", ("Embedded", None, None, None, True, 1, "wiki")),
        ("![[Note#Section]]", ("Note", "Section", None, None, True, 1, "wiki")),
        ("![[Note#^abc]]", ("Note", None, "abc", None, True, 1, "wiki")),
        ("[[folder/Note.md]]", ("folder/Note.md", None, None, None, False, 1, "wiki")),
        ("[[Note#H1#H2]]", ("Note", "H1#H2", None, None, False, 1, "wiki")),
        ("[[ Note | label ]]", ("Note", None, None, "label", False, 1, "wiki")),
        ("[[Note|]]", ("Note", None, None, None, False, 1, "wiki")),
        ("[[#Heading]]", ("", "Heading", None, None, False, 1, "wiki")),
        ("[[#^blk]]", ("", None, "blk", None, False, 1, "wiki")),
        ("| [[Note\\|label]] |", ("Note", None, None, "label", False, 1, "wiki")),
        ("[[v1.2 release]]", ("v1.2 release", None, None, None, False, 1, "wiki")),
        ("[[Redis 缓存#集群|缓存]]", ("Redis 缓存", "集群", None, "缓存", False, 1, "wiki")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_parse_links_does_read_each_wiki_form(text: str, expected: tuple) -> None:
    assert _links(text) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[label](path/to/note.md)", ("path/to/note.md", None, None, "label", False, 1, "markdown")),
        ("[x](Note%20Name.md#Some%20Heading)", ("Note Name.md", "Some Heading", None, "x", False, 1, "markdown")),
        ("[x](Note.md#^blk)", ("Note.md", None, "blk", "x", False, 1, "markdown")),
        ("[x](<My Note.md>)", ("My Note.md", None, None, "x", False, 1, "markdown")),
        ('[x](Note.md "a title")', ("Note.md", None, None, "x", False, 1, "markdown")),
        ("[x](../up/Note.md)", ("../up/Note.md", None, None, "x", False, 1, "markdown")),
        ("[x](Note)", ("Note", None, None, "x", False, 1, "markdown")),
        ("[x](#local-heading)", ("", "local-heading", None, "x", False, 1, "markdown")),
        ("![](Embedded.md)", ("Embedded.md", None, None, None, True, 1, "markdown")),
        ("[读书](笔记/%E6%B5%AA%E6%BD%AE%E4%B9%8B%E5%B7%85.md)", ("笔记/浪潮之巅.md", None, None, "读书", False, 1, "markdown")),
        ("[x](notes.markdown)", ("notes.markdown", None, None, "x", False, 1, "markdown")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_parse_links_does_read_markdown_links_to_notes(text: str, expected: tuple) -> None:
    assert _links(text) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "[site](https://example.com/page.md)",
        "[site](http://example.com)",
        "[mail](mailto:me@example.com)",
        "[open](obsidian://open?vault=v&file=Note)",
        "[cdn](//cdn.example.com/x.md)",
        "![photo](attachments/cat.png)",
        "[doc](files/spec.pdf)",
        "[code](src/main.py)",
        "![[diagram.png]]",
        "[[report.pdf]]",
        "![[clip.mp4|300]]",
        "[empty]()",
        "[[]]",
        "[[|label only]]",
        "plain [brackets] and (parens)",
    ],
)
def test_parse_links_skips_urls_attachments_and_empty_links(text: str) -> None:
    assert parse_links(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "```\n[[In Fence]]\n```",
        "~~~md\n[x](In%20Fence.md)\n~~~",
        "- item\n  ```\n  [[In List Fence]]\n  ```",
        "`[[inline]]`",
        "``code with ` and [[inline]]``",
        "```unclosed\n[[Never]]\n[[Seen]]",
    ],
)
def test_parse_links_skips_links_in_fenced_and_inline_code(text: str) -> None:
    assert parse_links(text) == []


def test_parse_links_does_read_links_around_code_spans_and_after_fences() -> None:
    text = "`a` [[One]] `b` ``[[no]]`` [[Two]] ` unmatched [[Three]]\n```\n[[no]]\n```\n[[Four]]\n"

    assert [(k.target, k.line) for k in parse_links(text)] == [("One", 1), ("Two", 1), ("Three", 1), ("Four", 5)]


def test_parse_links_does_number_lines_from_one_across_frontmatter_bom_and_crlf() -> None:
    text = '\ufeff---\r\nrelated: "[[Alpha]]"\r\n---\r\nline four [[Beta]]\rline five [x](Gamma.md)\n'

    assert [(k.target, k.line) for k in parse_links(text)] == [("Alpha", 2), ("Beta", 4), ("Gamma.md", 5)]


def test_parse_links_does_return_links_in_order_of_appearance() -> None:
    text = "[md](A.md) then [[B]] then ![[C]] then [md2](D.md)"

    assert [k.target for k in parse_links(text)] == ["A.md", "B", "C", "D.md"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- see [[Kestrel Project]]", ("Kestrel Project", None, None, None, False, 1, "wiki")),
        ("- tagged #[[data quality]]", ("data quality", None, None, None, False, 1, "wiki")),
        ("- {{embed [[Roadmap]]}}", ("Roadmap", None, None, None, True, 1, "wiki")),
        ("\t- owner:: [[Alice Chen]]", ("Alice Chen", None, None, None, False, 1, "wiki")),
        ("- 负责 [[红隼项目]] 的协调", ("红隼项目", None, None, None, False, 1, "wiki")),
    ],
)
def test_parse_links_does_read_logseq_refs_and_embeds(text: str, expected: tuple) -> None:
    assert _links(text) == [expected]


def test_parse_links_skips_plain_hashtags() -> None:
    assert parse_links("- a #tag and #标签 but no page ref") == []


def test_parse_links_does_run_in_linear_time_on_hostile_200k_inputs() -> None:
    counts = run_bounded(
        "import json; from kb_links import parse_links\n"
        "n = 200_000\n"
        "texts = ['[[' * (n // 2), '[' * n, '![](' * (n // 4), '[a](' + 'b' * n, '[a](x' + ' ' * n + 'y',\n"
        "         '`' * n, '` `` ' * (n // 5) + '[[ok]]', '{{embed [[' * (n // 10), '[x](<' + 'a' * n,\n"
        "         '[[' + 'a' * n, '```\\n' * (n // 4), ('[[a]] `' * (n // 7)), '[' + 'a|' * (n // 2) + ']]']\n"
        "print(json.dumps([len(parse_links(t)) for t in texts]))"
    )

    assert counts[6] == 1 and counts[11] > 0  # the work is done, not skipped


# ---- LinkResolver ----------------------------------------------------------------------------------------------------

VAULT = [
    "Home.md",
    "projects/Alpha.md",
    "projects/alpha/Alpha.md",
    "archive/2025/Alpha.md",
    "people/张伟.md",
    "tech/Redis 缓存策略.md",
    "daily/2026-03-02.md",
    "notes.markdown",
    "a/b/Deep.md",
    "x/b/Deep.md",
]


@pytest.fixture
def resolver() -> LinkResolver:
    return LinkResolver(VAULT, {"people/张伟.md": ["Zhang Wei", "老张"], "tech/Redis 缓存策略.md": ["cache"]})


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("Home", "Home.md"),
        ("home", "Home.md"),
        ("HOME.MD", "Home.md"),
        ("Home.md", "Home.md"),
        ("张伟", "people/张伟.md"),
        ("redis 缓存策略", "tech/Redis 缓存策略.md"),
        ("2026-03-02", "daily/2026-03-02.md"),
        ("notes", "notes.markdown"),
        ("notes.markdown", "notes.markdown"),
        ("people/张伟", "people/张伟.md"),
        ("/people/张伟.md", "people/张伟.md"),
        ("PEOPLE/张伟.MD", "people/张伟.md"),
    ],
)
def test_resolve_does_match_names_case_insensitively_with_optional_md(resolver: LinkResolver, target: str, path: str) -> None:
    assert resolver.resolve(target, "Home.md") == Resolution(path)


def test_resolve_does_pick_the_shortest_path_and_flag_an_ambiguous_name(resolver: LinkResolver) -> None:
    got = resolver.resolve("Alpha", "Home.md")

    assert got == Resolution("projects/Alpha.md", ("projects/Alpha.md", "archive/2025/Alpha.md", "projects/alpha/Alpha.md"))


def test_resolve_does_prefer_the_linking_notes_folder_when_ambiguous(resolver: LinkResolver) -> None:
    got = resolver.resolve("Alpha", "archive/2025/Review.md")

    assert got.path == "archive/2025/Alpha.md" and len(got.ambiguous) == 3


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("alpha/Alpha", "projects/alpha/Alpha.md"),
        ("2025/Alpha", "archive/2025/Alpha.md"),
        ("archive/2025/Alpha.md", "archive/2025/Alpha.md"),
        ("projects/Alpha", "projects/Alpha.md"),
        ("a/b/Deep", "a/b/Deep.md"),
    ],
)
def test_resolve_does_disambiguate_with_a_partial_path(resolver: LinkResolver, target: str, path: str) -> None:
    assert resolver.resolve(target, "Home.md") == Resolution(path)


def test_resolve_does_flag_a_partial_path_that_is_still_ambiguous(resolver: LinkResolver) -> None:
    assert resolver.resolve("b/Deep", "Home.md") == Resolution("a/b/Deep.md", ("a/b/Deep.md", "x/b/Deep.md"))


@pytest.mark.parametrize(
    ("target", "from_path", "path"),
    [
        ("../people/张伟.md", "projects/Alpha.md", "people/张伟.md"),
        ("./Alpha.md", "projects/Plan.md", "projects/Alpha.md"),
        ("alpha/Alpha.md", "projects/Plan.md", "projects/alpha/Alpha.md"),
        ("../../Home.md", "archive/2025/Alpha.md", "Home.md"),
        ("2025/Alpha.md", "archive/Index.md", "archive/2025/Alpha.md"),
        ("b/Deep.md", "x/Index.md", "x/b/Deep.md"),
    ],
)
def test_resolve_does_resolve_relative_links_from_the_linking_notes_folder(
    resolver: LinkResolver, target: str, from_path: str, path: str
) -> None:
    assert resolver.resolve(target, from_path) == Resolution(path)


@pytest.mark.parametrize("target", ["../../Home.md", "../outside.md", "./Missing.md"])
def test_resolve_rejects_relative_links_that_leave_the_vault_or_miss(resolver: LinkResolver, target: str) -> None:
    assert resolver.resolve(target, "projects/Alpha.md") == Resolution(None)


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("Zhang Wei", "people/张伟.md"),
        ("zhang wei", "people/张伟.md"),
        ("老张", "people/张伟.md"),
        ("CACHE", "tech/Redis 缓存策略.md"),
    ],
)
def test_resolve_does_resolve_aliases(resolver: LinkResolver, target: str, path: str) -> None:
    assert resolver.resolve(target, "Home.md") == Resolution(path)


def test_resolve_does_prefer_a_file_name_to_an_alias_and_flag_shared_aliases() -> None:
    r = LinkResolver(
        ["Cache.md", "tech/Redis.md", "tech/Memcached.md"], {"tech/Redis.md": ["cache", "kv"], "tech/Memcached.md": ["kv"]}
    )

    assert r.resolve("cache", "x.md") == Resolution("Cache.md")
    assert r.resolve("kv", "x.md") == Resolution("tech/Redis.md", ("tech/Redis.md", "tech/Memcached.md"))


def test_resolve_skips_aliases_of_notes_it_does_not_know() -> None:
    assert LinkResolver(["a.md"], {"gone.md": ["ghost"]}).resolve("ghost", "a.md") == Resolution(None)


@pytest.mark.parametrize("target", ["Missing", "projects/Missing", "Alpha/Beta", "pic.png", "Home#"])
def test_resolve_returns_none_for_an_unresolved_target(resolver: LinkResolver, target: str) -> None:
    assert resolver.resolve(target, "Home.md").path is None


def test_resolve_does_return_the_linking_note_for_a_link_into_itself(resolver: LinkResolver) -> None:
    assert resolver.resolve("", "projects/Alpha.md") == Resolution("projects/Alpha.md")


def test_resolve_does_match_decomposed_unicode_names() -> None:
    nfd = unicodedata.normalize("NFD", "notes/Café.md")  # how macOS file systems hand names back

    assert LinkResolver([nfd]).resolve("café", "x.md") == Resolution(nfd)


@pytest.mark.parametrize(
    ("file", "target"),
    [
        ("pages/Kestrel Project___Roadmap.md", "Kestrel Project/Roadmap"),
        ("pages/Meetings%2FWeekly sync.md", "meetings/weekly sync"),
        ("pages/What%3F Why%3A.md", "What? Why:"),
        ("pages/项目___规划.md", "项目/规划"),
        ("graph/pages/Nested___Page.md", "nested/page"),
    ],
)
def test_resolve_does_map_logseq_page_names_with_file_name_escaping(file: str, target: str) -> None:
    assert LinkResolver([file, "pages/Other.md"]).resolve(target, "pages/Other.md") == Resolution(file)


@pytest.mark.parametrize("title", ["Mar 2nd, 2026", "mar 2nd, 2026", "2026-03-02", "2026/03/02", "2026_03_02", "2026年03月02日"])
def test_resolve_does_map_logseq_journal_titles(title: str) -> None:
    assert LinkResolver(["journals/2026_03_02.md", "pages/A.md"]).resolve(title, "pages/A.md") == Resolution(
        "journals/2026_03_02.md"
    )


@pytest.mark.parametrize(
    ("day", "first"),
    [
        ("2026-03-01", "Mar 1st, 2026"),
        ("2026-03-02", "Mar 2nd, 2026"),
        ("2026-03-03", "Mar 3rd, 2026"),
        ("2026-03-11", "Mar 11th, 2026"),
        ("2026-03-22", "Mar 22nd, 2026"),
        ("2026-12-13", "Dec 13th, 2026"),
    ],
)
def test_journal_titles_does_format_logseqs_default_title(day: str, first: str) -> None:
    assert journal_titles(day)[0] == first


def test_ambiguous_names_does_list_file_names_shared_by_several_notes(resolver: LinkResolver) -> None:
    assert resolver.ambiguous_names() == {
        "alpha": ("projects/Alpha.md", "archive/2025/Alpha.md", "projects/alpha/Alpha.md"),
        "deep": ("a/b/Deep.md", "x/b/Deep.md"),
    }


def _logseq_resolver() -> tuple[LinkResolver, list[str]]:
    paths = sorted(p.relative_to(LOGSEQ_SAMPLE).as_posix() for p in LOGSEQ_SAMPLE.rglob("*.md"))
    aliases = {
        p: chunk_note((LOGSEQ_SAMPLE / p).read_text("utf-8"), Path(p).stem, 200, rel_path=p, logseq_graph=True).aliases
        for p in paths
    }
    return LinkResolver(paths, aliases), paths


def test_resolver_does_resolve_every_link_of_the_logseq_sample() -> None:
    resolver, paths = _logseq_resolver()

    edges = {
        (p, k.target): resolver.resolve(k.target, p).path
        for p in paths
        for k in parse_links((LOGSEQ_SAMPLE / p).read_text("utf-8"))
    }

    assert edges[("pages/Alice Chen.md", "Kestrel")] == "pages/Kestrel Project.md"  # alias::
    assert edges[("pages/张伟.md", "红隼项目")] == "pages/Kestrel Project.md"  # Chinese alias
    assert edges[("pages/Kestrel Project.md", "Data Platform")] == "pages/数据平台.md"  # alias in a tags:: value
    assert edges[("pages/Kestrel Project.md", "Mar 2nd, 2026")] == "journals/2026_03_02.md"  # a page refers to a journal
    assert edges[("pages/Kestrel Project.md", "Kestrel Project/Roadmap")] == "pages/Kestrel Project___Roadmap.md"
    assert edges[("pages/Kestrel Project.md", "Meetings/Weekly sync")] == "pages/Meetings%2FWeekly sync.md"
    assert edges[("journals/2026_03_05.md", "Kestrel Project")] == "pages/Kestrel Project.md"
    unresolved = sorted({t for (_, t), path in edges.items() if path is None})
    assert unresolved == ["data quality", "基础设施", "流式 计算"]  # tag pages nobody wrote


# ---- expand_embeds ---------------------------------------------------------------------------------------------------

NOTES = {
    "Home.md": "---\ntitle: Home\n---\n# Home\n\n![[Plan]]\n\nSee ![[Plan#Risks]] inline.\n",
    "Plan.md": "---\ntags: [plan]\n---\n# Plan\n\nIntro.\n\n## Goals\n\nShip it.\n\n### Detail\n\nSmall.\n\n## Risks\n\nLate events.\n\n# Appendix\n\nEnd.\n",
    "A.md": "A starts\n![[B]]\nA ends",
    "B.md": "B starts\n![[C]]\nB ends",
    "C.md": "C starts\n![[A]]\nC ends",
    "Deep1.md": "one ![[Deep2]]",
    "Deep2.md": "two ![[Deep3]]",
    "Deep3.md": "three ![[Deep4]]",
    "Deep4.md": "four",
    "Blocks.md": "Para line one\npara line two ^para1\n\n- item one ^item1\n  - child of item one\n- item two\n\nTable text\n\n^alone\n",
    "中文.md": "# 数据平台\n\n## 组件\n\nKafka 集群。\n\n## 运维约定\n\n周五不上线。\n",
    "Uses中文.md": "嵌入：\n![[中文#组件]]\n",
    "Missing.md": "![[Nowhere]] and ![[Plan#No Such Heading]] and ![[Plan#^nope]]",
    "Code.md": "```\n![[Plan]]\n```\n`![[Plan]]`\n",
    "Twice.md": "![[Deep4]]\n![[Deep4]]\n![[Deep4]]\n",
    "Self.md": "# Top\n\n![[#Top]]\n",
    "Md.md": "![](Plan.md#Goals)\n",
}


def _reader(notes: dict[str, str], reads: list[str] | None = None):
    def read(path: str) -> str | None:
        if reads is not None:
            reads.append(path)
        return notes.get(path)

    return read


def _expand(path: str, **kw: int) -> str:
    return expand_embeds(path, _reader(NOTES), LinkResolver(NOTES), **kw)


def test_expand_embeds_does_replace_a_note_embed_with_its_body_without_frontmatter() -> None:
    out = _expand("Home.md")

    assert out.startswith("---\ntitle: Home\n---\n# Home\n\n# Plan\n\nIntro.")  # the note's own frontmatter stays
    assert "tags: [plan]" not in out and "\n# Appendix\n\nEnd.\n" in out


def test_expand_embeds_does_embed_a_section_up_to_the_next_heading_of_its_level() -> None:
    assert _expand("Md.md") == "## Goals\n\nShip it.\n\n### Detail\n\nSmall.\n"
    assert "See ## Risks\n\nLate events. inline." in _expand("Home.md")


def test_expand_embeds_does_embed_a_section_of_a_chinese_note() -> None:
    assert _expand("Uses中文.md") == "嵌入：\n## 组件\n\nKafka 集群。\n"


@pytest.mark.parametrize(
    ("anchor", "expected"),
    [
        ("para1", "Para line one\npara line two"),
        ("item1", "- item one\n  - child of item one"),
        ("alone", "Table text"),
    ],
)
def test_expand_embeds_does_embed_a_block(anchor: str, expected: str) -> None:
    notes = {**NOTES, "E.md": f"![[Blocks#^{anchor}]]"}

    assert expand_embeds("E.md", _reader(notes), LinkResolver(notes)) == expected


def test_expand_embeds_skips_a_cycle_with_a_marker() -> None:
    assert _expand("A.md") == "A starts\nB starts\nC starts\n(embed of A skipped: cycle)\nC ends\nB ends\nA ends"


def test_expand_embeds_skips_an_embed_of_its_own_note_as_a_cycle() -> None:
    assert _expand("Self.md") == "# Top\n\n(embed of #Top skipped: cycle)\n"


@pytest.mark.parametrize(
    ("max_depth", "expected"),
    [
        (0, "one ![[Deep2]] (embed of Deep2 skipped: deeper than 0 levels)"),
        (1, "one two ![[Deep3]] (embed of Deep3 skipped: deeper than 1 levels)"),
        (2, "one two three ![[Deep4]] (embed of Deep4 skipped: deeper than 2 levels)"),
        (3, "one two three four"),
    ],
)
def test_expand_embeds_skips_levels_past_max_depth(max_depth: int, expected: str) -> None:
    assert _expand("Deep1.md", max_depth=max_depth) == expected


def test_expand_embeds_does_keep_unresolved_embeds_and_missing_anchors_with_a_marker() -> None:
    assert _expand("Missing.md") == (
        "![[Nowhere]] (embed of Nowhere not found) and "
        "![[Plan#No Such Heading]] (embed of Plan#No Such Heading not found: no such heading or block) and "
        "![[Plan#^nope]] (embed of Plan#^nope not found: no such heading or block)"
    )


def test_expand_embeds_skips_embeds_in_code() -> None:
    assert _expand("Code.md") == NOTES["Code.md"]


def test_expand_embeds_does_read_each_note_once() -> None:
    reads: list[str] = []

    out = expand_embeds("Twice.md", _reader(NOTES, reads), LinkResolver(NOTES))

    assert out == "four\nfour\nfour\n" and reads == ["Twice.md", "Deep4.md"]


def test_expand_embeds_skips_embeds_past_the_character_budget() -> None:
    out = _expand("Twice.md", max_chars=9)

    assert out == "four\nfour\n![[Deep4]] (embed of Deep4 skipped: embeds over 9 characters)\n"


def test_expand_embeds_does_mark_a_note_that_cannot_be_read() -> None:
    notes = {"A.md": "![[B]]", "B.md": "x"}
    read = _reader({"A.md": "![[B]]"})

    assert expand_embeds("A.md", read, LinkResolver(notes)) == "![[B]] (embed of B not found: unreadable)"


def test_expand_embeds_rejects_a_note_it_cannot_read() -> None:
    with pytest.raises(KBError, match="cannot read 'gone.md'"):
        expand_embeds("gone.md", _reader(NOTES), LinkResolver(NOTES))


def test_expand_embeds_does_expand_a_logseq_embed_in_the_sample() -> None:
    resolver, _ = _logseq_resolver()

    def read(path: str) -> str | None:
        p = LOGSEQ_SAMPLE / path
        return p.read_text("utf-8") if p.is_file() else None

    out = expand_embeds("pages/Reading list.md", read, resolver)

    assert "{{embed" not in out
    assert "- - Q2\n\t- April: shadow run of the order stream" in out and "Retire the batch cluster. #milestone" in out


def test_expand_embeds_does_stay_linear_on_many_embeds_of_a_big_note() -> None:
    sizes = run_bounded(
        "import json; from kb_links import LinkResolver, expand_embeds\n"
        "notes = {'Big.md': 'x' * 200_000, 'Many.md': '![[Big]]\\n' * 10_000}\n"
        "out = expand_embeds('Many.md', notes.get, LinkResolver(notes))\n"
        "print(json.dumps([len(out), out.count('skipped: embeds over')]))"
    )

    assert sizes[1] == 10_000 - 5 and sizes[0] < 2_000_000  # five copies fit the 1,000,000-character budget
