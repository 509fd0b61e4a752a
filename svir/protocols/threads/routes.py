"""svir's threads API, /v1/threads (see docs/threads.md): a conversation kept by svir, continued
by a model. This is its HTTP edge; what a thread is and does lives in svir.threads.

    POST   /v1/threads                                         create
    GET    /v1/threads                                         the caller's threads, paginated
    GET    /v1/threads/{thread_id}                             a thread with its messages
    POST   /v1/threads/{thread_id}                             change model, system or metadata
    DELETE /v1/threads/{thread_id}                             delete
    POST   /v1/threads/{thread_id}/messages                    append (JSON, or a multipart upload)
    GET    /v1/threads/{thread_id}/messages                    messages, paginated
    GET    /v1/threads/{thread_id}/messages/{message_id}       one message
    GET    /v1/threads/{thread_id}/attachments/{attachment_id} an attachment's bytes
    POST   /v1/threads/{thread_id}/continue                    the model's next turn, as frames
    POST   /v1/threads/{thread_id}/cancel                      cancel the running continuation

The request is a thread's messages, which svir.threads.service turns into the canonical chat
request; the canonical events become the threads API's frames (svir.threads.frames, sent as SSE)
or the last frame alone. Errors are OpenAI's shape, with more fields when a ThreadError carries
them; a continue request answers every error with the error frame's object (seed 002). A streamed
continue whose upstream has shown nothing by its provider's commit deadline starts anyway
(`: keepalive` comments: svir.protocols.http `EarlyStart`), and a failure after that start is its
last frame, not retried.

A thread belongs to the bearer token that created it (its SHA-256; no token is one fixed
anonymous owner); any other token gets 404 for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from svir.asgi import GRACEFUL_STOP_SECONDS, Receive, Scope, Send, header
from svir.errors import GatewayError, ThreadError, request_error
from svir.protocols.http import (
    ANONYMOUS,
    EarlyStart,
    UntilDisconnect,
    headers_with,
    new_call_context,
    open_early,
    owner_of,
    query_params,
    read_body,
    read_json,
    send_json,
)
from svir.protocols.router import Handler, Host
from svir.threads import frames
from svir.threads.service import Continuation, ThreadService, parse_continue
from svir.wire.classify import ClientError, error_body

__all__ = ["ANONYMOUS", "ThreadsAPI", "install", "owner_of"]

log = logging.getLogger("svir.threads")

PREFIX: Final = "/v1/threads"
# How long before the server cancels the open responses a running continuation is ended, so that
# its error frame is written and its lease given back first.
_ABORT_BEFORE_CUT: Final = 1.0
_STORE_CLOSED: Final = GatewayError(
    ClientError(503, "server_error", "store_unavailable", "The thread store is not open.")
)


def install(app: Host, service: ThreadService) -> ThreadsAPI:
    """Serve /v1/threads on `app` with `service`: the routes, and the service's store opened at
    start-up and closed at shut-down (the composition root builds the service and its store:
    svir.server.thread_service)."""
    api = ThreadsAPI(app, service)
    for method, template, handler in api.routes():
        shape = continue_error if template.endswith("/continue") else thread_error
        app.routes.add(method, PREFIX + template, api.handler(handler), shape)
    app.on_startup(api.startup)
    app.on_stopping(api.stopping)
    app.on_shutdown(api.shutdown)
    return api


def thread_error(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's error shape, with the fields a ThreadError adds to the error object."""
    body = error_body(exc.error)
    if isinstance(exc, ThreadError):
        body["error"].update(exc.extra)
    return body


def continue_error(exc: GatewayError) -> frames.Frame:
    """A continue request's error answer: the error frame's object (seed 002), which is an OpenAI
    error body with two more fields."""
    return frames.error(exc.error, **(exc.extra if isinstance(exc, ThreadError) else {}))


@dataclass(frozen=True, slots=True)
class Request:
    """One request to a thread route, with what every handler needs."""

    scope: Scope
    receive: Receive
    send: Send
    service: ThreadService
    owner: str
    thread_id: str
    headers: dict[str, str]
    fields: dict[str, Any]

    def param(self, name: str) -> str:
        """A parameter of the route's path (`message_id`, `attachment_id`)."""
        value: str = self.scope["path_params"][name]
        return value


