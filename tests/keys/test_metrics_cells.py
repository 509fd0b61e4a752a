"""The metrics' hot paths keep cells per series (svir.edges.metrics): fed any history of requests,
calls, attempts and config reloads, /metrics must read as it does when every update goes through
`Counter.inc` and `Histogram.observe` with labels worked out anew (`Reference`, the hooks as they
were before the cells): no series missing, none made early, none with a stale label."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.call import EMBEDDINGS
from svir.chat import Call, CallStats
from svir.edges.metrics import ERROR_CLASSES, METHODS, OTHER, OUTCOMES, Metrics, closed
from svir.observers import CallOpened, CallSettled, RequestEnded
from tests.keys.test_metrics_text import ATTEMPT, attempt, context, record


class Reference(Metrics):
    """Every update by labels, through the metrics' own `inc` and `observe`."""

    def ended(self, event: RequestEnded) -> None:
        fields = event.fields
        status = int(fields.get("status") or 500)
        method = event.method
        endpoint = event.route or OTHER
        self.http_requests.inc((endpoint, method if method in METHODS else OTHER, str(status)))
        seconds = float(fields.get("duration_ms", 0)) / 1000
        self.http_duration.observe((endpoint,), seconds)
        error = fields.get("error")
        if not error:
            ctx = event.call
            if ctx is not None and ctx.outcome.stats is not None:
                error = ctx.outcome.stats.error_kind
        if error:
            self.errors.inc((closed(error, ERROR_CLASSES),))
        elif status >= 400:
            self.errors.inc((f"http_{status}",))

    def opened(self, event: CallOpened) -> None:
        self.in_flight.inc((event.call.route.provider.name,))

    def settled(self, event: CallSettled) -> None:
        ctx, record = event.ctx, event.record
        o = ctx.outcome
        status = record.status
        label, provider = self.chat_labels(record.model, record.provider)
        calls = self.embedding_requests if ctx.operation == EMBEDDINGS else self.chat_requests
        calls.inc((label, provider, status if status in OUTCOMES else OTHER))
        limit = o.limit if o.limit is not None and status == f"{o.limit}_exceeded" else None
        if o.served_model is None:
            if limit is not None:
                self.limit_rejections.inc((limit,))
            return
        if limit is not None:
            self.streams_cut.inc((limit,))
        self.in_flight.inc((provider,), -1)
        self.tokens.inc((label, provider, "prompt"), record.prompt_tokens)
        self.tokens.inc((label, provider, "completion"), record.completion_tokens)
        if record.reasoning_tokens:
            self.tokens.inc((label, provider, "reasoning"), record.reasoning_tokens)
        if record.cached_tokens:
            self.tokens.inc((label, provider, "cached"), record.cached_tokens)
        if record.ttft_ms is not None:
            self.ttft.observe((provider,), record.ttft_ms / 1000)
        tps = o.stats.tokens_per_second if o.stats is not None else None
        if tps is not None:
            self.tps.observe((provider,), tps)

    def _attempt_closed(self, call: Call) -> None:
        provider = call.route.provider.name
        s = call.stats
        if s.error_kind is not None and not call.succeeded and s.first_token_ms is None:
            outcome = s.error_kind
            seconds = self.clock() - s.started
        else:
            outcome = "ok" if call.succeeded else (s.error_kind or "cancelled")
            seconds = (s.first_token_ms or 0.0) / 1000
        self.attempts.inc((provider, outcome if outcome in OUTCOMES else OTHER))
        self.upstream_latency.observe((provider,), seconds)


class Router:
    """What the metrics read of svir.policy.routing.Router: `known` follows the current table,
    which a reload swaps."""

    def __init__(self, max_unlisted: int = 2) -> None:
        self.table = frozenset({"fake/a", "smart"})
        self.max_unlisted = max_unlisted

    def known(self, model: str) -> bool:
        return model in self.table


MODELS = ("fake/a", "smart", "new/1", "new/2", "new/3", "new/4", "x/y")
PROVIDERS = ("fake", "slow", "local")
STATUSES = ("ok", "cancelled", "transient", "timeout", "rpm_exceeded", "tokens_per_day_exceeded",
            "model_not_allowed", "made-up outcome", OTHER)  # fmt: skip
ERRORS = (None, "transient", "timeout", "not-a-kind")
seconds = st.floats(0, 400, allow_nan=False)
maybe = st.none() | seconds
tokens = st.integers(0, 10**6)

