"""uvicorn's HTTP/1.1 protocol (httptools) with its socket writes coalesced per loop turn, and
the limits on what one client connection may hold.

uvicorn writes a response's head as soon as the app sends `http.response.start`, then each body
piece: two system calls for a non-streamed answer, and more for a stream. Here the writes one
connection makes during one turn of the event loop go out together, in one write, when the turn
ends, when the response is complete, at once past `FLUSH_AT` bytes, or before the connection
closes: a whole short response costs one system call, and nothing waits past its last send.

The limits (`[server]` in the config; README, "Connections"), in this one place for every route:
- a request head must be whole `head_timeout` seconds after its first byte, else 408 and close;
- a connection with no request under way closes after `keep_alive_timeout`, also before its first
  request (uvicorn arms that timer only after a response);
- a head over `max_head_bytes` or `max_header_fields` is answered 431 and the connection closed
  (an unfinished one as soon as it is too large, not when it ends);
- past `max_connections` open connections in this process, a new one is closed as it is accepted,
  before a byte is read: the cheapest refusal, one the client sees at once as a connection error
  (which HTTP clients retry), where a 503 would mean reading a head first and holding the very
  file descriptor the cap is there to save.
A request whose head arrives in one read, the usual case, arms no timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from svir.asgi import DISCONNECT_WATCH, SERVER_STOPPING, DisconnectWatch, Receive, Scope, Send
from svir.chat import unique_id
from svir.config import ServerConfig
from svir.frontends.http import JSON_HEADERS, headers_with, send_json
from svir.wire.classify import ClientError, error_body

log = logging.getLogger("svir.server")
_encode = msgspec.json.encode

# Past this many bytes waiting, write at once: a large body is not held back for the turn's end.
FLUSH_AT = 64 * 1024
# A refused connection is logged at most this often (seconds), with how many were refused.
CAP_WARNING_EVERY = 60.0


class CoalescingTransport:
    """A transport that gathers the writes of one loop turn into one; the rest is delegated."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Iterable[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Write what is waiting (dropped if the connection is already going away)."""
        self._scheduled = False
        if not self._pending:
            return
        pending = self._pending
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CoalescingTransport`, under the limits of
    `limits` (see the module doc); `svir serve` passes the config's `[server]`."""

    # svir's own attributes in slots: in uvicorn's instance dict they grew it past its size, and
    # an idle connection held 1.5 KB more for it (bench.suite --idle-connections).
    __slots__ = (
        "_disconnect",
        "_fed",
        "_head_bytes",
        "_head_pending",
        "_head_timer",
        "_in_message",
        "_limits",
    )

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ServerConfig | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits or ServerConfig()
        self._head_timer: asyncio.TimerHandle | None = None
        # Bytes are owed a head: from a request's first byte until its head is whole.
        self._head_pending = False
        # What the reads before this one brought of the pending head, and this read's size.
        self._head_bytes = 0
        self._fed = 0
        # Between a message's first byte and its body's end: what arrives belongs to it. An
        # answer may be whole before its request is (a 413 for a body over the limit), and the
        # rest of that body is not a new head.
        self._in_message = False
        # Tells the request being served that its client went away (svir.asgi), which spares
        # every request a task waiting on `receive` for it.
        self._disconnect = DisconnectWatch()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._limits.max_connections:
            self.transport = transport  # uvicorn's connection_lost closes it again
            transport.abort()
            _refused_connection(self._limits.max_connections, self.loop)
            return
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        # Idle before its first request is idle too: uvicorn's keep-alive timer closes it.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def shutdown(self) -> None:
        # The server stops: the app ends what would otherwise last until the graceful timeout.
        stopping = self.app_state.get(SERVER_STOPPING)
        if stopping is not None:
            stopping()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        self._disconnect.fire()

    def data_received(self, data: bytes) -> None:
        if self.timeout_keep_alive_task is not None and not self._in_message:
            # The connection was idle: these bytes begin a request, even if they are only the
            # blank lines the parser skips without beginning one.
            self._head_pending = True
        self._fed = len(data)
        super().data_received(data)
        if self._head_pending:
            self._head_unfinished()

    def on_message_begin(self) -> None:
        # Also a head that begins while a response is going out (the client pipelined).
        self._head_pending = True
        self._in_message = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def on_headers_complete(self) -> None:
        self._head_pending = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        limits = self._limits
        # What was read of this head is at most the earlier reads and this one: the head is only
        # measured when that is over the limit.
        read, self._head_bytes = self._head_bytes + self._fed, 0
        if len(self.headers) > limits.max_header_fields or (
            read > limits.max_head_bytes and self._head_size() > limits.max_head_bytes
        ):
            # uvicorn starts the request with `self.app`: this one answers 431 in the request's
            # turn (after any response still going out on the connection), and it closes.
            app, self.app = self.app, _refusal_app(431, _too_large(limits))
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            return
        super().on_headers_complete()
        # The request's `receive` is its cycle's: the cycle carries the connection's watch.
        setattr(self.cycle, DISCONNECT_WATCH, self._disconnect)

    def on_response_complete(self) -> None:
        # The response is whole: it goes out now, not after the app's bookkeeping that follows
        # in the same turn (the log line, the ledger, the metrics).
        transport = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()
        super().on_response_complete()

    def _head_size(self) -> int:
        """The head as it came, about: the target, and each field with its `: ` and line end."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _head_unfinished(self) -> None:
        """After a read that left a head unfinished: bound what it holds, and from its first read
        on, how long it may take."""
        if self.transport.is_closing():
            return
        # Whole reads are counted: one that also ended the request before counts a little over.
        self._head_bytes += self._fed
        if self._head_bytes > self._limits.max_head_bytes:
            self._refuse(431, _too_large(self._limits))
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self._limits.head_timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        seconds = self._limits.head_timeout
        self._refuse(408, f"The request head did not arrive whole within {seconds:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` to a head that is still unfinished, and close."""
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A response is still going out (the client pipelined): it is the last; nothing more
            # is read, and an answer now would land inside it.
            transport.pause_reading()
            cycle.keep_alive = False
            return
        extra, obj = _refusal(status, message)
        body = _encode(obj)
        out = [STATUS_LINE[status]]
        for name, value in (
            *self.server_state.default_headers,
            *headers_with(JSON_HEADERS, extra),
            (b"content-length", b"%d" % len(body)),
        ):
            out += (name, b": ", value, b"\r\n")
        out += (b"\r\n", body)
        transport.write(b"".join(out))
        transport.close()


_CODES = {408: "request_timeout", 431: "request_header_fields_too_large"}


def _too_large(limits: ServerConfig) -> str:
    return (
        f"Request header fields too large: at most {limits.max_head_bytes} bytes and "
        f"{limits.max_header_fields} fields"
    )


def _refusal(status: int, message: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers (but the content type) and the body of the answer to a refused request."""
    rid = unique_id()
    log.info(message, extra={"request_id": rid, "fields": {"status": status}})
    ce = ClientError(status, "invalid_request_error", _CODES[status], message)
    return {"x-request-id": rid, "connection": "close"}, error_body(ce)


def _refusal_app(status: int, message: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app that answers with `_refusal`."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers, body = _refusal(status, message)
        await send_json(send, status, body, headers)

    return refuse


class _Refused:
    """Connections refused at the cap since the last warning, and when that was."""

    count = 0
    warned_at = -CAP_WARNING_EVERY


def _refused_connection(cap: int, loop: asyncio.AbstractEventLoop) -> None:
    _Refused.count += 1
    now = loop.time()
    if now - _Refused.warned_at >= CAP_WARNING_EVERY:
        log.warning(
            "refused %d new connection(s) since the last such warning: %d are open, the limit"
            " (server.max_connections)",
            _Refused.count,
            cap,
        )
        _Refused.count = 0
        _Refused.warned_at = now
