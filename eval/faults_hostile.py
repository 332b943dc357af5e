"""eval/faults.py part `hostile`: hostile paths over every tool that takes one, bad tool arguments, and broken notes.

Paths: every call is refused with a tool error or accepted as the note it names; no byte changes outside the write
whitelist (the vault and a canary folder beside it are hashed before and after) and no "internal error". Broken
notes (eval/faults_broken.py): ingest exits 0 within a time proportional to the vault's size and each note is
indexed or listed as skipped with a reason; the server, its tools and the watcher keep working over them.
Over 500 lines for a reason: most of it is the cases themselves (path_cases, bad_arg_cases), one per line, with the
judge beside them; apart, a case and the rule that judges it would sit in two files.
"""

from __future__ import annotations

import json
import os
import re
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from faults_broken import (
    ABSENT_OR_SKIPPED,
    BROKEN_MAX_FILE_BYTES,
    CANARY_TOKEN,
    INDEXED,
    SKIPPED,
    vault_bytes,
    write_broken_vault,
)
from faults_common import PYTHON, START_TIMEOUT_S, Outcome, Server, changed_bytes, load_cfg, run_cli, snapshot, tail
from faults_report import PartResult, Run
from harness import write_config

# Expected outcomes: a tool error, success, either (only safety is checked), or success with no results / an error.
REFUSE, ACCEPT, ANY, EMPTY = "refuse", "accept", "any", "empty"
# The write whitelist of the path cases: files, a folder, links whose names are whitelisted, a FIFO, a loop.
WRITABLE = ["inbox.md", "journal/", "alias.md", "outlink.md", "pipe.md", "loop.md", "x.md"]
CREATABLE = ["new/"]
# Text in the canary folder beside the vault: no reply may ever contain it.
SECRET = "canarysecretzq"
# Seconds a hostile call may take (anything slower is a hang: a FIFO opened for reading blocks forever).
HOSTILE_CALL_TIMEOUT_S = 20.0
# ingest over the broken notes must finish within BASE + PER_MB x the megabytes it reads (linear in the vault).
INGEST_BASE_S, INGEST_PER_MB_S = 60.0, 20.0
# Longest the watcher may take to sync an edit (its first sync, over every broken note, included); a watcher still
# without that sync is a finding (a hang), one that exited too.
WATCHER_SYNC_TIMEOUT_S = 30.0
# The watcher's line for a sync that did work (watcher.py at INFO): "watcher: files: 1 added, 0 changed, ...".
WATCHER_SYNC_LINE = re.compile(r"watcher: files: (\d+) added, (\d+) changed")
# How much of a case's arguments a report quotes.
SHOWN_ARGS_CHARS = 160


@dataclass(frozen=True)
class Case:
    tool: str
    args: dict[str, Any]
    expect: str
    label: str


def _shown(args: dict[str, Any]) -> str:
    text = json.dumps(args, ensure_ascii=True)
    return text if len(text) <= SHOWN_ARGS_CHARS else text[:SHOWN_ARGS_CHARS] + f"... ({len(text)} chars)"


# ---- the path vault and its cases ---------------------------------------------------------------------------------


def write_path_vault(vault: Path, canary: Path) -> None:
    """A vault with whitelisted notes, a private one, links in and out, a FIFO, a loop, a folder named x.md."""
    for rel, text in {
        "inbox.md": "# Inbox\n\nfirst line\n",
        "journal/j1.md": "# Journal\n\nday one\n",
        "private/p.md": "# Private\n\nnot writable\n",
        "notes/a.md": "# Note A\n\nbackup restore hostiletoken\n",
        ".obsidian/workspace.md": "# hidden\n",
        "node_modules/pkg.md": "# ignored\n",
        "new/keep.md": "# creatable folder\n",
    }.items():
        (vault / rel).parent.mkdir(parents=True, exist_ok=True)
        (vault / rel).write_text(text, encoding="utf-8")
    canary.mkdir(parents=True, exist_ok=True)
    (canary / "secret.md").write_text(f"# canary\n\n{SECRET}\n", encoding="utf-8")
    (canary / "other.txt").write_text(SECRET, encoding="utf-8")
    links = {
        "new/dangling_in.md": "../private/created.md",
        "new/dangling_out.md": "../../canary/created_out.md",
        "new/escape.md": "../../canary/secret.md",
        "alias.md": "private/p.md",
        "outlink.md": "../canary/secret.md",
        "linkdir": "../canary",
        "inlinkdir": "private",
        "loop.md": "loop.md",
    }
    for rel, target in links.items():
        os.symlink(target, vault / rel)
    os.mkfifo(vault / "pipe.md")
    (vault / "x.md").mkdir()


