"""kb_redact: secrets in notes are masked before a reply leaves for a remote client; look-alikes stay byte for byte.

Every secret here is fake but correctly shaped, built at import from a prefix and seeded random filler (no literal
token in the source, so nothing real is pasted and push protection has nothing to flag).
"""

from __future__ import annotations

import base64
import json
import random
import re
import string

import pytest

from kb_redact import MASK, find_secrets, redact, redact_count

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
B64URL = ALNUM + "_-"


def _rand(n: int, seed: str, alphabet: str = ALNUM) -> str:
    """n characters of `alphabet`, the same on every run for the same seed."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _mask(kind: str) -> str:
    return MASK.format(kind=kind)


ANTHROPIC = "sk-ant-api03-" + _rand(93, "ant", B64URL) + "AA"
ANTHROPIC_ADMIN = "sk-ant-admin01-" + _rand(93, "admin", B64URL) + "AA"
OPENAI_LEGACY = "sk-" + _rand(20, "oa1") + "T3BlbkFJ" + _rand(20, "oa2")
OPENAI_PROJECT = "sk-proj-" + _rand(74, "proj1", B64URL) + "T3BlbkFJ" + _rand(74, "proj2", B64URL)
OPENAI_SERVICE = "sk-svcacct-" + _rand(58, "svc1", B64URL) + "T3BlbkFJ" + _rand(58, "svc2", B64URL)
GITHUB = {prefix: prefix + _rand(36, prefix) for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")}
GITHUB_PAT = "github_pat_" + _rand(22, "pat1") + "_" + _rand(59, "pat2")
AWS_KEY_ID = "AKIA" + _rand(16, "akia", UPPER_DIGITS)
AWS_SESSION_KEY_ID = "ASIA" + _rand(16, "asia", UPPER_DIGITS)
AWS_SECRET = _rand(40, "awssecret", B64)
GOOGLE = "AIza" + _rand(35, "google", B64URL)
SLACK_BOT = "xoxb-" + _rand(11, "sb1", string.digits) + "-" + _rand(13, "sb2", string.digits) + "-" + _rand(24, "sb3")
SLACK_USER = "xoxp-" + _rand(11, "su1", string.digits) + "-" + _rand(12, "su2", string.digits) + "-" + _rand(32, "su3")
SLACK_APP = "xapp-1-A" + _rand(10, "sa1", UPPER_DIGITS) + "-" + _rand(13, "sa2", string.digits) + "-" + _rand(64, "sa3")
SLACK_HOOK_PATH = "T" + _rand(8, "h1", UPPER_DIGITS) + "/B" + _rand(10, "h2", UPPER_DIGITS) + "/" + _rand(24, "h3")
STRIPE_LIVE = "sk_live_" + _rand(24, "stripe1")
STRIPE_RESTRICTED = "rk_live_" + _rand(24, "stripe2")
STRIPE_TEST = "sk_test_" + _rand(24, "stripe3")
STRIPE_WEBHOOK = "whsec_" + _rand(32, "stripe4")
JWT = (
    _b64url({"alg": "HS256", "typ": "JWT"})
    + "."
    + _b64url({"sub": "1234567890", "name": "Ada", "iat": 1716239022})
    + "."
    + _rand(43, "jwtsig", B64URL)
)
OPAQUE = _rand(32, "opaque")  # a provider-less token (a self-hosted service's key)
HEX_TOKEN = _rand(40, "hex", "0123456789abcdef")

# (kind, secret, note context with {s} where the secret goes)
MASKED = [
    ("anthropic key", ANTHROPIC, "ANTHROPIC_API_KEY={s}\n"),
    ("anthropic key", ANTHROPIC_ADMIN, "Rotated the admin key {s} on Monday."),
    ("anthropic key", ANTHROPIC, 'client = anthropic.Anthropic(api_key="{s}")'),
    ("openai key", OPENAI_LEGACY, "```python\nopenai.api_key = '{s}'\n```"),
    ("openai key", OPENAI_PROJECT, "export OPENAI_API_KEY={s}"),
    ("openai key", OPENAI_SERVICE, "- service account for the bot: `{s}`"),
    ("github token", GITHUB["ghp_"], "git remote token {s} (expires in 30 days)"),
    ("github token", GITHUB["gho_"], '{{"oauth": "{s}"}}'),
    ("github token", GITHUB["ghu_"], "user-to-server: {s}"),
    ("github token", GITHUB["ghs_"], "GITHUB_TOKEN={s}"),
    ("github token", GITHUB["ghr_"], "refresh with {s}."),
    ("github token", GITHUB_PAT, "| ci | {s} |"),
    ("aws key", AWS_KEY_ID, "[default]\naws_access_key_id = {s}\n"),
    ("aws key", AWS_SESSION_KEY_ID, "temporary creds {s} from sts"),
    ("aws secret", AWS_SECRET, "[default]\naws_secret_access_key = {s}\n"),
    ("google key", GOOGLE, "https://maps.googleapis.com/maps/api/geocode/json?address=x&key={s}"),
    ("slack token", SLACK_BOT, "SLACK_BOT_TOKEN: {s}"),
    ("slack token", SLACK_USER, "my user token is {s}"),
    ("slack token", SLACK_APP, "socket mode app token {s}"),
    ("slack webhook", SLACK_HOOK_PATH, "alerts go to https://hooks.slack.com/services/{s}"),
    ("stripe key", STRIPE_LIVE, "STRIPE_SECRET_KEY={s}"),
    ("stripe key", STRIPE_RESTRICTED, "restricted key for reports: {s}"),
    ("stripe key", STRIPE_TEST, 'stripe.api_key = "{s}"'),
    ("stripe key", STRIPE_WEBHOOK, "webhook signing secret {s}"),
    ("jwt", JWT, "Authorization: Bearer {s}"),
    ("jwt", JWT, "the session cookie was {s}; it expired"),
    ("bearer token", OPAQUE, 'curl -H "Authorization: Bearer {s}" https://api.internal/v1'),
    ("bearer token", OPAQUE, "token: Bearer {s}"),
    ("password", "hunter2isgreat", "password = {s}"),
    ("password", "Tr0ub4dor&3", 'db:\n  password: "{s}"\n'),
    ("password", "S3cure!pass", "DB_PASSWORD={s}"),
    ("password", "S3cure!pass", 'conn = connect(host="db", passwd="{s}")'),
    ("password", "hunter2isgreat", "**Password:** {s}"),
    ("password", "hunter2isgreat", "| service | password |\n| password | {s} |"),
    ("password", "Tr0ub4dor&3", "数据库\n密码：{s}，别外传"),
    ("password", "20481937", "wifi pwd: {s}"),
    ("password", "C0rrect-H0rse", "DB_PASS={s}"),
    ("secret", OPAQUE, '{{"client_id": "abc", "client_secret": "{s}"}}'),
    ("secret", "django-insecure-" + _rand(30, "dj", ALNUM + "!@#%^&*(-_=+)"), "SECRET_KEY = '{s}'"),
    ("secret", OPAQUE, "API密钥 = {s}"),
    ("token", OPAQUE, "export API_TOKEN={s}"),
    ("token", HEX_TOKEN, "https://example.org/hook?access_token={s}"),
    ("token", OPAQUE, "令牌: {s}"),
    ("api key", OPAQUE, "x-api-key: {s}"),
    ("api key", OPAQUE, 'const config = {{ apiKey: "{s}" }};'),
    ("api key", HEX_TOKEN, "| api_key | {s} |"),
    ("private key", _rand(64, "pk", B64), 'private_key = "{s}"'),
    ("url credentials", "pa55w0rd", "https://user:{s}@host/x"),
    ("url credentials", "s3cret", "DATABASE_URL=postgres://app:{s}@db:5432/x"),
    ("url credentials", "p4ssw0rd", "redis://:{s}@cache:6379/0"),
]

LOOK_ALIKES = [
    "api_key = <your-key>",
    "OPENAI_API_KEY=<API_KEY>",
    "api_key: ${OPENAI_API_KEY}",
    "curl -H 'Authorization: Bearer $TOKEN' https://api.example.org",
    "password: {{ secret }}",
    "password: changeme",
    'api_key = "example-key-123"',
    "token: xxx",
    "password: ***",
    "api_key = ...",
    "OPENAI_API_KEY=your_api_key_here",
    'password = ""',
    "password: null",
    "password=None",
    'token = os.environ["TOKEN"]',
    'api_key = os.getenv("OPENAI_API_KEY")',
    "client = OpenAI(api_key=api_key)",
    '"password": "password"',
    "secret_key: settings.SECRET_KEY",
    "private_key = ~/.ssh/id_ed25519",
    "Fixed in commit 3f786850e387550fdab836ed7e6dc881de23001b, see the log.",
    "request id 123e4567-e89b-12d3-a456-426614174000 failed",
    "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "![chart](data:image/png;base64,iVBORw0KGgo" + _rand(40, "img1", B64) + "AIza" + _rand(35, "img2", B64URL) + ")",
    "Filed under task-Q3Planning-Notes-for-Backend-Team-2024 in the tracker.",
    "面积 = 长 × 宽",
    "密码学 = 研究加密的学科",
    "我的密码在 1Password 里",
    "token budget = 4096",
    "max_tokens: 4096",
    "| Token | 4096 |",
    "Reset your password in settings, then log in again.",
    "Password: see the team vault",
    "sk-learn is what people sometimes call scikit-learn",
    "sk-learn-compatible-estimators-and-transformers-for-pipelines",
    "xoxb-your-bot-token-goes-here",
    "Bearer tokens expire after one hour.",
    "bypass: abc12345",
    "AWS docs use AKIAIOSFODNN7EXAMPLE as the sample key id.",
    "Keys start with sk-ant-api03-... and are 108 characters long.",
    "ssh git@github.com:me/notes.git",
    "https://example.com:8080/path@v2",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE" + _rand(52, "pub", B64) + "\n-----END PUBLIC KEY-----",
    "mix 3 eggs; the secret ingredient is love",
    "Token: https://docs.github.com/en/authentication/keeping-your-account-and-data-secure",
    "client_secret: stored in https://vault.internal/ui/secret/team",
]


def _note(context: str, secret: str) -> str:
    return context.format(s=secret)


@pytest.mark.parametrize(("kind", "secret", "context"), MASKED, ids=[f"{i}-{c[0]}" for i, c in enumerate(MASKED)])
def test_redact_masks_secret_in_note_context(kind, secret, context):
    note = _note(context, secret)
    out, count = redact_count(note)
    assert secret not in out
    assert _mask(kind) in out
    assert count == 1
    assert out.replace(_mask(kind), secret, 1) == note  # only the secret's own characters changed


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_redact_leaves_look_alike_byte_identical(text):
    assert redact(text) == text
    assert find_secrets(text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password = hunter2isgreat", "password = [redacted: password]"),
        ("postgres://app:s3cret@db:5432/x", "postgres://app:[redacted: url credentials]@db:5432/x"),
        ('api_key: "' + ANTHROPIC + '"', 'api_key: "[redacted: anthropic key]"'),
        ("密码：Tr0ub4dor&3", "密码：[redacted: password]"),
        ("password = hunter2isgreat.", "password = [redacted: password]."),
    ],
)
def test_redact_keeps_key_operator_and_surroundings(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize("label", ["RSA ", "EC ", "OPENSSH ", "", "ENCRYPTED "])
def test_redact_masks_multi_line_pem_block_as_one(label):
    body = "\n".join(_rand(64, f"pem{label}{i}", B64) for i in range(12))
    headers = "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F2A9C\n\n" if label == "ENCRYPTED " else ""
    pem = f"-----BEGIN {label}PRIVATE KEY-----\n{headers}{body}\n-----END {label}PRIVATE KEY-----"
    note = f"Deploy key for the backup box:\n\n```\n{pem}\n```\nRotate yearly."
    out, count = redact_count(note)
    assert out == "Deploy key for the backup box:\n\n```\n[redacted: private key]\n```\nRotate yearly."
    assert count == 1


def test_redact_masks_pem_block_cut_off_before_its_end():
    lines = [_rand(64, f"cut{i}", B64) for i in range(5)]
    note = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n\n(the rest is on the laptop)"
    out = redact(note)
    assert not any(line in out for line in lines)
    assert out == "[redacted: private key]\n\n(the rest is on the laptop)"


def test_redact_masks_pem_inside_json_string():
    body = "\\n".join(_rand(64, f"sa{i}", B64) for i in range(26))  # a service account file: escaped newlines
    key = f"-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\\n"
    note = '{"type": "service_account", "private_key": "' + key + '", "client_email": "bot@p.iam"}'
    out = redact(note)
    assert "BEGIN PRIVATE KEY" not in out and body[:64] not in out
    assert json.loads(out)["private_key"].startswith("[redacted: private key]")


def test_redact_masks_several_secrets_in_one_note():
    note = (
        "# Staging\n\n"
        f"ANTHROPIC_API_KEY={ANTHROPIC}\n"
        f"GITHUB_TOKEN={GITHUB['ghp_']}\n"
        "DB_PASSWORD=hunter2isgreat\n"
        "DATABASE_URL=postgres://app:s3cret@db:5432/app\n\n"
        f"Slack alerts: https://hooks.slack.com/services/{SLACK_HOOK_PATH}\n"
        f"AWS: {AWS_KEY_ID} / aws_secret_access_key: {AWS_SECRET}\n"
        "token budget = 4096, see commit 3f786850e387550fdab836ed7e6dc881de23001b\n"
    )
    out, count = redact_count(note)
    for secret in (ANTHROPIC, GITHUB["ghp_"], "hunter2isgreat", "s3cret", SLACK_HOOK_PATH, AWS_KEY_ID, AWS_SECRET):
        assert secret not in out
    assert count == 7
    assert "token budget = 4096, see commit 3f786850e387550fdab836ed7e6dc881de23001b" in out
    assert out.startswith("# Staging\n\nANTHROPIC_API_KEY=[redacted: anthropic key]\n")


def test_redact_keeps_json_parseable():
    note = json.dumps({"user": "ada", "password": "hunter2isgreat", "token": OPAQUE, "max_tokens": 4096})
    assert json.loads(redact(note)) == {
        "user": "ada",
        "password": "[redacted: password]",
        "token": "[redacted: token]",
        "max_tokens": 4096,
    }


def test_redact_masks_secret_that_overlaps_another_as_one():
    out, count = redact_count("DB_PASSWORD=postgres://app:s3cret@db/x")
    assert (out, count) == ("DB_PASSWORD=[redacted: password]", 1)


@pytest.mark.parametrize(
    "text",
    [_note(context, secret) for _, secret, context in MASKED]
    + ["password = hunter2isgreat and " + GITHUB["gho_"] + " and https://a:b1@h/x\n-----BEGIN PRIVATE KEY-----\nabc"],
)
def test_redact_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once
    assert redact_count(once) == (once, 0)


def test_redact_returns_text_without_secrets_unchanged():
    text = "# Reading list\n\n" + "Notes on tokenizers, password managers and API design (面积 = 长 × 宽).\n" * 200
    assert redact(text) is text
    assert redact_count(text) == (text, 0)
    assert redact("") == ""


def test_redact_masks_only_with_short_lowercase_kinds():
    text = "\n".join(_note(context, secret) for _, secret, context in MASKED)
    kinds = set(re.findall(r"\[redacted: ([^\]]*)\]", redact(text)))
    assert kinds == {kind for kind, _, _ in MASKED}
    assert all(re.fullmatch(r"[a-z]+(?: [a-z]+)*", kind) for kind in kinds)


@pytest.mark.parametrize(
    "text",
    [
        "a=" * 500_000,
        "token:" * 170_000,
        "secret=<" * 125_000,
        "password = '" * 90_000,
        base64.b64encode(random.Random(7).randbytes(750_000)).decode(),
        "-----BEGIN PRIVATE KEY-----\n" * 38_000,
        "-----BEGIN RSA PRIVATE KEY-----\n" + ("A" * 64 + "\n") * 15_000,
        "sk-" * 333_333,
        "https://a:" * 100_000,
        "Bearer " * 150_000,
        "eyJaaaaaaaaaa." * 70_000,
        ("k" * 60 + "token=") * 15_000,
        " " * 1_000_000,
    ],
    ids=lambda text: repr(text[:12]),
)
def test_redact_finishes_on_one_megabyte_adversarial_input(text):
    """Every run is bounded or possessive: these finish in well under a second each (no timing asserted)."""
    out = redact(text)
    assert isinstance(out, str)
    assert redact(out) == out
