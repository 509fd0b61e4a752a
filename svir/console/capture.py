"""Capture (`[capture]`, off by default; docs/capture.md): the four byte streams of each chat
request, for the console's request page and its "download as a conformance case".

When capture is on, the app serves every client route that makes calls (POST, outside /admin/)
through the capturer (`Capturer.serve`, composed into the app when it is built): the client's
request (headers and body) and the bytes svir sends back are teed at the ASGI
`receive` and `send`, and the request's `Capture` goes on its call's context (through the
request's `svir.asgi.Exchange`): the policy opens each attempt through the capture's `tap` of its
transport, which tees the request svir sends upstream (URL, headers, body) and the upstream's raw
stream, and an attempt watcher notes the upstream kind and decoder options (what replays the
stream). The last attempt's upstream panes are kept. When
the request ends, every pane is redacted (svir.console.panes: the secrets svir hides from its logs,
the client's own credentials, credential headers by name), bounded, and written to the shared store
in the background (svir.store.captures), which prunes by age and count. When capture is off none
of this is installed: no wrapper, no watcher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from svir.asgi import Message, Receive, Scope, Send, exchange
from svir.call import EMBEDDINGS
from svir.chat import tool_names
from svir.config.model import CaptureConfig, Timeouts
from svir.console.panes import Pane, client_credentials, redact, redact_headers, secret_forms
from svir.observers import AttemptStarted, Observer
from svir.policy.auth import ADMIN_PREFIX
from svir.protocols.router import Handler, Route
from svir.store.captures import CaptureRecord, CaptureStore
from svir.transport import JSON_BODY_LIMIT, Network, StreamResponse, Transport
from svir.wire.completions import is_completion
from svir.wire.errors import UpstreamError

__all__ = ["Capture", "Capturer", "CapturingTransport"]

log = logging.getLogger("svir.console")

# Captures being written at once; past it a capture is dropped (and counted), not queued.
MAX_WRITES: Final = 32


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
        self,
        request_id: str,
        headers: list[tuple[str, str]],
        limit: int,
        created_at: float,
        secrets: Iterable[str],
    ) -> None:
        self.request_id = request_id
        self.created_at = created_at
        self.limit = limit
        # The secrets known now: the app's (`App.secrets`), and the client's credentials.
        self.secrets = secret_forms([*secrets, *client_credentials(headers)])
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

    def tap(self, transport: Transport) -> Transport:
        """`transport` teeing this request's upstream traffic (svir.call.Capture)."""
        return CapturingTransport(transport, self)

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
    """The policy's transport as a captured request's call opens its attempts through it
    (`Capture.tap`): its streamed requests teed into `capture` (the others go through
    untouched)."""

    def __init__(self, inner: Transport, capture: Capture) -> None:
        self.inner = inner
        self.capture = capture

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
        network: Network | None = None,
    ) -> StreamResponse:
        cap = self.capture
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


class Capturer(Observer):
    """Captures requests (see the module doc) into `store()` (the keys service's store once it is
    open; None before)."""

    def __init__(
        self,
        config: CaptureConfig,
        store: Callable[[], CaptureStore | None],
        *,
        clock: Callable[[], float] = time.time,
        secrets: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        # The secrets of the app it captures for, as they are now (a reload may change them).
        self.secrets = secrets
        self.dropped = 0
        self.written = 0
        self._writes: set[asyncio.Task[None]] = set()

    def captures(self, route: Route) -> bool:
        """Whether requests to `route` are captured: a client route that makes calls (POST,
        outside /admin/), added to the app's routes (not a 404's or a 405's)."""
        template = route.template
        return (
            route.method == "POST"
            and template is not None
            and not template.startswith(ADMIN_PREFIX)
        )

    async def serve(
        self,
        handler: Handler,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        rid: str,
        fields: dict[str, Any],
    ) -> int:
        """Serve a request of a captured route (the app runs its handler here): its client
        panes teed at `receive` and `send`, its Capture on its call's context."""
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        cap = Capture(rid, headers, self.config.max_body_bytes, self.clock(), self.secrets())

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

        noted = exchange(scope)
        noted.capture = cap
        try:
            return await handler(scope, tee_receive, tee_send, rid, fields)
        finally:
            noted.capture = None
            ctx = noted.call
            if ctx is not None and ctx.operation != EMBEDDINGS:
                cap.api = ctx.api
                if cap.provider is None:
                    cap.provider = ctx.outcome.provider
                self._keep(cap)

    def attempt(self, event: AttemptStarted) -> None:
        """Note what reads the attempt's stream (the last attempt's wins)."""
        route, request = event.route, event.request
        cap = event.ctx.capture
        if isinstance(cap, Capture):
            cap.provider = route.provider.name
            cap.model = request.get("model")
            if event.ctx.operation == EMBEDDINGS or is_completion(request):
                cap.server = None  # not a chat stream: no conformance case
            else:
                cap.server = route.kind.name
                cap.options = {
                    "think_tags": route.think_tags,
                    "tool_names": tool_names(request) or None,
                }

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
