"""The stream's edges, driven as raw ASGI so that what the client has seen orders the upstream
(no test waits on a clock): a silent upstream gets the stream started and kept alive until its
answer comes, a failure after that start is the stream's `response.failed`, and a stored
response is in the store before `response.completed` (or the answer not streamed) is sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from svir.config.load import parse_config
from svir.edges.app import App
from svir.errors import NotFound
from svir.protocols.responses import routes as responses
from svir.store.responses import SqlResponseStore
from tests.responses.support import CONFIG
from tests.support.asgi import Lifespan, post_raw
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport
from tests.support.upstream import token_stream

# Provider `up` starts a stream with no output yet at once (its commit deadline).
EARLY = CONFIG.replace(
    "attempts = 1\n", "attempts = 1\n[providers.timeouts]\ncommit_deadline = 0.001\n", 1
)


def events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for block in body.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(msgspec.json.decode(line[6:]))
    return out


class Client:
    """One request's answer as the app sends it. `kept_alive` is set once the client has seen a
    keep-alive (a second `response.in_progress`); `stored` is what the store held for the
    response the moment each end (or the answer not streamed) was handed to the client."""

    def __init__(self, store: SqlResponseStore) -> None:
        self.store = store
        self.messages: list[dict[str, Any]] = []
        self.kept_alive = asyncio.Event()
        self.stored: list[bool] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if self.body().count(b'"type":"response.in_progress"') >= 2:
            self.kept_alive.set()
        chunk = message.get("body", b"")
        if b"response.completed" in chunk or (
            message["type"] == "http.response.body" and b'"object":"response"' in chunk[:80]
        ):
            self.stored.append(await self._stored())

    async def _stored(self) -> bool:
        body = self.body()
        rid = (msgspec.json.decode(body) if body.startswith(b"{") else events(body)[0]["response"])[
            "id"
        ]
        try:
            await self.store.get("anonymous", rid)
        except NotFound:
            return False
        return True

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[tuple[App, SqlResponseStore, list[Client]]]:
    store = SqlResponseStore(f"sqlite:///{tmp_path / 'svir.db'}")
    clients: list[Client] = []

    async def upstream(request: MockRequest) -> MockResponse:
        model = request.json()["model"]
        if model.startswith("silent-"):
            await clients[-1].kept_alive.wait()
        if model.endswith("-down"):  # (sooner, the same failure is an HTTP error: test_sdk.py)
            return MockResponse.json({"error": {"message": "down"}}, 503)
        return MockResponse(body=token_stream("m", ["hello", " world"]))

    svir = App(parse_config(EARLY), {}, transport=MockTransport(upstream))
    responses.install(svir, store, keepalive_every=0.001)
    lifespan = Lifespan(svir)
    await lifespan.start()
    try:
        yield svir, store, clients
    finally:
        await lifespan.stop()


async def ask(
    app: tuple[App, SqlResponseStore, list[Client]], model: str, *, streamed: bool = True
) -> Client:
    svir, store, clients = app
    client = Client(store)
    clients.append(client)
    body = {"model": model, "input": "hi", "stream": streamed}
    await post_raw(svir, "/v1/responses", msgspec.json.encode(body), client.send)
    return client


async def test_a_silent_upstream_gets_the_stream_started_and_kept_alive(
    app: tuple[App, SqlResponseStore, list[Client]],
) -> None:
    client = await ask(app, "up/silent-ok")
    assert client.messages[0]["status"] == 200
    got = events(client.body())
    types = [e["type"] for e in got]
    assert types[:3] == ["response.created", "response.in_progress", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    text = "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta")
    assert text == "hello world"
    assert client.stored == [True]


async def test_a_failure_after_the_start_is_response_failed(
    app: tuple[App, SqlResponseStore, list[Client]],
) -> None:
    client = await ask(app, "up/silent-down")
    assert client.messages[0]["status"] == 200
    got = events(client.body())
    assert got[0]["type"] == "response.created" and got[-1]["type"] == "response.failed"
    assert got[-1]["response"]["status"] == "failed"
    assert got[-1]["response"]["error"]["code"] == "server_error"
    assert client.messages[-1]["more_body"] is False


async def test_the_response_is_stored_before_its_end_is_sent(
    app: tuple[App, SqlResponseStore, list[Client]],
) -> None:
    streamed = await ask(app, "up/ok")
    assert events(streamed.body())[-1]["type"] == "response.completed"
    assert streamed.stored == [True]
    answer = await ask(app, "up/ok", streamed=False)
    assert answer.stored == [True]
    assert msgspec.json.decode(answer.body())["status"] == "completed"
