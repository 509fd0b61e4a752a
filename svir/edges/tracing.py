"""OpenTelemetry traces: a span per HTTP request (kind SERVER) and one per upstream attempt (kind
CLIENT, a child of it), named and described with the GenAI semantic conventions.

Off by default (`[telemetry] otel`). When off, nothing here is imported or installed: no guard,
no hook, no cost. When on, svir has a tracer provider of its own (not the global one), sampled
by `sample_ratio` and parent-based (a caller's `traceparent` is honoured), exporting in batches
from a background thread over OTLP/HTTP (the `opentelemetry-exporter-otlp-proto-http` package) or
to the console.

Request span: `http.request.method`, `http.route`, `url.path`, `http.response.status_code`,
`svir.request_id` (the `x-request-id` of the answer), `svir.key_id`, `gen_ai.request.model`,
`error.type`. Attempt span `chat {model}` (`text_completion {model}` for a completion):
`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
`gen_ai.request.max_tokens`, `gen_ai.request.temperature`, `gen_ai.request.top_p`,
`gen_ai.request.stream`, `server.address`, `server.port`, then `gen_ai.response.id`,
`gen_ai.response.model`, `gen_ai.response.finish_reasons`,
`gen_ai.response.time_to_first_chunk`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
`gen_ai.usage.reasoning.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
`svir.tokens_per_second`, `svir.upstream_request_id`, `error.type`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from svir import __version__
from svir.asgi import Scope, exchange, header
from svir.config.model import TelemetryConfig
from svir.edges.metrics import ERROR_CLASSES, METHODS, OUTCOMES, closed
from svir.observers import AttemptStarted, Observer
from svir.wire.completions import is_completion

if TYPE_CHECKING:
    from svir.chat import Call, CloseHook

__all__ = ["Tracing"]

# gen_ai.provider.name for the kinds the conventions name; other kinds go by their own name.
_PROVIDER_NAMES: Final = {
    "openai": "openai",
    "azure": "azure.ai.openai",
    "gemini": "gcp.gemini",
}


class Tracing(Observer):
    """The request spans (a guard: `request_guard`) and the attempt spans (an observer of the
    attempts, svir.observers)."""

    def __init__(
        self,
        config: TelemetryConfig,
        environ: Mapping[str, str] | None = None,
        *,
        exporter: Any = None,
        batch: bool = True,
    ) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        env = os.environ if environ is None else environ
        if exporter is None:
            exporter = _exporter(config, env)
        self._trace = trace
        self._context = otel_context
        self.provider = TracerProvider(
            resource=Resource.create(
                {"service.name": config.service_name, "service.version": __version__}
            ),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("svir", __version__)
        self.propagator = TraceContextTextMapPropagator()

    async def close(self) -> None:
        # Flushes the batch: the exporter's HTTP calls block, so off the event loop.
        await asyncio.to_thread(self.provider.shutdown)

    def request_guard(self) -> Callable[[Scope, dict[str, Any]], Any]:
        trace = self._trace
        context = self._context
        server = trace.SpanKind.SERVER

        async def guard(scope: Scope, fields: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
            carrier: dict[str, str] = {}
            for name in (b"traceparent", b"tracestate"):
                value = header(scope, name)
                if value is not None:
                    carrier[name.decode()] = value.decode("latin-1")
            parent = self.propagator.extract(carrier) if carrier else None
            # The span's name and route are svir's own (a path no route matched is the client's
            # and stays in url.path); an unknown method is "_OTHER", as the conventions say.
            noted = exchange(scope)
            route = noted.route
            method = scope["method"] if scope["method"] in METHODS else "_OTHER"
            attributes = {"http.request.method": method, "url.path": scope["path"]}
            if route:
                attributes["http.route"] = route
            span = self.tracer.start_span(
                f"{method} {route}" if route else method,
                context=parent,
                kind=server,
                attributes=attributes,
            )
            token = context.attach(trace.set_span_in_context(span, parent))

            def after(done: dict[str, Any]) -> None:
                try:
                    status = int(done.get("status") or 500)
                    # Set in one go: the SDK takes its locks and checks the span once, not once
                    # an attribute.
                    ended: dict[str, Any] = {"http.response.status_code": status}
                    rid = _request_id(done)
                    if rid:
                        ended["svir.request_id"] = rid
                    key_id = done.get("key_id")
                    if isinstance(key_id, str):
                        ended["svir.key_id"] = key_id
                    error = done.get("error")
                    call = noted.call
                    if call is None:
                        # A request about a model that made no call (Ollama's /api/show).
                        model = done.get("model")
                        if isinstance(model, str):
                            ended["gen_ai.request.model"] = model
                    else:
                        o = call.outcome
                        s = o.stats
                        for dst, value in (
                            ("gen_ai.request.model", o.model),
                            ("svir.provider", o.provider),
                            ("svir.served_model", o.served_model),
                            ("svir.upstream_request_id", s.upstream_request_id if s else None),
                        ):
                            if value is not None:
                                ended[dst] = value
                        if not error and s is not None:
                            error = s.error_kind
                    if status >= 500 or error:
                        ended["error.type"] = closed(error, ERROR_CLASSES) if error else str(status)
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                    span.set_attributes(ended)
                    span.end()
                finally:
                    context.detach(token)

            return after

        return guard

    def attempt(self, event: AttemptStarted) -> CloseHook:
        """An attempt's span, a child of its request's; ended when the attempt closes."""
        trace = self._trace
        route, request, ctx = event.route, event.request, event.ctx
        address, port = _server_address(route.base_url)
        # OpenTelemetry's names: "chat", "embeddings", "text_completion".
        operation = "text_completion" if is_completion(request) else ctx.operation
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": _PROVIDER_NAMES.get(route.kind.name, route.kind.name),
            "gen_ai.request.model": route.model_id,
            "gen_ai.request.stream": bool(request.get("stream")),
            "svir.provider": route.provider.name,
            "svir.request_id": ctx.request_id,
        }
        if address:
            attributes["server.address"] = address
        attributes["server.port"] = port
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
            attributes["gen_ai.request.max_tokens"] = max_tokens
        for src, dst in (
            ("temperature", "gen_ai.request.temperature"),
            ("top_p", "gen_ai.request.top_p"),
        ):
            value = request.get(src)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[dst] = float(value)
        span = self.tracer.start_span(
            f"{operation} {route.model_id}", kind=trace.SpanKind.CLIENT, attributes=attributes
        )
        return lambda done: _end_attempt(trace, span, done)


def _end_attempt(trace: Any, span: Any, call: Call) -> None:
    s = call.stats
    ended: dict[str, Any] = {}  # set in one go, as the request span's
    if s.upstream_id:
        ended["gen_ai.response.id"] = s.upstream_id
    model = call.response_model
    if model:
        ended["gen_ai.response.model"] = model
    if s.finish_reason:
        ended["gen_ai.response.finish_reasons"] = [s.finish_reason]
    if s.first_token_ms is not None:
        ended["gen_ai.response.time_to_first_chunk"] = s.first_token_ms / 1000
    if s.tokens_per_second is not None:
        ended["svir.tokens_per_second"] = s.tokens_per_second
    if s.upstream_request_id:
        ended["svir.upstream_request_id"] = s.upstream_request_id
    u = s.usage
    if u is not None:
        ended["gen_ai.usage.input_tokens"] = u.prompt_tokens
        ended["gen_ai.usage.output_tokens"] = u.completion_tokens
        if u.reasoning_tokens is not None:
            ended["gen_ai.usage.reasoning.output_tokens"] = u.reasoning_tokens
        if u.cached_tokens is not None:
            ended["gen_ai.usage.cache_read.input_tokens"] = u.cached_tokens
    if not call.succeeded:
        ended["error.type"] = closed(s.error_kind or "cancelled", OUTCOMES)
        if s.error_kind:
            span.set_status(trace.Status(trace.StatusCode.ERROR))
    if ended:
        span.set_attributes(ended)
    span.end()


@functools.lru_cache(maxsize=256)
def _server_address(base_url: str) -> tuple[str | None, int]:
    """The host and port of an upstream's base URL (`server.address`, `server.port`), parsed
    once per URL rather than once per attempt."""
    url = urlsplit(base_url)
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def _request_id(fields: dict[str, Any]) -> str | None:
    from svir.log import request_id_var

    return request_id_var.get()


def _exporter(config: TelemetryConfig, env: Mapping[str, str]) -> Any:
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise RuntimeError(
            "[telemetry] exporter 'otlp' needs the opentelemetry-exporter-otlp-proto-http package"
            " (pip install 'svir[otel]')"
        ) from None
    endpoint = config.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
