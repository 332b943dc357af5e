#!/usr/bin/env bash
# Register the second-brain MCP server (stdio) with Claude Code via `claude mcp add`.
#
# Usage: ./register_mcp.sh [PYTHON] [--config PATH] [--scope local|user|project]
#
#   PYTHON          interpreter that runs mcp_server.py from this clone (default: the installed
#                   `second-brain-mcp` command if it is on PATH, else .venv/bin/python beside this
#                   script if it exists, else python3, else python)
#   --config PATH   config file the server reads (default: $KB_CONFIG, else config.yaml beside the scripts,
#                   created from config.example.yaml on first run)
#   --scope SCOPE   user (default: every project), local (only the current folder, private to you) or
#                   project (writes .mcp.json in the current folder, to share with the team)
#
# The server name is read through kb_config (server.name / KB_SERVER_NAME), so it matches what the server
# reports. Re-running replaces an existing registration of that name in that scope. Without the `claude` CLI
# it prints a JSON snippet for Claude Desktop, Cursor and other MCP clients instead, and exits 0.
#
# Exit codes: 0 registered (or snippet printed), 1 python or `claude mcp add` failed, 2 usage error.

set -u

# Claude Code's own default is "local"; notes are useful in every project, so we default to "user".
DEFAULT_SCOPE="user"
FALLBACK_NAME="second-brain"

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
SERVER_PY="$REPO_DIR/mcp_server.py"

usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die_usage() {
    echo "error: $1" >&2
    echo "run '$0 --help' for usage" >&2
    exit 2
}

# Absolute path without resolving symlinks: a venv's python is a symlink and must stay one.
abs_path() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$PWD/${1#./}" ;;
    esac
}

PY=""
CONFIG="${KB_CONFIG:-}"
SCOPE="$DEFAULT_SCOPE"
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --config) [ $# -ge 2 ] || die_usage "--config needs a path"; CONFIG="$2"; shift 2 ;;
        --config=*) CONFIG="${1#--config=}"; shift ;;
        --scope|-s) [ $# -ge 2 ] || die_usage "--scope needs local, user or project"; SCOPE="$2"; shift 2 ;;
        --scope=*) SCOPE="${1#--scope=}"; shift ;;
        -*) die_usage "unknown option '$1'" ;;
        *) [ -z "$PY" ] || die_usage "only one PYTHON may be given (got '$PY' and '$1')"; PY="$1"; shift ;;
    esac
done

case "$SCOPE" in
    local|user|project) ;;
    *) die_usage "--scope must be local, user or project (got '$SCOPE')" ;;
esac

# ---- python --------------------------------------------------------------------------------------------------
# An installed command (pipx install .) is registered as itself; its console script names its interpreter.
INSTALLED=""
if [ -z "$PY" ] && INSTALLED="$(command -v second-brain-mcp 2>/dev/null)" && [ -n "$INSTALLED" ]; then
    INSTALLED="$(abs_path "$INSTALLED")"
    PY="$(head -n 1 "$INSTALLED" | sed -n 's/^#! *//p' | cut -d' ' -f1)"
    [ -x "$PY" ] || { echo "error: cannot find the interpreter of '$INSTALLED'; reinstall it or pass PYTHON" >&2; exit 1; }
fi
if [ -z "$PY" ]; then
    if [ -x "$REPO_DIR/.venv/bin/python" ]; then
        PY="$REPO_DIR/.venv/bin/python"
    elif command -v python3 >/dev/null 2>&1; then
        PY="$(command -v python3)"
    elif command -v python >/dev/null 2>&1; then
        PY="$(command -v python)"
    else
        echo "error: no python found; create the venv (python3 -m venv .venv && .venv/bin/pip install -r requirements.txt) or pass PYTHON" >&2
        exit 1
    fi
