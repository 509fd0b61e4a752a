"""Retries, fallback and load balancing around opening a call: a chat, or embeddings.

Everything here happens before the client has seen a byte: a `ChatCall` is opened and primed to
its first visible output (an `EmbeddingCall` reads its whole answer: one loop opens either, by
the context's `operation`), and only a failure until then is retried (transient classes, with
backoff and jitter, a 429's Retry-After honoured up to a cap, under a retry budget), sent to the
next deployment of the route, or to the route's fallbacks in order. A content-filter block is an
answer, not a failure, and a context overflow only goes to a model configured as larger-context.
A deployment that keeps failing in ways that say it is unwell (not the request's or the model's
doing: `BREAKER_KINDS`) rests (a circuit breaker) and is probed back with one request.

A streamed request carries a commit deadline (`CallContext.commit`, the attempt's provider's
`timeouts.commit_deadline`): past it the client has the response's head and keep-alives, and a
failure is raised as it is (the stream's one error), neither retried nor sent to a fallback.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from svir.call import EMBEDDINGS, CallContext
from svir.chat import Call, ChatCall, CloseHook, UpstreamTarget
from svir.config.model import (
    BreakerConfig,
    Config,
    ProviderConfig,
    RetryConfig,
    RouteConfig,
    RouteTarget,
)
from svir.embeddings import EmbeddingCall
from svir.errors import GatewayError
from svir.observers import AttemptStarted, Observers
from svir.policy.bounded import BoundedMap
from svir.policy.routing import Router, RoutingTable
from svir.transport import Transport
from svir.wire.classify import ClientError
from svir.wire.errors import RETRYABLE_KINDS, ErrorKind, UpstreamError

log = logging.getLogger("svir.policy")

# What each kind of failure gets (the table in docs/providers.md). Which are retried is the
# wire core's one decision, `UpstreamError.retryable` (RETRYABLE_KINDS); a context overflow and a
# content-filter block go to a fallback only as their route says.
# Failures that another deployment or model may not have.
FALLBACK_KINDS = RETRYABLE_KINDS | {
    ErrorKind.AUTH,
    ErrorKind.UNSUPPORTED_INPUT,
    ErrorKind.MODEL_NOT_FOUND,
    ErrorKind.MODEL_OUTPUT,
    ErrorKind.NOT_A_STREAM,
    ErrorKind.PROTOCOL,
    ErrorKind.OTHER,
}
# Failures that say the deployment is unwell or unusable, whatever was asked of it: these count
# toward its breaker. Not the ones the request or the model's answer brought about (a rejection,
# an overflow, a filter block, a missing model, the server's parser failing on what the model
# wrote), nor OTHER, which nothing identifies. An auth failure counts: every request would fail
# alike until svir's key is fixed, and resting spares the server and the client the round trips.
BREAKER_KINDS = RETRYABLE_KINDS | {ErrorKind.AUTH, ErrorKind.NOT_A_STREAM, ErrorKind.PROTOCOL}

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_EFFORT_WORD = re.compile(r"\b(" + "|".join(EFFORTS) + r")\b")
OPTIONAL_FIELDS = ("reasoning_effort", "stream_options")


def _rendezvous(key: str, target: RouteTarget) -> float:
    """The rank of `target` for `key` (lowest first): -ln(u) / weight for a u in (0, 1] hashed
    from both, so each deployment is first for a share of the keys its weight's."""
    digest = hashlib.blake2b(f"{key}\0{target.model}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 1) / 2.0**64
    return -math.log(u) / target.weight


@dataclass(frozen=True, slots=True)
class Timing:
    """What the policy waits with (backoff), draws from (jitter, weighted picks) and reads the
    time by (breakers, budgets). The composition root passes the real ones; tests their own."""

    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic


@dataclass(slots=True)
class Deployment:
    """Live state of one `<provider>/<model-id>` behind a route."""

    model: str
    in_flight: int = 0
    failures: int = 0
    open_until: float = 0.0
    probing: bool = False

    def state(self, now: float) -> str:
        if self.open_until > now:
            return "open"
        return "half-open" if self.failures and self.open_until else "closed"

    def idle(self) -> bool:
        """Nothing worth keeping: no failures counted (so no breaker open) and nothing in flight."""
        return not self.failures and not self.in_flight


class RetryBudget:
    """Retries allowed: `ratio` of the requests sent plus `per_second` (a token bucket, as in
    Envoy and Finagle), so retries stay a bounded share of the traffic when an upstream is down
    while a quiet gateway can still retry every request."""

    def __init__(
        self, ratio: float, now: float, per_second: float = 3.0, cap: float = 20.0
    ) -> None:
        self.ratio = ratio
        self.per_second = per_second
        self.cap = cap
        self.tokens = cap
        self.at = now

    def deposit(self, now: float) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio + (now - self.at) * self.per_second)
        self.at = now

    def take(self) -> bool:
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass(slots=True)
class Quirks:
    """What one upstream was learned not to accept (§2.5), so later requests don't pay twice."""

    dropped: set[str]
    efforts: dict[str, str | None]


