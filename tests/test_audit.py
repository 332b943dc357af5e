"""kb_audit: one masked JSON line per tool call and auth event, rotation, tail across files, permissions, disk errors."""

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kb_fixtures import Clock

import kb_audit
from kb_audit import MAX_ARG_CHARS, MAX_PATHS, WITHHELD, AuditLog, format_record

# 2026-12-07 10:31:02.250 UTC
T0 = 1_796_639_462.25
REPO = Path(__file__).resolve().parent.parent


def fake_mask(text: str) -> str:
    return text.replace("sk-secret", "[redacted: key]")


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tool_call(log: AuditLog, i: int = 0, **over) -> None:
    kw = dict(
        transport="http",
        client_id="a1b2c3d4e5f6",
        client_name="Claude",
        tool="search",
        arguments={"query": f"q{i}"},
        ok=True,
        ms=41.26,
        paths=["notes/x.md", "notes/y.md"],
    )
    kw.update(over)
    log.record_tool(**kw)


def test_record_tool_writes_one_line_with_fields(tmp_path):
    log = AuditLog(tmp_path / "data", now=Clock(T0))
    tool_call(log)
    (rec,) = lines_of(tmp_path / "data" / "audit.jsonl")
    assert rec == {
        "ts": "2026-12-07T10:31:02.250Z",
        "kind": "tool",
        "transport": "http",
        "client_id": "a1b2c3d4e5f6",
        "client_name": "Claude",
        "tool": "search",
        "args": {"query": "q0"},
        "ok": True,
        "ms": 41.3,
        "paths": ["notes/x.md", "notes/y.md"],
        "error": None,
    }


def test_record_tool_masks_and_cuts_arguments_recursively(tmp_path):
    log = AuditLog(tmp_path, mask=fake_mask, now=Clock(T0))
    long_text = "x" * (MAX_ARG_CHARS + 50)
    args = {"query": "key sk-secret here", "filters": {"tags": ["sk-secret", 3, None]}, "text": long_text, "k": 5}
    tool_call(log, arguments=args, ok=False, error="bad sk-secret", client_name="sk-secret bot")
    raw = (tmp_path / "audit.jsonl").read_bytes()
    assert b"sk-secret" not in raw
    (rec,) = lines_of(tmp_path / "audit.jsonl")
    assert rec["args"]["query"] == "key [redacted: key] here"
    assert rec["args"]["filters"] == {"tags": ["[redacted: key]", 3, None]}
    assert rec["args"]["text"] == "x" * MAX_ARG_CHARS + "…[cut 50 chars]"
    assert rec["args"]["k"] == 5
    assert rec["error"] == "bad [redacted: key]" and rec["ok"] is False
    assert rec["client_name"] == "[redacted: key] bot"


def test_record_tool_counts_paths_past_the_cap(tmp_path):
    log = AuditLog(tmp_path, now=Clock(T0))
    tool_call(log, paths=[f"n/{i}.md" for i in range(MAX_PATHS + 7)])
    (rec,) = lines_of(tmp_path / "audit.jsonl")
    assert len(rec["paths"]) == MAX_PATHS and rec["paths_more"] == 7


@pytest.mark.parametrize(
    "key", ["passphrase", "Password", "code", "token", "access_token", "refresh_token", "client_secret", "code_verifier", "TOTP"]
)
def test_record_auth_withholds_secret_named_fields(tmp_path, key):
    log = AuditLog(tmp_path, mask=fake_mask, now=Clock(T0))
    log.record_auth("login_failure", failures=3, client_id="c1", note="saw sk-secret", **{key: "hunter2-value"})
    raw = (tmp_path / "audit.jsonl").read_bytes()
    assert b"hunter2-value" not in raw and b"sk-secret" not in raw
    (rec,) = lines_of(tmp_path / "audit.jsonl")
    assert rec == {
        "ts": "2026-12-07T10:31:02.250Z",
        "kind": "auth",
        "event": "login_failure",
        "failures": 3,
        "client_id": "c1",
        "note": "saw [redacted: key]",
        key: WITHHELD,
    }


