"""The plumbing every front end shares, written once: the request id, the request body read within
its limit (a 413 past it) and decoded as JSON within the depth limit, JSON answers, streamed
answers (SSE or NDJSON) that send their 200 only with their first bytes, the watch that stops a
request's work the moment its client disconnects, the context of a request's chat call, who owns
what a request stores, and the early start of a stream whose upstream is still silent past its
commit deadline.

What a handler raises is answered by the app's one error mapper (svir.edges.app); nothing here
answers an error itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

import msgspec

from svir.asgi import Receive, Scope, Send, exchange, header, piece_sender, server_extension
from svir.call import CHAT, CLIENT_USER_CHARS, CallContext, Commit
from svir.chat import ChatCall, unique_id
from svir.errors import BodyTooLarge, ClientGone, GatewayError
from svir.wire.answer import AnswerFold
from svir.wire.blobs import Blobs
from svir.wire.classify import to_client_error
from svir.wire.encoder import error_frame
from svir.wire.jsonbody import decode_body
from svir.wire.sse import encode_comment

__all__ = [
    "ANONYMOUS",
    "JSON_HEADERS",
    "KEEPALIVE_EVERY",
    "NDJSON_HEADERS",
    "SSE_HEADERS",
    "WARNING_HEADER",
    "EarlyStart",
    "UntilDisconnect",
    "folded",
    "headers_with",
    "merge_headers",
    "new_call_context",
    "open_early",
    "owner_of",
    "query_params",
    "read_body",
    "read_json",
    "request_id_of",
    "send_json",
    "send_stream",
    "sse_early_start",
    "warning_header",
]

_encode = msgspec.json.encode
# Seconds between the keep-alives of a stream started before its upstream's first output: well
# inside every client's and proxy's patience (nginx: 60 s without a byte).
KEEPALIVE_EVERY: Final = 10.0
JSON_HEADERS = ((b"content-type", b"application/json"),)
SSE_HEADERS = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
NDJSON_HEADERS = (
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_DONE_FRAME = b"data: [DONE]\n\n"
_REQUIRED: Final[Any] = object()
WARNING_HEADER: Final = "x-svir-warning"
# The owner of what a request without a bearer token stores.
ANONYMOUS: Final = "anonymous"
Fold = TypeVar("Fold", bound=AnswerFold)
Opened = TypeVar("Opened")


def request_id_of(scope: Scope) -> str:
    """The client's request id when it is sane, else a new one."""
    given = header(scope, b"x-request-id")
    if given is not None and _SANE_REQUEST_ID.fullmatch(given):
        return given.decode()
    return unique_id()


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | bytearray:
    """The whole request body, refusing more than `limit` bytes (BodyTooLarge) before reading
    them; ClientGone if the client leaves first."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise BodyTooLarge(limit)
        return bytes(body)
    buf = bytearray(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        buf += message.get("body", b"")
        if len(buf) > limit:
            raise BodyTooLarge(limit)
        if not message.get("more_body"):
            return buf  # msgspec decodes any buffer: no second copy of a large body


async def read_json(scope: Scope, receive: Receive, limit: int, *, empty: Any = _REQUIRED) -> Any:
    """The request body as JSON (svir.wire.jsonbody's decoder, with its depth limit), read as
    `read_body` reads it. A blank body is `empty` when one is given, else not JSON (BadJSON)."""
    raw = await read_body(scope, receive, limit)
    if empty is not _REQUIRED and not raw.strip():
        return empty
    return decode_body(raw)


def query_params(scope: Scope) -> dict[str, str]:
    """The request's query parameters (the last of a repeated name; a blank value kept as "")."""
    raw: bytes = scope.get("query_string") or b""
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


def headers_with(
    base: Iterable[tuple[bytes, bytes]], extra: dict[str, str]
) -> list[tuple[bytes, bytes]]:
    # A loop, not a generator in the list: a generator is made, then resumed once per field.
    fields = list(base)
    for name, value in extra.items():
        fields.append((name.lower().encode(), value.encode()))
    return fields


async def send_json(
    send: Send, status: int, obj: Any, extra_headers: dict[str, str] | None = None
) -> None:
    body = _encode(obj)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers_with(JSON_HEADERS, extra_headers or {}),
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_stream(
    send: Send,
    stream: AsyncIterator[bytes],
    headers: dict[str, str],
    kind: Iterable[tuple[bytes, bytes]] = SSE_HEADERS,
    *,
    last: Callable[[bytes], bool] | None = None,
) -> None:
    """Send a streamed 200 (`kind`: its content headers, SSE unless NDJSON_HEADERS) only with the
    first bytes: an earlier failure is still an HTTP error.

    A piece that `last` says is the last one (by default: one that ends with SSE's `[DONE]`
    frame) goes out with the end of the response in the same send (one write fewer per stream);
    the stream is then run to its end.
    """
    is_last = last or _ends_done
    piece = piece_sender(send)
    first = await anext(stream, None)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": headers_with(kind, headers),
        }
    )
    if first is not None:
        if is_last(first):
            await send({"type": "http.response.body", "body": first, "more_body": False})
            await _drain(stream)
            return
        await piece(first)
        async for data in stream:
            if is_last(data):
                await send({"type": "http.response.body", "body": data, "more_body": False})
                await _drain(stream)
                return
            await piece(data)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _ends_done(data: bytes) -> bool:
    return data.endswith(_DONE_FRAME)


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Run a stream whose answer is complete to its end (its bookkeeping runs on the way)."""
    async for _ in stream:
        pass


class UntilDisconnect:
    """`with UntilDisconnect(scope, receive): return await work`: the work the block awaits is
    cancelled the moment the client disconnects, and that cancellation leaves the block as
    ClientGone (the app answers it 499: nothing is left to answer); a client gone before the block
    is ClientGone at once, before the work starts.

    The work runs in the calling task (no second task per request), and the watch is no coroutine
    around it (one level fewer that every chunk of a stream resumes). svir's own server says that
    the client went (its connection's `DisconnectWatch`, svir.asgi.ServerExtension); under any
    other, a watcher task waits on `receive` for the disconnect.
    """

    __slots__ = ("_gone", "_receive", "_task", "_watch", "_watcher")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._receive = receive
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._gone = False
        server = server_extension(scope)
        self._watch = server.watch if server is not None else None
        self._watcher: asyncio.Future[None] | None = None

    def _went(self) -> None:
        self._gone = True
        self._task.cancel()

    async def _watch_receive(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._went()
                return

    def __enter__(self) -> None:
        watch = self._watch
        if watch is None:
            self._watcher = asyncio.ensure_future(self._watch_receive())
        elif watch.gone:
            raise ClientGone  # the client left before the work could start
        else:
            watch.callback = self._went

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        watch, watcher = self._watch, self._watcher
        if watcher is not None:
            self._watcher = None  # it refers to this, through its coroutine: no cycle left
            watcher.cancel()
        elif watch is not None and watch.callback == self._went:  # not kept: a cycle
            watch.callback = None
        if (
            self._gone
            and kind is not None
            and issubclass(kind, asyncio.CancelledError)
            and self._task.uncancel() == 0
        ):
            raise ClientGone from None  # the client went away, and nothing else cancelled


async def folded(call: ChatCall, fold: Fold) -> Fold:
    """`fold` with every event of the call's answer added: an answer not streamed. A stream
    that failed is raised as the GatewayError it is."""
    async for events in call.events():
        fold.extend(events)
    if fold.error is not None:
        raise GatewayError(to_client_error(fold.error), fold.error)
    return fold


def new_call_context(
    scope: Scope,
    rid: str,
    api: str,
    blobs: Blobs | None = None,
    client_user: str | None = None,
    *,
    operation: str = CHAT,
    early: EarlyStart | None = None,
) -> CallContext:
    """The context of the call a handler makes for this request (one per request), naming its
    front end `api` ("openai", "ollama", "threads", ...), the caller's key and the request's
    capture (from its `svir.asgi.Exchange`), the end user the client named (cut to
    CLIENT_USER_CHARS), the `operation` (CHAT, or EMBEDDINGS: svir.call) and a streamed answer's
    early start (`early`: its commit goes on the context, for the policy to say when); kept on
    the request's Exchange, from which the app writes the request's log fields about the call
    when the request ends (svir.edges.app)."""
    if client_user is not None:
        client_user = client_user[:CLIENT_USER_CHARS]
    noted = exchange(scope)
    ctx = CallContext(
        rid,
        api,
        noted.key,
        blobs,
        client_user,
        operation=operation,
        commit=early.commit if early is not None else None,
        capture=noted.capture,
    )
    noted.call = ctx
    return ctx


def owner_of(scope: Scope) -> str:
    """Who owns what this request creates (a thread, a stored response): the SHA-256 of its bearer
    token (the token itself is never stored), or ANONYMOUS without one."""
    value = header(scope, b"authorization")
    if value is None:
        return ANONYMOUS
    token = value.strip()
    scheme, _, rest = token.partition(b" ")
    if scheme.lower() == b"bearer":
        token = rest.strip()
    if not token:
        return ANONYMOUS
    return "sha256:" + hashlib.sha256(token).hexdigest()


def merge_headers(headers: dict[str, str], extra: Mapping[str, str]) -> None:
    """Add a call's answer headers to the front end's own: an `x-svir-warning` both have says
    both (what the translation dropped, then what the upstream was sent without)."""
    for name, value in extra.items():
        if name == WARNING_HEADER and headers.get(name):
            headers[name] = f"{headers[name]}; {value}"
        else:
            headers[name] = value


def warning_header(warnings: Iterable[str]) -> str:
    """The `x-svir-warning` value for what a translation ignored: one latin-1 line (the warnings
    name fields and tools the client sent)."""
    text = "; ".join(warnings).encode("latin-1", "replace").decode("latin-1")
    return " ".join(text.split())


class EarlyStart:
    """What a streamed request's front end sends when the policy says its answer commits (its
    `commit`, a `svir.call.Commit` made with it, at the request's arrival, and carried by the
    call's context) while the upstream is still silent (a long prompt being read, a model being
    loaded): the response's head with `kind`'s content headers and `first()`'s bytes, then
    `ping()`'s every `every` seconds of silence, and the upstream's own keep-alive comments as
    `relay` writes them (none without it), from a task made only then (nothing more for an answer
    that comes in time). A failure after that start is the stream's one error, `fail`'s bytes.
    """

    __slots__ = (
        "_every",
        "_fail",
        "_first",
        "_headers",
        "_kind",
        "_pending",
        "_ping",
        "_relay",
        "_send",
        "_stopping",
        "_task",
        "_waiting",
        "_wake",
        "commit",
        "ended",
        "started",
    )

    def __init__(
        self,
        send: Send,
        headers: dict[str, str],
        *,
        first: Callable[[], bytes],
        ping: Callable[[], bytes],
        fail: Callable[[GatewayError], bytes],
        relay: Callable[[str], bytes] | None = None,
        kind: Iterable[tuple[bytes, bytes]] = SSE_HEADERS,
        every: float = KEEPALIVE_EVERY,
    ) -> None:
        self._send = send
        self._headers = headers
        self._kind = kind
        self._first = first
        self._ping = ping
        self._fail = fail
        self._relay = relay
        self._every = every
        # When the answer commits: the policy says it (svir.call.Commit), this acts on it.
        self.commit = commit = Commit()
        commit.on_commit = self._commit
        if relay is not None:
            commit.relay = self._upstream_keepalive
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._pending: list[bytes] = []
        self._waiting = False
        self._stopping = False
        # The response's head is (being) sent; `ended`: the failure was the stream's end.
        self.started = False
        self.ended = False

    def _commit(self) -> None:
        self._task = asyncio.ensure_future(self._keep_alive())

    def _upstream_keepalive(self, comment: str) -> None:
        """The upstream's keep-alive, once committed: passed on as `relay` writes it."""
        if self._relay is None or self._stopping:
            return
        self._pending.append(self._relay(comment))
        if self._wake is not None:
            self._wake.set()

    async def _keep_alive(self) -> None:
        # The only sender until `stop`, and never cancelled inside a send (see `stop`): the
        # client gets whole frames.
        self.started = True
        start = headers_with(self._kind, self._headers)
        await self._send({"type": "http.response.start", "status": 200, "headers": start})
        first = self._first()
        if first:
            await self._send({"type": "http.response.body", "body": first, "more_body": True})
        wake = self._wake = asyncio.Event()
        while not self._stopping:
            if not self._pending:
                self._waiting = True
                try:
                    async with asyncio.timeout(self._every):
                        await wake.wait()
                except TimeoutError:
                    pass
                finally:
                    self._waiting = False
                wake.clear()
            data = b"".join(self._pending) if self._pending else self._ping()
            self._pending.clear()
            if data:
                await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def stop(self) -> bool:
        """Stop the deadline and the keep-alives; whether the response has started."""
        self._stopping = True
        self.commit.close()
        task = self._task
        if task is None:
            return False
        if self._waiting or not self.started:
            task.cancel()
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return self.started

    async def fail(self, exc: GatewayError) -> None:
        """End the started stream with `exc` as its last event."""
        self.ended = True
        data = self._fail(exc)
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def open(
        self,
        opening: Awaitable[Opened],
        refused: Callable[[GatewayError], GatewayError] | None = None,
    ) -> Opened | None:
        """What `opening` gives (the opened call), while the deadline runs. A failure is raised
        (as `refused` words it) before the start, and is the started stream's last event after
        it (then None, and `ended`)."""
        try:
            opened = await opening
        except GatewayError as exc:
            error = exc if refused is None else refused(exc)
            if not await self.stop():
                raise error from None
            await self.fail(error)
            return None
        except BaseException:
            await self.stop()
            raise
        if self._task is None:  # in time (the common case): only the deadline to end
            self._stopping = True
            self.commit.close()
            return opened
        await self.stop()
        return opened

    def stream(
        self, pieces: AsyncIterator[bytes], *, last: Callable[[bytes], bool] | None = None
    ) -> Awaitable[None]:
        """The answer's bytes: as `send_stream` sends them (the head with the first) when the
        response has not started, else after what was sent; `last` as there. Not a coroutine
        itself: the one it gives is awaited directly, one coroutine level fewer to resume on
        every chunk."""
        if not self.started:
            return send_stream(self._send, pieces, self._headers, self._kind, last=last)
        return self._stream_on(pieces, last)

    async def _stream_on(
        self, pieces: AsyncIterator[bytes], last: Callable[[bytes], bool] | None
    ) -> None:
        is_last = last or _ends_done
        send = self._send
        piece = piece_sender(send)
        async for data in pieces:
            if is_last(data):
                await send({"type": "http.response.body", "body": data, "more_body": False})
                await _drain(pieces)
                return
            await piece(data)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def open_early(
    opening: Awaitable[Opened],
    early: EarlyStart | None,
    refused: Callable[[GatewayError], GatewayError] | None = None,
) -> Opened | None:
    """What `opening` gives (the opened call), under the stream's early start if it has one
    (`EarlyStart.open`: None when the started stream ended with the failure); a failure without
    one is raised as `refused` words it."""
    if early is not None:
        return await early.open(opening, refused)
    try:
        return await opening
    except GatewayError as exc:
        if refused is None:
            raise
        raise refused(exc) from None


_KEEPALIVE_COMMENT: Final = b": keepalive\n\n"


def _keepalive_comment() -> bytes:
    return _KEEPALIVE_COMMENT


def _error_frame(exc: GatewayError) -> bytes:
    ce = exc.error
    return error_frame(ce.message, ce.type, None if ce.code is None else str(ce.code))


def sse_early_start(send: Send, headers: dict[str, str]) -> EarlyStart:
    """The early start of an OpenAI-style stream (chat and text completions): `: keepalive`
    comments, the upstream's own comments as it wrote them (mlx-lm's `: keepalive 256/512`), and
    a failure as the one `data: {"error": ...}` frame, without `[DONE]`."""
    return EarlyStart(
        send,
        headers,
        first=_keepalive_comment,
        ping=_keepalive_comment,
        fail=_error_frame,
        relay=encode_comment,
    )
