"""A scripted OpenAI-compatible model server on loopback for the Claude Code tests: it plays an
agent's model. A request with tools and no tool result yet is answered with one call of
`TOOL` (its arguments `arguments`); a request whose last message is a tool result, with
`FINAL` and the result's first line; any other request (Claude Code's side tasks), with "ok".
Every request body is kept in `bodies`, its headers in `headers`."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from tests.support.svir_proc import free_port

TOOL = "Read"
FINAL = "The file says:"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-agent",
        "object": "chat.completion.chunk",
        "model": "agent",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class AgentUpstream:
    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> AgentUpstream:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handle_signals=False)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def reply(self, body: dict[str, Any]) -> list[bytes]:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        tools = [t["function"]["name"] for t in body.get("tools") or ()]
        role = [_chunk({"role": "assistant"})]
        if last.get("role") == "tool":
            text = f"{FINAL} {str(last.get('content', '')).strip().splitlines()[0]}"
            return [*role, _chunk({"content": text}), _chunk({}, "stop")]
        if TOOL in tools:
            call = {
                "index": 0,
                "id": "call_agent_1",
                "type": "function",
                "function": {"name": TOOL, "arguments": json.dumps(self.arguments)},
            }
            return [*role, _chunk({"tool_calls": [call]}), _chunk({}, "tool_calls")]
        return [*role, _chunk({"content": "ok"}), _chunk({}, "stop")]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in self.reply(body):
            await resp.write(piece)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
