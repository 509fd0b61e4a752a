"""Retries, fallback, load balancing, breakers and the learned quirks, through the whole svir app
(`build_app`, every front end) in this process, over a `tests.support.mock_transport.MockTransport` whose
handler plays a faulty upstream: each model name is a behaviour (`ScriptedUpstream`,
tests/support/upstream.py). The policy's sleep, random source and clock are injected, so no
test waits for real time except the first-byte timeout's."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from svir.config.model import Timeouts
from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.inprocess import InProcess
from tests.support.mock_transport import MockResponse, MockTransport
from tests.support.upstream import ScriptedUpstream, error

BASE = "http://upstream.test/v1"


def provider(name: str, extra: str = "") -> str:
    return f"""
[[providers]]
name = "{name}"
kind = "openai-compatible"
base_url = "{BASE}"
discover = false
{extra}
"""


CONFIG = (
    provider(
        "f",
        "[providers.retry]\nattempts = 3\nbackoff = 0.01\nmax_backoff = 0.05\n"
        "[providers.timeouts]\nfirst_byte = 0.1\nidle = 0.5",
    )
    + provider("g")
    + provider("capped", "[providers.retry]\nretry_after_cap = 0.5")
    + provider(
        "b", "[providers.retry]\nattempts = 1\n[providers.breaker]\nfailures = 2\ncooldown = 1.0"
    )
    + provider("p")
    + provider("p1", "[providers.retry]\nattempts = 1\n")
    + """
[[routes]]
name = "f/always-503"
fallbacks = ["g/ok"]

[[routes]]
name = "f/overflow"
fallbacks = ["g/flaky-0"]
context_fallback = "g/ok"

[[routes]]
name = "f/filtered"
fallbacks = ["g/ok"]

[[routes]]
name = "p/filtered"
fallbacks = ["g/ok"]
fallback_on_content_filter = true

[[routes]]
name = "g/missing"
fallbacks = ["g/ok"]

[[routes]]
name = "lb"
targets = [{ model = "f/ok", weight = 3 }, { model = "g/ok", weight = 1 }]

[[routes]]
name = "lif"
strategy = "least-in-flight"
targets = [{ model = "f/ok" }, { model = "g/ok" }]
"""
)


class Svir(InProcess):
    """The app over the scripted upstream, with the policy's sleep and clock recorded."""

    def __init__(self, tmp: Path) -> None:
        self.faults = ScriptedUpstream(retry_after="1")
        super().__init__(tmp, CONFIG, self.faults)

    async def ask(self, model: str, **kw: Any) -> Any:
        return await self.client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], **kw
        )

    async def text(self, model: str) -> str:
        raw = await self.ask(model, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])

    async def deployments(self) -> dict[str, Any]:
        r = await self.http.get("/healthz?verbose=1")
        out: dict[str, Any] = r.json()["deployments"]
        return out


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[Svir]:
    s = Svir(tmp_path)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def test_transient_failures_are_retried_before_the_first_byte(svir: Svir) -> None:
    assert await svir.text("f/flaky-2") == "hello world"
    assert svir.faults.hits["flaky-2"] == 3
    with pytest.raises(openai.InternalServerError):
        await svir.ask("f/flaky-5")
    assert svir.faults.hits["flaky-5"] == 3  # the provider's attempts, and no more


async def test_a_transient_503_is_retried_once_then_served(svir: Svir) -> None:
    assert await svir.text("f/flaky-1") == "hello world"
    assert len(svir.transport.requests) == 2
    assert [r.url for r in svir.transport.requests] == [BASE + "/chat/completions"] * 2


async def test_a_400_is_not_retried(svir: Svir) -> None:
    with pytest.raises(openai.BadRequestError):
        await svir.ask("f/rejected")
    assert svir.faults.hits["rejected"] == 1 and svir.slept == []


async def test_fallback_serves_and_says_which_model(svir: Svir) -> None:
    raw = await svir.ask("f/always-503")
    completion = raw.parse()
    assert completion.choices[0].message.content == "hello world"
    assert completion.model == "g/ok"
    assert raw.headers["x-svir-served-model"] == "g/ok"
    assert svir.faults.hits["ok"] == 1
    # The route's own model first, retried as its provider allows, then the fallback.
    assert [b["model"] for b in svir.bodies()] == ["always-503"] * 3 + ["ok"]


async def test_retry_after_is_honoured(svir: Svir) -> None:
    await svir.ask("f/limited")
    assert svir.slept == [1.0]  # the upstream's Retry-After, not the provider's backoff
    assert svir.faults.hits["limited"] == 2


