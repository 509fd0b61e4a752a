"""The gate every call passes, whatever the front end (OpenAI, Ollama, threads) and whatever it
does (a chat, or embeddings): it wraps the gateway's chain (an interceptor), so a front end gets
keys, limits, the ledger and the metrics by calling the gateway as it always did. An embedding
call reserves its inputs' estimate and no answer allowance, and settles with the upstream's count
of the inputs' tokens (its prompt tokens) when it gave one.

Before the call: the key's models (403 `model_not_allowed`), then its limits (429 with
Retry-After, naming the limit). Tokens are reserved: the prompt's estimate plus the answer's
allowance (`max_tokens`, or `[limits] default_completion_tokens`). While the answer streams, a
guard on the call asks for more whenever what streamed passes what is held, and ends the answer
with one error frame when a budget has no more (never a silent truncation). When the call
closes, the reservation is settled with the upstream's usage or, when it reported none, with a
count of what streamed (§3.6's visible tokens) and the prompt's estimate. Each call, refused,
failed or served, is settled into one `CallRecord`, told to the gateway's observers
(svir.observers: `CallSettled`; the ledger, the metrics, the console), which also hear of each
call let through (`CallOpened`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable
from typing import Any

from svir.call import EMBEDDINGS, CallContext, CallRecord
from svir.chat import Call, Cut, visible_count
from svir.config.model import LimitsConfig, PriceConfig
from svir.errors import GatewayError, LimitsUnavailable
from svir.keys.limits import (
    Ask,
    Backend,
    Denied,
    Grant,
    Limits,
    budget_denial,
    limit_description,
    windows_at,
)
from svir.keys.model import KeyRecord, model_allowed
from svir.log import hundredths, now_ms
from svir.observers import CallOpened, CallSettled, Observers
from svir.policy.gateway import OpenCall
from svir.wire.classify import ClientError
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import Event
from svir.wire.tokens import estimate_input_tokens, estimate_prompt_tokens

__all__ = [
    "Gate",
    "Meter",
    "Price",
    "limit_error",
]

log = logging.getLogger("svir.keys")


class Price:
    """A model's price in micro-USD per token (= USD per million tokens)."""

    __slots__ = ("cached_input", "input", "output")

    def __init__(self, config: PriceConfig) -> None:
        self.input = config.input
        self.output = config.output
        self.cached_input = config.input if config.cached_input is None else config.cached_input

    def cost(self, prompt: int, completion: int, cached: int = 0) -> int:
        """Micro-USD, rounded up."""
        cached = min(max(cached, 0), prompt)
        micros = (prompt - cached) * self.input + cached * self.cached_input
        micros += completion * self.output
        return math.ceil(micros - 1e-9)