def path_cases(vault: Path, canary: Path) -> list[Case]:
    """>= 80 hostile (and a few legitimate) paths over read_note, update_knowledge_base and the path_prefix filters."""
    v, c = str(vault), str(canary)
    long_name = "a" * 300 + ".md"  # 303 characters
    long_path = "d/" * 2498 + "x.md"  # 5,000 characters
    both_refused = [
        "../canary/secret.md",
        "../../etc/passwd",
        "notes/../../canary/secret.md",
        "/etc/passwd",
        f"{c}/secret.md",
        f"{v}/../canary/secret.md",
        "~/secret.md",
        "C:\\Windows\\win.ini",
        "C:/canary/secret.md",
        "..\\canary\\secret.md",
        "notes\\..\\..\\canary\\secret.md",
        "%2e%2e/canary/secret.md",
        "%2e%2e%2fcanary%2fsecret.md",
        "..%2fcanary%2fsecret.md",
        "new/escape.md",
        "new/dangling_out.md",
        "new/dangling_in.md",
        "linkdir/secret.md",
        "inlinkdir/p.md",
        "outlink.md",
        long_name,
        long_path,
        "new/" + long_name,
        "inbox.md\x00.txt",
        "inb\x00ox.md",
        ".",
        "./",
        "",
        "   ",
        "/",
        "in\nbox.md",
        "inbox.md\u202e",
        "ｉｎｂｏｘ.md",
        "\u2025/canary/secret.md",
        "..\u2215canary\u2215secret.md",
        "inbox.md\u200b",
        ".obsidian/workspace.md",
        "node_modules/pkg.md",
        ".kb-tmp-x.md",
        "notes/a.txt",
        "inbox",
        "journal/../inbox.md",
        "x.md",
        "pipe.md",
        "loop.md",
        "file:///etc/passwd",
        "\\\\server\\share\\x.md",
        "new/sub/../../private/x.md",
        "new/..%2f..%2fcanary%2fy.md",
        "new/.hidden.md",
        "INBOX.MD",
        "new/" + "é" * 130 + ".md",  # 263 bytes: over NAME_MAX
        "new/%2e%2e/%2e%2e/canary/x.md",
    ]
    cases = [Case("read_note", {"path": p}, REFUSE, "read " + p[:60]) for p in both_refused]
    cases += [
        Case("update_knowledge_base", {"path": p, "content": f"hostile append {i} hz{i}q"}, REFUSE, "append " + p[:60])
        for i, p in enumerate(both_refused)
    ]
    cases += [
        Case("read_note", {"path": f"{v}/notes/a.md"}, ACCEPT, "read absolute inside"),
        Case("read_note", {"path": "./notes/a.md"}, ACCEPT, "read ./notes/a.md"),
        Case("read_note", {"path": "alias.md"}, ANY, "read alias.md (link inside the vault)"),
        Case("read_note", {"path": "private/p.md"}, ACCEPT, "read a non-writable note"),
        Case("update_knowledge_base", {"path": f"{v}/inbox.md", "content": "abs inside ok"}, ACCEPT, "append absolute inside"),
        Case("update_knowledge_base", {"path": "./inbox.md", "content": "dot slash ok"}, ACCEPT, "append ./inbox.md"),
        Case("update_knowledge_base", {"path": f"{v}/notes/a.md", "content": "no"}, REFUSE, "append absolute, not writable"),
        Case("update_knowledge_base", {"path": "private/p.md", "content": "no"}, REFUSE, "append private/p.md"),
        Case("update_knowledge_base", {"path": "alias.md", "content": "no"}, REFUSE, "append via whitelisted link to private"),
        Case("update_knowledge_base", {"path": "journal/j1.md", "content": "journal ok"}, ACCEPT, "append journal/j1.md"),
        Case("update_knowledge_base", {"path": "journal/new.md", "content": "no"}, REFUSE, "create in writable-only folder"),
        Case("update_knowledge_base", {"path": "new/ok.md", "content": "created ok"}, ACCEPT, "create new/ok.md"),
        Case("update_knowledge_base", {"path": f"{v}/new/abs.md", "content": "abs create"}, ACCEPT, "create absolute inside"),
        Case("update_knowledge_base", {"path": "new/naïve café 名字.md", "content": "unicode"}, ACCEPT, "create unicode name"),
        Case("update_knowledge_base", {"path": "new/" + "é" * 119 + ".md", "content": "x"}, ACCEPT, "create 241-byte name"),
        Case("update_knowledge_base", {"path": unicodedata.normalize("NFD", "new/café.md"), "content": "x"}, ANY, "NFD"),
        Case("update_knowledge_base", {"path": "inbox.md\n", "content": "x"}, ANY, "inbox.md + newline"),
        Case("update_knowledge_base", {"path": "inbox.md/", "content": "x"}, ANY, "inbox.md/"),
    ]
    prefixes_out = ["..", "../canary", "/etc", c, "%2e%2e", "..\\", "notes/../..", "linkdir", "new/escape.md", "~"]
    prefixes_any = [v, "./", ".", "", "\x00", "a" * 5000, "in\nbox", "notes\\", "ｎｏｔｅｓ", "\u202e"]
    for p in prefixes_out:
        cases.append(Case("list_notes", {"path_prefix": p}, EMPTY, f"list_notes prefix {p[:40]!r}"))
        cases.append(
            Case("search_my_knowledge_base", {"query": "canary secret", "path_prefix": p}, EMPTY, f"search prefix {p[:40]!r}")
        )
    for p in prefixes_any:
        cases.append(Case("list_notes", {"path_prefix": p}, ANY, f"list_notes prefix {p[:40]!r}"))
        cases.append(Case("search_my_knowledge_base", {"query": "backup", "path_prefix": p}, ANY, f"search prefix {p[:40]!r}"))
    return cases


