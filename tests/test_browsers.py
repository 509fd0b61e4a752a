"""What a web page can make a browser do to svir (svir.edges.browsers), the whole app in process as
a browser on this machine reaches it: over loopback (`http://127.0.0.1:11434`, the ASGI scope's
`server`), no keys, the admin API open to this machine, capture on.

Each route family (the model APIs, Ollama's, the admin API, the console, the health check) is
asked with a refused Origin, an allowed one (a page of this machine, an app's, one that
`[server] allowed_origins` or SVIR_ORIGINS adds), none at all (SDKs, curl, agents), a rebound
Host, and as a CORS preflight. What a refused request could have done is checked where it would
show: the upstream's record of calls, the key store, the config's reload generation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from svir.config.load import parse_config
from svir.errors import ConfigError
from svir.server import build_app
from tests.support.inprocess import InProcess
from tests.support.upstream import ScriptedUpstream

CONFIG = """
[capture]
enabled = true

[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://up.test/v1"
models = ["ok"]
discover = false
"""
LOOPBACK = "http://127.0.0.1:11434"
EVIL = "http://evil.example"
REBOUND = "rebind.attacker.example:11434"
MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Family:
    """One route family: a request of it, the status it is served with, and its error shape."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | None
    served: int
    shape: str  # "openai", "anthropic" or "ollama"
    upstream: bool = False  # whether serving it calls the upstream


FAMILIES = [
    Family(
        "chat", "POST", "/v1/chat/completions", {"model": "up/ok", "messages": MESSAGES}, 200,
        "openai", upstream=True,
    ),
    Family(
        "responses", "POST", "/v1/responses", {"model": "up/ok", "input": "hi"}, 200, "openai",
        upstream=True,
    ),
    Family(
        "anthropic", "POST", "/v1/messages",
        {"model": "up/ok", "max_tokens": 16, "messages": MESSAGES}, 200, "anthropic",
        upstream=True,
    ),
    Family(
        "ollama", "POST", "/api/chat", {"model": "up/ok", "messages": MESSAGES, "stream": False},
        200, "ollama", upstream=True,
    ),
    Family("models", "GET", "/v1/models", None, 200, "openai"),
    Family("ollama-tags", "GET", "/api/tags", None, 200, "ollama"),
    Family("captures", "GET", "/admin/requests", None, 200, "openai"),
    Family("admin-config", "GET", "/admin/config", None, 200, "openai"),
    Family("admin-usage", "GET", "/admin/usage", None, 200, "openai"),
    Family("admin-keys", "GET", "/admin/keys", None, 200, "openai"),
    Family("create-key", "POST", "/admin/keys", {"name": "page"}, 201, "openai"),
    Family("reload", "POST", "/admin/reload", {}, 200, "openai"),
    Family("console", "GET", "/ui/", None, 200, "openai"),
    Family("health", "GET", "/healthz", None, 200, "openai"),
]  # fmt: skip
IDS = [f.name for f in FAMILIES]


class Browsed:
    """The app, and a client reaching it over loopback as a browser on this machine does."""

    def __init__(self, svir: InProcess, base_url: str = LOOPBACK) -> None:
        self.svir = svir
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=svir.app), base_url=base_url, timeout=20
        )

    async def send(
        self,
        family: Family,
        headers: dict[str, str] | None = None,
        *,
        content_type: str = "text/plain;charset=UTF-8",
    ) -> httpx.Response:
        """`family`'s request; a body goes as a page's `fetch` sends it without a preflight."""
        sent = dict(headers or {})
        content = None
        if family.body is not None:
            content = json.dumps(family.body).encode()
            sent["content-type"] = content_type
        return await self.http.request(family.method, family.path, content=content, headers=sent)

    def upstream_calls(self) -> int:
        return len(self.svir.transport.requests)

    async def keys(self) -> list[Any]:
        r = await self.http.get("/admin/keys")
        assert r.status_code == 200, r.text
        data: list[Any] = r.json()["data"]
        return data

    def generation(self) -> int:
        status = self.svir.app.reload_status()
        assert status is not None
        generation: int = status["generation"]
        return generation

    async def unchanged(self) -> None:
        """Nothing reached the upstream, no key was made, the config was not reloaded."""
        assert self.upstream_calls() == 0
        assert await self.keys() == []
        assert self.generation() == 0


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[tuple[InProcess, Browsed]] = []

    async def start(
        environ: dict[str, str] | None = None, extra: str = "", base_url: str = LOOPBACK
    ) -> Browsed:
        here = tmp_path / str(len(started))
        here.mkdir()
        svir = InProcess(
            here,
            CONFIG + extra,
            ScriptedUpstream(models=["ok"]),
            environ,
            config_file=here / "svir.toml",
        )
        await svir.start()
        browsed = Browsed(svir, base_url)
        started.append((svir, browsed))
        return browsed

    yield start
    for svir, browsed in started:
        await browsed.http.aclose()
        await svir.stop()


