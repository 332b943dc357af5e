"""What one tool call's client may see and do, and what its reply and its audit line carry: the owner (stdio, a shared
server's sessions, HTTP with the static token) sees every note; an OAuth client what its scopes grant (notes:read,
notes:append, notes:private), its replies with secrets masked (server.redact).

Pure: an access token's scopes in, an Access out; replies in, masked replies out. Imports: kb_filter, kb_redact.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from kb_filter import PrivateNotes
from kb_redact import redact

# The scopes an OAuth client may hold (kb_oauth offers them on its consent page).
SCOPE_READ, SCOPE_APPEND, SCOPE_PRIVATE = "notes:read", "notes:append", "notes:private"
OWNER_SCOPES = frozenset({SCOPE_READ, SCOPE_APPEND, SCOPE_PRIVATE})
# Note paths an audit line lists from one reply, at most (kb_audit cuts too).
MAX_AUDIT_PATHS = 50


@dataclass(frozen=True)
class Access:
    """One tool call's caller: `client_id` None for the owner; `private` the notes it must not see (None: it sees
    every note); `redact` whether its replies are masked."""

    client_id: str | None
    scopes: frozenset[str]
    private: PrivateNotes | None
    redact: bool

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


def access_of(client_id: str | None, scopes: Collection[str] | None, private: PrivateNotes, redact_mode: str) -> Access:
    """The Access of a call made with an OAuth token of `client_id` holding `scopes`, or (client_id None) by the owner.

    Example: access_of("c1", ["notes:read"], PrivateNotes.of(["Private/**"]), "remote").private -> the rule
    """
    if client_id is None:
        return Access(None, OWNER_SCOPES, None, redact_mode == "always")
    held = frozenset(scopes or ())
    return Access(client_id, held, None if SCOPE_PRIVATE in held else private, redact_mode != "never")


def redact_reply(text: str, data: Any, mask: Callable[[str], str] = redact) -> tuple[str, Any]:
    """A reply's text and structured content with every string masked (dict keys are the tools' own names)."""
    return mask(text), _masked(data, mask)


def _masked(value: Any, mask: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {k: _masked(v, mask) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v, mask) for v in value]
    return value


def reply_paths(data: Any) -> list[str]:
    """The note paths a reply's structured content names (its `path` and `translation` fields, at any depth), in
    order, without repeats: what an audit line records."""
    found: dict[str, None] = {}

    def walk(value: Any) -> None:
        if len(found) >= MAX_AUDIT_PATHS:
            return
        if isinstance(value, dict):
            for key in ("path", "translation"):
                if isinstance(value.get(key), str) and value[key]:
                    found.setdefault(value[key], None)
            for v in value.values():
                if isinstance(v, (dict, list)):
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(data)
    return list(found)[:MAX_AUDIT_PATHS]
