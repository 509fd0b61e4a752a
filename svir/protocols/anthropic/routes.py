"""Anthropic's Messages API: `POST /v1/messages` (SSE stream, or one message with `"stream": false`;
matched on the path only, so Claude Code's `/v1/messages?beta=true` is the same route),
`POST /v1/messages/count_tokens`, and `GET /v1/models` for a request that carries
`anthropic-version` (OpenAI's list otherwise, on the same path). The base URL clients probe
(`HEAD /`, `GET /`) is Ollama's route (svir.protocols.ollama), whose words Ollama's clients check:
Anthropic's clients only look for an answer there.

The request becomes the canonical chat request by svir.protocols.anthropic.request (what it ignored
is said in `x-svir-warning`); the canonical events become Anthropic's SSE or message by
svir.protocols.anthropic.encode. `anthropic-beta` and every other client header stay here: svir
builds the upstream's headers itself. Every error on these routes, and on any path under
`/v1/messages`, is answered in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`)
with svir's status; a stream that fails after `message_start` ends with one `error` event. A
`claude-*` model no route maps is a 404 that shows the `[[routes]]` entry to add.

A streamed answer whose upstream has shown nothing by its provider's commit deadline
(`timeouts.commit_deadline`: a local server reading a long prompt, a model being loaded) starts
anyway (svir.protocols.http `EarlyStart`): `message_start`, then a `ping` every `ping_every`
seconds and for each of the upstream's own keep-alives until the output comes, as Anthropic's API
streams, because Claude Code gives up on a stream with no bytes for a few minutes. A failure after
that start is the stream's one `error` event, not retried; one sooner (the common case) is still
an HTTP error, retried or sent to a fallback as the policy says. (The call's own response
headers, such as its cooling or limit notes, cannot follow a started response.)

count_tokens is exact when the model's server is llama.cpp's (the gateway asks it to tokenize the
prompt its chat template makes: `x-svir-token-count: exact`), svir's estimate otherwise
(`estimate`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from svir.asgi import Receive, Scope, Send
from svir.call import CallContext
from svir.chat import ChatCall
from svir.errors import GatewayError, request_error
from svir.protocols.anthropic.encode import (
    MessageAggregator,
    MessageStreamEncoder,
    anthropic_error,
    model_list,
)
from svir.protocols.anthropic.request import (
    MessagesRequest,
    MessagesRequestError,
    translate_request,
)
from svir.protocols.http import (
    KEEPALIVE_EVERY,
    WARNING_HEADER,
    EarlyStart,
    UntilDisconnect,
    folded,
    merge_headers,
    new_call_context,
    open_early,
    read_json,
    send_json,
    warning_header,
)
from svir.protocols.router import Host
from svir.providers import validate_chat_request
from svir.wire.events import Keepalive
from svir.wire.tokens import estimate_prompt_tokens

# Anthropic's list needs a `created_at`; svir does not know when a model was made.
CREATED_AT: Final = "2023-11-14T22:13:20Z"

__all__ = ["AnthropicMessages", "error_shape", "install"]

COUNT_HEADER: Final = "x-svir-token-count"
_WAITING: Final = Keepalive("svir: the upstream has not answered yet")


def install(app: Host, *, ping_every: float = KEEPALIVE_EVERY) -> AnthropicMessages:
    """Serve Anthropic's Messages API from `app`, its errors in Anthropic's shape."""
    api = AnthropicMessages(app, ping_every=ping_every)
    app.routes.add("POST", "/v1/messages", api.messages, error_shape)
    app.routes.add("POST", "/v1/messages/count_tokens", api.count_tokens, error_shape)
    app.routes.errors_under("/v1/messages", error_shape)
    # Anthropic's clients list models on OpenAI's path; the header tells them apart.
    app.routes.add(
        "GET", "/v1/models", api.list_models, error_shape, when_header=b"anthropic-version"
    )
    return api


def error_shape(exc: GatewayError) -> dict[str, Any]:
    """An error answer as Anthropic gives it (the status stays svir's: `anthropic_error`)."""
    return anthropic_error(exc.error)[1]


def _refusal(exc: MessagesRequestError) -> GatewayError:
    return request_error(exc.message, param=exc.param)


def _unmapped(exc: GatewayError, model: str) -> GatewayError:
    """A 404 for a model no route maps, saying how to map it when the client is Claude Code
    (its `claude-*` names are nobody's models here)."""
    ce = exc.error
    if ce.code != "model_not_found" or not model.startswith("claude"):
        return exc
    message = (
        f"svir has no model {model!r}: map it to one of svir's models in the config, e.g. "
        f'[[routes]] name = "{model}" targets = [{{ model = "<provider>/<model-id>" }}] '
        "(docs/anthropic.md). " + ce.message
    )
    return GatewayError(msgspec.structs.replace(ce, message=message), exc.upstream)


class AnthropicMessages:
    def __init__(self, app: Host, *, ping_every: float = KEEPALIVE_EVERY) -> None:
        self.app = app
        self.gateway = app.gateway
        self.max_body_bytes = app.config.server.max_body_bytes
        self.ping_every = ping_every

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.app.models(scope)
        listed = model_list([model for model, _ in models], CREATED_AT)
        await send_json(send, 200, listed, {"x-request-id": rid})
        return 200

    async def _translated(self, scope: Scope, receive: Receive) -> tuple[Any, MessagesRequest]:
        body = await read_json(scope, receive, self.max_body_bytes)
        try:
            return body, translate_request(body)
        except MessagesRequestError as exc:
            raise _refusal(exc) from None

    async def messages(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        fields["api"] = "anthropic"
        body, translated = await self._translated(scope, receive)
        model: str = body["model"]
        request = validate_chat_request(translated.chat)
        fields["stream"] = translated.stream
        headers = {"x-request-id": rid}
        if translated.warnings:
            headers[WARNING_HEADER] = warning_header(translated.warnings)
        encoder = MessageStreamEncoder(id=rid, model=model)
        early: EarlyStart | None = None
        if request.get("stream"):
            early = EarlyStart(
                send,
                headers,
                first=encoder.start,
                ping=lambda: encoder.encode(_WAITING),
                fail=lambda exc: encoder.error(exc.error),
                relay=lambda _comment: encoder.encode(_WAITING),
                every=self.ping_every,
            )
        ctx = new_call_context(scope, rid, "anthropic", client_user=translated.user_id, early=early)
        with UntilDisconnect(scope, receive):
            return await self._serve(
                ctx, request, encoder, early, model=model, send=send, headers=headers
            )

    async def _serve(
        self,
        ctx: CallContext,
        request: dict[str, Any],
        encoder: MessageStreamEncoder,
        early: EarlyStart | None,
        *,
        model: str,
        send: Send,
        headers: dict[str, str],
    ) -> int:
        opening = self.gateway.open_chat(ctx, request)
        call = await open_early(opening, early, lambda exc: _unmapped(exc, model))
        if call is None:
            return 200  # the started stream ended with the failure
        merge_headers(headers, call.headers)
        try:
            if early is None:
                fold = await folded(call, MessageAggregator())
                answer = fold.message(id=ctx.request_id, model=model)
                await send_json(send, 200, answer, headers)
                return 200
            # The piece that ends the message goes with the body's end, in one write.
            await early.stream(_frames(call, encoder), last=lambda _data: encoder.ended)
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client

    async def count_tokens(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        fields["api"] = "anthropic"
        body, translated = await self._translated(scope, receive)
        fields["model"] = body["model"]
        exact = await self.gateway.count_tokens(translated.chat, rid)
        count = exact if exact is not None else estimate_prompt_tokens(translated.chat)
        headers = {"x-request-id": rid, COUNT_HEADER: "estimate" if exact is None else "exact"}
        await send_json(send, 200, {"input_tokens": count}, headers)
        return 200


async def _frames(call: ChatCall, encoder: MessageStreamEncoder) -> Any:
    """The answer's SSE bytes, batch by batch (a failure before any output was raised when the
    call opened, as an HTTP error)."""
    encode = encoder.encode
    async for events in call.events():
        data = b"".join([encode(event) for event in events])
        if data:
            yield data