async def test_retry_after_over_the_cap_is_not_waited_for(svir: Svir) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        await svir.ask("capped/limited")
    assert svir.slept == []
    assert info.value.response.headers["retry-after"] == "1"


async def test_hang_before_headers_is_retried_then_504(svir: Svir) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await svir.ask("f/stall-first-byte", stream=True)
    assert info.value.status_code == 504
    assert svir.faults.hits["stall-first-byte"] == 3


async def test_reset_before_output_is_retried(svir: Svir) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await svir.ask("f/reset-early", stream=True)
    assert info.value.status_code == 502
    assert svir.faults.hits["reset-early"] == 3


async def test_no_retry_once_output_went_out(svir: Svir) -> None:
    body = {"model": "f/reset-late", "messages": [{"role": "user", "content": "hi"}]}
    r = await svir.http.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200
    assert b"partial" in r.content and r.content.count(b"partial") == 1  # nothing duplicated
    frames = [f for f in r.content.split(b"\n\n") if f]
    assert b'"error"' in frames[-1] and b"[DONE]" not in r.content
    assert len([f for f in frames if b'"error"' in f]) == 1  # one error frame
    assert svir.faults.hits["reset-late"] == 1


async def test_context_overflow_goes_to_the_larger_model_only(svir: Svir) -> None:
    completion = (await svir.ask("f/overflow")).parse()
    assert completion.model == "g/ok"
    assert svir.faults.hits["flaky-0"] == 0  # not an ordinary fallback


async def test_other_failures_do_not_take_the_context_fallback(svir: Svir) -> None:
    # f/overflow's route: a 503 of its ordinary fallback is not an overflow.
    svir.faults.hits["flaky-0"] = 0
    completion = (await svir.ask("f/overflow")).parse()
    assert completion.model == "g/ok"
    assert svir.faults.hits["ok"] == 1 and svir.faults.hits["overflow"] == 1


async def test_content_filter_never_falls_back_by_default(svir: Svir) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await svir.ask("f/filtered")
    assert info.value.code == "content_filter"
    assert svir.faults.hits["ok"] == 0
    # The block is the answer, as the server gave it: its words, not retried.
    assert info.value.status_code == 400 and "filtered" in info.value.message
    assert svir.faults.hits["filtered"] == 1


async def test_content_filter_falls_back_when_the_route_asks(svir: Svir) -> None:
    # p/filtered's route sets fallback_on_content_filter: the block goes to the next target.
    raw = await svir.ask("p/filtered")
    completion = raw.parse()
    assert completion.choices[0].message.content == "hello world"
    assert completion.model == "g/ok" and raw.headers["x-svir-served-model"] == "g/ok"
    assert [b["model"] for b in svir.bodies()] == ["filtered", "ok"]  # tried once, no retry


async def test_breaker_opens_rests_and_probes_back(svir: Svir) -> None:
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await svir.ask("b/always-503")
    hits = svir.faults.hits["always-503"]
    with pytest.raises(openai.APIStatusError) as info:
        await svir.ask("b/always-503")
    assert info.value.status_code == 503 and info.value.code == "upstream_unavailable"
    assert svir.faults.hits["always-503"] == hits  # the resting deployment was not asked
    state = (await svir.deployments())["b/always-503"]
    assert state["state"] == "open" and state["failures"] == 2
    svir.now += 1.1  # past the cooldown
    with pytest.raises(openai.InternalServerError):
        await svir.ask("b/always-503")  # the one probe
    assert svir.faults.hits["always-503"] == hits + 1
    assert (await svir.deployments())["b/always-503"]["state"] == "open"


async def test_rejected_reasoning_effort_is_mapped_and_remembered(svir: Svir) -> None:
    raw = await svir.ask("g/effort", reasoning_effort="high")
    assert raw.parse().choices[0].message.content == "hello world"
    assert "xhigh" in raw.headers["x-svir-warning"]
    efforts = [b.get("reasoning_effort") for b in svir.bodies() if b["model"] == "effort"]
    assert efforts == ["high", "xhigh"]
    await svir.ask("g/effort", reasoning_effort="high")
    efforts = [b.get("reasoning_effort") for b in svir.bodies() if b["model"] == "effort"]
    assert efforts == ["high", "xhigh", "xhigh"]  # learned: the second request pays once
    quirks = (await svir.http.get("/healthz?verbose=1")).json()["quirks"]
    assert quirks["g"]["reasoning_effort"] == {"high": "xhigh"}


async def test_rejected_stream_options_is_dropped_and_remembered(svir: Svir) -> None:
    for _ in range(2):
        assert await svir.text("g/no-stream-options") == "hello world"
    sent = ["stream_options" in b for b in svir.bodies() if b["model"] == "no-stream-options"]
    assert sent == [True, False, False]


