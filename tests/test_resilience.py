"""Retries, fallback, load balancing and breakers, end to end through svir against a
fault-injecting upstream on loopback, and the balancer's rules on their own."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from svir.config import Config, RetryConfig, RouteTarget, Timeouts, parse_config
from svir.edges.upstream import UpstreamClient
from svir.errors import GatewayError
from svir.policy.resilience import (
    BREAKER_KINDS,
    FALLBACK_KINDS,
    Resilience,
    backoff_delay,
    nearest_effort,
)
from svir.policy.routing import Router
from svir.wire.classify import to_client_error
from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.faults import FaultServer
from tests.support.svir_proc import SvirProcess


def provider(name: str, base: str, extra: str = "") -> str:
    return f"""
[[providers]]
name = "{name}"
kind = "openai-compatible"
base_url = "{base}"
discover = false
{extra}
"""


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    with FaultServer(retry_after="1") as server:
        yield server


@pytest.fixture(scope="module")
def svir(faults: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    fast = "[providers.retry]\nattempts = 3\nbackoff = 0.01\nmax_backoff = 0.05\n[providers.timeouts]\nfirst_byte = 0.5\nidle = 0.5"
    config = (
        provider("f", faults.base_url, fast)
        + provider("g", faults.base_url)
        + provider("capped", faults.base_url, "[providers.retry]\nretry_after_cap = 0.5")
        + provider(
            "b",
            faults.base_url,
            "[providers.retry]\nattempts = 1\n[providers.breaker]\nfailures = 2\ncooldown = 1.0",
        )
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
name = "g/missing"
fallbacks = ["g/ok"]

[[routes]]
name = "lb"
targets = [{ model = "f/ok", weight = 3 }, { model = "g/ok", weight = 1 }]
"""
    )
    with SvirProcess(config, tmp_path_factory.mktemp("svir-faults")) as proc:
        yield proc


@pytest.fixture
def client(svir: SvirProcess) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=svir.base_url, max_retries=0, timeout=20)


def ask(client: openai.OpenAI, model: str, **kw: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], **kw
    )