fi
case "$PY" in
    */*) PY="$(abs_path "$PY")" ;;
    *) command -v "$PY" >/dev/null 2>&1 || { echo "error: python '$PY' is not on PATH; pass a path to the interpreter" >&2; exit 1; }
       PY="$(command -v "$PY")" ;;
esac
if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    echo "error: cannot run python '$PY'; pass a working interpreter, e.g. $0 /path/to/venv/bin/python" >&2
    exit 1
fi
# Installed, not imported: importing mcp takes over a second.
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("mcp") and u.find_spec("yaml")))' >/dev/null 2>&1; then
    echo "warning: '$PY' has no mcp or yaml installed, so the server will not start; install the requirements:" >&2
    echo "  \"$PY\" -m pip install -r \"$REPO_DIR/requirements.txt\"" >&2
fi

# ---- config file ---------------------------------------------------------------------------------------------
# KB_CONFIG is passed on as --config: Claude Code starts the server without this shell's environment.
if [ -n "$CONFIG" ]; then
    case "$CONFIG" in "~/"*) CONFIG="$HOME/${CONFIG#\~/}" ;; esac
    CONFIG="$(abs_path "$CONFIG")"
    [ -f "$CONFIG" ] || die_usage "config file '$CONFIG' does not exist; pass an existing file or omit --config"
fi

# ---- server name, through the project's own config loader -----------------------------------------------------
# load_cli_config is what mcp_server.py calls, so the name matches; it creates config.yaml on first run.
NAME_ERR="$(mktemp "${TMPDIR:-/tmp}/register_mcp.XXXXXX")"
# From a clone it runs in the clone (its kb_config); installed, in the current folder with the installed modules.
LOOKUP_DIR="$REPO_DIR"
[ -n "$INSTALLED" ] && LOOKUP_DIR="$PWD"
LOOKUP="$(cd "$LOOKUP_DIR" && "$PY" -c '
import sys
from pathlib import Path
from types import SimpleNamespace
try:
    from kb_config import load_cli_config
    path = Path(sys.argv[1]) if sys.argv[1] else None
    cfg = load_cli_config(SimpleNamespace(config=path, kb_dir=None))
    print(cfg.server_name)
    print(cfg.source)
except Exception as e:  # the message is enough here; the traceback would bury it
    sys.exit(f"{type(e).__name__}: {e}")
' "$CONFIG" 2>"$NAME_ERR")"
NAME_RC=$?
NAME="$(printf '%s\n' "$LOOKUP" | sed -n 1p)"
SOURCE="$(printf '%s\n' "$LOOKUP" | sed -n 2p)"
# Claude Code starts servers in the project folder: pin the config an installed command found here.
if [ -n "$INSTALLED" ] && [ -z "$CONFIG" ] && [ -n "$SOURCE" ] && [ "$SOURCE" != "defaults" ]; then
    CONFIG="$SOURCE"
fi
if [ $NAME_RC -ne 0 ] || [ -z "$NAME" ]; then
    echo "warning: could not read server.name through kb_config; using '$FALLBACK_NAME'. The loader said:" >&2
    sed 's/^/  /' "$NAME_ERR" >&2
    echo "  (the server will probably fail to start too: fix the config, then run this script again)" >&2
    NAME="$FALLBACK_NAME"
else
    cat "$NAME_ERR" >&2  # e.g. "created config.yaml from config.example.yaml"
fi
rm -f "$NAME_ERR"

if [ -n "$INSTALLED" ]; then
    CMD="$INSTALLED"
    SERVER_ARGS=()
else
    CMD="$PY"
    SERVER_ARGS=("$SERVER_PY")
fi
[ -n "$CONFIG" ] && SERVER_ARGS+=("--config" "$CONFIG")

# Shell-quoted, so a path with spaces can be pasted back into a terminal.
SHOWN_CMD="$(printf '%q ' "$CMD" ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"})"
echo "server name: $NAME"
echo "command:     $SHOWN_CMD"

# ---- without claude: print a snippet for other clients --------------------------------------------------------
if ! command -v claude >/dev/null 2>&1; then
    echo
    echo "The 'claude' CLI (Claude Code) is not on PATH, so nothing was registered."
    echo "Install it with:  npm install -g @anthropic-ai/claude-code   then run this script again."
    echo
    echo "For Claude Desktop, Cursor or another MCP client, add this to its MCP config (mcpServers):"
    echo
    "$PY" -c '
import json, sys
print(json.dumps({"mcpServers": {sys.argv[1]: {"command": sys.argv[2], "args": sys.argv[3:]}}}, indent=2, ensure_ascii=False))
' "$NAME" "$CMD" ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"}
    exit 0
fi

# ---- register ------------------------------------------------------------------------------------------------
# Remove first so re-running is idempotent ("already exists" otherwise); a missing entry is not an error.
if claude mcp remove "$NAME" --scope "$SCOPE" >/dev/null 2>&1; then
    echo "replaced the existing '$NAME' registration ($SCOPE scope)"
fi
if ! claude mcp add --scope "$SCOPE" "$NAME" -- "$CMD" ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"}; then
    echo "error: 'claude mcp add' failed (see above); nothing was registered" >&2
    exit 1
fi

echo
echo "claude mcp list:"
if ! claude mcp list; then
    echo "hint: 'claude mcp list' failed; the registration is saved. Check it with: claude mcp get $NAME" >&2
fi
echo
if [ "$SCOPE" = "project" ]; then
    echo "Project-scoped servers show 'Pending approval' until you start 'claude' in this folder and approve them."
fi
echo "If '$NAME' is not Connected, test the server by hand:  $SHOWN_CMD--search test"
exit 0
