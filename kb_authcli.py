"""`mcp_server.py auth ...`: set up the owner's sign-in (passphrase + TOTP) for server.auth: oauth, list and revoke the
clients it granted, read the audit log. A CLI (results on stdout, diagnostics on stderr), never run by the server.
Imports: kb_audit, kb_authstore, kb_config, kb_http.
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from kb_audit import format_record
from kb_authstore import MIN_PASSPHRASE_CHARS, AuthError, TotpSetup
from kb_config import Config, KBError
from kb_http import AUTH_INIT_COMMAND, MCP_PATH, auth_folder, open_audit, open_auth_store

# Records `auth log` shows by default.
DEFAULT_LOG_RECORDS = 20
# Characters per group when the TOTP secret is shown for typing by hand.
SECRET_GROUP_CHARS = 4
# The port the README's examples serve on.
EXAMPLE_PORT = 8765
# Added to every auth event this CLI causes, so `auth log` tells them from the server's.
CLI_CONTEXT = {"via": "cli"}

EPILOG = """examples:
  python mcp_server.py auth init                 # passphrase prompt; prints the QR code for your authenticator app
  echo "$PASSPHRASE" | python mcp_server.py auth init --reset   # from standard input; revokes every grant
  python mcp_server.py auth clients              # who holds access
  python mcp_server.py auth revoke 3f2a...       # one client must sign in again (at once, also in a running server)
  python mcp_server.py auth log -n 50            # the newest audit records

Common flags (--config, --kb-dir, -v, -q) go before or after `auth`, as for the server."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp_server.py auth",
        description="OAuth for server.auth: oauth (claude.ai and the Claude apps through an https tunnel): set the "
        "owner's passphrase and authenticator code, list and revoke the clients you let in, read the audit log.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    init = sub.add_parser(
        "init",
        help="set the passphrase and a new TOTP secret (shown once, with a QR code)",
        description="Set the owner's passphrase (at least 12 characters; prompted twice, or one line of standard input "
        "when it is not a terminal) and a new TOTP secret for an authenticator app, shown once as a QR code.",
    )
    init.add_argument(
        "--reset", action="store_true", help="replace existing credentials; revokes every client and token (default: off)"
    )
    clients = sub.add_parser("clients", help="list the registered clients", description="List the registered clients.")
    clients.add_argument("--json", action="store_true", help="print JSON instead of a table")
    revoke = sub.add_parser(
        "revoke",
        help="revoke one client, or --all",
        description="Remove a client with its tokens at once (a running server rereads the store on its next request); "
        "the client must register and sign in again.",
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("client_id", nargs="?", metavar="CLIENT_ID", help="a client id from `auth clients`")
    which.add_argument("--all", action="store_true", help="revoke every client (the passphrase and TOTP stay)")
    log = sub.add_parser("log", help="show the newest audit records", description="Show the newest audit records.")
    log.add_argument(
        "-n", type=int, default=DEFAULT_LOG_RECORDS, metavar="N", help=f"records to show (default: {DEFAULT_LOG_RECORDS})"
    )
    log.add_argument("--json", action="store_true", help="print the records as a JSON array")
    sub.add_parser("status", help="whether OAuth is set up, and where", description="Say whether OAuth is set up, and where.")
    sub.add_parser(
        "unlock",
        help="lift a sign-in lockout (5 failures in 15 min lock it for 15 min)",
        description="Lift a sign-in lockout now and forget the failed attempts (you, at this machine).",
    )
    return parser


def main(argv: list[str] | None, cfg: Config) -> int:
    """Run one `auth` command on the vault of `cfg`; 0 on success, 1 on a refusal (message on stderr)."""
    args = build_parser().parse_args(argv)
    run = {"init": _init, "clients": _clients, "revoke": _revoke, "log": _log, "status": _status, "unlock": _unlock}[args.command]
    try:
        return run(args, cfg)
    except KBError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, EOFError):  # Ctrl-C or Ctrl-D at the passphrase prompt
        print("\ncancelled; nothing changed", file=sys.stderr)
        return 1


