"""Capture (`[capture]`, off by default; docs/capture.md): the four byte streams of each chat
request, for the console's request page and its "download as a conformance case".

When capture is on, every client route that makes calls (POST, outside /admin/) is wrapped: the
client's request (headers and body) and the bytes svir sends back are teed at the ASGI
`receive` and `send`; the policy's transport is wrapped to tee the request svir sends upstream
(URL, headers, body) and the upstream's raw stream, and an attempt watcher notes the upstream kind
and decoder options (what replays the stream). The last attempt's upstream panes are kept. When
the request ends, every pane is redacted (svir.console.panes: the secrets svir hides from its logs,
the client's own credentials, credential headers by name), bounded, and written to the shared store
in the background (svir.store.captures), which prunes by age and count. When capture is off none
of this is installed: no wrapper, no watcher.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from svir.asgi import CALL_CONTEXT, Message, Receive, Scope, Send
from svir.call import EMBEDDINGS, CallContext
from svir.chat import Call, CloseHook, Route, tool_names
from svir.config.model import CaptureConfig, Timeouts
from svir.console.panes import Pane, client_credentials, redact, redact_headers, secret_forms
from svir.log import hidden_values
from svir.protocols.router import Handler, Routes
from svir.store.captures import CaptureRecord, CaptureStore
from svir.transport import JSON_BODY_LIMIT, Network, StreamResponse, Transport
from svir.wire.completions import is_completion
from svir.wire.errors import UpstreamError

__all__ = ["Capture", "Capturer", "CapturingTransport", "current_capture"]

log = logging.getLogger("svir.console")

_current: contextvars.ContextVar[Capture | None] = contextvars.ContextVar(
    "svir_capture", default=None
)
# Captures being written at once; past it a capture is dropped (and counted), not queued.
MAX_WRITES: Final = 32


def current_capture() -> Capture | None:
    """The capture of the request this task serves, if it is captured."""
    return _current.get()


def _noop(call: Call) -> None:
    return None


class Capture:
    """One request's capture while it runs."""

    __slots__ = (
        "api",
        "client_body",
        "client_headers",
        "client_status",
        "client_stream",
        "created_at",
        "limit",
        "margin",
        "model",
        "options",
        "provider",
        "request_id",
        "secrets",
        "server",
        "upstream_body",
        "upstream_headers",
        "upstream_status",
        "upstream_stream",
        "upstream_url",
    )

    def __init__(
        self, request_id: str, headers: list[tuple[str, str]], limit: int, created_at: float
    ) -> None:
        self.request_id = request_id
        self.created_at = created_at
        self.limit = limit
        # The secrets known now: what svir hides from its logs, and the client's credentials.
        self.secrets = secret_forms([*hidden_values(), *client_credentials(headers)])
        self.margin = max((len(s) for s in self.secrets), default=0)
        self.client_headers = headers
        self.client_body = Pane(limit, self.margin)
        self.client_status: int | None = None
        self.client_stream = Pane(limit, self.margin)
        self.upstream_url: str | None = None
        self.upstream_headers: list[tuple[str, str]] = []
        self.upstream_body = Pane(limit, self.margin)
        self.upstream_status: int | None = None
        self.upstream_stream = Pane(limit, self.margin)
        self.api: str | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.server: str | None = None
        self.options: dict[str, Any] = {}

    def record(self) -> CaptureRecord:
        """What is stored: every pane redacted and bounded."""
        s = self.secrets
        truncated = False

        def pane(p: Pane) -> bytes:
            nonlocal truncated
            data, cut = p.value(s)
            truncated = truncated or cut
            return data

        url = self.upstream_url
        return CaptureRecord(
            request_id=self.request_id,
            created_at=self.created_at,
            api=self.api,
            provider=self.provider,
            model=self.model,
            server=self.server,
            options=self.options,
            client_headers=redact_headers(self.client_headers, s),
            client_body=pane(self.client_body),
            upstream_url=redact(url.encode(), s).decode("utf-8", "replace") if url else None,
            upstream_headers=redact_headers(self.upstream_headers, s),
            upstream_body=pane(self.upstream_body),
            upstream_status=self.upstream_status,
            upstream_stream=pane(self.upstream_stream),
            client_status=self.client_status,
            client_stream=pane(self.client_stream),
            truncated=truncated,
        )


