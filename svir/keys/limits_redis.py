"""The limits' counters in Redis, shared by every svir replica that names the same Redis.

Each operation is one Lua script, so a check and the reservation that depends on it happen as one
step however many replicas ask at once. The arithmetic is `MemoryBackend`'s, line for line; the
moment (`now`, and from it the windows) is the calling replica's clock. One key's counters carry
one hash tag, so the scripts also run on Redis Cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from svir.errors import LimitsUnavailable
from svir.keys.limits import (
    Ask,
    Backend,
    Denied,
    Figures,
    Grant,
    Limits,
    budget_denial,
    sliding,
    ttls,
    window_denial,
    windows_at,
)
from svir.wire.redact import redact_url

__all__ = ["RedisBackend"]

_NUM: Final = """
local function num(k)
  local v = redis.call('GET', k)
  if v then return tonumber(v) end
  return 0
end
"""

# KEYS: rpm, rpm_prev, tpm, tpm_prev, tday, tmonth, cday, cmonth, conc
# ARGV: now, fraction, lease, lease_until, rpm, tpm, conc, tday, tmonth, cday, cmonth (-1: none),
#       tokens, floor, cost, cost_floor, ttl_minute, ttl_day, ttl_month, ttl_conc
ADMIT: Final = (
    _NUM
    + """
local now, f = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm, conc = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tday, tmonth = tonumber(ARGV[8]), tonumber(ARGV[9])
local cday, cmonth = tonumber(ARGV[10]), tonumber(ARGV[11])
local tokens, floor = tonumber(ARGV[12]), tonumber(ARGV[13])
local cost, cfloor = tonumber(ARGV[14]), tonumber(ARGV[15])
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', ARGV[1])
  local n = redis.call('ZCARD', KEYS[9])
  if n >= conc then return {0, 'concurrent', tostring(n), '0', '0'} end
end
if rpm >= 0 then
  local p, c = num(KEYS[2]), num(KEYS[1])
  if p * (1 - f) + c + 1 > rpm then return {0, 'rpm', '0', tostring(p), tostring(c)} end
end
if tpm >= 0 then
  local need = math.min(tokens, tpm)
  local p, c = num(KEYS[4]), num(KEYS[3])
  if p * (1 - f) + c + need > tpm then return {0, 'tpm', '0', tostring(p), tostring(c)} end
end
local least = math.max(1, floor)
if tday >= 0 then
  local u = num(KEYS[5])
  if tday - u < least then return {0, 'tokens_per_day', tostring(u), '0', '0'} end
  tokens = math.min(tokens, tday - u)
end
if tmonth >= 0 then
  local u = num(KEYS[6])
  if tmonth - u < least then return {0, 'tokens_per_month', tostring(u), '0', '0'} end
  tokens = math.min(tokens, tmonth - u)
end
if cost > 0 then
  local cleast = math.max(1, cfloor)
  if cday >= 0 then
    local u = num(KEYS[7])
    if cday - u < cleast then return {0, 'cost_per_day', tostring(u), '0', '0'} end
    cost = math.min(cost, cday - u)
  end
  if cmonth >= 0 then
    local u = num(KEYS[8])
    if cmonth - u < cleast then return {0, 'cost_per_month', tostring(u), '0', '0'} end
    cost = math.min(cost, cmonth - u)
  end
end
if conc >= 0 then
  redis.call('ZADD', KEYS[9], ARGV[4], ARGV[3])
  redis.call('EXPIRE', KEYS[9], ARGV[19])
end
if rpm >= 0 then
  redis.call('INCRBY', KEYS[1], 1)
  redis.call('EXPIRE', KEYS[1], ARGV[16])
end
if tpm >= 0 then
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[3], ARGV[16])
end
if tday >= 0 then
  redis.call('INCRBY', KEYS[5], tokens)
  redis.call('EXPIRE', KEYS[5], ARGV[17])
end
if tmonth >= 0 then
  redis.call('INCRBY', KEYS[6], tokens)
  redis.call('EXPIRE', KEYS[6], ARGV[18])
end
if cday >= 0 then
  redis.call('INCRBY', KEYS[7], cost)
  redis.call('EXPIRE', KEYS[7], ARGV[17])
end
if cmonth >= 0 then
  redis.call('INCRBY', KEYS[8], cost)
  redis.call('EXPIRE', KEYS[8], ARGV[18])
