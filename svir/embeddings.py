"""One embedding call: a checked embedding request (svir.wire.embeddings) over a route, the
upstream's one JSON answer, the vectors.

It has the shape of a `ChatCall` as the policy and the interceptors see it (svir.chat.Call), so
that an embedding request goes through the same routing, retries, fallbacks, breakers, key gate,
ledger, metrics and traces: `open()` sends the request and reads the whole answer, so that every
failure is raised while the client has seen nothing; `close()` settles the stats and runs the
close hooks. There is nothing to stream, so a guard attached to it is never asked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from svir.chat import (
    CallState,
    CallStats,
    CloseHook,
    StreamGuard,
    UpstreamTarget,
    scrubbed,
    upstream_headers,
)
from svir.errors import GatewayError
from svir.transport import Transport
from svir.wire.blobs import Blobs
from svir.wire.classify import ClientError, to_client_error
from svir.wire.embeddings import (
    EmbeddingAnswer,
    EmbeddingInputError,
    ollama_upstream_body,
    openai_upstream_body,
    parse_ollama_answer,
    parse_openai_answer,
)
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import Usage
from svir.wire.tokens import estimate_input_tokens

__all__ = ["EMBEDDINGS_BODY_LIMIT", "EmbeddingCall"]

# The most of an upstream's embeddings answer read: 2048 inputs of 3072 float32s in base64 are
# 34 MB, and as JSON floats about four times that.
EMBEDDINGS_BODY_LIMIT: Final = 256 << 20
_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})
_encode = msgspec.json.encode


class EmbeddingCall:
    """One embedding request to one route (see the module doc). Built with the arguments a
    `ChatCall` takes, so that the policy builds either the same way."""

    def __init__(
        self,
        client: Transport,
        route: UpstreamTarget,
        request: dict[str, Any],
        *,
        request_id: str,
        model_label: str,
        blobs: Blobs | None = None,
        headers: Mapping[str, str] = _NO_HEADERS,
        drop_fields: frozenset[str] = frozenset(),
        on_close: Iterable[CloseHook] = (),
    ) -> None:
        self.client = client
        self.route = route
        self.request = request
        self.request_id = request_id
        self.model_label = model_label
        self.headers = headers
        self.drop_fields = drop_fields
        self.state = CallState.NEW
        self.stats = CallStats()
        self.answer: EmbeddingAnswer | None = None
        self._error: UpstreamError | None = None
        self._on_close: list[Any] = [*on_close]

    # What the policy and the interceptors read (svir.call.Call)

    @property
    def succeeded(self) -> bool:
        return self.answer is not None

    @property
    def error(self) -> UpstreamError | None:
        return self._error

    @property
    def visible_tokens(self) -> int:
        return 0  # an embedding answer has no generated tokens

    @property
    def response_model(self) -> str | None:
        return self.answer.model if self.answer is not None else None

    @property
    def prompt_tokens(self) -> int | None:
        """The tokens the upstream counted in the inputs, if it said."""
        return self.answer.prompt_tokens if self.answer is not None else None

    def input_tokens(self) -> int:
        """The inputs' tokens: the upstream's count, or svir's estimate when it gave none."""
        counted = self.prompt_tokens
        return counted if counted is not None else estimate_input_tokens(self.request["input"])

    def attach(self, *, guard: StreamGuard | None, on_close: CloseHook) -> None:
        """A close hook for whoever gets the call opened (the key gate); the guard is never
        asked (nothing streams)."""
        assert self.state is CallState.PRIMED, f"attach() to a call {self.state.value}"
        self._on_close.append(on_close)

    # The request

    def upstream_body(self) -> bytes:
        route = self.route
        kind = route.kind
        request = self.request
        name = route.provider.name
        if kind.embeddings is None:
            raise _refusal(
                f"The provider {name!r} (kind {kind.name!r}) has no embeddings API; use a model "
                "of a provider that embeds.",
                "unsupported_input",
                "model",
            )
        if route.provider.managed is not None and not route.provider.embeds(route.model_id):
            raise _refusal(
                f"The model {name}/{route.model_id} is not configured for embeddings: set "
                f"embeddings = true under [providers.managed.models.{route.model_id}] (its "
                "server then starts with --embeddings).",
                "unsupported_input",
                "model",
            )
        if "dimensions" in request and not kind.embedding_dimensions:
            raise _refusal(
                f"The provider {name!r} (kind {kind.name!r}) does not honour dimensions: its "
                "server answers full-size vectors; leave dimensions out.",
                "unsupported_parameter",
                "dimensions",
            )
        try:
            if kind.embeddings == "ollama":
                body = ollama_upstream_body(request, route.model_id)
            else:
                body = openai_upstream_body(
                    request, route.model_id, base64_answer=kind.embeddings_base64
                )
        except EmbeddingInputError as exc:
            raise _refusal(exc.message, "unsupported_input", exc.param) from None
        for field in self.drop_fields:
            body.pop(field, None)
        return _encode(body)

    def upstream_headers(self) -> dict[str, str]:
        return upstream_headers(self.route, self.request_id, "application/json")

    def _raise(self, error: UpstreamError) -> None:
        error = scrubbed(self.route, self.route.kind.explain_error(error))
        self._error = error
        self.stats.error_kind = error.kind.value
        self.close()
        raise GatewayError(to_client_error(error), error)

    async def open(self) -> None:
        """Send the request and read the whole answer; a GatewayError if it failed."""
        assert self.state is CallState.NEW, f"open() a call {self.state.value}"
        self.state = CallState.OPENING
        try:
            await self._open()
        except BaseException:
            self.close()  # also when cancelled: a managed model's hold is given back
            raise
        if self.state is CallState.OPENING:
            self.state = CallState.PRIMED

    async def _open(self) -> None:
        route = self.route
        body = self.upstream_body()
        base = route.base_url
        if route.ensure is not None:
            try:
                base = await route.ensure(route.model_id)
            except UpstreamError as exc:
                self._raise(exc)
            if route.release is not None:
                release, model_id = route.release, route.model_id
                self._on_close.append(lambda _call: release(model_id))
        url = route.kind.embeddings_url(base, route.model_id, route.provider)
        try:
            raw = await self.client.get_json_bytes(
                url,
                headers=self.upstream_headers(),
                timeout=route.timeouts.first_byte,
                body=body,
                limit=EMBEDDINGS_BODY_LIMIT,
                network=route.network,
            )
        except UpstreamError as exc:
            self._raise(exc)
        count = len(self.request["input"])
        parse = parse_ollama_answer if route.kind.embeddings == "ollama" else parse_openai_answer
        try:
            self.answer = parse(raw, count)
        except UpstreamError as exc:
            self._raise(exc)
        del raw
        self.stats.first_token_ms = None
        self.stats.finish_reason = "stop"

    def close(self) -> None:
        """Settle the stats and run the close hooks, once."""
        if self.state is CallState.CLOSED:
            return
        self.state = CallState.CLOSED
        answer = self.answer
        if answer is not None and answer.prompt_tokens is not None:
            self.stats.usage = Usage(
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=0,
                total_tokens=answer.prompt_tokens,
            )
        hooks, self._on_close = self._on_close, []
        for hook in hooks:
            hook(self)

    def elapsed_ns(self) -> int:
        """Nanoseconds since the call started (Ollama's `total_duration`)."""
        return round((time.perf_counter() - self.stats.started) * 1_000_000_000)


def _refusal(message: str, code: str, param: str) -> GatewayError:
    """A request this upstream cannot take, refused before it is sent: a 400 for the client, and
    for the policy an UNSUPPORTED_INPUT failure, which goes on to a route's next deployment or
    fallback (another may take it) and counts toward no breaker."""
    err = UpstreamError(ErrorKind.UNSUPPORTED_INPUT, message, param=param)
    return GatewayError(ClientError(400, "invalid_request_error", code, message, param), err)
