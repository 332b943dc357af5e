"""OAuth 2.1 in front of MCP over streamable HTTP: the SDK's authorization-server routes and bearer middleware, driven by
a provider over kb_authstore, with the owner's sign-in (passphrase + TOTP) and consent pages in between.
Imports: kb_authstore, kb_config.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio.to_thread
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    ProviderTokenVerifier,
    RefreshToken,
    RegistrationError,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_resource_metadata_url, create_auth_routes, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from kb_authstore import (
    LOOPBACK_HOSTS,
    MAX_CLIENT_INFO_CHARS,
    MAX_CLIENTS,
    AuthError,
    AuthStore,
    RedirectUriError,
    RegistrationRefusedError,
    TokenPair,
)
from kb_config import ConfigError

logger = logging.getLogger(__name__)
_Client = OAuthClientInformationFull  # a registered client, as the SDK hands it to the provider

# Scopes a client may hold, with the line the consent page shows; notes:read is needed for /mcp at all.
SCOPES = {
    "notes:read": "search and read your notes (except notes marked private)",
    "notes:append": "append text to the notes you made writable",
    "notes:private": "also see notes marked private",
}
READ_SCOPE = "notes:read"
# The one resource owner of a personal vault: the `sub` of every token.
SUBJECT = "owner"
# Paths: the MCP endpoint (the protected resource) and our two pages.
MCP_PATH, LOGIN_PATH, CONSENT_PATH = "/mcp", "/login", "/consent"
# A parked /authorize request lives this long, and at most this many wait at once (the oldest is dropped).
PARKED_TTL_S, MAX_PARKED = 10 * 60, 200
# Random bytes in a parked-request id, a CSRF token and a sign-in cookie.
RANDOM_BYTES = 32
# Cookie names (`__Host-` prefixed when public_url is https: Secure, host-only, path /).
CSRF_COOKIE, LOGIN_COOKIE = "kb_csrf", "kb_login"
# The SDK's own DNS-rebinding defaults for a loopback server.
LOOPBACK_ALLOWED_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ALLOWED_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
# Said for every refused sign-in, never which part was wrong.
LOGIN_FAILED = "wrong passphrase or code"
# Said under it: a code already used (a sign-in a moment ago) is refused as a wrong one.
LOGIN_FAILED_HINT = "Each code works once: after a sign-in, wait for the next code."
# Said to a refused registrant instead of the store's message, which names a server path.
REGISTRATION_REFUSED = (
    f"registration refused: the metadata is over {MAX_CLIENT_INFO_CHARS} characters, or this server already holds "
    f"{MAX_CLIENTS} clients (ask its owner to revoke unused ones)"
)


def check_public_url(public_url: str) -> str:
    """The normalised origin clients reach us at ("https://notes.example.com"); raises ConfigError unless it is https
    (or http on a loopback host) with no path, query or fragment."""
    try:
        parts = urlsplit(public_url.strip())
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise ConfigError(f"public_url {public_url!r} is malformed ({e}); set it like https://notes.example.com") from e
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(f"public_url {public_url!r} is not an http(s) URL; set it like https://notes.example.com")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"public_url {public_url!r} must be an origin only (no path, query or user); drop the rest")
    if parts.scheme != "https" and host not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"public_url {public_url!r} is plain http on a non-loopback host, so passphrases and tokens would cross the "
            "network in clear; serve it behind an https tunnel or reverse proxy and set public_url to the https:// address"
        )
    netloc = f"[{host}]" if ":" in host else host
    if port and port != {"http": 80, "https": 443}[parts.scheme]:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}"


def current_client() -> tuple[str, list[str]] | None:
    """(client_id, scopes) of the OAuth client calling the current tool; None on stdio or the static-token transport."""
    token = get_access_token()
    return None if token is None else (token.client_id, list(token.scopes))


@dataclass
class _Parked:
    """An /authorize request waiting for the owner's sign-in and consent."""

    client_id: str
    params: AuthorizationParams
    expires_at: float
    login_hash: str | None = None  # SHA-256 of the sign-in cookie of the browser that signed in for this request


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _oauth_token(pair: TokenPair) -> OAuthToken:
    scope = " ".join(pair.scopes)
    return OAuthToken(access_token=pair.access_token, expires_in=pair.expires_in_s, scope=scope, refresh_token=pair.refresh_token)