end
return {1, tokens, cost}
"""
)

# KEYS: tday, tmonth, cday, cmonth, conc
# ARGV: tokens, cost, tday, tmonth, cday, cmonth (-1: none), lease, lease_until, ttl_day,
#       ttl_month, has_conc
EXTEND: Final = (
    _NUM
    + """
local t, c = tonumber(ARGV[1]), tonumber(ARGV[2])
local tday, tmonth = tonumber(ARGV[3]), tonumber(ARGV[4])
local cday, cmonth = tonumber(ARGV[5]), tonumber(ARGV[6])
if tday >= 0 then t = math.max(0, math.min(t, tday - num(KEYS[1]))) end
if tmonth >= 0 then t = math.max(0, math.min(t, tmonth - num(KEYS[2]))) end
if cday >= 0 then c = math.max(0, math.min(c, cday - num(KEYS[3]))) end
if cmonth >= 0 then c = math.max(0, math.min(c, cmonth - num(KEYS[4]))) end
if tday >= 0 then
  redis.call('INCRBY', KEYS[1], t)
  redis.call('EXPIRE', KEYS[1], ARGV[9])
end
if tmonth >= 0 then
  redis.call('INCRBY', KEYS[2], t)
  redis.call('EXPIRE', KEYS[2], ARGV[10])
end
if cday >= 0 then
  redis.call('INCRBY', KEYS[3], c)
  redis.call('EXPIRE', KEYS[3], ARGV[9])
end
if cmonth >= 0 then
  redis.call('INCRBY', KEYS[4], c)
  redis.call('EXPIRE', KEYS[4], ARGV[10])
end
if ARGV[11] == '1' then redis.call('ZADD', KEYS[5], 'XX', ARGV[8], ARGV[7]) end
return {t, c}
"""
)

# KEYS: tpm, tday, tmonth, cday, cmonth, conc
# ARGV: d_tpm, d_tokens, d_cost, then 1/0 for tpm, tday, tmonth, cday, cmonth, conc; lease
SETTLE: Final = """
local function adjust(k, d)
  if d ~= 0 and redis.call('EXISTS', k) == 1 then redis.call('INCRBY', k, d) end
