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
        """The body as it arrives; raises UpstreamError on an idle timeout or a broken read."""
        content = self._resp.content
        loop = asyncio.get_running_loop()
        idle = self._idle
        try:
            async with asyncio.timeout(idle) as deadline:
                while True:
                    data = await content.readany()
                    if not data:
                        return
                    deadline.reschedule(loop.time() + idle)
                    yield data
        except TimeoutError:
            raise UpstreamError(
                ErrorKind.TIMEOUT,
                f"upstream sent nothing for {idle:g} s",
                in_stream=True,
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                ErrorKind.INCOMPLETE,
                f"upstream connection broke: {type(exc).__name__}",
                in_stream=True,
            ) from None

    def close(self) -> None:
        """Drop the connection (not back to the pool): the server sees the request cancelled."""
        self._resp.close()


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
        body: bytes,
        timeouts: Timeouts,
    ) -> UpstreamResponse:
        """POST a streamed request; return the open response, or raise a classified error."""
        try:
            async with asyncio.timeout(timeouts.first_byte):
                resp = await self.session.post(
                    url,
                    data=body,
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
