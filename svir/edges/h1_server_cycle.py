"""One request on a connection of svir's HTTP/1.1 server (svir.edges.h1_server) and its
response: the ASGI `receive` and `send` of the app's call for it, and the response head, rendered
and checked (a field name that is not a token, or a value with a control in it, fails the app
before its response, which is then a 500: the head is never split)."""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from itertools import chain
from typing import Any, Final, Protocol

from svir.asgi import (
    SERVER_EXTENSION,
    DisconnectWatch,
    Message,
    Receive,
    Scope,
    Send,
)

__all__ = ["Connection", "Cycle", "status_line"]

log = logging.getLogger("svir.server")

STATUS_LINE: Final = {
    code: b"HTTP/1.1 %d %s\r\n" % (code, phrase.encode())
    for code, phrase in ((s.value, s.phrase) for s in http.HTTPStatus)
}
# What RFC 9110 allows in a field name (a token), and the bytes it forbids in a value (the
# controls but HTAB).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_VALUE_CONTROLS: Final = bytes([*range(0x09), *range(0x0A, 0x20), 0x7F])
_CHUNKED_END: Final = b"0\r\n\r\n"
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT: Final = {"type": "http.disconnect"}
# Field names found valid: a response's names repeat, and a set lookup costs a tenth of the
# regex search (values vary, request ids among them: each is checked, by a translate).
_VALID_NAMES: set[bytes] = set()


def status_line(status: int) -> bytes:
    """The status line of a response with `status`."""
    line = STATUS_LINE.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def _check_name(name: bytes) -> None:
    """Refuse a response field name that is not a token (it would break the head)."""
    if not name or _BAD_NAME.search(name):
        raise RuntimeError(f"Invalid HTTP header name {name!r}.")
    if len(_VALID_NAMES) < 4096:
        _VALID_NAMES.add(name)


def _check_values(fields: Iterable[Iterable[tuple[bytes, bytes]]], values: list[bytes]) -> None:
    """Refuse a response whose field values hold a control (CR or LF among them would split the
    response), naming the first such field. One translate over the values joined by a space
    (which is allowed): a call per field cost ~500 instructions each, ten a response."""
    joined = b" ".join(values)
    if len(joined.translate(None, _VALUE_CONTROLS)) == len(joined):
        return
    for name, value in chain.from_iterable(fields):
        if len(value.translate(None, _VALUE_CONTROLS)) != len(value):
            raise RuntimeError(f"Invalid HTTP header value for {name!r}.")
    # Headers given as an iterator are spent by now: refused all the same, without the name.
    raise RuntimeError("Invalid HTTP header value.")


# uvicorn's default fields (`date`, `server`), a new list once a second (its tick): the list last
# seen and its lines, made once for every response in that second. None: the loop over each
# response's fields must see them (a field that frames or closes the response, or one it refuses).
_DEFAULTS: list[Any] = [None, None]
_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def _render_defaults(fields: list[tuple[bytes, bytes]]) -> bytes | None:
    rendered: bytes | None = None
    if all(
        name
        and not _BAD_NAME.search(name)
        and name.lower() not in _FRAMING
        and len(value.translate(None, _VALUE_CONTROLS)) == len(value)
        for name, value in fields
    ):
        rendered = b"".join([name.lower() + b": " + value + b"\r\n" for name, value in fields])
    _DEFAULTS[:] = [fields, rendered]
    return rendered


