"""The ASGI application: svir's HTTP routes over the router and the chat core.

Routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /healthz`. Every response carries
`x-request-id`, and every log line of a request carries it too. A client that disconnects stops
its upstream request at once.

Every error is answered here, for every front end, in the shape that front end registered with
its routes (OpenAI's `{"error": {...}}` unless it says otherwise): what a handler raises as the
client's mistake (a GatewayError, a request the shared checks refused, a body that is not JSON
or over `max_body_bytes`, a client gone before its body came), and any other exception, which is
svir's own failure: logged once with its traceback and the request id, and answered as a JSON
500 while the response has not started (once it has, the connection is closed).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from svir import __version__
from svir.call import CallContext
from svir.chat import unique_id
from svir.config import Config
from svir.edges.asgi import (
    CALL_CONTEXT,
    SSE_HEADERS,
    Message,
    Receive,
    Scope,
    Send,
    header,
    headers_with,
    read_body,
    send_json,
)
from svir.edges.upstream import UpstreamClient
from svir.errors import (
    BodyTooLarge,
    ClientGone,
    GatewayError,
    RequestError,
    body_too_large,
    invalid_request,
    request_error,
)
from svir.gateway import Gateway
from svir.keys.context import current_key
from svir.log import log_request, request_id_var
from svir.policy.resilience import Timing
from svir.policy.routing import Router
from svir.providers import validate_chat_request
from svir.transport import Transport
from svir.wire.blobs import MIN_BLOB, Blobs, extract_blobs, new_token
from svir.wire.classify import ClientError, error_body
from svir.wire.jsonbody import BadJSON, decode_body

log = logging.getLogger("svir.access")
failures = logging.getLogger("svir.app")

_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
# `/healthz?verbose=1`: the operator's view (svir.keys guards it as it guards /metrics).
VERBOSE = b"verbose=1"
CREATED = 1700000000  # /v1/models needs a `created`; svir does not know when a model was made


def request_id_of(scope: Scope) -> str:
    """The client's request id when it is sane, else a new one."""
    given = header(scope, b"x-request-id")
    if given is not None and _SANE_REQUEST_ID.fullmatch(given):
        return given.decode()
    return unique_id()


Handler = Callable[[Scope, Receive, Send, str, dict[str, Any]], Awaitable[int]]
# The body of an error answer in a front end's own shape, from the error.
ErrorShape = Callable[[ClientError], Any]
INTERNAL_ERROR = ClientError(500, "server_error", "internal_error", "svir failed on this request.")
Hook = Callable[[], Awaitable[None]]
# Runs before every request's handler (svir.keys: auth, metrics, tracing): it may refuse the
# request by raising GatewayError, and may return a callback that gets the request's log fields
# (status and duration set) once the request ends.
Guard = Callable[[Scope, dict[str, Any]], Awaitable[Callable[[dict[str, Any]], None] | None]]


