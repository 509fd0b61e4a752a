"""Config reloads of the whole app in process (`build_app` over a `MockTransport`), asked for
with `POST /admin/reload` as an operator does: new routes are served at once, a stream that
started before finishes on its old server, the breakers and learned quirks of unchanged servers
survive (those of a changed one start afresh), fields read once at start are reported as
needing a restart, and an invalid file changes nothing and is reported."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from tests.support.asgi import post_raw
from tests.support.inprocess import InProcess
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import ScriptedUpstream, chunk

ADMIN = "admin-secret"
ENV = {"SVIR_ADMIN_KEY": ADMIN}


def provider(name: str, host: str, extra: str = "") -> str:
    return f"""
[[providers]]
name = "{name}"
kind = "openai-compatible"
base_url = "http://{host}/v1"
discover = false
{extra}
"""


BREAKER = "[providers.retry]\nattempts = 1\n[providers.breaker]\nfailures = 1\ncooldown = 600\n"


class Upstreams:
    """Every upstream host at once: `who` answers which host it is ("from a.test"), `held`
    says so and then waits for `release`; any other model is the scripted upstream's."""

    def __init__(self) -> None:
        self.scripted = ScriptedUpstream()
        self.release = asyncio.Event()

    async def __call__(self, request: MockRequest) -> MockResponse:
        host = urlsplit(request.url).hostname
        model = request.model
        if model in ("who", "held"):
            return MockResponse(body=self._stream(str(model), f"from {host}"))
        answer = self.scripted(request)
        return await answer if asyncio.iscoroutine(answer) else answer  # type: ignore[return-value]

    async def _stream(self, model: str, text: str) -> AsyncIterator[bytes]:
        yield chunk(model, {"role": "assistant", "content": text})
        if model == "held":
            await self.release.wait()
            yield chunk(model, {"content": " (done)"})
        yield chunk(model, {}, "stop")
        yield b"data: [DONE]\n\n"


class Svir(InProcess):
    def __init__(self, tmp: Path, config: str) -> None:
        self.upstreams = Upstreams()
        self.path = tmp / "svir.toml"
        self.store = f'\n[store]\nurl = "sqlite:///{tmp / "svir.db"}"\n'
        super().__init__(tmp, config, self.upstreams, ENV, config_file=self.path)

    def rewrite(self, config: str) -> None:
        self.path.write_text(config + self.store)

    async def reload(self, config: str | None = None, *, status: int = 200) -> dict[str, Any]:
        if config is not None:
            self.rewrite(config)
        r = await self.http.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == status, r.text
        out: dict[str, Any] = r.json()
        return out

    async def health(self) -> dict[str, Any]:
        r = await self.http.get("/healthz?verbose=1", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    async def text(self, model: str) -> str:
        stream = await self.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[Svir] = []

    async def make(config: str) -> Svir:
        svir = Svir(tmp_path, config)
        await svir.start()
        started.append(svir)
        return svir

    yield make
    for svir in started:
        await svir.stop()


ROUTE = '\n[[routes]]\nname = "smart"\ntargets = [{{ model = "{target}" }}]\n'


async def test_new_routes_and_providers_are_served_at_once(start: Any) -> None:
    svir = await start(provider("a", "a.test") + ROUTE.format(target="a/who"))
    assert await svir.text("smart") == "from a.test"
    answer = await svir.reload(
        provider("a", "a.test") + provider("b", "b.test") + ROUTE.format(target="b/who")
    )
    assert answer == {
        "ok": True,
        "changed": ["providers.b: added", "routes.smart.targets: changed"],
        "restart_needed": [],
        "error": None,
    }
    assert await svir.text("smart") == "from b.test"  # the very next request
    assert await svir.text("b/who") == "from b.test"
    answer = await svir.reload(provider("b", "b.test"))
    assert answer["changed"] == ["providers.a: removed", "routes.smart: removed"]
    with pytest.raises(openai.NotFoundError):
        await svir.text("a/who")
    with pytest.raises(openai.NotFoundError):
        await svir.text("smart")
    reload = (await svir.health())["reload"]
    assert reload["generation"] == 2 and reload["error"] is None
    assert reload["source"] == str(svir.path) and reload["trigger"] == "admin"
    assert reload["last_success"] == reload["last_attempt"] is not None
    assert svir.app.reload_status() == reload  # what the console's /admin/config shows


async def test_a_stream_in_flight_finishes_on_the_server_it_started_on(start: Any) -> None:
    svir = await start(provider("p", "old.test"))
    # Raw ASGI: the client sees each piece of the stream as the app sends it.
    sent: list[bytes] = []
    first = asyncio.Event()

    async def receive_piece(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))
        if b"from old.test" in b"".join(sent):
            first.set()

    body = json.dumps({"model": "p/held", "messages": [{"role": "user", "content": "hi"}],
                       "stream": True}).encode()  # fmt: skip
    held = asyncio.create_task(post_raw(svir.app, "/v1/chat/completions", body, receive_piece))
    await asyncio.wait_for(first.wait(), 30)
    answer = await svir.reload(provider("p", "new.test"))
    assert answer["changed"] == ["providers.p.base_url: changed"]
    assert await svir.text("p/who") == "from new.test"  # new requests: the new server
    svir.upstreams.release.set()
    await asyncio.wait_for(held, 30)
    stream = b"".join(sent).decode()
    assert " (done)" in stream and stream.endswith("data: [DONE]\n\n")  # whole, on the old one
    assert '"error"' not in stream
    hosts = [urlsplit(r.url).hostname for r in svir.transport.requests]
    assert hosts == ["old.test", "new.test"]
    # The old server's state went with it; the old call's end did not bring it back.
    assert "p/held" not in (await svir.health())["deployments"]


