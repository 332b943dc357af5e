"""The owner's sign-in (passphrase + TOTP) and consent pages of the OAuth flow (kb_oauth): small server-rendered HTML,
inline CSS only, no external assets, CSRF-checked, usable on a 390 px phone; each page bound to one parked /authorize
request and to the browser that signed in. Imports: kb_authstore.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import logging
import secrets
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlencode, urlsplit

import anyio.to_thread
from mcp.server.auth.provider import AuthorizationParams, construct_redirect_uri
from mcp.shared.auth import OAuthClientInformationFull
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from kb_authstore import AuthError, AuthStore

logger = logging.getLogger(__name__)

# Scopes a client may hold, with the line the consent page shows; notes:read is needed for /mcp at all.
SCOPES = {
    "notes:read": "search and read your notes (except notes marked private)",
    "notes:append": "append text to the notes you made writable",
    "notes:private": "also see notes marked private",
}
READ_SCOPE = "notes:read"
# Our two pages.
LOGIN_PATH, CONSENT_PATH = "/login", "/consent"
# A parked /authorize request (and its page's cookies) lives this long.
PARKED_TTL_S = 10 * 60
# Random bytes in a parked-request id, a CSRF token and a sign-in cookie.
RANDOM_BYTES = 32
# Cookie names (`__Host-` prefixed when public_url is https: Secure, host-only, path /).
CSRF_COOKIE, LOGIN_COOKIE = "kb_csrf", "kb_login"
# Said for every refused sign-in, never which part was wrong.
LOGIN_FAILED = "wrong passphrase or code"
# Said under it: a code already used (a sign-in a moment ago) is refused as a wrong one.
LOGIN_FAILED_HINT = "Each code works once: after a sign-in, wait for the next code."


@dataclass
class Parked:
    """An /authorize request waiting for the owner's sign-in and consent."""

    client_id: str
    params: AuthorizationParams
    expires_at: float
    login_hash: str | None = None  # SHA-256 of the sign-in cookie of the browser that signed in for this request


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ParkingProvider(Protocol):
    """What the pages need of kb_oauth.VaultOAuthProvider."""

    store: AuthStore
    public_url: str

    def parked(self, req: str) -> Parked | None: ...

    def take_parked(self, req: str) -> Parked | None: ...

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None: ...


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _offered_scopes(asked: list[str] | None) -> tuple[list[str], set[str]]:
    """(scopes the consent page offers, those pre-ticked): what the client asked for, or all three with read ticked."""
    if not asked:
        return list(SCOPES), {READ_SCOPE}
    return [s for s in SCOPES if s in asked or s == READ_SCOPE], {READ_SCOPE, *asked}


