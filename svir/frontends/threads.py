"""The HTTP edge of /v1/threads (see docs/threads.md).

    POST   /v1/threads                                  create
    GET    /v1/threads                                  the caller's threads, paginated
    GET    /v1/threads/{id}                             a thread with its messages
    POST   /v1/threads/{id}                             change model, system or metadata
    DELETE /v1/threads/{id}                             delete
    POST   /v1/threads/{id}/messages                    append (JSON, or a multipart upload)
    GET    /v1/threads/{id}/messages                    messages, paginated
    GET    /v1/threads/{id}/messages/{message_id}       one message
    GET    /v1/threads/{id}/attachments/{attachment_id} an attachment's bytes
    POST   /v1/threads/{id}/continue                    the model's next turn, as frames
    POST   /v1/threads/{id}/cancel                      cancel the running continuation

A thread belongs to the bearer token that created it (its SHA-256; no token is one fixed
anonymous owner); any other token gets 404 for it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from svir.edges.app import App, call_fields, send_stream, until_disconnect
from svir.edges.asgi import (
    Receive,
    Scope,
    Send,
    header,
    headers_with,
    read_body,
    send_json,
)
from svir.errors import GatewayError, ThreadError, request_error
from svir.store import Store, default_url, make_store
from svir.threads import frames
from svir.threads.service import ThreadService, parse_continue
from svir.wire.classify import ClientError, error_body
from svir.wire.jsonbody import decode_body

__all__ = ["ANONYMOUS", "ThreadsAPI", "install", "owner_of"]

log = logging.getLogger("svir.threads")

PREFIX: Final = "/v1/threads"
ANONYMOUS: Final = "anonymous"


def install(app: App) -> None:
    """Serve /v1/threads on `app`: the routes, and the store opened at start-up and closed at
    shut-down."""
    api = ThreadsAPI(app)
    app.mount(PREFIX, api.handle)
    app.on_startup(api.startup)
    app.on_shutdown(api.shutdown)


def owner_of(scope: Scope) -> str:
    """Who owns what this request creates: the SHA-256 of its bearer token (the token itself is
    never stored), or ANONYMOUS without one."""
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


@dataclass(frozen=True, slots=True)
class Request:
    """One request to a thread route, with what every handler needs."""

    scope: Scope
    receive: Receive
    send: Send
    service: ThreadService
    owner: str
    parts: list[str]
    headers: dict[str, str]
    fields: dict[str, Any]


class ThreadsAPI:
    def __init__(self, app: App) -> None:
        self.app = app
        self.store: Store | None = None
        self.service: ThreadService | None = None

    async def startup(self) -> None:
        config = self.app.config.store
        store = make_store(config.url or default_url(self.app.environ))
        await store.open()
        self.store = store
        self.service = ThreadService(store, self.app.gateway, config)
        log.info("thread store open", extra={"fields": {"store": store.dialect}})

    async def shutdown(self) -> None:
        if self.service is not None:
            await self.service.shutdown()
        if self.store is not None:
            store, self.store, self.service = self.store, None, None
            await store.close()

    # Routing

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        headers = {"x-request-id": rid}
        path: str = scope["path"]
        rest = path[len(PREFIX) :]
        if rest and not rest.startswith("/"):
            return await _error(send, _no_route(path), headers)
        parts = [p for p in rest.split("/") if p]
        method: str = scope["method"]
        service = self.service
        if service is None:
            error = GatewayError(
                ClientError(
                    503, "server_error", "store_unavailable", "The thread store is not open."
                )
            )
            return await _error(send, error, headers)
        owner = owner_of(scope)
        if parts:
            fields["thread_id"] = parts[0]
        try:
            route = self._route(method, parts)
            if route is None:
                allowed = self._route_exists(parts)
                if allowed:
                    error = request_error(
                        "Method not allowed", status=405, code="method_not_allowed"
                    )
                    return await _error(send, error, headers)
                return await _error(send, _no_route(path), headers)
            return await route(
                Request(scope, receive, send, service, owner, parts, headers, fields)
            )
        except ThreadError as exc:
            # The other errors, and svir's own failures, are answered by the app (svir.edges.app).
            fields["error"] = exc.error.code or exc.error.type
            return await _error(send, exc, headers, exc.extra)

    _Route = Callable[[Request], Awaitable[int]]

    def _route(self, method: str, parts: list[str]) -> _Route | None:
        n = len(parts)
        table: dict[tuple[str, int, str | None], ThreadsAPI._Route] = {
            ("POST", 0, None): self._create,
            ("GET", 0, None): self._list,
            ("GET", 1, None): self._get,
            ("POST", 1, None): self._update,
            ("DELETE", 1, None): self._delete,
            ("POST", 2, "messages"): self._post_messages,
            ("GET", 2, "messages"): self._list_messages,
            ("GET", 3, "messages"): self._get_message,
            ("GET", 3, "attachments"): self._attachment,
            ("POST", 2, "continue"): self._continue,
            ("POST", 2, "cancel"): self._cancel,
        }
        return table.get((method, n, parts[1] if n >= 2 else None))

    @staticmethod
    def _route_exists(parts: list[str]) -> bool:
        n = len(parts)
        if n <= 1:
            return True
        return (n, parts[1]) in {
            (2, "messages"),
            (3, "messages"),
            (3, "attachments"),
            (2, "continue"),
            (2, "cancel"),
        }

    # Handlers

    async def _body(self, scope: Scope, receive: Receive) -> bytes | bytearray:
        return await read_body(
            receive, self.app.config.server.max_body_bytes, header(scope, b"content-length")
        )

    async def _json(self, scope: Scope, receive: Receive, *, empty: Any = None) -> Any:
        raw = await self._body(scope, receive)
        if not raw.strip():
            return empty
        return decode_body(raw)

    async def _create(self, r: Request) -> int:
        body = await self._json(r.scope, r.receive, empty={})
        thread = await r.service.create(r.owner, body)
        r.fields["thread_id"] = thread["id"]
        await send_json(r.send, 200, thread, r.headers)
        return 200

    async def _list(self, r: Request) -> int:
        await send_json(
            r.send, 200, await r.service.list_threads(r.owner, _query(r.scope)), r.headers
        )
        return 200

    async def _get(self, r: Request) -> int:
        await send_json(r.send, 200, await r.service.get(r.owner, r.parts[0]), r.headers)
        return 200

    async def _update(self, r: Request) -> int:
        body = await self._json(r.scope, r.receive, empty={})
        await send_json(r.send, 200, await r.service.update(r.owner, r.parts[0], body), r.headers)
        return 200

    async def _delete(self, r: Request) -> int:
        await send_json(r.send, 200, await r.service.delete(r.owner, r.parts[0]), r.headers)
        return 200

    async def _post_messages(self, r: Request) -> int:
        content_type = (header(r.scope, b"content-type") or b"").decode("latin-1")
        if content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
            raw = bytes(await self._body(r.scope, r.receive))
            result = await r.service.post_multipart_message(r.owner, r.parts[0], raw, content_type)
        else:
            body = await self._json(r.scope, r.receive)
            if body is None:
                raise request_error("The request body is empty: send a message")
            result = await r.service.post_json_messages(r.owner, r.parts[0], body)
        await send_json(r.send, 200, result, r.headers)
        return 200

    async def _list_messages(self, r: Request) -> int:
        result = await r.service.list_messages(r.owner, r.parts[0], _query(r.scope))
        await send_json(r.send, 200, result, r.headers)
        return 200

    async def _get_message(self, r: Request) -> int:
        await send_json(
            r.send, 200, await r.service.get_message(r.owner, r.parts[0], r.parts[2]), r.headers
        )
        return 200

    async def _attachment(self, r: Request) -> int:
        media_type, data = await r.service.attachment(r.owner, r.parts[0], r.parts[2])
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
        await send_json(r.send, 200, await r.service.cancel(r.owner, r.parts[0]), r.headers)
        return 200

    async def _continue(self, r: Request) -> int:
        params = parse_continue(await self._json(r.scope, r.receive, empty={}))
        r.fields["stream"] = params.stream
        run = r.service.continuation(
            r.owner, r.parts[0], params, r.headers["x-request-id"], r.fields
        )

        async def work() -> int:
            try:
                await run.start()
                if run.call is not None:
                    r.headers.update(run.call.headers)
                if not params.stream:
                    last: frames.Frame | None = None
                    status = 200
                    async for frame, code in run.frames():
                        if frame is not None:
                            last, status = frame, code
                    assert last is not None
                    await send_json(r.send, status, last, r.headers)
                    return status
                return await _stream(r.send, run.frames(), r.headers)
            finally:
                await run.close()
                if run.call is not None:
                    call_fields(run.call, r.fields)

        try:
            return await until_disconnect(r.receive, work())
        except ThreadError as exc:
            r.fields["error"] = exc.error.code or exc.error.type
            return await _error(r.send, exc, r.headers, exc.extra, frame=True)
        except GatewayError as exc:
            r.fields["error"] = exc.error.code or exc.error.type
            return await _error(r.send, exc, r.headers, frame=True)


async def _stream(
    send: Send, items: AsyncIterator[tuple[frames.Frame | None, int]], headers: dict[str, str]
) -> int:
    """The frames as SSE. A failure before the first frame is still an HTTP error with its own
    status; after it, the error is the stream's last frame."""
    first = await anext(items, None)
    while first is not None and first[0] is None:
        first = await anext(items, None)  # no keep-alive before the first frame
    if first is None:
        raise RuntimeError("the continuation produced no frame")
    frame, status = first
    assert frame is not None
    if frame["type"] == "error":
        await send_json(send, status, frame, headers)
        async for _ in items:
            pass
        return status

    async def body() -> AsyncIterator[bytes]:
        yield frames.encode(frame)
        async for item, _ in items:
            yield frames.keepalive() if item is None else frames.encode(item)

    await send_stream(send, body(), headers)
    return 200


def _query(scope: Scope) -> dict[str, str]:
    raw: bytes = scope.get("query_string") or b""
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


def _no_route(path: str) -> GatewayError:
    return request_error(f"No route {path}", status=404, code="not_found")


async def _error(
    send: Send,
    error: GatewayError,
    headers: dict[str, str],
    extra: dict[str, Any] | None = None,
    *,
    frame: bool = False,
) -> int:
    ce = error.error
    if frame:
        # A continue request answers every error with the error frame's object (seed 002), which
        # is an OpenAI error body with two more fields.
        body: dict[str, Any] = frames.error(ce, **(extra or {}))
    else:
        body = error_body(ce)
        body["error"].update(extra or {})
    await send_json(send, ce.status, body, {**headers, **ce.headers})
    return ce.status