def assert_refused(r: httpx.Response, family: Family, code: str, *settings: str) -> None:
    """A 403 in the family's own error shape, whose message names the settings that admit it."""
    assert r.status_code == 403, r.text
    body = r.json()
    if family.shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "permission_error"
        message = body["error"]["message"]
    elif family.shape == "ollama":
        assert isinstance(body["error"], str)
        message = body["error"]
    else:
        assert body["error"]["code"] == code
        message = body["error"]["message"]
    for setting in settings:
        assert setting in message
    # Nothing a page could read.
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_a_page_of_another_origin_is_refused(start: Any, family: Family) -> None:
    svir = await start()
    r = await svir.send(family, {"origin": EVIL})
    assert_refused(r, family, "origin_not_allowed", "allowed_origins", "SVIR_ORIGINS=")
    # A JSON body (which needs a preflight) and the opaque origin of a sandboxed frame alike.
    r = await svir.send(family, {"origin": EVIL}, content_type="application/json")
    assert_refused(r, family, "origin_not_allowed")
    r = await svir.send(family, {"origin": "null"})
    assert_refused(r, family, "origin_not_allowed", "null")
    await svir.unchanged()


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_a_rebound_name_is_refused(start: Any, family: Family) -> None:
    svir = await start()
    # Rebound, the page is its own origin to the browser: Origin names the rebound host too.
    for headers in ({"host": REBOUND}, {"host": REBOUND, "origin": f"http://{REBOUND}"}):
        r = await svir.send(family, headers, content_type="application/json")
        assert_refused(r, family, "host_not_allowed", "allowed_hosts", "SVIR_ALLOWED_HOSTS")
    await svir.unchanged()


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
@pytest.mark.parametrize(
    "origin",
    [
        None,  # an SDK, curl, an agent
        "http://localhost:5173",  # a page of this machine
        "http://127.0.0.1:11434",  # svir's own: the console
        "vscode-webview://1abc2def3",  # an editor's webview
        "app://obsidian.md",  # a desktop app's page
    ],
)
async def test_allowed_callers_are_served(start: Any, family: Family, origin: str | None) -> None:
    svir = await start()
    headers = {} if origin is None else {"origin": origin}
    r = await svir.send(family, headers, content_type="application/json")
    assert r.status_code == family.served, r.text
    if origin is None:
        assert "access-control-allow-origin" not in r.headers
    else:
        assert r.headers["access-control-allow-origin"] == origin
        assert "Origin" in r.headers.get_list("vary")
    assert svir.upstream_calls() == (1 if family.upstream else 0)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
@pytest.mark.parametrize(
    ("allowed", "refused"),
    [
        # *. names the names under it, not the name itself.
        ("https://app.example.com", "https://example.com"),
        ("chrome-extension://abcdef", "chrome-extension://other"),
        # From the config file; the port is part of the origin.
        ("https://chat.example.org:8443", "https://chat.example.org"),
    ],
)
async def test_origins_the_environment_and_the_config_add(
    start: Any, family: Family, allowed: str, refused: str
) -> None:
    svir = await start(
        {"SVIR_ORIGINS": "https://*.example.com, chrome-extension://abcdef"},
        '[server]\nallowed_origins = ["https://chat.example.org:8443"]\n',
    )
    r = await svir.send(family, {"origin": refused})
    assert_refused(r, family, "origin_not_allowed")
    await svir.unchanged()
    r = await svir.send(family, {"origin": allowed}, content_type="application/json")
    assert r.status_code == family.served, r.text
    assert r.headers["access-control-allow-origin"] == allowed
    assert svir.upstream_calls() == (1 if family.upstream else 0)


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_a_preflight_is_answered_for_an_allowed_origin_only(
    start: Any, family: Family
) -> None:
    svir = await start()
    ask = {
        "access-control-request-method": family.method,
        "access-control-request-headers": (
            "authorization, content-type, x-api-key, anthropic-version, openai-beta,"
            " x-stainless-retry-count"
        ),
    }
    r = await svir.http.options(family.path, headers={"origin": "http://localhost:5173", **ask})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert family.method in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == (
        "authorization, content-type, x-api-key, anthropic-version, openai-beta,"
        " x-stainless-retry-count"
    )
    assert "Origin" in r.headers["vary"]
    r = await svir.http.options(family.path, headers={"origin": EVIL, **ask})
    assert_refused(r, family, "origin_not_allowed")
    await svir.unchanged()