def test_record_auth_withholds_secret_named_fields_nested(tmp_path):
    log = AuditLog(tmp_path, now=Clock(T0))
    log.record_auth("token_issued", grant={"refresh_token": "rt-value-123", "scope": "read"})
    (rec,) = lines_of(tmp_path / "audit.jsonl")
    assert rec["grant"] == {"refresh_token": WITHHELD, "scope": "read"}
    assert b"rt-value-123" not in (tmp_path / "audit.jsonl").read_bytes()


def test_record_auth_rejects_reserved_field_names(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        AuditLog(tmp_path).record_auth("login", ts="yesterday")


def test_audit_rotates_by_size_and_tail_reads_across_files(tmp_path):
    clock = Clock(T0)
    log = AuditLog(tmp_path, max_bytes=2_000, backups=2, now=clock)
    for i in range(100):
        clock.t = T0 + i
        tool_call(log, i)
    files = sorted(p.name for p in tmp_path.glob("audit.jsonl*") if not p.name.endswith(".lock"))
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    line_len = len((tmp_path / "audit.jsonl").read_bytes().splitlines()[0])
    for name in files:
        assert (tmp_path / name).stat().st_size <= 2_000 + line_len
    kept = [r for name in reversed(files) for r in lines_of(tmp_path / name)]
    assert [r["args"]["query"] for r in kept] == [f"q{i}" for i in range(100 - len(kept), 100)]  # oldest dropped, in order
    newest = log.tail(len(kept) - 1)
    assert [r["args"]["query"] for r in newest] == [f"q{i}" for i in range(100 - len(kept) + 1, 100)]
    assert [r["args"]["query"] for r in log.tail(3)] == ["q97", "q98", "q99"]


def test_audit_rotation_without_backups_starts_over(tmp_path):
    log = AuditLog(tmp_path, max_bytes=500, backups=0, now=Clock(T0))
    for i in range(20):
        tool_call(log, i)
    assert not (tmp_path / "audit.jsonl.1").exists()
    assert log.tail(100)[-1]["args"]["query"] == "q19"


def test_tail_skips_torn_line_and_next_record_survives(tmp_path):
    log = AuditLog(tmp_path, now=Clock(T0))
    tool_call(log, 1)
    with open(tmp_path / "audit.jsonl", "ab") as f:
        f.write(b'{"ts":"2026-12-07T10:3')  # a crash mid-write
    assert [r["args"]["query"] for r in log.tail()] == ["q1"]
    tool_call(log, 2)
    assert [r["args"]["query"] for r in log.tail()] == ["q1", "q2"]


def test_tail_returns_nothing_before_first_write(tmp_path):
    assert AuditLog(tmp_path / "none").tail() == []


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_audit_creates_private_folder_and_files(tmp_path):
    old = os.umask(0o022)
    try:
        log = AuditLog(tmp_path / "data" / "audit", max_bytes=300, backups=1, now=Clock(T0))
        for i in range(5):
            tool_call(log, i)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "data" / "audit").stat().st_mode) == 0o700
    for name in ("audit.jsonl", "audit.jsonl.1", "audit.jsonl.lock"):
        assert stat.S_IMODE((tmp_path / "data" / "audit" / name).stat().st_mode) == 0o600