def test_transient_failures_are_retried_before_the_first_byte(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    raw = ask(client, "f/flaky-2", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == "hello world"
    assert faults.hits["flaky-2"] == 3
    with pytest.raises(openai.InternalServerError):
        ask(client, "f/flaky-5")
    assert faults.hits["flaky-5"] == 3  # the provider's attempts, and no more


def test_fallback_serves_and_says_which_model(client: openai.OpenAI, faults: FaultServer) -> None:
    before = faults.hits["ok"]
    raw = ask(client, "f/always-503")
    completion = raw.parse()
    assert completion.choices[0].message.content == "hello world"
    assert completion.model == "g/ok"
    assert raw.headers["x-svir-served-model"] == "g/ok"
    assert faults.hits["ok"] == before + 1


def test_retry_after_is_honoured(client: openai.OpenAI, faults: FaultServer) -> None:
    t = time.monotonic()
    ask(client, "f/limited")
    assert time.monotonic() - t >= 0.95
    assert faults.hits["limited"] == 2


def test_retry_after_over_the_cap_is_not_waited_for(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    faults.hits["limited"] = 0
    t = time.monotonic()
    with pytest.raises(openai.RateLimitError) as info:
        ask(client, "capped/limited")
    assert time.monotonic() - t < 0.9
    assert info.value.response.headers["retry-after"] == "1"


def test_hang_before_headers_is_retried_then_504(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        ask(client, "f/hang-headers", stream=True)
    assert info.value.status_code == 504
    assert faults.hits["hang-headers"] == 3


def test_reset_before_output_is_retried(client: openai.OpenAI, faults: FaultServer) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        ask(client, "f/reset-early", stream=True)
    assert info.value.status_code == 502
    assert faults.hits["reset-early"] == 3


def test_no_retry_once_output_went_out(svir: SvirProcess, faults: FaultServer) -> None:
    body = {
        "model": "f/reset-late",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    r = httpx.post(svir.base_url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    assert b"partial" in r.content and r.content.count(b"partial") == 1  # nothing duplicated
    frames = [f for f in r.content.split(b"\n\n") if f]
    assert b'"error"' in frames[-1] and b"[DONE]" not in r.content
    assert faults.hits["reset-late"] == 1


def test_context_overflow_goes_to_the_larger_model_only(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    completion = ask(client, "f/overflow").parse()
    assert completion.model == "g/ok"
    assert faults.hits["flaky-0"] == 0  # not an ordinary fallback


def test_content_filter_never_falls_back_by_default(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    before = faults.hits["ok"]
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, "f/filtered")
    assert info.value.code == "content_filter"
    assert faults.hits["ok"] == before


def test_breaker_opens_rests_and_probes_back(
    client: openai.OpenAI, svir: SvirProcess, faults: FaultServer
) -> None:
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            ask(client, "b/always-503")
    hits = faults.hits["always-503"]
    with pytest.raises(openai.APIStatusError) as info:
        ask(client, "b/always-503")
    assert info.value.status_code == 503 and info.value.code == "upstream_unavailable"
    assert faults.hits["always-503"] == hits  # the resting deployment was not asked
    state = httpx.get(svir.url + "/healthz?verbose=1").json()["deployments"]["b/always-503"]
    assert state["state"] == "open" and state["failures"] == 2
    time.sleep(1.1)
    with pytest.raises(openai.InternalServerError):
        ask(client, "b/always-503")  # the one probe
    assert faults.hits["always-503"] == hits + 1
    assert (
        httpx.get(svir.url + "/healthz?verbose=1").json()["deployments"]["b/always-503"]["state"]
        == "open"
    )


def test_rejected_reasoning_effort_is_mapped_and_remembered(
    client: openai.OpenAI, svir: SvirProcess, faults: FaultServer
) -> None:
    raw = ask(client, "g/effort", reasoning_effort="high")
    assert raw.parse().choices[0].message.content == "hello world"
    assert "xhigh" in raw.headers["x-svir-warning"]
    efforts = [b.get("reasoning_effort") for b in faults.bodies if b["model"] == "effort"]
    assert efforts == ["high", "xhigh"]
    ask(client, "g/effort", reasoning_effort="high")
    efforts = [b.get("reasoning_effort") for b in faults.bodies if b["model"] == "effort"]
    assert efforts == ["high", "xhigh", "xhigh"]  # learned: the second request pays once
    quirks = httpx.get(svir.url + "/healthz?verbose=1").json()["quirks"]
    assert quirks["g"]["reasoning_effort"] == {"high": "xhigh"}


def test_rejected_stream_options_is_dropped_and_remembered(
    client: openai.OpenAI, faults: FaultServer
) -> None:
    for _ in range(2):
        text = "".join(
            c.choices[0].delta.content or ""
            for c in ask(client, "g/no-stream-options", stream=True).parse()
            if c.choices
        )
        assert text == "hello world"
    sent = ["stream_options" in b for b in faults.bodies if b["model"] == "no-stream-options"]
    assert sent == [True, False, False]


def test_an_upstream_404_for_its_model_is_a_404_model_not_found(
    client: openai.OpenAI, svir: SvirProcess, faults: FaultServer
) -> None:
    before = faults.hits["missing"]
    with pytest.raises(openai.NotFoundError) as info:
        ask(client, "f/missing")
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert faults.hits["missing"] == before + 1  # not retried (the provider allows 3 attempts)
    # Ollama's front end answers as Ollama does for a model it does not have.
    r = httpx.post(
        svir.url + "/api/chat",
        json={"model": "f/missing", "messages": [{"role": "user", "content": "hi"}]},
        timeout=20,
    )
    assert r.status_code == 404 and r.json() == {"error": "model 'f/missing' not found"}


def test_a_missing_model_falls_back(client: openai.OpenAI, faults: FaultServer) -> None:
    before = faults.hits["missing"]
    raw = ask(client, "g/missing")
    assert raw.parse().model == "g/ok"
    assert faults.hits["missing"] == before + 1


def test_a_missing_model_does_not_rest_the_deployment(
    client: openai.OpenAI, svir: SvirProcess
) -> None:
    for _ in range(3):  # provider b rests a deployment after 2 failures
        with pytest.raises(openai.NotFoundError):
            ask(client, "b/missing")
    state = httpx.get(svir.url + "/healthz?verbose=1").json()["deployments"]["b/missing"]
    assert state["state"] == "closed" and state["failures"] == 0


def test_weighted_load_balancing(client: openai.OpenAI, faults: FaultServer) -> None:
    served = [ask(client, "lb").parse().model for _ in range(40)]
    assert set(served) == {"f/ok", "g/ok"}
    assert served.count("f/ok") > served.count("g/ok")


# -- the balancer's rules, with a fake clock --------------------------------------------------


def policy(clock: list[float]) -> Resilience:
    config = parse_config(
        provider("p", "http://127.0.0.1:9/v1") + provider("q", "http://127.0.0.1:9/v1")
    )
    router = Router(config, {}, UpstreamClient())
    return Resilience(config, router, router.client, rng=random.Random(1), clock=lambda: clock[0])


# What each kind of failure gets: retried (before the first byte), sent to a fallback, counted
# toward the deployment's breaker. The same table is in docs/providers.md.
DECISIONS = {
    ErrorKind.TRANSIENT: (True, True, True),
    ErrorKind.TIMEOUT: (True, True, True),
    ErrorKind.RATE_LIMITED: (True, True, True),
    ErrorKind.INCOMPLETE: (True, True, True),
    ErrorKind.AUTH: (False, True, True),
    ErrorKind.NOT_A_STREAM: (False, True, True),
    ErrorKind.PROTOCOL: (False, True, True),
    ErrorKind.MODEL_OUTPUT: (False, True, False),
    ErrorKind.MODEL_NOT_FOUND: (False, True, False),
    ErrorKind.UNSUPPORTED_INPUT: (False, True, False),
    ErrorKind.OTHER: (False, True, False),
    ErrorKind.REJECTED: (False, False, False),
    ErrorKind.CONTEXT_OVERFLOW: (False, False, False),  # only to a route's context_fallback
    ErrorKind.CONTENT_FILTER: (False, False, False),  # only with fallback_on_content_filter
}


def test_every_kind_is_decided() -> None:
    assert set(DECISIONS) == set(ErrorKind)


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_the_decision_table(kind: ErrorKind) -> None:
    retry, fallback, breaker = DECISIONS[kind]
    err = UpstreamError(kind, "x")
    assert err.retryable is retry  # the one retry decision, which the policy uses
    assert (kind in FALLBACK_KINDS) is fallback
    assert (kind in BREAKER_KINDS) is breaker


@pytest.fixture
async def inprocess(faults: FaultServer) -> Any:
    """A policy in this process, against the fault server (default retries and breaker)."""
    made: list[UpstreamClient] = []

    def make(extra: str = "", clock: Callable[[], float] = time.time) -> Resilience:
        config = parse_config(provider("p", faults.base_url) + extra)
        client = UpstreamClient(clock=clock)
        made.append(client)
        router = Router(config, {}, client)
        return Resilience(config, router, client, rng=random.Random(1))

    yield make
    for client in made:
        await client.close()


async def serve(res: Resilience, model: str) -> None:
    """One streamed request through the policy, read to its end or its error."""
    request = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    try:
        call = await res.open(request, request_id="t")
    except GatewayError:
        return
    async for _ in call.stream():
        pass


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
async def test_model_caused_failures_leave_the_breaker_closed(
    inprocess: Callable[..., Resilience], model: str
) -> None:
    res = inprocess()
    for _ in range(5):
        await serve(res, f"p/{model}")
    d = res.deployment(f"p/{model}")
    assert (d.state(time.monotonic()), d.failures) == ("closed", 0)


@pytest.mark.parametrize("model", ["crash-late", "reset-late", "always-503"])
async def test_five_failures_of_the_deployment_open_its_breaker(
    inprocess: Callable[..., Resilience], model: str
) -> None:
    res = inprocess("[providers.retry]\nattempts = 1\n")
    for _ in range(5):
        await serve(res, f"p/{model}")
    d = res.deployment(f"p/{model}")
    assert d.state(time.monotonic()) == "open" and d.failures == 5


# Retry-After as an HTTP date: read against the wall clock at the edge (the clock injected).

T0 = 2_000_000_000.0


async def limited_once(retry_after: str, client: UpstreamClient) -> UpstreamError:
    """The error the upstream client makes of a 429 whose Retry-After is `retry_after`."""
    with FaultServer(retry_after=retry_after) as server:
        try:
            with pytest.raises(UpstreamError) as info:
                await client.open_stream(
                    server.base_url + "/chat/completions",
                    headers={"Content-Type": "application/json"},
                    body=b'{"model": "limited"}',
                    timeouts=Timeouts(),
                )
        finally:
            await client.close()
    return info.value


async def test_an_http_date_retry_after_counts_through_the_upstream_client() -> None:
    date = email.utils.formatdate(T0 + 5, usegmt=True)
    err = await limited_once(date, UpstreamClient(clock=lambda: T0))
    assert err.kind is ErrorKind.RATE_LIMITED and err.retry_after == 5.0
    assert to_client_error(err).headers == {"Retry-After": "5"}


async def test_an_http_date_retry_after_is_read_against_the_wall_clock() -> None:
    err = await limited_once(
        email.utils.formatdate(time.time() + 600, usegmt=True), UpstreamClient()
    )
    assert err.retry_after is not None and 300 < err.retry_after <= 600


async def test_an_http_date_over_the_cap_goes_to_the_fallback() -> None:
    # 60 s ahead, over the default cap of 30 s: not waited for, the fallback serves at once.
    with FaultServer(retry_after=email.utils.formatdate(T0 + 60, usegmt=True)) as server:
        config = parse_config(
            provider("p", server.base_url)
            + '[[routes]]\nname = "p/limited"\nfallbacks = ["p/ok"]\n'
        )
        client = UpstreamClient(clock=lambda: T0)
        router = Router(config, {}, client)
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        res = Resilience(config, router, client, sleep=sleep, rng=random.Random(1))
        try:
            request = {"model": "p/limited", "messages": [{"role": "user", "content": "hi"}]}
            call = await res.open(request, request_id="t")
            assert call.headers["x-svir-served-model"] == "p/ok"
            call.close()
        finally:
            await client.close()
    assert server.hits["limited"] == 1 and slept == []


def test_least_in_flight_prefers_the_idle_deployment() -> None:
    clock = [0.0]
    res = policy(clock)
    targets = (RouteTarget("p/a"), RouteTarget("q/a"))
    res.deployment("p/a").in_flight = 3
    assert {res.pick(targets, "least-in-flight", set()).model for _ in range(20)} == {"q/a"}  # type: ignore[union-attr]
    res.deployment("q/a").in_flight = 6  # weighted by share: q's 6 of weight 1 > p's 3
    assert res.pick(targets, "least-in-flight", set()).model == "p/a"  # type: ignore[union-attr]


def test_breaker_half_open_allows_one_probe() -> None:
    clock = [0.0]
    res = policy(clock)
    from svir.config import BreakerConfig

    d = res.deployment("p/a")
    cfg = BreakerConfig(failures=2, cooldown=5.0)
    res._failed(d, cfg)
    assert res.pick((RouteTarget("p/a"),), "weighted", set()) is d
    res._failed(d, cfg)
    assert res.pick((RouteTarget("p/a"),), "weighted", set()) is None
    clock[0] = 5.1
    assert res.pick((RouteTarget("p/a"),), "weighted", set()) is d  # the probe
    assert res.pick((RouteTarget("p/a"),), "weighted", set()) is None  # only one at a time
    res._succeeded(d)
    assert res.pick((RouteTarget("p/a"),), "weighted", set()) is d
    assert d.state(clock[0]) == "closed"


def test_backoff_grows_and_is_capped() -> None:
    cfg = RetryConfig(backoff=0.1, max_backoff=1.0)
    rng = random.Random(0)
    delays = [backoff_delay(n, cfg, rng) for n in range(8)]
    assert 0.05 <= delays[0] <= 0.1
    assert all(0.5 <= d <= 1.0 for d in delays[4:])


@pytest.mark.parametrize(
    ("rejected", "message", "want"),
    [
        (
            "high",
            "Unexpected reasoning effort high. Supported types are xhigh (default), medium, and low.",
            "xhigh",
        ),
        ("minimal", "supported: low, high", "low"),
        ("high", "reasoning_effort is not supported", None),
    ],
)
def test_nearest_effort(rejected: str, message: str, want: str | None) -> None:
    assert nearest_effort(rejected, message) == want


def test_routes_are_checked_at_load() -> None:
    from svir.errors import ConfigError

    with pytest.raises(ConfigError, match=r"routes\[0\].fallbacks\[0\]"):
        parse_config(
            provider("p", "http://h/v1") + '[[routes]]\nname = "p/x"\nfallbacks = ["nope/y"]\n'
        )
    with pytest.raises(ConfigError, match=r"routes\[0\].strategy"):
        parse_config(
            provider("p", "http://h/v1") + '[[routes]]\nname = "p/x"\nstrategy = "random"\n'
        )
    config: Config = parse_config(
        provider("p", "http://h/v1") + '[[routes]]\nname = "smart"\ntargets = [{ model = "p/x" }]\n'
    )
    assert config.routes[0].targets[0].model == "p/x"


def test_retry_budget_bounds_retries_under_sustained_failure() -> None:
    from svir.policy.resilience import RetryBudget

    budget = RetryBudget(0.2, now=0.0, per_second=3.0, cap=20.0)
    allowed = 0
    for i in range(1000):  # 1,000 requests within one second, each wanting a retry
        budget.deposit(i / 1000)
        allowed += budget.take()
    # 20 saved up, 20% of the requests, and 3 for the second that passed.
    assert 200 <= allowed <= 20 + 200 + 3