class VaultOAuthProvider:
    """The SDK's OAuthAuthorizationServerProvider over an AuthStore: clients, codes and tokens live in the store;
    /authorize requests are parked in memory until the owner signs in and consents on our pages."""

    def __init__(self, store: AuthStore, public_url: str, *, now: Callable[[], float] = time.time) -> None:
        self.store = store
        self.public_url = check_public_url(public_url)
        self.resource = self.public_url + MCP_PATH
        self._now = now
        self._parked: dict[str, _Parked] = {}

    # --- clients ---

    async def get_client(self, client_id: str) -> _Client | None:
        info = self.store.get_client(client_id)
        return None if info is None else OAuthClientInformationFull.model_validate(info)

    async def register_client(self, client_info: _Client) -> None:
        try:
            self.store.register_client(client_info.model_dump(mode="json"))
        except RedirectUriError as e:
            raise RegistrationError("invalid_redirect_uri", str(e)) from e
        except RegistrationRefusedError as e:
            logger.warning("refused a client registration: %s", e)
            raise RegistrationError("invalid_client_metadata", REGISTRATION_REFUSED) from e

    # --- /authorize and the parked requests ---

    async def authorize(self, client: _Client, params: AuthorizationParams) -> str:
        """Park the request and send the browser to our sign-in page (RFC 8707: only our /mcp is a valid resource)."""
        if _canonical_url(params.resource or self.resource) != self.resource:
            raise AuthorizeError("invalid_target", f"this server only grants access to resource {self.resource}")
        now = self._now()
        self._parked = {req: p for req, p in self._parked.items() if p.expires_at > now}
        if len(self._parked) >= MAX_PARKED:  # /authorize is open to any registered client: bound the memory
            del self._parked[min(self._parked, key=lambda req: self._parked[req].expires_at)]
        req = secrets.token_urlsafe(RANDOM_BYTES)
        params = params.model_copy(update={"resource": self.resource})
        self._parked[req] = _Parked(str(client.client_id), params, now + PARKED_TTL_S)
        return f"{self.public_url}{LOGIN_PATH}?{urlencode({'req': req})}"

    def parked(self, req: str) -> _Parked | None:
        """The parked request `req`, unless unknown or expired."""
        found = self._parked.get(req)
        return found if found is not None and found.expires_at > self._now() else None

    def take_parked(self, req: str) -> _Parked | None:
        """The parked request, removed: each one is decided once."""
        found = self.parked(req)
        self._parked.pop(req, None)
        return found

    # --- /token, the resource server and revocation: SDK models from store records (extra fields are ignored) ---

    async def load_authorization_code(self, client: _Client, authorization_code: str) -> AuthorizationCode | None:
        rec = self.store.load_code(authorization_code)  # a replayed code comes back None and its tokens are revoked
        if rec is None or rec.client_id != client.client_id:
            return None
        return AuthorizationCode.model_validate(asdict(rec) | {"code": authorization_code, "subject": SUBJECT})

    async def exchange_authorization_code(self, client: _Client, authorization_code: AuthorizationCode) -> OAuthToken:
        rec = self.store.consume_code(authorization_code.code)
        if rec is None or rec.client_id != client.client_id:
            raise TokenError("invalid_grant", "authorization code does not exist")
        try:  # in the code's family, so that a replay of this code revokes exactly these tokens
            return _oauth_token(self.store.issue_tokens(rec.client_id, rec.scopes, rec.resource, family=rec.family))
        except AuthError as e:
            raise TokenError("invalid_grant", "this grant was revoked; authorize again") from e

    async def load_refresh_token(self, client: _Client, refresh_token: str) -> RefreshToken | None:
        rec = self.store.load_refresh(refresh_token)  # a spent one comes back None and its family is revoked
        if rec is None or rec.client_id != client.client_id:
            return None
        return RefreshToken.model_validate(asdict(rec) | {"token": refresh_token, "subject": SUBJECT})

    async def exchange_refresh_token(self, client: _Client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        try:
            pair = self.store.rotate_refresh(refresh_token.token, scopes)
        except AuthError as e:
            raise TokenError("invalid_scope", f"ask for no more than the granted scopes {refresh_token.scopes}") from e
        if pair is None:
            raise TokenError("invalid_grant", "refresh token does not exist")
        return _oauth_token(pair)

    async def load_access_token(self, token: str) -> AccessToken | None:
        rec = self.store.load_access(token)
        if rec is None:
            return None
        self.store.touch_client(rec.client_id)
        claims = {"iss": self.public_url}
        return AccessToken.model_validate(asdict(rec) | {"token": token, "subject": SUBJECT, "claims": claims})

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.store.revoke_token(token.token)  # the whole family: both halves of the pair and every rotation


def _canonical_url(url: str) -> str:
    try:
        return str(AnyHttpUrl(url)).rstrip("/")
    except ValidationError:
        return url


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _offered_scopes(asked: list[str] | None) -> tuple[list[str], set[str]]:
    """(scopes the consent page offers, those pre-ticked): what the client asked for, or all three with read ticked."""
    if not asked:
        return list(SCOPES), {READ_SCOPE}
    return [s for s in SCOPES if s in asked or s == READ_SCOPE], {READ_SCOPE, *asked}


class _Pages:
    """GET/POST /login (passphrase + TOTP) and GET/POST /consent, bound to one parked request and one browser."""

    def __init__(self, provider: VaultOAuthProvider) -> None:
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

    def _check(self, request: Request, req: str, form: FormData | None = None, signed_in: bool = False) -> _Parked | Response:
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

    async def _client_name(self, parked: _Parked) -> str:
        client = await self.provider.get_client(parked.client_id)
        return html.escape((client.client_name if client else None) or parked.client_id)

    async def _login_page(self, req: str, parked: _Parked, csrf: str, error: str = "", status: int = 200) -> Response:
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


class _PathAlias:
    """Serve `path` under another route: /mcp/ answered as /mcp, not with Starlette's Host-built 307."""

    def __init__(self, app: Any, path: str) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app(dict(scope, path=self.path, raw_path=self.path.encode()), receive, send)


class _RequestHook:
    """Calls on_request(method, path, status, client_id) after each HTTP response (never with query or headers)."""

    def __init__(self, app: Any, on_request: Callable[[str, str, int, str | None], None]) -> None:
        self.app, self.on_request = app, on_request

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            user = scope.get("user")
            client_id = user.access_token.client_id if isinstance(user, AuthenticatedUser) else None
            self.on_request(scope["method"], scope["path"], status, client_id)


def _transport_security(public_url: str, allowed_hosts: Sequence[str]) -> TransportSecuritySettings:
    """Host/Origin checks on /mcp: the public host (with and without port) and `allowed_hosts`; loopback as the SDK."""
    parts = urlsplit(public_url)
    host = parts.hostname or ""
    if host in LOOPBACK_HOSTS:
        hosts, origins = list(LOOPBACK_ALLOWED_HOSTS), list(LOOPBACK_ALLOWED_ORIGINS)
    else:
        netloc = f"[{host}]" if ":" in host else host
        hosts = [parts.netloc, netloc if parts.port else f"{netloc}:443"]
        origins = [f"https://{parts.netloc}"]
    hosts += list(allowed_hosts)
    origins += [f"https://{h}" for h in allowed_hosts]
    return TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins)


