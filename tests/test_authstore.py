"""kb_authstore: owner login (scrypt + TOTP, lockout), clients, one-use codes, rotating refresh tokens, the file on disk."""

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kb_fixtures import Clock

import kb_authstore
from kb_authstore import (
    AuthError,
    AuthStore,
    AuthStoreCorruptError,
    RedirectUriError,
    RegistrationRefusedError,
    check_redirect_uri,
    totp_code,
)

PASSPHRASE = "correct horse battery staple"
# A fixed start, mid-way through a TOTP step.
T0 = 1_700_000_010.0

pytestmark = pytest.mark.usefixtures("cheap_scrypt")


@pytest.fixture
def clock():
    return Clock(T0)


@pytest.fixture
def events():
    return []


@pytest.fixture
def store(tmp_path, clock, events):
    s = AuthStore(tmp_path / "auth", now=clock, on_event=lambda name, detail: events.append((name, detail)))
    s.secret = s.set_owner(PASSPHRASE).secret_b32
    return s


def _client(store, client_id="c1", name="Claude"):
    return store.register_client({"client_id": client_id, "client_name": name, "redirect_uris": ["https://claude.ai/cb"]})


def _code(store, client_id="c1"):
    return store.create_code(client_id, ["notes"], "challenge", "https://claude.ai/cb", True, "https://vault.example/mcp")


def _files_text(folder):
    return "".join(p.read_text(encoding="utf-8", errors="replace") for p in folder.iterdir() if p.is_file())


# --- owner and login ---


def test_totp_code_matches_the_rfc6238_vector():
    secret = kb_authstore.base64.b32encode(b"12345678901234567890").decode()
    assert totp_code(secret, 59, digits=8) == "94287082"
    assert totp_code(secret, 59) == "287082"


def test_set_owner_rejects_a_short_passphrase(tmp_path):
    with pytest.raises(AuthError, match="12 characters"):
        AuthStore(tmp_path / "auth").set_owner("short pass")


def test_set_owner_rejects_a_second_init_without_reset(store):
    with pytest.raises(AuthError, match="--reset"):
        store.set_owner("another long passphrase")


def test_set_owner_stores_the_real_scrypt_cost_and_returns_an_otpauth_url(tmp_path, monkeypatch):
    monkeypatch.setattr(kb_authstore, "SCRYPT_N", 2**15)
    s = AuthStore(tmp_path / "auth")
    setup = s.set_owner(PASSPHRASE, label="my notes")
    owner = json.loads(s.path.read_text(encoding="utf-8"))["owner"]
    assert (
        owner["scrypt"] == [2**15, 8, 1] and len(bytes.fromhex(owner["salt"])) == 16 and len(bytes.fromhex(owner["hash"])) == 32
    )
    assert len(kb_authstore._b32decode(setup.secret_b32)) == 20
    assert setup.url == (
        f"otpauth://totp/second-brain-mcp:my%20notes?secret={setup.secret_b32}"
        "&issuer=second-brain-mcp&algorithm=SHA1&digits=6&period=30"
    )
    assert s.is_initialised()


def test_set_owner_reset_revokes_every_grant(store, clock):
    _client(store)
    pair = store.issue_tokens("c1", ["notes"], None)
    code = _code(store)
    setup = store.set_owner("a brand new passphrase", reset=True)
    assert store.load_access(pair.access_token) is None and store.load_refresh(pair.refresh_token) is None
    assert store.load_code(code) is None and store.list_clients() == []
    assert not store.check_login(PASSPHRASE, totp_code(setup.secret_b32, clock.t)).ok
    clock.advance(30)
    assert store.check_login("a brand new passphrase", totp_code(setup.secret_b32, clock.t)).ok


def test_check_login_accepts_the_right_passphrase_and_code(store, clock, events):
    result = store.check_login(PASSPHRASE, totp_code(store.secret, clock.t))
    assert result == kb_authstore.LoginResult(True)
    assert ("login", {}) in events


@pytest.mark.parametrize("wrong", ["passphrase", "code", "both"])
def test_check_login_gives_one_generic_failure_whichever_part_is_wrong(store, clock, wrong):
    passphrase = "not the passphrase" if wrong in ("passphrase", "both") else PASSPHRASE
    code = totp_code(store.secret, clock.t)
    if wrong in ("code", "both"):
        code = f"{(int(code) + 1) % 10**6:06d}"
    assert store.check_login(passphrase, code) == kb_authstore.LoginResult(False, False, 0)