async def test_breakers_and_quirks_of_unchanged_servers_survive(start: Any) -> None:
    config = provider("u", "u.test", BREAKER) + provider("c", "c.test", BREAKER)
    svir = await start(config)
    for name in ("u", "c"):
        with pytest.raises(openai.InternalServerError):
            await svir.text(f"{name}/always-503")
    assert await svir.text("u/no-stream-options") == "hello world"  # learned: drop stream_options
    before = await svir.health()
    assert before["deployments"]["u/always-503"]["state"] == "open"
    assert before["deployments"]["c/always-503"]["state"] == "open"
    assert before["quirks"]["u"]["dropped"] == ["stream_options"]
    # u unchanged, a route added; c moved to another server.
    answer = await svir.reload(
        provider("u", "u.test", BREAKER)
        + provider("c", "c2.test", BREAKER)
        + ROUTE.format(target="u/ok")
    )
    assert answer["changed"] == ["providers.c.base_url: changed", "routes.smart: added"]
    after = await svir.health()
    assert after["deployments"]["u/always-503"]["state"] == "open"
    assert after["deployments"]["u/always-503"]["cooldown_left"] > 0
    assert "c/always-503" not in after["deployments"]  # another server: a fresh breaker
    assert after["quirks"]["u"]["dropped"] == ["stream_options"]
    sent = len(svir.transport.requests)
    with pytest.raises(openai.APIStatusError) as resting:
        await svir.text("u/always-503")
    assert resting.value.status_code == 503
    assert len(svir.transport.requests) == sent  # still resting: nothing was sent
    assert await svir.text("u/no-stream-options") == "hello world"
    assert "stream_options" not in svir.transport.requests[-1].json()  # the quirk still applies
    with pytest.raises(openai.InternalServerError):
        await svir.text("c/always-503")  # c's new server is tried afresh
    assert len(svir.transport.requests) == sent + 2


