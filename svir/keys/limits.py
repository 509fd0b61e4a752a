"""Per-key rate limits and token budgets: requests and tokens per minute, concurrent calls, and
token and cost budgets per day and per month.

A call reserves before it is sent (`admit`): a request toward the per-minute count, a slot among
the concurrent calls, and tokens (the prompt's estimate plus the answer's allowance) toward the
per-minute tokens and the budgets. When the budgets hold less than the allowance but more than the
prompt, the call starts with what is left, and asks for more as its answer streams past it
(`extend`); when none is left, the front end ends the answer with one error frame. The call
settles with what it really used (`settle`): the upstream's usage, or a count of what streamed.

Per-minute limits are sliding windows: the count of the current minute plus the previous minute's
weighted by the share of it still inside the last 60 seconds. Budgets are calendar days and
months in UTC. Cost is counted in micro-USD, so that every counter is an integer.

Two backends, one semantics: `MemoryBackend` (one process) and `svir.keys.limits_redis`
(several replicas over one Redis, atomic through Lua scripts). The decisions are the same
arithmetic in both; the tests run one suite on each.
"""

from __future__ import annotations

import abc
import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

__all__ = [
    "LIMIT_NAMES",
    "Ask",
    "Backend",
    "CounterNames",
    "Denied",
    "Figures",
    "Grant",
    "Limits",
    "MemoryBackend",
    "Windows",
    "limit_description",
    "retry_after",
    "windows_at",
]

MINUTE: Final = 60.0
DAY: Final = 86400.0

LIMIT_NAMES: Final = (
    "concurrent",
    "rpm",
    "tpm",
    "tokens_per_day",
    "tokens_per_month",
    "cost_per_day",
    "cost_per_month",
)
_DESCRIPTIONS: Final = {
    "concurrent": "concurrent requests",
    "rpm": "requests per minute",
    "tpm": "tokens per minute",
    "tokens_per_day": "token budget per day",
    "tokens_per_month": "token budget per month",
    "cost_per_day": "cost budget per day",
    "cost_per_month": "cost budget per month",
}
# Keys outlive their window by this much, so a late settlement still finds its counter.
_SLACK: Final = 3600


def limit_description(name: str) -> str:
    return _DESCRIPTIONS.get(name, name)


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's limits; None is no limit. Costs are micro-USD."""

    rpm: int | None = None
    tpm: int | None = None
    concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    cost_per_day: int | None = None
    cost_per_month: int | None = None

    @property
    def any(self) -> bool:
        # Asked for every request with a key: one comparison of the fields, not a look-up of each
        # by name.
        return self != _NO_LIMITS

    @property
    def token_budgets(self) -> bool:
        return self.tokens_per_day is not None or self.tokens_per_month is not None

    @property
    def cost_budgets(self) -> bool:
        return self.cost_per_day is not None or self.cost_per_month is not None

    @property
    def settles(self) -> bool:
        """Whether a call's end corrects a counter (the per-minute tokens, a budget) or gives a
        concurrency slot back: with a requests-per-minute limit alone, a call is done once
        admitted."""
        return (
            self.tpm is not None
            or self.token_budgets
            or self.cost_budgets
            or (self.concurrent is not None)
        )

    @property
    def counts_tokens(self) -> bool:
        """Whether anything here needs the call's tokens (an estimate before, usage after)."""
        return self.tpm is not None or self.token_budgets

    def value(self, name: str) -> int | None:
        value: int | None = getattr(self, name)
        return value


_NO_LIMITS: Final = Limits()


# Ask and Windows are made for every call a limit counts: msgspec Structs, immutable as a frozen
# dataclass is, but made in C (~2k instructions where a frozen dataclass's __init__ costs ~11k).
class Ask(msgspec.Struct, frozen=True, gc=False):
    """What a call wants to reserve. `tokens` is the prompt's estimate plus the answer's
    allowance; `floor` the least it can start with (the prompt and one token). Cost likewise."""

    tokens: int
    floor: int
    cost: int = 0
    cost_floor: int = 0


class Windows(msgspec.Struct, frozen=True, gc=False):
    """The windows a moment falls in: minute, UTC day and UTC month numbers, where it is inside
    the current minute (0 to 1), and when the day and the month end."""

    now: float
    minute: int
    day: int
    month: int
    minute_fraction: float
    day_ends: float
    month_ends: float


def windows_at(now: float) -> Windows:
    global _calendar
    minute = math.floor(now / MINUTE)
    calendar = _calendar  # one read: another thread may swap it meanwhile
    if calendar[0] != minute:
        calendar = _calendar = (minute, *_calendar_of(minute))
    _, day, month, month_ends = calendar
    return Windows(
        now=now,
        minute=minute,
        day=day,
        month=month,
        minute_fraction=(now - minute * MINUTE) / MINUTE,
        day_ends=(day + 1) * DAY,
        month_ends=month_ends,
    )