def test_check_login_rejects_a_code_used_before(store, clock):
    code = totp_code(store.secret, clock.t)
    assert store.check_login(PASSPHRASE, code).ok
    assert not store.check_login(PASSPHRASE, code).ok
    clock.advance(30)  # the previous step's code is within the drift window, but it was used
    assert not store.check_login(PASSPHRASE, code).ok
    assert store.check_login(PASSPHRASE, totp_code(store.secret, clock.t)).ok


@pytest.mark.parametrize(("offset_steps", "accepted"), [(-2, False), (-1, True), (0, True), (1, True), (2, False)])
def test_check_login_accepts_codes_one_step_either_side_only(store, clock, offset_steps, accepted):
    code = totp_code(store.secret, clock.t + offset_steps * 30)
    assert store.check_login(PASSPHRASE, code).ok is accepted


def test_check_login_rejects_malformed_codes_without_raising(store):
    for code in ("", "12345", "1234567", "abcdef", "١٢٣٤٥٦"):
        assert not store.check_login(PASSPHRASE, code).ok


def test_check_login_locks_after_five_failures_for_fifteen_minutes(store, clock, events):
    for attempt in range(1, 6):
        result = store.check_login("wrong passphrase!", "000000")
        assert result.locked is (attempt == 5)
    assert result.retry_after_s == 900
    assert ("login_locked", {"seconds": 900}) in events
    clock.advance(600)
    refused = store.check_login(PASSPHRASE, totp_code(store.secret, clock.t))
    assert refused == kb_authstore.LoginResult(False, True, 300)
    clock.advance(300)
    assert store.check_login(PASSPHRASE, totp_code(store.secret, clock.t)).ok


def test_check_login_forgets_failures_older_than_the_window(store, clock):
    for _ in range(4):
        store.check_login("wrong passphrase!", "000000")
    clock.advance(15 * 60 + 1)
    assert not store.check_login("wrong passphrase!", "000000").locked


def test_check_login_lock_survives_a_new_store_on_the_same_folder(store, clock):
    for _ in range(5):
        store.check_login("wrong passphrase!", "000000")
    reopened = AuthStore(store.folder, now=clock)
    result = reopened.check_login(PASSPHRASE, totp_code(store.secret, clock.t))
    assert result.locked and result.retry_after_s == 900


def test_check_login_success_clears_earlier_failures(store, clock):
    for _ in range(4):
        store.check_login("wrong passphrase!", "000000")
    assert store.check_login(PASSPHRASE, totp_code(store.secret, clock.t)).ok
    for _ in range(4):
        assert not store.check_login("wrong passphrase!", "000000").locked


def test_check_login_refuses_when_parallel_attempts_locked_it_during_the_hash(store, clock, monkeypatch):
    """Attempts racing each other all pass the first lock check; the verdict checks again, so racing does not get
    more than five tries."""
    real_scrypt, racing = kb_authstore._scrypt, []

    def scrypt_while_others_fail(*args):
        if not racing:
            racing.append(True)
            for _ in range(5):
                AuthStore(store.folder, now=clock).check_login("wrong passphrase!", "000000")
        return real_scrypt(*args)

    monkeypatch.setattr(kb_authstore, "_scrypt", scrypt_while_others_fail)
    result = store.check_login(PASSPHRASE, totp_code(store.secret, clock.t))
    assert result.locked and not result.ok


def test_check_login_rejects_before_init(tmp_path):
    with pytest.raises(AuthError, match="auth init"):
        AuthStore(tmp_path / "auth").check_login(PASSPHRASE, "123456")


# --- clients and redirect URIs ---


@pytest.mark.parametrize(
    "uri", ["https://claude.ai/api/mcp/auth_callback", "http://127.0.0.1:3000/cb", "http://localhost/cb", "http://[::1]:8080/cb"]
)
def test_check_redirect_uri_accepts_https_and_loopback_http(uri):
    check_redirect_uri(uri)


@pytest.mark.parametrize(
    "uri",
    [
        "http://example.com/cb",
        "javascript:alert(1)",
        "https://claude.ai/cb#frag",
        "http://localhost.evil.example/cb",
        "http://127.0.0.1@evil.example/cb",
        "ftp://claude.ai/cb",
        "https:///nohost",
        "custom-app:/cb",
    ],
)
def test_check_redirect_uri_rejects_everything_else(uri):
    with pytest.raises(RedirectUriError, match="redirect URI"):
        check_redirect_uri(uri)