def oauth_app(
    server: Any,
    store: AuthStore,
    public_url: str,
    host: str,
    allowed_hosts: Sequence[str] = (),
    on_request: Callable[[str, str, int, str | None], None] | None = None,
) -> Any:
    """The ASGI app: authorization server (metadata, /authorize, /token, /register, /revoke), resource metadata, our
    sign-in and consent pages, and `server`'s streamable HTTP endpoint at /mcp behind a bearer token with notes:read.

    Every URL it advertises is built from `public_url`, never from a request's Host. Raises ConfigError for a
    public_url that is not https (plain http is accepted on loopback hosts only).
    """
    provider = VaultOAuthProvider(store, public_url)
    public_url = provider.public_url
    # Strings, parsed by the model: a ready AnyHttpUrl renders "https://h/" and breaks the client's exact issuer check.
    urls = {"issuer_url": public_url, "resource_server_url": provider.resource}
    settings = AuthSettings.model_validate(urls | {"validate_token_resource": True})
    issuer_url, resource_url = settings.issuer_url, settings.resource_server_url
    assert resource_url is not None
    registration = ClientRegistrationOptions(enabled=True, valid_scopes=list(SCOPES), default_scopes=list(SCOPES))
    security = _transport_security(public_url, allowed_hosts)
    inner = server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=security, host=host)
    protected = RequireAuthMiddleware(inner, [READ_SCOPE], build_resource_metadata_url(resource_url))
    routes = [
        *create_auth_routes(
            provider, issuer_url, client_registration_options=registration, revocation_options=RevocationOptions(enabled=True)
        ),
        *create_protected_resource_routes(resource_url, [issuer_url], scopes_supported=list(SCOPES)),
        *_Pages(provider).routes(),
        # The inner app routes on scope["path"], which a plain Route leaves as "/mcp".
        Route(MCP_PATH, endpoint=protected),
        Route(MCP_PATH + "/", endpoint=_PathAlias(protected, MCP_PATH)),
    ]
    # BearerAuthBackend with resource_server_url refuses tokens issued for another resource (RFC 8707 audience).
    backend = BearerAuthBackend(ProviderTokenVerifier(provider), resource_server_url=resource_url)
    # Outside the inner app, so the session manager sees scope["user"] and binds each session to its client.
    middleware = [Middleware(AuthenticationMiddleware, backend=backend), Middleware(AuthContextMiddleware)]
    # The inner lifespan starts the session manager and the MCPServer's own lifespan.
    app = Starlette(routes=routes, middleware=middleware, lifespan=lambda _app: inner.router.lifespan_context(inner))
    return app if on_request is None else _RequestHook(app, on_request)


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
