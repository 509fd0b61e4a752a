"""One suite, both backends: the in-process counters and Redis (127.0.0.1:6379, which every dev
and CI machine runs: these tests fail, not skip, when it is down)."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svir.errors import LimitsUnavailable
from svir.keys.limits import (
    LIMIT_NAMES,
    Ask,
    Backend,
    Denied,
    Grant,
    Limits,
    MemoryBackend,
    windows_at,
)
from svir.keys.limits_redis import RedisBackend

REDIS_URL = "redis://127.0.0.1:6379/0"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def at(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, second: float = 0
) -> float:
    whole = datetime.datetime(year, month, day, hour, minute, tzinfo=datetime.UTC).timestamp()
    return whole + second


async def _cleanup(prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


Factory = Callable[..., Backend]


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    prefix = f"svirtest-{uuid.uuid4().hex[:8]}"
    made: list[Backend] = []

    def factory(clock: Clock, lease_seconds: float = 300.0) -> Backend:
        backend: Backend
        if request.param == "memory":
            backend = made[0] if made else MemoryBackend(lease_seconds=lease_seconds, clock=clock)
        else:
            backend = RedisBackend(
                REDIS_URL, prefix=prefix, lease_seconds=lease_seconds, clock=clock
            )
        made.append(backend)
        return backend

    yield factory
    for backend in {id(b): b for b in made}.values():
        await backend.close()
    if request.param == "redis":
        await _cleanup(prefix)


async def started(make: Factory, clock: Clock, **kw: float) -> Backend:
    backend = make(clock, **kw)
    await backend.start()
    return backend


def subject() -> str:
    return "key_" + uuid.uuid4().hex[:12]


def granted(result: Grant | Denied) -> Grant:
    assert isinstance(result, Grant), result
    return result


def denied(result: Grant | Denied) -> Denied:
    assert isinstance(result, Denied), result
    return result


ONE = Ask(tokens=1, floor=1)


async def test_rpm_sliding_window_and_honest_retry_after(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=30))  # half way through a minute
    b = await started(make, clock)
    s, limits = subject(), Limits(rpm=3)
    for _ in range(3):
        granted(await b.admit(s, limits, ONE, uuid.uuid4().hex))
    d = denied(await b.admit(s, limits, ONE, uuid.uuid4().hex))
    assert d.limit == "rpm" and d.value == 3 and d.used == 3
    # Next minute, the 3 decay: 3 * (1 - f) + 1 <= 3 once f >= 1/3, i.e. 20 s into it: 50 s on.
    assert d.retry_after == pytest.approx(50, abs=0.01)
    clock.now += 49
    denied(await b.admit(s, limits, ONE, uuid.uuid4().hex))
    clock.now += 1.01
    granted(await b.admit(s, limits, ONE, uuid.uuid4().hex))


async def test_refused_calls_do_not_count(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(rpm=1)
    granted(await b.admit(s, limits, ONE, "a"))
    for _ in range(5):
        denied(await b.admit(s, limits, ONE, uuid.uuid4().hex))
    clock.now += 120
    granted(await b.admit(s, limits, ONE, "b"))


async def test_tpm_reserves_then_settles_to_what_was_used(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(tpm=1000)
    g = granted(await b.admit(s, limits, Ask(tokens=800, floor=100), "a"))
    assert g.tokens == 800
    d = denied(await b.admit(s, limits, Ask(tokens=300, floor=100), "b"))
    assert d.limit == "tpm" and d.used == 800
    await b.settle(g, 150, 0)  # the answer was short
    assert (await b.figures(s, limits)).used["tpm"] == 150
    granted(await b.admit(s, limits, Ask(tokens=300, floor=100), "c"))
    # A request larger than the whole limit waits for an empty window, then goes.
    clock.now += 200
    big = granted(await b.admit(s, limits, Ask(tokens=5000, floor=10), "d"))
    assert big.tokens == 5000


async def test_concurrency_slots_are_given_back_and_expire(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock, lease_seconds=30)
    s, limits = subject(), Limits(concurrent=2)
    g1 = granted(await b.admit(s, limits, ONE, "a"))
    granted(await b.admit(s, limits, ONE, "b"))
    d = denied(await b.admit(s, limits, ONE, "c"))
    assert d.limit == "concurrent" and d.retry_after >= 1
    await b.settle(g1, 0, 0)
    g3 = granted(await b.admit(s, limits, ONE, "c"))
    # A long call renews its slot; a replica that died leaves one that expires.
    clock.now += 20
    await b.extend(g3, 0, 0)
    clock.now += 20  # "b" is past its lease, "c" was renewed
    assert (await b.figures(s, limits)).used["concurrent"] == 1
    granted(await b.admit(s, limits, ONE, "d"))
    denied(await b.admit(s, limits, ONE, "e"))


async def test_daily_budget_partial_grant_extend_and_settle(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 22, 0, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(tokens_per_day=100)
    g1 = granted(await b.admit(s, limits, Ask(tokens=80, floor=10), "a"))
    assert g1.tokens == 80
    # Less than asked is left, more than the prompt: the call starts with what is left.
    g2 = granted(await b.admit(s, limits, Ask(tokens=80, floor=10), "b"))
    assert g2.tokens == 20
    d = denied(await b.admit(s, limits, Ask(tokens=5, floor=2), "c"))
    assert d.limit == "tokens_per_day" and d.budget
    assert d.retry_after == pytest.approx(2 * 3600, abs=0.01)  # until midnight UTC
    await b.settle(g1, 50, 0)
    assert await b.extend(g2, 100, 0) == (30, 0)
    assert g2.tokens == 50
    assert await b.extend(g2, 100, 0) == (0, 0)
    await b.settle(g2, 45, 0)
    assert (await b.figures(s, limits)).used["tokens_per_day"] == 95
    # The prompt alone does not fit in what is left: refused.
    denied(await b.admit(s, limits, Ask(tokens=50, floor=6), "d"))
    granted(await b.admit(s, limits, Ask(tokens=50, floor=5), "e"))
    clock.now += 2 * 3600  # a new day
    g = granted(await b.admit(s, limits, Ask(tokens=80, floor=10), "f"))
    assert g.tokens == 80 and g.day == g1.day + 1


async def test_monthly_budget_rolls_over_with_the_calendar(make: Factory) -> None:
    clock = Clock(at(2026, 2, 28, 23, 59, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(tokens_per_month=10)
    granted(await b.admit(s, limits, Ask(tokens=10, floor=1), "a"))
    d = denied(await b.admit(s, limits, Ask(tokens=1, floor=1), "b"))
    assert d.limit == "tokens_per_month"
    assert d.retry_after == pytest.approx(60, abs=0.01)  # March starts in a minute
    clock.now += 61
    granted(await b.admit(s, limits, Ask(tokens=10, floor=1), "c"))
    assert windows_at(clock.now).month == 2026 * 12 + 2


async def test_cost_budget_and_free_calls(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(cost_per_day=1000, cost_per_month=1500)
    g = granted(await b.admit(s, limits, Ask(tokens=10, floor=1, cost=700, cost_floor=100), "a"))
    assert g.cost == 700
    g2 = granted(await b.admit(s, limits, Ask(tokens=10, floor=1, cost=700, cost_floor=100), "b"))
    assert g2.cost == 300
    d = denied(await b.admit(s, limits, Ask(tokens=10, floor=1, cost=50, cost_floor=10), "c"))
    assert d.limit == "cost_per_day"
    # A model without a price costs nothing and is not held back by cost budgets.
    granted(await b.admit(s, limits, Ask(tokens=10, floor=1), "d"))
    await b.settle(g, 0, 200)
    await b.settle(g2, 0, 300)
    clock.now += 86400
    g3 = granted(await b.admit(s, limits, Ask(tokens=10, floor=1, cost=5000, cost_floor=10), "e"))
    assert g3.cost == 1000  # the day allows 1000; the month 1000 more
    d = denied(await b.admit(s, limits, Ask(tokens=10, floor=1, cost=5000, cost_floor=10), "f"))
    assert d.limit in ("cost_per_day", "cost_per_month")


async def test_settle_is_once_and_tolerates_expired_windows(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock)
    s, limits = subject(), Limits(tpm=100, tokens_per_day=1000, concurrent=1)
    g = granted(await b.admit(s, limits, Ask(tokens=50, floor=5), "a"))
    await b.settle(g, 10, 0)
    await b.settle(g, 10, 0)
    used = (await b.figures(s, limits)).used
    assert used["tokens_per_day"] == 10 and used["tpm"] == 10 and used["concurrent"] == 0


async def test_figures_report_only_the_limits_a_key_has(make: Factory) -> None:
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b = await started(make, clock)
    s = subject()
    limits = Limits(rpm=10, tokens_per_month=500)
    granted(await b.admit(s, limits, Ask(tokens=40, floor=4), "a"))
    used = (await b.figures(s, limits)).used
    assert used == {"rpm": 1, "tokens_per_month": 40}


async def test_budget_holds_under_concurrent_admission(make: Factory) -> None:
    """Many calls at once, over two connections (two replicas' worth for Redis): what is granted
    never passes the budget, and the whole budget is granted."""
    clock = Clock(at(2026, 3, 4, 10, 0, second=0))
    b1 = await started(make, clock)
    b2 = await started(make, clock)
    s, limits = subject(), Limits(tokens_per_day=1000, rpm=10_000)

    async def one(i: int) -> int:
        backend = b1 if i % 2 else b2
        got = await backend.admit(s, limits, Ask(tokens=37, floor=5), f"l{i}")
        if isinstance(got, Denied):
            return 0
        before = got.tokens
        extra, _ = await backend.extend(got, 11, 0)
        assert got.tokens == before + extra
        return got.tokens

    total = sum(await asyncio.gather(*(one(i) for i in range(120))))
    assert total == 1000


async def test_redis_down_is_an_error_not_a_pass() -> None:
    backend = RedisBackend("redis://127.0.0.1:1/0", prefix="svirtest")
    with pytest.raises(LimitsUnavailable, match="cannot reach Redis"):
        await backend.start()
    with pytest.raises(LimitsUnavailable):
        await backend.admit("k", Limits(rpm=1), ONE, "a")
    await backend.close()


async def test_redis_url_password_is_not_shown() -> None:
    backend = RedisBackend("redis://user:hunter2@127.0.0.1:1/0", prefix="svirtest")
    with pytest.raises(LimitsUnavailable) as info:
        await backend.start()
    assert "hunter2" not in str(info.value)
    await backend.close()


@given(st.lists(st.floats(min_value=0, max_value=4_102_444_800), min_size=1, max_size=20))
def test_windows_are_the_calendars_whatever_moments_came_before(moments: list[float]) -> None:
    # windows_at keeps the last minute's calendar: each moment's windows must still be its own.
    for now in moments:
        w = windows_at(now)
        # (The whole second: fromtimestamp rounds to microseconds, into the next month at worst.)
        date = datetime.datetime.fromtimestamp(now // 1, datetime.UTC)
        assert w.now == now and w.minute == int(now // 60) and w.day == int(now // 86400)
        assert w.month == date.year * 12 + date.month - 1
        year, month = divmod(w.month + 1, 12)
        ends = datetime.datetime(year, month + 1, 1, tzinfo=datetime.UTC).timestamp()
        assert w.month_ends == ends and w.day_ends == (w.day + 1) * 86400
        assert 0 <= w.minute_fraction < 1


@pytest.mark.parametrize("name", LIMIT_NAMES)
async def test_a_settlement_is_skipped_only_when_it_would_change_nothing(name: str) -> None:
    # The gate does not settle a grant whose limits say they need none (Limits.settles): for
    # each limit alone, settling must then leave every counter and slot as it was.
    clock = Clock(at(2026, 3, 4, 10, 0, second=30))
    backend = MemoryBackend(clock=clock)
    limits = Limits(**{name: 1_000})
    s = subject()
    g = granted(await backend.admit(s, limits, Ask(tokens=50, floor=5, cost=40, cost_floor=4), "a"))
    before = (dict(backend._counters), {k: dict(v) for k, v in backend._leases.items()})
    await backend.settle(g, 7, 3)
    after = (dict(backend._counters), {k: dict(v) for k, v in backend._leases.items()})
    assert (before == after) == (not limits.settles), name


def test_limits_any_names_every_limit() -> None:
    assert not Limits().any
    for name in LIMIT_NAMES:
        assert Limits(**{name: 0}).any, name
