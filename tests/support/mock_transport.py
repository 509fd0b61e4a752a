"""An upstream that is a function, in process: `MockTransport`, a `svir.transport.Transport` as
httpx's `MockTransport` is, for svir's tests and benchmarks (not in the wheel: no user document
offers it, and svir runs without it). `tests/support/mock_server.py` serves the same handler over
loopback HTTP; svir's own script of upstream behaviours is tests/support/upstream.py.

The handler gets each request (`MockRequest`: method, url, headers, body bytes) and returns a
`MockResponse` (status, headers, body: bytes, chunks, or an async iterator of chunks to script
timing and breaks), or raises what the real client would (a classified `UpstreamError` for a
connect failure). The answer then goes through what `svir.edges.upstream.UpstreamClient` does
with one (`svir.transport`): a non-2xx status is classified from its body, a 2xx that is not an
event stream is refused, the first-byte and idle timeouts apply, and an `UpstreamError` raised
by a body's iterator is the stream's break (script it with `in_stream=True`).

    async def handler(request: MockRequest) -> MockResponse:
        return MockResponse(503, body=b'{"error": {"message": "overloaded"}}')

    app = build_app(config, environ, transport=MockTransport(handler))
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from svir.config.model import Timeouts
from svir.transport import (
    ERROR_BODY_LIMIT,
    JSON_BODY_LIMIT,
    Headers,
    Network,
    error_answer,
    error_body_timeout,
    first_byte_timeout,
    idle_timeout,
    too_large,
)
from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.errors import ErrorKind, UpstreamError

__all__ = [
    "Handler",
    "MockRequest",
    "MockResponse",
    "MockStream",
    "MockTransport",
    "sse",
]

Body = bytes | Iterable[bytes] | AsyncIterable[bytes]


@dataclass(frozen=True)
class MockRequest:
    """One request as the upstream would get it."""

    method: str
    url: str
    headers: Mapping[str, str]  # looked up case-insensitively
    body: bytes
    # The provider's network (proxy, TLS) the request was sent with; None: the default.
    network: Network | None = None

    def json(self) -> Any:
        """The body's JSON (parsed once: a script may ask for it more than once)."""
        cache = self.__dict__  # frozen, but a cache is not the request's state
        if "_json" not in cache:
            cache["_json"] = _decode_json(self.body)
        return cache["_json"]

    @property
    def path(self) -> str:
        return _path(self.url)

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.url.partition("?")[2]))

    @property
    def model(self) -> str | None:
        """The model asked for: the deployment an Azure URL names, else the JSON body's `model`."""
        if "/openai/deployments/" in self.url:
            deployment = _DEPLOYMENT.search(self.url)
            if deployment is not None:
                return deployment[1]
        try:
            body = self.json()
        except msgspec.DecodeError:
            return None
        name = body.get("model") if isinstance(body, dict) else None
        return name if isinstance(name, str) else None


_decode_json = msgspec.json.Decoder().decode


def _path(url: str) -> str:
    """A URL's path, without urlsplit's cost (a mock server reads one per request)."""
    rest = url.partition("://")[2]
    at = rest.find("/")
    return rest[at:].partition("?")[0] if at >= 0 else "/"


_DEPLOYMENT = re.compile(r"/openai/deployments/([^/?]+)/")


