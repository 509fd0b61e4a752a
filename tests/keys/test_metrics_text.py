"""The whole /metrics text for a fixed set of requests, calls and attempts, byte for byte: the
metrics' hot path is written for speed (label tuples and histogram entries kept per series), and
this pins what it must still produce."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from svir import __version__
from svir.call import EMBEDDINGS, CallContext, CallOutcome, CallRecord
from svir.chat import CallStats
from svir.edges.metrics import Metrics
from svir.observers import AttemptStarted, CallOpened, CallSettled, RequestEnded


def record(model: str, provider: str | None, status: str, **kw: Any) -> CallRecord:
    values: dict[str, Any] = {
        "ts": 1.0,
        "request_id": "r",
        "key_id": None,
        "api": "openai",
        "model": model,
        "served_model": None,
        "provider": provider,
        "status": status,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "reasoning_tokens": None,
        "cached_tokens": None,
        "usage_source": "none",
        "cost_micros": None,
        "latency_ms": 0.0,
        "ttft_ms": None,
        "tokens_per_second": None,
        "upstream_request_id": None,
        "upstream_id": None,
        "client_user": None,
    }
    values.update(kw)
    return CallRecord(**values)


def context(operation: str = "chat", **outcome: Any) -> CallContext:
    return CallContext(
        request_id="r", api="openai", outcome=CallOutcome(**outcome), operation=operation
    )


def attempt(provider: str, *, succeeded: bool, **stats: Any) -> Any:
    route = SimpleNamespace(provider=SimpleNamespace(name=provider))
    return SimpleNamespace(route=route, stats=CallStats(**stats), succeeded=succeeded)


def request(
    metrics: Metrics,
    route: str | None,
    fields: dict[str, Any],
    *,
    call: CallContext | None = None,
    method: str = "POST",
) -> None:
    metrics.ended(RequestEnded(route, method, fields, call))


def settle(metrics: Metrics, ctx: CallContext, record: CallRecord) -> None:
    metrics.settled(CallSettled(ctx, record))


# What the metrics' attempt watch is given: it counts the attempt when it closes, from the call.
ATTEMPT: Any = AttemptStarted(None, {}, None)  # type: ignore[arg-type]


def feed(metrics: Metrics) -> None:
    chat = "/v1/chat/completions"
    ok = context(stats=CallStats(started=10.0, error_kind=None))
    failed_stream = context(stats=CallStats(started=10.0, error_kind="transient"))
    request(metrics, chat, {"status": 200, "duration_ms": 12.5}, call=ok)
    request(metrics, chat, {"status": 200, "duration_ms": 0.3}, call=ok)
    request(metrics, chat, {"status": 200, "duration_ms": 700000.0})
    request(metrics, chat, {"status": 200}, call=failed_stream)
    request(metrics, chat, {"status": 401, "error": "invalid_api_key"})
    request(metrics, chat, {"status": 429, "error": "rpm_exceeded"})
    request(metrics, chat, {"status": 400, "error": "some upstream's code sk-1"})
    request(metrics, None, {"status": 404, "duration_ms": 1}, method="BREW")
    request(metrics, "/healthz", {"status": 503}, method="GET")
    request(metrics, chat, {"duration_ms": 5000})  # no status: a 500
    request(metrics, chat, {"status": 499, "duration_ms": 2})
    request(metrics, "/v1/models", {"status": 200}, method="GET")

    metrics.router = SimpleNamespace(  # type: ignore[assignment]
        known=lambda model: model in ("fake/a", "smart"), max_unlisted=2
    )
    served = SimpleNamespace(route=SimpleNamespace(provider=SimpleNamespace(name="fake")))
    for _ in range(3):
        metrics.opened(CallOpened(context(), served))  # type: ignore[arg-type]
    settle(
        metrics,
        context(served_model="fake/a", stats=CallStats(tokens_per_second=42.5)),
        record("fake/a", "fake", "ok", prompt_tokens=12, completion_tokens=5, ttft_ms=120.0),
    )
    settle(
        metrics,
        context(served_model="fake/a", stats=CallStats(tokens_per_second=None)),
        record(
            "smart", "fake", "ok", prompt_tokens=7, completion_tokens=3, reasoning_tokens=2,
            cached_tokens=4, ttft_ms=3.5,
        ),
    )  # fmt: skip
    settle(
        metrics,
        context(served_model="fake/a", limit="tokens_per_day", stats=CallStats()),
        record("fake/a", "fake", "tokens_per_day_exceeded", prompt_tokens=1, completion_tokens=9),
    )
    settle(metrics, context(limit="rpm"), record("fake/a", None, "rpm_exceeded"))
    settle(metrics, context(limit="models"), record("secret", None, "model_not_allowed"))
    settle(metrics, context(), record("fake/a", "fake", "transient"))
    # Unlisted models: two keep their names (the cap), the third is "other".
    for name in ("new/1", "new/2", "new/3", "new/1"):
        settle(metrics, context(), record(name, "other-provider", "cancelled"))
    settle(
        metrics,
        context(EMBEDDINGS, served_model="fake/a", stats=CallStats()),
        record("fake/a", "fake", "ok", prompt_tokens=30),
    )
    settle(metrics, context(EMBEDDINGS), record("fake/a", "fake", "made-up outcome"))

    policy = SimpleNamespace(
        router=metrics.router,
        retries=3,
        fallbacks=1,
        snapshot=lambda: {
            "deployments": {
                "fake/a": {"state": "closed", "failures": 0},
                "fake/b": {"state": "open", "failures": 5},
            }
        },
    )
    metrics.watch_policy(policy)  # type: ignore[arg-type]
    for call in (
        attempt("fake", succeeded=True, first_token_ms=250.0),
        attempt("fake", succeeded=True, first_token_ms=None),
        attempt("fake", succeeded=False, error_kind="transient", started=99.5),
        attempt("slow", succeeded=False, error_kind="timeout", started=70.0),
        attempt("slow", succeeded=False, error_kind="transient", first_token_ms=40.0),
        attempt("slow", succeeded=False),
        attempt("slow", succeeded=False, error_kind="not-a-kind", started=100.0),
    ):
        metrics.attempt(ATTEMPT)(call)


def test_the_metrics_text_for_a_fixed_history() -> None:
    metrics = Metrics(clock=lambda: 100.0)
    feed(metrics)
    text = metrics.render().decode()
    assert text == EXPECTED.replace("VERSION", __version__)


EXPECTED = """\
# HELP svir_http_requests_total HTTP requests by route, method and status.
# TYPE svir_http_requests_total counter
svir_http_requests_total{endpoint="/healthz",method="GET",status="503"} 1
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="200"} 4
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="400"} 1
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="401"} 1
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="429"} 1
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="499"} 1
svir_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="500"} 1
svir_http_requests_total{endpoint="/v1/models",method="GET",status="200"} 1
svir_http_requests_total{endpoint="other",method="other",status="404"} 1
# HELP svir_http_request_duration_seconds HTTP request duration, to the last byte of the answer.
# TYPE svir_http_request_duration_seconds histogram
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.005"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.01"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.025"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.05"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.1"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.25"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="0.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="1"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="2.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="10"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="30"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="60"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="120"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="300"} 1
svir_http_request_duration_seconds_bucket{endpoint="/healthz",le="+Inf"} 1
svir_http_request_duration_seconds_sum{endpoint="/healthz"} 0
svir_http_request_duration_seconds_count{endpoint="/healthz"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.005"} 6
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.01"} 6
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.025"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.05"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.1"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.25"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="0.5"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="1"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="2.5"} 7
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="5"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="10"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="30"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="60"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="120"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="300"} 8
svir_http_request_duration_seconds_bucket{endpoint="/v1/chat/completions",le="+Inf"} 9
svir_http_request_duration_seconds_sum{endpoint="/v1/chat/completions"} 705.0147999999999
svir_http_request_duration_seconds_count{endpoint="/v1/chat/completions"} 9
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.005"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.01"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.025"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.05"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.1"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.25"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="0.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="1"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="2.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="5"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="10"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="30"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="60"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="120"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="300"} 1
svir_http_request_duration_seconds_bucket{endpoint="/v1/models",le="+Inf"} 1
svir_http_request_duration_seconds_sum{endpoint="/v1/models"} 0
svir_http_request_duration_seconds_count{endpoint="/v1/models"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.005"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.01"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.025"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.05"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.1"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.25"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="0.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="1"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="2.5"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="5"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="10"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="30"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="60"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="120"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="300"} 1
svir_http_request_duration_seconds_bucket{endpoint="other",le="+Inf"} 1
svir_http_request_duration_seconds_sum{endpoint="other"} 0.001
svir_http_request_duration_seconds_count{endpoint="other"} 1
# HELP svir_errors_total Failed requests by class: svir's error code, or the upstream failure's kind.
# TYPE svir_errors_total counter
svir_errors_total{class="http_404"} 1
svir_errors_total{class="http_499"} 1
svir_errors_total{class="http_500"} 1
svir_errors_total{class="http_503"} 1
svir_errors_total{class="invalid_api_key"} 1
svir_errors_total{class="other"} 1
svir_errors_total{class="rpm_exceeded"} 1
svir_errors_total{class="transient"} 1
# HELP svir_chat_requests_total Chat calls (every front end) by model asked, provider and outcome.
# TYPE svir_chat_requests_total counter
svir_chat_requests_total{model="fake/a",provider="fake",outcome="ok"} 1
svir_chat_requests_total{model="fake/a",provider="fake",outcome="tokens_per_day_exceeded"} 1
svir_chat_requests_total{model="fake/a",provider="fake",outcome="transient"} 1
svir_chat_requests_total{model="fake/a",provider="none",outcome="rpm_exceeded"} 1
svir_chat_requests_total{model="new/1",provider="other-provider",outcome="cancelled"} 2
svir_chat_requests_total{model="new/2",provider="other-provider",outcome="cancelled"} 1
svir_chat_requests_total{model="other",provider="none",outcome="model_not_allowed"} 1
svir_chat_requests_total{model="other",provider="other-provider",outcome="cancelled"} 1
svir_chat_requests_total{model="smart",provider="fake",outcome="ok"} 1
# HELP svir_embedding_requests_total Embedding calls (every front end) by model asked, provider and outcome.
# TYPE svir_embedding_requests_total counter
svir_embedding_requests_total{model="fake/a",provider="fake",outcome="ok"} 1
svir_embedding_requests_total{model="fake/a",provider="fake",outcome="other"} 1
# HELP svir_tokens_total Tokens by model, provider and kind (prompt, completion, reasoning, cached).
# TYPE svir_tokens_total counter
svir_tokens_total{model="fake/a",provider="fake",kind="completion"} 14
svir_tokens_total{model="fake/a",provider="fake",kind="prompt"} 43
svir_tokens_total{model="smart",provider="fake",kind="cached"} 4
svir_tokens_total{model="smart",provider="fake",kind="completion"} 3
svir_tokens_total{model="smart",provider="fake",kind="prompt"} 7
svir_tokens_total{model="smart",provider="fake",kind="reasoning"} 2
# HELP svir_time_to_first_token_seconds From the chat call's start (retries included) to the first visible token.
# TYPE svir_time_to_first_token_seconds histogram
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.005"} 1
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.01"} 1
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.025"} 1
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.05"} 1
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.1"} 1
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.25"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="0.5"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="1"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="2.5"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="5"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="10"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="30"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="60"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="120"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="300"} 2
svir_time_to_first_token_seconds_bucket{provider="fake",le="+Inf"} 2
svir_time_to_first_token_seconds_sum{provider="fake"} 0.1235
svir_time_to_first_token_seconds_count{provider="fake"} 2
# HELP svir_tokens_per_second Generation speed, first visible token to last (§3.6).
# TYPE svir_tokens_per_second histogram
svir_tokens_per_second_bucket{provider="fake",le="1"} 0
svir_tokens_per_second_bucket{provider="fake",le="2"} 0
svir_tokens_per_second_bucket{provider="fake",le="5"} 0
svir_tokens_per_second_bucket{provider="fake",le="10"} 0
svir_tokens_per_second_bucket{provider="fake",le="20"} 0
svir_tokens_per_second_bucket{provider="fake",le="30"} 0
svir_tokens_per_second_bucket{provider="fake",le="50"} 1
svir_tokens_per_second_bucket{provider="fake",le="75"} 1
svir_tokens_per_second_bucket{provider="fake",le="100"} 1
svir_tokens_per_second_bucket{provider="fake",le="150"} 1
svir_tokens_per_second_bucket{provider="fake",le="200"} 1
svir_tokens_per_second_bucket{provider="fake",le="500"} 1
svir_tokens_per_second_bucket{provider="fake",le="+Inf"} 1
svir_tokens_per_second_sum{provider="fake"} 42.5
svir_tokens_per_second_count{provider="fake"} 1
# HELP svir_streams_in_flight Chat calls streaming now.
# TYPE svir_streams_in_flight gauge
svir_streams_in_flight{provider="fake"} -1
# HELP svir_upstream_attempts_total Upstream attempts (each retry and fallback counts) by provider and outcome.
# TYPE svir_upstream_attempts_total counter
svir_upstream_attempts_total{provider="fake",outcome="ok"} 2
svir_upstream_attempts_total{provider="fake",outcome="transient"} 1
svir_upstream_attempts_total{provider="slow",outcome="cancelled"} 1
svir_upstream_attempts_total{provider="slow",outcome="other"} 1
svir_upstream_attempts_total{provider="slow",outcome="timeout"} 1
svir_upstream_attempts_total{provider="slow",outcome="transient"} 1
# HELP svir_upstream_latency_seconds Per attempt: to the first visible output, or to the failure.
# TYPE svir_upstream_latency_seconds histogram
svir_upstream_latency_seconds_bucket{provider="fake",le="0.005"} 1
svir_upstream_latency_seconds_bucket{provider="fake",le="0.01"} 1
svir_upstream_latency_seconds_bucket{provider="fake",le="0.025"} 1
svir_upstream_latency_seconds_bucket{provider="fake",le="0.05"} 1
svir_upstream_latency_seconds_bucket{provider="fake",le="0.1"} 1
svir_upstream_latency_seconds_bucket{provider="fake",le="0.25"} 2
svir_upstream_latency_seconds_bucket{provider="fake",le="0.5"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="1"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="2.5"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="5"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="10"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="30"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="60"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="120"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="300"} 3
svir_upstream_latency_seconds_bucket{provider="fake",le="+Inf"} 3
svir_upstream_latency_seconds_sum{provider="fake"} 0.75
svir_upstream_latency_seconds_count{provider="fake"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="0.005"} 2
svir_upstream_latency_seconds_bucket{provider="slow",le="0.01"} 2
svir_upstream_latency_seconds_bucket{provider="slow",le="0.025"} 2
svir_upstream_latency_seconds_bucket{provider="slow",le="0.05"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="0.1"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="0.25"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="0.5"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="1"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="2.5"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="5"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="10"} 3
svir_upstream_latency_seconds_bucket{provider="slow",le="30"} 4
svir_upstream_latency_seconds_bucket{provider="slow",le="60"} 4
svir_upstream_latency_seconds_bucket{provider="slow",le="120"} 4
svir_upstream_latency_seconds_bucket{provider="slow",le="300"} 4
svir_upstream_latency_seconds_bucket{provider="slow",le="+Inf"} 4
svir_upstream_latency_seconds_sum{provider="slow"} 30.04
svir_upstream_latency_seconds_count{provider="slow"} 4
# HELP svir_limit_rejections_total Calls refused by a key's limit.
# TYPE svir_limit_rejections_total counter
svir_limit_rejections_total{limit="rpm"} 1
# HELP svir_streams_cut_total Answers ended by an error frame when a budget ran out mid-answer.
# TYPE svir_streams_cut_total counter
svir_streams_cut_total{limit="tokens_per_day"} 1
# HELP svir_build_info svir's version.
# TYPE svir_build_info gauge
svir_build_info{version="VERSION"} 1
# HELP svir_retries_total Upstream attempts retried.
# TYPE svir_retries_total counter
svir_retries_total 3
# HELP svir_fallbacks_total Calls sent on to a fallback model.
# TYPE svir_fallbacks_total counter
svir_fallbacks_total 1
# HELP svir_breaker_state Circuit breaker per deployment: 0 closed, 1 half-open, 2 open.
# TYPE svir_breaker_state gauge
svir_breaker_state{deployment="fake/a"} 0
svir_breaker_state{deployment="fake/b"} 2
# HELP svir_breaker_failures Failures in a row per deployment.
# TYPE svir_breaker_failures gauge
svir_breaker_failures{deployment="fake/a"} 0
svir_breaker_failures{deployment="fake/b"} 5
"""
