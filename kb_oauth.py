"""OAuth 2.1 in front of MCP over streamable HTTP: the SDK's authorization-server routes and bearer middleware, driven by
a provider over kb_authstore, with the owner's sign-in (passphrase + TOTP) and consent pages (kb_oauth_pages) in
between. Imports: kb_authstore, kb_config, kb_oauth_pages.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode, urlsplit

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
)
from mcp.server.auth.routes import build_resource_metadata_url, create_auth_routes, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
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
from kb_oauth_pages import LOGIN_PATH, PARKED_TTL_S, RANDOM_BYTES, READ_SCOPE, SCOPES, Parked, SignInPages

logger = logging.getLogger(__name__)
_Client = OAuthClientInformationFull  # a registered client, as the SDK hands it to the provider

# The one resource owner of a personal vault: the `sub` of every token.
SUBJECT = "owner"
# The MCP endpoint (the protected resource).
MCP_PATH = "/mcp"
# RFC 9728 protected-resource metadata without the resource's path: the same document as at the suffixed URL.
RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource"
# At most this many /authorize requests wait at once (the oldest is dropped).
MAX_PARKED = 200
# The SDK's own DNS-rebinding defaults for a loopback server.
LOOPBACK_ALLOWED_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ALLOWED_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
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
        self._parked: dict[str, Parked] = {}

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
        self._parked[req] = Parked(str(client.client_id), params, now + PARKED_TTL_S)
        return f"{self.public_url}{LOGIN_PATH}?{urlencode({'req': req})}"

    def parked(self, req: str) -> Parked | None:
        """The parked request `req`, unless unknown or expired."""
        found = self._parked.get(req)
        return found if found is not None and found.expires_at > self._now() else None

    def take_parked(self, req: str) -> Parked | None:
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
    # At /.well-known/oauth-protected-resource/mcp (the SDK's route), and at the plain URL for clients that look there.
    resource_metadata = create_protected_resource_routes(resource_url, [issuer_url], scopes_supported=list(SCOPES))
    resource_metadata += [Route(RESOURCE_METADATA_PATH, r.endpoint, methods=r.methods) for r in resource_metadata]
    routes = [
        *create_auth_routes(
            provider, issuer_url, client_registration_options=registration, revocation_options=RevocationOptions(enabled=True)
        ),
        *resource_metadata,
        *SignInPages(provider).routes(),
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