@dataclass(slots=True)
class MockResponse:
    """A scripted answer: by default an event stream, whose `body` is bytes or chunks (an async
    iterator of them may sleep between chunks, or raise an `UpstreamError` to break)."""

    status: int = 200
    body: Body = b""
    headers: Mapping[str, str] = field(
        default_factory=lambda: {"Content-Type": "text/event-stream"}
    )

    @classmethod
    def json(
        cls, obj: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> MockResponse:
        """A JSON answer (an upstream's error, a model list)."""
        return cls(
            status,
            json.dumps(obj).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )


def sse(*events: Any) -> list[bytes]:
    """SSE chunks, one `data:` frame per event (a JSON value, compact, or a str such as
    "[DONE]")."""
    return [
        f"data: {e if isinstance(e, str) else json.dumps(e, separators=(',', ':'))}\n\n".encode()
        for e in events
    ]


Handler = Callable[[MockRequest], MockResponse | Awaitable[MockResponse]]


async def _chunks(body: Body) -> AsyncGenerator[bytes, None]:
    if isinstance(body, bytes):
        if body:
            yield body
    elif isinstance(body, AsyncIterable):
        async for chunk in body:
            yield chunk
    else:
        for chunk in body:
            yield chunk


async def _read(chunks: AsyncGenerator[bytes, None], limit: int) -> bytes:
    """A body to its end or to `limit` bytes, as `svir.edges.upstream.read_limited` reads one."""
    parts: list[bytes] = []
    size = 0
    async for data in chunks:
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


class MockStream:
    """An open, successful scripted stream (a `svir.transport.StreamResponse`)."""

    def __init__(self, response: MockResponse, headers: Headers, idle: float) -> None:
        self.status = response.status
        self.headers: Mapping[str, str] = headers
        self._chunks = _chunks(response.body)
        self._idle = idle
        self.closed = False
        self.finished = False

    async def read(self) -> bytes:
        data = b""
        while not data:  # a scripted empty chunk is not the body's end
            try:
                async with asyncio.timeout(self._idle):
                    data = await anext(self._chunks)
            except StopAsyncIteration:
                return b""
            except TimeoutError:
                raise idle_timeout(self._idle) from None
        return data

    def close(self) -> None:
        self.closed = True

    def finish(self) -> None:
        self.finished = True


class MockTransport:
    """A `svir.transport.Transport` answered by `handler` (sync or async); `requests` holds what
    it was asked, in order. `clock` is the wall clock an error's Retry-After date is read
    against, as `UpstreamClient`'s."""

    def __init__(self, handler: Handler, *, clock: Callable[[], float] = time.time) -> None:
        self.handler = handler
        self.requests: list[MockRequest] = []
        self.streams: list[MockStream] = []
        self.closed = False
        self._clock = clock

    async def _answer(self, request: MockRequest) -> tuple[MockResponse, Headers]:
        self.requests.append(request)
        response = self.handler(request)
        if inspect.isawaitable(response):
            response = await response
        assert isinstance(response, MockResponse), f"a handler returns a MockResponse: {response!r}"
        return response, Headers(list(response.headers.items()))

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
        network: Network | None = None,
    ) -> MockStream:
        data = body if isinstance(body, bytes) else b"".join(bytes(p) for p in body)
        request = MockRequest("POST", url, Headers(list(headers.items())), data, network)
        try:
            async with asyncio.timeout(timeouts.first_byte):
                response, answer_headers = await self._answer(request)
        except TimeoutError:
            raise first_byte_timeout(timeouts.first_byte) from None
        if response.status >= 300:
            error_body = b""
            try:
                async with asyncio.timeout(error_body_timeout(response.status)):
                    error_body = await _read(_chunks(response.body), ERROR_BODY_LIMIT)
            except (TimeoutError, UpstreamError):
                pass
            raise error_answer(response.status, answer_headers, error_body, now=self._clock())
        problem = check_stream_response(response.status, answer_headers.get("Content-Type"))
        if problem is not None:
            raise problem
        stream = MockStream(response, answer_headers, timeouts.idle)
        self.streams.append(stream)
        return stream

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
        method = "GET" if body is None else "POST"
        try:
            async with asyncio.timeout(timeout):
                response, answer_headers = await self._answer(
                    MockRequest(method, url, Headers(list(headers.items())), body or b"", network)
                )
                read = JSON_BODY_LIMIT if response.status >= 300 else limit + 1
                answer = await _read(_chunks(response.body), read)
        except TimeoutError:
            raise UpstreamError(ErrorKind.TIMEOUT, f"no answer within {timeout:g} s") from None
        if response.status >= 300:
            raise classify_http_error(response.status, answer_headers, answer, now=self._clock())
        if len(answer) > limit:
            raise too_large(limit)
        return answer

    async def close(self) -> None:
        self.closed = True