def completion_allowance(request: dict[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def estimate_call_prompt(ctx: CallContext, request: dict[str, Any]) -> int:
    """The estimate of a call's prompt: a chat's messages, or an embedding request's inputs."""
    if ctx.operation == EMBEDDINGS:
        return estimate_input_tokens(request["input"])
    return estimate_prompt_tokens(request)


def _human(seconds: float) -> str:
    s = max(1, math.ceil(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{math.ceil(s / 60)} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _amount(name: str, value: float) -> str:
    if name.startswith("cost_"):
        return f"${value / 1_000_000:.4f}"
    return f"{value:g}"


def limit_client_error(key: KeyRecord, d: Denied, *, cut_after: int | None = None) -> ClientError:
    """The OpenAI-shaped 429 naming the limit: `<limit>_exceeded`, type `rate_limit_error` for
    rates and `insufficient_quota` for budgets, with Retry-After."""
    desc = limit_description(d.limit)
    retry = max(1, math.ceil(d.retry_after))
    value = _amount(d.limit, d.value)
    used = _amount(d.limit, d.used)
    if d.budget:
        kind = "insufficient_quota"
        said = f"the {desc} of key {key.name!r} ({value}) is used up ({used} used)"
    elif d.limit == "concurrent":
        kind = "rate_limit_error"
        said = f"key {key.name!r} has {int(d.used)} requests running, its limit of {desc}"
    else:
        kind = "rate_limit_error"
        said = f"key {key.name!r} reached its {desc} ({value}; {used} in the last minute)"
    if cut_after is not None:
        message = (
            f"The answer was cut after {cut_after} tokens: {said}. Try again in {_human(retry)}."
        )
    else:
        message = f"Rate limit: {said}. Try again in {_human(retry)}."
    headers = {"Retry-After": str(retry), "x-svir-limit": d.limit}
    if d.limit in ("rpm", "tpm"):
        unit = "requests" if d.limit == "rpm" else "tokens"
        headers[f"x-ratelimit-limit-{unit}"] = str(d.value)
        headers[f"x-ratelimit-remaining-{unit}"] = str(max(0, math.floor(d.value - d.used)))
        headers[f"x-ratelimit-reset-{unit}"] = f"{retry}s"
    return ClientError(429, kind, f"{d.limit}_exceeded", message, None, headers)


def limit_error(key: KeyRecord, d: Denied) -> GatewayError:
    return GatewayError(limit_client_error(key, d))


def model_not_allowed(key: KeyRecord, model: str) -> GatewayError:
    """The 403 for a key that may not use `model`."""
    return GatewayError(
        ClientError(
            403,
            "invalid_request_error",
            "model_not_allowed",
            f"The key {key.name!r} may not use the model {model!r}.",
            "model",
        )
    )


def limits_unavailable() -> GatewayError:
    """The 503 for a call whose key's limits cannot be checked (their backend failed)."""
    return GatewayError(
        ClientError(
            503,
            "server_error",
            "limits_unavailable",
            "svir cannot check this key's limits right now; try again shortly.",
            None,
            {"Retry-After": "1"},
        )
    )


def _failure_status(exc: BaseException) -> str:
    """The ledger's status of a call that failed to open with `exc`."""
    if isinstance(exc, GatewayError):
        ce = exc.error
        return exc.upstream.kind.value if exc.upstream is not None else (ce.code or ce.type)
    return "cancelled"


class Gate:
    """The interceptor (see the module doc); without a backend, no limits apply."""

    def __init__(
        self,
        *,
        backend: Backend | None,
        limits: LimitsConfig,
        prices: tuple[PriceConfig, ...] = (),
        observers: Observers | None = None,
    ) -> None:
        self.backend = backend
        # Told of each call let through, and of what each call came to (svir.observers).
        self.observers = observers if observers is not None else Observers()
        self.config = limits
        self.set_prices(prices)
        self._tasks: set[asyncio.Task[None]] = set()

    def set_prices(self, prices: tuple[PriceConfig, ...]) -> None:
        """Price calls by `prices` from now on (at start, and on a config reload)."""
        self.prices = [(p.model, Price(p)) for p in prices]

    def price(self, model: str) -> Price | None:
        for pattern, price in self.prices:
            if model_allowed((pattern,), model):
                return price
        return None

    def settle_later(self, grant: Grant, tokens: int, cost: int) -> None:
        """Settle `grant` with what its call used, in a task of its own (the backend may be
        remote), unless its limits have nothing a call's end corrects (`Limits.settles`): a
        task a call, and for Redis a round trip, for nothing."""
        if not grant.limits.settles:
            return
        task = asyncio.get_running_loop().create_task(self.settle(grant, tokens, cost))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the settlements still running (at shut-down)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def settle(self, grant: Grant, tokens: int, cost: int) -> None:
        assert self.backend is not None
        try:
            await self.backend.settle(grant, tokens, cost)
        except Exception:
            log.warning(
                "could not settle a reservation",
                extra={"fields": {"key_id": grant.subject, "tokens": tokens}},
                exc_info=True,
            )

    async def __call__(self, ctx: CallContext, request: dict[str, Any], proceed: OpenCall) -> Call:
        started = time.perf_counter()
        key = ctx.key
        model = str(request.get("model"))
        if key is not None and not key.allows(model):
            ctx.outcome.limit = "models"
            self._refused(ctx, model, status="model_not_allowed", started=started)
            raise model_not_allowed(key, model)
        grant: Grant | None = None
        prompt_estimate: int | None = None
        limits = key.limits if key is not None else None
        backend = self.backend
        if key is not None and limits is not None and limits.any and backend is not None:
            ask, prompt_estimate = self.ask(ctx, request, limits, model)
            try:
                outcome = await backend.admit(
                    key.id, limits, ask, f"{ctx.request_id}:{os.urandom(4).hex()}"
                )
            except LimitsUnavailable as exc:
                log.error("limits unavailable", extra={"fields": {"error": str(exc)}})
                self._refused(ctx, model, status="limits_unavailable", started=started)
                raise limits_unavailable() from None
            if isinstance(outcome, Denied):
                ctx.outcome.limit = outcome.limit
                self._refused(ctx, model, status=f"{outcome.limit}_exceeded", started=started)
                raise limit_error(key, outcome)
            grant = outcome
        try:
            call = await proceed(ctx, request)
        except BaseException as exc:
            if grant is not None:
                self.settle_later(grant, 0, 0)
            self._refused(ctx, model, status=_failure_status(exc), started=started, failed=True)
            raise
        meter = Meter(
            self,
            call,
            ctx,
            model=model,
            grant=grant,
            prompt_estimate=prompt_estimate,
            started=started,
        )
        guarded = (
            grant is not None
            and limits is not None
            and (limits.token_budgets or limits.cost_budgets or limits.concurrent is not None)
        )
        call.attach(guard=meter if guarded else None, on_close=meter.closed)
        if self.observers:
            self.observers.opened(CallOpened(ctx, call))
        return call

    def ask(
        self, ctx: CallContext, request: dict[str, Any], limits: Limits, model: str
    ) -> tuple[Ask, int | None]:
        """What a call asks of its key's limits, and the prompt's estimate it counted (None when
        the limits count neither tokens nor cost: then only the request is counted)."""
        price = self.price(model) if limits.cost_budgets else None
        if not (limits.counts_tokens or price is not None):
            return Ask(tokens=1, floor=1), None
        # An embedding call generates nothing: it needs its inputs' tokens, no more.
        first = 0 if ctx.operation == EMBEDDINGS else 1
        allowance = (
            completion_allowance(request, self.config.default_completion_tokens) if first else 0
        )
        estimate = estimate_call_prompt(ctx, request)
        ask = Ask(
            tokens=estimate + allowance,
            floor=estimate + first,
            cost=price.cost(estimate, allowance) if price else 0,
            cost_floor=price.cost(estimate, first) if price else 0,
        )
        return ask, estimate

    def _refused(
        self,
        ctx: CallContext,
        model: str,
        *,
        status: str,
        started: float,
        failed: bool = False,
    ) -> None:
        """A call that never streamed: refused by svir, or failed at every upstream tried."""
        if not self.observers:
            return
        o = ctx.outcome
        key = ctx.key
        record = CallRecord(
            ts=time.time(),
            request_id=ctx.request_id,
            key_id=key.id if key is not None else None,
            api=ctx.api,
            model=model,
            served_model=o.served_model,
            provider=o.provider,
            status=status,
            prompt_tokens=0,
            completion_tokens=0,
            reasoning_tokens=None,
            cached_tokens=None,
            usage_source="none",
            cost_micros=None,
            latency_ms=now_ms(started) if failed else 0.0,
            ttft_ms=None,
            tokens_per_second=None,
            upstream_request_id=None,
            upstream_id=None,
            client_user=ctx.client_user,
        )
        self.observers.settled(CallSettled(ctx, record))


class Meter:
    """One opened call: its stream guard (budgets mid-answer, the concurrency slot's renewal)
    and, when it closes, its settlement and its `CallRecord`."""

    def __init__(
        self,
        gate: Gate,
        call: Call,
        ctx: CallContext,
        *,
        model: str,
        grant: Grant | None,
        prompt_estimate: int | None,
        started: float,
    ) -> None:
        self.gate = gate
        self.ctx = ctx
        self.key = ctx.key
        self.model = model
        self.grant = grant
        self.prompt_estimate = prompt_estimate
        self.started = started
        self.price = gate.price(call.model_label) or gate.price(model)
        self.delivered = 0
        self.seen = 0
        self.cut: str | None = None
        self.touched = time.monotonic()
        self.allowed = self._allowed()

    def _allowed(self) -> float:
        """Answer tokens the reservation covers now."""
        grant = self.grant
        if grant is None:
            return math.inf
        limits = grant.limits
        prompt = self.prompt_estimate or 0
        allowed = math.inf
        if limits.token_budgets:
            allowed = grant.tokens - prompt
        if limits.cost_budgets and self.price is not None and grant.cost > 0:
            if self.price.output > 0:
                by_cost = (grant.cost - self.price.cost(prompt, 0)) / self.price.output
                allowed = min(allowed, math.floor(by_cost))
        return allowed

    # StreamGuard

    def check(self, events: list[Event]) -> Awaitable[Cut | None] | None:
        # Counted from the batches checked, not from the decoder, which may have read ahead
        # (priming reads past the batch being checked): a cut must fall where this batch is.
        self.seen += visible_count(events)
        count = self.seen
        if count <= self.allowed:
            self.delivered = count
            grant = self.grant
            if grant is not None and grant.limits.concurrent is not None:
                backend = self.gate.backend
                lease = backend.lease_seconds if backend is not None else math.inf
                if time.monotonic() - self.touched > lease / 3:
                    self.touched = time.monotonic()
                    return self._touch()
            return None
        return self._extend(count)

    async def _touch(self) -> Cut | None:
        assert self.gate.backend is not None and self.grant is not None
        try:
            await self.gate.backend.extend(self.grant, 0, 0)
        except LimitsUnavailable:
            log.warning("could not renew a concurrency slot", exc_info=True)
        return None

    async def _extend(self, count: int) -> Cut | None:
        backend = self.gate.backend
        grant = self.grant
        assert backend is not None and grant is not None
        step = self.gate.config.extend_tokens
        while count > self.allowed:
            want = max(step, math.ceil(count - self.allowed))
            want_cost = self.price.cost(0, want) if self.price is not None else 0
            try:
                await backend.extend(grant, want, want_cost)
            except LimitsUnavailable:
                log.error("limits unavailable mid-answer", exc_info=True)
                keep = self._keep(count)
                self.delivered += keep
                return Cut(self._cut_unavailable(), keep)
            self.touched = time.monotonic()
            before = self.allowed
            self.allowed = self._allowed()
            if self.allowed <= before:
                keep = self._keep(count)
                self.delivered += keep
                return Cut(await self._cut(), keep)
        self.delivered = count
        return None

    def _keep(self, count: int) -> int:
        """How many of this batch's visible pieces the reservation still covers."""
        return max(0, min(count, math.floor(self.allowed)) - self.delivered)

    async def _cut(self) -> UpstreamError:
        """The error that ends the answer: which budget ran out, and when it renews."""
        backend = self.gate.backend
        grant = self.grant
        key = self.key
        assert backend is not None and grant is not None and key is not None
        limits = grant.limits
        try:
            used = (await backend.figures(grant.subject, limits)).used
        except LimitsUnavailable:
            return self._cut_unavailable()
        w = windows_at(backend.clock())
        names = ("tokens_per_day", "tokens_per_month", "cost_per_day", "cost_per_month")
        present = [n for n in names if limits.value(n) is not None]
        # The budget with the least left is the one that ran out.
        name = min(present, key=lambda n: (limits.value(n) or 0) - used.get(n, 0))
        value = limits.value(name) or 0
        denial = budget_denial(name, value, used.get(name, value), w)
        self.cut = name
        self.ctx.outcome.limit = name
        return _own_error(limit_client_error(key, denial, cut_after=self.delivered))

    def _cut_unavailable(self) -> UpstreamError:
        self.cut = "limits_unavailable"
        return _own_error(
            ClientError(
                503,
                "server_error",
                "limits_unavailable",
                f"The answer was cut after {self.delivered} tokens: svir cannot check this"
                " key's budgets right now.",
                None,
                {"Retry-After": "1"},
            )
        )

    # Close

    def closed(self, call: Call) -> None:
        s = call.stats
        usage = s.usage
        cut = self.cut is not None
        if usage is not None and not cut:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
            reasoning, cached = usage.reasoning_tokens, usage.cached_tokens
            source = "reported"
        else:
            if self.prompt_estimate is None:
                self.prompt_estimate = estimate_call_prompt(self.ctx, call.request)
            prompt = self.prompt_estimate
            completion = self.delivered if cut else call.visible_tokens
            reasoning = cached = None
            source = "counted"
        price = self.price
        cost = price.cost(prompt, completion, cached or 0) if price is not None else None
        gate = self.gate
        if self.grant is not None:
            gate.settle_later(self.grant, prompt + completion, cost or 0)
        # A cut first: svir may have read the whole answer (the upstream succeeded) by the time
        # it ends the client's with an error.
        if cut:
            status = self.cut if self.cut == "limits_unavailable" else f"{self.cut}_exceeded"
        elif call.succeeded:
            status = "ok"
        else:
            status = s.error_kind or "cancelled"
        ttft_ms = None
        if s.first_token_ms is not None:
            ttft_ms = hundredths((s.started - self.started) * 1000 + s.first_token_ms)
        ctx = self.ctx
        if source == "counted":
            ctx.outcome.usage_source = "counted"
        if not gate.observers:
            return
        record = CallRecord(
            ts=time.time(),
            request_id=ctx.request_id,
            key_id=self.key.id if self.key is not None else None,
            api=ctx.api,
            model=self.model,
            served_model=call.model_label,
            provider=call.route.provider.name,
            status=status,
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            cached_tokens=cached,
            usage_source=source,
            cost_micros=cost,
            latency_ms=now_ms(self.started),
            ttft_ms=ttft_ms,
            tokens_per_second=(
                round(s.tokens_per_second, 3) if s.tokens_per_second is not None else None
            ),
            upstream_request_id=s.upstream_request_id,
            upstream_id=s.upstream_id,
            client_user=ctx.client_user,
        )
        gate.observers.settled(CallSettled(ctx, record))


def _own_error(ce: ClientError) -> UpstreamError:
    """svir's own error as the event that ends a stream: every front end shows `ce` itself."""
    return UpstreamError(
        ErrorKind.RATE_LIMITED if ce.status == 429 else ErrorKind.OTHER,
        ce.message,
        status=ce.status,
        code=ce.code,
        in_stream=True,
        details={"client_error": ce},
    )
