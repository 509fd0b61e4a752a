"""The ASGI app: the route table front ends install themselves on (svir.protocols), the guards
run before every request, the lifespan hooks, `GET /healthz`, and the one error mapper.

Every response carries `x-request-id`, and every log line of a request carries it too.

What a web page may make a browser send is checked first, for every route (svir.edges.browsers):
a refused Origin or Host is answered 403 before any guard runs, an allowed origin's CORS
preflight 204, and an admin write a form could have sent is refused after the guards.

Every error is answered here, for every front end, in the shape its route registered
(svir.protocols.router; OpenAI's `{"error": {...}}` unless it says otherwise): what a handler
raises as the client's mistake (a GatewayError, a request the shared checks refused, a body that is
not JSON or over its limit, a client gone before its body came), a path no route has (404) or a
method its routes do not take (405), and any other exception, which is svir's own failure: logged
once with its traceback and the request id, and answered as a JSON 500 while the response has not
started (once it has, the connection is closed).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from svir import __version__
from svir.asgi import (
    EXCHANGE,
    SERVER_STOPPING,
    Exchange,
    Receive,
    Response,
    Scope,
    Send,
    header,
    server_extension,
)
from svir.config.model import Config
from svir.edges.browsers import BrowserGuard, check_admin_write, is_admin_write, with_headers
from svir.edges.upstream import UpstreamClient
from svir.errors import (
    BadRequest,
    BodyTooLarge,
    ClientGone,
    GatewayError,
    body_too_large,
    invalid_request,
    request_error,
)
from svir.log import hide_in_logs, log_request, now_ms, request_id_var
from svir.observers import Observer, RequestEnded
from svir.policy.catalog import Catalog
from svir.policy.gateway import Gateway
from svir.policy.resilience import Timing
from svir.policy.routing import Router
from svir.protocols.http import request_id_of, send_json
from svir.protocols.router import ErrorShape, Hook, Routes, Tap
from svir.transport import Transport
from svir.wire.classify import ClientError
from svir.wire.jsonbody import BadJSON

F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P")


def _coroutine_function(func: F) -> F:
    """`func`, which returns a coroutine, marked as a coroutine function (`async def`) for
    `inspect.iscoroutinefunction` (3.12+) and `asyncio.iscoroutinefunction` (3.11)."""
    if sys.version_info >= (3, 12):
        return inspect.markcoroutinefunction(func)
    func._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
    return func


log = logging.getLogger("svir.access")
failures = logging.getLogger("svir.app")

# `/healthz?verbose=1`: the operator's view (svir.keys guards it as it guards /metrics).
VERBOSE = b"verbose=1"
INTERNAL_ERROR = GatewayError(
    ClientError(500, "server_error", "internal_error", "svir failed on this request.")
)
# Runs before every request's handler (svir.keys: auth, metrics, tracing): it may refuse the
# request by raising GatewayError, and may return a callback that gets the request's log fields
# (status and duration set) once the request ends.
Guard = Callable[[Scope, dict[str, Any]], Awaitable[Callable[[dict[str, Any]], None] | None]]


class App:
    """svir's ASGI app. Front ends add routes to `routes` (each with the shape of its error
    answers), guards, and start-up and shut-down hooks; a handler gets the request id and the log
    fields to fill, and may raise what the module doc lists."""

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
        # What a web page may make svir do through a browser (svir.edges.browsers): read at
        # start, as the other [server] fields are.
        self.browsers = BrowserGuard(config.server, environ)
        self.secrets: tuple[str, ...] = ()
        self.take_secrets(config)
        # The upstream client unless one is injected (a MockTransport in tests), and
        # the policy's sleep, randomness and clock unless given (a test's own).
        self.gateway = Gateway(config, environ, transport or UpstreamClient(), timing=timing)
        # What is true of each model as svir serves it (`/api/show`, `/v1/models`, num_ctx).
        self.catalog = Catalog(
            self.gateway.router, clock=timing.clock if timing is not None else time.monotonic
        )
        self.ready = False
        self.routes = Routes()
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = [self.gateway.close]
        self._stopping: list[Callable[[], None]] = []
        self._guards: list[Guard] = []
        # What serves the requests of the routes it captures (svir.console.capture, when
        # `[capture]` is on): composed in once the app is built (`compose`).
        self._capture: Tap | None = None
        # More state for `/healthz?verbose=1`, from what front ends and supervisors install.
        self.health_extras: list[Callable[[], dict[str, Any]]] = []
        # Which models a request may see listed (svir.keys: the key's models).
        self.model_filters: list[Callable[[Scope, str], bool]] = []
        # The config reload's state (svir.edges.reload installs it): `reload_status()`.
        self.reload_state: Callable[[], dict[str, Any]] | None = None
        # What an installer left here to be found again by its type (`part`): the app's own, not
        # a registry of the process's that a second app would share.
        self._parts: dict[type, object] = {}
        self.routes.add("GET", "/healthz", self.healthz)

    @property
    def router(self) -> Router:
        return self.gateway.router

    async def models(self, scope: Scope) -> list[tuple[str, str]]:
        """(model, provider) for every model the request `scope` may see, for model lists."""
        models = await self.gateway.router.models()
        if not self.model_filters:
            return models
        return [m for m in models if all(allowed(scope, m[0]) for allowed in self.model_filters)]

    def reload_status(self) -> dict[str, Any] | None:
        """The config reload's state (svir.edges.reload: source, generation, last attempt and
        success, error, what changed, what needs a restart), or None when nothing reloads."""
        return self.reload_state() if self.reload_state is not None else None

    def add_part(self, part: object) -> None:
        """Keep `part` (one of its type) on this app, for `part(type(part))`."""
        self._parts[type(part)] = part

    def part(self, kind: type[P]) -> P:
        """The part of type `kind` an installer added (KeyError when none was)."""
        found = self._parts[kind]
        assert isinstance(found, kind)
        return found

    def compose(self, observers: Iterable[Observer], capture: Tap | None = None) -> None:
        """The pipeline's parts that watch or tee every request, whatever was installed when:
        `observers` told of every request, call and attempt in this order (svir.observers), and
        `capture` serving the requests of the routes it captures. Said once, by the app's
        builder (svir.server.build_app)."""
        self.gateway.observers.compose(observers)
        self._capture = capture

    def take_secrets(self, config: Config) -> None:
        """Keep the secrets `config` names out of every log line from now on (the log is the
        process's), and out of what this app's console shows (`secrets`); a reload calls it
        with the new config (svir.edges.reload), whatever gets installed."""
        self.secrets = config.secrets(self.environ)
        hide_in_logs(*self.secrets)

    def add_guard(self, guard: Guard) -> None:
        """Run `guard` before every request, in the order added (see `Guard`)."""
        self._guards.append(guard)

    def on_startup(self, hook: Hook) -> None:
        self._startup.append(hook)

    def on_shutdown(self, hook: Hook) -> None:
        self._shutdown.insert(0, hook)

    def on_stopping(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the server starts to stop, before it waits for the open responses
        (a response that lasts as long as its reader should end then); at most once."""
        self._stopping.append(hook)

    def stopping(self) -> None:
        """The server stops: run the `on_stopping` hooks (once, however often it is said)."""
        hooks, self._stopping = self._stopping, []
        for hook in hooks:
            try:
                hook()
            except Exception:
                failures.exception("a stopping hook failed")

    @_coroutine_function
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The request's or the lifespan's coroutine. Not a coroutine itself: what it gives is
        awaited directly by the server, one coroutine level fewer that every chunk of a stream
        resumes; marked as one, for the servers that ask whether the app is ASGI 3."""
        kind = scope["type"]
        if kind == "http":
            return self.http(scope, receive, send)
        if kind == "lifespan":
            return self.lifespan(scope, receive, send)
        return _ignored()

    async def lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        if state is not None:  # the server's connections see it (svir.asgi.SERVER_STOPPING)
            state[SERVER_STOPPING] = self.stopping
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
        route = self.routes.match(scope)
        # What the guards and the handler note about the request (svir.asgi.Exchange).
        noted = Exchange(route.template)
        extensions = scope.get("extensions")
        if extensions is None:
            extensions = scope["extensions"] = {}
        extensions[EXCHANGE] = noted
        shape = route.errors
        # Whether (and with which status) the response started (`_answer` reads it), and svir's
        # own server's piece sender for the handler's streams.
        server = server_extension(scope)
        response = Response(send, server.send_piece if server is not None else None)
        afters: list[Callable[[dict[str, Any]], None]] = []
        try:
            try:
                # Before the guards: a refused page's request reaches nothing (svir.edges.browsers).
                cors = self.browsers.check(scope)
                if cors is not None and _is_preflight(scope):
                    # Answered before the key guard: a preflight carries no key.
                    status = await _preflight(response, self.browsers.preflight(scope, cors), rid)
                else:
                    if cors is not None:
                        response = Response(with_headers(send, cors))
                    for guard in self._guards:
                        after = await guard(scope, fields)
                        if after is not None:
                            afters.append(after)
                    if is_admin_write(method, path):
                        check_admin_write(scope)
                    capture = self._capture
                    if capture is not None and capture.captures(route):
                        status = await capture.serve(
                            route.handler, scope, receive, response, rid=rid, fields=fields
                        )
                    else:
                        status = await route.handler(scope, receive, response, rid, fields)
            except Exception as exc:
                status = await _answer_failure(
                    response, shape, exc, rid, fields, method=method, path=path
                )
            fields["status"] = status
        finally:
            # The one place the log fields about the request's chat call are written.
            ctx = noted.call
            if ctx is not None:
                ctx.log_into(fields)
            fields["duration_ms"] = now_ms(started)
            for after in reversed(afters):
                try:
                    after(fields)
                except Exception:
                    log.exception("request guard failed after the request")
            # Told after the guards' callbacks, before the access line: what needs nothing
            # before the handler (the metrics) is not a guard, whose await and callback each
            # request would pay.
            observers = self.gateway.observers
            if observers:
                observers.ended(RequestEnded(noted.route, method, fields, ctx))
            log_request(fields, rid)
            request_id_var.reset(token)
            # uvicorn keeps a connection's last scope until its next request: not the call's
            # context and what it reaches (1 KB an idle connection).
            extensions.pop(EXCHANGE, None)

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


def _is_preflight(scope: Scope) -> bool:
    """Whether the request is a CORS preflight (its Origin is checked by the caller)."""
    return scope["method"] == "OPTIONS" and (
        header(scope, b"access-control-request-method") is not None
    )


async def _preflight(send: Send, headers: Iterable[tuple[bytes, bytes]], rid: str) -> int:
    """Answer an allowed origin's preflight: 204 with `headers` (svir.edges.browsers)."""
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [(b"x-request-id", rid.encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": b""})
    return 204


async def _ignored() -> None:
    """What a scope svir does not serve (a websocket's) gets."""


async def _answer_failure(
    response: Response,
    shape: ErrorShape,
    exc: Exception,
    rid: str,
    fields: dict[str, Any],
    *,
    method: str,
    path: str,
) -> int:
    """Answer the request whose handling raised `exc` (its client gone: 499, nothing sent); the
    status. Called while `exc` is handled, so that svir's own failure is logged with it."""
    if isinstance(exc, GatewayError):
        return await _answer(response, shape, exc, rid, fields)
    if isinstance(exc, BadRequest):
        return await _answer(response, shape, invalid_request(exc), rid, fields)
    if isinstance(exc, BadJSON):
        error = request_error(exc.message, code=exc.code)
        return await _answer(response, shape, error, rid, fields)
    if isinstance(exc, BodyTooLarge):
        return await _answer(response, shape, body_too_large(exc.limit), rid, fields)
    if isinstance(exc, ClientGone):
        return 499
    # Bad input is answered above: this is svir's own failure, and svir goes on.
    failures.exception("unexpected failure", extra={"fields": {"method": method, "path": path}})
    return await _answer(response, shape, INTERNAL_ERROR, rid, fields, logged=True)


async def _answer(
    response: Response,
    shape: ErrorShape,
    error: GatewayError,
    rid: str,
    fields: dict[str, Any],
    *,
    logged: bool = False,
) -> int:
    """Answer `error` in `shape` (noted in the request's log `fields`), unless the response has
    started: then nothing more can be said, and the connection is left to close (said once in
    the log, unless `logged`)."""
    ce = error.error
    fields["error"] = ce.code or ce.type
    status = response.status
    if status is not None:
        if not logged:
            failures.error(
                "the request failed after its response started",
                extra={"fields": {"error": ce.message}},
            )
        return status
    await send_json(response, ce.status, shape(error), {"x-request-id": rid, **ce.headers})
    return ce.status