async def test_a_preflight_needs_no_key_once_keys_are_on(start: Any) -> None:
    svir = await start()
    r = await svir.http.post("/admin/keys", json={"name": "sdk"})
    assert r.status_code == 201
    preflight = {"origin": "http://localhost:5173", "access-control-request-method": "POST"}
    r = await svir.http.options("/v1/chat/completions", headers=preflight)
    assert r.status_code == 204
    # The request itself still needs one, and its refusal is readable by the allowed page.
    r = await svir.send(FAMILIES[0], {"origin": "http://localhost:5173"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert svir.upstream_calls() == 0


async def test_names_of_this_machine_are_answered_and_the_setting_adds_more(start: Any) -> None:
    chat = FAMILIES[0]
    svir = await start()
    for host in (
        "localhost:11434",
        "svir.localhost:11434",
        "127.0.0.1",
        "[::1]:11434",
        f"{socket.gethostname()}:11434",
    ):
        r = await svir.send(chat, {"host": host}, content_type="application/json")
        assert r.status_code == 200, (host, r.text)
    named = await start({"SVIR_ALLOWED_HOSTS": "rebind.attacker.example"})
    r = await named.send(chat, {"host": REBOUND}, content_type="application/json")
    assert r.status_code == 200, r.text
    configured = await start(extra='[server]\nallowed_hosts = ["*.attacker.example"]\n')
    r = await configured.send(chat, {"host": REBOUND}, content_type="application/json")
    assert r.status_code == 200, r.text
    r = await configured.send(chat, {"host": "attacker.example"}, content_type="application/json")
    assert_refused(r, chat, "host_not_allowed")


async def test_on_a_lan_listener_host_is_checked_once_names_are_given(start: Any) -> None:
    chat = FAMILIES[0]
    # A request that came in on a LAN address (svir on 0.0.0.0): the names it is reached by
    # (a LAN name, a proxy's) are not svir's to know.
    lan = await start(base_url="http://192.168.1.5:11434")
    r = await lan.send(chat, {"host": "svir.lan:11434"}, content_type="application/json")
    assert r.status_code == 200, r.text
    # The console opened at that name is its own origin.
    r = await lan.send(
        chat,
        {"host": "svir.lan:11434", "origin": "http://svir.lan:11434"},
        content_type="application/json",
    )
    assert r.status_code == 200, r.text
    # Other pages are refused there as everywhere.
    r = await lan.send(chat, {"host": "svir.lan:11434", "origin": EVIL})
    assert_refused(r, chat, "origin_not_allowed")
    assert lan.upstream_calls() == 2
    # Names given: the check holds on every listener.
    named = await start({"SVIR_ALLOWED_HOSTS": "svir.lan"}, base_url="http://192.168.1.5:11434")
    r = await named.send(chat, {"host": "svir.lan:11434"}, content_type="application/json")
    assert r.status_code == 200, r.text
    r = await named.send(chat, {"host": "other.lan:11434"}, content_type="application/json")
    assert_refused(r, chat, "host_not_allowed")
    r = await named.send(chat, {"host": "192.168.1.5:11434"}, content_type="application/json")
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("family", FAMILIES, ids=IDS)
async def test_a_load_from_another_site_without_origin_is_refused(
    start: Any, family: Family
) -> None:
    svir = await start()
    # What Chromium sends for <img src> / <script src> of another site: no Origin.
    for dest in ("image", "script", "iframe"):
        mode = "navigate" if dest == "iframe" else "no-cors"
        fetch = {"sec-fetch-site": "cross-site", "sec-fetch-mode": mode, "sec-fetch-dest": dest}
        r = await svir.send(family, fetch)
        assert_refused(r, family, "cross_site_request", "allowed_origins")
    await svir.unchanged()
    # The user opening a page from a link or a bookmark is served.
    if family.method == "GET":
        navigation = {"sec-fetch-mode": "navigate", "sec-fetch-dest": "document"}
        for site in ("cross-site", "none"):
            r = await svir.send(family, {"sec-fetch-site": site, **navigation})
            assert r.status_code == family.served, r.text
    # A page's own requests are served.
    r = await svir.send(family, {"sec-fetch-site": "same-origin"}, content_type="application/json")
    assert r.status_code == family.served, r.text


ADMIN_WRITES = [
    ("POST", "/admin/keys", b'{"name": "form"}'),
    ("POST", "/admin/reload", b""),
    ("POST", "/admin/models/load", b'{"model": "up/ok"}'),
    ("POST", "/admin/probe", b'{"provider": "up"}'),
    ("DELETE", "/admin/keys/key_0000000000000000", b""),
]


@pytest.mark.parametrize("write", ADMIN_WRITES, ids=[f"{m} {p}" for m, p, _ in ADMIN_WRITES])
@pytest.mark.parametrize(
    "origin", [None, "http://localhost:5173", "vscode-webview://1abc2def3"], ids=str
)
@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"],
)
async def test_an_admin_write_a_form_could_send_is_refused(
    start: Any, write: tuple[str, str, bytes], origin: str | None, content_type: str | None
) -> None:
    method, path, body = write
    svir = await start()
    headers = {} if origin is None else {"origin": origin}
    if content_type is not None:
        headers["content-type"] = content_type
    r = await svir.http.request(method, path, content=body, headers=headers)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "json_required"
    assert "Content-Type: application/json" in error["message"]
    await svir.unchanged()


async def test_an_admin_write_with_json_or_authorization_is_served(start: Any) -> None:
    svir = await start()
    r = await svir.http.post(
        "/admin/reload", headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert r.status_code == 200, r.text
    # Not a write: what svir answers any path that does not take the method.
    r = await svir.http.options("/admin/keys")
    assert r.status_code == 405, r.text
    r = await svir.http.post("/admin/keys", json={"name": "json"})
    assert r.status_code == 201, r.text
    # Authorization is a header no form can send either: curl's default body type passes with it.
    admin = "admin-key-0123456789abcdef"
    keyed = await start({"SVIR_ADMIN_KEY": admin})
    r = await keyed.http.post(
        "/admin/keys",
        content=b'{"name": "curl"}',
        headers={
            "authorization": f"Bearer {admin}",
            "content-type": "application/x-www-form-urlencoded",
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "curl"


def test_bad_entries_are_named_in_the_config_and_the_environment(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('[server]\nallowed_origins = ["https://ok.example", "app.example.com"]\n')
    assert caught.value.field == "server.allowed_origins[1]"
    assert "write scheme://host[:port]" in caught.value.reason
    with pytest.raises(ConfigError) as caught:
        parse_config('[server]\nallowed_hosts = ["svir.lan:11434"]\n')
    assert caught.value.field == "server.allowed_hosts[0]"
    assert "without a port" in caught.value.reason
    config = parse_config("")
    for var, value, says in (
        ("SVIR_ORIGINS", "https://ok.example,https://bad.example/", "has no path"),
        ("SVIR_ALLOWED_HOSTS", "ok.lan, http://bad.lan", "without scheme or path"),
    ):
        with pytest.raises(ConfigError) as caught:
            build_app(config, {var: value})
        assert (caught.value.path, caught.value.field) == ("environment", var)
        assert says in str(caught.value)


def test_svir_serve_names_a_bad_environment_entry_and_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "svir.toml"
    path.write_text(CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "svir", "serve", "--config", str(path), "--port", "9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SVIR_ORIGINS": "localhost:3000"},
    )
    assert done.returncode == 2, done.stderr
    assert "svir: bad config: environment: SVIR_ORIGINS: 'localhost:3000' is not an origin" in (
        done.stderr
    )