def _calendar_of(minute: int) -> tuple[int, int, float]:
    """The UTC day and month numbers of `minute`, and when its month ends."""
    start = minute * MINUTE
    day = math.floor(start / DAY)
    date = datetime.datetime.fromtimestamp(start, datetime.UTC)
    month = date.year * 12 + date.month - 1
    next_year, next_month = divmod(month + 1, 12)
    month_ends = datetime.datetime(next_year, next_month + 1, 1, tzinfo=datetime.UTC).timestamp()
    return day, month, month_ends


# The calendar of the last minute a call was admitted in (minute, day, month, month's end): the
# datetime arithmetic cost ~25k instructions a call, and every call of a minute shares it.
_calendar: tuple[int, int, int, float] = (-1, 0, 0, 0.0)


@dataclass(slots=True)
class Grant:
    """An admitted call's reservation: what it holds, and in which windows it was counted (the
    settlement corrects those same counters)."""

    subject: str
    lease: str
    limits: Limits
    minute: int
    day: int
    month: int
    tokens: int
    cost: int
    # What the per-minute token count was charged at admission (extensions are not charged to
    # it; the settlement corrects it).
    tpm_tokens: int = 0
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Denied:
    """A call refused: which limit, its value, what is used, and when to try again."""

    limit: str
    value: int
    used: float
    retry_after: float

    @property
    def budget(self) -> bool:
        return self.limit.startswith(("tokens_per_", "cost_per_"))


@dataclass(frozen=True, slots=True)
class Figures:
    """A key's counters now, for GET /v1/usage: the used amount per limit it has."""

    used: dict[str, float] = field(default_factory=dict)


def sliding(prev: float, curr: float, fraction: float) -> float:
    """The sliding-window estimate of the last minute's count."""
    return prev * (1.0 - fraction) + curr


def retry_after(prev: float, curr: float, need: float, limit: float, w: Windows) -> float:
    """Seconds until a sliding window of `limit` admits `need` more (`need` <= `limit`)."""
    start = w.minute * MINUTE
    room = limit - curr - need
    if room >= 0:
        if prev <= 0:
            return 0.0
        fraction = 1.0 - room / prev
        return max(0.0, start + fraction * MINUTE - w.now)
    # Not within this minute: in the next one, this minute's count is the one that decays.
    if curr <= 0:
        return max(0.0, start + MINUTE - w.now)
    fraction = min(1.0, max(0.0, 1.0 - (limit - need) / curr))
    return max(0.0, start + MINUTE + fraction * MINUTE - w.now)


def budget_denial(name: str, value: int, used: float, w: Windows) -> Denied:
    ends = w.day_ends if name.endswith("_day") else w.month_ends
    return Denied(name, value, used, max(1.0, ends - w.now))


def window_denial(
    name: str, value: int, prev: float, curr: float, *, need: float, w: Windows
) -> Denied:
    used = sliding(prev, curr, w.minute_fraction)
    return Denied(name, value, used, max(1.0, retry_after(prev, curr, need, value, w)))


class Backend(abc.ABC):
    """Where the counters live. Every operation is atomic for the key it is about."""

    def __init__(
        self,
        *,
        lease_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
        prefix: str = "",
    ):
        self.lease_seconds = lease_seconds
        self.clock = clock
        # The names of its counters, each under `prefix`.
        self.names = CounterNames(prefix)

    @abc.abstractmethod
    async def admit(self, subject: str, limits: Limits, ask: Ask, lease: str) -> Grant | Denied:
        """Check every limit and, only when all pass, reserve against each."""

    @abc.abstractmethod
    async def extend(self, grant: Grant, tokens: int, cost: int) -> tuple[int, int]:
        """Reserve up to `tokens` and `cost` more against the budgets (what they still hold),
        renew the concurrency slot, and add what was granted to `grant`."""

    @abc.abstractmethod
    async def settle(self, grant: Grant, tokens: int, cost: int) -> None:
        """The call ended having used `tokens` and `cost`: correct every counter it was charged
        to by the difference from what it held, and give its concurrency slot back."""

    @abc.abstractmethod
    async def figures(self, subject: str, limits: Limits) -> Figures: ...

    async def start(self) -> None:  # noqa: B027 (nothing to do for most backends)
        """Connect; raise when the backend cannot be reached."""

    async def close(self) -> None:  # noqa: B027
        """Disconnect."""


# ---------------------------------------------------------------------------------------------
# In-process backend


