"""The upstream HTTP client: opens a model server's response and yields its body bytes.

It turns every network failure into a classified `UpstreamError`, applies the three timeouts
(connect, first byte, idle between chunks), and closes the connection at once when the caller
stops reading, so that a client who went away stops the generation upstream too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp

from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.errors import ErrorKind, UpstreamError

ERROR_BODY_LIMIT = 65536
ERROR_BODY_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds allowed to connect, to the response's headers, and between two body chunks."""

    connect: float = 10.0
    first_byte: float = 300.0
    idle: float = 120.0


async def read_limited(content: aiohttp.StreamReader, limit: int) -> bytes:
    """Read a body to its end, or to `limit` bytes, whichever comes first."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        data = await content.readany()
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)[:limit]


class UpstreamResponse:
    """An open, successful streamed response."""

    __slots__ = ("_idle", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, idle: float) -> None:
        self._resp = resp
        self._idle = idle
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises UpstreamError on an idle timeout or a broken read.

        The idle clock runs only while waiting on the upstream, never while the consumer is busy
        (a slow client is not the upstream's silence). One timer serves the whole stream: each
        firing re-arms itself from the current wait instead of a reschedule per chunk.
        """
        content = self._resp.content
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        idle = self._idle
        waiting_since: float | None = None
        expired = False

        timer: list[asyncio.TimerHandle] = []

        def check() -> None:
            nonlocal expired
            now = loop.time()
            if waiting_since is not None and now - waiting_since >= idle:
                expired = True
                task.cancel()
            else:
                timer[0] = loop.call_at((waiting_since or now) + idle, check)

        timer.append(loop.call_at(loop.time() + idle, check))
        try:
            while True:
                waiting_since = loop.time()
                data = await content.readany()
                waiting_since = None
                if not data:
                    return
                yield data
        except asyncio.CancelledError:
            if expired:
                task.uncancel()  # this cancellation was ours, and is answered here
                raise UpstreamError(
                    ErrorKind.TIMEOUT, f"upstream sent nothing for {idle:g} s", in_stream=True
                ) from None
            raise
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                ErrorKind.INCOMPLETE,
                f"upstream connection broke: {type(exc).__name__}",
                in_stream=True,
            ) from None
        finally:
            timer[0].cancel()

    def close(self) -> None:
        """Drop the connection (not back to the pool): the server sees the request cancelled."""
        self._resp.close()


async def _pieces(parts: list[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
    for part in parts:
        yield part


class UpstreamClient:
    """One connection pool for all upstreams."""

    def __init__(self, *, limit: int = 0) -> None:
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
    ) -> UpstreamResponse:
        """POST a streamed request; return the open response, or raise a classified error.

        A body in pieces is sent as they are, with its exact length up front: not every server
        takes a chunked body (§2.3).
        """
        data: bytes | AsyncIterator[bytes | memoryview]
        if isinstance(body, list):
            if len(body) == 1:
                data = bytes(body[0])
            else:
                headers = {**headers, "Content-Length": str(sum(len(p) for p in body))}
                data = _pieces(body)
        else:
            data = body
        try:
            async with asyncio.timeout(timeouts.first_byte):
                resp = await self.session.post(
                    url,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
                )
        except TimeoutError:
            raise UpstreamError(
                ErrorKind.TIMEOUT, f"upstream did not answer within {timeouts.first_byte:g} s"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(
                ErrorKind.TRANSIENT, f"cannot connect to upstream: {exc.os_error or exc}"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                ErrorKind.TRANSIENT, f"upstream request failed: {type(exc).__name__}"
            ) from None
        if resp.status >= 300:
            raise await self._error(resp)
        problem = check_stream_response(resp.status, resp.headers.get("Content-Type"))
        if problem is not None:
            resp.close()
            raise problem
        return UpstreamResponse(resp, timeouts.idle)

    async def get_json_bytes(
        self, url: str, *, headers: Mapping[str, str], timeout: float
    ) -> bytes:
        """A small GET (model lists): the body, or a classified error."""
        try:
            async with (
                asyncio.timeout(timeout),
                self.session.get(url, headers=headers) as resp,
            ):
                body = await read_limited(resp.content, 4 << 20)
                if resp.status >= 300:
                    raise classify_http_error(resp.status, resp.headers, body)
                return body
        except TimeoutError:
            raise UpstreamError(ErrorKind.TIMEOUT, f"no answer within {timeout:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(ErrorKind.TRANSIENT, f"request failed: {exc}") from None

    @staticmethod
    async def _error(resp: aiohttp.ClientResponse) -> UpstreamError:
        body = b""
        # Some servers stall an auth error's body: its words would not change the answer anyway.
        if resp.status not in (401, 403):
            try:
                async with asyncio.timeout(ERROR_BODY_TIMEOUT):
                    body = await read_limited(resp.content, ERROR_BODY_LIMIT)
            except (TimeoutError, aiohttp.ClientError):
                pass
        resp.close()
        return classify_http_error(resp.status, resp.headers, body)
