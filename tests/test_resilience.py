"""The policy's rules on their own (the decision table, the balancer and breaker with a fake
clock, backoff, retry budget) and a Retry-After date read by the real upstream client against a
scripted upstream on loopback. The rules end to end through the whole app run in process
over a MockTransport: tests/test_policy_inprocess.py."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

from svir.call import INTERNAL, CallContext
from svir.config.load import parse_config
from svir.config.model import Config, RetryConfig, RouteTarget, Timeouts
from svir.edges.upstream import UpstreamClient
from svir.policy.resilience import (
    BREAKER_KINDS,
    FALLBACK_KINDS,
    Resilience,
    Timing,
    backoff_delay,
    nearest_effort,
)
from svir.policy.routing import Router
from svir.wire.classify import to_client_error
from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.mock_server import MockServerThread
from tests.support.upstream import ScriptedUpstream


def provider(name: str, base: str, extra: str = "") -> str:
    return f"""
[[providers]]
name = "{name}"
kind = "openai-compatible"
base_url = "{base}"
discover = false
{extra}
"""


# -- the balancer's rules, with a fake clock --------------------------------------------------


def policy(clock: list[float]) -> Resilience:
    config = parse_config(
        provider("p", "http://127.0.0.1:9/v1") + provider("q", "http://127.0.0.1:9/v1")
    )
    router = Router(config, {}, UpstreamClient())
    timing = Timing(rng=random.Random(1), clock=lambda: clock[0])
    return Resilience(config, router, router.client, timing=timing)


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


# Retry-After as an HTTP date: read against the wall clock at the edge (the clock injected).

T0 = 2_000_000_000.0


async def limited_once(retry_after: str, client: UpstreamClient) -> UpstreamError:
    """The error the upstream client makes of a 429 whose Retry-After is `retry_after`."""
    with MockServerThread(ScriptedUpstream(retry_after=retry_after)) as server:
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
    date = email.utils.formatdate(T0 + 60, usegmt=True)
    with MockServerThread(ScriptedUpstream(retry_after=date)) as server:
        config = parse_config(
            provider("p", server.base_url)
            + '[[routes]]\nname = "p/limited"\nfallbacks = ["p/ok"]\n'
        )
        client = UpstreamClient(clock=lambda: T0)
        router = Router(config, {}, client)
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        res = Resilience(config, router, client, timing=Timing(sleep=sleep, rng=random.Random(1)))
        try:
            request = {"model": "p/limited", "messages": [{"role": "user", "content": "hi"}]}
            call = await res.open(CallContext("t", INTERNAL), request)
            assert call.headers["x-svir-served-model"] == "p/ok"
            call.close()
        finally:
            await client.close()
    assert server.handler.hits["limited"] == 1 and slept == []


def test_least_in_flight_prefers_the_idle_deployment() -> None:
    clock = [0.0]
    res = policy(clock)
    targets = (RouteTarget("p/a"), RouteTarget("q/a"))
    res.deployment("p/a").in_flight = 3
    assert {res.pick(targets, "least-in-flight", set()).model for _ in range(20)} == {"q/a"}  # type: ignore[union-attr]
    res.deployment("q/a").in_flight = 6  # weighted by share: q's 6 of weight 1 > p's 3
    assert res.pick(targets, "least-in-flight", set()).model == "p/a"  # type: ignore[union-attr]


def test_a_prompt_cache_key_keeps_its_deployment_and_moves_only_while_it_rests() -> None:
    from svir.config.model import BreakerConfig

    clock = [0.0]
    res = policy(clock)
    targets = (RouteTarget("p/a"), RouteTarget("q/a", weight=2.0))
    for strategy in ("weighted", "least-in-flight"):
        chosen = {
            key: {res.pick(targets, strategy, set(), key).model for _ in range(10)}  # type: ignore[union-attr]
            for key in (f"conv-{i}" for i in range(60))
        }
        assert all(len(models) == 1 for models in chosen.values())  # each key, one deployment
        firsts = [next(iter(m)) for m in chosen.values()]
        # Both deployments get keys, the heavier one more (rendezvous weighted by share).
        assert 0 < firsts.count("p/a") < firsts.count("q/a")
    key = next(k for k, m in chosen.items() if m == {"p/a"})
    res.deployment("q/a").in_flight = 0
    res.deployment("p/a").in_flight = 9  # busy: the key stays anyway (its server has the cache)
    assert res.pick(targets, "least-in-flight", set(), key).model == "p/a"  # type: ignore[union-attr]
    assert res.pick(targets, "weighted", {"p/a"}, key).model == "q/a"  # type: ignore[union-attr]
    cfg = BreakerConfig(failures=1, cooldown=5.0)
    res._failed(res.deployment("p/a"), cfg)  # it rests: the key goes elsewhere meanwhile
    assert res.pick(targets, "weighted", set(), key).model == "q/a"  # type: ignore[union-attr]
    clock[0] = 5.1
    probe = res.pick(targets, "weighted", set(), key)
    assert probe is not None
    res._succeeded(res.deployment("p/a"))
    assert res.pick(targets, "weighted", set(), key).model == "p/a"  # type: ignore[union-attr]


def test_breaker_half_open_allows_one_probe() -> None:
    clock = [0.0]
    res = policy(clock)
    from svir.config.model import BreakerConfig

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
