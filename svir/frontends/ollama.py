"""Ollama's native API on svir's port, over the same gateway, providers and models as `/v1`.

Routes: `POST /api/chat` and `POST /api/generate` (NDJSON stream, or one object with
`"stream": false`; generate's `raw` and `suffix` forms are text completions), `GET /api/tags`,
`POST /api/show`, `GET /api/version`, `GET /api/ps`; any other `/api/` path is a 404 in
Ollama's error shape. Errors are `{"error": "<message>"}` with the status svir's `/v1` would
give; a stream that fails after its first line ends with one `{"error": ...}` line. A client
that disconnects stops its upstream request at once.

The translation both ways is pure and tested on its own, in svir.frontends.ollama_translate: the
request becomes the canonical chat request there, and the canonical events become NDJSON lines
(`NDJSONEncoder`) or one answer (`ChatAggregator`, over the shared fold svir.wire.answer).
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from svir import __version__
from svir.asgi import Receive, Scope, Send
from svir.call import EMBEDDINGS, CallContext
from svir.chat import ChatCall, Route
from svir.errors import GatewayError, OllamaError, RequestError, request_error
from svir.frontends.embeddings import embed, prompt_tokens
from svir.frontends.http import (
    NDJSON_HEADERS,
    folded,
    new_call_context,
    read_json,
    send_json,
    send_stream,
    until_disconnect,
)
from svir.frontends.ollama_translate import (
    OLLAMA_API_VERSION,
    ChatAggregator,
    GenerateAggregator,
    GenerateEncoder,
    Metrics,
    NDJSONEncoder,
    created_at,
    error_line,
    error_message,
    model_name,
    ps_entry,
    show_response,
    tags_entry,
    to_generate_request,
    to_openai_request,
)
from svir.frontends.routes import Handler, Host
from svir.policy.bounded import BoundedMap
from svir.providers import validate_chat_request
from svir.wire.classify import to_client_error
from svir.wire.completions import is_completion
from svir.wire.embeddings import (
    EmbeddingInputError,
    check_ollama_embed,
    check_ollama_embeddings,
    ollama_embed_answer,
    ollama_embeddings_answer,
)
from svir.wire.errors import UpstreamError
from svir.wire.events import Usage

__all__ = ["OllamaAPI", "error_shape", "install"]

# How long `/api/ps` lists a model after svir last served it: Ollama's default keep-alive.
KEEP_ALIVE_SECONDS = 300.0
_NS = 1_000_000_000
# The embedding routes' name in the ledger and the logs (`CallContext.api`).
OLLAMA_EMBED_API = "ollama_embed"


def install(app: Host) -> OllamaAPI:
    """Serve Ollama's API from `app`, its errors in Ollama's shape."""
    api = OllamaAPI(app)
    for method, path, handler in api.routes():
        app.routes.add(method, path, handler, error_shape)
    app.routes.errors_under("/api/", error_shape)
    return api


def error_shape(exc: GatewayError) -> dict[str, str]:
    """An error answer as Ollama gives it: `{"error": "<message>"}`."""
    return {"error": exc.error.message}


def _refusal(exc: OllamaError) -> GatewayError:
    """The translation's refusal (an OllamaError), as the app's error mapper answers it."""
    return request_error(exc.message, status=exc.status, code="invalid_request")


class OllamaAPI:
    """The handlers; `recent` remembers when each model was last served, for `/api/ps`."""

    def __init__(self, app: Host, *, clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.clock = clock
        self.max_body_bytes = app.config.server.max_body_bytes
        # Bounded (svir.policy.bounded): a server may serve whatever model id a client sends.
        self.recent: BoundedMap[str, float] = app.router.bounded()

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/api/chat", self.chat),
            ("POST", "/api/generate", self.generate),
            ("GET", "/api/tags", self.tags),
            ("POST", "/api/show", self.show),
            ("GET", "/api/version", self.version),
            ("GET", "/api/ps", self.ps),
            # Embeddings: `input` -> `embeddings`, and the older `prompt` -> `embedding`.
            ("POST", "/api/embed", self.embed),
            ("POST", "/api/embeddings", self.embeddings),
        ]

    # Chat

    async def chat(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        return await self._answer(scope, receive, send, rid, fields, generate=False)

    async def generate(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """`/api/generate`: a chat of one turn, or with `raw` or a `suffix` a text completion
        (svir.wire.completions), answered with `response` where `/api/chat` has `message`."""
        return await self._answer(scope, receive, send, rid, fields, generate=True)

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rid: str,
        fields: dict[str, Any],
        *,
        generate: bool,
    ) -> int:
        headers = {"x-request-id": rid}
        fields["api"] = "ollama"
        label = ""
        try:
            body = await read_json(scope, receive, self.max_body_bytes)
            request = to_generate_request(body) if generate else to_openai_request(body)
            # Ollama answers with the name the client asked for, tag and all.
            label = body.get("model") or body.get("name")
            fields["stream"] = request["stream"]
            if not is_completion(request):
                if not request["messages"]:
                    return await self._load(request, label, body, send, headers, generate=generate)
                validate_chat_request(request)
            ctx = new_call_context(scope, rid, "ollama")
            work = self._serve_chat(request, label, send, ctx, generate)
            return await until_disconnect(receive, work)
        except OllamaError as exc:
            raise _refusal(exc) from None
        except GatewayError as exc:
            # In Ollama's words for a model it does not have, which need the name the client
            # asked for; the app's error mapper answers it.
            ce = exc.error
            if ce.code != "model_not_found":
                raise
            ce = msgspec.structs.replace(ce, message=error_message(ce, label))
            raise GatewayError(ce, exc.upstream) from None

    async def _load(
        self,
        request: dict[str, Any],
        label: str,
        body: dict[str, Any],
        send: Send,
        headers: dict[str, str],
        *,
        generate: bool,
    ) -> int:
        """No messages (no prompt): Ollama loads (or with `keep_alive: 0` unloads) the model and
        says so.

        For a server svir runs itself, loading starts it (or swaps the model in), and unloading
        stops it when no request is using it; for any other, svir checks that the model routes
        and leaves unloading to the server.
        """
        route = self._route(request["model"])
        unload = body.get("keep_alive") in (0, 0.0, "0", "0s", "0m")
        try:
            if unload and route.unload is not None:
                await route.unload(route.model_id)
            elif route.ensure is not None and not unload:
                await route.ensure(route.model_id)
                if route.release is not None:
                    route.release(route.model_id)
        except UpstreamError as exc:
            raise GatewayError(to_client_error(exc), exc) from None
        content: dict[str, Any] = (
            {"response": ""} if generate else {"message": {"role": "assistant", "content": ""}}
        )
        answer = {
            "model": label,
            "created_at": created_at(),
            **content,
            "done_reason": "unload" if unload else "load",
            "done": True,
        }
        await send_json(send, 200, answer, headers)
        return 200

    async def _serve_chat(
        self, request: dict[str, Any], label: str, send: Send, ctx: CallContext, generate: bool
    ) -> int:
        headers = {"x-request-id": ctx.request_id}
        call = await self.app.gateway.open_chat(ctx, request)
        headers.update(call.headers)
        self.recent[request["model"]] = self.clock()
        metrics = functools.partial(_metrics, call)
        try:
            if not request["stream"]:
                agg = await folded(call, GenerateAggregator() if generate else ChatAggregator())
                try:
                    answer = agg.response(model=label, metrics=metrics)
                except UpstreamError as exc:
                    raise GatewayError(to_client_error(exc), exc) from None
                await send_json(send, 200, answer, headers)
                return 200
            encoder = (GenerateEncoder if generate else NDJSONEncoder)(model=label, metrics=metrics)
            await send_stream(send, _lines(call, encoder), headers, NDJSON_HEADERS)
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client

    # Models

    async def tags(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.app.models()
        entries = [tags_entry(name, self._kind(provider)) for name, provider in models]
        await send_json(send, 200, {"models": entries}, {"x-request-id": rid})
        return 200

    async def show(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        try:
            body = await read_json(scope, receive, self.max_body_bytes)
            if not isinstance(body, dict):
                raise OllamaError("the request body must be a JSON object")
            given = body.get("model") or body.get("name")
            if not isinstance(given, str) or not given:
                raise OllamaError("model is required")
            name = model_name(given)
            fields["model"] = name
            route = self._route(name)
        except OllamaError as exc:
            raise _refusal(exc) from None
        answer = show_response(name, route.provider.name, route.model_id, route.kind.name)
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    async def ps(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """The models svir served within the keep-alive window: svir loads nothing itself."""
        now = self.clock()
        for name, last in self.recent.items():
            if now - last >= KEEP_ALIVE_SECONDS:
                del self.recent[name]
        entries = []
        for name, last in sorted(self.recent.items(), key=lambda item: -item[1]):
            provider = self.app.router.providers.get(name.partition("/")[0])
            kind = provider.kind.name if provider is not None else ""
            expires = datetime.datetime.fromtimestamp(last + KEEP_ALIVE_SECONDS, datetime.UTC)
            entries.append(ps_entry(name, kind, created_at(expires)))
        await send_json(send, 200, {"models": entries}, {"x-request-id": rid})
        return 200

    async def version(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        answer = {"version": OLLAMA_API_VERSION, "svir_version": __version__}
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    # Helpers

    def _route(self, name: str) -> Route:
        """Where a model name goes (for a configured route, its first target), or an
        OllamaError: Ollama's 404 for a model it does not have."""
        asked = name
        for route in self.app.config.routes:
            if route.name == name and route.targets:
                name = route.targets[0].model
                break
        try:
            return self.app.router.resolve(name)
        except RequestError as exc:
            raise OllamaError(exc.message) from None
        except GatewayError as exc:
            raise OllamaError(error_message(exc.error, asked), exc.error.status) from None

    def _kind(self, provider: str) -> str:
        found = self.app.router.providers.get(provider)
        return found.kind.name if found is not None else ""

    # Embeddings (the call and its checks: svir.frontends.embeddings, svir.wire.embeddings)

    async def embed(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """`/api/embed`: `input` a string or strings -> `embeddings`, counts and durations."""
        return await self._embedding(scope, receive, send, rid, legacy=False)

    async def embeddings(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """The older `/api/embeddings`: `prompt` -> `embedding`."""
        return await self._embedding(scope, receive, send, rid, legacy=True)

    async def _embedding(
        self, scope: Scope, receive: Receive, send: Send, rid: str, *, legacy: bool
    ) -> int:
        body = await read_json(scope, receive, self.max_body_bytes)
        try:
            request = check_ollama_embeddings(body) if legacy else check_ollama_embed(body)
        except EmbeddingInputError as exc:
            raise _refusal(OllamaError(exc.message)) from None
        label = request["model"]
        request["model"] = model_name(label)
        ctx = new_call_context(scope, rid, OLLAMA_EMBED_API, operation=EMBEDDINGS)
        work = self._serve_embedding(request, label, send, ctx, legacy=legacy)
        try:
            return await until_disconnect(receive, work)
        except GatewayError as exc:
            if exc.error.code != "model_not_found":
                raise
            ce = msgspec.structs.replace(exc.error, message=error_message(exc.error, label))
            raise GatewayError(ce, exc.upstream) from None

    async def _serve_embedding(
        self, request: dict[str, Any], label: str, send: Send, ctx: CallContext, *, legacy: bool
    ) -> int:
        call, headers = await embed(self.app.gateway, ctx, request)
        assert call.answer is not None
        self.recent[request["model"]] = self.clock()
        if legacy:
            answer = ollama_embeddings_answer(call.answer)
        else:
            answer = ollama_embed_answer(
                call.answer,
                model=label,
                total_duration=call.elapsed_ns(),
                prompt_tokens=prompt_tokens(call),
            )
        await send_json(send, 200, answer, headers)
        return 200


async def _lines(call: ChatCall, encoder: NDJSONEncoder) -> AsyncIterator[bytes]:
    """The answer's NDJSON; raises GatewayError if it fails before its first line."""
    async for events in call.events():
        data = encoder.feed(events)
        if encoder.early_error is not None:
            raise GatewayError(to_client_error(encoder.early_error), encoder.early_error)
        if data:
            yield data
    if not encoder.ended:  # not reached: the events always end with Done or an error
        yield error_line("the upstream stream ended without an answer")


def _metrics(call: ChatCall, usage: Usage | None) -> Metrics:
    """Counts from the upstream's usage; durations as svir saw them, in nanoseconds."""
    now = time.perf_counter()
    started = call.stats.started
    first = call.first_token_at
    if first is None or first < started:
        first = now
    return Metrics(
        total_duration=round((now - started) * _NS),
        prompt_eval_duration=round((first - started) * _NS),
        eval_duration=round((now - first) * _NS),
        prompt_eval_count=usage.prompt_tokens if usage is not None else None,
        eval_count=usage.completion_tokens if usage is not None else None,
    )