def backoff_delay(attempt: int, cfg: RetryConfig, rng: random.Random) -> float:
    """Exponential backoff with jitter: half fixed, half random, capped."""
    base = min(cfg.max_backoff, cfg.backoff * float(1 << min(attempt, 30)))
    return base / 2 + rng.uniform(0, base / 2)


def nearest_effort(rejected: str, message: str) -> str | None:
    """The effort value nearest to `rejected` among those the server's message names."""
    named: list[str] = [str(w) for w in _EFFORT_WORD.findall(message.lower()) if w != rejected]
    if not named or rejected not in EFFORTS:
        return None
    at = EFFORTS.index(rejected)
    # Nearest by rank; on a tie the stronger one, since the client asked for effort.
    return min(set(named), key=lambda w: (abs(EFFORTS.index(w) - at), -EFFORTS.index(w)))


def optional_culprit(err: UpstreamError, request: dict[str, Any]) -> str | None:
    """The optional field a 400/422 rejection is about, if it is one svir may drop (§2.5).

    svir sends `stream_options` on every call, so that one counts whether the client sent it.
    """
    if err.kind is not ErrorKind.REJECTED:
        return None
    text = f"{err.param or ''} {err.message}".lower()
    if "reasoning_effort" in request and ("reasoning_effort" in text or "reasoning effort" in text):
        return "reasoning_effort"
    if "stream_options" in text or "include_usage" in text:
        return "stream_options"
    return None


class _Then(Enum):
    """What `Resilience.open` does after a failed attempt."""

    AGAIN = "again"  # the same deployment at once: a field it rejects was dropped
    RETRY = "retry"  # another deployment of the tier, after the backoff waited
    FALL_BACK = "fall back"  # the next tier
    CONTEXT_FALLBACK = "context fallback"  # the route's larger-context model, instead of the rest
    RAISE = "raise"  # the failure is the answer


