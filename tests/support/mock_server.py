"""The handler of tests/support/mock_transport.py served over loopback HTTP, by `MockServer`
(on the running loop) or `MockServerThread` (its own loop in a thread, for sync tests), for a
svir subprocess or any HTTP client; for svir's tests and benchmarks, not in the wheel. Each
request and what became of its answer is recorded (`RequestRecord`), a bytes body is answered
with one write, a chunk list with one write of chunked frames, an async iterator's chunks as
they come (a stall holds until the client closes; an `UpstreamError` it raises cuts the
connection, as a broken upstream does).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import ssl as ssl_module
import threading
import time
from collections.abc import (
    AsyncIterable,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import parse_qsl

import msgspec

from svir.transport import (
    Headers,
)
from svir.wire.errors import UpstreamError
from tests.support.mock_transport import Handler, MockRequest, MockResponse

__all__ = ["MockServer", "MockServerThread", "RequestRecord"]

H = TypeVar("H", bound=Handler)
Outcome = Literal["pending", "completed", "disconnected", "shutdown", "error"]

_MAX_HEAD = 64 * 1024
_LAST_CHUNK = b"0\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in http.HTTPStatus}


@dataclass(eq=False)
class RequestRecord:
    """One request as the server received it, and what became of its answer."""

    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]  # looked up case-insensitively
    raw: bytes
    body: Any  # the parsed JSON body, or None when it is empty or not JSON
    model: str | None = None  # `MockRequest.model`
    status: int | None = None  # None until a status line went out
    # completed: answered in full (a scripted cut included); disconnected: the client closed
    # first; shutdown: the server stopped first; error: the handler raised.
    outcome: Outcome = "pending"
    bytes_sent: int = 0  # body bytes handed to the transport, framing left out
    writes: int = 0  # body chunks written
    sent_all: bool = False
    peer: tuple[str, int] | None = None  # the client's address: one per connection
    error: BaseException | None = None
    ended: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def disconnected(self) -> bool:
        """The client closed the connection before the whole answer was written."""
        return self.outcome == "disconnected"

    @property
    def completed(self) -> bool:
        return self.outcome == "completed"

    def wait_ended(self, timeout: float = 5.0) -> bool:
        """Block until the answer has ended (sync tests)."""
        return self.ended.wait(timeout)


class _RequestHeaders(Mapping[str, str]):
    """A request's header fields, parsed on first use into `Headers`."""

    __slots__ = ("_fields", "_parsed")

    def __init__(self, fields: bytes) -> None:
        self._fields = fields
        self._parsed: Headers | None = None

    @property
    def _headers(self) -> Headers:
        if self._parsed is None:
            lines = self._fields.decode("latin-1").split("\r\n")
            pairs = [line.partition(":") for line in lines if line]
            self._parsed = Headers([(name, value.strip()) for name, _, value in pairs])
        return self._parsed

    def __getitem__(self, name: str) -> str:
        return self._headers[name]

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return self._headers.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)


def _field(lower_head: bytes, key: bytes) -> bytes | None:
    """A field's value, found by its `key` (CRLF, lowercase name, colon) in a lowercased head
    that starts with CRLF."""
    at = lower_head.find(key)
    if at < 0:
        return None
    start = at + len(key)
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else len(lower_head)].strip()


_WHOLE_BODIES = (bytes, tuple, list)
_MEMO_BODY = 64 * 1024  # a larger request is answered anew: its key would cost more than that
_MEMO_ENTRIES = 4096


