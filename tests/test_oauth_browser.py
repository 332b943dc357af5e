"""The sign-in and consent pages in a real headless chromium at phone size (390x844): they fit, they show the error,
they sign in with a TOTP code, Allow lands on the client's redirect_uri with a working code, and nothing is loaded
from another origin. Chromium is driven over the DevTools protocol on a pipe, so no Python dependency is added.

    OAUTH_SCREENSHOTS=docs .venv/bin/python -m pytest tests/test_oauth_browser.py   # also writes docs/oauth-*.png
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
import pytest
from test_oauth import PASSPHRASE, _pkce, _serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not on PATH (Debian/Ubuntu: apt-get install chromium); the browser test needs it"
    ),
    pytest.mark.usefixtures("cheap_scrypt"),
]

# An iPhone 12-15 viewport in CSS pixels; screenshots are taken at this size (device scale 1).
PHONE_WIDTH_PX, PHONE_HEIGHT_PX = 390, 844
# A tap target this tall or more (Apple's HIG says 44 pt) for text inputs and buttons.
MIN_TAP_PX = 44
# WCAG 2.2 (2.5.8) minimum target size, for the checkbox rows (the whole label is the target).
MIN_TARGET_PX = 24
# Below this font size iOS Safari zooms the page when an input gets focus.
MIN_INPUT_FONT_PX = 16
# Upper bound on any one DevTools call or page load.
CDP_TIMEOUT_S = 15
CLIENT_NAME = "Phone Test Client"
SCREENSHOTS_ENV = "OAUTH_SCREENSHOTS"

# Chromium's own background traffic off; --no-sandbox because CI runs as root in a container.
CHROMIUM_FLAGS = [
    "--headless",
    "--remote-debugging-pipe",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
]

# Layout facts of the current page, measured in the browser.
MEASURE_JS = """(() => {
  const box = (e) => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    return {tag: e.tagName.toLowerCase(), id: e.id || e.value || e.innerText.trim(), left: r.left, right: r.right,
            top: r.top, bottom: r.bottom, width: r.width, height: r.height, font_px: parseFloat(s.fontSize),
            visible: r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'}; };
  const d = document.documentElement;
  return {inner_width: innerWidth, scroll_width: d.scrollWidth, body_scroll_width: document.body.scrollWidth,
          scroll_height: d.scrollHeight, path: location.pathname, title: document.title, text: document.body.innerText,
          controls: [...document.querySelectorAll('input:not([type=hidden]):not([hidden]), button')].map(box),
          scope_rows: [...document.querySelectorAll('label.scope')].map(box),
          checkboxes: [...document.querySelectorAll('input[type=checkbox]')].map(
            (e) => ({value: e.value, checked: e.checked, disabled: e.disabled})),
          alerts: [...document.querySelectorAll('[role=alert]')].map((e) => ({...box(e), text: e.innerText})),
          forms: document.forms.length,
          external: [...document.querySelectorAll('script, link, img, iframe, object, embed, video, audio, source')]
            .map((e) => e.outerHTML.slice(0, 120))};
})()"""


class Chromium:
    """Headless chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: commands on its fd 3, answers
    and events on its fd 4, each a JSON message ended by NUL): one page, driven synchronously."""

    def __init__(self, profile: Path) -> None:
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        # bash puts our pipe ends at fds 3 and 4 of chromium (dash takes single-digit fds only); pass_fds keeps them open.
        cmd = ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}', CHROMIUM, *CHROMIUM_FLAGS]
        cmd += [f"--user-data-dir={profile}", "about:blank"]
        self.log = profile.parent / "chromium-stderr.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(cmd, pass_fds=(to_browser, from_browser), stdout=subprocess.DEVNULL, stderr=err)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id = b"", 0
        self.events: list[dict[str, Any]] = []  # not yet waited for
        self.history: list[dict[str, Any]] = []  # every event since launch
        self.session = ""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call `method` (on the page once attached); its result. Events read meanwhile go to self.events."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode("utf-8") + b"\0")
        while True:
            answer = self._read(f"the answer to {method}")
            if answer.get("id") == self._next_id:
                assert "error" not in answer, f"{method} failed: {answer['error']}"
                return answer["result"]

    def wait_for(self, event: str) -> dict[str, Any]:
        """The first event named `event` since self.events was last cleared (read from the pipe if not there yet)."""
        while True:
            for seen in self.events:
                if seen["method"] == event:
                    self.events.remove(seen)
                    return seen["params"]
            self._read(event)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def tap(self, selector: str) -> None:
        """A finger tap at the centre of the element, as the phone's touch screen sends it."""
        r = self.evaluate(f"document.querySelector({json.dumps(selector)}).getBoundingClientRect().toJSON()")
        point = [{"x": r["left"] + r["width"] / 2, "y": r["top"] + r["height"] / 2}]
        self.send("Input.dispatchTouchEvent", type="touchStart", touchPoints=point)
        self.send("Input.dispatchTouchEvent", type="touchEnd", touchPoints=[])

    def type_into(self, selector: str, text: str) -> None:
        self.tap(selector)
        assert self.evaluate(f"document.activeElement === document.querySelector({json.dumps(selector)})"), selector
        self.send("Input.insertText", text=text)

    def load(self, action: Any) -> dict[str, Any]:
        """Run `action` (a navigation or a tap that submits), wait for the next page load; the page's measurements."""
        self.events.clear()
        action()
        self.wait_for("Page.loadEventFired")
        return self.evaluate(MEASURE_JS)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError):  # already gone: the test's own failure says why
            self.session = ""
            self.send("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_browser)
        os.close(self._from_browser)

    def _read(self, waiting_for: str) -> dict[str, Any]:
        deadline = time.monotonic() + CDP_TIMEOUT_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
            assert ready, f"no {waiting_for} from chromium within {CDP_TIMEOUT_S} s; its stderr is in {self.log}"
            chunk = os.read(self._from_browser, 1 << 20)
            assert chunk, f"chromium closed the DevTools pipe (exit {self.proc.poll()}); its stderr is in {self.log}"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self.events.append(message)
            self.history.append(message)
        return message


@pytest.fixture
def phone(tmp_path) -> Iterator[Chromium]:
    """A chromium page emulating a 390x844 touch phone, with network, page and console events on."""
    browser = Chromium(tmp_path / "chromium-profile")
    try:
        browser.send("Emulation.setDeviceMetricsOverride", width=PHONE_WIDTH_PX, height=PHONE_HEIGHT_PX, deviceScaleFactor=1,
                     mobile=True)  # fmt: skip
        browser.send("Emulation.setTouchEmulationEnabled", enabled=True, maxTouchPoints=5)
        for domain in ("Page", "Network", "Runtime", "Log"):
            browser.send(f"{domain}.enable")
        yield browser
    finally:
        browser.close()


@contextlib.contextmanager
def _client_callback() -> Iterator[tuple[str, list[str]]]:
    """The OAuth client's redirect_uri: a tiny HTTP server on another loopback port; (its URL, the paths it was sent)."""
    seen: list[str] = []

    class Callback(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = b"<!doctype html><title>client</title><p>back at the client</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # not to stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/callback", seen
    finally:
        server.shutdown()
        server.server_close()


def _assert_fits_a_phone(page: dict[str, Any]) -> None:
    """No horizontal scroll at 390 px, the viewport meta obeyed, every control on screen, large enough to tap."""
    widths = page["inner_width"], page["scroll_width"], page["body_scroll_width"]
    # A phone widens the layout viewport to fit wide content, so innerWidth catches overflow as well as a lost meta tag.
    assert widths == (PHONE_WIDTH_PX,) * 3, f"{page['path']} lays out (window, page, body) {widths} px wide on a 390 px phone"
    for c in page["controls"]:
        assert c["visible"] and c["left"] >= 0 and c["right"] <= PHONE_WIDTH_PX, f"{c['id']} is off screen: {c}"
        if c["tag"] == "button" or c["id"] in ("passphrase", "code"):
            assert c["height"] >= MIN_TAP_PX, f"{c['id']!r} is {c['height']} px tall, under {MIN_TAP_PX} px"
        if c["tag"] == "input" and c["id"] in ("passphrase", "code"):
            assert c["font_px"] >= MIN_INPUT_FONT_PX, f"{c['id']} font {c['font_px']} px: iOS would zoom on focus"
    for row in page["scope_rows"]:
        assert row["height"] >= MIN_TARGET_PX and row["right"] <= PHONE_WIDTH_PX, row
    assert page["external"] == [], "the page embeds scripts, styles or images"


def _all(browser: Chromium, *names: str) -> list[dict[str, Any]]:
    """Every event named one of `names` since launch."""
    return [e for e in browser.history if e["method"] in names]


def test_pages_sign_in_and_consent_in_a_phone_sized_browser(tmp_path, phone):
    shots = Path(os.environ[SCREENSHOTS_ENV]) if os.environ.get(SCREENSHOTS_ENV) else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    with _serve(tmp_path) as served, _client_callback() as (redirect_uri, callback_paths):
        body = {"client_name": CLIENT_NAME, "redirect_uris": [redirect_uri], "token_endpoint_auth_method": "client_secret_post"}
        client = httpx2.post(served.local + "/register", json=body).json()
        verifier, challenge = _pkce()
        query = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": redirect_uri, "state": "s1",
                 "code_challenge": challenge, "code_challenge_method": "S256"}  # fmt: skip

        # The client sends the phone to /authorize; the server parks the request and shows the sign-in page.
        login = phone.load(lambda: phone.send("Page.navigate", url=served.local + "/authorize?" + urlencode(query)))
        assert login["path"] == "/login" and CLIENT_NAME in login["text"], login["text"]
        _assert_fits_a_phone(login)
        assert max(c["bottom"] for c in login["controls"]) <= PHONE_HEIGHT_PX, "Sign in is below the first screen"
        # The phone's keyboards: a password field, and digits with one-time-code autofill for the TOTP code.
        keyboards = "[...document.querySelectorAll('#passphrase, #code')].map((e) => [e.type, e.inputMode, e.autocomplete])"
        assert phone.evaluate(keyboards) == [["password", "", "current-password"], ["text", "numeric", "one-time-code"]]
        if shots:
            phone.screenshot(shots / "oauth-login.png")

        # A wrong passphrase: the same page again, with the error, the form and an empty passphrase field.
        phone.type_into("#passphrase", "not the passphrase")
        phone.type_into("#code", served.next_code())
        again = phone.load(lambda: phone.tap("button[type=submit]"))
        assert again["path"] == "/login" and again["forms"] == 1, again
        [alert] = again["alerts"]
        assert alert["text"] == "wrong passphrase or code" and alert["visible"] and alert["bottom"] <= PHONE_HEIGHT_PX, alert
        assert phone.evaluate("document.querySelector('#passphrase').value") == ""
        _assert_fits_a_phone(again)

        # The right passphrase and a fresh code: the consent page names the client and where the answer goes.
        phone.type_into("#passphrase", PASSPHRASE)
        phone.type_into("#code", served.next_code())
        consent = phone.load(lambda: phone.tap("button[type=submit]"))
        assert consent["path"] == "/consent", consent["text"]
        assert CLIENT_NAME in consent["text"] and urlsplit(redirect_uri).netloc in consent["text"], consent["text"]
        assert [(b["value"], b["checked"], b["disabled"]) for b in consent["checkboxes"]] == [
            ("notes:read", True, True),
            ("notes:append", False, False),
            ("notes:private", False, False),
        ]
        assert [c["id"] for c in consent["controls"] if c["tag"] == "button"] == ["allow", "deny"]
        _assert_fits_a_phone(consent)
        if shots:
            phone.screenshot(shots / "oauth-consent.png")

        # Tick notes:append by tapping its row, then Allow: chromium follows the 302 to the client (no CSP form-action
        # on the consent page may stop that redirect) with the code, the state and the issuer.
        phone.tap("label.scope:has(input[value='notes:append'])")
        assert phone.evaluate("document.querySelector('input[value=\"notes:append\"]').checked")
        back = phone.load(lambda: phone.tap("button[value=allow]"))
        final = phone.evaluate("location.href")
        assert final.startswith(redirect_uri + "?") and back["text"] == "back at the client", final
        q = {k: v[0] for k, v in parse_qs(urlsplit(final).query).items()}
        assert q["state"] == "s1" and q["iss"] == served.public and q["code"], q
        assert callback_paths[0] == urlsplit(final).path + "?" + urlsplit(final).query  # then chromium's /favicon.ico

        # The code the browser carried works once at /token, for the scopes ticked on the page.
        form = {"grant_type": "authorization_code", "code": q["code"], "code_verifier": verifier, "redirect_uri": redirect_uri,
                "client_id": client["client_id"], "client_secret": client["client_secret"]}  # fmt: skip
        token = httpx2.post(served.local + "/token", data=form)
        assert token.status_code == 200 and token.json()["scope"] == "notes:read notes:append", token.text

    # Every request the pages made went to our server or, at the end, to the client: no fonts, CDNs or trackers.
    urls = [e["params"]["request"]["url"] for e in _all(phone, "Network.requestWillBeSent")]
    origins = {f"{urlsplit(u).scheme}://{urlsplit(u).netloc}" for u in urls}
    assert origins <= {served.local, f"http://{urlsplit(redirect_uri).netloc}"}, origins
    complaints = [e["params"] for e in _all(phone, "Log.entryAdded", "Runtime.exceptionThrown", "Runtime.consoleAPICalled")]
    # Left out: status lines the flow expects (401 for the wrong passphrase, 404 for /favicon.ico) and chromium's
    # "verbose" advice (it wants a username field beside a password); a CSP refusal or a script error would stay.
    errors = [
        c for c in complaints if c.get("entry", {}).get("source") != "network" and c.get("entry", {}).get("level") != "verbose"
    ]
    assert not errors, errors