class SignInPages:
    """GET/POST /login (passphrase + TOTP) and GET/POST /consent, bound to one parked request and one browser."""

    def __init__(self, provider: ParkingProvider) -> None:
        self.provider, self.store, self.public_url = provider, provider.store, provider.public_url
        self.secure = self.public_url.startswith("https://")
        prefix = "__Host-" if self.secure else ""
        self.csrf_cookie, self.login_cookie = prefix + CSRF_COOKIE, prefix + LOGIN_COOKIE

    def routes(self) -> list[Route]:
        return [
            Route(LOGIN_PATH, self.login_form, methods=["GET"]),
            Route(LOGIN_PATH, self.login_submit, methods=["POST"]),
            Route(CONSENT_PATH, self.consent_form, methods=["GET"]),
            Route(CONSENT_PATH, self.consent_submit, methods=["POST"]),
        ]

    async def login_form(self, request: Request) -> Response:
        req = request.query_params.get("req", "")
        if isinstance(parked := self._check(request, req), Response):
            return parked
        return await self._login_page(req, parked, secrets.token_urlsafe(RANDOM_BYTES))

    async def login_submit(self, request: Request) -> Response:
        form = await request.form()
        req = _field(form, "req")
        if isinstance(parked := self._check(request, req, form=form), Response):
            return parked
        try:  # scrypt takes ~0.1 s: off the event loop
            result = await anyio.to_thread.run_sync(self.store.check_login, _field(form, "passphrase"), _field(form, "code"))
        except AuthError as e:
            logger.error("sign-in impossible: %s", e)
            return self._page("Not set up", NOT_SET_UP, 503)
        if result.locked:
            minutes = max(1, -(-result.retry_after_s // 60))
            return self._page("Locked", LOCKED.format(minutes=minutes), 429, {"Retry-After": str(result.retry_after_s)})
        if not result.ok:
            logger.info("refused a sign-in for client %s (%s)", parked.client_id, LOGIN_FAILED)
            return await self._login_page(req, parked, _field(form, "csrf"), error=LOGIN_FAILED, status=401)
        # Bind the sign-in to this browser: consent needs the cookie whose hash the parked request now holds.
        login = secrets.token_urlsafe(RANDOM_BYTES)
        parked.login_hash = _sha256(login)
        url = f"{self.public_url}{CONSENT_PATH}?{urlencode({'req': req})}"
        response = RedirectResponse(url, status_code=303, headers=self._headers())
        self._set_cookie(response, self.login_cookie, login)
        return response

    async def consent_form(self, request: Request) -> Response:
        req = request.query_params.get("req", "")
        if isinstance(parked := self._check(request, req, signed_in=True), Response):
            return parked
        redirect_uri, csrf = str(parked.params.redirect_uri), secrets.token_urlsafe(RANDOM_BYTES)
        offered, ticked = _offered_scopes(parked.params.scopes)
        boxes = "".join(
            SCOPE_BOX.format(
                scope=s, text=html.escape(SCOPES[s]), checked=" checked" * (s in ticked), disabled=" disabled" * (s == READ_SCOPE)
            )
            for s in offered
        )
        host, action = html.escape(urlsplit(redirect_uri).netloc), html.escape(self.public_url + CONSENT_PATH)
        client = await self._client_name(parked)
        body = CONSENT.format(client=client, host=host, action=action, req=html.escape(req), csrf=csrf, boxes=boxes)
        response = self._page("Allow access?", body, redirects_out=True)
        self._set_cookie(response, self.csrf_cookie, csrf)
        return response

    async def consent_submit(self, request: Request) -> Response:
        form = await request.form()
        req = _field(form, "req")
        if isinstance(parked := self._check(request, req, form=form, signed_in=True), Response):
            return parked
        self.provider.take_parked(req)
        params, redirect_uri = parked.params, str(parked.params.redirect_uri)
        if _field(form, "decision") != "allow":
            logger.info("the owner denied client %s", parked.client_id)
            self.store.deny_consent(parked.client_id)
            back = construct_redirect_uri(redirect_uri, error="access_denied", state=params.state, iss=self.public_url)
        else:
            offered, _ = _offered_scopes(params.scopes)
            ticked = set(form.getlist("scope"))
            granted = [s for s in SCOPES if s == READ_SCOPE or (s in ticked and s in offered)]
            try:
                code = self.store.create_code(
                    parked.client_id, granted, params.code_challenge, redirect_uri, params.redirect_uri_provided_explicitly,
                    params.resource, params.state,
                )  # fmt: skip
            except AuthError:
                return self._page("Link expired", EXPIRED, 400)  # the client was revoked while the owner signed in
            # RFC 9207 iss: the SDK client compares it with the metadata issuer, exactly.
            back = construct_redirect_uri(redirect_uri, code=code, state=params.state, iss=self.public_url)
        # 302, never Starlette's default 307, which would re-POST this form to the client.
        response = RedirectResponse(back, status_code=302, headers=self._headers())
        response.delete_cookie(self.login_cookie, path="/", secure=self.secure, httponly=True, samesite="lax")
        return response

    def _check(self, request: Request, req: str, form: FormData | None = None, signed_in: bool = False) -> Parked | Response:
        """The parked request, or the refusal page: CSRF (double submit) on a POST, then the request, then the sign-in."""
        if form is not None:
            cookie = request.cookies.get(self.csrf_cookie, "")
            if not cookie or not hmac.compare_digest(cookie.encode("utf-8"), _field(form, "csrf").encode("utf-8")):
                return self._page("Refused", FORBIDDEN, 403)
        if (parked := self.provider.parked(req)) is None:
            return self._page("Link expired", EXPIRED, 400)
        if signed_in:
            cookie = request.cookies.get(self.login_cookie, "")
            if not (cookie and parked.login_hash and hmac.compare_digest(_sha256(cookie), parked.login_hash)):
                return self._page("Refused", FORBIDDEN, 403)
        return parked

    async def _client_name(self, parked: Parked) -> str:
        client = await self.provider.get_client(parked.client_id)
        return html.escape((client.client_name if client else None) or parked.client_id)

    async def _login_page(self, req: str, parked: Parked, csrf: str, error: str = "", status: int = 200) -> Response:
        action = html.escape(self.public_url + LOGIN_PATH)
        if error:
            hint = f'<p class="hint">{html.escape(LOGIN_FAILED_HINT)}</p>\n' if error == LOGIN_FAILED else ""
            error = ERROR.format(message=html.escape(error)) + hint
        body = LOGIN.format(
            client=await self._client_name(parked), action=action, req=html.escape(req), csrf=html.escape(csrf), error=error
        )
        response = self._page("Sign in", body, status)
        self._set_cookie(response, self.csrf_cookie, csrf)
        return response

    def _set_cookie(self, response: Response, name: str, value: str) -> None:
        response.set_cookie(name, value, max_age=PARKED_TTL_S, path="/", secure=self.secure, httponly=True, samesite="lax")

    def _headers(self, redirects_out: bool = False) -> dict[str, str]:
        # Browsers apply form-action to every redirect after a form POST, and claude.ai's callback redirects on to the
        # Claude apps' own claude:// scheme (fastmcp dropped form-action from its consent page for this, PR #3372): the
        # consent form, whose answer leaves for the client, has none; its inputs are escaped and CSRF-checked.
        csp = CSP.format(form_action="" if redirects_out else " form-action 'self';")
        return {
            "Cache-Control": "no-store",
            "Content-Security-Policy": csp,
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        }

    def _page(self, title: str, body: str, status: int = 200, extra: dict | None = None, redirects_out: bool = False) -> Response:
        headers = self._headers(redirects_out) | (extra or {})
        return HTMLResponse(PAGE.format(title=html.escape(title), body=body), status_code=status, headers=headers)


# --- pages: inline CSS only, no external assets, usable on a 390 px phone ---

CSP = "default-src 'none'; style-src 'unsafe-inline';{form_action} frame-ancestors 'none'; base-uri 'none'"

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - second-brain-mcp</title>
<style>
body {{ font: 17px/1.5 system-ui, sans-serif; margin: 0; padding: 16px; background: #f6f6f4; color: #222; }}
main {{ max-width: 420px; margin: 24px auto; background: #fff; padding: 20px; border-radius: 12px; }}
h1 {{ font-size: 1.3em; margin-top: 0; }}
label {{ display: block; margin: 14px 0 4px; font-weight: 600; }}
input[type=password], input[type=text] {{ width: 100%; box-sizing: border-box; font-size: 1.2em; padding: 12px;
  border: 1px solid #999; border-radius: 8px; }}
.scope {{ display: flex; gap: 12px; align-items: flex-start; margin: 12px 0; font-weight: normal; }}
.scope input {{ width: 24px; height: 24px; flex: none; }}
button, input {{ font-family: inherit; }}
button {{ width: 100%; font-size: 1.1em; padding: 14px; margin-top: 16px; border: 0; border-radius: 8px;
  background: #1f5fbf; color: #fff; }}
button.deny {{ background: #ddd; color: #222; }}
.error {{ background: #fde8e8; color: #8a1c1c; padding: 10px; border-radius: 8px; }}
.hint {{ color: #555; font-size: 0.9em; }}
</style></head>
<body><main><h1>{title}</h1>
{body}
</main></body></html>
"""

LOGIN = """<p>Sign in to let <b>{client}</b> use your notes.</p>
{error}<form method="post" action="{action}">
<input type="hidden" name="req" value="{req}">
<input type="hidden" name="csrf" value="{csrf}">
<input type="text" name="username" value="owner" autocomplete="username" hidden>
<label for="passphrase">Passphrase</label>
<input type="password" id="passphrase" name="passphrase" autocomplete="current-password" required autofocus>
<label for="code">6-digit code from your authenticator app</label>
<input type="text" id="code" name="code" autocomplete="one-time-code" inputmode="numeric" pattern="[0-9]{{6}}"
  maxlength="6" required>
<button type="submit">Sign in</button>
</form>
"""

ERROR = '<p class="error" role="alert">{message}</p>\n'

CONSENT = """<p><b>{client}</b> asks for access to your notes. It will receive the answer at <b>{host}</b>.</p>
<form method="post" action="{action}">
<input type="hidden" name="req" value="{req}">
<input type="hidden" name="csrf" value="{csrf}">
{boxes}<button type="submit" name="decision" value="allow">Allow</button>
<button type="submit" name="decision" value="deny" class="deny">Deny</button>
</form>
"""

SCOPE_BOX = """<label class="scope"><input type="checkbox" name="scope" value="{scope}"{checked}{disabled}>
<span><code>{scope}</code>: {text}</span></label>
"""

LOCKED = "<p>Too many failed sign-ins. Try again in about {minutes} minutes, then start again from your app.</p>\n"

EXPIRED = "<p>This sign-in link expired or was already used. Start again from your app.</p>\n"

FORBIDDEN = "<p>This form was not accepted. Start again from your app, in one browser.</p>\n"

NOT_SET_UP = "<p>This server has no owner credentials yet. Its owner must run <code>auth init</code> first.</p>\n"
