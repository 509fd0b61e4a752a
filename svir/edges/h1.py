"""A minimal HTTP/1.1 client on asyncio protocols, with httptools' response parser.

What svir's upstream calls need and no more: one request at a time per connection, keep-alive
pooling per (scheme, host, port), bodies in pieces with a Content-Length, responses framed by
Content-Length, chunked or connection close (httptools decodes the framing), gzip/deflate bodies
decoded, TLS through `ssl`. It is cheaper per request than a general client: no request and
response object graphs, no per-request timeout objects, one `write` per request.

Timeouts are the caller's (`asyncio.timeout` around `request`, an idle clock around `read`),
except the connect timeout, applied here. A connection goes back to the pool when its response
was read whole and allows keep-alive, or when the caller `finish`es a response whose content it
has (the end of the framing, which may come in a later read, is awaited in the background). A
response `close`d before its end takes its connection down with it: the server sees the request
cancelled.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import zlib
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

import httptools

from svir.errors import H1Error
from svir.transport import Headers, merge_header

HIGH_WATER: Final = 256 * 1024  # buffered body bytes before the socket stops being read
MAX_IDLE_PER_HOST: Final = 256
DRAIN_GRACE: Final = 2.0  # s a finished response's end is awaited before its connection is dropped


Key = tuple[str, str, int]  # scheme, host, port


class _Connection(asyncio.Protocol):
    """One keep-alive connection; the parser's callbacks fill the current response."""

    def __init__(self, key: Key, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        # Kept: CPython 3.11's get_running_loop() makes a getpid() system call each time.
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.error: Exception | None = None
        # The response being read.
        self._names: list[tuple[str, str]] = []
        self._merged: dict[str, str] = {}  # the same by lower-case name (svir.transport.Headers)
        self._header_name = b""
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        # While a finished response's end is awaited: the pool it goes back to, and the timer
        # that drops it if the end does not come.
        self._drain_to: H1Pool | None = None
        self._drain_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(H1Error("upstream answered with a protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(H1Error(f"malformed HTTP response: {exc}"))
        if self._drain_to is not None:
            if self.complete:
                self._drained()
            return
        # The parser's callbacks only record what arrived: the reader is woken once per read,
        # not once per piece of a chunked body (an SSE stream has a piece per event).
        self._wake()

    def eof_received(self) -> bool | None:
        if self.headers_done and not self.complete and self.until_close:
            # A body framed by the connection's end is whole now; any other is cut short
            # (connection_lost says so).
            self.complete = True
            self.keep_alive = False
            self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_draining()
        if not self.complete:
            reason = f": {exc}" if exc else ""
            self._fail(H1Error(f"upstream closed the connection{reason}"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        self._names.append((key, text))
        merge_header(self._merged, key.lower(), text)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        merged = self._merged
        chunked = "chunked" in merged.get("transfer-encoding", "").lower()
        self.until_close = "content-length" not in merged and not chunked
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._drain_to is not None:
            return  # the caller has what it wanted: the rest is only read to reach the end
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True

    # Reading

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():  # (cancelled: its reader is gone)
                waiter.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """What the reader awaits until the next callback that may change what it waits for.
        A future, not a coroutine: a stream's reader waits once a chunk, and each coroutine
        level between the task and the future is resumed and suspended again every time."""
        waiter = self.waiter = self.loop.create_future()
        return waiter

    def start(self) -> None:
        """Reset for the next response on this connection."""
        self._names = []
        self._merged = {}
        self.status = 0
        self.headers_done = self.complete = False
        self.chunks.clear()
        self.buffered = 0
        self.error = None
        self.parser = httptools.HttpResponseParser(self)

    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    @property
    def reusable(self) -> bool:
        return not self.lost and self.error is None and self.transport is not None

    def drain(self, pool: H1Pool) -> None:
        """Read the current response to its end in the background, then go back to `pool`;
        closed if the end does not come within DRAIN_GRACE s."""
        self._drain_to = pool
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self._drain_timer = self.loop.call_later(DRAIN_GRACE, self._drain_expired)

    def _drained(self) -> None:
        pool = self._drain_to
        self._stop_draining()
        if pool is not None and self.keep_alive and self.reusable:
            pool.put(self)
        elif self.transport is not None:
            self.transport.close()

    def _drain_expired(self) -> None:
        self._drain_timer = None
        self._stop_draining()
        if self.transport is not None:
            self.transport.close()

    def _stop_draining(self) -> None:
        # Both references point back here (the timer through its callback): let them go.
        self._drain_to = None
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None


class H1Response:
    """An open response: status and headers read, the body read with `read`."""

    __slots__ = ("_conn", "_decoder", "_pool", "_released", "headers", "status")

    def __init__(self, conn: _Connection, pool: H1Pool) -> None:
        self._conn = conn
        self._pool = pool
        self._released = False
        self.status = conn.status
        self.headers = Headers(conn._names, conn._merged)
        encoding = (self.headers.get("content-encoding") or "").strip().lower()
        self._decoder: zlib._Decompress | None = None
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()

    async def read(self) -> bytes:
        """The next body bytes as they arrive; b"" at the end. Raises H1Error on a broken read."""
        while (data := self.read_nowait()) is None:
            await self._conn.wait()
        return data

    def read_nowait(self) -> bytes | None:
        """`read` without waiting: the next body bytes if some have arrived, b"" at the end, None
        while they are still to come (await `wait()`, then ask again). For a reader that waits
        for a stream's every chunk: one coroutine level fewer to resume each time."""
        conn = self._conn
        while conn.chunks:
            data = conn.take()
            if self._decoder is None:
                return data
            data = self._decoder.decompress(data)
            if data:
                return data
        if conn.error is not None:
            raise conn.error
        if conn.complete:
            self._release()
            return self._decoder.flush() if self._decoder is not None else b""
        return None

    def wait(self) -> asyncio.Future[None]:
        """Done when the connection has more to tell `read_nowait`."""
        return self._conn.wait()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.keep_alive and conn.reusable:
            self._pool.put(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        """Done with the response: a connection whose response has fully arrived (read or not)
        goes back to the pool; one still receiving is dropped, so the server sees the request
        cancelled."""
        if self._released:
            return
        conn = self._conn
        if conn.complete and conn.error is None:
            conn.chunks.clear()
            self._release()
            return
        self._released = True
        if conn.transport is not None:
            conn.transport.close()

    def finish(self) -> None:
        """Done with a response whose content the caller has whole (an SSE stream past its
        `[DONE]`): unlike `close`, a connection still receiving the response's last bytes (a
        chunked body's terminating chunk, which may come in a later read) is kept, read to
        the response's end in the background and pooled."""
        if self._released:
            return
        conn = self._conn
        if conn.complete or not conn.reusable or not conn.keep_alive:
            self.close()
            return
        self._released = True
        conn.drain(self._pool)


class H1Pool:
    """Keep-alive connections per (scheme, host, port); no limit on open connections."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Key, list[_Connection]] = {}
        self._ssl = ssl_context
        self._heads: dict[tuple[str, str], tuple[Key, bytes, str]] = {}

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def put(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < MAX_IDLE_PER_HOST:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def _target(self, method: str, url: str) -> tuple[Key, bytes, str]:
        """(pool key, request line and Host header, host) for `url`; cached."""
        cached = self._heads.get((method, url))
        if cached is not None:
            return cached
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise H1Error(f"unsupported URL scheme {parts.scheme!r}", connect=True)
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        default = (scheme == "http" and port == 80) or (scheme == "https" and port == 443)
        host_header = host if ":" not in host else f"[{host}]"
        if not default:
            host_header += f":{port}"
        head = f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")
        found = ((scheme, host, port), head, host)
        if len(self._heads) < 1024:
            self._heads[(method, url)] = found
        return found

    async def _connect(self, key: Key, host: str, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        scheme, _, port = key
        context = self._ssl_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key, loop),
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                )
        except TimeoutError:
            raise H1Error(f"connect timed out after {timeout:g} s", connect=True) from None
        except OSError as exc:
            raise H1Error(str(exc) or type(exc).__name__, connect=True) from None
        return conn

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | Sequence[bytes | memoryview] = b"",
        connect_timeout: float = 10.0,
    ) -> H1Response:
        """Send a request and wait for its response's status and headers."""
        key, head, host = self._target(method, url)
        if isinstance(body, bytes | bytearray | memoryview):
            pieces, length = [body], len(body)
        else:
            pieces = list(body)
            length = sum(map(len, pieces))
        lines = [head]
        for name, value in headers.items():
            if name.lower() not in ("host", "content-length", "connection", "transfer-encoding"):
                lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        if length or method not in ("GET", "HEAD"):
            lines.append(b"Content-Length: %d\r\n" % length)
        lines.append(b"\r\n")
        message = b"".join(lines)
        small = length <= 65536
        if small:
            message += b"".join(pieces)
        idle = self._idle.get(key)
        while True:
            reused = bool(idle)
            if idle:
                conn = idle.pop()
                if not conn.reusable:
                    continue
            else:
                conn = await self._connect(key, host, connect_timeout)
            conn.start()
            transport = conn.transport
            assert transport is not None
            if small:
                transport.write(message)
            else:
                transport.writelines([message, *pieces])
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait()
            except H1Error:
                # A pooled connection the server had already closed: try once more, anew.
                if reused and not conn.headers_done and not conn.chunks:
                    idle = None
                    continue
                raise
            except BaseException:
                transport.close()
                raise
            return H1Response(conn, self)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
