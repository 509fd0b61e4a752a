"""svir.edges.h1_server, svir's HTTP/1.1 protocol: a response's writes reach the socket as one write
(a fake transport records every write the protocol makes), and what a client sees of HTTP/1.1 is
what it saw of uvicorn's protocol (a real server on loopback, driven with raw sockets: keep-alive,
HTTP/1.0, pipelining, `Expect: 100-continue`, HEAD, chunked bodies both ways, flow control, bad
requests, smuggling refused, failures of the app, proxy headers)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.server import ServerState

from svir.asgi import Receive, Response, Scope, Send, piece_sender, server_extension
from svir.config.load import parse_config
from svir.config.model import ServerConfig
from svir.edges.app import App
from svir.edges.h1_server import FLUSH_AT, H1ServerProtocol
from svir.errors import request_error
from svir.server import server_settings


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def json_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await receive()
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    # Bookkeeping after the response (svir: log line, ledger): the response must not wait on it.
    app_state["after_response_writes"] = len(transport_of[0].writes)


async def stream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]}
    await send(start)
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await asyncio.sleep(0.01)  # the upstream is slow: what was sent must not wait for more
    app_state["mid_stream_writes"] = len(transport_of[0].writes)
    await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
    # A piece sent on its own (nothing waits to go with it) is written at once.
    app_state["lone_piece_writes"] = len(transport_of[0].writes)
    await asyncio.sleep(0.01)
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


app_state: dict[str, Any] = {}
transport_of: list[RecordingTransport] = []

REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _connected(
    app: Any = json_app,
    *,
    state: ServerState | None = None,
    limits: ServerConfig | None = None,
    **options: Any,
) -> tuple[H1ServerProtocol, RecordingTransport, ServerState]:
    """A server protocol for `app` (uvicorn's config `options` added) on a recording transport,
    nothing read yet (a running loop's), and the server state it shares (`state`, else a new
    one)."""
    config = Config(app=app, http=H1ServerProtocol, lifespan="off", log_level="error", **options)
    state = state or ServerState()
    protocol = H1ServerProtocol(config, state, {}, asyncio.get_running_loop(), limits=limits)
    transport = RecordingTransport()
    transport_of[:] = [transport]
    protocol.connection_made(transport)
    return protocol, transport, state


async def serve_one(
    app: Any, request: bytes = REQUEST
) -> tuple[RecordingTransport, H1ServerProtocol]:
    protocol, transport, state = _connected(app)
    protocol.data_received(request)
    # Until the request's task is done, answered whole or cut short (a slow machine gets up to
    # 30 s).
    for _ in range(6000):
        await asyncio.sleep(0.005)
        if not state.tasks:
            break
    app_state["closed_before_end"] = transport.closed
    protocol.connection_lost(None)
    return transport, protocol


async def test_a_whole_response_is_one_write_before_the_app_goes_on() -> None:
    transport, _ = await serve_one(json_app)
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"ok":true}'
    assert app_state["after_response_writes"] == 1  # written when complete, not at turn's end
    assert not app_state["closed_before_end"]  # keep-alive kept


async def test_a_stream_goes_out_piece_by_piece_as_the_app_sends() -> None:
    transport, _ = await serve_one(stream_app)
    assert app_state["mid_stream_writes"] == 1  # head and first piece together, not held back
    assert app_state["lone_piece_writes"] == 2
    assert len(transport.writes) == 3
    assert b"data: 1" in transport.writes[0] and transport.writes[0].startswith(b"HTTP/1.1 200")
    assert transport.writes[1] == b"9\r\ndata: 2\n\n\r\n"
    assert transport.writes[2] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


PIECES = (b"data: 1\n\n", b"", b"data: 2\n\n")
LAST = b"data: [DONE]\n\n"


def pieces_app(own: bool, fields: list[tuple[bytes, bytes]], *, start: bool = True) -> Any:
    """An app that sends PIECES (more to come) and then LAST: through the server's own piece
    sender (`own`), or as ASGI messages through `send`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if own:
            server = server_extension(scope)
            assert server is not None
            piece = piece_sender(Response(send, server.send_piece))
            assert piece == server.send_piece
        else:

            async def piece(body: bytes) -> None:
                await send({"type": "http.response.body", "body": body, "more_body": True})

        if start:
            await send({"type": "http.response.start", "status": 200, "headers": fields})
        for body in PIECES:
            await piece(body)
        await send({"type": "http.response.body", "body": LAST, "more_body": False})

    return app


@pytest.mark.parametrize(
    ("request_bytes", "fields", "start"),
    [
        (REQUEST, [(b"content-type", b"text/event-stream")], True),  # chunked
        (REQUEST, [(b"content-length", b"%d" % len(b"".join((*PIECES, LAST))))], True),
        # No body goes out, even one the app says is chunked.
        (REQUEST.replace(b"GET", b"HEAD"), [(b"transfer-encoding", b"chunked")], True),
        (REQUEST, [], False),  # a piece before the start: the app fails, a 500
    ],
    ids=["chunked", "content-length", "head", "not-started"],
)
async def test_the_servers_piece_sender_writes_what_send_writes(
    request_bytes: bytes, fields: list[tuple[bytes, bytes]], start: bool
) -> None:
    # svir.asgi.ServerExtension.send_piece: a chunk of a chunked response goes out without an
    # ASGI message; whatever the response, the client gets the same bytes as from `send`.
    own, _ = await serve_one(pieces_app(True, fields, start=start), request_bytes)
    plain, _ = await serve_one(pieces_app(False, fields, start=start), request_bytes)
    assert b"".join(own.writes) == b"".join(plain.writes)
    assert b"".join(own.writes).startswith(b"HTTP/1.1 200" if start else b"HTTP/1.1 500")


async def test_a_piece_sender_on_another_server_sends_the_asgi_message() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await piece_sender(send)(b"data: 1\n\n")
    assert sent == [{"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}]


def failing_mid_stream_app() -> App:
    """svir's app with one route that starts a 200 stream, then fails with a GatewayError."""

    async def half(scope: Scope, receive: Receive, send: Send, rid: str, fields: Any) -> int:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise request_error("gone", status=503, type="server_error", code="upstream_unavailable")

    app = App(parse_config(""), {})
    app.routes.add("GET", "/", half)
    return app


def access_status(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r.fields["status"] for r in caplog.records if r.name == "svir.access"]


async def test_a_failure_after_the_response_started_is_not_answered_on_svir_s_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The app notes the status its response started with (svir.asgi.Response) and says nothing
    # more on a started response; the log line has the status the client got.
    caplog.set_level(logging.INFO)
    transport, _ = await serve_one(failing_mid_stream_app())
    out = b"".join(transport.writes)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.count(b"HTTP/1.1") == 1
    assert b"data: 1" in out and b"upstream_unavailable" not in out
    assert app_state["closed_before_end"]  # cut short: the connection cannot be reused
    assert access_status(caplog) == [200]
    assert [r.getMessage() for r in caplog.records if r.name == "svir.app"] == [
        "the request failed after its response started"
    ]


async def test_a_failure_after_the_response_started_is_not_answered_on_another_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A server without svir's extension (a plain function for `send`): the same outcome.
    caplog.set_level(logging.INFO)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    await failing_mid_stream_app()(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"data: 1\n\n"
    assert access_status(caplog) == [200]
    assert [r.getMessage() for r in caplog.records if r.name == "svir.app"] == [
        "the request failed after its response started"
    ]


async def test_the_servers_default_fields_are_in_every_head_as_they_are_at_its_start() -> None:
    """uvicorn swaps in a new list of default fields (`date`, `server`) once a second: each head
    has the list of its moment, and a default field that frames or closes the response still
    does."""
    protocol, transport, state = _connected()

    async def head_of_next(defaults: list[tuple[bytes, bytes]]) -> list[bytes]:
        state.default_headers = defaults
        before = len(transport.writes)
        protocol.data_received(REQUEST)
        for _ in range(6000):  # until answered (a slow machine gets up to 30 s)
            await asyncio.sleep(0.005)
            if not state.tasks and len(transport.writes) > before:
                break
        head = b"".join(transport.writes[before:]).partition(b"\r\n\r\n")[0]
        return head.split(b"\r\n")[1:]

    first = await head_of_next([(b"date", b"Thu, 03 Dec 2026 09:00:00 GMT"), (b"Server", b"x")])
    assert first[:2] == [b"date: Thu, 03 Dec 2026 09:00:00 GMT", b"server: x"]
    second = await head_of_next([(b"date", b"Thu, 03 Dec 2026 09:00:01 GMT")])
    assert second[0] == b"date: Thu, 03 Dec 2026 09:00:01 GMT"
    assert not any(line.startswith(b"server:") for line in second)
    assert not transport.closed
    closing = await head_of_next([(b"Connection", b"close")])
    assert closing[0] == b"connection: close" and closing.count(b"connection: close") == 1
    assert transport.closed
    protocol.connection_lost(None)


async def test_coalesced_writes_edges() -> None:
    protocol, inner, _ = _connected()
    protocol.write(b"a")
    protocol.write(b"b")
    assert inner.writes == []
    await asyncio.sleep(0)
    assert inner.writes == [b"ab"]  # one write at the turn's end
    big = b"x" * FLUSH_AT
    protocol.write(big)  # past the threshold: at once
    assert inner.writes[-1] == big
    protocol.write(b"last")
    protocol.close()  # flushes first
    assert inner.writes[-1] == b"last" and inner.closed
    protocol.write(b"late")
    await asyncio.sleep(0)
    assert inner.writes[-1] == b"last"  # a closing connection gets nothing more
    protocol.connection_lost(None)


async def test_a_piece_that_finds_nothing_waiting_goes_at_once() -> None:
    protocol, inner, _ = _connected()
    protocol.write_piece(b"a")
    assert inner.writes == [b"a"]  # nothing waited: at once
    protocol.write(b"head")
    protocol.write_piece(b"b")
    assert inner.writes == [b"a"]  # a head waits: the piece goes with it
    await asyncio.sleep(0)
    assert inner.writes == [b"a", b"headb"]
    protocol.connection_lost(None)


async def test_an_idle_connection_closes_after_the_keep_alive_timeout_and_a_busy_one_does_not() -> (
    None
):
    """The one idle timer: it closes a connection idle for the whole timeout, waits again for
    what is left of it after a request, and leaves a connection with a request under way."""
    protocol, transport, _ = _connected(timeout_keep_alive=5)
    now = protocol.loop.time()
    assert protocol._idle_timer is not None  # idle from the start
    protocol._idle_timer.cancel()
    protocol._idle_since = None  # a request under way
    protocol._idle_check()
    assert not transport.closed and protocol._idle_timer is None
    protocol._idle_since = now - 1  # idle for a second: four are left
    protocol._idle_check()
    assert not transport.closed and protocol._idle_timer is not None
    assert protocol._idle_timer.when() == pytest.approx(now + 4, abs=1)
    protocol._idle_timer.cancel()
    protocol._idle_since = now - 6
    protocol._idle_check()
    assert transport.closed
    protocol.connection_lost(None)


class Server:
    """Connections to one server (a shared `ServerState`) with `limits`, each on a recording
    transport; `app` answers 200 "ok" to a request once `release` is set."""

    def __init__(self, limits: ServerConfig) -> None:
        self.limits = limits
        self.state = ServerState()
        self.release = asyncio.Event()

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass
        await self.release.wait()
        fields = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        await send({"type": "http.response.body", "body": b"ok"})

    def connect(self) -> tuple[H1ServerProtocol, RecordingTransport]:
        protocol, transport, _ = _connected(
            self.app, state=self.state, limits=self.limits, interface="asgi3"
        )
        return protocol, transport


async def until(condition: Any) -> None:
    """Until `condition()` holds (a slow machine gets up to 30 s)."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    pytest.fail("the condition did not come true within 30 s")


HEAD_START = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: "


async def test_at_the_cap_the_connection_at_rest_longest_makes_room() -> None:
    """At the cap, a new connection closes the one at rest longest: idle, or with a head still
    arriving, counted from the head's first byte (later bytes do not make it younger); a request
    read whole is not at rest until its answer ends."""
    server = Server(ServerConfig(max_connections=3))
    (idle, idle_t), (slow, slow_t), (busy, busy_t) = [server.connect() for _ in range(3)]
    slow.data_received(HEAD_START)  # at rest since now: after `idle` and `busy`
    busy.data_received(REQUEST)  # under way (the app waits for `release`)
    slow.data_received(b"a")  # a slowloris's next byte
    assert not (idle_t.closed or slow_t.closed or busy_t.closed)

    late, late_t = server.connect()
    assert idle_t.closed and not (slow_t.closed or busy_t.closed)
    assert idle not in server.state.connections and late in server.state.connections
    idle.connection_lost(None)
    slow.data_received(b"a")
    later, later_t = server.connect()
    assert slow_t.closed and not (busy_t.closed or late_t.closed)
    slow.connection_lost(None)

    # `busy`'s answer ends: at rest from then on, after `late` and `later`.
    server.release.set()
    await until(lambda: b"".join(busy_t.writes).endswith(b"\r\n\r\nok"))
    assert not busy_t.closed
    last, _ = server.connect()
    assert late_t.closed and not (later_t.closed or busy_t.closed)
    assert server.state.connections == {later, busy, last}
    # A request on `later`, the oldest at rest now, makes it the youngest.
    later.data_received(REQUEST)
    await until(lambda: b"".join(later_t.writes).endswith(b"\r\n\r\nok"))
    server.connect()
    assert busy_t.closed and not later_t.closed
    for protocol in (late, busy, *server.state.connections):
        protocol.connection_lost(None)


async def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused() -> None:
    """Requests under way (answers awaited, a body still arriving) are not cut: the new
    connection is refused; once an answer ends, its connection makes room."""
    server = Server(ServerConfig(max_connections=3))
    (waiting, waiting_t), (sending, sending_t), (piped, piped_t) = [
        server.connect() for _ in range(3)
    ]
    waiting.data_received(REQUEST)
    sending.data_received(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nab")
    piped.data_received(REQUEST + REQUEST[:10])  # a request, and the next one's head begun
    refused, refused_t = server.connect()
    assert refused_t.closed and refused not in server.state.connections
    assert not (waiting_t.closed or sending_t.closed or piped_t.closed)

    server.release.set()
    await until(lambda: b"".join(waiting_t.writes).endswith(b"ok"))
    assert not waiting_t.closed
    sending.data_received(b"cd")
    await until(lambda: b"".join(sending_t.writes).endswith(b"ok"))
    await until(lambda: b"".join(piped_t.writes).endswith(b"ok"))
    # The three are at rest now (`piped` with a head begun), in the order they came to be.
    new, _ = server.connect()
    assert waiting_t.closed and not (sending_t.closed or piped_t.closed)
    for protocol in (waiting, sending, piped, new):
        protocol.connection_lost(None)


async def test_an_answer_draining_to_a_slow_reader_is_not_closed_for_a_new_connection() -> None:
    server = Server(ServerConfig(max_connections=2))
    server.release.set()
    reader, reader_t = server.connect()
    reader.data_received(REQUEST)
    await until(lambda: b"".join(reader_t.writes).endswith(b"ok"))
    reader.pause_writing()  # the answer waits in the transport: the client does not read
    idle, idle_t = server.connect()
    new, new_t = server.connect()
    assert idle_t.closed and not reader_t.closed  # `reader` came to rest first, yet stays
    idle.connection_lost(None)
    reader.resume_writing()  # drained: at rest, after `new`
    newer, _ = server.connect()
    assert new_t.closed and not reader_t.closed
    new.connection_lost(None)
    last, _ = server.connect()
    assert reader_t.closed
    for protocol in (reader, newer, last):
        protocol.connection_lost(None)


async def test_a_body_after_an_early_answer_is_not_cut_for_a_new_connection() -> None:
    """An answer given before its request's body came (as a 413 is): the body still arriving
    belongs to that request, and the connection is at rest only once it is whole."""

    async def early(scope: Scope, receive: Receive, send: Send) -> None:
        fields = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 413, "headers": fields})
        await send({"type": "http.response.body", "body": b"no"})

    state = ServerState()
    limits = ServerConfig(max_connections=2)
    uploading, uploading_t, _ = _connected(early, state=state, limits=limits)
    uploading.data_received(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nab")
    await until(lambda: b"".join(uploading_t.writes).endswith(b"no"))
    idle, idle_t, _ = _connected(early, state=state, limits=limits)  # after the answer
    _, new_t, _ = _connected(early, state=state, limits=limits)
    assert idle_t.closed and not uploading_t.closed
    uploading.data_received(b"cd")  # the body's end: at rest from now, after `new`
    _connected(early, state=state, limits=limits)
    assert new_t.closed and not uploading_t.closed
    _connected(early, state=state, limits=limits)
    assert uploading_t.closed
    for protocol in [*state.connections, uploading, idle]:
        protocol.connection_lost(None)


class Behind(NamedTuple):
    paused: bool  # reading paused when the second request came
    closed_then: bool  # the connection closed when it came
    closed_after: bool  # the connection closed once the first answer ended
    sent: bytes  # every byte written


async def behind_a_response(second: bytes, limits: ServerConfig | None = None) -> Behind:
    """`second` arrives while the answer to a first request still streams, then that answer is
    let end (see `Behind`)."""
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b"end"})

    class Transport(RecordingTransport):
        paused = False

        def pause_reading(self) -> None:
            self.paused = True

    config = Config(app=app, http=H1ServerProtocol, lifespan="off", log_level="error")
    loop = asyncio.get_running_loop()
    protocol = H1ServerProtocol(config, ServerState(), {}, loop, limits=limits)
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.01)
    protocol.data_received(second)
    paused, closed = transport.paused, transport.closed
    release.set()
    for _ in range(6000):  # up to 30 s on a slow machine
        if transport.closed:
            break
        await asyncio.sleep(0.005)
    closed_after = transport.closed
    protocol.connection_lost(None)
    return Behind(paused, closed, closed_after, b"".join(transport.writes))


async def test_a_bad_request_pipelined_behind_a_response_does_not_land_inside_it() -> None:
    """A request the parser refuses while the previous response still streams: no 400 inside
    that response; nothing more is read, and the connection closes after it."""
    seen = await behind_a_response(b"NOT A REQUEST\r\n\r\n")
    assert seen.paused and not seen.closed_then and seen.closed_after
    assert seen.sent.endswith(b"3\r\nend\r\n0\r\n\r\n") and b" 400 " not in seen.sent


FORWARDED_HEADS = [
    b"",
    b"X-Forwarded-For: 203.0.113.7\r\n",
    b"X-Forwarded-For: 203.0.113.7:4711, 10.0.0.2\r\nX-Forwarded-Proto: https\r\n",
    b"X-Forwarded-For: [2001:db8::1]:80\r\nX-Forwarded-For: 127.0.0.1\r\n",
    b"X-Forwarded-For: \r\nX-Forwarded-Proto: ftp\r\n",
    b"X-Forwarded-Proto:  wss \r\n",
]


@pytest.mark.parametrize("allowed", [None, "10.0.0.0/8", "127.0.0.1,10.0.0.0/8", "*", "off"])
async def test_forwarded_headers_are_read_as_uvicorns_proxy_headers_middleware_reads_them(
    allowed: str | None,
) -> None:
    """The client address and scheme the app sees are what uvicorn's `ProxyHeadersMiddleware`
    makes of the same scope, for each trust setting (None: the default; "off": proxy_headers
    off) and each way of forwarding."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    seen_scopes: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen_scopes.append(dict(scope))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    options: dict[str, Any] = {"proxy_headers": allowed != "off"}
    if allowed not in (None, "off"):
        options["forwarded_allow_ips"] = allowed
    config = Config(app=app, http=H1ServerProtocol, lifespan="off", log_level="error", **options)
    state = ServerState()
    protocol = H1ServerProtocol(config, state, {}, asyncio.get_running_loop())
    protocol.connection_made(RecordingTransport())
    for n, extra in enumerate(FORWARDED_HEADS, 1):
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: localhost\r\n" + extra + b"\r\n")
        for _ in range(6000):
            if state.total_requests == n:
                break
            await asyncio.sleep(0.005)
    protocol.connection_lost(None)
    assert len(seen_scopes) == len(FORWARDED_HEADS)

    async def reference(scope: dict[str, Any], receive: Any, send: Any) -> None:
        expected.append((scope["client"], scope["scheme"]))

    middleware = ProxyHeadersMiddleware(reference, config.forwarded_allow_ips)
    for scope in seen_scopes:
        expected: list[Any] = []
        plain = {**scope, "client": ("127.0.0.1", 50000), "scheme": "http"}
        if allowed == "off":
            await reference(plain, None, None)
        else:
            await middleware(plain, None, None)  # type: ignore[arg-type]
        assert (scope["client"], scope["scheme"]) == expected[0], scope["headers"]
    # The client (127.0.0.1) is trusted by the default, "*" and the list that names it.
    forwarded = {scope["client"] for scope in seen_scopes}
    trusted = allowed in (None, "*", "127.0.0.1,10.0.0.0/8")
    assert len(forwarded) > 1 if trusted else forwarded == {("127.0.0.1", 50000)}


@pytest.fixture(autouse=True)
def _clean() -> None:
    app_state.clear()


async def test_a_lost_connection_cancels_the_request_without_a_watcher_task() -> None:
    """svir's protocol tells `UntilDisconnect` itself that the client went away: the request's
    work is cancelled and leaves as ClientGone (answered 499), and no task was made to wait on
    `receive` for it."""
    from svir.errors import ClientGone
    from svir.protocols.http import UntilDisconnect

    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the body
        tasks_before = len(asyncio.all_tasks())

        async def work() -> int:
            # Whatever UntilDisconnect made is running by now.
            app_state["tasks_made"] = len(asyncio.all_tasks()) - tasks_before
            started.set()
            try:
                await asyncio.sleep(3600)  # an upstream that never answers
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 200

        try:
            with UntilDisconnect(scope, receive):
                await work()
        except ClientGone:
            app_state["status"] = 499

    protocol, transport, _ = _connected(app)
    protocol.data_received(REQUEST)
    await asyncio.wait_for(started.wait(), 30)
    protocol.connection_lost(None)  # the client went away
    await asyncio.wait_for(cancelled.wait(), 30)
    for _ in range(2000):
        if "status" in app_state:
            break
        await asyncio.sleep(0.005)
    assert app_state["status"] == 499
    assert app_state["tasks_made"] == 0
    assert transport.writes == []  # nothing was answered to a client that is gone


# --- a real server on loopback, driven with raw sockets ---------------------------------------

# How long anything is waited for: far past what a working server takes.
PATIENCE = 30.0
seen: dict[str, Any] = {}
disconnected = threading.Event()
answer_first_read = threading.Event()


# Response heads an app may not send: each would split the response or break its head.
BAD_HEADERS: dict[str, list[tuple[bytes, bytes]]] = {
    "/bad-header": [(b"x-reflected", b"a\r\nx-injected: 1")],
    # A control in a value after good ones: every value is checked, not only the first.
    "/bad-header-late": [(b"x-a", b"1"), (b"x-b", b"2"), (b"x-reflected", b"a\nx-injected: 1")],
    "/bad-header-nul": [(b"x-a", b"1"), (b"x-reflected", b"a\x00x-injected")],
    "/bad-header-del": [(b"x-reflected", b"x-injected\x7f")],
    "/bad-header-name": [(b"x-a", b"1"), (b"x-injected: 1\r\nx-b", b"2")],
}


async def edge_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What each path of the edge-case tests asks of the server."""
    path = scope["path"]
    if path == "/fail":
        raise RuntimeError("the app fails before its response")
    if path == "/answer-first":
        # The answer begins before the body is read; what the app reads after is recorded.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        message = await receive()
        while message.get("more_body"):
            message = await receive()
        seen["answer_first"] = message["type"]
        answer_first_read.set()
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/wait-disconnect":
        # The whole body is read: the next receive tells only that the client left.
        seen["after_body"] = (await receive())["type"]
        disconnected.set()
        return
    if path in BAD_HEADERS:
        await send({"type": "http.response.start", "status": 200, "headers": BAD_HEADERS[path]})
        return
    if path == "/bad-header-iterator":
        # Headers are any iterable: one read once is refused as a list is.
        headers = iter(BAD_HEADERS["/bad-header-late"])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        return
    if path == "/tab-in-value":
        headers = [(b"x-a", b"1"), (b"x-tabbed", b"a\tb"), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = json.dumps(
        {
            "method": scope["method"],
            "path": path,
            "query": scope["query_string"].decode(),
            "client": scope["client"][0],
            "scheme": scope["scheme"],
            "http_version": scope["http_version"],
            "length": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


# The raw-socket tests run against both HTTP/1.1 protocols uvicorn's Server can take: svir's own,
# and uvicorn's on httptools (which svir's replaced, and must behave as). A behaviour only svir's
# protocol has is marked `svir_only` and asserted only there.
PROTOCOLS: Final = ("svir", "uvicorn")
svir_only = pytest.mark.parametrize("edge_port", ["svir"], indirect=True)


@contextlib.contextmanager
def edge_server(
    protocol: str, app: Any = edge_app, limits: ServerConfig | None = None
) -> Iterator[int]:
    """uvicorn's Server with `app` on `protocol` ("svir": svir's, with `limits`, by default the
    default `[server]`; "uvicorn": uvicorn's own on httptools), on a thread of its own (so that
    the tests may block on sockets), configured as `svir serve` configures it. Yields its port."""
    sock = socket.create_server(("127.0.0.1", 0))
    settings = server_settings("127.0.0.1", sock.getsockname()[1], limits or ServerConfig())
    if protocol == "uvicorn":
        settings["http"] = "httptools"
    settings.update(lifespan="off", log_level="critical")
    server = uvicorn.Server(Config(app=app, **settings))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        deadline = time.monotonic() + PATIENCE
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(PATIENCE)
        sock.close()


@pytest.fixture(scope="module", params=PROTOCOLS)
def edge_port(request: pytest.FixtureRequest) -> Iterator[int]:
    """The port of `edge_server` with `edge_app`, on each protocol."""
    with edge_server(request.param) as port:
        yield port


class Client:
    """A raw connection and what it has read: responses are parsed from one buffer, so that
    pipelined responses that arrive together are each found whole."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
        self.buffer = b""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"closed with {self.buffer!r} unread")
        self.buffer += data

    def _take_line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def response(self, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        """The next whole response: status, headers (names in lower case), body (de-chunked)."""
        status = int(self._take_line().split(b" ")[1])
        headers: dict[str, str] = {}
        while line := self._take_line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if method == "HEAD":
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._take_line(), 16):
                body += self._take(size)
                assert self._take(2) == b"\r\n"
            assert self._take_line() == b""
            return status, headers, body
        return status, headers, self._take(int(headers.get("content-length", "0")))

    def until_closed(self) -> bytes:
        """What is left until the server closes the connection."""
        out, self.buffer = self.buffer, b""
        try:
            while chunk := self.sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = [b"POST %s HTTP/1.1" % path.encode(), b"Host: localhost", *extra]
    head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def test_keep_alive_then_connection_close(edge_port: int) -> None:
    with Client(edge_port) as sock:
        for i in range(3):
            sock.sendall(post(f"/echo?i={i}", b"x" * i))
            status, headers, body = sock.response()
            doc = json.loads(body)
            assert status == 200 and doc["query"] == f"i={i}" and doc["length"] == i
            assert "connection" not in headers and headers["server"] == "uvicorn"
            assert headers["date"]
        sock.sendall(post("/echo", b"", b"Connection: close"))
        status, headers, _ = sock.response()
        assert status == 200 and headers["connection"] == "close"
        assert sock.until_closed() == b""  # closed after the response


def test_http_1_0_closes_after_its_response(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(b"GET /echo HTTP/1.0\r\nHost: localhost\r\n\r\n")
        status, headers, body = sock.response()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["http_version"] == "1.0"
        assert sock.until_closed() == b""


def test_pipelined_requests_are_answered_in_order(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(b"".join(post(f"/echo?n={n}", b"b" * n) for n in range(5)))
        for n in range(5):
            status, _, body = sock.response()
            doc = json.loads(body)
            assert status == 200 and doc["query"] == f"n={n}" and doc["length"] == n


def test_expect_100_continue_is_answered_before_the_body_is_sent(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post("/echo", b"", b"Expect: 100-continue").replace(
            b"Content-Length: 0", b"Content-Length: 4"))  # fmt: skip
        assert sock.response()[0] == 100
        sock.sendall(b"body")
        status, _, answer = sock.response()
        assert status == 200 and json.loads(answer)["length"] == 4


def test_a_chunked_request_body_arrives_whole(edge_port: int) -> None:
    body = bytes(range(256)) * 1000  # past the read high-water mark: reading pauses and resumes
    pieces = [body[i : i + 7000] for i in range(0, len(body), 7000)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    with Client(edge_port) as sock:
        head = b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head + chunked)
        status, _, answer = sock.response()
    doc = json.loads(answer)
    assert status == 200 and doc["length"] == len(body)
    assert doc["sha256"] == hashlib.sha256(body).hexdigest()


def test_head_has_the_headers_and_no_body(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(b"HEAD /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, headers, body = sock.response("HEAD")
        assert status == 200 and int(headers["content-length"]) > 0 and body == b""
        sock.sendall(post("/echo", b"after"))  # the connection goes on: no stray body bytes
        assert json.loads(sock.response()[2])["length"] == 5


def test_a_response_without_a_length_is_chunked(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post("/stream", b""))
        status, headers, body = sock.response()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert body == b"one two three"


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT A REQUEST\r\n\r\n",
        # A body framed two ways (request smuggling): refused, not guessed at.
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        # A body the parser refuses once the app has begun to wait for it (it would wait, and hold
        # the connection, forever): a coding that does not end with chunked, a bad chunk size,
        # a bare LF in a chunk's extension.
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n",
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3;a\nb\r\nabc\r\n",
    ],
)
def test_a_request_the_parser_refuses_gets_400_and_the_connection_closes(
    edge_port: int, raw: bytes
) -> None:
    with Client(edge_port) as sock:
        sock.sendall(raw)
        answer = sock.until_closed()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"connection: close\r\n" in answer and answer.count(b"HTTP/1.1") == 1


@svir_only
@pytest.mark.parametrize("path", ["/fail", *BAD_HEADERS, "/bad-header-iterator"])
def test_an_app_failure_before_its_response_is_a_500_and_the_connection_closes(
    edge_port: int, path: str
) -> None:
    """svir's protocol checks a head before it counts the response as started, so that a head
    it refuses is an app failure before the response, answered 500 (uvicorn's counts it started
    first, and closes the connection without an answer: below)."""
    with Client(edge_port) as sock:
        sock.sendall(post(path, b""))
        answer = sock.until_closed()
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"x-injected" not in answer and answer.endswith(b"\r\n\r\nInternal Server Error")


def test_an_app_failure_before_it_starts_a_response_is_a_500_on_both_protocols(
    edge_port: int,
) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post("/fail", b""))
        answer = sock.until_closed()
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answer.endswith(b"\r\n\r\nInternal Server Error")


@pytest.mark.parametrize("path", [*BAD_HEADERS, "/bad-header-iterator"])
def test_a_head_the_app_may_not_send_is_never_written(edge_port: int, path: str) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post(path, b""))
        answer = sock.until_closed()
    assert b"x-injected" not in answer and b"HTTP/1.1 200" not in answer


def test_a_tab_in_a_header_value_is_sent_as_it_is(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post("/tab-in-value", b""))
        status, headers, _ = sock.response()
    assert status == 200 and headers["x-tabbed"] == "a\tb" and headers["x-a"] == "1"


def test_after_the_body_receive_waits_for_the_client_to_leave(edge_port: int) -> None:
    disconnected.clear()
    with Client(edge_port) as sock:
        sock.sendall(post("/wait-disconnect", b"body"))
        # The app is waiting in receive: it must not have been told anything yet.
        assert not disconnected.wait(0.2)
    assert disconnected.wait(PATIENCE)
    assert seen["after_body"] == "http.disconnect"


def test_a_trusted_proxy_names_the_client(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(post("/echo", b"", b"X-Forwarded-For: 203.0.113.7"))
        assert json.loads(sock.response()[2])["client"] == "203.0.113.7"
        sock.sendall(post("/echo", b"", b"X-Forwarded-Proto: https"))
        assert json.loads(sock.response()[2])["scheme"] == "https"
        sock.sendall(post("/echo", b""))
        answer = json.loads(sock.response()[2])
        assert answer["client"] == "127.0.0.1" and answer["scheme"] == "http"


@svir_only
def test_an_upgrade_is_answered_as_http_and_the_connection_closes(edge_port: int) -> None:
    with Client(edge_port) as sock:
        sock.sendall(
            b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        status, headers, body = sock.response()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["method"] == "GET"
        assert sock.until_closed() == b""


@svir_only
def test_a_body_the_parser_refuses_after_the_answer_began_cuts_it_without_a_400_inside(
    edge_port: int,
) -> None:
    """svir's protocol never writes an error inside a response under way: the app is told the
    client left, and the connection closes (uvicorn's writes its 400 into the response)."""
    answer_first_read.clear()
    with Client(edge_port) as sock:
        head = b"POST /answer-first HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
        sock.sendall(head + b"\r\n3\r\nabc\r\n")
        while b"first\r\n" not in sock.buffer:
            sock._fill()
        sock.sendall(b"zz\r\n")  # not a chunk size
        answer = sock.until_closed()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.count(b"HTTP/1.1") == 1
    assert answer.endswith(b"5\r\nfirst\r\n")  # cut: no last chunk, nothing after it
    assert answer_first_read.wait(PATIENCE)
    assert seen["answer_first"] == "http.disconnect"