# ---- init ------------------------------------------------------------------------------------------------------


def _init(args: argparse.Namespace, cfg: Config) -> int:
    store = open_auth_store(cfg, open_audit(cfg), **CLI_CONTEXT)  # a --reset's revocation goes to the audit log
    if not args.reset and store.is_initialised():
        print(
            f"error: OAuth is already set up for this vault ({store.path}). `auth init --reset` sets a new passphrase "
            "and TOTP secret and revokes every grant: each client (claude.ai, the phone apps) must sign in again.",
            file=sys.stderr,
        )
        return 1
    passphrase = _read_passphrase()
    setup = store.set_owner(passphrase, reset=args.reset, label=cfg.kb_dir.name or "vault")
    open_audit(cfg).record_auth("owner_set", reset=args.reset, **CLI_CONTEXT)
    _print_setup(setup, cfg, args.reset)
    return 0


def _read_passphrase() -> str:
    """From a prompt, asked twice, when standard input is a terminal; else its first line."""
    if not sys.stdin.isatty():
        line = sys.stdin.readline().rstrip("\r\n")
        if len(line) < MIN_PASSPHRASE_CHARS:
            raise AuthError(
                f"the passphrase on standard input is {len(line)} characters; give one line of at least "
                f"{MIN_PASSPHRASE_CHARS} characters"
            )
        return line
    while True:
        first = getpass.getpass(f"New passphrase (at least {MIN_PASSPHRASE_CHARS} characters): ")
        if len(first) < MIN_PASSPHRASE_CHARS:
            print(
                f"That is {len(first)} characters; use at least {MIN_PASSPHRASE_CHARS} (a few words work well).", file=sys.stderr
            )
            continue
        if getpass.getpass("The same passphrase again: ") == first:
            return first
        print("The two passphrases differ; start again.", file=sys.stderr)


def _qr_text(url: str) -> str | None:
    """The QR code of `url` drawn with block characters, or None (with a note on stderr) when it cannot be shown."""
    try:
        # qrcode (pure Python, no dependencies): a QR encoder is hundreds of lines of Reed-Solomon and masking rules.
        import qrcode
    except ImportError:
        print("(no QR code: the qrcode package is missing; pip install -r requirements.txt)", file=sys.stderr)
        return None
    qr = qrcode.QRCode(border=1)
    qr.add_data(url)
    out = io.StringIO()
    qr.print_ascii(out=out, invert=True)
    text = out.getvalue()
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        print(f"(no QR code: this terminal's encoding {encoding} has no block characters; type the secret)", file=sys.stderr)
        return None
    return text


def _print_setup(setup: TotpSetup, cfg: Config, reset: bool) -> None:
    grouped = " ".join(setup.secret_b32[i : i + SECRET_GROUP_CHARS] for i in range(0, len(setup.secret_b32), SECRET_GROUP_CHARS))
    print("OAuth sign-in is set up for this vault" + (" (every earlier grant was revoked)." if reset else "."))
    print("Add it to your authenticator app (any TOTP app: 1Password, Google Authenticator, Aegis, ...): scan the QR")
    print("code below, or enter the secret by hand. It is shown only now; keep this terminal's scrollback private.\n")
    qr = _qr_text(setup.url)
    if qr:
        print(qr)
    print(f"otpauth URL: {setup.url}")
    print(f"secret:      {grouped}\n")
    public = cfg.public_url or "https://notes.example.com"
    config = "config.yaml" if cfg.source == "defaults" else cfg.source
    steps = [
        f"In {config}, under server: set `auth: oauth` and `public_url: {public}` (your tunnel's https address)"
        + (" (already set)" if cfg.server_auth == "oauth" and cfg.public_url else ""),
        f"Start the server:   python mcp_server.py --transport http --port {EXAMPLE_PORT}",
        f"Start the tunnel:   cloudflared tunnel --url http://127.0.0.1:{EXAMPLE_PORT}   (or: tailscale funnel {EXAMPLE_PORT})",
        f"In claude.ai: Settings -> Connectors -> Add custom connector -> {public}{MCP_PATH}",
        "Sign in with the passphrase and the 6-digit code, choose the scopes; the Claude phone apps then have it too.",
        "Later: `auth clients`, `auth revoke CLIENT_ID`, `auth log` (README, OAuth section).",
    ]
    print("Next steps:")
    for i, step in enumerate(steps, 1):
        print(f"  {i}. {step}")