def bad_arg_cases() -> list[Case]:
    """Wrong types, out-of-range numbers, empty text, over-long and multi-line headings: all must be tool errors."""
    s, u, r, ln = "search_my_knowledge_base", "update_knowledge_base", "read_note", "list_notes"
    q = {"query": "backup"}
    ap = {"path": "inbox.md", "content": "bad-arg check"}
    cases = [
        (s, {"query": 123}),
        (s, {"query": None}),
        (s, {}),
        (s, {"query": ""}),
        (s, {"query": "   "}),
        (s, {"query": "x" * 10_000}),
        (s, {**q, "top_k": 0}),
        (s, {**q, "top_k": -1}),
        (s, {**q, "top_k": 51}),
        (s, {**q, "top_k": 10**12}),
        (s, {**q, "top_k": 2.5}),
        (s, {**q, "top_k": "five"}),
        (s, {**q, "mode": "fuzzy"}),
        (s, {**q, "mode": 5}),
        (s, {**q, "modified_within_days": 0}),
        (s, {**q, "modified_within_days": -1}),
        (s, {**q, "modified_within_days": 1e308}),
        (s, {**q, "modified_within_days": "inf"}),
        (s, {**q, "modified_within_days": "Infinity"}),
        (s, {**q, "modified_within_days": "NaN"}),
        (s, {**q, "modified_within_days": []}),
        (s, {**q, "path_prefix": 5}),
        (s, {**q, "tag": {"a": 1}}),
        (u, {"path": "inbox.md", "content": ""}),
        (u, {"path": "inbox.md", "content": "   \n\t"}),
        (u, {"path": "inbox.md", "content": "x" * 20_001}),
        (u, {"path": "inbox.md", "content": None}),
        (u, {"path": "inbox.md", "content": 5}),
        (u, {"path": "inbox.md"}),
        (u, {"path": "inbox.md", "content": "a\x00b"}),
        (u, {**ap, "heading": "line one\nline two", "create_heading": True}),
        (u, {**ap, "heading": "h" * 10_000, "create_heading": True}),
        (u, {**ap, "heading": "no such heading"}),
        (u, {**ap, "create_heading": "maybe"}),
        (u, {"path": 5, "content": "x"}),
        (u, {"path": None, "content": "x"}),
        (u, {"path": ["inbox.md"], "content": "x"}),
        (r, {"path": "inbox.md", "start_line": 0}),
        (r, {"path": "inbox.md", "start_line": -5}),
        (r, {"path": "inbox.md", "start_line": 10**12}),
        (r, {"path": "inbox.md", "start_line": 2.5}),
        (r, {"path": "inbox.md", "heading": "nope"}),
        (r, {"path": "inbox.md", "heading": "h" * 10_000}),
        (r, {"path": "inbox.md", "heading": "a\nb"}),
        (r, {"path": 5}),
        (r, {}),
        (ln, {"modified_within_days": 0}),
        (ln, {"modified_within_days": -1}),
        (ln, {"modified_within_days": 1e308}),
        (ln, {"modified_within_days": "inf"}),
        (ln, {"path_prefix": 5}),
        ("delete_everything", {"path": "inbox.md"}),
    ]
    out = []
    for i, (tool, args) in enumerate(cases):
        if tool == u and args.get("content") == ap["content"]:
            args = {**args, "content": f"bad-arg check {i}"}  # unique: a repeated text is de-duplicated before checks
        out.append(Case(tool, args, REFUSE, f"{tool} {_shown(args)[:70]}"))
    # A heading of 7 '#' is not a Markdown heading prefix, so it is taken as the heading's text: allowed.
    out.append(Case(u, {**ap, "content": "seven hashes", "heading": "####### seven", "create_heading": True}, ANY, "7 #"))
    out.append(Case("index_status", {"unexpected": 1}, ANY, "index_status with an unknown argument"))
    return out


