"""MCP over streamable HTTP (`--transport http`): the SDK's own transport at /mcp behind a bearer token, or, with
server.auth: oauth, behind kb_oauth's OAuth 2.1 server (claude.ai and the phone apps, through an https tunnel).

Token mode: every request needs `Authorization: Bearer <token>` (compared in constant time, never logged); without a
token the server does not start, and it never binds a non-loopback address without one. The SDK's DNS-rebinding
protection checks Host and Origin. OAuth mode: refuses to start before `auth init` or without an https public_url; the
store and the audit log of a vault live in auth_folder(cfg).
Imports: kb_config, kb_files, kb_audit, kb_authstore, kb_redact; lazily: kb_oauth.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb_audit import AuditLog
from kb_authstore import AuthStore
from kb_config import CONFIG_FILE_NAME, DEFAULT_CONFIG_FILE, Config, ConfigError
from kb_files import atomic_write_text
from kb_redact import redact

logger = logging.getLogger(__name__)

# Where --print-token stores a generated token (user-only permissions), under data_dir.
TOKEN_FILE = "server-token"
# Bytes of randomness in a generated token (URL-safe base64: 43 characters).
TOKEN_BYTES = 32
# The path clients connect to.
MCP_PATH = "/mcp"
# Host names that only this machine can reach.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# server.auth: oauth keeps each vault's OAuth store and audit log in data_dir/AUTH_DIR/<index folder name>.
AUTH_DIR = "auth"
# What the OAuth refusals tell the owner to run.
AUTH_INIT_COMMAND = "python mcp_server.py auth init"
# Longest request path the OAuth server's request log shows.
LOG_PATH_CHARS = 200


def token_path(cfg: Config) -> Path:
    return cfg.data_dir / TOKEN_FILE


def configured_token(cfg: Config) -> tuple[str, str] | None:
    """(token, where it came from): server.token / KB_SERVER_TOKEN, else the file --print-token wrote; else None."""
    if cfg.server_token:
        return cfg.server_token, "server.token"
    path = token_path(cfg)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read the server token file {path} ({e.strerror}); fix its permissions") from e
    return (token, str(path)) if token else None


def create_token(cfg: Config) -> tuple[str, Path]:
    """The stored token, generating one on first use (file mode 0600)."""
    existing = configured_token(cfg)
    if existing and existing[1] != "server.token":
        return existing[0], token_path(cfg)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    path = token_path(cfg)
    atomic_write_text(path, token + "\n", mode=0o600)
    return token, path


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve without a token, with a message saying why and what to do."""
    if token:
        return
    where = "a non-loopback address" if host not in LOOPBACK_HOSTS else host
    raise ConfigError(
        f"refusing to serve MCP over HTTP on {where} without a token: anyone who can reach the port could read and "
        "append to your notes. Run `second-brain-mcp --print-token` (or python mcp_server.py --print-token) to "
        "create one, or set server.token / KB_SERVER_TOKEN"
    )


class BearerTokenMiddleware:
    """ASGI middleware: 401 unless the request carries `Authorization: Bearer <token>` (constant-time compare)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode("utf-8")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(credential.strip(), self._token):
            logger.info("refused an HTTP request without a valid token from %s", (scope.get("client") or ("?",))[0])
            body = b'{"error": "unauthorized: send Authorization: Bearer <token> (see second-brain-mcp --print-token)"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="second-brain-mcp"'),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def http_app(server: Any, cfg: Config, host: str, token: str) -> Any:
    """The SDK's streamable HTTP app for `server` (an MCPServer) behind the token check."""
    from mcp.server.transport_security import TransportSecuritySettings

    security = None  # loopback: the SDK protects against DNS rebinding with its own localhost rules
    if host not in LOOPBACK_HOSTS:
        if cfg.allowed_hosts:
            origins = [f"http://{h}" for h in cfg.allowed_hosts] + [f"https://{h}" for h in cfg.allowed_hosts]
            security = TransportSecuritySettings(allowed_hosts=list(cfg.allowed_hosts), allowed_origins=origins)
        else:
            logger.info("DNS-rebinding checks are off for %s (no server.allowed_hosts); the bearer token guards it", host)
            security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=security, host=host)
    return BearerTokenMiddleware(app, token)


