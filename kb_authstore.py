"""OAuth state of one vault and the policy that is not HTTP: the owner's passphrase + TOTP login with its lockout,
registered clients, one-use authorization codes, rotating refresh tokens in families revoked as one (kb_oauth serves it).
Imports: kb_config, kb_files.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import struct
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from kb_config import KBError
from kb_files import atomic_write_text

try:
    import fcntl
except ImportError:  # Windows: threads are still serialised; run one server per vault there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# The store's one file, and the file whose flock serialises processes sharing the folder.
STATE_FILE = "auth.json"
LOCK_FILE = "auth.lock"
# Stamped into the file; any other value is refused, never guessed at.
FORMAT = "second-brain-auth-1"
# Shortest passphrase set_owner accepts.
MIN_PASSPHRASE_CHARS = 12
# scrypt cost (32 MiB, ~0.1 s a check); stored with each hash so a later change still verifies old ones.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
# hashlib's memory cap for scrypt: room above the 32 MiB the cost above needs.
SCRYPT_MAXMEM = 64 * 1024 * 1024
# Random salt and derived hash sizes, in bytes.
SALT_BYTES, HASH_BYTES = 16, 32
# RFC 6238 as authenticator apps expect it: SHA-1, 6 digits, 30 s steps; a code one step early or late is accepted.
TOTP_SECRET_BYTES, TOTP_DIGITS, TOTP_STEP_S, TOTP_DRIFT_STEPS = 20, 6, 30, 1
# Issuer shown in authenticator apps.
ISSUER = "second-brain-mcp"
# This many failed logins within LOGIN_WINDOW_S lock the login (of this vault) for LOGIN_LOCK_S.
MAX_LOGIN_FAILURES, LOGIN_WINDOW_S, LOGIN_LOCK_S = 5, 15 * 60, 15 * 60
# Registered clients at most (registration is open to anyone who reaches the URL), and one registration's JSON size.
MAX_CLIENTS, MAX_CLIENT_INFO_CHARS = 100, 16_000
# A registration that never received a token is dropped after this, so strangers cannot fill MAX_CLIENTS for good.
UNUSED_CLIENT_TTL_S = 24 * 3600
# touch_client rewrites the file at most this often per client.
TOUCH_INTERVAL_S = 60
# Lifetimes of an authorization code, an access token and a refresh token (renewed on each rotation).
CODE_TTL_S, ACCESS_TTL_S, REFRESH_TTL_S = 5 * 60, 3600, 30 * 24 * 3600
# What each entry of the file's tables holds at least (a file without them is corrupt, not half-usable).
OWNER_KEYS = {"salt", "hash", "scrypt", "totp_secret", "totp_last_step"}
TABLE_KEYS: dict[str, set[str]] = {
    "clients": {"info", "created_at", "last_used_at"},
    "codes": {"client_id", "scopes", "code_challenge", "redirect_uri", "expires_at", "family", "consumed"},
    "tokens": {"kind", "client_id", "scopes", "resource", "expires_at", "family", "used"},
    "revoked_families": set(),
}
# Random bytes in a code or token (256 bits).
TOKEN_BYTES = 32
# Hosts where a redirect URI may use plain http: the client runs on the same machine.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class AuthError(KBError):
    """An authorization-store operation was refused; the message says what to do."""


class AuthStoreCorruptError(AuthError):
    """The store's file cannot be read; `auth init --reset` starts over."""


class RedirectUriError(AuthError):
    """A redirect URI breaks the policy: https, or http on a loopback host; never a fragment."""


class RegistrationRefusedError(AuthError):
    """A client registration was refused (malformed, too large, duplicate id, or MAX_CLIENTS reached)."""


@dataclass(frozen=True)
class TotpSetup:
    """Shown once by `auth init`: the TOTP secret (base32) and the otpauth:// URL a QR code carries."""

    secret_b32: str
    url: str


@dataclass(frozen=True)
class LoginResult:
    """ok; or one generic failure that never says which part was wrong; or locked, retry after `retry_after_s`."""

    ok: bool
    locked: bool = False
    retry_after_s: int = 0


