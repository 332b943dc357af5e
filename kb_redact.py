"""Masks secrets (provider keys, tokens, passwords, private keys, URL credentials) in text sent to remote clients and
the audit log: `redact(text)` -> text with each secret replaced by `[redacted: KIND]`.
Pure: strings in, strings out. Imports: nothing from the project (standard library only: re, string).

What counts as a secret (four precompiled scans, each starting at a literal; every run is bounded or possessive):
1. Provider formats with a fixed prefix (gitleaks' rules): Anthropic, OpenAI, GitHub, AWS key ids, Google, Slack, Stripe,
   JWTs, Slack webhook URLs, PEM private key blocks. A token must start a word: one inside a longer word or a base64
   run (a `data:` image) is not one. Prefixes that also begin ordinary words (`sk-`, `xox?-`) need a random-looking
   body: an upper case letter, a lower case letter and a digit ("sk-learn-style-names" stays).
2. A value assigned to a secret-named key: the key is one identifier (`DB_PASSWORD`, `"apiKey"`, `x-api-key`, `密码`)
   ending in a secret word, then `=`, `:`, `:=`, `=>`, `：`, `＝` or a table's `|`. Only the value is masked, and only if
   it looks like a secret: >= MIN_SECRET_CHARS long, no placeholder marker (`<..>`, `${`, `{{`, `xxxx`, `***`, `...`,
   "example", "changeme", "your", ...), not a plain number (except for password keys: a PIN is a password), and not a
   reference: `$VAR`, a call or subscript (`os.environ[...]`, `getenv(...)`), a path (`~/.ssh/id_rsa`), a URL without
   credentials (where the secret lives; a token in its query is its own assignment), or, unquoted, a bare word of
   letters and `_.-` (`api_key`, `None`, `settings.token`). A quoted letters-only literal counts unless it names a
   secret itself (`"password"`, `"OPENAI_API_KEY"`). Unquoted values are ASCII runs, so Chinese prose after `=` is
   never a value; `密码学 = ...` has no key (the secret word must end the key).
3. The password of a URL (`scheme://user:PASSWORD@host`), and the token after `Bearer`, unless a placeholder.
Provider kinds win: `api_key = "sk-ant-..."` is masked as `anthropic key`. Overlapping finds are masked as one.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

# What a masked secret becomes.
MASK = "[redacted: {kind}]"
# Shortest value assigned to a secret-named key that counts (shorter ones are examples, counts or flags).
MIN_SECRET_CHARS = 8
# Longest assigned value examined; longer runs are no single secret (provider patterns still match inside them).
MAX_VALUE_CHARS = 512

# Provider formats, in priority order (Anthropic before OpenAI: both start with `sk-`). Each alternative starts with a
# literal character, so the regex engine skips ahead to candidate characters instead of trying every position.
PROVIDERS = [
    ("anthropic key", r"sk-ant-[a-z]{2,10}\d\d-[A-Za-z0-9_-]{32,}+"),
    ("openai key", r"sk-[A-Za-z0-9_-]{32,}+"),
    ("github token", r"gh[pousr]_[A-Za-z0-9]{36,}+|github_pat_[A-Za-z0-9_]{40,}+"),
    ("aws key", r"A(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("google key", r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"),
    ("slack token", r"xox[abposr]-[A-Za-z0-9-]{10,}+|xapp-\d-[A-Za-z0-9-]{10,}+"),
    ("stripe key", r"sk_(?:live|test)_[A-Za-z0-9]{16,}+|rk_(?:live|test)_[A-Za-z0-9]{16,}+|whsec_[A-Za-z0-9]{24,}+"),
    ("jwt", r"eyJ[A-Za-z0-9_-]{8,}+\.ey[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+"),
]
# Kinds whose prefix also starts ordinary words, so their body must look random.
LOOSE_PREFIX_KINDS = {"openai key", "slack token"}
# Characters a provider token may not follow: it would be the tail of a longer word or of a base64 run.
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "_+/-")
# The secret words a key may end with, lower case (keys are matched in lower-cased text); bare `pass` only as its own
# segment (not "bypass"). Each alternative starts with a literal, for the same fast skip as PROVIDERS.
KEY_WORDS = (
    r"pass(?:word|wd|phrase)|pass(?<![a-z]pass)|pwd|secret[_.-]?access[_.-]?key|api[_.-]?key|access[_.-]?key"
    r"|auth[_.-]?key|secret[_.-]?key|private[_.-]?key|secret|token|密码|口令|密钥|秘钥|私钥|令牌"
)
# Secret words (lower case without `_.-`, by prefix) naming each kind of key; the rest (api/access/auth key) are "api key".
KEY_KINDS = [
    (("pass", "pwd", "密码", "口令"), "password"),
    (("secretaccess",), "aws secret"),  # AWS's name, kept by S3-compatible stores
    (("secret", "密钥", "秘钥"), "secret"),
    (("private", "私钥"), "private key"),
    (("token", "令牌"), "token"),
]

_V = MAX_VALUE_CHARS
_UNQUOTED = r"""[^\s"'`|\x80-\U0010ffff]"""  # ASCII, not a quote or a table bar
_PEM_END = r"-----END[A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----"
# A PEM block: the body never holds "-----"; a block cut off before its END loses its base64 lines.
_PEM = re.compile(
    rf"-----BEGIN[A-Z0-9 ]{{0,40}}?PRIVATE KEY(?: BLOCK)?-----(?:(?:[^-]++|-(?!----))*+{_PEM_END}"
    r"|(?:\r?\n[ \t]*[A-Za-z0-9+/=]{16,}+)*+)"
)
_TOKEN = re.compile(
    "|".join(pattern for _, pattern in PROVIDERS)
    + r"|https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<hook>[A-Za-z0-9_/+-]{20,}+)"
    + r"|://(?<=[A-Za-z0-9]://)[^\s:/@]{0,256}+:(?P<url>[^\s/@]{1,256}+)@"
)
_BEARER = re.compile(rf"[Bb]earer[ \t]++(?P<val>[A-Za-z0-9._~+/-]{{{MIN_SECRET_CHARS},{_V}}}+=*+)")
_ASSIGN = re.compile(
    rf"(?P<word>{KEY_WORDS})(?![\w.-])[\"'`]?[ \t]*(?:\*\*)?[ \t]*(?::=|=>|=|:|：|＝|\|)[ \t]*(?:\*\*|__)?[ \t]*"
    r"(?P<scheme>bearer[ \t]+)?"
    rf"(?P<val>\"[^\"\n]{{0,{_V}}}+\"|'[^'\n]{{0,{_V}}}+'|`[^`\n]{{0,{_V}}}+`|{_UNQUOTED}{{1,{_V}}}+(?!{_UNQUOTED}))"
)
_PROVIDER_FULL = re.compile("|".join(f"(?P<p{i}>{pattern})" for i, (_, pattern) in enumerate(PROVIDERS)))
_PLACEHOLDER = re.compile(
    r"<[^<>\n]*>|\$\{|\{\{|%\(|\[redacted|\*{3}|\.{3}|…|(?i:x{4}|example|changeme|change_me|placeholder|your|dummy|redacted)"
)
_REFERENCE = re.compile(r"\$\w+|[A-Za-z_][\w.]*[(\[].*|(?:~|\.{1,2}|/[A-Za-z][a-z]+)/[\w./-]*|[A-Za-z][\w+.-]*://[^@\s]*")
_NUMBER = re.compile(r"[+-]?\d[\d.,:_/ -]*")
_WORD = re.compile(r"[A-Za-z_.-]+")
_KEY_WORD = re.compile(KEY_WORDS)
_QUOTES = "\"'`"
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_NO_SEPARATORS = str.maketrans("", "", "_.-")
_PROSE_TAIL = ".,;)]}"  # closes a sentence or bracket around an unquoted value, not part of it

Span = tuple[int, int, str | None]  # start, end, kind (None: not a secret)
Judge = Callable[[re.Match[str], str], Span]  # (match, original text) -> span


def _random_looking(body: str) -> bool:
    return any(c.isupper() for c in body) and any(c.islower() for c in body) and any(c.isdigit() for c in body)


def _provider_kind(value: str) -> str | None:
    """The provider kind of a whole value (`sk-ant-...` -> "anthropic key"), or None."""
    m = _PROVIDER_FULL.fullmatch(value)
    if not m or _PLACEHOLDER.search(value):
        return None
    kind = PROVIDERS[int(m.lastgroup[1:])][0]
    return None if kind in LOOSE_PREFIX_KINDS and not _random_looking(value) else kind


def _names_secret(value: str) -> bool:
    """A bare word that names a secret instead of holding one: "password", "OPENAI_API_KEY"."""
    return bool(_WORD.fullmatch(value) and _KEY_WORD.search(value.lower()))


def _looks_secret(value: str, *, quoted: bool, numbers_count: bool) -> bool:
    """Whether a value assigned to a secret-named key (or sent as a bearer token) holds a secret (rules in the docstring)."""
    if len(value) < MIN_SECRET_CHARS or _PLACEHOLDER.search(value) or _REFERENCE.fullmatch(value):
        return False
    if _NUMBER.fullmatch(value):
        return numbers_count
    return not _names_secret(value) if quoted else not _WORD.fullmatch(value)


def _key_kind(word: str) -> str:
    word = word.lower().translate(_NO_SEPARATORS)
    return next((kind for prefixes, kind in KEY_KINDS if word.startswith(prefixes)), "api key")


def _judge_pem(m: re.Match[str], text: str) -> Span:
    return m.start(), m.end(), "private key"


def _judge_token(m: re.Match[str], text: str) -> Span:
    if m["hook"]:
        return *m.span("hook"), "slack webhook"
    if m["url"]:
        value = m["url"]
        masked = not (_PLACEHOLDER.search(value) or _REFERENCE.fullmatch(value) or _names_secret(value))
        return *m.span("url"), "url credentials" if masked else None
    inside_word = m.start() > 0 and text[m.start() - 1] in TOKEN_CHARS
    return m.start(), m.end(), None if inside_word else _provider_kind(m[0])


def _judge_bearer(m: re.Match[str], text: str) -> Span:
    start, end = m.span("val")
    if m.start() > 0 and (text[m.start() - 1].isalnum() or text[m.start() - 1] in "_-"):
        return start, end, None
    value = m["val"]
    kind = _provider_kind(value) or ("bearer token" if _looks_secret(value, quoted=False, numbers_count=False) else None)
    return start, end, kind


def _judge_assign(m: re.Match[str], text: str) -> Span:
    """Judges a match found in lower-cased text: the value is read from the original."""
    start, end = m.span("val")
    value = text[start:end]
    quoted = value[0] in _QUOTES
    if quoted:
        value, start, end = value[1:-1], start + 1, end - 1
    else:
        trimmed = value.rstrip(_PROSE_TAIL)
        value, end = trimmed, end - (len(value) - len(trimmed))
    kind = _provider_kind(value)
    if kind is None:
        key_kind = _key_kind(m["word"])
        if not _looks_secret(value, quoted=quoted, numbers_count=key_kind == "password"):
            return start, end, None
        kind = "bearer token" if m["scheme"] else key_kind
    return start, end, kind


# Each scan: a pattern whose first character is a literal or a small set (fast to skip to), its judge, and whether it
# reads lower-cased text (case-insensitive keys without re.IGNORECASE, which is 3x slower and widens negated classes).
SCANS: list[tuple[re.Pattern[str], Judge, bool]] = [
    (_PEM, _judge_pem, False),
    (_TOKEN, _judge_token, False),
    (_BEARER, _judge_bearer, False),
    (_ASSIGN, _judge_assign, True),
]


def find_secrets(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every secret in `text`, sorted by start; spans may overlap."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few letters lower-case to two characters; keep offsets aligned
        lowered = text.translate(_ASCII_LOWER)
    found = []
    for pattern, judge, lower in SCANS:
        pos = 0
        while m := pattern.search(lowered if lower else text, pos):
            start, end, kind = judge(m, text)
            if kind is None:
                # Not a secret: scan on from its value, so a secret inside it is still found.
                pos = start if start > m.start() else m.end()
            else:
                found.append((start, end, kind))
                pos = end
    return sorted(found, key=lambda span: (span[0], -span[1]))


def redact_count(text: str) -> tuple[str, int]:
    """`text` with every secret masked, and how many were masked; the same object when there were none.

    Example: redact_count("postgres://app:s3cret@db/x") == ("postgres://app:[redacted: url credentials]@db/x", 1)
    """
    parts: list[str] = []
    done = count = 0
    for start, end, kind in find_secrets(text):
        if start < done:  # overlaps the previous mask: mask the union
            done = max(done, end)
            continue
        parts += [text[done:start], MASK.format(kind=kind)]
        done = end
        count += 1
    if not count:
        return text, 0
    parts.append(text[done:])
    return "".join(parts), count


def redact(text: str) -> str:
    """`text` with every secret replaced by `[redacted: KIND]`, e.g. `password = [redacted: password]`."""
    return redact_count(text)[0]
