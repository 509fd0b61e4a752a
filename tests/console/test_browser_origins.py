"""What a web page can make a real browser do to a local svir: Debian's Chromium, headless, driven
by Playwright (as tests/console/test_browser.py; its Local Network Access checks off, as in
browsers that have none), against a real `svir serve` as it runs on a
laptop (no keys, no admin key: the admin API answers this machine; capture on), over a recording
upstream.

The attacker's page comes from a second HTTP server on another port, under a name Chromium maps
to 127.0.0.1 (`--host-resolver-rules`): `http://evil.test:<port>`, another origin. It tries what
a page can: `fetch` of "simple" text/plain POSTs to the model APIs and the admin API (read, and
`no-cors`), a form POST, `<img>` and `<script>` loads. A second page imitates DNS rebinding: its
document is served under `http://rebind.test:<svir's port>` (Playwright answers it, as the
attacker's server would before the name is rebound), and its same-origin requests then reach
svir with that Host. Nothing may reach the upstream, no key may be made, no captured prompt
read; and svir's access log shows that every attempt did arrive and was refused. The console at
svir's own origin still works, down to a write without a key (the config reload).
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

from tests.support.mock_server import MockServerThread
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedUpstream

# svir, an HTTP server and Chromium, outside pytest: not in `make test-fast`.
pytestmark = pytest.mark.external

CHROMIUM = os.environ.get("SVIR_CHROMIUM", "/usr/bin/chromium")
# A bound on waits for things that do happen (a page's requests on a loaded machine).
SHORT = 60_000
SECRET = "the secret prompt 7f3a"
expect.set_options(timeout=SHORT)

ATTACK = """<!doctype html>
<html><body>
<iframe name="sink" id="sink"></iframe>
<script>
const svir = "SVIR";
const results = {};
const plain = { "Content-Type": "text/plain" };
const bodies = {
  "/v1/chat/completions": { model: "up/ok", messages: [{ role: "user", content: "page" }] },
  "/api/chat": { model: "up/ok", messages: [{ role: "user", content: "page" }], stream: false },
  "/v1/messages": { model: "up/ok", max_tokens: 8, messages: [{ role: "user", content: "page" }] },
  "/v1/responses": { model: "up/ok", input: "page" },
  "/admin/keys": { name: "from-a-page" },
  "/admin/reload": {},
};
async function attempt(name, run) {
  try { results[name] = await run(); } catch (err) { results[name] = "refused: " + err.name; }
}
function loaded(element) {
  return new Promise((resolve) => {
    element.onload = () => resolve("loaded");
    element.onerror = () => resolve("error");
    document.body.appendChild(element);
  });
}
async function attack() {
  for (const [path, body] of Object.entries(bodies)) {
    const init = { method: "POST", headers: plain, body: JSON.stringify(body) };
    await attempt("cors " + path, async () => (await fetch(svir + path, init)).text());
    await attempt("no-cors " + path,
      async () => (await fetch(svir + path, { ...init, mode: "no-cors" })).type);
  }
  for (const path of ["/admin/requests", "CAPTURED", "/admin/config"]) {
    await attempt("read " + path, async () => (await fetch(svir + path)).text());
  }
  for (const [path, body] of [["/admin/keys", bodies["/admin/keys"]],
                              ["/v1/chat/completions", bodies["/v1/chat/completions"]]]) {
    // The JSON-in-a-form trick: enctype text/plain sends `name=value`, here a JSON document.
    const form = document.createElement("form");
    form.method = "POST";
    form.enctype = "text/plain";
    form.target = "sink";
    form.action = svir + path;
    const input = document.createElement("input");
    const text = JSON.stringify({ ...body, pad: "" });
    input.name = text.slice(0, -2);
    input.value = text.slice(-2);
    form.appendChild(input);
    document.body.appendChild(form);
    const sink = document.getElementById("sink");
    const done = new Promise((resolve) => { sink.onload = () => resolve("submitted"); });
    form.submit();
    results["form " + path] = await done;
  }
  for (const path of ["/v1/models", "/admin/requests"]) {
    const img = document.createElement("img");
    img.src = svir + path;
    results["img " + path] = await loaded(img);
  }
  for (const path of ["/admin/requests", "/api/tags"]) {
    const script = document.createElement("script");
    script.src = svir + path;
    results["script " + path] = await loaded(script);
  }
  window.results = results;
}
attack();
</script>
</body></html>
"""

REBOUND = """<!doctype html>
<html><body><script>
const results = {};
async function attack() {
  const read = await fetch("CAPTURED");
  results.read = [read.status, await read.text()];
  const write = await fetch("/admin/keys", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name: "rebound" }),
  });
  results.write = [write.status, await write.text()];
  window.results = results;
}
attack();
</script></body></html>
"""


class PageServer:
    """The attacker's server: one page, whatever the path, on a free loopback port."""

    def __init__(self, page: str) -> None:
        body = page.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[MockServerThread[ScriptedUpstream]]:
    with MockServerThread(ScriptedUpstream(models=["ok"])) as server:
        yield server


