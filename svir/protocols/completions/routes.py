"""OpenAI's legacy text completions: `POST /v1/completions` (SSE `text_completion` chunks, or one
`text_completion` object with `"stream": false`), with fill-in-the-middle by `suffix`.

The request becomes the canonical completion request (svir.wire.completions); the gateway opens
it as any chat call (routing, retries, fallback, keys and limits), and the chat call sends it to
the upstream's own completion endpoint (llama-server's `/completion` or `/infill`, an
OpenAI-compatible `/v1/completions`) and writes its answer as `text_completion`s. Errors are
OpenAI's, as on `/v1/chat/completions`, and so is a stream's early start past the commit
deadline (`: keepalive` comments, then one error frame on a failure). docs/completions.md says
what each field does.
"""

from __future__ import annotations

from typing import Any

from svir.asgi import Receive, Scope, Send
from svir.call import CallContext
from svir.errors import GatewayError, request_error
from svir.protocols.completions.request import CompletionRequestError, parse_completion_request
from svir.protocols.http import (
    EarlyStart,
    UntilDisconnect,
    new_call_context,
    open_early,
    read_json,
    send_json,
    sse_early_start,
)
from svir.protocols.router import Host

__all__ = ["Completions", "install"]


def install(app: Host) -> Completions:
    """Serve `/v1/completions` from `app`."""
    api = Completions(app)
    app.routes.add("POST", "/v1/completions", api.completions)
    return api


def refusal(exc: CompletionRequestError) -> GatewayError:
    """A request svir will not send, as the app's error mapper answers it (OpenAI's 400)."""
    return request_error(exc.message, code=exc.code, param=exc.param)


class Completions:
    def __init__(self, app: Host) -> None:
        self.app = app

    async def completions(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        body = await read_json(scope, receive, self.app.config.server.max_body_bytes)
        try:
            request = parse_completion_request(body)
        except CompletionRequestError as exc:
            raise refusal(exc) from None
        fields["stream"] = request["stream"]
        user = request.get("user")
        headers = {"x-request-id": rid}
        early = sse_early_start(send, headers) if request["stream"] else None
        ctx = new_call_context(scope, rid, "completions", None, user, early=early)
        with UntilDisconnect(scope, receive):
            return await self._serve(request, send, ctx, headers, early)

    async def _serve(
        self,
        request: dict[str, Any],
        send: Send,
        ctx: CallContext,
        headers: dict[str, str],
        early: EarlyStart | None,
    ) -> int:
        opening = self.app.gateway.open_chat(ctx, request)
        call = await open_early(opening, early)
        if call is None:
            return 200  # the started stream ended with the failure
        headers.update(call.headers)
        try:
            if early is None:
                await send_json(send, 200, await call.complete(), headers)
                return 200
            await early.stream(call.stream())
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client
