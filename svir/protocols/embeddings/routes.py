"""OpenAI's embeddings API: `POST /v1/embeddings` (`input` a string, strings or token arrays;
`encoding_format` "float" or "base64", the OpenAI SDK's default; `dimensions` where the upstream
honours it; `user`), over the same gateway, routes and key gate as chat.

The request is checked into the canonical embedding request (svir.wire.embeddings), opened as an
embedding call (svir.embeddings) and answered in OpenAI's shape; Ollama's `/api/embed` and
`/api/embeddings` are in svir.protocols.ollama.routes, over the same call.
"""

from __future__ import annotations

from typing import Any

from svir.asgi import Receive, Scope, Send
from svir.call import EMBEDDINGS, CallContext
from svir.errors import GatewayError, request_error
from svir.protocols.embeddings.request import check_openai_request, openai_answer
from svir.protocols.http import UntilDisconnect, new_call_context, read_json, send_json
from svir.protocols.router import Host
from svir.wire.embeddings import EmbeddingInputError

__all__ = ["API", "OpenAIEmbeddings", "input_error", "install"]

# The front end's name in the ledger and the logs (`CallContext.api`).
API = "embeddings"


def install(app: Host) -> OpenAIEmbeddings:
    """Serve OpenAI's embeddings from `app`."""
    api = OpenAIEmbeddings(app)
    app.routes.add("POST", "/v1/embeddings", api.embeddings)
    return api


def input_error(exc: EmbeddingInputError) -> GatewayError:
    """The 400 for an embedding request the wire checks refused."""
    return request_error(exc.message, param=exc.param, code="invalid_value")


class OpenAIEmbeddings:
    def __init__(self, app: Host) -> None:
        self.app = app
        self.gateway = app.gateway
        self.max_body_bytes = app.config.server.max_body_bytes

    async def embeddings(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        body = await read_json(scope, receive, self.max_body_bytes)
        try:
            request = check_openai_request(body)
        except EmbeddingInputError as exc:
            raise input_error(exc) from None
        fields["inputs"] = len(request["input"])
        ctx = new_call_context(
            scope, rid, API, client_user=request.get("user"), operation=EMBEDDINGS
        )
        with UntilDisconnect(scope, receive):
            return await self._serve(request, send, ctx)

    async def _serve(self, request: dict[str, Any], send: Send, ctx: CallContext) -> int:
        call = await self.gateway.embed(ctx, request)
        headers = {"x-request-id": ctx.request_id, **call.headers}
        assert call.answer is not None
        answer = openai_answer(
            call.answer,
            model=call.model_label,
            encoding_format=request.get("encoding_format", "float"),
            prompt_tokens=call.input_tokens(),
        )
        await send_json(send, 200, answer, headers)
        return 200
