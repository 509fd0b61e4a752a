"""One chat call: a validated request over a route, the upstream's stream, canonical output.

This is the core between the edges and the wire: it builds the upstream body, opens the upstream,
and turns its bytes into what the client gets, streamed (canonical or relayed) or aggregated. An
upstream failure before anything visible was produced is raised as a `GatewayError`, so the
client gets an HTTP error and not a 200 stream; after that it is one error frame.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from svir.config import ProviderConfig
from svir.edges.upstream import Timeouts, UpstreamClient, UpstreamResponse
from svir.providers import ProviderKind, build_upstream_body
from svir.wire.classify import ClientError, to_client_error
from svir.wire.decoder import StreamDecoder
from svir.wire.encoder import ChunkEncoder, CompletionAggregator, stream_error_fields
from svir.wire.errors import BodyError, ErrorKind, SSEError, UpstreamError
from svir.wire.events import ContentFilter, Event, Keepalive, Role, StreamError, Usage
from svir.wire.sse import SSEEvent, SSEParser, encode_data

_encode = msgspec.json.encode
# Events that put nothing visible on the wire: until one that does arrives, nothing is sent.
_SILENT = (Role, Keepalive, ContentFilter)


class GatewayError(Exception):
    """A failure answered to the client as an OpenAI-shaped HTTP error."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(error.message)
        self.error = error


