"""The ASGI application: svir's HTTP routes over the router and the chat core.

Routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /healthz`. Every response carries
`x-request-id`, and every log line of a request carries it too. A client that disconnects stops
its upstream request at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import msgspec

from svir import __version__
from svir.chat import ChatCall, GatewayError, request_error
from svir.config import Config
from svir.edges.asgi import (
    SSE_HEADERS,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    headers_with,
    read_body,
    send_json,
)
from svir.edges.upstream import UpstreamClient
from svir.log import request_id_var
from svir.policy.routing import Router
from svir.providers import RequestError, validate_chat_request
from svir.wire.classify import error_body

log = logging.getLogger("svir.access")

_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_decode = msgspec.json.decode
CREATED = 1700000000  # /v1/models needs a `created`; svir does not know when a model was made


def request_id_of(scope: Scope) -> str:
    """The client's request id when it is sane, else a new one."""
    given = header(scope, b"x-request-id")
    if given is not None and _SANE_REQUEST_ID.fullmatch(given):
        return given.decode()
    return uuid.uuid4().hex


class App:
    """svir's ASGI app."""

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        self.config = config
        self.client = UpstreamClient()
        self.router = Router(config, environ, self.client)
        self.ready = False
        self._routes: dict[tuple[str, str], Callable[..., Awaitable[int]]] = {
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("GET", "/v1/models"): self.list_models,
            ("GET", "/healthz"): self.healthz,
        }
        self._paths = {path for _, path in self._routes}

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
                self.ready = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                await self.client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id_of(scope)
        token = request_id_var.set(rid)
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        fields: dict[str, Any] = {"method": method, "path": path}
        handler = self._routes.get((method, path))
        try:
            if handler is None:
                status = 405 if path in self._paths else 404
                message = "Method not allowed" if status == 405 else f"No route {path}"
                await send_json(
                    send, status, _error(message, "invalid_request_error"), {"x-request-id": rid}
                )
            else:
                status = await handler(scope, receive, send, rid, fields)
            fields["status"] = status
        finally:
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 2)
            log.info("request", extra={"fields": fields, "request_id": rid})
            request_id_var.reset(token)

    async def healthz(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        status = 200 if self.ready else 503
        await send_json(
            send,
            status,
            {"status": "ok" if self.ready else "starting", "version": __version__},
            {"x-request-id": rid},
        )
        return status

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.router.models()
        data = [
            {"id": model, "object": "model", "created": CREATED, "owned_by": owner}
            for model, owner in models
        ]
        await send_json(send, 200, {"object": "list", "data": data}, {"x-request-id": rid})
        return 200

    async def chat_completions(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        headers = {"x-request-id": rid}
        try:
            raw = await read_body(
                receive, self.config.server.max_body_bytes, header(scope, b"content-length")
            )
            try:
                parsed = _decode(raw)
            except msgspec.DecodeError as exc:
                raise request_error(f"The request body is not valid JSON: {exc}") from None
            del raw
            try:
                request = validate_chat_request(parsed)
            except RequestError as exc:
                raise request_error(exc.message, param=exc.param, code=exc.code) from None
            route = self.router.resolve(request["model"])
            fields.update(
                model=request["model"],
                provider=route.provider.name,
                stream=bool(request.get("stream")),
            )
            call = ChatCall(
                self.client, route, request, request_id=rid, model_label=request["model"]
            )
            try:
                return await until_disconnect(
                    receive, self._serve_chat(call, request, send, headers)
                )
            finally:
                _call_fields(call, fields)
        except BodyTooLarge:
            limit = self.config.server.max_body_bytes
            error = request_error(
                f"The request body is larger than the limit of {limit} bytes",
                status=413,
                code="request_too_large",
            )
            return await _send_error(send, error, headers)
        except ClientGone:
            return 499
        except GatewayError as exc:
            fields["error"] = exc.error.code or exc.error.type
            return await _send_error(send, exc, headers)

    async def _serve_chat(
        self, call: ChatCall, request: dict[str, Any], send: Send, headers: dict[str, str]
    ) -> int:
        await call.open()
        if not request.get("stream"):
            completion = await call.complete()
            await send_json(send, 200, completion, headers)
            return 200
        options = request.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        stream = (
            call.relay(include_usage=include_usage)
            if call.route.provider.relay
            else call.stream(include_usage=include_usage)
        )
        await _send_stream(send, stream, headers)
        return 200


async def _send_stream(send: Send, stream: AsyncIterator[bytes], headers: dict[str, str]) -> None:
    """Send the 200 only with the first bytes: an earlier failure is still an HTTP error."""
    first = await anext(stream, None)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": headers_with(SSE_HEADERS, headers),
        }
    )
    if first is not None:
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for data in stream:
            await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def until_disconnect(receive: Receive, work: Awaitable[int]) -> int:
    """Run `work`, cancelling it the moment the client disconnects."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            return 499  # the client went away: nothing is left to answer
        raise
    finally:
        watcher.cancel()


async def _send_error(send: Send, error: GatewayError, headers: dict[str, str]) -> int:
    ce = error.error
    await send_json(send, ce.status, error_body(ce), {**headers, **ce.headers})
    return ce.status


def _error(message: str, type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def _call_fields(call: ChatCall, fields: dict[str, Any]) -> None:
    s = call.stats
    fields["upstream_request_id"] = s.upstream_request_id
    fields["upstream_id"] = s.upstream_id
    fields["finish_reason"] = s.finish_reason
    if s.error_kind:
        fields["error_kind"] = s.error_kind
    if s.first_token_ms is not None:
        fields["ttft_ms"] = s.first_token_ms
    if s.tokens_per_second is not None:
        fields["tokens_per_second"] = round(s.tokens_per_second, 2)
    if s.usage is not None:
        fields["prompt_tokens"] = s.usage.prompt_tokens
        fields["completion_tokens"] = s.usage.completion_tokens
