"""OpenAI's Chat Completions API: `POST /v1/chat/completions` (SSE stream, or one completion with
`"stream": false`) and `GET /v1/models`, the one model list of `/v1` (each model with what svir
knows of it as it serves it: `context_length` and Ollama's `capabilities` words). A request that
carries `anthropic-version` gets Anthropic's list instead (svir.protocols.anthropic registers it
on the same path).

The request is already the canonical chat request (the shared checks of svir.providers validate
it); the canonical events become OpenAI's bytes by the wire core's encoder (svir.wire.encoder),
through the chat call. A client that disconnects stops its upstream request at once.

A stream whose upstream has shown nothing by its provider's commit deadline (svir.protocols.http
`EarlyStart`) starts anyway: the head, then `: keepalive` comments (and the upstream's own, such
as mlx-lm's prompt progress) until the first chunk; a failure after that start is the stream's
one error frame (no `[DONE]`), and is not retried.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from svir.asgi import Receive, Scope, Send
from svir.errors import BadRequest, GatewayError
from svir.protocols.http import (
    UntilDisconnect,
    new_call_context,
    open_early,
    read_body,
    send_json,
    sse_early_start,
)
from svir.protocols.router import Host
from svir.providers import validate_chat_request
from svir.wire.blobs import MIN_BLOB, Blobs, extract_blobs, new_token
from svir.wire.jsonbody import decode_body
from svir.wire.model_meta import ModelFacts

__all__ = ["OpenAIChat", "install"]

CREATED = 1700000000  # /v1/models needs a `created`; svir does not know when a model was made


def install(app: Host) -> OpenAIChat:
    """Serve OpenAI's chat completions and model list from `app`."""
    api = OpenAIChat(app)
    app.routes.add("POST", "/v1/chat/completions", api.chat_completions)
    app.routes.add("GET", "/v1/models", api.list_models)
    return api


class OpenAIChat:
    def __init__(self, app: Host) -> None:
        self.app = app
        self.gateway = app.gateway
        self.max_body_bytes = app.config.server.max_body_bytes

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        models = await self.app.models(scope)
        facts = await asyncio.gather(*(self._facts(model) for model, _ in models))
        data = []
        for (model, owner), known in zip(models, facts, strict=True):
            entry: dict[str, Any] = {
                "id": model,
                "object": "model",
                "created": CREATED,
                "owned_by": owner,
            }
            if known is not None:
                # What svir knows of the model as it serves it (svir.policy.catalog).
                entry["context_length"] = known.context_length
                entry["capabilities"] = known.capabilities
            data.append(entry)
        await send_json(send, 200, {"object": "list", "data": data}, {"x-request-id": rid})
        return 200

    async def _facts(self, model: str) -> ModelFacts | None:
        try:
            route = self.app.router.resolve(model)
        except (BadRequest, GatewayError):
            return None
        return await self.app.catalog.facts(model, route)

    async def chat_completions(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        raw = await read_body(scope, receive, self.max_body_bytes)
        # Large image data stays in `raw` and is spliced into the upstream body (§2.3).
        blobs: Blobs | None = None
        skeleton = raw
        if len(raw) >= MIN_BLOB:
            skeleton, blobs = extract_blobs(raw, new_token(os.urandom(15)))
        request = validate_chat_request(decode_body(skeleton))
        del skeleton
        stream = fields["stream"] = bool(request.get("stream"))
        user = request.get("user")
        headers = {"x-request-id": rid}
        early = sse_early_start(send, headers) if stream else None
        ctx = new_call_context(
            scope, rid, "openai", blobs, user if isinstance(user, str) else None, early=early
        )
        # The call is made and streamed here, not in a coroutine of its own: one level fewer
        # that every chunk of a stream resumes.
        with UntilDisconnect(scope, receive):
            call = await open_early(self.gateway.open_chat(ctx, request), early)
            if call is None:
                return 200  # the started stream ended with the failure
            headers.update(call.headers)
            try:
                if early is None:
                    completion = await call.complete()
                    await send_json(send, 200, completion, headers)
                    return 200
                await early.stream(call.stream())
                return 200
            finally:
                call.close()  # at once, also when cancelled: the upstream stops with the client