class _Cut(Exception):
    """The handler's body broke the stream (an `UpstreamError`): the connection is aborted."""


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one after another (keep-alive), each answered
    in full before the next is read from the buffer."""

    def __init__(self, server: _ServerCore[Any]) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] | None = None
        self.buf = bytearray()
        self.head: tuple[str, str, bool, _RequestHeaders] | None = None
        self.need = 0  # body bytes of the request whose head was read
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.peer = transport.get_extra_info("peername")
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server._connections.discard(self)
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._process()

    # Reading

    def _process(self) -> None:
        buf = self.buf
        while self.task is None and self.transport is not None:
            if self.head is None:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        self._refuse(431)
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                if not self._parse_head(head):
                    return
            if len(buf) < self.need:
                return
            if len(buf) == self.need:
                body = bytes(buf)
                buf.clear()
            else:
                body = bytes(memoryview(buf)[: self.need])
                del buf[: self.need]
            assert self.head is not None
            method, target, close, headers = self.head
            self.head = None
            self._answer(method, target, close, headers, body)

    def _parse_head(self, head: bytes) -> bool:
        line, _, fields = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3:
            self._refuse(400)
            return False
        method, target, version = (part.decode("latin-1") for part in parts)
        # The few fields the server reads itself are found in the head as it is; the request's
        # `headers` are parsed only if the handler looks at them (a benchmark's does not).
        lower = b"\r\n" + fields.lower()
        length = _field(lower, b"\r\ncontent-length:") or b"0"
        if not length.isdigit():
            self._refuse(400)
            return False
        if b"\r\ntransfer-encoding:" in lower:
            self._refuse(411)  # no client svir's tests use sends a chunked request body
            return False
        if _field(lower, b"\r\nexpect:") == b"100-continue":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        connection = _field(lower, b"\r\nconnection:")
        close = connection != b"keep-alive" if version == "HTTP/1.0" else connection == b"close"
        self.head = (method, target, close, _RequestHeaders(fields))
        self.need = int(length)
        return True

    def _refuse(self, status: int) -> None:
        assert self.transport is not None
        body = b'{"error":{"message":"bad request"}}'
        head = f"{_STATUS_LINES[status]}Content-Type: application/json\r\n"
        self.transport.write(
            f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        self.transport.close()

    # Answering

    def _answer(
        self, method: str, target: str, close: bool, headers: _RequestHeaders, body: bytes
    ) -> None:
        server = self.server
        memo = server._memo
        key = (method, target, close, body)
        if memo is not None and len(body) <= _MEMO_BODY and self.transport is not None:
            wire = memo.get(key)
            if wire is not None:
                self.transport.write(wire)
                if close:
                    self.transport.close()
                return
        request = MockRequest(method, server._root_url + target, headers, body)
        record = server._record(request, target, self.peer) if server.record else None
        try:
            answer = server.handler(request)
        except Exception as exc:
            answer = _raise(exc)
        if isinstance(answer, MockResponse) and type(answer.body) in _WHOLE_BODIES:
            wire = self._write_whole(answer, record, close)
            if memo is not None and len(body) <= _MEMO_BODY and len(memo) < _MEMO_ENTRIES:
                memo[key] = wire
            server._finish(record, "completed")
            if close and self.transport is not None:
                self.transport.close()
            return
        self.task = asyncio.get_running_loop().create_task(self._serve(answer, record, close))

    async def _serve(
        self,
        answer: MockResponse | Awaitable[MockResponse],
        record: RequestRecord | None,
        close: bool,
    ) -> None:
        started = False
        try:
            response = answer if isinstance(answer, MockResponse) else await answer
            assert isinstance(response, MockResponse), (
                f"a handler returns a MockResponse: {response!r}"
            )
            if type(response.body) in _WHOLE_BODIES or not isinstance(response.body, AsyncIterable):
                self._write_whole(response, record, close)
            else:
                started = True
                await self._stream(response, response.body, record, close)
        except asyncio.CancelledError:
            self.server._finish(record, "shutdown" if self.server._closing else "disconnected")
            raise
        except _Cut:
            self.server._finish(record, "completed")
            if self.transport is not None:
                self.transport.abort()
            return
        except Exception as exc:
            if record is not None:
                record.error = exc
            self.server._finish(record, "error")
            if self.transport is not None:
                if started:
                    self.transport.abort()
                else:
                    self._refuse(500)
            return
        finally:
            self.task = None
        self.server._finish(record, "completed")
        if close:
            if self.transport is not None:
                self.transport.close()
        elif self.buf:
            self._process()

    def _head(
        self, response: MockResponse, record: RequestRecord | None, close: bool, length: int | None
    ) -> tuple[bytes, bool]:
        if record is not None:
            record.status = response.status
        return _head(response.status, tuple(response.headers.items()), length, close)

    def _write_whole(
        self, response: MockResponse, record: RequestRecord | None, close: bool
    ) -> bytes:
        """A bytes body or a chunk list: the whole answer in one write (and its bytes)."""
        body = response.body
        if isinstance(body, bytes):
            head, _ = self._head(response, record, close, len(body))
            wire = head + body
            chunks: tuple[bytes, ...] = (body,) if body else ()
        else:
            chunks = body if isinstance(body, tuple) else tuple(body)  # type: ignore[arg-type]
            length = sum(map(len, chunks)) if self.server.framing == "length" else None
            head, chunked = self._head(response, record, close, length)
            wire = head + (_chunked(chunks) if chunked else b"".join(chunks))
        if self.transport is not None:
            self.transport.write(wire)
        if record is not None:
            record.writes += sum(1 for c in chunks if c)
            record.bytes_sent += sum(map(len, chunks))
            record.sent_all = True
        return wire

    async def _stream(
        self,
        response: MockResponse,
        body: AsyncIterable[bytes],
        record: RequestRecord | None,
        close: bool,
    ) -> None:
        """An async iterator's chunks, each written as it comes."""
        head, chunked = self._head(response, record, close, None)
        if self.transport is None:
            raise asyncio.CancelledError
        self.transport.write(head)
        try:
            async for chunk in body:
                if not chunk or self.transport is None:
                    continue
                self.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                if record is not None:
                    record.writes += 1
                    record.bytes_sent += len(chunk)
        except UpstreamError:
            raise _Cut from None
        # The end of the body goes in a write of its own a loop turn later, as a server that
        # awaits between writes sends it: a client must not need it to be in the same segment.
        await asyncio.sleep(0)
        if chunked and self.transport is not None:
            self.transport.write(_LAST_CHUNK)
        if record is not None:
            record.sent_all = True