end
if ARGV[4] == '1' then adjust(KEYS[1], tonumber(ARGV[1])) end
if ARGV[5] == '1' then adjust(KEYS[2], tonumber(ARGV[2])) end
if ARGV[6] == '1' then adjust(KEYS[3], tonumber(ARGV[2])) end
if ARGV[7] == '1' then adjust(KEYS[4], tonumber(ARGV[3])) end
if ARGV[8] == '1' then adjust(KEYS[5], tonumber(ARGV[3])) end
if ARGV[9] == '1' then redis.call('ZREM', KEYS[6], ARGV[10]) end
return 1
"""


def _opt(value: int | None) -> int:
    return -1 if value is None else value


def _flag(value: object) -> str:
    return "0" if value is None else "1"


class RedisBackend(Backend):
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "svir",
        lease_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(lease_seconds=lease_seconds, clock=clock, prefix=f"{prefix}:lim:")
        import redis.asyncio as aioredis

        self.url = url
        self._redis: Any = aioredis.from_url(
            url, decode_responses=True, socket_connect_timeout=5, socket_timeout=5
        )
        self._admit = self._redis.register_script(ADMIT)
        self._extend = self._redis.register_script(EXTEND)
        self._settle = self._redis.register_script(SETTLE)
        self._ttl = ttls(lease_seconds)

    async def start(self) -> None:
        try:
            await self._redis.ping()
        except Exception as exc:
            raise LimitsUnavailable(
                f"cannot reach Redis at {redact_url(self.url)} for [limits]: {exc}"
            ) from None

    async def close(self) -> None:
        await self._redis.aclose()

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except Exception as exc:
            raise LimitsUnavailable(f"the limits' Redis failed: {type(exc).__name__}") from exc

    async def admit(self, subject: str, limits: Limits, ask: Ask, lease: str) -> Grant | Denied:
        now = self.clock()
        w = windows_at(now)
        k = self.names.at(subject, w)
        ttl = self._ttl
        out = await self._run(
            self._admit,
            [
                k.rpm,
                k.rpm_prev,
                k.tpm,
                k.tpm_prev,
                k.day,
                k.month,
                k.cost_day,
                k.cost_month,
                k.conc,
            ],
            [
                repr(now),
                repr(w.minute_fraction),
                lease,
                repr(now + self.lease_seconds),
                _opt(limits.rpm),
                _opt(limits.tpm),
                _opt(limits.concurrent),
                _opt(limits.tokens_per_day),
                _opt(limits.tokens_per_month),
                _opt(limits.cost_per_day),
                _opt(limits.cost_per_month),
                ask.tokens,
                ask.floor,
                ask.cost,
                ask.cost_floor,
                ttl["minute"],
                ttl["day"],
                ttl["month"],
                ttl["conc"],
            ],
        )
        if int(out[0]) == 1:
            tokens, cost = int(out[1]), int(out[2])
            return Grant(subject, lease, limits, w.minute, w.day, w.month, tokens, cost, tokens)
        name, used, prev, curr = str(out[1]), float(out[2]), float(out[3]), float(out[4])
        if name == "concurrent":
            return Denied("concurrent", limits.concurrent or 0, used, 1.0)
        value = limits.value(name) or 0
        if name == "rpm":
            return window_denial(name, value, prev, curr, need=1, w=w)
        if name == "tpm":
            return window_denial(name, value, prev, curr, need=min(ask.tokens, value), w=w)
        return budget_denial(name, value, used, w)

    async def extend(self, grant: Grant, tokens: int, cost: int) -> tuple[int, int]:
        now = self.clock()
        k = self.names.of(grant)
        limits = grant.limits
        out = await self._run(
            self._extend,
            [k.day, k.month, k.cost_day, k.cost_month, k.conc],
            [
                tokens,
                cost,
                _opt(limits.tokens_per_day),
                _opt(limits.tokens_per_month),
                _opt(limits.cost_per_day),
                _opt(limits.cost_per_month),
                grant.lease,
                repr(now + self.lease_seconds),
                self._ttl["day"],
                self._ttl["month"],
                _flag(limits.concurrent),
            ],
        )
        got_tokens, got_cost = int(out[0]), int(out[1])
        grant.tokens += got_tokens
        grant.cost += got_cost
        return got_tokens, got_cost

    async def settle(self, grant: Grant, tokens: int, cost: int) -> None:
        if grant.settled:
            return
        grant.settled = True
        k = self.names.of(grant)
        limits = grant.limits
        await self._run(
            self._settle,
            [k.tpm, k.day, k.month, k.cost_day, k.cost_month, k.conc],
            [
                tokens - grant.tpm_tokens,
                tokens - grant.tokens,
                cost - grant.cost,
                _flag(limits.tpm),
                _flag(limits.tokens_per_day),
                _flag(limits.tokens_per_month),
                _flag(limits.cost_per_day),
                _flag(limits.cost_per_month),
                _flag(limits.concurrent),
                grant.lease,
            ],
        )

    async def figures(self, subject: str, limits: Limits) -> Figures:
        now = self.clock()
        w = windows_at(now)
        k = self.names.at(subject, w)
        names = [
            ("rpm", (k.rpm_prev, k.rpm)),
            ("tpm", (k.tpm_prev, k.tpm)),
            ("tokens_per_day", (k.day,)),
            ("tokens_per_month", (k.month,)),
            ("cost_per_day", (k.cost_day,)),
            ("cost_per_month", (k.cost_month,)),
        ]
        wanted = [(name, keys) for name, keys in names if limits.value(name) is not None]
        try:
            pipe = self._redis.pipeline(transaction=False)
            for _, keys in wanted:
                for key in keys:
                    pipe.get(key)
            if limits.concurrent is not None:
                pipe.zcount(k.conc, f"({now!r}", "+inf")
            values = await pipe.execute()
        except Exception as exc:
            raise LimitsUnavailable(f"the limits' Redis failed: {type(exc).__name__}") from exc
        used: dict[str, float] = {}
        i = 0
        for name, keys in wanted:
            got = [float(v) if v is not None else 0.0 for v in values[i : i + len(keys)]]
            i += len(keys)
            used[name] = sliding(got[0], got[1], w.minute_fraction) if len(got) == 2 else got[0]
        if limits.concurrent is not None:
            used["concurrent"] = float(values[i])
        return Figures(used)
