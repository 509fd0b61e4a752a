"""A streamed answer whose upstream stays silent starts anyway: `message_start`, then pings until
the output comes (Claude Code gives up on a stream without bytes), and a failure after that start
is the stream's one error event. Driven as raw ASGI, so that the upstream answers only once the
client has seen a ping (no test waits on a clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from svir.config.load import parse_config
from svir.edges.app import App
from svir.protocols.anthropic import routes as anthropic
from svir.protocols.anthropic.encode import error_type
from tests.anthropic.sdk import check_grammar, frames, stream, text_of
from tests.support.asgi import Lifespan, post_raw
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport
from tests.support.upstream import token_stream

CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 1
[providers.timeouts]
commit_deadline = 0.001
"""


class Client:
    """One request to the app, its messages kept; `pinged` is set by the first ping it gets."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.pinged = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if b"event: ping" in message.get("body", b""):
            self.pinged.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


@pytest.fixture
async def app() -> AsyncIterator[tuple[App, Client]]:
    client = Client()

    async def upstream(request: MockRequest) -> MockResponse:
        model = request.json()["model"]
        if model.startswith("silent-"):
            await client.pinged.wait()
        elif model.startswith("slow-"):
            await asyncio.sleep(0.05)
        if model.endswith("-down"):
            return MockResponse.json({"error": {"message": "down"}}, 503)
        return MockResponse(body=token_stream("m", ["hello", " world"]))

    svir = App(parse_config(CONFIG), {}, transport=MockTransport(upstream))
    anthropic.install(svir, ping_every=0.001)
    lifespan = Lifespan(svir)
    await lifespan.start()
    try:
        yield svir, client
    finally:
        await lifespan.stop()


async def ask(app: App, client: Client, model: str, *, streamed: bool = True) -> None:
    body = {"model": model, "max_tokens": 8, "stream": streamed}
    body["messages"] = [{"role": "user", "content": "hi"}]
    await post_raw(app, "/v1/messages", msgspec.json.encode(body), client.send)


async def test_a_silent_upstream_gets_message_start_and_pings_then_the_answer(
    app: tuple[App, Client],
) -> None:
    svir, client = app
    await ask(svir, client, "up/silent-ok")
    start = client.messages[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    body = client.body()
    names = [name for name, _ in check_grammar(body)]
    assert names[:2] == ["message_start", "ping"]
    assert names[-1] == "message_stop"
    got = stream(body)
    assert got.error is None and text_of(got.message) == "hello world"


async def test_a_failure_after_the_early_start_is_the_one_error_event(
    app: tuple[App, Client],
) -> None:
    svir, client = app
    await ask(svir, client, "up/silent-down")
    assert client.messages[0]["status"] == 200
    got = frames(client.body())
    names = [name for name, _ in got]
    assert names[0] == "message_start" and "ping" in names
    assert names[-1] == "error" and names.count("error") == 1
    assert client.messages[-1]["more_body"] is False
    # The same failure as an HTTP error, when the upstream answers before the stream starts.
    failed = Client()
    await ask(svir, failed, "up/slow-down", streamed=False)
    status = failed.messages[0]["status"]
    assert status >= 500
    assert got[-1][1] == msgspec.json.decode(failed.body())
    assert got[-1][1]["error"]["type"] == error_type(status)


async def test_an_answer_not_streamed_gets_no_early_start(app: tuple[App, Client]) -> None:
    svir, client = app
    await ask(svir, client, "up/slow-ok", streamed=False)
    assert client.messages[0]["status"] == 200
    answer = msgspec.json.decode(client.body())
    assert answer["content"] == [{"type": "text", "text": "hello world"}]