class Resilience:
    """Opens chat calls under the configured routes, retries, fallbacks and breakers."""

    def __init__(
        self,
        config: Config,
        router: Router,
        client: Transport,
        *,
        timing: Timing | None = None,
        observers: Observers | None = None,
    ) -> None:
        self.router = router
        # Told of each attempt before it is sent (svir.observers).
        self.observers = observers if observers is not None else Observers()
        self.client = client
        timing = timing or Timing()
        self._sleep = timing.sleep
        self._rng = timing.rng
        self._clock = timing.clock
        # Bounded (svir.policy.bounded): clients may ask for any model id under a provider.
        self.deployments: BoundedMap[str, Deployment] = router.bounded(idle=Deployment.idle)
        self.budgets: dict[str, RetryBudget] = {}
        self.quirks: dict[str, Quirks] = {}
        self.retries = 0
        self.fallbacks = 0

    @property
    def routes(self) -> Mapping[str, RouteConfig]:
        """The configured routes by name (the router's table: a reload swaps them)."""
        return self.router.table.routes

    def route_for(
        self,
        model: str,
        resolved: dict[str, UpstreamTarget] | None = None,
        table: RoutingTable | None = None,
    ) -> RouteConfig:
        """The configured route of `model`, or a route of its own. A model without one is
        resolved here, so that an unknown provider is a 404 before any state is made for it;
        the UpstreamTarget found is kept in `resolved`, for the attempt not to resolve it again. By
        `table` when given (the one a call started with), else the router's current one."""
        table = table or self.router.table
        route = table.routes.get(model)
        if route is None:
            found = self.router.resolve(model, table)
            if resolved is not None:
                resolved[model] = found
            route = RouteConfig(name=model, targets=(RouteTarget(model),))
        return route

    def forget(
        self, fresh: Iterable[str], *, quirks: Iterable[str], budgets: Iterable[str]
    ) -> None:
        """After a reload: drop the breaker state of the deployments `fresh` names (a model
        name, or a `<provider>/` prefix: another server now), the learned quirks of the
        providers in `quirks` and the retry budgets of those in `budgets`. A call in flight
        keeps the objects it holds; the state of every unchanged server carries on as it was."""
        names = set(fresh)
        prefixes = tuple(n for n in names if n.endswith("/"))
        for model, _ in self.deployments.items():
            if model in names or (prefixes and model.startswith(prefixes)):
                del self.deployments[model]
        for name in quirks:
            self.quirks.pop(name, None)
        for name in budgets:
            self.budgets.pop(name, None)

    def deployment(self, model: str) -> Deployment:
        return self.deployments.setdefault(model, lambda: Deployment(model))

    def pick(
        self,
        targets: tuple[RouteTarget, ...],
        strategy: str,
        avoid: set[str],
        affinity: str | None = None,
    ) -> Deployment | None:
        """A deployment to try: closed ones first, else one half-open probe; None if all rest.

        With an `affinity` (the request's `prompt_cache_key`), the same key picks the same
        deployment among those ready, whatever the strategy, so that one conversation keeps the
        prompt cache of one server: the deployment ranked first for the key by weighted
        rendezvous hashing. A resting or avoided one is passed over for the key's next, and the
        key goes back to its first once that is well (no table to keep, the same on every worker).
        """
        now = self._clock()
        ready: list[tuple[RouteTarget, Deployment]] = []
        probe: list[tuple[RouteTarget, Deployment]] = []
        for t in targets:
            d = self.deployment(t.model)
            if d.open_until > now:
                continue
            if d.open_until and d.failures:
                if not d.probing:
                    probe.append((t, d))
                continue
            ready.append((t, d))
        fresh = [x for x in ready if x[1].model not in avoid] or ready
        if not fresh:
            if not probe:
                return None
            _, d = probe[0]
            d.probing = True
            return d
        if len(fresh) == 1:  # a route of one target, the usual case: no draw to make
            return fresh[0][1]
        if affinity is not None:
            return min(fresh, key=lambda x: _rendezvous(affinity, x[0]))[1]
        if strategy == "least-in-flight":
            least = min(d.in_flight / t.weight for t, d in fresh)
            fresh = [(t, d) for t, d in fresh if d.in_flight / t.weight == least]
        total = sum(t.weight for t, _ in fresh)
        r = self._rng.uniform(0, total)
        for t, d in fresh:
            r -= t.weight
            if r <= 0:
                return d
        return fresh[-1][1]

    def _succeeded(self, d: Deployment) -> None:
        d.failures = 0
        d.open_until = 0.0
        d.probing = False

    def _failed(self, d: Deployment, cfg: BreakerConfig) -> None:
        d.failures += 1
        if d.probing or d.failures >= cfg.failures:
            d.open_until = self._clock() + cfg.cooldown
            log.warning(
                "deployment cooled down",
                extra={
                    "fields": {
                        "deployment": d.model,
                        "failures": d.failures,
                        "cooldown": cfg.cooldown,
                    }
                },
            )
        d.probing = False

    def adjust(self, provider: str, request: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
        """The request with what this upstream is known to refuse taken out or mapped."""
        q = self.quirks.get(provider)
        if q is None:
            return request
        out = dict(request)
        for name in q.dropped:
            out.pop(name, None)
            if name in request:
                warnings.append(f"{name} dropped: the server rejects it")
        effort = out.get("reasoning_effort")
        if isinstance(effort, str) and effort in q.efforts:
            mapped = q.efforts[effort]
            if mapped is None:
                del out["reasoning_effort"]
                warnings.append(f"reasoning_effort {effort!r} dropped: the server rejects it")
            else:
                out["reasoning_effort"] = mapped
                warnings.append(
                    f"reasoning_effort {effort!r} sent as {mapped!r}: the server rejects {effort!r}"
                )
        return out

    def learn(self, provider: str, err: UpstreamError, request: dict[str, Any]) -> bool:
        """Remember an optional field this upstream rejected; True if a retry without it helps."""
        name = optional_culprit(err, request)
        if name is None:
            return False
        q = self.quirks.setdefault(provider, Quirks(set(), {}))
        effort = request.get("reasoning_effort")
        if name == "reasoning_effort" and isinstance(effort, str):
            if effort in q.efforts:
                return False
            q.efforts[effort] = nearest_effort(effort, err.message)
        else:
            if name in q.dropped:
                return False
            q.dropped.add(name)
        log.info(
            "learned an upstream quirk", extra={"fields": {"provider": provider, "field": name}}
        )
        return True

    async def open(self, ctx: CallContext, request: dict[str, Any]) -> Call:
        """Open and prime a call for the request (a `ChatCall`, or an `EmbeddingCall` for
        `ctx.operation` EMBEDDINGS); raise the last GatewayError if all fail. `ctx.outcome`
        learns each attempt's provider and, when a call serves, who serves it."""
        make: type[ChatCall] | type[EmbeddingCall] = (
            EmbeddingCall if ctx.operation == EMBEDDINGS else ChatCall
        )
        asked = request["model"]
        outcome = ctx.outcome
        resolved: dict[str, UpstreamTarget] = {}
        # The config this call started with, to its end, whatever a reload swaps in meanwhile.
        table = self.router.table
        route = self.route_for(asked, resolved, table)
        tiers: list[tuple[RouteTarget, ...]] = [route.targets]
        for f in route.fallbacks:
            tiers.append(self.route_for(f, resolved, table).targets)
        last: GatewayError | None = None
        tier = 0
        context_fallback_used = False
        key = request.get("prompt_cache_key")
        affinity = key if isinstance(key, str) and key else None
        # A captured request's attempts go through its capture's tap (svir.call.Capture).
        client = self.client if ctx.capture is None else ctx.capture.tap(self.client)
        while tier < len(tiers):
            targets = tiers[tier]
            attempt = 0
            avoid: set[str] = set()
            while True:
                d = self.pick(targets, route.strategy, avoid, affinity)
                if d is None:
                    last = last or _cooling_error(targets)
                    break
                target_route = resolved.get(d.model) or self.router.resolve(d.model, table)
                budget = self._budget(target_route.provider, attempt == 0)
                call = self._attempt(ctx, d, target_route, request, make=make, client=client)
                try:
                    await call.open()
                except GatewayError as exc:
                    last = exc
                    then = await self._after_failure(
                        exc,
                        call,
                        budget,
                        ctx=ctx,
                        attempt=attempt,
                        route=route,
                        context_fallback_used=context_fallback_used,
                    )
                    if then is _Then.AGAIN:
                        continue
                    if then is _Then.RETRY:
                        attempt += 1
                        avoid = {d.model}
                        continue
                    if then is _Then.CONTEXT_FALLBACK:
                        assert route.context_fallback is not None
                        context_fallback_used = True
                        tiers[tier + 1 :] = [
                            self.route_for(route.context_fallback, resolved, table).targets
                        ]
                    elif then is _Then.RAISE:
                        raise
                    break
                outcome.model = asked
                outcome.served_model = d.model
                outcome.stats = call.stats
                return call
            tier += 1
            if tier < len(tiers):
                self.fallbacks += 1
                self._log_fallback(asked, tiers[tier], outcome.attempts, last)
        assert last is not None
        raise last

    def _budget(self, provider: ProviderConfig, first: bool) -> RetryBudget:
        """The provider's retry budget, which the first attempt of a tier pays into."""
        budget = self.budgets.get(provider.name)
        if budget is None:
            budget = self.budgets[provider.name] = RetryBudget(
                provider.retry.budget_ratio, self._clock()
            )
        if first:
            budget.deposit(self._clock())
        return budget

    def _attempt(
        self,
        ctx: CallContext,
        d: Deployment,
        target_route: UpstreamTarget,
        request: dict[str, Any],
        *,
        make: type[ChatCall] | type[EmbeddingCall],
        client: Transport,
    ) -> ChatCall | EmbeddingCall:
        """The call of one attempt at deployment `d`, adjusted to what its provider was learned
        to reject and counted in flight and in `ctx.outcome`'s attempts; not yet opened."""
        provider = target_route.provider
        warnings: list[str] = []
        sent = self.adjust(provider.name, request, warnings)
        sent = {**sent, "model": d.model}
        headers = {"x-svir-served-model": d.model}
        if warnings:
            headers["x-svir-warning"] = "; ".join(warnings)
        quirks = self.quirks.get(provider.name)
        closers = [self._closer(d, provider.breaker)]
        if self.observers:
            closers += self.observers.attempt(AttemptStarted(target_route, sent, ctx))
        call = make(
            client,
            target_route,
            sent,
            request_id=ctx.request_id,
            model_label=d.model,
            blobs=ctx.blobs,
            headers=headers,
            drop_fields=frozenset(quirks.dropped) if quirks is not None else frozenset(),
            on_close=closers,
        )
        d.in_flight += 1
        # Also when every attempt fails: the metrics and the ledger name who failed.
        outcome = ctx.outcome
        outcome.provider = provider.name
        outcome.attempts = (*outcome.attempts, d.model)
        commit = ctx.commit
        if commit is not None:
            # The deadline of the provider tried now; its keep-alives go to the client.
            commit.due_after(target_route.timeouts.commit_deadline)
            if isinstance(call, ChatCall):
                call.keepalive_to = commit.upstream_keepalive
        return call

    async def _after_failure(
        self,
        exc: GatewayError,
        call: Call,
        budget: RetryBudget,
        *,
        ctx: CallContext,
        attempt: int,
        route: RouteConfig,
        context_fallback_used: bool,
    ) -> _Then:
        """What follows the attempt `call` that failed with `exc`; a retry's wait is waited
        here."""
        err = exc.upstream
        if err is None:
            return _Then.RAISE
        provider = call.route.provider
        self._log_failure(call.model_label, err, attempt)
        commit = ctx.commit
        if commit is not None and commit.committed:
            return _Then.RAISE  # the client has the stream's head: its one error, no retry
        if self.learn(provider.name, err, call.request):
            return _Then.AGAIN  # the same deployment, without the field: not a retry
        if err.retryable and attempt + 1 < provider.retry.attempts:
            wait = self._retry_wait(err, attempt, provider.retry)
            if wait is not None and budget.take():
                self.retries += 1
                await self._sleep(wait)
                return _Then.RETRY
        if err.kind is ErrorKind.CONTEXT_OVERFLOW:
            if route.context_fallback and not context_fallback_used:
                return _Then.CONTEXT_FALLBACK
            return _Then.RAISE
        if err.kind is ErrorKind.CONTENT_FILTER and not route.fallback_on_content_filter:
            return _Then.RAISE
        if err.kind in FALLBACK_KINDS or (
            err.kind is ErrorKind.CONTENT_FILTER and route.fallback_on_content_filter
        ):
            return _Then.FALL_BACK
        return _Then.RAISE

    def _log_fallback(
        self,
        asked: str,
        targets: tuple[RouteTarget, ...],
        attempts: tuple[str, ...],
        last: GatewayError | None,
    ) -> None:
        log.warning(
            "falling back",
            extra={
                "fields": {
                    "model": asked,
                    "to": [t.model for t in targets],
                    "after": list(attempts),
                    "error": last.error.message if last else None,
                }
            },
        )

    def _retry_wait(self, err: UpstreamError, attempt: int, cfg: RetryConfig) -> float | None:
        if err.kind is ErrorKind.RATE_LIMITED and err.retry_after is not None:
            # Longer than the cap: better served by a fallback than by waiting.
            return err.retry_after if err.retry_after <= cfg.retry_after_cap else None
        return backoff_delay(attempt, cfg, self._rng)

    def _closer(self, d: Deployment, breaker: BreakerConfig) -> CloseHook:
        def close(call: Call) -> None:
            d.in_flight -= 1
            error = call.error
            if call.succeeded:
                self._succeeded(d)
            elif error is not None:
                error = call.route.kind.explain_error(error)
                if error.kind in BREAKER_KINDS:
                    self._failed(d, breaker)
                elif d.probing:
                    d.probing = False
            elif (
                call.stats.error_kind is not None
                and ErrorKind(call.stats.error_kind) in BREAKER_KINDS
            ):
                self._failed(d, breaker)
            elif d.probing:
                d.probing = False

        return close

    def _log_failure(self, model: str, err: UpstreamError, attempt: int) -> None:
        log.warning(
            "upstream attempt failed",
            extra={
                "fields": {
                    "deployment": model,
                    "attempt": attempt + 1,
                    "error_kind": err.kind.value,
                    "error": err.message,
                }
            },
        )

    def snapshot(self) -> dict[str, Any]:
        """Breaker and load state per deployment, for `/healthz?verbose=1`."""
        now = self._clock()
        return {
            "deployments": {
                m: {
                    "state": d.state(now),
                    "failures": d.failures,
                    "in_flight": d.in_flight,
                    "cooldown_left": round(max(0.0, d.open_until - now), 3),
                }
                for m, d in sorted(self.deployments.items())
            },
            "retries": self.retries,
            "fallbacks": self.fallbacks,
            "quirks": {
                p: {"dropped": sorted(q.dropped), "reasoning_effort": q.efforts}
                for p, q in sorted(self.quirks.items())
            },
        }


def _cooling_error(targets: tuple[RouteTarget, ...]) -> GatewayError:
    names = ", ".join(t.model for t in targets)
    answer = ClientError(
        503,
        "upstream_error",
        "upstream_unavailable",
        f"Every deployment of {names} is cooling down after repeated failures",
        None,
        {"Retry-After": "1"},
    )
    return GatewayError(answer, UpstreamError(ErrorKind.TRANSIENT, "cooling down"))