def test_register_client_stores_and_returns_the_registration(store, events):
    stored = _client(store)
    assert (
        stored
        == store.get_client("c1")
        == {"client_id": "c1", "client_name": "Claude", "redirect_uris": ["https://claude.ai/cb"]}
    )
    assert store.get_client("nobody") is None
    assert ("registration", {"client_id": "c1", "client_name": "Claude"}) in events


def test_register_client_rejects_a_bad_redirect_uri_a_duplicate_and_a_huge_registration(store):
    with pytest.raises(RedirectUriError):
        store.register_client({"client_id": "x", "redirect_uris": ["http://example.com/cb"]})
    _client(store)
    with pytest.raises(RegistrationRefusedError, match="already registered"):
        _client(store)
    with pytest.raises(RegistrationRefusedError, match="characters"):
        store.register_client({"client_id": "big", "redirect_uris": ["https://a.example/cb"], "client_name": "x" * 20_000})
    assert [c.client_id for c in store.list_clients()] == ["c1"]


def test_register_client_rejects_the_101st(store):
    for i in range(100):
        _client(store, f"c{i}")
    with pytest.raises(RegistrationRefusedError, match="100 registered clients"):
        _client(store, "one-too-many")
    assert len(store.list_clients()) == 100


def test_purge_drops_registrations_that_never_got_a_token_after_a_day(store, clock):
    _client(store, "idle")
    _client(store, "used")
    store.issue_tokens("used", ["notes"], None)
    clock.advance(24 * 3600 + 1)
    assert store.purge() >= 1
    assert store.get_client("idle") is None and store.get_client("used") is not None


def test_list_clients_shows_granted_scopes_and_last_use(store, clock):
    _client(store)
    store.issue_tokens("c1", ["notes", "write"], None)
    (summary,) = store.list_clients()
    assert (summary.client_id, summary.client_name, summary.scopes) == ("c1", "Claude", ["notes", "write"])
    assert summary.created_at == summary.last_used_at == int(T0)


def test_touch_client_rewrites_the_file_at_most_once_a_minute(store, clock):
    _client(store)
    store.touch_client("c1")
    before = store.path.stat().st_mtime_ns, store.path.read_text(encoding="utf-8")
    clock.advance(59)
    store.touch_client("c1")
    assert (store.path.stat().st_mtime_ns, store.path.read_text(encoding="utf-8")) == before
    clock.advance(1)
    store.touch_client("c1")
    assert store.list_clients()[0].last_used_at == int(T0) + 60
    store.touch_client("unknown")  # a no-op, not an error


def test_revoke_client_removes_its_codes_and_tokens_only(store, events):
    _client(store, "a")
    _client(store, "b")
    code_a, pair_a, pair_b = _code(store, "a"), store.issue_tokens("a", ["notes"], None), store.issue_tokens("b", ["notes"], None)
    assert store.revoke_client("a") is True
    assert store.revoke_client("a") is False
    assert store.load_code(code_a) is None and store.load_access(pair_a.access_token) is None
    assert store.load_refresh(pair_a.refresh_token) is None
    assert store.load_access(pair_b.access_token) is not None
    assert ("revocation", {"client_id": "a"}) in events
    with pytest.raises(AuthError, match="not registered"):
        store.issue_tokens("a", ["notes"], None)


def test_revoke_all_removes_every_client_and_token(store):
    _client(store, "a")
    _client(store, "b")
    pair = store.issue_tokens("b", ["notes"], None)
    assert store.revoke_all() == 2
    assert store.list_clients() == [] and store.load_access(pair.access_token) is None


# --- authorization codes ---


def test_consume_code_returns_the_grant_once(store):
    _client(store)
    code = _code(store)
    loaded = store.load_code(code)
    assert loaded is not None and loaded.client_id == "c1" and loaded.scopes == ["notes"]
    assert loaded.code_challenge == "challenge" and loaded.redirect_uri == "https://claude.ai/cb"
    assert loaded.resource == "https://vault.example/mcp" and loaded.redirect_uri_provided_explicitly
    assert store.consume_code(code) == loaded
    assert store.consume_code(code) is None
    assert store.load_code("not-a-code") is None


def test_create_code_records_the_consent_without_the_code(store, events):
    _client(store)
    code = _code(store)
    assert events[-1] == ("consent", {"client_id": "c1", "client_name": "Claude", "scopes": ["notes"]})
    assert code not in repr(events)


def test_deny_consent_records_the_denial_and_stores_nothing(store, events):
    _client(store)
    before = store.path.read_bytes()
    store.deny_consent("c1")
    store.deny_consent("gone")  # a client revoked while the owner read the page: still recorded
    assert events[-2:] == [
        ("consent_denied", {"client_id": "c1", "client_name": "Claude"}),
        ("consent_denied", {"client_id": "gone", "client_name": None}),
    ]
    assert store.path.read_bytes() == before