class _TeeResponse:
    """An upstream response whose body bytes are also kept in a pane."""

    __slots__ = ("_pane", "_resp", "headers", "status")

    def __init__(self, resp: StreamResponse, pane: Pane) -> None:
        self._resp = resp
        self._pane = pane
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def read(self) -> bytes:
        data = await self._resp.read()
        self._pane.add(data)
        return data

    def close(self) -> None:
        self._resp.close()

    def finish(self) -> None:
        self._resp.finish()


class CapturingTransport:
    """The policy's transport, teeing the streamed requests of a captured request (the others go
    through untouched)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
        network: Network | None = None,
    ) -> StreamResponse:
        cap = _current.get()
        if cap is None:
            return await self.inner.open_stream(
                url, headers=headers, body=body, timeouts=timeouts, network=network
            )
        # Each attempt starts the upstream panes again: the last one is kept.
        cap.upstream_url = url
        cap.upstream_headers = list(headers.items())
        cap.upstream_body = sent = Pane(cap.limit, cap.margin)
        for piece in [body] if isinstance(body, bytes) else body:
            sent.add(piece)
        cap.upstream_stream = Pane(cap.limit, cap.margin)
        cap.upstream_status = None
        try:
            resp = await self.inner.open_stream(
                url, headers=headers, body=body, timeouts=timeouts, network=network
            )
        except UpstreamError as exc:
            cap.upstream_status = exc.status
            raise
        cap.upstream_status = resp.status
        return _TeeResponse(resp, cap.upstream_stream)

    async def get_json_bytes(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        body: bytes | None = None,
        limit: int = JSON_BODY_LIMIT,
        network: Network | None = None,
    ) -> bytes:
        return await self.inner.get_json_bytes(
            url, headers=headers, timeout=timeout, body=body, limit=limit, network=network
        )

    async def close(self) -> None:
        await self.inner.close()


class Capturer:
    """Captures requests (see the module doc) into `store()` (the keys service's store once it is
    open; None before)."""

    def __init__(
        self,
        config: CaptureConfig,
        store: Callable[[], CaptureStore | None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.dropped = 0
        self.written = 0
        self._writes: set[asyncio.Task[None]] = set()

    def install(self, routes: Routes, policy: Any) -> None:
        """Wrap the client routes, the policy's transport, and watch its attempts."""
        for method, template, route in routes.each():
            if method == "POST" and not template.startswith("/admin/"):
                route.handler = self.wrap(route.handler)
        policy.client = CapturingTransport(policy.client)
        policy.on_attempt.append(self.attempt)

    def wrap(self, handler: Handler) -> Handler:
        limit = self.config.max_body_bytes

        async def captured(
            scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
        ) -> int:
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            cap = Capture(rid, headers, limit, self.clock())

            async def tee_receive() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    cap.client_body.add(message.get("body", b""))
                return message

            async def tee_send(message: Message) -> None:
                kind = message["type"]
                if kind == "http.response.body":
                    cap.client_stream.add(message.get("body", b""))
                elif kind == "http.response.start":
                    cap.client_status = message.get("status", 200)
                await send(message)

            token = _current.set(cap)
            try:
                return await handler(scope, tee_receive, tee_send, rid, fields)
            finally:
                _current.reset(token)
                ctx: CallContext | None = scope.get(CALL_CONTEXT)
                if ctx is not None and ctx.operation != EMBEDDINGS:
                    cap.api = ctx.api
                    if cap.provider is None:
                        cap.provider = ctx.outcome.provider
                    self._keep(cap)

        return captured

    def attempt(self, route: Route, request: dict[str, Any], ctx: CallContext) -> CloseHook:
        """The policy's attempt watcher: what reads the attempt's stream."""
        cap = _current.get()
        if cap is not None:
            cap.provider = route.provider.name
            cap.model = request.get("model")
            if ctx.operation == EMBEDDINGS or is_completion(request):
                cap.server = None  # not a chat stream: no conformance case
            else:
                cap.server = route.kind.name
                cap.options = {
                    "think_tags": route.think_tags,
                    "tool_names": tool_names(request) or None,
                }
        return _noop

    def _keep(self, cap: Capture) -> None:
        store = self.store()
        if store is None or len(self._writes) >= MAX_WRITES:
            self.dropped += 1
            return
        try:
            record = cap.record()
        except Exception:
            log.exception("could not make a capture")
            return
        task = asyncio.get_running_loop().create_task(self._write(store, record))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, store: CaptureStore, record: CaptureRecord) -> None:
        try:
            await store.put(record)
            self.written += 1
        except Exception:
            self.dropped += 1
            log.warning("could not store a capture", exc_info=True)

    async def drain(self) -> None:
        """Wait for the captures being written (at shut-down)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