class MemoryBackend(Backend):
    """Counters in this process: exact, and shared by nothing else."""

    def __init__(self, *, lease_seconds: float = 300.0, clock: Callable[[], float] = time.time):
        super().__init__(lease_seconds=lease_seconds, clock=clock)
        # key -> (value, expires at)
        self._counters: dict[str, tuple[float, float]] = {}
        # subject -> lease -> expires at
        self._leases: dict[str, dict[str, float]] = {}
        self._ops = 0

    def _get(self, key: str, now: float) -> float:
        entry = self._counters.get(key)
        if entry is None or entry[1] <= now:
            return 0.0
        return entry[0]

    def _add(self, key: str, amount: float, ttl: float, now: float) -> None:
        self._counters[key] = (self._get(key, now) + amount, now + ttl)

    def _adjust(self, key: str, amount: float, now: float) -> None:
        """Correct a counter that may have expired (then there is nothing left to correct)."""
        entry = self._counters.get(key)
        if entry is not None and entry[1] > now:
            self._counters[key] = (entry[0] + amount, entry[1])

    def _sweep(self, now: float) -> None:
        self._ops += 1
        if self._ops % 1024:
            return
        self._counters = {k: v for k, v in self._counters.items() if v[1] > now}
        for subject in list(self._leases):
            live = {k: t for k, t in self._leases[subject].items() if t > now}
            if live:
                self._leases[subject] = live
            else:
                del self._leases[subject]

    def _slots(self, subject: str, now: float) -> dict[str, float]:
        leases = self._leases.setdefault(subject, {})
        for lease in [k for k, t in leases.items() if t <= now]:
            del leases[lease]
        return leases

    async def admit(self, subject: str, limits: Limits, ask: Ask, lease: str) -> Grant | Denied:
        now = self.clock()
        w = windows_at(now)
        self._sweep(now)
        k = self.names.at(subject, w)
        if limits.concurrent is not None:
            slots = self._slots(subject, now)
            if len(slots) >= limits.concurrent:
                return Denied("concurrent", limits.concurrent, len(slots), 1.0)
        if limits.rpm is not None:
            prev, curr = self._get(k.rpm_prev, now), self._get(k.rpm, now)
            if sliding(prev, curr, w.minute_fraction) + 1 > limits.rpm:
                return window_denial("rpm", limits.rpm, prev, curr, need=1, w=w)
        if limits.tpm is not None:
            need = min(ask.tokens, limits.tpm)
            prev, curr = self._get(k.tpm_prev, now), self._get(k.tpm, now)
            if sliding(prev, curr, w.minute_fraction) + need > limits.tpm:
                return window_denial("tpm", limits.tpm, prev, curr, need=need, w=w)
        tokens, cost = ask.tokens, ask.cost
        for name, key in (("tokens_per_day", k.day), ("tokens_per_month", k.month)):
            value = limits.value(name)
            if value is not None:
                used = self._get(key, now)
                if value - used < max(1, ask.floor):
                    return budget_denial(name, value, used, w)
                tokens = min(tokens, int(value - used))
        # A call that costs nothing (a model without a price) is not held by cost budgets.
        if ask.cost > 0:
            for name, key in (("cost_per_day", k.cost_day), ("cost_per_month", k.cost_month)):
                value = limits.value(name)
                if value is not None:
                    used = self._get(key, now)
                    if value - used < max(1, ask.cost_floor):
                        return budget_denial(name, value, used, w)
                    cost = min(cost, int(value - used))
        if limits.concurrent is not None:
            self._slots(subject, now)[lease] = now + self.lease_seconds
        if limits.rpm is not None:
            self._add(k.rpm, 1, 2 * MINUTE + _SLACK, now)
        if limits.tpm is not None:
            self._add(k.tpm, tokens, 2 * MINUTE + _SLACK, now)
        self._charge_budgets(k, limits, tokens, cost, now)
        return Grant(subject, lease, limits, w.minute, w.day, w.month, tokens, cost, tokens)

    def _charge_budgets(self, k: _Keys, limits: Limits, tokens: int, cost: int, now: float) -> None:
        """Add tokens and cost to the day and month budgets the limits have."""
        if limits.tokens_per_day is not None:
            self._add(k.day, tokens, DAY + _SLACK, now)
        if limits.tokens_per_month is not None:
            self._add(k.month, tokens, 32 * DAY, now)
        if limits.cost_per_day is not None:
            self._add(k.cost_day, cost, DAY + _SLACK, now)
        if limits.cost_per_month is not None:
            self._add(k.cost_month, cost, 32 * DAY, now)

    async def extend(self, grant: Grant, tokens: int, cost: int) -> tuple[int, int]:
        now = self.clock()
        k = self.names.of(grant)
        limits = grant.limits
        for name, key in (("tokens_per_day", k.day), ("tokens_per_month", k.month)):
            value = limits.value(name)
            if value is not None:
                tokens = max(0, min(tokens, int(value - self._get(key, now))))
        for name, key in (("cost_per_day", k.cost_day), ("cost_per_month", k.cost_month)):
            value = limits.value(name)
            if value is not None:
                cost = max(0, min(cost, int(value - self._get(key, now))))
        self._charge_budgets(k, limits, tokens, cost, now)
        if limits.concurrent is not None:
            slots = self._leases.setdefault(grant.subject, {})
            if grant.lease in slots:
                slots[grant.lease] = now + self.lease_seconds
        grant.tokens += tokens
        grant.cost += cost
        return tokens, cost

    async def settle(self, grant: Grant, tokens: int, cost: int) -> None:
        if grant.settled:
            return
        grant.settled = True
        now = self.clock()
        k = self.names.of(grant)
        limits = grant.limits
        dt, dc = tokens - grant.tokens, cost - grant.cost
        if limits.tpm is not None:
            self._adjust(k.tpm, tokens - grant.tpm_tokens, now)
        if limits.tokens_per_day is not None:
            self._adjust(k.day, dt, now)
        if limits.tokens_per_month is not None:
            self._adjust(k.month, dt, now)
        if limits.cost_per_day is not None:
            self._adjust(k.cost_day, dc, now)
        if limits.cost_per_month is not None:
            self._adjust(k.cost_month, dc, now)
        if limits.concurrent is not None:
            self._leases.get(grant.subject, {}).pop(grant.lease, None)

    async def figures(self, subject: str, limits: Limits) -> Figures:
        now = self.clock()
        w = windows_at(now)
        k = self.names.at(subject, w)
        used: dict[str, float] = {}
        if limits.concurrent is not None:
            used["concurrent"] = len(self._slots(subject, now))
        if limits.rpm is not None:
            used["rpm"] = sliding(
                self._get(k.rpm_prev, now), self._get(k.rpm, now), w.minute_fraction
            )
        if limits.tpm is not None:
            used["tpm"] = sliding(
                self._get(k.tpm_prev, now), self._get(k.tpm, now), w.minute_fraction
            )
        for name, key in (
            ("tokens_per_day", k.day),
            ("tokens_per_month", k.month),
            ("cost_per_day", k.cost_day),
            ("cost_per_month", k.cost_month),
        ):
            if limits.value(name) is not None:
                used[name] = self._get(key, now)
        return Figures(used)


