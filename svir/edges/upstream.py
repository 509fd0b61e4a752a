"""The upstream HTTP client: opens a model server's response and yields its body bytes.

HTTP/1.1 goes through svir's own small client (`svir.edges.h1`, chosen by measurement: see
BENCHMARKS.md). It turns every network failure into a classified `UpstreamError`, applies the
three timeouts (connect, first byte, idle between chunks), and closes the connection at once when
the caller stops reading, so that a client who went away stops the generation upstream too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from svir.config.model import Timeouts
from svir.edges.h1 import H1Pool, H1Response
from svir.errors import H1Error, ProxyError
from svir.transport import (
    ERROR_BODY_LIMIT,
    JSON_BODY_LIMIT,
    Network,
    error_answer,
    error_body_timeout,
    first_byte_timeout,
    idle_timeout,
    too_large,
)
from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.proxy import rules_from_env


async def read_limited(resp: H1Response, limit: int) -> bytes:
    """Read a body to its end, or to `limit` bytes, whichever comes first."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        data = await resp.read()
        if not data:
            break
        parts.append(data)
        size += len(data)
    return b"".join(parts)[:limit]


class _IdleTimer:
    """Cancels `task` once the upstream has been waited on for `idle` s without a byte.

    One timer serves a whole stream: each firing re-arms itself from the current wait instead of
    a reschedule per chunk. An object rather than a closure: a closure that re-arms itself refers
    to itself, and that cycle would leave every request's timer to the garbage collector.
    """

    __slots__ = ("_handle", "expired", "idle", "loop", "task", "waiting_since")

    def __init__(self, task: asyncio.Task[Any], idle: float) -> None:
        self.loop = task.get_loop()
        self.task = task
        self.idle = idle
        self.waiting_since: float | None = None
        self.expired = False
        self._handle = self.loop.call_at(self.loop.time() + idle, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        if self.waiting_since is not None and now - self.waiting_since >= self.idle:
            self.expired = True
            self.task.cancel()
        else:
            self._handle = self.loop.call_at((self.waiting_since or now) + self.idle, self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class _Deadline:
    """Cancels the current task `seconds` from now, unless cancelled first; `expired_here` says,
    in the task's CancelledError handler, whether the cancellation was this deadline's (and
    takes it back), as `asyncio.timeout` does."""

    __slots__ = ("_cancelling", "_handle", "expired", "task")

    def __init__(self, seconds: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.expired = False
        self._cancelling = task.cancelling()  # requests already made are not this deadline's
        self._handle = task.get_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def expired_here(self) -> bool:
        return self.expired and self.task.uncancel() <= self._cancelling

    def cancel(self) -> None:
        self._handle.cancel()


class UpstreamResponse:
    """An open, successful streamed response."""

    __slots__ = ("_idle", "_resp", "_timer", "headers", "status")

    def __init__(self, resp: H1Response, idle: float) -> None:
        self._resp = resp
        self._idle = idle
        self._timer: _IdleTimer | None = None
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    async def read(self) -> bytes:
        """The body's next bytes as they arrive, b"" at its end; raises UpstreamError on an idle
        timeout or a broken read.

        The idle clock runs only while waiting on the upstream, never while the reader is busy
        (a slow client is not the upstream's silence) nor when the bytes are already here. One
        timer serves the whole body, armed at the first read that has to wait, for the task that
        reads: a body that arrived with its head (a short answer) never arms one.
        """
        resp = self._resp
        timer = self._timer
        try:
            if (data := resp.read_nowait()) is None:
                # In this coroutine, not one of its own: a stream's reader waits once a chunk, and
                # each level between the task and the future is resumed every time.
                if timer is None:
                    task = asyncio.current_task()
                    assert task is not None
                    timer = self._timer = _IdleTimer(task, self._idle)
                timer.waiting_since = timer.loop.time()
                await resp.wait()
                while (data := resp.read_nowait()) is None:
                    await resp.wait()
                timer.waiting_since = None
        except asyncio.CancelledError:
            if timer is not None and timer.expired:
                timer.task.uncancel()  # this cancellation was ours, and is answered here
                self._stop_timer()
                raise idle_timeout(self._idle) from None
            raise
        except H1Error as exc:
            self._stop_timer()
            raise UpstreamError(
                ErrorKind.INCOMPLETE, f"upstream connection broke: {exc}", in_stream=True
            ) from None
        if not data:
            self._stop_timer()
        return data

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Drop the connection (not back to the pool): the server sees the request cancelled."""
        self._stop_timer()
        self._resp.close()

    def finish(self) -> None:
        """Done with a response whose answer is whole: the connection is kept for the next
        request, once what is left of the body (its framing's end) has arrived."""
        self._stop_timer()
        self._resp.finish()


def connect_failure(exc: H1Error, what: str) -> UpstreamError:
    """The classified error of a request that never reached the upstream (TRANSIENT, retried):
    the proxy's failure says it was the proxy's, and names it (`details["proxy"]`)."""
    if isinstance(exc, ProxyError):
        details: dict[str, Any] = {"proxy": exc.proxy}
        if exc.status is not None:
            details["proxy_status"] = exc.status
        return UpstreamError(ErrorKind.TRANSIENT, str(exc), details=details)
    return UpstreamError(ErrorKind.TRANSIENT, f"{what}: {exc}")


class UpstreamClient:
    """One connection pool for all upstreams (svir.edges.h1: keep-alive, no limit by default).

    `clock` is the wall clock (unix time) an error's `Retry-After` date is read against.
    `environ` (default the process's) gives the proxy variables of a request sent without a
    provider's network.
    """

    def __init__(
        self,
        *,
        limit: int = 0,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._limit = limit  # kept for the interface; the pool does not cap connections
        self._pool: H1Pool | None = None
        self._clock = clock
        self._default = Network(rules_from_env(os.environ if environ is None else environ))

    @property
    def pool(self) -> H1Pool:
        if self._pool is None:
            self._pool = H1Pool(default_network=self._default)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
        network: Network | None = None,
    ) -> UpstreamResponse:
        """POST a streamed request; return the open response, or raise a classified error.

        A body in pieces is sent as they are, with its exact length up front: not every server
        takes a chunked body (§2.3).
        """
        # The first-byte deadline as one timer that cancels this task, not an asyncio.timeout
        # (its context manager and rescheduling cost more than the request's own timer).
        deadline = _Deadline(timeouts.first_byte)
        try:
            resp = await self.pool.request(
                "POST",
                url,
                headers=headers,
                body=body,
                connect_timeout=timeouts.connect,
                network=network,
            )
        except asyncio.CancelledError:
            if deadline.expired_here():
                raise first_byte_timeout(timeouts.first_byte) from None
            raise
        except H1Error as exc:
            if exc.connect:
                raise connect_failure(exc, "cannot connect to upstream") from None
            raise UpstreamError(ErrorKind.TRANSIENT, f"upstream request failed: {exc}") from None
        except OSError as exc:
            raise UpstreamError(
                ErrorKind.TRANSIENT, f"upstream request failed: {type(exc).__name__}"
            ) from None
        finally:
            deadline.cancel()
        if resp.status >= 300:
            raise await self._error(resp)
        problem = check_stream_response(resp.status, resp.headers.get("Content-Type"))
        if problem is not None:
            resp.close()
            raise problem
        return UpstreamResponse(resp, timeouts.idle)

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
        """A small GET (model lists), or POST of `body`: the answer's body, or a classified
        error."""
        resp: H1Response | None = None
        method = "GET" if body is None else "POST"
        try:
            async with asyncio.timeout(timeout):
                resp = await self.pool.request(
                    method,
                    url,
                    headers=headers,
                    body=body or b"",
                    connect_timeout=timeout,
                    network=network,
                )
                if resp.status >= 300:
                    answer = await read_limited(resp, JSON_BODY_LIMIT)
                    raise classify_http_error(resp.status, resp.headers, answer, now=self._clock())
                answer = await read_limited(resp, limit + 1)
                if len(answer) > limit:
                    raise too_large(limit)
                return answer
        except TimeoutError:
            raise UpstreamError(ErrorKind.TIMEOUT, f"no answer within {timeout:g} s") from None
        except H1Error as exc:
            raise connect_failure(exc, "request failed") from None
        except OSError as exc:
            raise UpstreamError(ErrorKind.TRANSIENT, f"request failed: {exc}") from None
        finally:
            if resp is not None:
                resp.close()

    async def _error(self, resp: H1Response) -> UpstreamError:
        body = b""
        try:
            async with asyncio.timeout(error_body_timeout(resp.status)):
                body = await read_limited(resp, ERROR_BODY_LIMIT)
        except (TimeoutError, H1Error):
            pass
        resp.close()
        return error_answer(resp.status, resp.headers, body, now=self._clock())