requests = st.tuples(
    st.just("request"),
    st.sampled_from(["/v1/chat/completions", "/v1/models", None]),
    st.sampled_from(["POST", "GET", "BREW"]),
    st.sampled_from([200, 400, 401, 429, 499, 503, None]),
    st.none() | seconds,
    st.sampled_from([None, "", "invalid_api_key", "rpm_exceeded", "some code sk-1"]),
    st.sampled_from((*ERRORS, "no call")),
)
opens = st.tuples(st.just("open"), st.sampled_from(PROVIDERS))
settles = st.tuples(
    st.just("settle"),
    st.sampled_from(["chat", EMBEDDINGS]),
    st.sampled_from(MODELS),
    st.none() | st.sampled_from(PROVIDERS),
    st.sampled_from(STATUSES),
    st.booleans(),  # served
    st.sampled_from([None, "rpm", "tokens_per_day", "models"]),
    st.tuples(tokens, tokens, st.none() | tokens, st.none() | tokens),
    maybe,  # ttft_ms
    maybe,  # tokens per second
)
attempts = st.tuples(
    st.just("attempt"),
    st.sampled_from(PROVIDERS),
    st.booleans(),
    st.sampled_from(ERRORS),
    maybe,  # first_token_ms
    st.floats(0, 100, allow_nan=False),  # started
)
reloads = st.tuples(st.just("reload"), st.frozensets(st.sampled_from(MODELS), max_size=4))
history = st.lists(st.one_of(requests, opens, settles, attempts, reloads), max_size=60)


def play(metrics: Metrics, router: Router, policy: Any, step: tuple[Any, ...]) -> None:
    match step:
        case ("request", route, method, status, duration, error, kind):
            call = None if kind == "no call" else context(stats=CallStats(error_kind=kind))
            fields: dict[str, Any] = {"status": status}
            if duration is not None:
                fields["duration_ms"] = duration
            if error is not None:
                fields["error"] = error
            metrics.ended(RequestEnded(route, method, fields, call))
        case ("open", provider):
            served = SimpleNamespace(route=SimpleNamespace(provider=SimpleNamespace(name=provider)))
            metrics.opened(CallOpened(context(), served))
        case ("settle", operation, model, provider, status, served, limit, counts, ttft, tps):
            prompt, completion, reasoning, cached = counts
            outcome: dict[str, Any] = {"limit": limit, "stats": CallStats(tokens_per_second=tps)}
            if served:
                outcome["served_model"] = model
            metrics.settled(CallSettled(
                context(operation, **outcome),
                record(
                    model, provider, status, prompt_tokens=prompt, completion_tokens=completion,
                    reasoning_tokens=reasoning, cached_tokens=cached, ttft_ms=ttft,
                ),
            ))  # fmt: skip
        case ("attempt", provider, succeeded, kind, first, started):
            call = attempt(
                provider, succeeded=succeeded, error_kind=kind, first_token_ms=first,
                started=started,
            )  # fmt: skip
            metrics.attempt(ATTEMPT)(call)
        case ("reload", named):
            router.table = named


def watched(metrics: Metrics, max_unlisted: int = 2) -> tuple[Router, Any]:
    router = Router(max_unlisted)
    policy = SimpleNamespace(
        router=router, retries=0, fallbacks=0, snapshot=lambda: {"deployments": {}}
    )
    metrics.watch_policy(policy)  # type: ignore[arg-type]
    return router, policy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history, st.integers(0, 3))
def test_the_cells_render_as_updates_by_labels(steps: list[tuple[Any, ...]], bound: int) -> None:
    fast, slow = Metrics(clock=lambda: 100.0), Reference(clock=lambda: 100.0)
    fast_env, slow_env = watched(fast, bound), watched(slow, bound)
    assert fast.render() == slow.render()
    for step in steps:
        play(fast, *fast_env, step)
        play(slow, *slow_env, step)
        assert fast.render().decode() == slow.render().decode(), step


def test_a_reload_relabels_a_model_the_cells_have_seen() -> None:
    """A model the config named keeps its name; after a reload that drops it, with the unlisted
    models' bound reached, its calls count as "other"."""
    metrics = Metrics()
    router, _ = watched(metrics, max_unlisted=0)
    ok = context(served_model="fake/a", stats=CallStats())
    metrics.settled(CallSettled(ok, record("fake/a", "fake", "ok", prompt_tokens=3)))
    router.table = frozenset()
    metrics.settled(CallSettled(ok, record("fake/a", "fake", "ok", prompt_tokens=5)))
    assert metrics.chat_requests.get(("fake/a", "fake", "ok")) == 1
    assert metrics.chat_requests.get(("other", "fake", "ok")) == 1
    assert metrics.tokens.get(("other", "fake", "prompt")) == 5