def test_load_code_expires_after_five_minutes(store, clock):
    _client(store)
    code = _code(store)
    clock.advance(299)
    assert store.load_code(code) is not None
    clock.advance(1)
    assert store.load_code(code) is None and store.consume_code(code) is None


@pytest.mark.parametrize("replay", ["consume_code", "load_code"])
def test_code_replay_revokes_the_tokens_issued_from_it(store, events, replay):
    _client(store)
    code = _code(store)
    grant = store.consume_code(code)
    pair = store.issue_tokens(grant.client_id, grant.scopes, grant.resource, family=grant.family)
    other = store.issue_tokens("c1", ["notes"], None)  # another grant of the same client stays
    assert getattr(store, replay)(code) is None
    assert store.load_access(pair.access_token) is None and store.load_refresh(pair.refresh_token) is None
    assert store.load_access(other.access_token) is not None
    assert ("code_replay", {"client_id": "c1"}) in events
    with pytest.raises(AuthError, match="revoked"):  # an exchange racing the replay cannot issue into the family
        store.issue_tokens("c1", ["notes"], None, family=grant.family)


# --- tokens ---


def test_load_access_expires_after_one_hour(store, clock):
    _client(store)
    pair = store.issue_tokens("c1", ["notes"], "https://vault.example/mcp")
    rec = store.load_access(pair.access_token)
    assert (rec.kind, rec.client_id, rec.scopes, rec.resource, rec.expires_at) == (
        "access",
        "c1",
        ["notes"],
        "https://vault.example/mcp",
        int(T0) + 3600,
    )
    assert pair.expires_in_s == 3600 and store.load_access(pair.refresh_token) is None  # kinds do not mix
    clock.advance(3599)
    assert store.load_access(pair.access_token) is not None
    clock.advance(1)
    assert store.load_access(pair.access_token) is None
    assert store.load_refresh(pair.refresh_token).expires_at == int(T0) + 30 * 24 * 3600


def test_rotate_refresh_issues_a_new_pair_in_the_same_family(store, clock):
    _client(store)
    first = store.issue_tokens("c1", ["notes", "write"], None)
    clock.advance(10)
    second = store.rotate_refresh(first.refresh_token)
    assert second.family == first.family and second.refresh_token != first.refresh_token
    assert store.load_refresh(second.refresh_token).scopes == ["notes", "write"]
    narrowed = store.rotate_refresh(second.refresh_token, scopes=["notes"])
    assert store.load_access(narrowed.access_token).scopes == ["notes"]
    assert store.load_refresh(narrowed.refresh_token).scopes == ["notes", "write"]
    with pytest.raises(AuthError, match="not granted"):
        store.rotate_refresh(narrowed.refresh_token, scopes=["admin"])


def test_rotate_refresh_reuse_revokes_the_whole_family(store, events):
    _client(store)
    first = store.issue_tokens("c1", ["notes"], None)
    second = store.rotate_refresh(first.refresh_token)
    third = store.rotate_refresh(second.refresh_token)
    unrelated = store.issue_tokens("c1", ["notes"], None)
    assert store.rotate_refresh(first.refresh_token) is None  # a thief replays the old refresh token
    for pair in (first, second, third):
        assert store.load_access(pair.access_token) is None and store.load_refresh(pair.refresh_token) is None
    assert store.rotate_refresh(third.refresh_token) is None
    assert store.load_access(unrelated.access_token) is not None
    assert ("refresh_reuse", {"client_id": "c1"}) in events


def test_load_refresh_of_a_used_token_revokes_the_family(store):
    _client(store)
    first = store.issue_tokens("c1", ["notes"], None)
    second = store.rotate_refresh(first.refresh_token)
    assert store.load_refresh(first.refresh_token) is None
    assert store.load_access(second.access_token) is None


def test_revoke_token_revokes_its_family_from_either_kind(store):
    _client(store)
    a, b = store.issue_tokens("c1", ["notes"], None), store.issue_tokens("c1", ["notes"], None)
    assert store.revoke_token(a.access_token) is True
    assert store.load_refresh(a.refresh_token) is None and store.load_access(b.access_token) is not None
    assert store.revoke_token(b.refresh_token) is True and store.load_access(b.access_token) is None
    assert store.revoke_token("unknown") is False