def auth_folder(cfg: Config) -> Path:
    """The vault's OAuth store and audit log: beside the index folder, not in it, so `ingest.py --rebuild` keeps grants."""
    return cfg.data_dir / AUTH_DIR / cfg.index_dir.name


def open_audit(cfg: Config) -> AuditLog:
    """The vault's audit log (auth events and tool calls over HTTP), every string masked by kb_redact."""
    return AuditLog(auth_folder(cfg), mask=redact)


def open_auth_store(cfg: Config, audit: AuditLog | None = None, **context: Any) -> AuthStore:
    """The vault's OAuth store; its events (logins, registrations, revocations) go to `audit` with `context` added."""
    if audit is None:
        return AuthStore(auth_folder(cfg))
    return AuthStore(auth_folder(cfg), on_event=lambda event, detail: audit.record_auth(event, **(detail | context)))


def client_names(cfg: Config) -> Callable[[str], str | None]:
    """client id -> the name it registered with (None when unknown), for the audit log's tool lines."""
    store = open_auth_store(cfg)
    return lambda client_id: (store.get_client(client_id) or {}).get("client_name")


def check_oauth(cfg: Config) -> str:
    """Refuse OAuth serving without an https server.public_url (http on loopback only) or before `auth init`;
    returns the normalised public URL."""
    from kb_oauth import check_public_url

    if not cfg.public_url:
        raise ConfigError(
            f"server.auth is oauth but server.public_url is empty (config {cfg.source}); set it to the https address "
            "clients reach, your tunnel's, e.g. https://notes.example.com (or KB_SERVER_PUBLIC_URL)"
        )
    public_url = check_public_url(cfg.public_url)
    store = open_auth_store(cfg)
    if not store.is_initialised():
        default = cfg.source in ("defaults", str(DEFAULT_CONFIG_FILE), str(Path.cwd() / CONFIG_FILE_NAME))
        config = "" if default else f" --config {cfg.source}"
        raise ConfigError(
            f"server.auth is oauth but no owner passphrase is set for this vault (in {store.folder}); "
            f"run `{AUTH_INIT_COMMAND}{config}` first"
        )
    return public_url


def _log_request(method: str, path: str, status: int, client_id: str | None) -> None:
    """The OAuth server's request log: no query strings or headers (they may carry codes); refusals at INFO."""
    shown = "".join(c if c.isprintable() else "?" for c in path[:LOG_PATH_CHARS])
    who = f" (client {client_id[:8]})" if client_id else ""
    logger.log(logging.INFO if status >= 400 else logging.DEBUG, "%s %s -> %d%s", method, shown, status, who)


def oauth_http_app(server: Any, cfg: Config, host: str) -> tuple[Any, str]:
    """kb_oauth's app for `server` over this vault's store, auth events to its audit log; returns (app, public URL)."""
    from kb_oauth import oauth_app

    public_url = check_oauth(cfg)
    store = open_auth_store(cfg, open_audit(cfg))
    app = oauth_app(server, store, public_url, host, cfg.allowed_hosts, on_request=_log_request)
    return app, public_url


def serve_http(server: Any, cfg: Config, host: str, port: int) -> None:
    """Serve until interrupted: several client sessions at once, one process, one index."""
    import uvicorn

    if cfg.server_auth == "oauth":
        app, public_url = oauth_http_app(server, cfg, host)
        if host not in LOOPBACK_HOSTS:
            logger.warning("OAuth server bound to %s: clients reaching it there bypass the tunnel's https", host)
        logger.info(
            "serving MCP with OAuth at http://%s:%d for %s; connector URL: %s%s", host, port, public_url, public_url, MCP_PATH
        )
        # proxy_headers off: nothing is built from X-Forwarded-*, and every tunnel connects from loopback anyway.
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", proxy_headers=False)
        uvicorn.Server(config).run()
        return
    found = configured_token(cfg)
    check_bind(host, found[0] if found else None)
    assert found is not None
    logger.info("serving MCP over streamable HTTP at http://%s:%d%s (token from %s)", host, port, MCP_PATH, found[1])
    config = uvicorn.Config(http_app(server, cfg, host, found[0]), host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()