def test_record_does_not_raise_when_folder_unwritable(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    log = AuditLog(blocker / "audit", now=Clock(T0))  # its parent is a file: works even as root
    with caplog.at_level(logging.WARNING, logger="kb_audit"):
        tool_call(log, 1)
        log.record_auth("login_failure", failures=1)
    warnings = [r for r in caplog.records if r.name == "kb_audit"]
    assert len(warnings) == 1 and "cannot write the audit log" in warnings[0].getMessage()


def test_record_warns_again_with_lost_count_when_writable(tmp_path, caplog):
    folder = tmp_path / "audit"
    folder.write_text("in the way", encoding="utf-8")
    log = AuditLog(folder, now=Clock(T0))
    with caplog.at_level(logging.WARNING, logger="kb_audit"):
        tool_call(log, 1)
        tool_call(log, 2)
        folder.unlink()
        tool_call(log, 3)
    messages = [r.getMessage() for r in caplog.records if r.name == "kb_audit"]
    assert len(messages) == 2 and "2 record(s) were lost" in messages[1]
    assert [r["args"]["query"] for r in log.tail()] == ["q3"]


def test_record_drops_line_when_mask_fails(tmp_path, caplog):
    def broken(text: str) -> str:
        raise RuntimeError("mask bug")

    log = AuditLog(tmp_path, mask=broken, now=Clock(T0))
    with caplog.at_level(logging.WARNING, logger="kb_audit"):
        tool_call(log, 1)
    assert not (tmp_path / "audit.jsonl").exists()
    assert "mask bug" in caplog.text


def test_format_record_shows_tool_record():
    rec = {
        "ts": "2026-12-07T10:31:02.250Z",
        "kind": "tool",
        "transport": "http",
        "client_id": "a1b2c3d4e5f6",
        "client_name": "Claude",
        "tool": "search",
        "args": {"query": "x"},
        "ok": True,
        "ms": 41.3,
        "paths": ["notes/x.md", "notes/y.md"],
        "error": None,
    }
    assert format_record(rec) == "2026-12-07 10:31:02Z tool search ok 41ms Claude (a1b2c3d4) -> notes/x.md, notes/y.md"
    failed = rec | {"ok": False, "error": "note not found", "paths": [f"n{i}.md" for i in range(50)], "paths_more": 5}
    assert format_record(failed) == (
        "2026-12-07 10:31:02Z tool search error 41ms Claude (a1b2c3d4): note not found -> n0.md, n1.md, n2.md (+52 more)"
    )


def test_format_record_shows_auth_record():
    rec = {"ts": "2026-12-07T10:31:02.250Z", "kind": "auth", "event": "login_failure", "failures": 3, "ip": "1.2.3.4"}
    assert format_record(rec) == "2026-12-07 10:31:02Z auth login_failure failures=3 ip=1.2.3.4"
    assert format_record(rec | {"client_name": "My phone"}).endswith('client_name="My phone"')


def test_format_record_escapes_control_characters():
    rec = {"ts": "2026-12-07T10:31:02.250Z", "kind": "tool", "tool": "read", "ok": True, "ms": 1, "client_name": "x\x1b[2Jy"}
    line = format_record(rec)
    assert "\x1b" not in line and "x\\x1b[2Jy" in line


def test_audit_threads_write_1000_parseable_lines(tmp_path):
    log = AuditLog(tmp_path, now=Clock(T0))

    def work(tag: str) -> None:
        for i in range(500):
            tool_call(log, i, client_name=tag)

    threads = [threading.Thread(target=work, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recs = lines_of(tmp_path / "audit.jsonl")
    assert len(recs) == 1000
    assert sorted(r["client_name"] for r in recs) == ["a"] * 500 + ["b"] * 500


def test_audit_processes_rotating_together_lose_no_line(tmp_path):
    code = (
        "import sys; from pathlib import Path; from kb_audit import AuditLog\n"
        "log = AuditLog(Path(sys.argv[1]), max_bytes=8_000, backups=100)\n"
        "for i in range(300):\n"
        "    log.record_auth('probe', who=sys.argv[2], i=i)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), tag], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        for tag in ("p", "q")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert (tmp_path / "audit.jsonl.1").exists()  # it did rotate
    recs = [r for p in tmp_path.glob("audit.jsonl*") if not p.name.endswith(".lock") for r in lines_of(p)]
    for tag in ("p", "q"):
        assert sorted(r["i"] for r in recs if r["who"] == tag) == list(range(300))
    assert len(AuditLog(tmp_path, backups=100).tail(1000)) == 600


def test_audit_module_imports_nothing_from_the_project():
    source = Path(kb_audit.__file__).read_text(encoding="utf-8")
    assert "import kb_" not in source and "from kb_" not in source