@pytest.fixture(scope="module")
def svir(
    upstream: MockServerThread[ScriptedUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SvirProcess]:
    config = f"""
[capture]
enabled = true

[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "{upstream.base_url}"
models = ["ok"]
discover = false
"""
    env = {"SVIR_ADMIN_KEY": ""}  # a laptop's svir: none, so the admin API is this machine's
    with SvirProcess(config, tmp_path_factory.mktemp("origins"), env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def captured(svir: SvirProcess, upstream: MockServerThread[ScriptedUpstream]) -> str:
    """The path of a captured request holding SECRET, which a page must not read (this machine
    may: it is there to be read)."""
    r = httpx.post(
        svir.base_url + "/chat/completions",
        json={"model": "up/ok", "messages": [{"role": "user", "content": SECRET}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    path = "/admin/requests/" + r.headers["x-request-id"]
    assert SECRET in httpx.get(svir.url + path, timeout=30).text
    upstream.clear()
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    args = [
        "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP rebind.test 127.0.0.1",
        # Chromium's own Local Network Access checks stop a page it deems public (the rebound
        # one, which Playwright serves) from reaching loopback; Firefox and Safari have none.
        # Off, so that svir's checks alone are what is tested.
        "--disable-features=LocalNetworkAccessChecks",
    ]
    if os.geteuid() == 0:
        args.append("--no-sandbox")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    context.set_default_timeout(SHORT)
    yield context.new_page()
    context.close()


def access_lines(svir: SvirProcess) -> list[dict[str, Any]]:
    """svir's access log lines: one a request, with its method, path, status and error."""
    out = []
    for line in svir.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("logger") == "svir.access":
            out.append(entry)
    return out


def requests_seen(svir: SvirProcess, since: int, count: int) -> Counter[tuple[Any, ...]]:
    """(method, path, status, error) of the requests logged after the first `since` lines, once
    `count` of them are (a line is written as its request ends, maybe after its client read it);
    the browser's own asks for a favicon left out."""
    deadline = time.monotonic() + SHORT / 1000  # a bound on a loaded machine, not a measurement
    while True:
        lines = [e for e in access_lines(svir)[since:] if e["path"] != "/favicon.ico"]
        if len(lines) >= count or time.monotonic() > deadline:
            return Counter((e["method"], e["path"], e["status"], e.get("error")) for e in lines)
        time.sleep(0.05)


def keys(svir: SvirProcess) -> list[Any]:
    r = httpx.get(svir.url + "/admin/keys", timeout=30)
    assert r.status_code == 200, r.text
    data: list[Any] = r.json()["data"]
    return data


def test_a_page_of_another_origin_cannot_drive_or_read_svir(
    page: Page, svir: SvirProcess, upstream: MockServerThread[ScriptedUpstream], captured: str
) -> None:
    before = len(access_lines(svir))
    with PageServer(ATTACK.replace("SVIR", svir.url).replace("CAPTURED", captured)) as attacker:
        page.goto(f"http://evil.test:{attacker.port}/")
        results: dict[str, str] = page.wait_for_function("window.results").json_value()
    # Every attempt reached svir, and svir refused each one before anything ran.
    refused = "origin_not_allowed"
    expected = {
        **{("POST", path, 403, refused): 2 for path in (
            "/api/chat", "/v1/messages", "/v1/responses", "/admin/reload",
        )},
        ("POST", "/v1/chat/completions", 403, refused): 3,  # fetch twice, and the form
        ("POST", "/admin/keys", 403, refused): 3,
        ("GET", "/admin/requests", 403, refused): 1,
        ("GET", captured, 403, refused): 1,
        ("GET", "/admin/config", 403, refused): 1,
        # <img> and <script> send no Origin: their Sec-Fetch-Site gives them away.
        ("GET", "/v1/models", 403, "cross_site_request"): 1,
        ("GET", "/admin/requests", 403, "cross_site_request"): 2,
        ("GET", "/api/tags", 403, "cross_site_request"): 1,
    }  # fmt: skip
    seen = requests_seen(svir, before, sum(expected.values()))
    assert seen == expected, seen
    # Nothing reached the upstream, no key was made.
    assert upstream.requests == []
    assert keys(svir) == []
    # The page read nothing: every CORS request failed in the page, whatever svir answered.
    for name, result in results.items():
        assert SECRET not in result, name
        if name.startswith(("cors ", "read ")):
            assert result == "refused: TypeError", (name, result)
        if name.startswith("no-cors "):
            assert result == "opaque", (name, result)  # sent, and unreadable
        if name.startswith(("img ", "script ")):
            assert result == "error", (name, result)


def test_a_rebound_name_cannot_read_or_change_svir(
    page: Page, svir: SvirProcess, upstream: MockServerThread[ScriptedUpstream], captured: str
) -> None:
    origin = f"http://rebind.test:{svir.port}"

    def first_load(route: Route) -> None:
        # What the attacker's server answers before the name resolves to 127.0.0.1.
        route.fulfill(
            status=200, content_type="text/html", body=REBOUND.replace("CAPTURED", captured)
        )

    page.route(f"{origin}/attack", first_load)
    page.goto(f"{origin}/attack")
    results: dict[str, Any] = page.wait_for_function("window.results").json_value()
    # Same-origin to the page, so it reads svir's answers: refusals, naming the setting.
    for name in ("read", "write"):
        status, text = results[name]
        assert status == 403, (name, text)
        assert json.loads(text)["error"]["code"] == "host_not_allowed"
        assert "SVIR_ALLOWED_HOSTS" in text and SECRET not in text
    # Opened at the rebound name, the console itself is refused too.
    response = page.goto(f"{origin}/ui/")
    assert response is not None and response.status == 403
    assert upstream.requests == []
    assert keys(svir) == []


def test_the_console_at_svirs_own_origin_still_works(page: Page, svir: SvirProcess) -> None:
    page.goto(svir.url + "/ui/#/config")
    expect(page.locator("main h1")).to_have_text("Config")
    # A write without a key (svir has none): the console says JSON, as svir wants of it.
    page.get_by_role("button", name="Reload the config file").click()
    expect(page.get_by_text("Reloaded: nothing changed.")).to_be_visible()
    page.goto(svir.url + "/ui/#/requests")
    expect(page.locator("main")).to_contain_text("up/ok")