class Connection(Protocol):
    """What a request's cycle needs of its connection (svir.edges.h1_server.H1ServerProtocol)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    server_state: Any  # uvicorn's ServerState: its `default_headers`
    watch: DisconnectWatch
    sent: asyncio.Future[None]
    write_paused: bool

    def write(self, data: bytes) -> None: ...
    def write_piece(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def response_complete(self, cycle: Cycle) -> None: ...


class Cycle:
    """One request on a connection and its response: the ASGI `receive` and `send` of the app's
    call for it."""

    __slots__ = (
        "_body_read",
        "_conn",
        "_waiter",
        "app",
        "body",
        "chunked",
        "continue_owed",
        "disconnected",
        "head",
        "keep_alive",
        "length_left",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "watch",
    )

    def __init__(
        self, conn: Connection, scope: Scope, *, keep_alive: bool, continue_owed: bool
    ) -> None:
        self._conn = conn
        self.scope: Scope | None = scope
        self.head = scope["method"] == "HEAD"
        self.keep_alive = keep_alive
        self.continue_owed = continue_owed
        self.disconnected = False
        self.body = b""
        self.more_body = True
        self._body_read = False  # the app has had the whole request body
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.length_left = -1  # bytes a Content-Length still owes; -1: none was given
        self._waiter: asyncio.Future[None] | None = None
        # What answers it (the app, or a refusal), kept while it waits its turn (pipelined).
        self.app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        # What the app reads of this request's connection (svir.asgi.ServerExtension), in the
        # scope: the scope is given up once the app has it (`run`), so that the two do not hold
        # each other (a cycle that only the collector would free).
        self.watch = conn.watch
        extensions = scope.get("extensions")
        if extensions is None:
            extensions = scope["extensions"] = {}
        extensions[SERVER_EXTENSION] = self

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        conn = self._conn
        scope, self.scope = self.scope, None
        assert scope is not None, "a request is run once"
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, Exception):
                log.error("exception in the ASGI application", exc_info=exc)
            if not self.response_started and not self.disconnected:
                await self._send_500()
            else:
                conn.close()
            if not isinstance(exc, Exception):
                raise  # cancelled (the server stops): the task ends as cancelled
        else:
            if not self.response_started and not self.disconnected:
                log.error("the ASGI application returned without starting a response")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("the ASGI application returned without completing its response")
                conn.close()

    async def _send_500(self) -> None:
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"21"),
            (b"connection", b"close"),
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> Message:
        conn = self._conn
        if self.continue_owed:
            self.continue_owed = False
            if not self.response_started and not conn.transport.is_closing():
                conn.write(_CONTINUE)
        # The body, piece by piece; after it, only the client's leaving is left to tell (or the
        # response's end, after which the request is over).
        while not (self.disconnected or self.response_complete):
            if not self._body_read and (self.body or not self.more_body):
                body, self.body = self.body, b""
                self._body_read = not self.more_body
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            conn.resume_reading()
            self._waiter = conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return dict(_DISCONNECT)

    def send(self, message: Message) -> Awaitable[None]:
        """The ASGI `send`: the message written at once, and a future already done to await
        (the connection's `sent`); a coroutine only while the client is not reading
        (`write_paused`), which waits for it first. Not a coroutine function: a stream sends
        each chunk, and a coroutine made and run for each cost ~400 instructions more."""
        conn = self._conn
        if conn.write_paused and not self.disconnected:
            return self._send_drained(message)
        self._send(message)
        return conn.sent

    def send_piece(self, body: bytes) -> Awaitable[None]:
        """`send` of a body piece with more to come (svir.asgi.ServerExtension): a chunk of a
        chunked response under way goes out with no message to build and take apart; anything
        else (the response not started or over, HEAD, a length given, an empty piece, the client
        gone or not reading) goes through `send`, which knows what to do with it."""
        conn = self._conn
        if (
            self.chunked
            and body
            and self.response_started
            and not (self.head or self.response_complete or self.disconnected or conn.write_paused)
        ):
            conn.write_piece(b"%x\r\n%s\r\n" % (len(body), body))
            return conn.sent
        return self.send({"type": "http.response.body", "body": body, "more_body": True})

    async def _send_drained(self, message: Message) -> None:
        await self._conn.drain()
        self._send(message)

    def _send(self, message: Message) -> None:
        if self.disconnected:
            return
        if not self.response_started:
            self._start_response(message)
            return
        conn = self._conn
        kind = message["type"]
        if self.response_complete:
            raise RuntimeError(f"unexpected {kind!r} after the response completed")
        if kind != "http.response.body":
            raise RuntimeError(f"expected 'http.response.body', got {kind!r}")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.head:
            self.length_left = -1
        elif self.chunked:
            if not body:
                if not more:
                    conn.write(_CHUNKED_END)
            elif more:
                conn.write_piece(b"%x\r\n%s\r\n" % (len(body), body))
            else:
                conn.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        else:
            if self.length_left >= 0:
                if len(body) > self.length_left:
                    raise RuntimeError("response content longer than its Content-Length")
                self.length_left -= len(body)
            if body:
                if more:
                    conn.write_piece(body)
                else:
                    conn.write(body)
        if not more:
            if self.length_left > 0:
                raise RuntimeError("response content shorter than its Content-Length")
            self.response_complete = True
            self.wake()
            conn.response_complete(self)

    def _start_response(self, message: Message) -> None:
        """Write the response head `message` (an `http.response.start`) asks for."""
        kind = message["type"]
        if kind != "http.response.start":
            raise RuntimeError(f"expected 'http.response.start', got {kind!r}")
        conn = self._conn
        status = message["status"]
        out = [status_line(status)]
        closes = False
        # Started once the head is built: a field refused below fails the app before its
        # response, which is then a 500.
        self.chunked = False
        self.length_left = -1
        defaults = conn.server_state.default_headers
        rendered = _DEFAULTS[1] if _DEFAULTS[0] is defaults else _render_defaults(defaults)
        if rendered is not None:
            out.append(rendered)
            head_fields: tuple[Iterable[tuple[bytes, bytes]], ...] = (message.get("headers", ()),)
        else:
            head_fields = (defaults, message.get("headers", ()))
        values: list[bytes] = []
        for fields in head_fields:
            for given, value in fields:
                if given not in _VALID_NAMES:
                    _check_name(given)
                values.append(value)
                name = given.lower()
                if name == b"content-length":
                    if self.length_left < 0 and not self.chunked:
                        self.length_left = int(value)
                elif name == b"transfer-encoding":
                    if value.lower() == b"chunked":
                        self.length_left = -1
                        self.chunked = True
                elif name == b"connection" and b"close" in [
                    token.strip() for token in value.lower().split(b",")
                ]:
                    self.keep_alive = False
                    closes = True
                out += (name, b": ", value, b"\r\n")
        _check_values(head_fields, values)
        if not self.keep_alive and not closes:
            out.append(b"connection: close\r\n")
        if self.length_left < 0 and not self.chunked and not self.head and status not in (204, 304):
            self.chunked = True
            out.append(b"transfer-encoding: chunked\r\n")
        out.append(b"\r\n")
        self.response_started = True
        self.continue_owed = False
        conn.write(b"".join(out))