# ---- running cases against a server ----------------------------------------------------------------------------


def _result_paths(o: Outcome) -> list[str]:
    data = o.data if isinstance(o.data, dict) else {}
    if o.tool == "list_notes":
        return [n.get("path", "") for n in data.get("notes", [])]
    if o.tool == "search_my_knowledge_base":
        return [h.get("path", "") for h in data.get("hits", [])]
    if o.tool == "read_note":
        return [data.get("path", "")]
    return []


def judge(case: Case, o: Outcome, vault: Path) -> str | None:
    """Why an outcome breaks the case's expectation (None when it is fine)."""
    if o.kind in ("internal", "timeout", "disconnected"):
        return f"{o.kind}: {o.text[:300]}"
    if SECRET in o.text:
        return f"the reply holds the canary's secret text: {o.text[:200]}"
    paths = _result_paths(o) if o.kind == "ok" else []
    bad = [p for p in paths if p.startswith(("/", "~")) or ".." in Path(p).parts or not (vault / p).exists()]
    if bad:
        return f"the reply names paths outside the vault's notes: {bad[:3]}"
    if case.expect == REFUSE and o.kind == "ok":
        return f"accepted: {o.text[:200]}"
    if case.expect == ACCEPT and o.kind != "ok":
        return f"refused: {o.text[:300]}"
    if case.expect == EMPTY and o.kind == "ok" and paths:
        return f"{len(paths)} results for a prefix outside the vault, e.g. {paths[:3]}"
    return None


