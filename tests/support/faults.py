"""A fault-injecting upstream on loopback, for the policy tests: each model name is a behaviour.

- `ok`: a short complete stream ("hello world").
- `flaky-N`: the first N requests get 503, the rest `ok`.
- `always-503`: 503 every time.
- `limited`: the first request gets 429 with Retry-After (`retry_after`), the rest `ok`.
- `hang-headers`: never answers.
- `reset-early`: headers and a role chunk, then the connection is cut before any text.
- `reset-late`: one text chunk, then the connection is cut.
- `slow`: `ok`, each chunk `slow_delay` seconds apart.
- `effort`: 400 with vLLM's message when `reasoning_effort` is "high"; else `ok`.
- `no-stream-options`: 422 when `stream_options` is sent; else `ok`.
- `overflow`: 400 context_length_exceeded. `filtered`: Azure's 400 content_filter.
- `missing`: vLLM's 404 for a model it does not have. `rejected`: llama.cpp's 400 for a bad field.
- `parse-fail-late`: one text chunk, then llama.cpp's error chunk for a tool call its parser could
  not read (the model's doing). `crash-late`: one text chunk, then a 500 error chunk.
Counts per model name are in `hits`; every request body is in `bodies`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from typing import Any

from aiohttp import web

from tests.support.svir_proc import free_port

CHUNK = 'data: {{"id":"f","model":"m","choices":[{{"index":0,"delta":{delta},"finish_reason":{finish}}}]}}\n\n'


# llama.cpp's error chunk when its chat parser cannot read the tool call the model wrote (§3.5).
PARSE_FAILURE = (
    b'data: {"error":{"code":500,"message":"Failed to parse input at pos 7: <tool_call>{\\"na",'
    b'"type":"server_error"}}\n\n'
)
CRASH = b'data: {"error":{"code":500,"message":"CUDA error: an illegal memory access","type":"server_error"}}\n\n'


def ok_stream(texts: list[str]) -> list[bytes]:
    out = [CHUNK.format(delta='{"role":"assistant"}', finish="null").encode()]
    out += [CHUNK.format(delta=json.dumps({"content": t}), finish="null").encode() for t in texts]
    out.append(CHUNK.format(delta="{}", finish='"stop"').encode())
    out.append(b"data: [DONE]\n\n")
    return out


class FaultServer:
    def __init__(self, *, retry_after: str = "1", slow_delay: float = 0.05) -> None:
        self.retry_after = retry_after
        self.slow_delay = slow_delay
        self.hits: collections.Counter[str] = collections.Counter()
        self.bodies: list[dict[str, Any]] = []
        self.times: list[tuple[str, float]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = free_port()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FaultServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, handle_signals=False)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body.get("model", "")
        self.hits[model] += 1
        self.bodies.append(body)
        self.times.append((model, self._loop.time()))
        n = self.hits[model]
        if model.startswith("flaky-"):
            if n <= int(model.split("-")[1]):
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            return await self._stream(request, ["hello", " world"])
        if model == "always-503":
            return web.json_response({"error": {"message": "down"}}, status=503)
        if model == "limited" and n == 1:
            return web.json_response(
                {"error": {"message": "slow down"}},
                status=429,
                headers={"Retry-After": self.retry_after},
            )
        if model == "hang-headers":
            await asyncio.sleep(3600)
        if model == "reset-early":
            return await self._stream(request, [], cut=True)
        if model == "reset-late":
            return await self._stream(request, ["partial"], cut=True)
        if model == "effort" and body.get("reasoning_effort") == "high":
            message = "Unexpected reasoning effort high. Supported types are xhigh (default), medium, and low."
            return web.json_response(
                {"error": {"message": message, "type": "BadRequestError", "code": 400}}, status=400
            )
        if model == "no-stream-options" and "stream_options" in body:
            detail = [
                {
                    "type": "extra_forbidden",
                    "loc": ["body", "stream_options"],
                    "msg": "Extra inputs are not permitted",
                }
            ]
            return web.json_response({"detail": detail}, status=422)
        if model == "overflow":
            return web.json_response(
                {
                    "error": {
                        "message": "This model's maximum context length is 8 tokens",
                        "code": "context_length_exceeded",
                    }
                },
                status=400,
            )
        if model == "missing":
            return web.json_response(
                {
                    "object": "error",
                    "message": "The model `missing` does not exist.",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                },
                status=404,
            )
        if model == "rejected":
            return web.json_response(
                {
                    "error": {
                        "code": 400,
                        "message": "Invalid tool_choice: bogus",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        if model == "parse-fail-late":
            return await self._stream(request, ["partial"], error=PARSE_FAILURE)
        if model == "crash-late":
            return await self._stream(request, ["partial"], error=CRASH)
        if model == "filtered":
            return web.json_response(
                {
                    "error": {
                        "message": "filtered",
                        "code": "content_filter",
                        "innererror": {
                            "content_filter_result": {
                                "hate": {"filtered": True, "severity": "high"}
                            }
                        },
                    }
                },
                status=400,
            )
        return await self._stream(request, ["hello", " world"], slow=model == "slow")

    async def _stream(
        self,
        request: web.Request,
        texts: list[str],
        *,
        cut: bool = False,
        slow: bool = False,
        error: bytes | None = None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = ok_stream(texts)
        if cut:
            chunks = chunks[: 1 + len(texts)]
        if error is not None:
            chunks = [*chunks[: 1 + len(texts)], error]
        for chunk in chunks:
            await resp.write(chunk)
            if slow:
                await asyncio.sleep(self.slow_delay)
        if cut:
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write_eof()
        return resp
