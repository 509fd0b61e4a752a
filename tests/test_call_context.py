"""The typed call context (svir.call) and ChatCall's states, in process over a MockTransport: the
policy fills the outcome, a ChatCall goes through its states, the access log's names are written
from the context, and the ledger's `api` is the front end's own word, not a guess from the
path."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from svir.call import INTERNAL, CallContext
from svir.chat import CallState, ChatCall, Cut
from svir.config.load import parse_config
from svir.errors import GatewayError
from svir.policy.gateway import Gateway
from svir.policy.resilience import Timing
from svir.server import build_app
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import Event, Usage
from svir.wire.tokens import estimate_prompt_tokens
from tests.keys.test_telemetry import samples, value
from tests.support.asgi import Lifespan
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport, sse

CONFIG = """
[[providers]]
name = "f"
kind = "openai-compatible"
base_url = "http://f.test/v1"
discover = false

[[providers]]
name = "g"
kind = "openai-compatible"
base_url = "http://g.test/v1"
discover = false

[[routes]]
name = "smart"
fallbacks = ["g/ok"]
targets = [{ model = "f/refused" }]

[[routes]]
name = "doomed"
fallbacks = ["g/refused"]
targets = [{ model = "f/refused" }]
"""

HI = [{"role": "user", "content": "hi"}]


def answer(*texts: str) -> list[bytes]:
    chunks: list[Any] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]
    chunks.append(
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(texts), "total_tokens": 5},
        }
    )
    return sse(*chunks, "[DONE]")


async def upstream(request: MockRequest) -> MockResponse:
    """`*/refused` is a 401 (not retried, sent to the fallback); any other model answers."""
    if request.json()["model"] == "refused":
        return MockResponse.json({"error": {"message": "bad key"}}, 401)
    return MockResponse(body=answer("hello", " world"))


def gateway() -> Gateway:
    return Gateway(
        parse_config(CONFIG), {}, MockTransport(upstream), timing=Timing(rng=random.Random(1))
    )


async def drain(call: ChatCall) -> list[CallState]:
    """Read the call's answer to its end; the call's state as each batch arrived."""
    seen = []
    async for _ in call.events():
        seen.append(call.state)
    return seen


async def test_the_policy_fills_the_outcome_of_a_served_call() -> None:
    gw = gateway()
    ctx = CallContext("rid-1", INTERNAL)
    call = await gw.open_chat(ctx, {"model": "smart", "messages": HI, "stream": True})
    o = ctx.outcome
    assert (o.model, o.provider, o.served_model) == ("smart", "g", "g/ok")
    assert o.attempts == ("f/refused", "g/ok")
    assert call.headers["x-svir-served-model"] == "g/ok"
    assert o.stats is call.stats and o.stats.finish_reason is None  # settled when it closes
    await drain(call)
    assert o.stats.finish_reason == "stop"
    assert o.stats.usage == Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    assert call.visible_tokens == 2 and call.error is None and call.succeeded


async def test_a_call_refused_everywhere_names_the_last_provider_tried() -> None:
    ctx = CallContext("rid-2", INTERNAL)
    with pytest.raises(GatewayError) as info:
        await gateway().open_chat(ctx, {"model": "doomed", "messages": HI, "stream": True})
    assert info.value.upstream is not None and info.value.upstream.kind is ErrorKind.AUTH
    o = ctx.outcome
    assert (o.provider, o.served_model, o.model, o.stats) == ("g", None, None, None)
    assert o.attempts == ("f/refused", "g/refused")


async def test_a_chat_call_goes_from_new_to_closed_through_its_states() -> None:
    gw = gateway()
    closed: list[ChatCall] = []
    call = ChatCall(
        gw.client,
        gw.router.resolve("g/ok"),
        {"model": "ok", "messages": HI, "stream": True},
        request_id="rid-3",
        model_label="g/ok",
        on_close=[closed.append],
    )
    assert call.state is CallState.NEW
    await call.open()
    assert call.state is CallState.PRIMED
    assert set(await drain(call)) == {CallState.STREAMING}
    assert call.state is CallState.CLOSED and closed == [call]
    call.close()
    assert closed == [call]  # the hooks ran once


class CutAtOnce:
    """A guard that ends the answer at its first visible piece."""

    def check(self, events: list[Event]) -> Any:
        async def cut() -> Cut:
            return Cut(UpstreamError(ErrorKind.OTHER, "budget gone", in_stream=True))

        return cut()


async def test_a_guard_attached_to_an_opened_call_cuts_its_answer() -> None:
    gw = gateway()
    ctx = CallContext("rid-4", INTERNAL)
    call = await gw.open_chat(ctx, {"model": "g/ok", "messages": HI, "stream": True})
    closed: list[ChatCall] = []
    call.attach(guard=CutAtOnce(), on_close=closed.append)
    assert await drain(call) == [CallState.CUT]
    assert call.state is CallState.CLOSED and closed == [call]
    with pytest.raises(AssertionError):
        call.attach(guard=None, on_close=closed.append)  # only before the output


def test_the_access_log_names_are_written_from_the_context() -> None:
    ctx = CallContext("rid-5", "openai", client_user="u-7")
    o = ctx.outcome
    o.provider, o.model, o.served_model, o.attempts = "g", "smart", "g/ok", ("f/x", "g/ok")
    o.limit, o.usage_source = "tokens_per_day", "counted"
    fields: dict[str, Any] = {"path": "/v1/chat/completions"}
    ctx.log_into(fields)
    assert fields == {
        "path": "/v1/chat/completions",
        "client_user": "u-7",
        "limit": "tokens_per_day",
        "model": "smart",
        "served_model": "g/ok",
        "attempts": ["f/x", "g/ok"],
        "provider": "g",
        "usage_source": "counted",
    }


ADMIN = {"Authorization": "Bearer admin-key-1"}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The whole app (every front end, keys, the ledger, metrics) over the mock upstream."""
    text = CONFIG + f'\n[store]\nurl = "sqlite:///{tmp_path / "svir.db"}"\n'
    environ = {"SVIR_ADMIN_KEY": "admin-key-1"}
    app = build_app(parse_config(text), environ, transport=MockTransport(upstream))
    lifespan = Lifespan(app)
    await lifespan.start()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://svir"
        ) as client:
            yield client
    finally:
        await lifespan.stop()