# What serves one thread route.
Serve = Callable[[Request], Awaitable[int]]


class ThreadsAPI:
    def __init__(self, app: Host, service: ThreadService) -> None:
        self.max_body_bytes = app.config.server.max_body_bytes
        self._service = service
        # The service while its store is open (None: a 503).
        self.service: ThreadService | None = None

    async def startup(self) -> None:
        store = self._service.store
        await store.open()
        self.service = self._service
        log.info("thread store open", extra={"fields": {"store": store.dialect}})

    def stopping(self) -> None:
        # A continuation gets the grace period every open response gets to finish (a drain);
        # one still running just before the server cancels the open responses ends then, its
        # client told (503 server_shutting_down) and its lease given back, rather than be cut
        # without a word.
        if self.service is not None:
            delay = max(GRACEFUL_STOP_SECONDS - _ABORT_BEFORE_CUT, 0.0)
            asyncio.get_running_loop().call_later(delay, self._abort_running)

    def _abort_running(self) -> None:
        if self.service is not None:
            self.service.abort_running()

    async def shutdown(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            await service.shutdown()
            await service.store.close()

    def routes(self) -> list[tuple[str, str, Serve]]:
        """(method, template under PREFIX, handler of a Request)."""
        return [
            ("POST", "", self._create),
            ("GET", "", self._list),
            ("GET", "/{thread_id}", self._get),
            ("POST", "/{thread_id}", self._update),
            ("DELETE", "/{thread_id}", self._delete),
            ("POST", "/{thread_id}/messages", self._post_messages),
            ("GET", "/{thread_id}/messages", self._list_messages),
            ("GET", "/{thread_id}/messages/{message_id}", self._get_message),
            ("GET", "/{thread_id}/attachments/{attachment_id}", self._attachment),
            ("POST", "/{thread_id}/continue", self._continue),
            ("POST", "/{thread_id}/cancel", self._cancel),
        ]

    def handler(self, serve: Serve) -> Handler:
        """The app's handler for a thread route: `serve` gets the Request once the store is open
        (a 503 before)."""

        async def handle(
            scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
        ) -> int:
            service = self.service
            if service is None:
                raise _STORE_CLOSED
            params: dict[str, str] = scope.get("path_params") or {}
            thread_id = params.get("thread_id", "")
            if thread_id:
                fields["thread_id"] = thread_id
            owner = owner_of(scope)
            request = Request(
                scope, receive, send, service, owner, thread_id, {"x-request-id": rid}, fields
            )
            return await serve(request)

        return handle

    # Handlers

    async def _json(self, r: Request, *, empty: Any = None) -> Any:
        return await read_json(r.scope, r.receive, self.max_body_bytes, empty=empty)

    async def _create(self, r: Request) -> int:
        body = await self._json(r, empty={})
        thread = await r.service.create(r.owner, body)
        r.fields["thread_id"] = thread["id"]
        await send_json(r.send, 200, thread, r.headers)
        return 200

    async def _list(self, r: Request) -> int:
        await send_json(
            r.send, 200, await r.service.list_threads(r.owner, query_params(r.scope)), r.headers
        )
        return 200

    async def _get(self, r: Request) -> int:
        await send_json(r.send, 200, await r.service.get(r.owner, r.thread_id), r.headers)
        return 200

    async def _update(self, r: Request) -> int:
        body = await self._json(r, empty={})
        await send_json(r.send, 200, await r.service.update(r.owner, r.thread_id, body), r.headers)
        return 200

    async def _delete(self, r: Request) -> int:
        await send_json(r.send, 200, await r.service.delete(r.owner, r.thread_id), r.headers)
        return 200

    async def _post_messages(self, r: Request) -> int:
        content_type = (header(r.scope, b"content-type") or b"").decode("latin-1")
        if content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
            raw = bytes(await read_body(r.scope, r.receive, self.max_body_bytes))
            result = await r.service.post_multipart_message(r.owner, r.thread_id, raw, content_type)
        else:
            body = await self._json(r)
            if body is None:
                raise request_error("The request body is empty: send a message")
            result = await r.service.post_json_messages(r.owner, r.thread_id, body)
        await send_json(r.send, 200, result, r.headers)
        return 200

    async def _list_messages(self, r: Request) -> int:
        result = await r.service.list_messages(r.owner, r.thread_id, query_params(r.scope))
        await send_json(r.send, 200, result, r.headers)
        return 200

    async def _get_message(self, r: Request) -> int:
        await send_json(
            r.send,
            200,
            await r.service.get_message(r.owner, r.thread_id, r.param("message_id")),
            r.headers,
        )
        return 200

    async def _attachment(self, r: Request) -> int:
        media_type, data = await r.service.attachment(
            r.owner, r.thread_id, r.param("attachment_id")
        )
        extra = {
            **r.headers,
            "content-type": media_type,
            "cache-control": "private, max-age=86400",
            # A client's bytes, served from svir's origin: never rendered as a page.
            "x-content-type-options": "nosniff",
            "content-security-policy": "sandbox",
        }
        if not media_type.startswith("image/"):
            extra["content-disposition"] = "attachment"
        await r.send(
            {"type": "http.response.start", "status": 200, "headers": headers_with((), extra)}
        )
        await r.send({"type": "http.response.body", "body": data})
        return 200

    async def _cancel(self, r: Request) -> int:
        await send_json(r.send, 200, await r.service.cancel(r.owner, r.thread_id), r.headers)
        return 200

    async def _continue(self, r: Request) -> int:
        params = parse_continue(await self._json(r, empty={}))
        r.fields["stream"] = params.stream
        early: EarlyStart | None = None
        if params.stream:

            def fail(exc: GatewayError) -> bytes:
                r.fields["error"] = exc.error.code or exc.error.type
                return frames.encode(continue_error(exc))

            early = EarlyStart(
                r.send,
                r.headers,
                first=frames.keepalive,
                ping=frames.keepalive,
                fail=fail,
                relay=lambda _comment: frames.keepalive(),
            )
        ctx = new_call_context(r.scope, r.headers["x-request-id"], "threads", early=early)
        run = r.service.continuation(r.owner, r.thread_id, params, ctx, r.fields)

        async def begun() -> Continuation:
            await run.start()
            return run

        async def work() -> int:
            try:
                if await open_early(begun(), early) is None:
                    return 200  # the started stream ended with the failure
                if run.call is not None:
                    r.headers.update(run.call.headers)
                if early is None:
                    # The answer is the last frame (`done` or `error`), last in its list.
                    last: frames.Frame | None = None
                    status = 200
                    async for batch, code in run.frames():
                        last, status = batch[-1], code
                    assert last is not None
                    await send_json(r.send, status, last, r.headers)
                    return status
                return await _stream(r.send, run.frames(), r.headers, early)
            finally:
                await run.close()

        with UntilDisconnect(r.scope, r.receive):
            return await work()


async def _stream(
    send: Send,
    batches: AsyncIterator[tuple[list[frames.Frame | None], int]],
    headers: dict[str, str],
    early: EarlyStart,
) -> int:
    """The frames as SSE, those of one upstream read in one piece. A failure before the first
    frame is still an HTTP error with its own status, unless the stream started early (its
    upstream silent past the commit deadline); after it, the error is the stream's last frame."""

    ended = False  # the piece just given ends with the stream's last frame

    def piece(batch: list[frames.Frame | None]) -> bytes:
        nonlocal ended
        ended = frames.is_last(batch[-1])
        return frames.encode_all(batch)

    def last(_data: bytes) -> bool:
        # The last piece goes out with the response's end, in one write.
        return ended

    async def rest() -> AsyncIterator[bytes]:
        async for batch, _ in batches:
            yield piece(batch)

    if early.started:
        await early.stream(rest(), last=last)
        return 200
    first: list[frames.Frame | None] = []
    status = 200
    while not first:
        item = await anext(batches, None)
        if item is None:
            raise RuntimeError("the continuation produced no frame")
        first, status = item
        while first and first[0] is None:
            first = first[1:]  # no keep-alive before the first frame
    frame = first[0]
    assert frame is not None
    if frame["type"] == "error":
        await send_json(send, status, frame, headers)
        async for _ in batches:
            pass
        return status

    async def body() -> AsyncIterator[bytes]:
        yield piece(first)
        async for data in rest():
            yield data

    await early.stream(body(), last=last)
    return 200
