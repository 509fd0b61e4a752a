"""The web console in a real browser: Debian's Chromium, headless, driven by Playwright (which
downloads no browser: `scripts/chromium.sh` installs Chromium for `make test`), against a real
`svir serve` on a free port with an admin key, a held scripted upstream and the real llama.cpp
model (Gemma 3 270M) as a managed provider, capture on.

What a user does: log in with the admin key; watch a request made through the OpenAI SDK appear
live while it streams and end with its tokens; open it and find the four capture panes holding
the real bytes, and download it as a conformance case; load and unload the managed model from
its buttons; create and revoke a key; chat in the playground with the real model and read its
tokens/s. Every page is photographed (`tests/console/screenshots/`, also at phone width), every control
has a label, the keyboard reaches the pages, and any JavaScript error fails the test (the `page`
fixture).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, expect, sync_playwright

from svir.edges.llama_server import ensure_gemma_model, find_llama_server
from svir.errors import LlamaServerError
from tests.support.mock_server import MockServerThread
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import token_stream

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
# Kept after the run as the test's artefacts (not committed: .gitignore); not under build/,
# whose presence at the root would pass for the `build` package (tests/test_wheel.py).
SHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = os.environ.get("SVIR_CHROMIUM", "/usr/bin/chromium")
ADMIN_KEY = "console-admin-key-0123456789abcdef"
GEMMA = "local/gemma-3-270m"
HELD = "held/answer"
# A recorded LM Studio stream: reasoning, then a get_weather call (the playground renders both).
REASONING_TOOLS = (ROOT / "tests/conformance/decoder/lmstudio-reasoning-tools.sse").read_bytes()
REASONING = "The user wants the weather in Paris. I should call get_weather."
HELD_TOKENS = [f"w{i} " for i in range(12)]
# The frames sent before the upstream holds its answer: the role and the first five tokens.
HELD_AT = 6
# Bounds on waits for things that do happen (a model loading on a loaded machine), not timings.
LONG = 240_000
SHORT = 60_000
expect.set_options(timeout=SHORT)


class HeldUpstream:
    """A chat upstream that streams the first tokens of its answer, then holds it until the test
    releases it (so that a request is seen running for sure, whatever the machine's load)."""

    def __init__(self) -> None:
        # Held only while a test clears it (then sets it again).
        self.release = threading.Event()
        self.release.set()
        self.sent = b"".join(token_stream("answer", HELD_TOKENS, usage=(7, len(HELD_TOKENS))))

    def __call__(self, request: MockRequest) -> MockResponse:
        if request.method == "GET":
            return MockResponse.json({"object": "list", "data": [{"id": "answer"}]})
        if request.json().get("model") == "reasoning-tools":
            return MockResponse(body=REASONING_TOOLS)
        if request.json().get("model") == "down":
            return MockResponse.json({"error": {"message": "overloaded"}}, status=503)
        frames = token_stream("answer", HELD_TOKENS, usage=(7, len(HELD_TOKENS)))

        async def body() -> Any:
            for i, frame in enumerate(frames):
                if i == HELD_AT:
                    while not self.release.is_set():
                        await asyncio.sleep(0.05)
                yield frame

        return MockResponse(body=body())


def gemma_path() -> Path:
    try:
        find_llama_server()
        return ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(f"{exc}\nThe console's tests need the real llama-server and Gemma 3 270M: "
                    "run `make install`.", pytrace=False)  # fmt: skip


@pytest.fixture(scope="module")
def held() -> Iterator[MockServerThread[HeldUpstream]]:
    with MockServerThread(HeldUpstream()) as server:
        yield server


@pytest.fixture(scope="module")
def svir(
    held: MockServerThread[HeldUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp("console")
    config = f"""
[ledger]
flush_seconds = 0.1

[capture]
enabled = true

[[prices]]
model = "held/"
input = 1.0
output = 3.0

[[providers]]
name = "held"
kind = "openai-compatible"
base_url = "{held.base_url}"
models = ["answer", "reasoning-tools", "down"]
discover = false
[providers.retry]
attempts = 2

[[routes]]
name = "steady"
targets = [{{ model = "held/down" }}]
fallbacks = ["held/answer"]

[[providers]]
name = "local"
kind = "llamacpp-managed"
[providers.managed]
chat_template = "builtin:gemma3-tools"
ctx = 2048
idle_unload = 0
[providers.managed.models]
gemma-3-270m = "{gemma_path()}"
"""
    with SvirProcess(config, tmp, env={"SVIR_ADMIN_KEY": ADMIN_KEY}) as proc:
        yield proc


@pytest.fixture(scope="module")
def sdk_key(svir: SvirProcess) -> str:
    """A key with budgets (keys are on for the whole module: the API wants one)."""
    r = httpx.post(
        svir.url + "/admin/keys",
        json={"name": "sdk", "rpm": 600, "tokens_per_day": 200_000, "cost_per_month": 5.0},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    secret: str = r.json()["key"]
    return secret


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
    yield browser
    browser.close()


def expected(message: ConsoleMessage) -> bool:
    """The one console error the page causes on purpose: the browser's own note of the 401 that
    tells the page to ask for the admin key."""
    return message.text.startswith(
        "Failed to load resource: the server responded with a status of 401"
    ) and message.location.get("url", "").endswith("/admin/console/session")


@pytest.fixture
def page(browser: Browser, sdk_key: str) -> Iterator[Page]:
    """A fresh tab (its own session storage); any JavaScript error in it fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(SHORT)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    tab.on(
        "console",
        lambda m: (
            errors.append(f"console.{m.type}: {m.text} at {m.location}")
            if m.type == "error" and not expected(m)
            else None
        ),
    )
    yield tab
    context.close()
    assert errors == [], "JavaScript errors in the console"


def shot(tab: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def login(tab: Page, svir: SvirProcess, where: str = "") -> None:
    tab.goto(f"{svir.url}/ui/{where}")
    tab.get_by_label("Admin key").fill(ADMIN_KEY)
    tab.get_by_role("button", name="Enter").click()
    expect(tab.locator("#who")).to_contain_text("admin key")


def until_in_history(tab: Page, request_ids: set[str]) -> None:
    """Filter the Requests page's history again until it lists every one of `request_ids` (the
    ledger is written in batches, a moment after a request ends)."""
    deadline = time.monotonic() + SHORT / 1000  # a bound on a slow store, not a measurement
    while True:
        history = tab.locator("section", has=tab.get_by_role("heading", name="History"))
        listed = set(history.get_by_role("link").all_text_contents())
        if request_ids <= listed:
            return
        assert time.monotonic() < deadline, (request_ids, listed)
        tab.wait_for_timeout(200)
        tab.get_by_role("button", name="Filter").click()
        expect(history.locator("table, .empty, .error-box").first).to_be_visible()


def unlabelled(tab: Page) -> list[str]:
    """The visible controls a screen reader could not name."""
    found: list[str] = tab.evaluate(
        """() => [...document.querySelectorAll('input, select, textarea, button, meter')]
          .filter((el) => el.offsetParent !== null && el.type !== 'hidden')
          .filter((el) => {
            if (el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')) return false;
            if (el.labels && el.labels.length) return false;
            return !(el.tagName === 'BUTTON' && el.textContent.trim());
          })
          .map((el) => el.outerHTML.slice(0, 120))"""
    )
    return found


def test_login_asks_for_the_admin_key_and_holds_it_for_the_tab(
    page: Page, svir: SvirProcess
) -> None:
    page.goto(svir.url + "/ui/")
    expect(page.get_by_text("svir wants its admin key.")).to_be_visible()
    shot(page, "login")
    # By keyboard: the field has the focus, Enter submits.
    page.keyboard.type("not-the-admin-key")
    page.keyboard.press("Enter")
    expect(page.get_by_text("svir refused that key")).to_be_visible()
    page.get_by_label("Admin key").fill(ADMIN_KEY)
    page.get_by_label("Admin key").press("Enter")
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("#who")).to_contain_text("admin key")
    assert page.evaluate("sessionStorage.getItem('svir.adminKey')") == ADMIN_KEY
    assert page.context.cookies() == []  # a header, never a cookie
    # A reload keeps the tab's key; "Forget the key" asks again.
    page.reload()
    expect(page.locator("main h1")).to_have_text("Overview")
    page.get_by_role("button", name="Forget the key").click()
    expect(page.get_by_label("Admin key")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('svir.adminKey')") is None


def test_a_request_through_the_openai_sdk_appears_live_and_its_capture_holds_the_bytes(
    page: Page, svir: SvirProcess, sdk_key: str, held: MockServerThread[HeldUpstream]
) -> None:
    held.handler.release.clear()
    login(page, svir, "#/requests")
    expect(page.locator(".live-state")).to_have_text("live")
    client = openai.OpenAI(base_url=svir.base_url, api_key=sdk_key, max_retries=0, timeout=120)
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            stream = client.chat.completions.create(
                model=HELD,
                messages=[{"role": "user", "content": "hello from the console test"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            outcome["id"] = stream.response.headers["x-request-id"]
            chunks = list(stream)
            outcome["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            outcome["usage"] = next(c.usage for c in chunks if c.usage)
        except Exception as exc:  # the test's thread: reported by the assertion below
            outcome["error"] = exc

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        # Running: the upstream holds the answer, so the row is there before it ends.
        row = page.locator("#live-rows tr").first
        expect(row).to_contain_text(HELD)
        expect(row.locator(".status")).to_have_text("streaming")
        expect(row.locator("td").nth(6)).not_to_have_text("0")  # tokens counted as they stream
        shot(page, "requests-live")
    finally:
        held.handler.release.set()
        asker.join(120)
    assert "error" not in outcome, outcome
    request_id = outcome["id"]
    assert outcome["text"] == "".join(HELD_TOKENS)
    row = page.locator(f'#live-rows tr[data-id="{request_id}"]')
    expect(row.locator(".status")).to_have_text("ok")
    expect(row.locator("td").nth(6)).to_have_text(str(outcome["usage"].completion_tokens))
    # The history (the ledger, from the store) has it too, filtered by model.
    page.get_by_label("Model", exact=True).fill(HELD)
    until_in_history(page, {request_id})
    shot(page, "requests")

    row.get_by_role("link", name=request_id).click()
    expect(page.get_by_role("heading", name=f"Request {request_id}")).to_be_visible()
    client_request = page.locator("#pane-client-request")
    upstream_request = page.locator("#pane-upstream-request")
    upstream_stream = page.locator("#pane-upstream-stream")
    client_stream = page.locator("#pane-client-stream")
    expect(client_request).to_contain_text("hello from the console test")
    expect(upstream_request).to_contain_text(held.base_url)
    expect(upstream_request).to_contain_text('"model": "answer"')
    # The upstream's stream as it sent it, byte for byte.
    assert upstream_stream.text_content() == held.handler.sent.decode()
    sent = client_stream.text_content() or ""
    assert sent.rstrip().endswith("data: [DONE]")
    for token in HELD_TOKENS:
        assert f'"content":"{token}"' in sent
    assert ADMIN_KEY not in (page.locator(".panes").text_content() or "")
    assert sdk_key not in (page.locator(".panes").text_content() or "")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download as a conformance case").click()
    # The corpus's format: the upstream's bytes as a .sse file, what they must decode to beside it.
    with zipfile.ZipFile(info.value.path()) as case:
        names = case.namelist()
        [stream] = [n for n in names if n.endswith(".sse")]
        assert case.read(stream) == held.handler.sent
        assert stream.removesuffix(".sse") + ".json" in names
    shot(page, "request")


def test_a_request_page_lists_every_attempt_and_why_it_was_retried_or_fell_back(
    page: Page, svir: SvirProcess, sdk_key: str
) -> None:
    client = openai.OpenAI(base_url=svir.base_url, api_key=sdk_key, max_retries=0, timeout=120)
    answer = client.chat.completions.with_raw_response.create(
        model="steady", messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert answer.headers["x-svir-served-model"] == HELD
    request_id = answer.headers["x-request-id"]
    login(page, svir, f"#/requests/{request_id}")
    attempts = page.locator("section", has=page.get_by_role("heading", name="Attempts"))
    rows = attempts.locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("held/down")
    expect(rows.nth(0)).to_contain_text("retried after")
    expect(rows.nth(1)).to_contain_text(f"fell back to {HELD} after")
    expect(rows.nth(1)).to_contain_text("overloaded")  # the upstream's words
    expect(rows.nth(2)).to_contain_text(HELD)
    expect(rows.nth(2).locator(".status")).to_have_text("ok")
    shot(page, "request-fallback")


def test_the_managed_model_loads_and_unloads_from_its_buttons(
    page: Page, svir: SvirProcess
) -> None:
    login(page, svir, "#/models")
    card = page.locator(f'article[data-model="{GEMMA}"]')
    state = card.locator("[data-state]")
    expect(state).to_have_text(re.compile("ready|stopped"))
    if state.text_content() == "ready":  # another test's request loaded it
        card.get_by_role("button", name=f"Unload {GEMMA}", exact=True).click()
        expect(state).to_have_text("stopped", timeout=LONG)
    card.get_by_role("button", name=f"Load {GEMMA}", exact=True).click()
    expect(state).to_have_text("ready", timeout=LONG)
    pid = int(card.locator("dd").first.text_content() or "0")
    server = psutil.Process(pid)
    assert server.name() == "llama-server"
    card.get_by_role("button", name=f"Log tail of {GEMMA}").click()
    expect(card.locator("pre.log")).to_contain_text("llama")
    page.get_by_role("button", name="Probe held").click()
    expect(page.locator(".probe-table")).not_to_be_empty()
    shot(page, "models")
    card.get_by_role("button", name=f"Unload {GEMMA}", exact=True).click()
    expect(state).to_have_text("stopped", timeout=LONG)
    # The server goes: it may still be exiting when the page says stopped.
    _gone, alive = psutil.wait_procs([server], timeout=SHORT / 1000)
    assert alive == [], alive


def test_a_key_is_created_shown_once_and_revoked(page: Page, svir: SvirProcess) -> None:
    login(page, svir, "#/keys")
    page.get_by_label("Name").fill("browser")
    page.get_by_label("Requests per minute").fill("60")
    page.get_by_label("Tokens per day").fill("100000")
    page.get_by_role("button", name="Create key").click()
    secret_box = page.get_by_label("Secret")
    expect(secret_box).to_be_visible()
    secret = secret_box.input_value()
    assert secret and secret not in (page.locator("#key-list").text_content() or "")
    works = httpx.get(svir.base_url + "/models", headers={"Authorization": f"Bearer {secret}"})
    assert works.status_code == 200, works.text
    row = page.locator("#key-list tr", has_text="browser").first
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("rpm 60")
    shot(page, "keys")
    row.get_by_role("button", name="Revoke browser").click()
    page.get_by_role("button", name="Confirm revoking browser").click()
    expect(page.locator("#key-list tr", has_text="browser").first).to_contain_text("revoked")
    refused = httpx.get(svir.base_url + "/models", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401


def test_the_playground_chats_with_the_real_model_and_shows_tokens_per_second(
    page: Page, svir: SvirProcess
) -> None:
    login(page, svir, "#/playground")
    page.get_by_label("Model", exact=True).select_option(GEMMA)
    page.get_by_label("Max tokens").fill("24")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Show the raw stream").check()
    for front_end in ("openai", "anthropic", "ollama"):
        page.get_by_label("Front end").select_option(front_end)
        page.get_by_label("Message").fill("Write one sentence about the sea.")
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#pg-speed .done")).to_be_visible(timeout=LONG)
        answer = page.locator(".msg.assistant").last
        expect(answer.locator(".content")).not_to_be_empty()
        expect(answer.locator(".error-box")).to_be_hidden()
        speed = float((page.locator("#pg-tps").text_content() or "0").replace(",", ""))
        assert speed > 0, front_end
        raw = page.locator("#pg-raw-stream").text_content() or ""
        assert ("data: " in raw) if front_end != "ollama" else ('"done":true' in raw)
    shot(page, "playground")


def test_the_playground_shows_reasoning_apart_and_renders_tool_calls(
    page: Page, svir: SvirProcess
) -> None:
    login(page, svir, "#/playground")
    page.get_by_label("Model", exact=True).select_option("held/reasoning-tools")
    page.get_by_label("Offer a tool (get_weather)").check()
    for front_end in ("openai", "anthropic", "responses"):
        page.get_by_label("Front end").select_option(front_end)
        page.get_by_label("Message").fill("What is the weather in Paris?")
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#pg-speed .done")).to_be_visible()
        answer = page.locator(".msg.assistant").last
        expect(answer.locator(".reasoning")).to_have_text(re.compile(re.escape(REASONING)))
        expect(answer.locator(".content")).not_to_contain_text("The user wants")
        expect(answer.locator(".tool-call code")).to_have_text("get_weather")
        expect(answer.locator(".tool-call .args")).to_have_text('{\n  "city": "Paris"\n}')
        expect(answer.locator(".error-box")).to_be_hidden()
    shot(page, "playground-tools")


def test_overview_usage_and_config(page: Page, svir: SvirProcess, sdk_key: str) -> None:
    # Some traffic for the charts, under the key with budgets.
    client = openai.OpenAI(base_url=svir.base_url, api_key=sdk_key, max_retries=0, timeout=60)
    for _ in range(3):
        client.chat.completions.create(
            model=HELD, messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
    login(page, svir, "#/overview")
    expect(page.locator(".live-state")).to_have_text("live")
    expect(page.locator(".tiles .tile")).to_have_count(5)
    expect(page.get_by_role("cell", name=HELD)).to_be_visible()
    shot(page, "overview")
    page.get_by_role("link", name="Usage").click()
    expect(page.locator("main h1")).to_have_text("Usage")
    expect(page.locator(".key-budgets", has_text="sdk").locator("meter")).to_have_count(3)
    # The held model has a price: the sdk key's requests cost something.
    by_key = page.locator("section", has=page.get_by_role("heading", name="By key"))
    expect(by_key.locator("tr", has_text="sdk").locator("td").nth(5)).not_to_have_text("$0")
    shot(page, "usage")
    page.get_by_role("link", name="Config").click()
    expect(page.locator("main h1")).to_have_text("Config")
    expect(page.locator("pre.config")).to_contain_text("held")
    # The file has not changed since svir read it: a reload changes nothing.
    page.get_by_role("button", name="Reload the config file").click()
    expect(page.get_by_text("Reloaded: nothing changed.")).to_be_visible()
    assert ADMIN_KEY not in (page.content())
    shot(page, "config")


def test_every_page_names_its_controls_and_the_keyboard_reaches_them(
    page: Page, svir: SvirProcess
) -> None:
    login(page, svir)
    for name in ("overview", "models", "requests", "usage", "keys", "playground", "config"):
        page.goto(f"{svir.url}/ui/#/{name}")
        expect(page.locator(f'#nav a[data-page="{name}"]')).to_have_attribute(
            "aria-current", "page"
        )
        expect(page.locator("main h1")).to_be_visible()
        assert unlabelled(page) == [], name
    # From the top of the page, Tab goes to the skip link, the brand, then each page in order.
    page.goto(f"{svir.url}/ui/#/overview")
    expect(page.locator("main h1")).to_be_visible()
    page.locator("body").focus()
    order = []
    for _ in range(9):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert order == ["Skip to the page", "svir", "Overview", "Models", "Requests", "Usage",
                     "Keys", "Playground", "Config"]  # fmt: skip
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")  # Keys
    page.keyboard.press("Enter")
    expect(page.locator("main h1")).to_have_text("Keys")


def test_phone_width(browser: Browser, svir: SvirProcess) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    context.set_default_timeout(SHORT)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        login(tab, svir)
        for name in ("overview", "models", "requests", "keys", "playground"):
            tab.goto(f"{svir.url}/ui/#/{name}")
            expect(tab.locator("main h1")).to_be_visible()
            expect(tab.locator("main .loading")).to_have_count(0)
            # Nothing wider than the phone: wide tables scroll inside their own box.
            width = tab.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (name, width)
            if name in ("overview", "playground"):
                shot(tab, f"phone-{name}")
    finally:
        context.close()
    assert errors == []


def test_files_outside_the_console_folder_are_not_served_over_http(svir: SvirProcess) -> None:
    # Raw request lines, as a client that does not normalize paths sends them.
    for target in ("/ui/../pyproject.toml", "/ui/%2e%2e/%2e%2e/pyproject.toml",
                   "/ui/..%2f..%2fpyproject.toml", "/ui/../edges/console_ui.py"):  # fmt: skip
        with socket.create_connection(("127.0.0.1", svir.port), timeout=30) as conn:
            conn.sendall(
                f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        status = answer.split(b"\r\n", 1)[0]
        assert status.split()[1] == b"404", (target, status)
        assert b"[build-system]" not in answer and b"import" not in answer


def test_with_two_workers_the_pages_say_which_worker_and_the_history_is_everyones(
    page: Page, held: MockServerThread[HeldUpstream], tmp_path: Path
) -> None:
    config = f"""
[ledger]
flush_seconds = 0.1

[[providers]]
name = "held"
kind = "openai-compatible"
base_url = "{held.base_url}"
models = ["answer"]
discover = false
"""
    with SvirProcess(
        config, tmp_path, env={"SVIR_ADMIN_KEY": ADMIN_KEY}, args=["--workers", "2"]
    ) as two:
        client = openai.OpenAI(base_url=two.base_url, api_key="none", max_retries=0, timeout=60)
        ids = set()
        for _ in range(4):
            answer = client.chat.completions.with_raw_response.create(
                model=HELD, messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            ids.add(answer.headers["x-request-id"])
        login(page, two, "#/overview")
        expect(page.locator("#who")).to_contain_text(re.compile(r"worker pid \d+ of 2"))
        expect(page.locator(".scope-note")).to_contain_text("each counts its own")
        page.goto(f"{two.url}/ui/#/requests")
        # The history is the shared store's: every request, whichever worker served it.
        until_in_history(page, ids)
        page.goto(f"{two.url}/ui/#/models")
        expect(page.get_by_role("cell", name="held", exact=True)).to_be_visible()


def test_without_keys_the_console_opens_on_this_machine_without_asking(
    page: Page, held: MockServerThread[HeldUpstream], tmp_path: Path
) -> None:
    config = f"""
[[providers]]
name = "held"
kind = "openai-compatible"
base_url = "{held.base_url}"
models = ["answer"]
discover = false
"""
    # No admin key and no key issued: the admin API serves this machine, as the API does.
    with SvirProcess(config, tmp_path, env={"SVIR_ADMIN_KEY": ""}) as open_svir:
        page.goto(f"{open_svir.url}/ui/#/keys")
        expect(page.locator("main h1")).to_have_text("Keys")
        expect(page.locator("#who")).to_contain_text("this machine (no keys)")
        expect(page.get_by_role("button", name="Forget the key")).to_be_hidden()
        expect(page.locator("#key-list")).to_contain_text("No keys")
