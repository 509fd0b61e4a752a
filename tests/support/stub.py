"""An app in process whose upstream is down, for fuzzing whole handlers: every request that gets
that far builds its real route and upstream body (a BodyError there is the client's 400), then
fails with a 502."""

from __future__ import annotations

from typing import Any

from svir.call import CallContext
from svir.chat import ChatCall
from svir.config.load import parse_config
from svir.edges.app import App
from svir.errors import request_error
from svir.protocols.completions import routes as completions
from svir.protocols.ollama import routes as ollama
from svir.protocols.openai_chat import routes as openai_chat

CONFIG = """
[server]
max_body_bytes = 100000

[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://127.0.0.1:9/v1"
discover = false
models = ["m"]
"""


def down_upstream_app() -> App:
    app = App(parse_config(CONFIG), {})
    openai_chat.install(app)
    completions.install(app)
    ollama.install(app)

    async def open_chat(ctx: CallContext, request: dict[str, Any]) -> ChatCall:
        route = app.router.resolve(request["model"])
        call = ChatCall(
            app.gateway.client, route, request, request_id=ctx.request_id, model_label="x"
        )
        call.upstream_body()
        raise request_error("the upstream is down", status=502, type="upstream_error")

    app.gateway.open_chat = open_chat  # type: ignore[method-assign,assignment]
    return app