async def test_an_upstream_404_for_its_model_is_a_404_model_not_found(svir: Svir) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await svir.ask("f/missing")
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert svir.faults.hits["missing"] == 1  # not retried (the provider allows 3 attempts)
    # Ollama's front end answers as Ollama does for a model it does not have.
    r = await svir.http.post(
        "/api/chat", json={"model": "f/missing", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 404 and r.json() == {"error": "model 'f/missing' not found"}


async def test_a_missing_model_falls_back(svir: Svir) -> None:
    raw = await svir.ask("g/missing")
    assert raw.parse().model == "g/ok"
    assert svir.faults.hits["missing"] == 1


async def test_a_missing_model_does_not_rest_the_deployment(svir: Svir) -> None:
    for _ in range(3):  # provider b rests a deployment after 2 failures
        with pytest.raises(openai.NotFoundError):
            await svir.ask("b/missing")
    state = (await svir.deployments())["b/missing"]
    assert state["state"] == "closed" and state["failures"] == 0


async def test_weighted_load_balancing(svir: Svir) -> None:
    served = [(await svir.ask("lb")).parse().model for _ in range(40)]
    assert set(served) == {"f/ok", "g/ok"}
    assert served.count("f/ok") > served.count("g/ok")


async def test_least_in_flight_sends_to_the_idle_deployment(svir: Svir) -> None:
    policy = svir.app.gateway.policy
    policy.deployment("f/ok").in_flight = 2
    served = [(await svir.ask("lif")).parse().model for _ in range(5)]
    assert served == ["g/ok"] * 5  # each request ends before the next: g stays the idler
    assert policy.deployment("f/ok").in_flight == 2 and policy.deployment("g/ok").in_flight == 0


# The breaker counts the deployment's failures, not the model's (BREAKER_KINDS).


async def serve(svir: Svir, model: str) -> None:
    """One streamed request through the app, read to its end or its error."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    await svir.http.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize(
    "model",
    [
        "parse-fail-late",  # llama.cpp's parser failing on the model's tool call, mid-stream
        "overflow",
        "filtered",
        "missing",
        "rejected",
    ],
)
async def test_model_caused_failures_leave_the_breaker_closed(svir: Svir, model: str) -> None:
    for _ in range(5):
        await serve(svir, f"p/{model}")
    d = svir.app.gateway.policy.deployment(f"p/{model}")
    assert (d.state(svir.now), d.failures) == ("closed", 0)
    assert svir.faults.hits[model] == 5


@pytest.mark.parametrize("model", ["crash-late", "reset-late", "always-503"])
async def test_five_failures_of_the_deployment_open_its_breaker(svir: Svir, model: str) -> None:
    for _ in range(5):
        await serve(svir, f"p1/{model}")
    d = svir.app.gateway.policy.deployment(f"p1/{model}")
    assert d.state(svir.now) == "open" and d.failures == 5


# The mock fails as the real client does (the shared rules of svir.transport).


async def open_one(answer: MockResponse, clock: float = 2_000_000_000.0) -> UpstreamError:
    mock = MockTransport(lambda request: answer, clock=lambda: clock)
    with pytest.raises(UpstreamError) as info:
        await mock.open_stream(BASE, headers={}, body=[b"{", b"}"], timeouts=Timeouts())
    assert mock.requests[0].body == b"{}" and mock.requests[0].method == "POST"
    return info.value


async def test_the_mock_refuses_a_2xx_that_is_not_an_event_stream() -> None:
    err = await open_one(MockResponse.json({"choices": []}))
    assert err.kind is ErrorKind.NOT_A_STREAM


async def test_the_mock_classifies_an_error_with_its_clock() -> None:
    date = email.utils.formatdate(2_000_000_005.0, usegmt=True)
    err = await open_one(error(429, {"error": {"message": "slow"}}, {"retry-after": date}))
    assert err.kind is ErrorKind.RATE_LIMITED and err.retry_after == 5.0


async def test_the_mock_reads_an_auth_errors_words_and_not_a_stalled_body() -> None:
    async def stalls() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()  # the head of a refusal, and its body never
        yield b""

    # Given up on after svir.transport.AUTH_BODY_TIMEOUT: the error without the server's words.
    err = await open_one(MockResponse(401, stalls(), {"Content-Type": "application/json"}))
    assert err.kind is ErrorKind.AUTH and err.message == "HTTP 401"
    err = await open_one(error(401, {"error": {"message": "Invalid key for this project"}}))
    assert err.kind is ErrorKind.AUTH and err.message == "Invalid key for this project"