async def run_cases(
    run: Run, res: PartResult, config: Path, workdir: Path, cases: list[Case], vault: Path, group: str
) -> dict[str, int]:
    """Each case once, in order, against one server (a fresh one after a crash); returns outcome counts."""
    counts: dict[str, int] = {}
    i = 0
    restarts = 0
    while i < len(cases):
        async with Server(run.procs, config, workdir, f"{group}-{restarts}") as s:
            first = await s.call("index_status", timeout_s=START_TIMEOUT_S)
            if first.kind != "ok":
                res.fail(f"{group}: server start", "index_status ok", f"{first.kind}: {first.text[:300]}")
                return counts
            while i < len(cases):
                case = cases[i]
                i += 1
                o = await s.call(case.tool, case.args, HOSTILE_CALL_TIMEOUT_S)
                counts[o.kind] = counts.get(o.kind, 0) + 1
                why = judge(case, o, vault)
                if why:
                    res.fail(f"{group}: {case.label}", case.expect, why, f"{case.tool} {_shown(case.args)} (config {config})")
                if o.kind in ("timeout", "disconnected"):
                    restarts += 1
                    break  # the server is stuck or gone: the next cases get a fresh one
    counts["server_restarts"] = restarts
    return counts


def _outside_whitelist(rel: str, vault_prefix: str) -> bool:
    """Is this snapshot path (relative to the part's folder) outside the write whitelist?"""
    from kb_scan import path_allowed

    if not rel.startswith(vault_prefix):
        return True
    return not path_allowed(rel[len(vault_prefix) :], (*WRITABLE, *CREATABLE))


async def _paths_and_args(run: Run, res: PartResult, base: Path) -> None:
    vault, canary = base / "vault", base / "canary"
    write_path_vault(vault, canary)
    config = write_config(
        base / "config.yaml", vault, base / "data", run.model, write={"writable": WRITABLE, "creatable": CREATABLE}
    )
    watched = {"vault": vault, "canary": canary}
    before = {name: snapshot(p) for name, p in watched.items()}
    cases = path_cases(vault, canary)
    counts = await run_cases(run, res, config, base, cases, vault, "paths")
    after = {name: snapshot(p) for name, p in watched.items()}
    outside: dict[str, int] = {}
    for name in watched:
        for rel, n in changed_bytes(before[name], after[name]).items():
            if name != "vault" or _outside_whitelist(rel, ""):
                outside[f"{name}/{rel}"] = n
    res.figures["hostile_paths"] = len(cases)
    res.figures["hostile_path_outcomes"] = counts
    res.figures["bytes_changed_outside_whitelist"] = sum(outside.values())
    if outside:
        res.fail("hostile paths", "0 bytes changed outside the whitelist", f"changed: {dict(list(outside.items())[:5])}")
        res.findings[-1].count = len(outside)
    bad_args = bad_arg_cases()
    res.figures["bad_arguments"] = len(bad_args)
    res.figures["bad_argument_outcomes"] = await run_cases(run, res, config, base, bad_args, vault, "args")


# ---- broken notes ---------------------------------------------------------------------------------------------


def _state_entry(files: dict[str, Any], skipped_listed: dict[str, str], tag: str) -> tuple[str, str]:
    """(indexed | skipped | absent, reason) of the class `tag` in state.json's files and the scan's skipped list."""
    for key, rec in files.items():
        if key.startswith(tag + "-") and "/" not in key:  # every class sits at the vault's root
            return ("skipped", rec.get("skipped", "")) if rec.get("skipped") else ("indexed", "")
    for key, reason in skipped_listed.items():
        if key.startswith(tag + "-") and "/" not in key:
            return "skipped", reason
    return "absent", ""