def test_purge_drops_expired_codes_and_tokens(store, clock):
    _client(store)
    _code(store)
    store.issue_tokens("c1", ["notes"], None)
    clock.advance(30 * 24 * 3600)
    assert store.purge() == 3
    data = json.loads(store.path.read_text(encoding="utf-8"))
    assert data["codes"] == {} and data["tokens"] == {}


# --- the files ---


def test_store_keeps_only_hashes_of_codes_tokens_and_the_passphrase(store, clock, events):
    _client(store)
    code = _code(store)
    grant = store.consume_code(code)
    pair = store.issue_tokens("c1", grant.scopes, grant.resource, family=grant.family)
    rotated = store.rotate_refresh(pair.refresh_token)
    store.check_login(PASSPHRASE, totp_code(store.secret, clock.t))
    store.check_login("wrong passphrase!", "000000")
    text = _files_text(store.folder)
    for secret in (code, pair.access_token, pair.refresh_token, rotated.access_token, rotated.refresh_token, PASSPHRASE):
        assert secret not in text
        assert secret not in repr(events)
    assert kb_authstore._digest(pair.access_token) in text


def test_store_creates_folder_0700_and_file_0600(tmp_path):
    folder = tmp_path / "auth"
    folder.mkdir(mode=0o755)
    s = AuthStore(folder)
    s.set_owner(PASSPHRASE)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for p in folder.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name


@pytest.mark.parametrize(
    "content", ["{not json", '{"format": "something-else"}', '{"format": "second-brain-auth-1"}', "\xff\xfe", "[]"]
)
def test_store_rejects_a_corrupt_file_and_reset_starts_over(store, content):
    _client(store)
    store.path.write_text(content, encoding="latin-1")
    with pytest.raises(AuthStoreCorruptError, match=r"auth\.json.*auth init --reset"):
        AuthStore(store.folder).is_initialised()
    with pytest.raises(AuthStoreCorruptError):
        store.load_access("anything")
    with pytest.raises(AuthStoreCorruptError):
        store.set_owner(PASSPHRASE)
    store.set_owner("a fresh passphrase here", reset=True)
    assert store.is_initialised() and store.list_clients() == []


def test_store_rejects_a_file_with_a_malformed_entry(store):
    _client(store)
    data = json.loads(store.path.read_text(encoding="utf-8"))
    del data["clients"]["c1"]["created_at"]
    store.path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(AuthStoreCorruptError, match="'clients'"):
        store.list_clients()


def test_store_sees_changes_another_store_made_to_the_folder(store, clock):
    other = AuthStore(store.folder, now=clock)
    _client(other, "from-other")
    pair = store.issue_tokens("from-other", ["notes"], None)
    assert other.load_access(pair.access_token) is not None
    assert other.revoke_client("from-other")
    assert store.load_access(pair.access_token) is None


def test_store_rereads_the_file_only_after_it_changed(store, monkeypatch):
    reads = []
    real_check = kb_authstore._check_shape
    monkeypatch.setattr(kb_authstore, "_check_shape", lambda state: (reads.append(1), real_check(state)))
    _client(store)  # its own write does not make it reread
    for _ in range(3):
        store.get_client("c1")
    assert reads == []
    _client(AuthStore(store.folder), "c2")
    assert store.get_client("c2") is not None and len(reads) == 2  # the other store read once, this one once


def test_store_forgets_a_change_it_could_not_write(store, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kb_authstore, "atomic_write_text", disk_full)
    with pytest.raises(OSError):
        _client(store)
    monkeypatch.undo()
    assert store.get_client("c1") is None  # memory matches the file: what was never written never happened


def test_store_serialises_two_processes_on_the_same_folder(store):
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from kb_authstore import AuthStore\n"
        "s = AuthStore(Path(sys.argv[2]))\n"
        "for i in range(25):\n"
        "    s.register_client({'client_id': f'{sys.argv[3]}-{i}', 'redirect_uris': ['https://a.example/cb']})\n"
    )
    repo = str(Path(kb_authstore.__file__).parent)
    procs = [subprocess.Popen([sys.executable, "-c", script, repo, str(store.folder), name]) for name in ("p", "q")]
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
    assert len(store.list_clients()) == 50  # no registration lost to a read-modify-write race


def test_store_survives_an_audit_hook_that_raises(tmp_path, clock):
    def broken(name, detail):
        raise RuntimeError("audit log is full")

    s = AuthStore(tmp_path / "auth", now=clock, on_event=broken)
    setup = s.set_owner(PASSPHRASE)
    assert s.check_login(PASSPHRASE, totp_code(setup.secret_b32, clock.t)).ok