@dataclass(frozen=True)
class ClientSummary:
    """A registered client as `auth list` shows it; `scopes` are those its live tokens hold."""

    client_id: str
    client_name: str | None
    scopes: list[str]
    created_at: int
    last_used_at: int | None


@dataclass(frozen=True)
class CodeRecord:
    """An authorization code's grant; pass `family` to issue_tokens so a replay of the code revokes those tokens."""

    client_id: str
    scopes: list[str]
    code_challenge: str
    redirect_uri: str
    redirect_uri_provided_explicitly: bool
    resource: str | None
    state: str | None
    expires_at: float
    family: str


@dataclass(frozen=True)
class TokenRecord:
    """What an access or refresh token grants; `family` groups every token descended from one authorization."""

    kind: str  # "access" or "refresh"
    client_id: str
    scopes: list[str]
    resource: str | None
    expires_at: int
    family: str


@dataclass(frozen=True)
class TokenPair:
    """Freshly issued tokens (the only time they exist in clear); `scopes` are the access token's."""

    access_token: str
    refresh_token: str
    expires_in_s: int
    scopes: list[str]
    family: str


def totp_code(secret_b32: str, at: float, digits: int = TOTP_DIGITS) -> str:
    """The RFC 6238 code (HMAC-SHA1, 30 s steps) of a base32 secret at Unix time `at`."""
    return _hotp(_b32decode(secret_b32), int(at // TOTP_STEP_S), digits)


def check_redirect_uri(uri: str) -> None:
    """Raise RedirectUriError unless `uri` is https, or http on 127.0.0.1 / localhost / [::1], and has no fragment."""
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError as e:
        raise RedirectUriError(f"redirect URI {uri!r} is malformed ({e}); register an https:// URL") from e
    if "#" in uri:
        raise RedirectUriError(f"redirect URI {uri!r} has a fragment, which OAuth forbids; register it without the '#...'")
    if host and (parts.scheme == "https" or (parts.scheme == "http" and host in LOOPBACK_HOSTS)):
        return
    raise RedirectUriError(
        f"redirect URI {uri!r} is refused; register an https:// URL (http:// only on 127.0.0.1, localhost or [::1])"
    )


def _hotp(key: bytes, counter: int, digits: int) -> str:
    mac = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    value = struct.unpack(">I", mac[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(value % 10**digits).zfill(digits)


def _b32decode(secret: str) -> bytes:
    secret = "".join(secret.split()).upper()
    return base64.b32decode(secret + "=" * (-len(secret) % 8))


def _scrypt(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    # NFC: the same passphrase typed on a phone and on a desktop keyboard must give the same bytes.
    raw = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    return hashlib.scrypt(raw, salt=salt, n=n, r=r, p=p, maxmem=SCRYPT_MAXMEM, dklen=HASH_BYTES)


def _digest(secret: str) -> str:
    """What the file keeps of a code or token: its SHA-256 (256 random bits need no salt or slow hash)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _empty_state() -> dict[str, Any]:
    return {"format": FORMAT, "owner": None, "login": {"failures": [], "locked_until": 0}} | {k: {} for k in TABLE_KEYS}


def _check_shape(state: Any) -> None:
    """Raise ValueError unless `state` has the layout this version writes, down to each entry's keys."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"format is {found!r}, expected {FORMAT!r}")
    if not isinstance(state.get("login"), dict) or not {"failures", "locked_until"} <= state["login"].keys():
        raise ValueError("'login' is missing or malformed")
    owner = state.get("owner")
    if owner is not None and not (isinstance(owner, dict) and OWNER_KEYS <= owner.keys()):
        raise ValueError("'owner' is malformed")
    for table, keys in TABLE_KEYS.items():
        entries = state.get(table)
        if not isinstance(entries, dict) or not all(
            not keys or (isinstance(e, dict) and keys <= e.keys()) for e in entries.values()
        ):
            raise ValueError(f"{table!r} is missing or holds a malformed entry")


class AuthStore:
    """The OAuth state of one vault, in `folder`/auth.json (0600, folder 0700), rewritten atomically on each change and
    reread when another process changed it. Methods are thread-safe; check_login takes ~0.1 s (scrypt), so async
    callers run it in a worker thread.

    Example: `AuthStore(data_dir / "auth", on_event=audit).check_login(passphrase, code).ok`
    """

    def __init__(
        self, folder: Path, now: Callable[[], float] = time.time, on_event: Callable[[str, dict], None] | None = None
    ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STATE_FILE
        self._now = now
        self._on_event = on_event
        self._lock = threading.Lock()
        self._state = _empty_state()
        self._signature: tuple[int, ...] | None = None
        self._pending: list[tuple[str, dict]] = []
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)  # also when it existed, or the umask widened it

    # --- owner and login ---

    def is_initialised(self) -> bool:
        """Whether owner credentials are set (raises AuthStoreCorruptError on an unreadable file)."""
        with self._hold() as s:
            return s["owner"] is not None

    def set_owner(self, passphrase: str, *, reset: bool = False, label: str = "vault") -> TotpSetup:
        """Set the owner's passphrase and a new TOTP secret; `reset` replaces them (even over a corrupt file) and
        revokes every client, code and token."""
        if len(passphrase) < MIN_PASSPHRASE_CHARS:
            raise AuthError(f"the passphrase is shorter than {MIN_PASSPHRASE_CHARS} characters; choose a longer one")
        salt = secrets.token_bytes(SALT_BYTES)
        digest = _scrypt(passphrase, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
        secret = base64.b32encode(secrets.token_bytes(TOTP_SECRET_BYTES)).decode("ascii")
        with self._hold(tolerate_corrupt=reset) as s:
            if s["owner"] is not None and not reset:
                raise AuthError(f"{self.path} already holds owner credentials; run `auth init --reset` to replace them")
            if reset:
                revoked = self._revoke_everything(s)
                self._event("revocation", {"client_id": "all", "clients": revoked})
            # The TOTP secret is stored in clear: the server must compute codes from it. The file is 0600 in a 0700
            # folder; encrypting it with a key kept beside it would add nothing.
            s["owner"] = {
                "salt": salt.hex(),
                "hash": digest.hex(),
                "scrypt": [SCRYPT_N, SCRYPT_R, SCRYPT_P],
                "totp_secret": secret,
                "totp_last_step": -1,
                "created_at": int(self._now()),
            }
            s["login"] = {"failures": [], "locked_until": 0}
            self._save()
        query = f"secret={secret}&issuer={quote(ISSUER)}&algorithm=SHA1&digits={TOTP_DIGITS}&period={TOTP_STEP_S}"
        return TotpSetup(secret, f"otpauth://totp/{quote(ISSUER)}:{quote(label, safe='')}?{query}")

    def check_login(self, passphrase: str, code: str) -> LoginResult:
        """Check the passphrase (constant time) and a TOTP code not used before; count failures and lock the login.

        Raises AuthError before `auth init`.
        """
        with self._hold() as s:
            owner = self._require_owner(s)
            if wait := self._locked_for(s):
                return LoginResult(False, True, wait)
            salt, (n, r, p) = owner["salt"], owner["scrypt"]
        # scrypt runs outside the locks so other requests go on; the lockout is checked again before the verdict.
        digest = _scrypt(passphrase, bytes.fromhex(salt), n, r, p)
        with self._hold() as s:
            owner = self._require_owner(s)
            if wait := self._locked_for(s):
                return LoginResult(False, True, wait)
            passphrase_ok = owner["salt"] == salt and hmac.compare_digest(digest, bytes.fromhex(owner["hash"]))
            step = self._totp_step(owner, code)  # checked whatever the passphrase gave, so timing tells nothing
            if passphrase_ok and step is not None:
                owner["totp_last_step"] = step
                s["login"]["failures"] = []
                self._event("login", {})
                self._save()
                return LoginResult(True)
            return self._fail(s)

    def _totp_step(self, owner: dict[str, Any], code: str) -> int | None:
        """The time step `code` belongs to, if it is within the drift and later than the last accepted one."""
        code = "".join(code.split())
        if len(code) != TOTP_DIGITS or not (code.isascii() and code.isdigit()):
            return None
        key, current, found = _b32decode(owner["totp_secret"]), int(self._now() // TOTP_STEP_S), None
        for step in range(current - TOTP_DRIFT_STEPS, current + TOTP_DRIFT_STEPS + 1):
            # Replay guard: a step at or before the last accepted one is refused, so each code works once.
            if hmac.compare_digest(_hotp(key, step, TOTP_DIGITS), code) and step > owner["totp_last_step"]:
                found = step
        return found

    def _fail(self, s: dict[str, Any]) -> LoginResult:
        now, login = self._now(), s["login"]
        login["failures"] = [t for t in login["failures"] if t > now - LOGIN_WINDOW_S] + [now]
        count = len(login["failures"])
        logger.warning("login failed (%d of %d allowed within %d min)", count, MAX_LOGIN_FAILURES, LOGIN_WINDOW_S // 60)
        self._event("login_failure", {"failures": count})
        if count >= MAX_LOGIN_FAILURES:
            login["failures"], login["locked_until"] = [], now + LOGIN_LOCK_S
            logger.warning("login locked for %d s after %d failures", LOGIN_LOCK_S, count)
            self._event("login_locked", {"seconds": LOGIN_LOCK_S})
        self._save()
        wait = self._locked_for(s)
        return LoginResult(False, bool(wait), wait)

    def _locked_for(self, s: dict[str, Any]) -> int:
        return max(0, math.ceil(s["login"]["locked_until"] - self._now()))

    def login_locked_for(self) -> int:
        """Seconds the sign-in stays locked (0: open)."""
        with self._hold() as s:
            return self._locked_for(s)

    def unlock_login(self) -> bool:
        """Lift a lockout and forget the failures (the owner, at this machine: `auth unlock`); True if it was locked."""
        with self._hold() as s:
            was = self._locked_for(s) > 0
            s["login"] = {"failures": [], "locked_until": 0}
            self._save()
            self._event("login_unlocked", {"was_locked": was})
        return was

    # --- clients ---

    def register_client(self, info: dict[str, Any]) -> dict[str, Any]:
        """Store a Dynamic Client Registration (OAuthClientInformationFull.model_dump(mode="json")); returns it."""
        client_id, uris = info.get("client_id"), info.get("redirect_uris")
        if not isinstance(client_id, str) or not client_id:
            raise RegistrationRefusedError("the registration has no client_id; register through the /register endpoint")
        if not isinstance(uris, list) or not uris:
            raise RegistrationRefusedError(f"client {client_id!r} registered no redirect_uris; send at least one")
        for uri in uris:
            check_redirect_uri(str(uri))
        try:
            text = json.dumps(info)
        except (TypeError, ValueError) as e:
            raise RegistrationRefusedError(f"client {client_id!r}'s registration is not JSON ({e}); send plain metadata") from e
        if len(text) > MAX_CLIENT_INFO_CHARS:
            raise RegistrationRefusedError(
                f"client {client_id!r}'s registration is {len(text)} characters; at most {MAX_CLIENT_INFO_CHARS} are kept"
            )
        with self._hold() as s:
            self._purge(s)  # stale never-used registrations make room first
            if client_id in s["clients"]:
                raise RegistrationRefusedError(f"client_id {client_id!r} is already registered; register for a new one")
            if len(s["clients"]) >= MAX_CLIENTS:
                raise RegistrationRefusedError(
                    f"{self.path} already holds {MAX_CLIENTS} registered clients; revoke unused ones, then register again"
                )
            s["clients"][client_id] = {"info": json.loads(text), "created_at": int(self._now()), "last_used_at": None}
            self._event("registration", {"client_id": client_id, "client_name": info.get("client_name")})
            self._save()
            return copy.deepcopy(s["clients"][client_id]["info"])

    def get_client(self, client_id: str) -> dict[str, Any] | None:
        """The client's stored registration, or None."""
        with self._hold() as s:
            client = s["clients"].get(client_id)
            return copy.deepcopy(client["info"]) if client else None

    def list_clients(self) -> list[ClientSummary]:
        """Every registered client, oldest first."""
        with self._hold() as s:
            now, summaries = self._now(), []
            for client_id, c in sorted(s["clients"].items(), key=lambda item: item[1]["created_at"]):
                live = [t for t in s["tokens"].values() if t["client_id"] == client_id and t["expires_at"] > now]
                scopes = sorted({scope for t in live for scope in t["scopes"]})
                name = c["info"].get("client_name")
                summaries.append(ClientSummary(client_id, name, scopes, c["created_at"], c["last_used_at"]))
            return summaries

    def touch_client(self, client_id: str) -> None:
        """Record that the client used a token now (written at most once a TOUCH_INTERVAL_S per client)."""
        with self._hold() as s:
            client, now = s["clients"].get(client_id), int(self._now())
            if client is None or (client["last_used_at"] is not None and now - client["last_used_at"] < TOUCH_INTERVAL_S):
                return
            client["last_used_at"] = now
            self._save()

    def revoke_client(self, client_id: str) -> bool:
        """Remove a client with its codes and tokens; False when it was not registered."""
        with self._hold() as s:
            if s["clients"].pop(client_id, None) is None:
                return False
            for table in (s["codes"], s["tokens"]):
                for key in [k for k, rec in table.items() if rec["client_id"] == client_id]:
                    del table[key]
            self._event("revocation", {"client_id": client_id})
            self._save()
            return True

    def revoke_all(self) -> int:
        """Remove every client, code and token; returns how many clients there were."""
        with self._hold() as s:
            count = self._revoke_everything(s)
            self._event("revocation", {"client_id": "all", "clients": count})
            self._save()
            return count

    # --- authorization codes ---

    def create_code(
        self,
        client_id: str,
        scopes: list[str],
        code_challenge: str,
        redirect_uri: str,
        redirect_uri_provided_explicitly: bool,
        resource: str | None,
        state: str | None = None,
    ) -> str:
        """A new one-use authorization code for the scopes the owner allowed on the consent page, valid CODE_TTL_S; only
        its SHA-256 is kept. Audited as "consent" (client and scopes, never the code)."""
        code = secrets.token_urlsafe(TOKEN_BYTES)
        with self._hold() as s:
            self._require_client(s, client_id)
            grant = CodeRecord(
                client_id,
                list(scopes),
                code_challenge,
                str(redirect_uri),
                bool(redirect_uri_provided_explicitly),
                resource,
                state,
                self._now() + CODE_TTL_S,
                secrets.token_hex(16),
            )
            s["codes"][_digest(code)] = asdict(grant) | {"consumed": False}
            name = s["clients"][client_id]["info"].get("client_name")
            self._event("consent", {"client_id": client_id, "client_name": name, "scopes": list(scopes)})
            self._save()
        return code

    def deny_consent(self, client_id: str) -> None:
        """Record that the owner denied `client_id` on the consent page (audited as "consent_denied"; nothing stored)."""
        with self._hold() as s:
            client = s["clients"].get(client_id)
            name = client["info"].get("client_name") if client else None
            self._event("consent_denied", {"client_id": client_id, "client_name": name})

    def load_code(self, code: str) -> CodeRecord | None:
        """The code's grant, or None if unknown or expired; a consumed code is a replay and revokes its tokens."""
        return self._take_code(code, consume=False)

    def consume_code(self, code: str) -> CodeRecord | None:
        """load_code, then mark the code used: any later use is a replay (its tokens are revoked, None returned)."""
        return self._take_code(code, consume=True)

    def _take_code(self, code: str, consume: bool) -> CodeRecord | None:
        with self._hold() as s:
            rec = s["codes"].get(_digest(code))
            if rec is None or rec["expires_at"] <= self._now():
                return None
            if rec["consumed"]:  # kept until it expires so that this replay can be told from an unknown code
                self._revoke_family(s, rec["family"], "code_replay", rec["client_id"])
                self._save()
                return None
            if consume:
                rec["consumed"] = True
                self._save()
            return CodeRecord(**{f.name: copy.deepcopy(rec.get(f.name)) for f in fields(CodeRecord)})

    # --- tokens ---

    def issue_tokens(self, client_id: str, scopes: list[str], resource: str | None, family: str | None = None) -> TokenPair:
        """A new access token (ACCESS_TTL_S) and refresh token (REFRESH_TTL_S) in `family` (a new one when None)."""
        with self._hold() as s:
            self._require_client(s, client_id)
            if family in s["revoked_families"]:
                raise AuthError(f"the grant of client {client_id!r} was revoked; the client must authorize again")
            pair = self._issue(s, client_id, list(scopes), list(scopes), resource, family or secrets.token_hex(16))
            self._save()
            return pair

    def load_access(self, token: str) -> TokenRecord | None:
        """The access token's grant, or None if unknown, expired or revoked."""
        with self._hold() as s:
            return self._live_token(s, token, "access")

    def load_refresh(self, token: str) -> TokenRecord | None:
        """The refresh token's grant, or None; a refresh token already used revokes its whole family."""
        with self._hold() as s:
            return self._live_token(s, token, "refresh")

    def rotate_refresh(self, old_refresh: str, scopes: list[str] | None = None) -> TokenPair | None:
        """Spend a refresh token for a new pair in its family (None if invalid; reuse revokes the family).

        `scopes` narrows the new access token; the new refresh token keeps the grant's scopes.
        """
        with self._hold() as s:
            rec = self._live_token(s, old_refresh, "refresh")
            if rec is None:
                return None
            if scopes is not None and not set(scopes) <= set(rec.scopes):
                raise AuthError(f"scopes {sorted(set(scopes) - set(rec.scopes))} were not granted; ask for {rec.scopes}")
            s["tokens"][_digest(old_refresh)]["used"] = True
            access_scopes = list(scopes) if scopes is not None else rec.scopes
            pair = self._issue(s, rec.client_id, access_scopes, rec.scopes, rec.resource, rec.family)
            self._save()
            return pair

    def revoke_token(self, token: str) -> bool:
        """Revoke the family of an access or refresh token; False when the token is unknown."""
        with self._hold() as s:
            rec = s["tokens"].get(_digest(token))
            if rec is None:
                return False
            self._revoke_family(s, rec["family"], "revocation", rec["client_id"])
            self._save()
            return True

    def _issue(
        self, s: dict[str, Any], client_id: str, scopes: list[str], refresh_scopes: list[str], resource: str | None, family: str
    ) -> TokenPair:
        now = int(self._now())
        access, refresh = secrets.token_urlsafe(TOKEN_BYTES), secrets.token_urlsafe(TOKEN_BYTES)
        common = {"client_id": client_id, "resource": resource, "family": family, "used": False}
        s["tokens"][_digest(access)] = common | {"kind": "access", "scopes": scopes, "expires_at": now + ACCESS_TTL_S}
        s["tokens"][_digest(refresh)] = common | {"kind": "refresh", "scopes": refresh_scopes, "expires_at": now + REFRESH_TTL_S}
        s["clients"][client_id]["last_used_at"] = now
        return TokenPair(access, refresh, ACCESS_TTL_S, list(scopes), family)

    def _live_token(self, s: dict[str, Any], token: str, kind: str) -> TokenRecord | None:
        rec = s["tokens"].get(_digest(token))
        if rec is None or rec["kind"] != kind or rec["expires_at"] <= self._now():
            return None
        if rec["used"]:  # a spent refresh token came back: it was stolen, or the client was; end the whole grant
            self._revoke_family(s, rec["family"], "refresh_reuse", rec["client_id"])
            self._save()
            return None
        return TokenRecord(kind, rec["client_id"], list(rec["scopes"]), rec["resource"], rec["expires_at"], rec["family"])

    def _revoke_family(self, s: dict[str, Any], family: str, event: str, client_id: str) -> None:
        for key in [k for k, rec in s["tokens"].items() if rec["family"] == family]:
            del s["tokens"][key]
        # Remembered, so a code exchange racing this revocation cannot issue into the family afterwards.
        s["revoked_families"][family] = int(self._now()) + REFRESH_TTL_S
        logger.warning("%s: revoked every token of one grant of client %s", event, client_id)
        self._event(event, {"client_id": client_id})

    def _revoke_everything(self, s: dict[str, Any]) -> int:
        count = len(s["clients"])
        for key in ("clients", "codes", "tokens"):
            s[key] = {}
        return count

    # --- upkeep ---

    def purge(self) -> int:
        """Drop expired codes, tokens and revocation marks and stale unused registrations; returns how many."""
        with self._hold() as s:
            removed = self._purge(s)
            if removed:
                self._save()
            return removed

    def _purge(self, s: dict[str, Any]) -> int:
        now, before = self._now(), sum(len(s[k]) for k in ("codes", "tokens", "revoked_families", "clients"))
        s["codes"] = {k: r for k, r in s["codes"].items() if r["expires_at"] > now}
        s["tokens"] = {k: r for k, r in s["tokens"].items() if r["expires_at"] > now}
        s["revoked_families"] = {f: until for f, until in s["revoked_families"].items() if until > now}
        s["clients"] = {
            k: c for k, c in s["clients"].items() if c["last_used_at"] is not None or c["created_at"] + UNUSED_CLIENT_TTL_S > now
        }
        s["login"]["failures"] = [t for t in s["login"]["failures"] if t > now - LOGIN_WINDOW_S]
        return before - sum(len(s[k]) for k in ("codes", "tokens", "revoked_families", "clients"))

    def _require_owner(self, s: dict[str, Any]) -> dict[str, Any]:
        if s["owner"] is None:
            raise AuthError(f"no owner credentials in {self.path}; run `auth init` to set a passphrase and TOTP")
        return s["owner"]

    def _require_client(self, s: dict[str, Any], client_id: str) -> None:
        if client_id not in s["clients"]:
            raise AuthError(f"client {client_id!r} is not registered (revoked?); the client must register again")

    def _event(self, name: str, fields: dict[str, Any]) -> None:
        self._pending.append((name, fields))

    # --- the file ---

    @contextlib.contextmanager
    def _hold(self, tolerate_corrupt: bool = False) -> Iterator[dict[str, Any]]:
        """Run one operation on the current state under the thread and file locks; events go out after release."""
        with self._lock:
            with self._file_lock():
                self._reload(tolerate_corrupt)
                self._pending = []
                try:
                    yield self._state
                except BaseException:
                    self._signature = None  # an unsaved half-change is dropped: the next operation rereads the file
                    raise
            events, self._pending = self._pending, []
        for name, detail in events:
            if self._on_event is not None:
                try:
                    self._on_event(name, detail)
                except Exception as e:
                    logger.warning("the audit hook failed on event %s: %s: %s", name, type(e).__name__, e)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _reload(self, tolerate_corrupt: bool) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._state, self._signature = _empty_state(), None
            return
        signature = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if signature == self._signature:
            return
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            _check_shape(state)
        except (OSError, ValueError) as e:
            if not tolerate_corrupt:
                raise AuthStoreCorruptError(
                    f"the OAuth store {self.path} is unreadable ({type(e).__name__}: {e}); run `auth init --reset` to "
                    "start over (every client will have to sign in again)"
                ) from e
            logger.warning("replacing the unreadable OAuth store %s (%s)", self.path, type(e).__name__)
            state = _empty_state()
        self._state, self._signature = state, signature

    def _save(self) -> None:
        self._purge(self._state)
        atomic_write_text(self.path, json.dumps(self._state, indent=1, sort_keys=True) + "\n", mode=0o600)
        st = os.stat(self.path)
        self._signature = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