@functools.lru_cache(maxsize=1024)
def _head(
    status: int, headers: tuple[tuple[str, str], ...], length: int | None, close: bool
) -> tuple[bytes, bool]:
    """The status line and headers, and whether the body goes in chunked frames. A
    Content-Length the handler set is kept (the body then goes as it is, short or not). Cached:
    a benchmark's answers repeat."""
    lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Status\r\n"]
    framed = True
    for name, value in headers:
        if name.lower() == "content-length":
            framed = False
        lines.append(f"{name}: {value}\r\n")
    if framed:
        if length is None:
            lines.append("Transfer-Encoding: chunked\r\n")
        else:
            lines.append(f"Content-Length: {length}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1"), framed and length is None


@functools.lru_cache(maxsize=256)
def _chunked(chunks: tuple[bytes, ...]) -> bytes:
    """`chunks` in chunked frames, with the last chunk. Cached: a prebuilt answer is a tuple
    (a list is hashed as the tuple it is made into), framed once."""
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + _LAST_CHUNK


async def _raise(exc: Exception) -> MockResponse:
    raise exc


class _ServerCore(Generic[H]):
    """What `MockServer` and `MockServerThread` share: the listener, the records, the URLs.

    `framing` is how a chunk list is sent ("chunked" frames, or "length": joined, with a
    Content-Length). `ssl` serves it over TLS (an https upstream; `root_url` then says
    https). A benchmark's upstream passes `record=False` (no records) and `memo=True`:
    a request the server has seen (the same method, target, body and keep-alive; bodies up to
    64 KiB) gets the bytes it was answered with, without the handler, whose whole answers must
    then depend on nothing else (streamed ones are asked for each time). That keeps the server
    out of a gateway benchmark's way: a repeated request costs what parsing its head does.
    """

    # Seconds a stop waits for the answers under way, cancelled, to end, and then for the
    # listener to close: a bound on a hang (a test that a stop cancels them sets it far longer).
    stop_grace: float = 2.0

    def __init__(
        self,
        handler: H,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        framing: Literal["chunked", "length"] = "chunked",
        record: bool = True,
        memo: bool = False,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.ssl = ssl
        self.host = host
        self.port = port
        self.framing = framing
        self.record = record
        self._memo: dict[tuple[str, str, bool, bytes], bytes] | None = {} if memo else None
        self.requests: list[RequestRecord] = []
        self.disconnects: list[RequestRecord] = []
        self.disconnected = threading.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._closing = False
        self._root_url = self.root_url

    @property
    def root_url(self) -> str:
        """The server without `/v1` (also the `azure_endpoint` of an Azure client)."""
        scheme = "https" if self.ssl is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def chat_requests(self) -> list[RequestRecord]:
        """The recorded chat-completion requests, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def last(self) -> RequestRecord:
        """The last chat-completion request."""
        return self.chat_requests[-1]

    def clear(self) -> None:
        """Forget the recorded requests and disconnects."""
        self.requests.clear()
        self.disconnects.clear()
        self.disconnected.clear()

    def _record(
        self, request: MockRequest, target: str, peer: tuple[str, int] | None
    ) -> RequestRecord:
        path, _, query = target.partition("?")
        try:
            body = request.json() if request.body else None
        except msgspec.DecodeError:
            body = None
        record = RequestRecord(
            request.method,
            path,
            dict(parse_qsl(query)),
            request.headers,
            request.body,
            body,
            request.model,
            peer=peer,
        )
        self.requests.append(record)
        return record

    def _finish(self, record: RequestRecord | None, outcome: Outcome) -> None:
        if record is None:
            return
        if record.outcome == "pending":
            if outcome == "disconnected" and record.sent_all:
                outcome = "completed"
            record.outcome = outcome
            if outcome == "disconnected":
                self.disconnects.append(record)
                self.disconnected.set()
        record.ended.set()

    async def _start(self) -> None:
        self._closing = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            self.host,
            self.port,
            backlog=2048,
            reuse_address=True,
            ssl=self.ssl,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._root_url = self.root_url

    async def _stop(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in self._connections if c.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_grace)
        for connection in list(self._connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.stop_grace):
                    await self._server.wait_closed()
            self._server = None

    async def serve_forever(self) -> None:
        """Serve until cancelled (a benchmark's upstream process)."""
        await self._start()
        try:
            await asyncio.Event().wait()
        finally:
            await self._stop()


class MockServer(_ServerCore[H]):
    """`handler` over loopback HTTP on the running loop: `async with MockServer(handler) as s:`
    (`s.base_url` is "http://127.0.0.1:PORT/v1"; `port=0` picks a free port)."""

    async def __aenter__(self) -> MockServer[H]:
        await self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def wait_disconnect(self, timeout: float = 5.0, count: int = 1) -> RequestRecord:
        """The `count`-th disconnected request, once there is one; TimeoutError otherwise."""
        await self._wait(lambda: len(self.disconnects) >= count, timeout)
        return self.disconnects[count - 1]

    async def wait_requests(self, count: int = 1, timeout: float = 5.0) -> list[RequestRecord]:
        """The recorded requests, once there are at least `count`."""
        await self._wait(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    async def wait_ended(self, record: RequestRecord, timeout: float = 5.0) -> RequestRecord:
        """`record`, once its answer has ended."""
        await self._wait(record.ended.is_set, timeout)
        return record

    @staticmethod
    async def _wait(ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() >= deadline:
                raise TimeoutError("mock server: condition not met in time")
            await asyncio.sleep(0.005)


class MockServerThread(_ServerCore[H]):
    """`handler` over loopback HTTP on its own loop in a background thread, for sync tests and
    svir subprocesses: `with MockServerThread(handler) as s:`. The handler runs on that loop."""

    def __init__(self, handler: H, **options: Any) -> None:
        super().__init__(handler, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MockServerThread[H]:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop,), daemon=True, name="mock-server"
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout=10)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._loop is not None
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        finally:
            self._shutdown_loop()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _shutdown_loop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def wait_disconnect(self, timeout: float = 5.0, count: int = 1) -> RequestRecord:
        """The `count`-th disconnected request, once there is one; TimeoutError otherwise."""
        self._wait(lambda: len(self.disconnects) >= count, timeout)
        return self.disconnects[count - 1]

    def wait_requests(self, count: int = 1, timeout: float = 5.0) -> list[RequestRecord]:
        """The recorded requests, once there are at least `count`."""
        self._wait(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    def wait_ended(self, record: RequestRecord, timeout: float = 5.0) -> RequestRecord:
        """`record`, once its answer has ended."""
        if not record.ended.wait(timeout):
            raise TimeoutError("mock server: request did not end in time")
        return record

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() >= deadline:
                raise TimeoutError("mock server: condition not met in time")
            time.sleep(0.005)