class _Keys:
    """Counter names of one subject in the windows of one moment (shared with the Redis
    backend), made by a backend's `CounterNames`."""

    __slots__ = (
        "conc",
        "cost_day",
        "cost_month",
        "day",
        "month",
        "rpm",
        "rpm_prev",
        "tpm",
        "tpm_prev",
    )

    def __init__(self, subject: str, minute: int, day: int, month: int, prefix: str = "") -> None:
        # A hash tag ({…}) keeps one subject's keys in one Redis Cluster slot.
        base = f"{prefix}{{{subject}}}"
        self.rpm = f"{base}:rpm:{minute}"
        self.rpm_prev = f"{base}:rpm:{minute - 1}"
        self.tpm = f"{base}:tpm:{minute}"
        self.tpm_prev = f"{base}:tpm:{minute - 1}"
        self.day = f"{base}:tday:{day}"
        self.month = f"{base}:tmonth:{month}"
        self.cost_day = f"{base}:cday:{day}"
        self.cost_month = f"{base}:cmonth:{month}"
        self.conc = f"{base}:conc"


class CounterNames:
    """The counter names of each subject's windows (`_Keys`), made once a minute for a subject
    (their nine strings cost ~15k instructions, and a call needs them at admission and at
    settlement). Each backend keeps its own, named under its `prefix`."""

    # The names made lately, by what they are made of; past this many, the cache starts again.
    KEPT: Final = 4096

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._made: dict[tuple[str, int, int, int], _Keys] = {}

    def at(self, subject: str, w: Windows) -> _Keys:
        """The names of `subject`'s counters in the windows `w`: to check and charge."""
        return self._cached(subject, w.minute, w.day, w.month)

    def of(self, grant: Grant) -> _Keys:
        """The names of the counters `grant` charged: to correct what it charged."""
        return self._cached(grant.subject, grant.minute, grant.day, grant.month)

    def _cached(self, subject: str, minute: int, day: int, month: int) -> _Keys:
        at = (subject, minute, day, month)
        found = self._made.get(at)
        if found is None:
            if len(self._made) >= self.KEPT:
                self._made.clear()
            found = self._made[at] = _Keys(subject, minute, day, month, self.prefix)
        return found


def ttls(lease_seconds: float) -> dict[str, int]:
    """Seconds each kind of counter lives (past its window, so late settlements find it)."""
    return {
        "minute": int(2 * MINUTE + _SLACK),
        "day": int(DAY + _SLACK),
        "month": int(32 * DAY),
        "conc": int(lease_seconds * 2 + 60),
    }