async def _broken_server_checks(run: Run, res: PartResult, base: Path, config: Path, vault: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    async with Server(run.procs, config, base, "broken") as s:
        status = await s.call("index_status", timeout_s=START_TIMEOUT_S)
        figures["index_status"] = status.kind
        listed = dict((status.data or {}).get("skipped_files", {})) if status.kind == "ok" else {}
        if status.kind != "ok":
            res.fail("broken notes: index_status", "ok", f"{status.kind}: {status.text[:300]}")
        for tool, args in (
            ("list_notes", {}),
            ("search_my_knowledge_base", {"query": "backup restore"}),
            ("search_my_knowledge_base", {"query": CANARY_TOKEN, "mode": "keyword"}),
        ):
            o = await s.call(tool, args, HOSTILE_CALL_TIMEOUT_S)
            hits = (o.data or {}).get("hits", []) if o.kind == "ok" else []
            if o.kind != "ok":
                res.fail(f"broken notes: {tool} {_shown(args)}", "ok", f"{o.kind}: {o.text[:300]}")
            elif any(CANARY_TOKEN in h.get("snippet", "") for h in hits):
                res.fail("broken notes: link out of the vault", "its target never indexed", f"search finds it: {hits[:1]}")
        reads = {"ok": 0, "error": 0}
        for p in sorted(vault.iterdir()):
            if not p.name.endswith(".md") or p.name.startswith(".") or not _utf8(p.name):
                continue  # a name that is not UTF-8 cannot travel in JSON: no client can ask for it
            o = await s.call("read_note", {"path": os.fsdecode(p.name)}, HOSTILE_CALL_TIMEOUT_S)
            if o.kind not in ("ok", "error"):
                res.fail(f"broken notes: read_note {p.name[:60]!r}", "ok or a tool error", f"{o.kind}: {o.text[:300]}")
                if o.kind in ("timeout", "disconnected"):
                    break
                continue
            reads[o.kind] += 1
            if p.name.startswith("b01-") and o.kind == "ok" and "Crème" not in o.text:
                res.fail("broken notes: read_note of the cp1252 note", "the text 'Crème', or a tool error", o.text[:200])
            if p.name.startswith("b17-") and o.kind == "ok":
                await _check_cr_lines(s, res, o)
        figures["read_note"] = reads
    return {**figures, "listed_skipped": listed}


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _check_cr_lines(s: Server, res: PartResult, read: Outcome) -> None:
    """Search's line numbers for the CR-only note must exist in what read_note shows."""
    o = await s.call("search_my_knowledge_base", {"query": "crtoken", "mode": "keyword"}, HOSTILE_CALL_TIMEOUT_S)
    hits = [h for h in (o.data or {}).get("hits", []) if h.get("path", "").startswith("b17-")] if o.kind == "ok" else []
    total = (read.data or {}).get("total_lines", 0)
    for h in hits:
        if h.get("line_end", 0) > total:
            res.fail(
                "broken notes: CR-only line numbers",
                f"search cites lines within read_note's {total}",
                f"search cites lines {h.get('line_start')}-{h.get('line_end')}",
            )


def _broken(run: Run, res: PartResult, base: Path) -> None:
    vault, canary = base / "vault", base / "canary"
    written = write_broken_vault(vault, canary, run.quick)
    config = write_config(base / "config.yaml", vault, base / "data", run.model, max_file_bytes=BROKEN_MAX_FILE_BYTES)
    size_mb = vault_bytes(vault, BROKEN_MAX_FILE_BYTES) / 1e6
    bound_s = INGEST_BASE_S + INGEST_PER_MB_S * size_mb
    repro = f"{PYTHON} ingest.py --config {config} (vault by eval/faults_broken.py write_broken_vault)"
    rc, out, secs = run_cli(run.procs, ["ingest.py", "--config", str(config), "--json"], bound_s, base / "ingest.err")
    rc2, _, nochange_s = run_cli(run.procs, ["ingest.py", "--config", str(config), "-q"], bound_s, base / "ingest.err")
    res.figures["broken_classes"] = len(written)
    res.figures["broken_vault_mb"] = round(size_mb, 2)
    res.figures["broken_ingest"] = {
        "exit": rc,
        "seconds": round(secs, 2),
        "bound_s": round(bound_s),
        "no_change_s": round(nochange_s, 2),
    }
    if rc != 0:
        res.fail(
            "broken notes: ingest",
            f"exit 0 within {bound_s:.0f} s",
            f"exit {rc} after {secs:.0f} s: {tail(base / 'ingest.err')}",
            repro,
        )
    if rc2 != 0:
        res.fail("broken notes: second (no-change) ingest", "exit 0", f"exit {rc2}: {tail(base / 'ingest.err')}", repro)
    cfg = load_cfg(config)
    try:
        files = json.loads((cfg.index_dir / "state.json").read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError) as e:
        files = {}
        res.fail("broken notes: state.json", "readable", str(e), repro)
    server = anyio.run(_broken_server_checks, run, res, base, config, vault)
    listed = server.pop("listed_skipped")
    res.figures["broken_server"] = server
    outcome: dict[str, str] = {}
    for note in written:
        got, reason = _state_entry(files, listed, note.tag)
        outcome[note.name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:40]] = got
        want = {INDEXED: ("indexed",), SKIPPED: ("skipped",), ABSENT_OR_SKIPPED: ("absent", "skipped")}.get(
            note.expect, ("indexed", "skipped")
        )
        if got not in want:
            res.fail(
                f"broken note {note.tag} ({note.name[:40]!r})", note.expect, f"{got}{': ' + reason if reason else ''}", repro
            )
        elif got == "skipped" and not reason.strip():
            res.fail(f"broken note {note.tag}", "skipped with a reason", "skipped without a reason", repro)
        elif got == "skipped" and note.reason_has and note.reason_has.lower() not in reason.lower():
            res.fail(f"broken note {note.tag} ({note.name[:40]!r})", f"a reason that says {note.reason_has}", reason, repro)
        elif got == "skipped" and not any(k.startswith(note.tag + "-") and "/" not in k for k in listed):
            res.fail(f"broken note {note.tag} ({note.name[:40]!r})", "listed by index_status", "skipped but not listed", repro)
    res.figures["broken_outcomes"] = outcome
    _watcher_survives(run, res, base, config, vault)


