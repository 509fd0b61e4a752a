"""GET /metrics: Prometheus text exposition (format 0.0.4), from counters kept in this process.

Written by hand rather than with prometheus-client: svir needs counters, gauges and histograms
with a few labels, one event loop updates them (no locks), and several Apps in one process (the
tests) must not share a global registry. Values read at scrape time (retries, fallbacks, breaker
states, the ledger's queue) come from collectors.

What is measured (see docs/keys.md):

- HTTP: `svir_http_requests_total{endpoint,method,status}`, `svir_http_request_duration_seconds`,
  `svir_errors_total{class}` (svir's error code, or the upstream failure's kind).
- Embedding calls: `svir_embedding_requests_total{model,provider,outcome}`; their input tokens
  count in `svir_tokens_total` as kind "prompt", and their attempts as the chat calls' do.
- Chat calls (every front end): `svir_chat_requests_total{model,provider,outcome}`,
  `svir_tokens_total{model,provider,kind}`, `svir_time_to_first_token_seconds{provider}`,
  `svir_tokens_per_second{provider}` (§3.6), `svir_streams_in_flight{provider}`. The model and
  provider labels are never empty and never grow with invented model ids (`Metrics.chat_labels`).
- Upstream attempts (retries and fallbacks each count): `svir_upstream_attempts_total
  {provider,outcome}`, `svir_upstream_latency_seconds{provider}` (to the first visible output, or
  to the failure).
- Policy: `svir_retries_total`, `svir_fallbacks_total`, `svir_breaker_state{deployment}` (0
  closed, 1 half-open, 2 open), `svir_breaker_failures{deployment}`.
- Keys: `svir_limit_rejections_total{limit}`, `svir_streams_cut_total{limit}`, and the ledger's
  `svir_ledger_rows_written_total`, `svir_ledger_rows_dropped_total`, `svir_ledger_rows_pending`.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from svir import __version__
from svir.call import EMBEDDINGS
from svir.config.model import ServerConfig
from svir.keys.limits import LIMIT_NAMES
from svir.observers import AttemptStarted, CallOpened, CallSettled, Observer, RequestEnded
from svir.wire.errors import ErrorKind

if TYPE_CHECKING:
    from svir.chat import Call, CloseHook
    from svir.policy.resilience import Resilience
    from svir.policy.routing import Router

__all__ = [
    "CONTENT_TYPE",
    "ERROR_CLASSES",
    "METHODS",
    "OTHER",
    "OUTCOMES",
    "OWN_ERRORS",
    "Counter",
    "Gauge",
    "Histogram",
    "Metrics",
    "Registry",
    "closed",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
RATE_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 500.0)
_LABEL_LIMIT: Final = 120
# The model label of a call to a model past the bound, or refused before it was routed.
OTHER_MODEL: Final = "other"
# The provider label of a call refused before it was routed.
NO_PROVIDER: Final = "none"
_UNLISTED_DEFAULT: Final = ServerConfig().max_unlisted_models

Labels = tuple[str, ...]

# Label values of errors, outcomes and methods come from these closed sets, which svir defines,
# never from a string a client or an upstream wrote: an upstream's error code may quote the key
# it was sent, and a client may invent a method per request. Anything else is "other".
OTHER: Final = "other"
# svir's own error codes, and the error types that stand in for a missing code (every code in
# svir's source is here: tests/keys/test_secrets.py reads the source to check).
OWN_ERRORS: Final = frozenset(
    {
        "admin_disabled", "attachment_not_found", "attachment_too_large", "content_filter",
        "context_length_exceeded", "continuation_cancelled", "duplicate_tool_result",
        "empty_thread", "internal_error", "invalid_admin_key", "invalid_api_key", "invalid_json",
        "invalid_cursor", "invalid_metrics_token", "invalid_request", "invalid_type",
        "invalid_value", "json_too_deep", "key_not_found", "lease_lost", "limits_unavailable",
        "loopback_only", "origin_not_allowed", "host_not_allowed", "cross_site_request",
        "json_required",
        "message_not_found", "method_not_allowed", "metrics_locked",
        "missing_required_parameter", "model_busy", "model_not_allowed", "model_not_found",
        "model_not_managed", "probe_busy", "probe_failed",
        "no_pending_tool_calls", "not_found", "nothing_to_answer", "previous_response_not_found",
        "rate_limit_exceeded",
        "request_too_large", "response_format_mismatch", "server_shutting_down", "starting",
        "store_unavailable", "thread_attachments_too_large", "thread_busy", "thread_not_found",
        "tool_results_pending", "unknown_tool_call_id", "unsupported_attachment",
        "unsupported_input", "unsupported_parameter", "unsupported_value",
        "upstream_auth_error", "upstream_error", "upstream_timeout", "upstream_unavailable",
        # Types
        "invalid_request_error", "rate_limit_error", "insufficient_quota", "server_error",
    }
)  # fmt: skip
ERROR_CLASSES: Final = frozenset(
    {*OWN_ERRORS, *(kind.value for kind in ErrorKind), *(f"{n}_exceeded" for n in LIMIT_NAMES)}
)
# What became of a chat call or an upstream attempt.
OUTCOMES: Final = ERROR_CLASSES | {"ok", "cancelled"}
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def closed(value: object, allowed: frozenset[str]) -> str:
    """`value` when it is one of `allowed`, else "other"."""
    return value if isinstance(value, str) and value in allowed else OTHER


def _escape(value: str) -> str:
    if len(value) > _LABEL_LIMIT:
        value = value[: _LABEL_LIMIT - 1] + "…"
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _labels(names: Labels, values: Labels, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Labels = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = labels

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help: str, labels: Labels = ()) -> None:
        super().__init__(name, help, labels)
        # labels -> [value]: a one-element list, so that a hot path may keep a series' cell
        # (`cell`) and add to it in place.
        self.values: dict[Labels, list[float]] = {}

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        cell = self.values.get(labels)
        if cell is None:
            cell = self.cell(labels)
        cell[0] += amount

    def get(self, labels: Labels = ()) -> float:
        cell = self.values.get(labels)
        return cell[0] if cell is not None else 0.0

    def cell(self, labels: Labels) -> list[float]:
        """The series of `labels` (made at 0 if new, so it is rendered from now on): a
        one-element list, which a hot path may keep and update in place as `inc` does."""
        cell = self.values.get(labels)
        if cell is None:
            cell = self.values[labels] = [0.0]
        return cell

    def samples(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.labelnames, k)} {_number(v[0])}"
            for k, v in sorted(self.values.items())
        ]


class Gauge(Counter):
    kind = "gauge"

    def set(self, labels: Labels, value: float) -> None:
        self.cell(labels)[0] = value


# A histogram's series: its counts per bucket (not cumulative) and +Inf's, and its sum.
Entry = tuple[list[int], list[float]]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labels: Labels = (),
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help, labels)
        self.buckets = buckets
        self.values: dict[Labels, Entry] = {}

    def observe(self, labels: Labels, value: float) -> None:
        entry = self.values.get(labels)
        if entry is None:
            entry = self.entry(labels)
        entry[0][bisect.bisect_left(self.buckets, value)] += 1
        entry[1][0] += value

    def entry(self, labels: Labels) -> Entry:
        """The series of `labels` (made empty if new): its counts per bucket and its sum, which
        a hot path may update in place as `observe` does."""
        entry = self.values.get(labels)
        if entry is None:
            entry = self.values[labels] = ([0] * (len(self.buckets) + 1), [0.0])
        return entry

    def count(self, labels: Labels = ()) -> int:
        entry = self.values.get(labels)
        return sum(entry[0]) if entry else 0

    def samples(self) -> list[str]:
        out: list[str] = []
        for labels, (counts, total) in sorted(self.values.items()):
            running = 0
            for bound, n in zip(self.buckets, counts, strict=False):
                running += n
                le = f'le="{_number(bound)}"'
                out.append(f"{self.name}_bucket{_labels(self.labelnames, labels, le)} {running}")
            running += counts[-1]
            inf = 'le="+Inf"'
            out.append(f"{self.name}_bucket{_labels(self.labelnames, labels, inf)} {running}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, labels)} {_number(total[0])}")
            out.append(f"{self.name}_count{_labels(self.labelnames, labels)} {running}")
        return out


Collector = Callable[[], Iterable[_Metric]]
M = TypeVar("M", bound=_Metric)


class Registry:
    def __init__(self) -> None:
        self.metrics: list[_Metric] = []
        self.collectors: list[Collector] = []

    def add(self, metric: M) -> M:
        self.metrics.append(metric)
        return metric

    def render(self) -> bytes:
        lines: list[str] = []
        metrics = list(self.metrics)
        for collect in self.collectors:
            metrics.extend(collect())
        for metric in metrics:
            lines.extend(metric.header())
            lines.extend(metric.samples())
        return ("\n".join(lines) + "\n").encode()


class _CallSeries:
    """The cells a settled call of one (operation, model label, provider label) updates, each
    taken from its metric when first needed (taking one makes its series, which must not show
    before a call counted in it)."""

    __slots__ = ("cached", "calls", "labels", "outcomes", "reasoning", "served", "tps", "ttft")

    def __init__(self, calls: Counter, label: str, provider: str) -> None:
        self.calls = calls
        self.labels = (label, provider)
        # Outcome (one of OUTCOMES) -> the cell of the calls that came to it.
        self.outcomes: dict[str, list[float]] = {}
        # What every served call updates: the streams in flight, the prompt and completion tokens.
        self.served: tuple[list[float], list[float], list[float]] | None = None
        self.reasoning: list[float] | None = None
        self.cached: list[float] | None = None
        self.ttft: Entry | None = None
        self.tps: Entry | None = None

    def outcome(self, status: str) -> list[float]:
        """The cell of the calls that came to `status` ("other" unless one of OUTCOMES: only
        those are kept, so that invented statuses cannot grow `outcomes`)."""
        if status not in OUTCOMES:
            return self.calls.cell((*self.labels, OTHER))
        cell = self.outcomes[status] = self.calls.cell((*self.labels, status))
        return cell


class Metrics(Observer):
    """svir's metrics, an observer (svir.observers): the App's end of each request (`ended`),
    the policy's attempts and the key gate's calls (opened, then settled) feed them."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        # Which models have a model label of their own (`chat_labels`); set by `watch_policy`.
        self.router: Router | None = None
        self._unlisted: set[str] = set()
        # (route, method, status) -> `ended`'s counter cell and histogram entry (bounded:
        # the route is svir's, the method one of METHODS or "other", the status svir's answer's).
        self._http: dict[tuple[str | None, str, Any], Any] = {}
        # The hot paths' cells, each bounded as the series it points into (which stay anyway):
        # per (operation, model label, provider label) of a settled call (`settled`); per
        # provider of an opened call; per (provider, outcome) of an upstream attempt.
        self._calls: dict[tuple[str, str, str], _CallSeries] = {}
        self._opened: dict[str, list[float]] = {}
        self._attempts: dict[tuple[str, str], tuple[list[float], Entry]] = {}
        r = self.registry = Registry()
        # In the order /metrics shows them.
        self._add_request_metrics(r)
        self._add_call_metrics(r)
        self._add_upstream_metrics(r)
        self._add_limit_metrics(r)
        info = r.add(Gauge("svir_build_info", "svir's version.", ("version",)))
        info.set((__version__,), 1)

    def _add_request_metrics(self, r: Registry) -> None:
        """The HTTP requests' metrics, and their failures by class."""
        self.http_requests = r.add(
            Counter(
                "svir_http_requests_total",
                "HTTP requests by route, method and status.",
                ("endpoint", "method", "status"),
            )
        )
        self.http_duration = r.add(
            Histogram(
                "svir_http_request_duration_seconds",
                "HTTP request duration, to the last byte of the answer.",
                ("endpoint",),
            )
        )
        self.errors = r.add(
            Counter(
                "svir_errors_total",
                "Failed requests by class: svir's error code, or the upstream failure's kind.",
                ("class",),
            )
        )

    def _add_call_metrics(self, r: Registry) -> None:
        """The chat and embedding calls' metrics: by outcome, their tokens, their speed."""
        self.chat_requests = r.add(
            Counter(
                "svir_chat_requests_total",
                "Chat calls (every front end) by model asked, provider and outcome.",
                ("model", "provider", "outcome"),
            )
        )
        self.embedding_requests = r.add(
            Counter(
                "svir_embedding_requests_total",
                "Embedding calls (every front end) by model asked, provider and outcome.",
                ("model", "provider", "outcome"),
            )
        )
        self.tokens = r.add(
            Counter(
                "svir_tokens_total",
                "Tokens by model, provider and kind (prompt, completion, reasoning, cached).",
                ("model", "provider", "kind"),
            )
        )
        self.ttft = r.add(
            Histogram(
                "svir_time_to_first_token_seconds",
                "From the chat call's start (retries included) to the first visible token.",
                ("provider",),
            )
        )
        self.tps = r.add(
            Histogram(
                "svir_tokens_per_second",
                "Generation speed, first visible token to last (§3.6).",
                ("provider",),
                RATE_BUCKETS,
            )
        )
        self.in_flight = r.add(
            Gauge("svir_streams_in_flight", "Chat calls streaming now.", ("provider",))
        )

    def _add_upstream_metrics(self, r: Registry) -> None:
        """The upstream attempts' metrics."""
        self.attempts = r.add(
            Counter(
                "svir_upstream_attempts_total",
                "Upstream attempts (each retry and fallback counts) by provider and outcome.",
                ("provider", "outcome"),
            )
        )
        self.upstream_latency = r.add(
            Histogram(
                "svir_upstream_latency_seconds",
                "Per attempt: to the first visible output, or to the failure.",
                ("provider",),
            )
        )

    def _add_limit_metrics(self, r: Registry) -> None:
        """What the keys' limits refused or cut."""
        self.limit_rejections = r.add(
            Counter("svir_limit_rejections_total", "Calls refused by a key's limit.", ("limit",))
        )
        self.streams_cut = r.add(
            Counter(
                "svir_streams_cut_total",
                "Answers ended by an error frame when a budget ran out mid-answer.",
                ("limit",),
            )
        )

    # Feeds

    def ended(self, event: RequestEnded) -> None:
        """Count an HTTP request that ended (its log fields have its status and duration). The
        requests counter's cell and the duration histogram's entry of each (route, method,
        status) are taken once: this runs for every request."""
        fields = event.fields
        status = fields.get("status") or 500
        method = event.method
        key = (event.route, method if method in METHODS else OTHER, status)
        series = self._http.get(key)
        if series is None:
            series = self._http_series(key)
        cell, counts, total, http_error = series
        cell[0] += 1.0
        seconds = float(fields.get("duration_ms", 0)) / 1000
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        total[0] += seconds
        # The failure's class: svir's error code from the log fields, else the kind of the chat
        # call's failure (closed: ERROR_CLASSES), else `http_<status>` for an error status.
        error = fields.get("error")
        if not error:
            ctx = event.call
            if ctx is not None:
                stats = ctx.outcome.stats
                if stats is not None:
                    error = stats.error_kind
        if error:
            self.errors.inc((closed(error, ERROR_CLASSES),))
        elif http_error is not None:
            self.errors.inc(http_error)

    def _http_series(
        self, key: tuple[str | None, str, Any]
    ) -> tuple[list[float], list[int], list[float], Labels | None]:
        route, method, raw = key
        endpoint = route or OTHER
        status = int(raw)
        cell = self.http_requests.cell((endpoint, method, str(status)))
        counts, total = self.http_duration.entry((endpoint,))
        http_error = (f"http_{status}",) if status >= 400 else None
        series = self._http[key] = (cell, counts, total, http_error)
        return series

    def chat_labels(self, model: str, provider: str | None) -> tuple[str, str]:
        """The model and provider labels of a chat call (`provider` None: refused before it was
        routed). A model keeps its name when the router knows it, and otherwise while fewer than
        `[server] max_unlisted_models` others have one; past that, or never routed, it counts as
        "other". A series, once there, stays (a counter must not vanish and come back from zero):
        the bound folds new names, as OpenTelemetry's cardinality limit does."""
        router = self.router
        if router is not None and router.known(model):
            return model, provider or NO_PROVIDER
        if provider is None:
            return OTHER_MODEL, NO_PROVIDER
        if model not in self._unlisted:
            cap = router.max_unlisted if router is not None else _UNLISTED_DEFAULT
            if len(self._unlisted) >= cap:
                return OTHER_MODEL, provider
            self._unlisted.add(model)
        return model, provider

    def opened(self, event: CallOpened) -> None:
        """A chat call the key gate let through is streaming."""
        name = event.call.route.provider.name
        cell = self._opened.get(name)
        if cell is None:
            cell = self._opened[name] = self.in_flight.cell((name,))
        cell[0] += 1.0

    def settled(self, event: CallSettled) -> None:
        """What a chat call came to (svir.policy.key_gate): refused or failed, or served and closed.
        The labels are worked out anew for each call (they follow the router's config); the
        cells they lead to are kept (`_CallSeries`)."""
        ctx, record = event.ctx, event.record
        o = ctx.outcome
        status = record.status
        label, provider = self.chat_labels(record.model, record.provider)
        key = (ctx.operation, label, provider)
        series = self._calls.get(key)
        if series is None:
            calls = self.embedding_requests if key[0] == EMBEDDINGS else self.chat_requests
            series = self._calls[key] = _CallSeries(calls, label, provider)
        cell = series.outcomes.get(status)
        if cell is None:
            cell = series.outcome(status)
        cell[0] += 1.0
        # The key's limit that refused the call, or cut its answer.
        limit = o.limit
        if limit is not None and status != f"{limit}_exceeded":
            limit = None
        if o.served_model is None:
            if limit is not None:
                self.limit_rejections.inc((limit,))
            return
        if limit is not None:
            self.streams_cut.inc((limit,))
        served = series.served
        if served is None:
            served = self._serve(series)
        in_flight, prompt, completion = served
        in_flight[0] -= 1.0
        prompt[0] += record.prompt_tokens
        completion[0] += record.completion_tokens
        if record.reasoning_tokens:
            reasoning = series.reasoning
            if reasoning is None:
                reasoning = series.reasoning = self.tokens.cell((label, provider, "reasoning"))
            reasoning[0] += record.reasoning_tokens
        if record.cached_tokens:
            cached = series.cached
            if cached is None:
                cached = series.cached = self.tokens.cell((label, provider, "cached"))
            cached[0] += record.cached_tokens
        if record.ttft_ms is not None:
            entry = series.ttft
            if entry is None:
                entry = series.ttft = self.ttft.entry((provider,))
            seconds = record.ttft_ms / 1000
            entry[0][bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            entry[1][0] += seconds
        tps = o.stats.tokens_per_second if o.stats is not None else None
        if tps is not None:  # unrounded, unlike the record's
            entry = series.tps
            if entry is None:
                entry = series.tps = self.tps.entry((provider,))
            entry[0][bisect.bisect_left(RATE_BUCKETS, tps)] += 1
            entry[1][0] += tps

    def _serve(self, series: _CallSeries) -> tuple[list[float], list[float], list[float]]:
        """Take the cells every served call of `series` updates (the first one makes their
        series)."""
        label, provider = series.labels
        tokens = self.tokens
        served = series.served = (
            self.in_flight.cell((provider,)),
            tokens.cell((label, provider, "prompt")),
            tokens.cell((label, provider, "completion")),
        )
        return served

    def watch_policy(self, policy: Resilience) -> None:
        """Label models by the policy's router, and read its state at scrape time."""
        self.router = policy.router
        self.registry.collectors.append(lambda: self._policy_metrics(policy))

    def attempt(self, event: AttemptStarted) -> CloseHook:
        """Count every upstream attempt, when it closes."""
        return self._attempt_closed

    def _attempt_closed(self, call: Call) -> None:
        provider = call.route.provider.name
        s = call.stats
        if s.error_kind is not None and not call.succeeded and s.first_token_ms is None:
            outcome = s.error_kind
            seconds = self.clock() - s.started
        else:
            outcome = "ok" if call.succeeded else (s.error_kind or "cancelled")
            seconds = (s.first_token_ms or 0.0) / 1000
        key = (provider, outcome if outcome in OUTCOMES else OTHER)
        series = self._attempts.get(key)
        if series is None:
            series = self._attempts[key] = (
                self.attempts.cell(key),
                self.upstream_latency.entry((provider,)),
            )
        cell, (counts, total) = series
        cell[0] += 1.0
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        total[0] += seconds

    def _policy_metrics(self, policy: Resilience) -> list[_Metric]:
        retries = Counter("svir_retries_total", "Upstream attempts retried.")
        retries.inc((), policy.retries)
        fallbacks = Counter("svir_fallbacks_total", "Calls sent on to a fallback model.")
        fallbacks.inc((), policy.fallbacks)
        state = Gauge(
            "svir_breaker_state",
            "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open.",
            ("deployment",),
        )
        failures = Gauge(
            "svir_breaker_failures",
            "Failures in a row per deployment.",
            ("deployment",),
        )
        codes = {"closed": 0, "half-open": 1, "open": 2}
        deployments: dict[str, dict[str, Any]] = policy.snapshot()["deployments"]
        for model, d in deployments.items():
            state.set((model,), codes.get(d["state"], 0))
            failures.set((model,), d["failures"])
        return [retries, fallbacks, state, failures]

    def render(self) -> bytes:
        return self.registry.render()
