"""A minimal HTTP/1.1 client on asyncio protocols, with httptools' response parser.

What svir's upstream calls need and no more: one request at a time per connection, keep-alive
pooling per (scheme, host, port) and per proxy and TLS setup, bodies in pieces with a
Content-Length, responses framed by Content-Length, chunked or connection close (httptools
decodes the framing), gzip/deflate bodies decoded, TLS through `ssl`; through an HTTP proxy
(svir.wire.proxy decides which): https in a CONNECT tunnel with TLS to the upstream inside it,
http as absolute-form requests to the proxy. It is cheaper per request than a general client:
no request and response object graphs, no per-request timeout objects, one `write` per request.

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
import os
import ssl
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeVar
from urllib.parse import urlsplit

import httptools

from svir.errors import H1Error, ProxyError, TLSSetupError
from svir.transport import Headers, Network, merge_header
from svir.wire.proxy import (
    ConnectRefused,
    ProxyURL,
    UnusableProxy,
    connect_request,
    parse_connect_head,
)

HIGH_WATER: Final = 256 * 1024  # buffered body bytes before the socket stops being read
MAX_IDLE_PER_HOST: Final = 256
DRAIN_GRACE: Final = 2.0  # s a finished response's end is awaited before its connection is dropped


# scheme, host, port; and for a connection through a proxy or with a provider's own TLS
# context, that proxy (None: none) and that context.
Key = tuple[str, str, int] | tuple[str, str, int, ProxyURL | None, ssl.SSLContext | None]
_P = TypeVar("_P", bound=asyncio.BaseProtocol)


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


class _Plan:
    """How a request to one URL over one network is sent, worked out once (`H1Pool._plan`):
    the pool key of its connections, its request line and Host header, where it connects and
    whether through a proxy's tunnel."""

    __slots__ = ("context", "head", "host", "key", "port", "proxy", "tunnel")

    def __init__(
        self,
        key: Key,
        head: bytes,
        *,
        host: str,
        port: int,
        context: ssl.SSLContext | None,
        proxy: ProxyURL | None,
        tunnel: bool,
    ) -> None:
        self.key = key
        self.head = head
        self.host = host
        self.port = port
        self.context = context
        self.proxy = proxy
        self.tunnel = tunnel