# ---- clients and revoke --------------------------------------------------------------------------------------


def _when(ts: float | None) -> str:
    return "never" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")


def _printable(text: str) -> str:
    # A client picks its own name at registration: no terminal escape sequences reach the owner's screen.
    return "".join(c if c.isprintable() else "?" for c in text)


def _clients(args: argparse.Namespace, cfg: Config) -> int:
    clients = open_auth_store(cfg).list_clients()
    if args.json:
        print(json.dumps([asdict(c) for c in clients], ensure_ascii=False, indent=2))
        return 0
    if not clients:
        print("no clients")
        return 0
    rows = [("CLIENT ID", "NAME", "SCOPES", "CREATED", "LAST USED")]
    for c in clients:
        scopes = " ".join(c.scopes) or "-"
        rows.append((c.client_id, _printable(c.client_name or "-"), scopes, _when(c.created_at), _when(c.last_used_at)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _revoke(args: argparse.Namespace, cfg: Config) -> int:
    store = open_auth_store(cfg, open_audit(cfg), **CLI_CONTEXT)
    if args.all:
        count = store.revoke_all()
        print(f"revoked {count} client(s) and every token; the passphrase and TOTP stay (`auth init --reset` replaces them)")
        return 0
    if not store.revoke_client(args.client_id):
        print(f"error: no client {_printable(args.client_id)!r} is registered; `auth clients` lists them", file=sys.stderr)
        return 1
    print(f"revoked client {args.client_id} and its tokens; it must sign in again")
    return 0


# ---- log and status ------------------------------------------------------------------------------------------


def _log(args: argparse.Namespace, cfg: Config) -> int:
    if args.n < 1:
        print(f"error: -n must be at least 1 (got {args.n})", file=sys.stderr)
        return 1
    records = open_audit(cfg).tail(args.n)
    if args.json:
        print(json.dumps(records, ensure_ascii=False, indent=2))
    elif not records:
        print(f"no audit records yet (in {auth_folder(cfg)})")
    else:
        for rec in records:
            print(format_record(rec))
    return 0


def _unlock(args: argparse.Namespace, cfg: Config) -> int:
    store = open_auth_store(cfg, open_audit(cfg), **CLI_CONTEXT)
    print("sign-in unlocked" if store.unlock_login() else "sign-in was not locked; failed attempts forgotten")
    return 0


def _status(args: argparse.Namespace, cfg: Config) -> int:
    store = open_auth_store(cfg)
    locked_s = store.login_locked_for()
    info: dict[str, Any] = {
        "initialised": store.is_initialised(),
        "store": str(store.path),
        "server.auth": cfg.server_auth,
        "server.public_url": cfg.public_url or "(unset)",
        "connector URL": cfg.public_url.rstrip("/") + MCP_PATH if cfg.public_url else "(set server.public_url)",
        "clients": len(store.list_clients()),
        "sign-in": f"locked for {-(-locked_s // 60)} more min (`auth unlock` lifts it)" if locked_s else "open",
    }
    for key, value in info.items():
        print(f"{key + ':':<19} {value}")
    if not info["initialised"]:
        print(f"run `{AUTH_INIT_COMMAND}` to set the passphrase and TOTP")
    return 0