async def test_each_front_end_names_itself_in_the_ledger(http: httpx.AsyncClient) -> None:
    body = {"model": "g/ok", "messages": HI, "stream": False}
    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert (await http.post("/api/chat", json=body)).status_code == 200
    thread = (await http.post("/v1/threads", json={"model": "g/ok"})).json()["id"]
    posted = await http.post(f"/v1/threads/{thread}/messages", json=HI[0])
    assert posted.status_code == 200, posted.text
    done = await http.post(f"/v1/threads/{thread}/continue", json={})
    assert done.status_code == 200, done.text
    usage = await http.get("/admin/usage?by=api,status", headers=ADMIN)
    rows = {(r["api"], r["status"]) for r in usage.json()["data"]}
    assert rows == {("openai", "ok"), ("ollama", "ok"), ("threads", "ok")}


async def test_the_metrics_count_a_cut_and_a_refusal_from_the_outcome(
    http: httpx.AsyncClient,
) -> None:
    # The budget holds the prompt's estimate and one answer token of the two the upstream sends.
    budget = estimate_prompt_tokens({"messages": HI}) + 1
    created = await http.post(
        "/admin/keys", json={"name": "tight", "tokens_per_day": budget}, headers=ADMIN
    )
    key = {"Authorization": f"Bearer {created.json()['key']}"}
    body = {"model": "g/ok", "messages": HI, "stream": True}
    cut = await http.post("/v1/chat/completions", json=body, headers=key)
    assert cut.status_code == 200 and b"tokens_per_day_exceeded" in cut.content
    refused = await http.post("/v1/chat/completions", json=body, headers=key)
    assert refused.status_code == 429
    found = samples((await http.get("/metrics", headers=ADMIN)).text)
    assert value(found, "svir_streams_cut_total", limit="tokens_per_day") == 1
    assert value(found, "svir_limit_rejections_total", limit="tokens_per_day") == 1
    outcome = {"model": "g/ok", "provider": "g", "outcome": "tokens_per_day_exceeded"}
    assert value(found, "svir_chat_requests_total", **outcome) == 1
    refusal = {"model": "g/ok", "provider": "none", "outcome": "tokens_per_day_exceeded"}
    assert value(found, "svir_chat_requests_total", **refusal) == 1
    assert value(found, "svir_streams_in_flight", provider="g") == 0
