"""svir's HTTP/1.1 server protocol: httptools' parser, the ASGI app run once per request, the
writes of a response coalesced, and the limits on what one client connection may hold.

uvicorn's `Server` still binds the socket, runs the lifespan, the workers and the graceful stop;
this protocol replaces uvicorn's own (`http=` in its config), which with the write coalescing and
limits svir had added around it cost a third more per request (`bench.server_floor`): here no
header regexes (names are checked once, values by a translate), no `asyncio.Event` per request,
one idle timer per connection instead of one armed and cancelled per request, and the coalescing
built in rather than wrapped around the transport.

What a client sees is uvicorn's behaviour: keep-alive and HTTP/1.0, pipelined requests answered in
order, `Expect: 100-continue`, HEAD, chunked request and response bodies, a 400 for a request the
parser refuses (among them a body framed both by Content-Length and Transfer-Encoding: llhttp's
strict mode), a 500 when the app fails before its response starts, the `date` and `server`
headers, and the client address and scheme from `X-Forwarded-For` and `X-Forwarded-Proto` of a
trusted proxy (uvicorn's `ProxyHeadersMiddleware`, which `Config.loaded_app` wraps the app in when
`proxy_headers` is on: its rule, with its trusted hosts (`forwarded_allow_ips`), is applied here
as the scope is built, not as a coroutine around the app that every piece of a stream resumes).
The raw-socket tests run against both protocols (tests/test_h1_server.py, and the fuzzed heads of
tests/test_h1_server_fuzz.py); where they differ, the tests marked `svir_only`: a head the app may
not send is a 500 here (uvicorn's closes without an answer), an error found while a response goes
out never lands inside it (a request pipelined behind it, a body refused after its answer began),
and an upgrade is answered as HTTP/1.1 (uvicorn's speaks WebSocket).

The writes one connection makes during one turn of the event loop go out together, in one write,
when the turn ends, when the response is complete, at once past `FLUSH_AT` bytes, or before the
connection closes: a whole short response costs one system call, and nothing waits past its last
send. A piece of a response under way that finds nothing waiting (a stream's chunk that arrived
on its own) is written at once: the flush scheduled for it cost more than the rest of its write.
So a turn that sends several pieces after such a one writes each (a thread's frames of one read
do: their events are one frame each); every other stream sends one piece a turn.

The limits (`[server]` in the config; README, "Connections"), in this one place for every route:
- a request head must be whole `head_timeout` seconds after its first byte, else 408 and close;
- a connection with no request under way closes after `keep_alive_timeout`, also before its first
  request;
- a head over `max_head_bytes` or `max_header_fields` is answered 431 and the connection closed
  (an unfinished one as soon as it is too large, not when it ends);
- at `max_connections` open connections in this process, a new one is admitted by closing the
  connection that has been at rest longest (`_evict`): at rest is no request under way, that is
  idle (kept alive, or never used), or with a head still arriving. Such a head counts from its
  first byte, which it cannot move: a slowloris dripping a byte a second ages and goes first, while
  a client's head split over reads is the newest at rest (and one that comes in one read, the usual
  case, is never at rest). A request whose head is whole is never cut for a new connection, nor
  is an answer still draining to a slow reader. Only when no connection is at rest is the new one
  refused: closed as it is accepted, before a byte is read, the cheapest refusal, one the client
  sees at once as a connection error (which HTTP clients retry), where a 503 would mean reading a
  head first and holding the very file descriptor the cap is there to save.
A request whose head arrives in one read, the usual case, arms no timer.

Here the connection: reading, parsing, pipelining, writing, timers and limits. A request's cycle
(the ASGI `receive` and `send`, the response head) is in svir.edges.h1_server_cycle; the answers to
a refused head and the tallies of the cap in svir.edges.h1_server_limits.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import urllib.parse
import weakref
from collections.abc import Iterable
from typing import Any, Final

import httptools
import msgspec
from uvicorn.config import Config
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl
from uvicorn.server import ServerState

from svir.asgi import SERVER_STOPPING, DisconnectWatch, Scope
from svir.config.model import ServerConfig
from svir.edges.h1_server_cycle import Cycle, status_line
from svir.edges.h1_server_limits import (
    EVICTED,
    REFUSED,
    refusal,
    refusal_app,
    too_large_message,
)
from svir.protocols.http import JSON_HEADERS, headers_with

__all__ = ["FLUSH_AT", "H1ServerProtocol"]

log = logging.getLogger("svir.server")
_encode = msgspec.json.encode

# Past this many bytes waiting, write at once: a large body is not held back for the turn's end.
FLUSH_AT: Final = 64 * 1024
# A request body buffered past this many bytes stops the reading until the app takes it.
BODY_HIGH_WATER: Final = 64 * 1024
_BAD_REQUEST: Final = b"Invalid HTTP request received."
_BAD_REQUEST_FIELDS: Final = (
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"%d" % len(_BAD_REQUEST)),
    (b"connection", b"close"),
)


class H1ServerProtocol(asyncio.Protocol):
    """One client connection (see the module doc); `svir serve` passes the config's `[server]`
    as `limits`."""

    # In slots: an idle connection holds its protocol as long as it is open (10,000 of them are
    # bench.suite's --idle-connections figure).
    __slots__ = (
        "_continue",
        "_drained",
        "_fed",
        "_flush_scheduled",
        "_head_bytes",
        "_head_pending",
        "_head_timer",
        "_idle_since",
        "_idle_timer",
        "_in_message",
        "_pending",
        "_pending_size",
        "app",
        "app_state",
        "client",
        "connections",
        "cycle",
        "evictable",
        "headers",
        "keep_alive_timeout",
        "limits",
        "loop",
        "parser",
        "pipeline",
        "proxied",
        "read_paused",
        "root_path",
        "scheme",
        "sent",
        "server",
        "server_state",
        "tasks",
        "transport",
        "trusted",
        "url",
        "watch",
        "write_paused",
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
        if not config.loaded:
            config.load()
        app = config.loaded_app
        # uvicorn's proxy headers: its trusted hosts kept, its rule applied as the scope is built.
        self.trusted: Any = None
        if isinstance(app, ProxyHeadersMiddleware):
            self.trusted = app.trusted_hosts
            app = app.app
        self.app = app
        self.loop = _loop or asyncio.get_event_loop()
        self.root_path = config.root_path
        self.keep_alive_timeout = config.timeout_keep_alive
        self.server_state = server_state
        # uvicorn's server shuts these down when it stops (typed there as its own protocols).
        self.connections: set[Any] = server_state.connections
        self.tasks = server_state.tasks
        # The server's connections in the order they came to rest, longest first (`_evict`).
        self.evictable = _evictable_of(server_state)
        self.app_state = app_state
        self.limits = limits or ServerConfig()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        # A pipelined request may follow one that asked to close: answer the first.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        # The client is a trusted proxy: its requests' forwarded headers are read.
        self.proxied = False
        self.watch = DisconnectWatch()
        # What `send` gives to await when it wrote at once: done from the start, and awaited as
        # often as it is given.
        self.sent: asyncio.Future[None] = self.loop.create_future()
        self.sent.set_result(None)
        # The request being answered, and requests read while it was (answered in order).
        self.cycle: Cycle | None = None
        self.pipeline: collections.deque[Cycle] = collections.deque()
        # The head being read.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self._continue = False
        # Writes waiting for the turn's end.
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._flush_scheduled = False
        self.read_paused = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        # Idle since (loop time), or None while a request is under way; one timer checks it, and
        # is not re-armed per request.
        self._idle_since: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        # Bytes are owed a head: from a request's first byte until its head is whole.
        self._head_pending = False
        self._head_timer: asyncio.TimerHandle | None = None
        # What the reads before this one brought of the pending head, and this read's size.
        self._head_bytes = 0
        self._fed = 0
        # Between a message's first byte and its body's end: what arrives belongs to it. An
        # answer may be whole before its request is (a 413 for a body over the limit), and the
        # rest of that body is not a new head.
        self._in_message = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        cap = self.limits.max_connections
        while len(self.connections) >= cap:
            if not self._evict():
                transport.abort()  # type: ignore[attr-defined]
                REFUSED.add(self.loop, cap)
                return
        self.connections.add(self)
        self.server = get_local_addr(self.transport)
        self.client = get_remote_addr(self.transport)
        self.scheme = "https" if is_ssl(self.transport) else "http"
        if self.trusted is not None:
            self.proxied = (self.client[0] if self.client else None) in self.trusted
        # Idle before its first request is idle too.
        self._idle(self.loop.time())
        self.evictable[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self.evictable.pop(self, None)
        for timer in (self._head_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._idle_timer = None
        self._pending.clear()
        cycles = [self.cycle, *self.pipeline] if self.cycle is not None else []
        for cycle in cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.wake()
        self._resume_writing()
        if exc is None and self.transport is not None:
            self.transport.close()
        self.watch.fire()

    def eof_received(self) -> bool | None:
        return None

    def data_received(self, data: bytes) -> None:
        if self._idle_since is not None and not self._in_message:
            # The connection was idle: these bytes begin a request, even if they are only the
            # blank lines the parser skips without beginning one.
            self._head_pending = True
        self._fed = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # svir speaks no protocol but HTTP/1.1: the request is answered as one, and what
            # follows its head on this connection is not read.
            self._in_message = False
            cycle = self._reading
            if cycle is not None:
                cycle.keep_alive = False
                cycle.more_body = False
                cycle.wake()
            self.pause_reading()
        except httptools.HttpParserError as exc:
            log.info("refused a request the HTTP parser did not take: %s", exc)
            self._answer_400()
            return
        if self._head_pending:
            self._head_unfinished()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self._resume_writing()
        # At rest, it may have been passed over by `_evict` while its answer drained.
        if self not in self.evictable and self._at_rest():
            self.evictable[self] = None

    # httptools callbacks

    def on_message_begin(self) -> None:
        # Also a head that begins while a response is going out (the client pipelined).
        self._head_pending = True
        self._in_message = True
        self._idle_since = None
        self.url = b""
        self.headers = []
        self._continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_pending = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        limits = self.limits
        # What was read of this head is at most the earlier reads and this one: the head is only
        # measured when that is over the limit.
        read, self._head_bytes = self._head_bytes + self._fed, 0
        too_large = len(self.headers) > limits.max_header_fields or (
            read > limits.max_head_bytes and self._head_size() > limits.max_head_bytes
        )
        parser = self.parser
        version = parser.get_http_version()
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": root,
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": url.query or b"",
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        if self.proxied:
            _forwarded(scope, self.trusted)
        cycle = Cycle(
            self,
            scope,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
            continue_owed=self._continue,
        )
        if too_large:
            # Answered 431 in the request's turn (after any response still going out on the
            # connection), and the connection closes.
            cycle.keep_alive = False
        cycle.app = refusal_app(431, too_large_message(limits)) if too_large else self.app
        current = self.cycle
        if current is None or current.response_complete:
            self.cycle = cycle
            self._start(cycle)
        else:
            self.pause_reading()
            self.pipeline.append(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self._reading
        if cycle is None or cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > BODY_HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        self._in_message = False
        cycle = self._reading
        if cycle is None or cycle.response_complete:
            # The end of a body answered before it came (a 413): the connection is at rest now.
            self._came_to_rest()
            return
        cycle.more_body = False
        cycle.wake()

    # Requests and responses

    @property
    def _reading(self) -> Cycle | None:
        """The request whose bytes are being read: the last pipelined, else the one answered."""
        return self.pipeline[-1] if self.pipeline else self.cycle

    def _start(self, cycle: Cycle) -> None:
        app, cycle.app = cycle.app, None
        assert app is not None
        task = self.loop.create_task(cycle.run(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def response_complete(self, cycle: Cycle) -> None:
        """`cycle`'s response is whole: it goes out now, not after the app's bookkeeping that
        follows in the same turn (the log line, the ledger, the metrics)."""
        self.server_state.total_requests += 1
        transport = self.transport
        if not cycle.keep_alive:
            self.close()
            return
        self.flush()
        if transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            self.cycle = nxt = self.pipeline.popleft()
            self._start(nxt)
        else:
            self._idle(self.loop.time())
            self._came_to_rest()

    def shutdown(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its response."""
        stopping = self.app_state.get(SERVER_STOPPING)
        if stopping is not None:
            stopping()
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.close()
        else:
            cycle.keep_alive = False

    # Writing

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= FLUSH_AT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_piece(self, data: bytes) -> None:
        """A piece of a response under way, not its end: at once when nothing waits to go out
        (a stream's chunk that arrived on its own, the usual case), else with what waits (the
        head it follows, in the turn that sent both). Saves such a chunk the flush scheduled for
        the turn's end (~5k instructions a chunk, `bench.instructions --drip`)."""
        if self._pending:
            self.write(data)
        elif not self.transport.is_closing():
            self.transport.write(data)

    def flush(self) -> None:
        """Write what is waiting (dropped if the connection is already going away)."""
        self._flush_scheduled = False
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._pending_size = 0
        if not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        if not self.transport.is_closing():
            self.transport.close()

    async def drain(self) -> None:
        """Until the transport takes writes again (or the connection is lost)."""
        if self._drained is None:
            self._drained = self.loop.create_future()
        await asyncio.shield(self._drained)

    def _resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # Timers and limits

    def _came_to_rest(self) -> None:
        """Last in the order of `evictable`, from now."""
        try:
            self.evictable.move_to_end(self)
        except KeyError:  # passed over by `_evict` while busy
            self.evictable[self] = None

    def _at_rest(self) -> bool:
        """No request under way: none answered, none read whole and waiting its turn, no body
        still arriving (a head still arriving does not count), and the connection open."""
        cycle = self.cycle
        return (
            (cycle is None or cycle.response_complete)
            and not self.pipeline
            and (self._head_pending or not self._in_message)
            and not self.transport.is_closing()
        )

    def _evict(self) -> bool:
        """Close the connection at rest longest, to admit this one; False when none is.

        `evictable` holds every open connection in the order it last came to rest (was made,
        ended an answer, began a head, ended a body answered early): one that is busy now is
        taken out of it here and goes back in when it comes to rest, so that a request costs
        one `move_to_end` and no check, and a connection is passed over at most once each time
        it comes to rest."""
        evictable = self.evictable
        while evictable:
            oldest, _ = evictable.popitem(last=False)
            # Busy, or its answer still draining to a slow reader (closed, it would hold its file
            # descriptor until drained all the same): back in the order when it comes to rest,
            # or has drained (`resume_writing`).
            if oldest.write_paused or not oldest._at_rest():
                continue
            oldest.connections.discard(oldest)
            oldest.close()
            EVICTED.add(self.loop, self.limits.max_connections)
            return True
        return False

    def _idle(self, now: float) -> None:
        self._idle_since = now
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(now + self.keep_alive_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None:
            return  # a request is under way: its response's end arms the timer again
        left = since + self.keep_alive_timeout - self.loop.time()
        if left <= 0:
            self.close()
        else:
            self._idle_timer = self.loop.call_later(left, self._idle_check)

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
        if self._head_bytes > self.limits.max_head_bytes:
            self._refuse(431, too_large_message(self.limits))
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_late)
            # At rest since its head began: a head's later bytes do not make it younger.
            self._came_to_rest()

    def _head_late(self) -> None:
        self._head_timer = None
        seconds = self.limits.head_timeout
        self._refuse(408, f"The request head did not arrive whole within {seconds:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` to a head that is still unfinished, and close."""
        if self._answer_would_split():
            return
        extra, obj = refusal(status, message)
        body = _encode(obj)
        fields = (*headers_with(JSON_HEADERS, extra), (b"content-length", b"%d" % len(body)))
        self._answer_and_close(status, fields, body)

    def _answer_400(self) -> None:
        """Answer a request the parser refused (as uvicorn words it), and close."""
        self._drop_broken_body()
        if not self._answer_would_split():
            self._answer_and_close(400, _BAD_REQUEST_FIELDS, _BAD_REQUEST)

    def _drop_broken_body(self) -> None:
        """The parser refused the body of the request being answered (a Transfer-Encoding it
        does not end with chunked, a bad chunk): to its app the client has left, as no more of
        the body will come (it would wait for it, and hold the connection, forever). Its answer
        is the 400 when none has begun; one under way is cut."""
        cycle = self.cycle
        if cycle is None or cycle is not self._reading or not cycle.more_body:
            return  # no request, or its body is whole: what the parser refused comes after it
        if cycle.response_complete:
            return
        cycle.disconnected = True
        cycle.wake()
        if cycle.response_started:
            self.close()

    def _answer_would_split(self) -> bool:
        """Whether an answer now would land inside a response still going out (the client
        pipelined): then that response is the last, and nothing more is read. Also True when
        the connection is already going away."""
        if self.transport.is_closing():
            return True
        cycle = self.cycle
        if cycle is not None and not (cycle.response_complete or cycle.disconnected):
            self.pause_reading()
            cycle.keep_alive = False
            return True
        return False

    def _answer_and_close(
        self, status: int, fields: Iterable[tuple[bytes, bytes]], body: bytes
    ) -> None:
        out = [status_line(status)]
        for name, value in (*self.server_state.default_headers, *fields):
            out += (name, b": ", value, b"\r\n")
        out += (b"\r\n", body)
        self.write(b"".join(out))
        self.close()


def _forwarded(scope: Scope, trusted: Any) -> None:
    """The client address and scheme a trusted proxy forwarded, in `scope` (uvicorn's
    `ProxyHeadersMiddleware`, for HTTP; `trusted` is its `trusted_hosts`)."""
    proto: bytes | None = None
    forwarded_for: list[bytes] = []
    for name, value in scope["headers"]:
        if name == b"x-forwarded-proto":
            proto = value
        elif name == b"x-forwarded-for":
            forwarded_for.append(value)
    if proto is not None:
        scheme = proto.decode("latin1").strip()
        if scheme in {"http", "https", "ws", "wss"}:
            scope["scheme"] = scheme
    if forwarded_for:
        host, port = trusted.get_trusted_client_address(b", ".join(forwarded_for).decode("latin1"))
        if host:  # an empty X-Forwarded-For names no one
            scope["client"] = (host, port)


def _evictable_of(
    state: ServerState,
) -> collections.OrderedDict[H1ServerProtocol, None]:
    """The connections of the server whose state is `state`, longest at rest first (see
    `H1ServerProtocol._evict`): each change, and an eviction, in constant
    time (amortized), with no scan of the connections."""
    order = _EVICTABLE.get(state)
    if order is None:
        order = _EVICTABLE[state] = collections.OrderedDict()
    return order


_EVICTABLE: weakref.WeakKeyDictionary[
    ServerState, collections.OrderedDict[H1ServerProtocol, None]
] = weakref.WeakKeyDictionary()