async def test_an_invalid_file_changes_nothing_and_is_reported(start: Any) -> None:
    config = provider("a", "a.test") + ROUTE.format(target="a/who")
    svir = await start(config)
    answer = await svir.reload(
        provider("a", "a.test") + ROUTE.format(target="nowhere/who"), status=422
    )
    assert answer["ok"] is False and answer["changed"] == []
    assert answer["error"] == (
        f"{svir.path}: routes[0].targets[0].model: 'nowhere/who' is not <provider>/<model-id> of"
        " a known provider"
    )
    assert await svir.text("smart") == "from a.test"  # as before
    reload = (await svir.health())["reload"]
    assert reload["error"] == answer["error"] and reload["generation"] == 0
    assert reload["last_success"] is None and reload["last_attempt"] is not None
    svir.rewrite("[[providers]\n")
    answer = await svir.reload(status=422)
    assert "TOML syntax error" in answer["error"] and answer["error"].startswith(str(svir.path))
    svir.path.unlink()
    answer = await svir.reload(status=422)
    assert answer["error"].startswith(f"{svir.path}: cannot read the file")
    assert await svir.text("smart") == "from a.test"
    answer = await svir.reload(config)  # fixed: applied, and the error is gone
    assert answer == {"ok": True, "changed": [], "restart_needed": [], "error": None}
    reload = (await svir.health())["reload"]
    assert (reload["error"], reload["generation"]) == (None, 1)


async def test_the_console_shows_each_reload_and_the_config_it_applied(start: Any) -> None:
    svir = await start(provider("a", "a.test"))
    await svir.reload(provider("a", "a.test") + ROUTE.format(target="nowhere/who"), status=422)
    r = await svir.http.get("/admin/config", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    shown = r.json()
    assert shown["reload"]["error"].startswith(f"{svir.path}: routes[0].targets[0].model:")
    assert shown["config"]["routes"] == []  # the running config, unchanged
    await svir.reload(provider("a", "a.test") + ROUTE.format(target="a/who"))
    shown = (
        await svir.http.get("/admin/config", headers={"Authorization": f"Bearer {ADMIN}"})
    ).json()
    assert shown["reload"]["error"] is None and shown["reload"]["changed"] == [
        "routes.smart: added"
    ]
    assert [r["name"] for r in shown["config"]["routes"]] == ["smart"]


async def test_fields_read_at_start_apply_after_a_restart_and_are_reported(start: Any) -> None:
    svir = await start(provider("a", "a.test"))
    port = svir.app.config.server.port
    answer = await svir.reload(
        provider("a", "a.test") + ROUTE.format(target="a/who") + "[server]\nport = 1\n"
        '[limits]\nbackend = "redis"\n'
    )
    assert answer["ok"] is True and answer["changed"] == ["routes.smart: added"]
    assert answer["restart_needed"] == ["server.port", "limits.backend"]
    assert svir.app.config.server.port == port and svir.app.config.limits.backend == "memory"
    assert await svir.text("smart") == "from a.test"  # the rest applied
    reload = (await svir.health())["reload"]
    assert reload["restart_needed"] == ["server.port", "limits.backend"]


async def test_the_admin_endpoint_takes_the_admin_key(start: Any) -> None:
    svir = await start(provider("a", "a.test"))
    svir.rewrite(provider("a", "a.test") + ROUTE.format(target="a/who"))
    r = await svir.http.post("/admin/reload")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
    r = await svir.http.post("/admin/reload", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert (await svir.health())["reload"]["generation"] == 0
    with pytest.raises(openai.NotFoundError):
        await svir.text("smart")


async def test_without_a_config_file_nothing_reloads(tmp_path: Path) -> None:
    svir = InProcess(tmp_path, provider("a", "a.test"), Upstreams(), ENV)
    await svir.start()
    try:
        r = await svir.http.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 422
        assert "without a config file" in r.json()["error"]
        health = await svir.http.get(
            "/healthz?verbose=1", headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert health.json()["reload"]["source"] is None
    finally:
        await svir.stop()