def _watcher_syncs(log: Path) -> int:
    """How many syncs that added or changed a note the watcher logged so far."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return 0
    return sum(1 for m in WATCHER_SYNC_LINE.finditer(text) if int(m[1]) + int(m[2]) > 0)


def _edit_and_wait_for_sync(p: Any, log: Path, note: Path, text: str) -> bool:
    """Save `note`, then wait until the watcher logged one more sync that added or changed a note; False when it
    exited or WATCHER_SYNC_TIMEOUT_S passed first."""
    before = _watcher_syncs(log)
    note.write_text(text, encoding="utf-8")
    deadline = time.monotonic() + WATCHER_SYNC_TIMEOUT_S
    while time.monotonic() < deadline and p.poll() is None:
        if _watcher_syncs(log) > before:
            return True
        time.sleep(0.1)
    return False


def _watcher_survives(run: Run, res: PartResult, base: Path, config: Path, vault: Path) -> None:
    """watcher.py over the broken notes stays up and syncs two edits: the first comes in by its first full sync (over
    every broken note) or by a file event, the second by a file event after that sync."""
    log = base / "watcher.log"
    p = run.procs.popen([PYTHON, "watcher.py", "--config", str(config), "--debounce", "0.3"], log=log)
    synced = 0
    for word in ("okaytoken", "okaytokenagain"):
        if not _edit_and_wait_for_sync(p, log, vault / "ok.md", f"# A normal note\n\nbackup restore {word} edited\n"):
            break
        synced += 1
    alive = p.poll() is None
    res.figures["watcher_alive_over_broken_notes"] = alive
    res.figures["watcher_edits_synced"] = synced
    if not alive or synced < 2:
        res.fail(
            "broken notes: watcher.py",
            "keeps running and syncs each of 2 edits",
            f"exited {p.returncode}: {tail(log)}" if not alive else f"{synced} synced (waited {WATCHER_SYNC_TIMEOUT_S:g} s)",
            f"{PYTHON} watcher.py --config {config}",
        )
    run.procs.kill(p.pid)
    p.wait()


def run_hostile(run: Run) -> PartResult:
    res = PartResult("hostile")
    anyio.run(_paths_and_args, run, res, run.folder("hostile-paths"))
    run.say(f"hostile: paths and arguments done ({res.inconsistencies} inconsistencies so far); broken notes next")
    _broken(run, res, run.folder("hostile-notes"))
    res.figures["internal_errors"] = sum(1 for f in res.findings if f.got.startswith("internal"))
    return res