class _Tunnel(asyncio.Protocol):
    """A proxy connection until its answer to CONNECT has come: `head` is done with the
    status, or with the ConnectRefused or H1Error that ended it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[int] = loop.create_future()
        self._data = b""

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self._data += data
        try:
            status = parse_connect_head(self._data)
        except ConnectRefused as exc:
            self.head.set_exception(exc)
            return
        if status is not None:
            self.head.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            reason = f": {exc}" if exc else ""
            self.head.set_exception(H1Error(f"the proxy closed the connection{reason}"))


class H1Pool:
    """Keep-alive connections per (scheme, host, port, proxy, TLS context); no limit on open
    connections. A request's `network` (svir.transport.Network) says which proxy and TLS setup
    it takes; None: `default_network` (the environment's proxies, the default TLS trust)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        default_network: Network | None = None,
    ) -> None:
        self._idle: dict[Key, list[_Connection]] = {}
        self._ssl = ssl_context
        self._default_network = default_network or Network()
        self._plans: dict[tuple[str, str, Network | None], _Plan] = {}
        # TLS contexts of the providers with their own CA or client certificate, by their files
        # as they were when read (a file changed on disk makes another context on reload).
        self._contexts: dict[tuple[object, ...], ssl.SSLContext] = {}

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _context_for(self, network: Network) -> ssl.SSLContext:
        """The TLS context of `network`: the default one, or one with its CA bundle (in place of
        the default trust) and client certificate."""
        files = (network.ca_file, network.client_cert, network.client_key)
        if files == (None, None, None):
            return self._ssl_context()
        try:
            key = tuple((f, os.stat(f).st_mtime_ns) if f else None for f in files)
        except OSError as exc:
            raise H1Error(
                f"cannot read the TLS files of provider {network.provider!r}: {exc}", connect=True
            ) from None
        context = self._contexts.get(key)
        if context is None:
            try:
                context = ssl.create_default_context(cafile=network.ca_file)
                if network.client_cert is not None:
                    context.load_cert_chain(network.client_cert, network.client_key)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise H1Error(
                    f"cannot load the TLS files of provider {network.provider!r}: {exc}",
                    connect=True,
                ) from None
            if len(self._contexts) >= 64:
                self._contexts.clear()
            self._contexts[key] = context
        return context

    def put(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < MAX_IDLE_PER_HOST:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def _target(self, method: str, url: str, network: Network | None = None) -> _Plan:
        """How a request to `url` over `network` goes (pool key, request line and Host header,
        where to connect); cached."""
        cached = self._plans.get((method, url, network))
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
        net = network or self._default_network
        proxy = net.proxies.proxy_for(scheme, host, port)
        if isinstance(proxy, UnusableProxy):
            raise ProxyError(
                f"{proxy.reason}, so svir cannot reach {host_header} (svir does not go around a"
                " proxy it was given)",
                proxy=proxy.source,
            )
        context = self._context_for(net) if scheme == "https" else None
        key: Key = (scheme, host, port)
        request_target = target
        extra = ""
        if proxy is not None:
            key = (scheme, host, port, proxy, context)
            if scheme == "http":
                # A plain request goes to the proxy in absolute form, as forward proxies take
                # it; a CONNECT tunnel to any port but 443 is refused by Squid's defaults.
                request_target = f"http://{host_header}{target}"
                if proxy.authorization is not None:
                    extra = f"Proxy-Authorization: {proxy.authorization}\r\n"
        elif context is not None and context is not self._ssl:
            key = (scheme, host, port, None, context)
        head = f"{method} {request_target} HTTP/1.1\r\nHost: {host_header}\r\n{extra}"
        plan = _Plan(
            key,
            head.encode("latin-1"),
            host=host,
            port=port,
            context=context,
            proxy=proxy,
            tunnel=proxy is not None and scheme == "https",
        )
        if len(self._plans) >= 1024:
            self._plans.clear()
        self._plans[(method, url, network)] = plan
        return plan

    async def _connect(self, plan: _Plan, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        key, context, proxy = plan.key, plan.context, plan.proxy
        try:
            async with asyncio.timeout(timeout):
                if proxy is None:
                    _, conn = await loop.create_connection(
                        lambda: _Connection(key, loop),
                        plan.host,
                        plan.port,
                        ssl=context,
                        server_hostname=plan.host if context is not None else None,
                    )
                elif not plan.tunnel:
                    _, conn = await self._to_proxy(lambda: _Connection(key, loop), proxy)
                else:
                    conn = await self._tunnel(plan, proxy, loop)
        except TimeoutError:
            what = f"the proxy {proxy.address} " if proxy is not None else ""
            message = f"connect {'through ' + what if what else ''}timed out after {timeout:g} s"
            if proxy is not None:
                raise ProxyError(message, proxy=proxy.address) from None
            raise H1Error(message, connect=True) from None
        except ssl.SSLCertVerificationError as exc:
            raise TLSSetupError(
                f"the upstream's TLS certificate is not trusted ({exc.verify_message}): give the"
                " provider the CA that signed it as ca_file, or set SSL_CERT_FILE"
            ) from None
        except ssl.SSLError as exc:
            raise TLSSetupError(f"TLS handshake failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise H1Error(str(exc) or type(exc).__name__, connect=True) from None
        return conn

    async def _to_proxy(
        self, factory: Callable[[], _P], proxy: ProxyURL
    ) -> tuple[asyncio.BaseTransport, _P]:
        """A TCP connection to `proxy` (a ProxyError if it cannot be made)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.create_connection(factory, proxy.host, proxy.port)
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ProxyError(
                f"cannot connect to the proxy {proxy.address}: {reason}", proxy=proxy.address
            ) from None

    async def _tunnel(
        self, plan: _Plan, proxy: ProxyURL, loop: asyncio.AbstractEventLoop
    ) -> _Connection:
        """A connection to `plan`'s upstream through a CONNECT tunnel of `proxy`, with TLS
        inside it, checked against the upstream's name (not the proxy's)."""
        transport, tunnel = await self._to_proxy(lambda: _Tunnel(loop), proxy)
        assert isinstance(transport, asyncio.Transport)
        try:
            transport.write(connect_request(plan.host, plan.port, proxy.authorization))
            try:
                await tunnel.head
            except ConnectRefused as exc:
                authority = f"{plan.host}:{plan.port}"
                raise ProxyError(
                    f"the proxy {proxy.address} refused the tunnel to {authority}: {exc}",
                    proxy=proxy.address,
                    status=exc.status or None,
                ) from None
            except H1Error as exc:
                raise ProxyError(
                    f"the proxy {proxy.address} failed: {exc}", proxy=proxy.address
                ) from None
            conn = _Connection(plan.key, loop)
            assert plan.context is not None
            tls = await loop.start_tls(transport, conn, plan.context, server_hostname=plan.host)
            if tls is None:
                raise H1Error("TLS through the proxy's tunnel did not start", connect=True)
        except BaseException:
            transport.close()
            raise
        conn.connection_made(tls)
        return conn

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | Sequence[bytes | memoryview] = b"",
        connect_timeout: float = 10.0,
        network: Network | None = None,
    ) -> H1Response:
        """Send a request and wait for its response's status and headers; `network` is the
        provider's proxy and TLS setup (None: the pool's default)."""
        plan = self._target(method, url, network)
        key, head = plan.key, plan.head
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
                conn = await self._connect(plan, connect_timeout)
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
            except H1Error as exc:
                # A pooled connection the server had already closed: try once more, anew.
                if reused and not conn.headers_done and not conn.chunks:
                    idle = None
                    continue
                if plan.context is not None and conn.lost and not conn.headers_done:
                    # TLS 1.3 checks the client's certificate after the handshake: a server
                    # that refuses it closes the connection, often without saying why.
                    raise H1Error(
                        f"{exc} before answering (a server that requires a client certificate"
                        " closes the connection when it gets none, or one it does not accept:"
                        " see the provider's client_cert and client_key)"
                    ) from None
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
