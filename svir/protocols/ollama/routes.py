"""Ollama's native API on svir's port, over the same gateway, providers and models as `/v1`.

Routes: `GET /` and `HEAD /` ("Ollama is running", the words Ollama's clients check; Anthropic's
only probe the base URL), `POST /api/chat` and `POST /api/generate` (NDJSON stream, or one
object with `"stream": false`; generate's `raw` and `suffix` forms are text completions),
`GET /api/tags`, `POST /api/show`, `GET /api/version`, `GET /api/ps`, and the model-file routes
(`/api/pull`, `/api/delete`, `/api/copy`, `/api/create`, `/api/push`), which svir does not have
files for; any other `/api/` path is a 404 in Ollama's error shape. What the listings say of a
model is what is true of it as svir serves it (svir.policy.catalog), and `options.num_ctx` is
honoured or refused there, before anything is sent, for chat and generate alike
(`fit_context`).

Errors are `{"error": "<message>"}` with the status svir's `/v1` would
give; a stream that fails after its first line ends with one `{"error": ...}` line. A stream
whose upstream has shown nothing by its provider's commit deadline (a prompt being read, a model
being loaded) sends its head at once and a space every few seconds until its first line
(svir.protocols.http `EarlyStart`); a failure after that start is its one error line, not
retried. A client that disconnects stops its upstream request at once.

The translation both ways is pure and tested on its own: the request becomes the canonical chat
request in svir.protocols.ollama.request, and the canonical events become NDJSON lines
(`NDJSONEncoder`) or one answer (`ChatAggregator`, over the shared fold svir.wire.answer) in
svir.protocols.ollama.encode; the listings' words are svir.protocols.ollama.listings.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import msgspec

from svir import __version__
from svir.asgi import Receive, Scope, Send
from svir.call import EMBEDDINGS, CallContext
from svir.chat import ChatCall, UpstreamTarget
from svir.errors import BadRequest, GatewayError, OllamaError, request_error
from svir.policy.bounded import BoundedMap
from svir.protocols.http import (
    NDJSON_HEADERS,
    EarlyStart,
    UntilDisconnect,
    folded,
    headers_with,
    new_call_context,
    open_early,
    read_json,
    send_json,
    send_stream,
)
from svir.protocols.ollama.embed import (
    check_ollama_embed,
    check_ollama_embeddings,
    ollama_embed_answer,
    ollama_embeddings_answer,
)
from svir.protocols.ollama.encode import (
    ChatAggregator,
    GenerateAggregator,
    GenerateEncoder,
    Metrics,
    NDJSONEncoder,
    created_at,
    error_line,
    error_message,
)
from svir.protocols.ollama.listings import (
    OLLAMA_API_VERSION,
    not_managed,
    ps_entry,
    pull_lines,
    show_response,
    tags_entry,
)
from svir.protocols.ollama.request import (
    model_name,
    num_ctx,
    to_generate_request,
    to_openai_request,
)
from svir.protocols.router import Handler, Host
from svir.providers import validate_chat_request
from svir.wire.classify import to_client_error
from svir.wire.completions import is_completion
from svir.wire.embeddings import EmbeddingInputError
from svir.wire.errors import UpstreamError
from svir.wire.events import Usage
from svir.wire.model_meta import ModelFacts

__all__ = ["OllamaAPI", "error_shape", "install"]

# How long `/api/ps` lists a model after svir last served it: Ollama's default keep-alive.
KEEP_ALIVE_SECONDS = 300.0
# `expires_at` of a model that is not unloaded when idle (Ollama's own for keep_alive -1).
NEVER = "2318-01-01T00:00:00.000000Z"
ROOT_TEXT = b"Ollama is running"
TEXT_HEADERS = ((b"content-type", b"text/plain; charset=utf-8"),)
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
            ("GET", "/", self.root),
            ("HEAD", "/", self.root),
            ("POST", "/api/chat", self.chat),
            ("POST", "/api/generate", self.generate),
            ("GET", "/api/tags", self.tags),
            ("POST", "/api/show", self.show),
            ("GET", "/api/version", self.version),
            ("GET", "/api/ps", self.ps),
            ("POST", "/api/pull", self.pull),
            ("POST", "/api/copy", self.model_files),
            ("POST", "/api/create", self.model_files),
            ("POST", "/api/push", self.model_files),
            ("DELETE", "/api/delete", self.model_files),
            # Embeddings: `input` -> `embeddings`, and the older `prompt` -> `embedding`.
            ("POST", "/api/embed", self.embed),
            ("POST", "/api/embeddings", self.embeddings),
        ]

    async def root(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """Ollama's answer at its base URL; Anthropic's clients only look at the status."""
        body = b"" if scope["method"] == "HEAD" else ROOT_TEXT
        headers = headers_with(TEXT_HEADERS, {"x-request-id": rid})
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return 200

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
            await self.fit_context(request, body)
            early: EarlyStart | None = None
            if request["stream"]:
                early = EarlyStart(
                    send,
                    headers,
                    kind=NDJSON_HEADERS,
                    first=_blank,
                    ping=_blank,
                    fail=_error_line,
                    relay=_relayed_blank,
                )
            ctx = new_call_context(scope, rid, "ollama", early=early)
            with UntilDisconnect(scope, receive):
                return await self._serve_chat(
                    request, label, send, ctx, generate=generate, headers=headers, early=early
                )
        except OllamaError as exc:
            raise _refusal(exc) from None
        except GatewayError as exc:
            raise _in_ollamas_words(exc, label) from None

    async def fit_context(self, request: dict[str, Any], body: dict[str, Any]) -> None:
        """Refuse, before it is sent, a request its model cannot take whole, and serve a managed
        model with the `options.num_ctx` asked for (svir.policy.catalog's `check_context`): the
        one rule of `/api/chat` and `/api/generate`. Raises GatewayError or OllamaError."""
        name = request["model"]
        route = self._route(name)
        await self.app.catalog.check_context(name, route, request, num_ctx(body))

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
        self,
        request: dict[str, Any],
        label: str,
        send: Send,
        ctx: CallContext,
        *,
        generate: bool,
        headers: dict[str, str],
        early: EarlyStart | None,
    ) -> int:
        opening = self.app.gateway.open_chat(ctx, request)
        call = await open_early(opening, early, lambda exc: _in_ollamas_words(exc, label))
        if call is None:
            return 200  # the started stream ended with the failure
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
            assert early is not None
            # Once started, a failure before the first line is a line too: the status is out.
            encoder.sent = early.started
            # The line that ends the answer goes with the body's end, in one write.
            await early.stream(_lines(call, encoder), last=lambda _data: encoder.ended)
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client

    # Models

    async def tags(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.app.models(scope)
        facts = await asyncio.gather(*(self._facts(name) for name, _ in models))
        entries = [tags_entry(f) for f in facts if f is not None]
        await send_json(send, 200, {"models": entries}, {"x-request-id": rid})
        return 200

    async def show(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        try:
            body = await read_json(scope, receive, self.max_body_bytes)
            name = _model_field(body)
            fields["model"] = name
            route = self._route(name)
        except OllamaError as exc:
            raise _refusal(exc) from None
        facts = await self.app.catalog.facts(name, route)
        answer = show_response(facts, route.provider.name)
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    async def ps(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """What runs: the servers svir runs itself, each with the context it runs with and when
        it unloads if unused; and the other models svir served within the keep-alive window."""
        now = self.clock()
        for name, last in self.recent.items():
            if now - last >= KEEP_ALIVE_SECONDS:
                del self.recent[name]
        entries = []
        for provider, runtime in self.app.catalog.runtimes.items():
            for loaded in runtime.loaded():
                name = f"{provider}/{loaded.model_id}"
                facts = await self._facts(name)
                if facts is None:
                    continue
                expires = _expiry(loaded.expires_at)
                entries.append(ps_entry(facts, expires, loaded.size))
        for name, last in sorted(self.recent.items(), key=lambda item: -item[1]):
            if name.partition("/")[0] in self.app.catalog.runtimes:
                continue  # listed above while it runs
            facts = await self._facts(name)
            if facts is not None:
                entries.append(ps_entry(facts, _expiry(last + KEEP_ALIVE_SECONDS)))
        await send_json(send, 200, {"models": entries}, {"x-request-id": rid})
        return 200

    # Model files

    async def pull(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """A model svir serves is there already: Ollama's last status lines, then `success`.
        Any other is Ollama's 404, with what svir does instead."""
        try:
            body = await read_json(scope, receive, self.max_body_bytes)
            name = _model_field(body)
            fields["model"] = name
            self._route(name)
        except OllamaError as exc:
            if exc.status == 404:
                exc = OllamaError(f"{exc.message}; {not_managed('pull')}", 404)
            raise _refusal(exc) from None
        lines = pull_lines(name)
        headers = {"x-request-id": rid}
        if body.get("stream") is False:
            await send_json(send, 200, lines[-1], headers)
        else:
            data = b"".join(msgspec.json.encode(line) + b"\n" for line in lines)
            await send_stream(send, _once(data), headers, NDJSON_HEADERS)
        return 200

    async def model_files(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        # The body is read as every route's is: too large or not JSON is that error first.
        await read_json(scope, receive, self.max_body_bytes, empty=None)
        action = scope["path"].rsplit("/", 1)[-1]
        raise _refusal(OllamaError(not_managed(action)))

    async def version(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        answer = {"version": OLLAMA_API_VERSION, "svir_version": __version__}
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    # Embeddings (the call and its checks: svir.protocols.embeddings.routes, svir.wire.embeddings)

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
        try:
            with UntilDisconnect(scope, receive):
                return await self._serve_embedding(request, label, send, ctx, legacy=legacy)
        except GatewayError as exc:
            if exc.error.code != "model_not_found":
                raise
            ce = msgspec.structs.replace(exc.error, message=error_message(exc.error, label))
            raise GatewayError(ce, exc.upstream) from None

    async def _serve_embedding(
        self, request: dict[str, Any], label: str, send: Send, ctx: CallContext, *, legacy: bool
    ) -> int:
        call = await self.app.gateway.embed(ctx, request)
        headers = {"x-request-id": ctx.request_id, **call.headers}
        assert call.answer is not None
        self.recent[request["model"]] = self.clock()
        if legacy:
            answer = ollama_embeddings_answer(call.answer)
        else:
            answer = ollama_embed_answer(
                call.answer,
                model=label,
                total_duration=call.elapsed_ns(),
                prompt_tokens=call.input_tokens(),
            )
        await send_json(send, 200, answer, headers)
        return 200

    # Helpers

    def _route(self, name: str) -> UpstreamTarget:
        """Where a model name goes (for a configured route, its first target), or an
        OllamaError: Ollama's 404 for a model it does not have."""
        asked = name
        for route in self.app.config.routes:
            if route.name == name and route.targets:
                name = route.targets[0].model
                break
        try:
            return self.app.router.resolve(name)
        except BadRequest as exc:
            raise OllamaError(exc.message) from None
        except GatewayError as exc:
            raise OllamaError(error_message(exc.error, asked), exc.error.status) from None

    async def _facts(self, name: str) -> ModelFacts | None:
        """What is true of a listed model; None for one that no longer routes."""
        try:
            route = self._route(name)
        except OllamaError:
            return None
        return await self.app.catalog.facts(name, route)


def _in_ollamas_words(exc: GatewayError, label: str) -> GatewayError:
    """The error in Ollama's words for a model it does not have, which need the name the client
    asked for (the app's error mapper, or a started stream's error line, answers it)."""
    ce = exc.error
    if ce.code != "model_not_found":
        return exc
    ce = msgspec.structs.replace(ce, message=error_message(ce, label))
    return GatewayError(ce, exc.upstream)


# A stream started before its first line (its upstream still silent past the commit deadline)
# is kept alive with spaces: NDJSON has no comment, and a blank line is an empty JSON text to
# a client that parses each line (the `ollama` package does), where whitespace before the next
# line's object is JSON's own.
_SPACE: Final = b" "


def _blank() -> bytes:
    return _SPACE


def _relayed_blank(_comment: str) -> bytes:
    return _SPACE


def _error_line(exc: GatewayError) -> bytes:
    return error_line(exc.error.message)


def _model_field(body: Any) -> str:
    """The model a body names (`model`, or the older `name`), without Ollama's default tag."""
    if not isinstance(body, dict):
        raise OllamaError("the request body must be a JSON object")
    given = body.get("model") or body.get("name")
    if not isinstance(given, str) or not given:
        raise OllamaError("model is required")
    return model_name(given)


def _expiry(moment: float | None) -> str:
    """`expires_at` for a wall-clock time; a model that never unloads, far in the future."""
    if moment is None:
        return NEVER
    return created_at(datetime.datetime.fromtimestamp(moment, datetime.UTC))


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


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