class App:
    """svir's ASGI app. Front ends add routes (exact paths) or mounts (path prefixes), each with
    the shape of its error answers, and start-up and shut-down hooks; a handler gets the request
    id and the log fields to fill, and may raise what the module doc lists."""

    def __init__(
        self,
        config: Config,
        environ: Mapping[str, str],
        *,
        transport: Transport | None = None,
        timing: Timing | None = None,
    ) -> None:
        self.config = config
        self.environ = environ
        # Whatever gets installed: no log line of this app repeats a key its config names.
        config.hide_secrets(environ)
        # The upstream client unless one is injected (svir.testing.MockTransport in tests), and
        # the policy's sleep, randomness and clock unless given (a test's own).
        self.gateway = Gateway(config, environ, transport or UpstreamClient(), timing=timing)
        self.ready = False
        self._routes: dict[tuple[str, str], tuple[Handler, ErrorShape]] = {}
        self._paths: set[str] = set()
        self._mounts: list[tuple[str, Handler, ErrorShape]] = []
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = [self.gateway.close]
        self._guards: list[Guard] = []
        # More state for `/healthz?verbose=1`, from what front ends and supervisors install.
        self.health_extras: list[Callable[[], dict[str, Any]]] = []
        # Which models the current request may see listed (svir.keys: the key's models).
        self.model_filters: list[Callable[[str], bool]] = []
        self.add_route("POST", "/v1/chat/completions", self.chat_completions)
        self.add_route("GET", "/v1/models", self.list_models)
        self.add_route("GET", "/healthz", self.healthz)

    @property
    def router(self) -> Router:
        return self.gateway.router

    async def models(self) -> list[tuple[str, str]]:
        """(model, provider) for every model the current request may see, for model lists."""
        models = await self.gateway.router.models()
        if not self.model_filters:
            return models
        return [m for m in models if all(allowed(m[0]) for allowed in self.model_filters)]

    def add_route(
        self, method: str, path: str, handler: Handler, errors: ErrorShape = error_body
    ) -> None:
        """Serve `method path` with `handler`; its errors are answered as `errors` shapes them."""
        self._routes[(method, path)] = (handler, errors)
        self._paths.add(path)

    def mount(self, prefix: str, handler: Handler, errors: ErrorShape = error_body) -> None:
        """Send every request whose path starts with `prefix` to `handler` (errors as in
        `add_route`)."""
        self._mounts.append((prefix, handler, errors))

    def call_context(
        self, scope: Scope, rid: str, api: str, blobs: Blobs | None = None
    ) -> CallContext:
        """The context of the chat call a handler makes for this request (one per request), from
        the front end `api` ("openai", "ollama", "threads", ...); the request's log fields
        about the call are written from it when the request ends."""
        ctx = CallContext(rid, api, current_key(), blobs)
        scope[CALL_CONTEXT] = ctx
        return ctx

    def add_guard(self, guard: Guard) -> None:
        """Run `guard` before every request, in the order added (see `Guard`)."""
        self._guards.append(guard)

    def on_startup(self, hook: Hook) -> None:
        self._startup.append(hook)

    def on_shutdown(self, hook: Hook) -> None:
        self._shutdown.insert(0, hook)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for hook in self._startup:
                        await hook()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                self.ready = True
                # What start-up built lives as long as the process: out of the collector's way.
                gc.collect()
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                for hook in self._shutdown:
                    try:
                        await hook()
                    except Exception:
                        log.exception("shut-down hook failed")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id_of(scope)
        token = request_id_var.set(rid)
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        fields: dict[str, Any] = {"method": method, "path": path}
        handler: Handler | None
        shape: ErrorShape = error_body
        found = self._routes.get((method, path))
        if found is not None:
            handler, shape = found
            scope["svir.route"] = path
        else:
            handler = None
            scope["svir.route"] = None
            for prefix, mounted, errors in self._mounts:
                if path.startswith(prefix):
                    handler, shape = mounted, errors
                    scope["svir.route"] = prefix
                    break
        response = _Response(send)
        afters: list[Callable[[dict[str, Any]], None]] = []
        try:
            try:
                for guard in self._guards:
                    after = await guard(scope, fields)
                    if after is not None:
                        afters.append(after)
                if handler is None:
                    not_allowed = path in self._paths
                    error = request_error(
                        "Method not allowed" if not_allowed else f"No route {path}",
                        status=405 if not_allowed else 404,
                    ).error
                    status = await _answer(response, shape, error, rid, None)
                else:
                    status = await handler(scope, receive, response, rid, fields)
            except GatewayError as exc:
                status = await _answer(response, shape, exc.error, rid, fields)
            except RequestError as exc:
                status = await _answer(response, shape, invalid_request(exc).error, rid, fields)
            except BadJSON as exc:
                error = request_error(exc.message, code=exc.code).error
                status = await _answer(response, shape, error, rid, fields)
            except BodyTooLarge:
                error = body_too_large(self.config.server.max_body_bytes).error
                status = await _answer(response, shape, error, rid, fields)
            except ClientGone:
                status = 499
            except Exception:
                # Bad input is answered above: this is svir's own failure, and svir goes on.
                failures.exception(
                    "unexpected failure", extra={"fields": {"method": method, "path": path}}
                )
                status = await _answer(response, shape, INTERNAL_ERROR, rid, fields, logged=True)
            fields["status"] = status
        finally:
            ctx: CallContext | None = scope.get(CALL_CONTEXT)
            if ctx is not None:
                ctx.log_into(fields)
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 2)
            for after in reversed(afters):
                try:
                    after(fields)
                except Exception:
                    log.exception("request guard failed after the request")
            log_request(fields, rid)
            request_id_var.reset(token)

    async def healthz(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        status = 200 if self.ready else 503
        body: dict[str, Any] = {
            "status": "ok" if self.ready else "starting",
            "version": __version__,
        }
        if VERBOSE in scope.get("query_string", b"").split(b"&"):
            # With several workers, the state below is this worker's.
            body["pid"] = os.getpid()
            body.update(self.gateway.policy.snapshot())
            for extra in self.health_extras:
                body.update(extra())
        await send_json(send, status, body, {"x-request-id": rid})
        return status

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.models()
        data = [
            {"id": model, "object": "model", "created": CREATED, "owned_by": owner}
            for model, owner in models
        ]
        await send_json(send, 200, {"object": "list", "data": data}, {"x-request-id": rid})
        return 200

    async def chat_completions(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        raw = await read_body(
            receive, self.config.server.max_body_bytes, header(scope, b"content-length")
        )
        # Large image data stays in `raw` and is spliced into the upstream body (§2.3).
        blobs: Blobs | None = None
        skeleton = raw
        if len(raw) >= MIN_BLOB:
            skeleton, blobs = extract_blobs(raw, new_token(os.urandom(15)))
        request = validate_chat_request(decode_body(skeleton))
        del skeleton
        fields["stream"] = bool(request.get("stream"))
        ctx = self.call_context(scope, rid, "openai", blobs)
        return await until_disconnect(receive, self._serve_chat(request, send, ctx))

    async def _serve_chat(self, request: dict[str, Any], send: Send, ctx: CallContext) -> int:
        headers = {"x-request-id": ctx.request_id}
        call = await self.gateway.open_chat(ctx, request)
        headers.update(call.headers)
        try:
            if not request.get("stream"):
                completion = await call.complete()
                await send_json(send, 200, completion, headers)
                return 200
            stream = call.stream()
            await send_stream(send, stream, headers)
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client


_DONE_FRAME = b"data: [DONE]\n\n"


async def send_stream(send: Send, stream: AsyncIterator[bytes], headers: dict[str, str]) -> None:
    """Send the 200 only with the first bytes: an earlier failure is still an HTTP error.

    A piece that ends with the `[DONE]` frame is the last one: it goes out with the end of the
    response in the same send (one write fewer per stream); the stream is then run to its end.
    """
    first = await anext(stream, None)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": headers_with(SSE_HEADERS, headers),
        }
    )
    if first is not None:
        if first.endswith(_DONE_FRAME):
            await send({"type": "http.response.body", "body": first, "more_body": False})
            await _drain(stream)
            return
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for data in stream:
            if data.endswith(_DONE_FRAME):
                await send({"type": "http.response.body", "body": data, "more_body": False})
                await _drain(stream)
                return
            await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Run a stream whose answer is complete to its end (its bookkeeping runs on the way)."""
    async for _ in stream:
        pass


async def until_disconnect(receive: Receive, work: Awaitable[int]) -> int:
    """Run `work`, cancelling it the moment the client disconnects.

    `work` runs in the calling task (no second task per request): the watcher cancels this task
    when the client goes, and the cancellation is answered here as a 499.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            return 499  # the client went away: nothing is left to answer
        raise
    finally:
        watcher.cancel()


class _Response:
    """A request's `send`, noting the status it started the response with (None: not yet)."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None

    def __call__(self, message: Message) -> Awaitable[None]:
        if self.status is None:  # the first message starts the response
            self.status = message.get("status", 200)
        return self._send(message)


async def _answer(
    response: _Response,
    shape: ErrorShape,
    error: ClientError,
    rid: str,
    fields: dict[str, Any] | None,
    *,
    logged: bool = False,
) -> int:
    """Answer `error` in `shape` (noted in the request's log `fields`), unless the response has
    started: then nothing more can be said, and the connection is left to close (said once in
    the log, unless `logged`)."""
    if fields is not None:
        fields["error"] = error.code or error.type
    if response.status is not None:
        if not logged:
            failures.error(
                "the request failed after its response started",
                extra={"fields": {"error": error.message}},
            )
        return response.status
    await send_json(response, error.status, shape(error), {"x-request-id": rid, **error.headers})
    return error.status