def request_error(
    message: str,
    *,
    status: int = 400,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> GatewayError:
    return GatewayError(ClientError(status, type, code, message, param, headers or {}))


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes: a provider, the kind of server it is, and the model id there."""

    provider: ProviderConfig
    kind: ProviderKind
    model_id: str
    base_url: str
    api_key: str | None
    timeouts: Timeouts

    @property
    def think_tags(self) -> bool:
        return self.kind.think_tags_for(self.provider)


@dataclass(slots=True)
class CallStats:
    """What one call measured, for the request's log line (and later the usage ledger)."""

    started: float = field(default_factory=time.perf_counter)
    first_token_ms: float | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    tokens_per_second: float | None = None
    upstream_id: str | None = None
    upstream_request_id: str | None = None


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def tool_names(request: Mapping[str, Any]) -> list[str]:
    names = []
    for tool in request.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


class ChatCall:
    """One request to one route, from opening the upstream to the last byte for the client."""

    def __init__(
        self,
        client: UpstreamClient,
        route: Route,
        request: dict[str, Any],
        *,
        request_id: str,
        model_label: str,
    ) -> None:
        self.client = client
        self.route = route
        self.request = request
        self.request_id = request_id
        self.model_label = model_label
        self.stats = CallStats()
        self.decoder = StreamDecoder(
            think_tags=route.think_tags,
            tool_names=tool_names(request),
            clock=time.perf_counter,
        )
        self._resp: UpstreamResponse | None = None

    def upstream_body(self) -> bytes:
        try:
            body = build_upstream_body(
                self.request,
                kind=self.route.kind,
                provider=self.route.provider,
                model_id=self.route.model_id,
            )
        except BodyError as exc:
            raise request_error(str(exc), param="messages") from None
        return _encode(body)

    def upstream_headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "X-Request-Id": self.request_id,
        }
        headers.update(self.route.provider.extra_headers or {})
        if self.route.api_key:
            headers.update(self.route.kind.auth_headers(self.route.api_key))
        return headers

    async def open(self) -> None:
        """Open the upstream stream; raise GatewayError if it fails before streaming."""
        route = self.route
        body = self.upstream_body()
        url = route.kind.chat_url(route.base_url, route.model_id, route.provider)
        try:
            self._resp = await self.client.open_stream(
                url, headers=self.upstream_headers(), body=body, timeouts=route.timeouts
            )
        except UpstreamError as exc:
            self.stats.error_kind = exc.kind.value
            raise GatewayError(to_client_error(exc)) from None
        headers = self._resp.headers
        self.stats.upstream_request_id = headers.get("x-request-id") or headers.get("request-id")

    async def events(self) -> AsyncIterator[list[Event]]:
        """The upstream's events in batches as bytes arrive; the last batch ends the stream
        (with `Done` or a `StreamError`). For front ends that speak another protocol."""
        assert self._resp is not None
        decoder = self.decoder
        try:
            async for data in self._resp.iter_bytes():
                events = decoder.feed(data)
                if events:
                    yield events
            yield decoder.close()
        except UpstreamError as exc:
            yield decoder.fail(exc)
        finally:
            self._resp.close()
            self._finish_stats()

    def _finish_stats(self) -> None:
        d = self.decoder
        s = self.stats
        s.usage = d.usage
        s.finish_reason = d.finish_reason if d.complete else None
        s.tokens_per_second = d.tokens_per_second
        s.upstream_id = d.id or None
        if d.error is not None:
            s.error_kind = d.error.kind.value
        if d.rate.first is not None:
            s.first_token_ms = round((d.rate.first - s.started) * 1000, 2)

    async def stream(self, *, include_usage: bool) -> AsyncIterator[bytes]:
        """Canonical chunks. Raises GatewayError before its first item if nothing showed yet."""
        encoder = ChunkEncoder(
            id=completion_id(),
            model=self.model_label,
            created=int(time.time()),
            include_usage=include_usage,
        )
        encode = encoder.encode
        pending: list[bytes] = []
        started = False
        async for events in self.events():
            if not started:
                # Whether output came before a failure is decided by the stream, not by how the
                # network batched it: after a visible event, a failure is an error frame.
                for ev in events:
                    if started:
                        pending.append(encode(ev))
                    elif isinstance(ev, StreamError):
                        raise GatewayError(to_client_error(ev.error))
                    elif isinstance(ev, _SILENT):
                        if type(ev) is Role:
                            pending.append(encode(ev))
                    else:
                        started = True
                        pending.append(encode(ev))
                if started:
                    yield b"".join(pending)
                continue
            out = b"".join([encode(ev) for ev in events])
            if out:
                yield out

    async def relay(self, *, include_usage: bool) -> AsyncIterator[bytes]:
        """The upstream's data lines byte for byte; a failure becomes one synthetic error frame."""
        pending: list[bytes] = []
        started = False
        async for frames, events in self._relay_batches(include_usage):
            for ev in events:
                if isinstance(ev, StreamError):
                    if not started:
                        raise GatewayError(to_client_error(ev.error))
                    frames.append(_error_frame(ev.error))
                elif not started and not isinstance(ev, _SILENT):
                    started = True
            pending.extend(frames)
            if started and pending:
                yield b"".join(pending)
                pending = []

    async def _relay_batches(
        self, include_usage: bool
    ) -> AsyncIterator[tuple[list[bytes], list[Event]]]:
        """Batches of (raw frames to forward, events decoded from them)."""
        assert self._resp is not None
        parser = SSEParser()
        decoder = self.decoder
        try:
            async for data in self._resp.iter_bytes():
                try:
                    items = parser.feed(data)
                except SSEError as exc:
                    err = UpstreamError(ErrorKind.PROTOCOL, str(exc), in_stream=True)
                    yield [], decoder.fail(err)
                    return
                frames: list[bytes] = []
                events: list[Event] = []
                for item in items:
                    usage, finish = decoder.usage, decoder.finish_reason
                    got = decoder.feed_item(item)
                    events.extend(got)
                    if type(item) is not SSEEvent or (got and isinstance(got[-1], StreamError)):
                        continue  # comments stay here; an error is replaced by svir's own frame
                    # The client did not ask for usage: drop the chunk that only carries it.
                    usage_only = (
                        decoder.usage is not usage
                        and decoder.finish_reason == finish
                        and all(isinstance(e, _SILENT) for e in got)
                    )
                    if include_usage or not usage_only:
                        frames.append(encode_data(item.data))
                yield frames, events
                if decoder.error is not None or decoder.complete:
                    return
            yield [], decoder.close()
        except UpstreamError as exc:
            yield [], decoder.fail(exc)
        finally:
            self._resp.close()
            self._finish_stats()

    async def complete(self) -> dict[str, Any]:
        """The aggregated `chat.completion`; any upstream failure is a GatewayError."""
        agg = CompletionAggregator()
        async for events in self.events():
            for ev in events:
                if isinstance(ev, StreamError):
                    raise GatewayError(to_client_error(ev.error))
                agg.add(ev)
        return agg.completion(id=completion_id(), model=self.model_label, created=int(time.time()))


def _error_frame(err: UpstreamError) -> bytes:
    message, type_, code = stream_error_fields(err)
    return encode_data(_encode({"error": {"message": message, "type": type_, "code": code}}))
