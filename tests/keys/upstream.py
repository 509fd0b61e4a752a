"""A fake upstream for the keys tests: each model name is a behaviour.

- `tok-N`: N content chunks of one token each ("w0 ", "w1 ", …), a `stop` finish, a usage chunk
  (prompt_tokens 7, completion_tokens N), `[DONE]`.
- `tok-N-nousage`: the same with no usage chunk (as servers that do not support it).
- `tok-N-slow`: `tok-N` with `delay` seconds between chunks.
- `tok-N-split`: the role chunk, `delay` seconds, then all N content chunks in one write.
- `echo-401`, `echo-400`, `echo-503`: that status, with the request's credential quoted back in
  the error's message (as some servers do), not in any `sk-`/Bearer form the generic redaction
  knows.
- `echo-stream`: one content chunk, then an error chunk inside the stream quoting the credential.
- `echo-fields-400`: a 400 whose message is clean but whose code, param, type and `innererror`
  (nested) are the credential.
- `echo-fields-stream`: one content chunk, then an error chunk whose code, param and type are the
  credential.
- `echo-bearer-400`: a 400 whose message holds svir's own `Bearer <key>` placeholder and a bearer
  token of someone else's.
Every request's headers and body are kept in `requests`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from tests.support.svir_proc import free_port

PROMPT_TOKENS = 7
# A bearer token svir never had (someone else's, in an upstream's words): redacted by its shape.
FOREIGN_TOKEN = "tok3n-0f-an0ther-server-9a8b"


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    body = {
        "id": "gen-fake-1",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FakeUpstream:
    def __init__(self, *, delay: float = 0.02) -> None:
        self.delay = delay
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = free_port()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def models(self) -> list[str]:
        return [body.get("model", "") for _, body in self.requests]

    def __enter__(self) -> FakeUpstream:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        done.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = self._runner = web.AppRunner(app, handle_signals=False)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = dict(request.headers)
        self.requests.append((headers, body))
        model: str = body.get("model", "")
        credential = (headers.get("Authorization") or "").removeprefix("Bearer ")
        if model == "echo-fields-400":
            error = {
                "message": "the request was refused",
                "code": credential,
                "param": credential,
                "type": credential,
                "innererror": {
                    "code": credential,
                    "content_filter_result": {"hate": {"filtered": True, "note": [credential]}},
                },
            }
            return web.json_response({"error": error}, status=400)
        if model == "echo-bearer-400":
            message = (
                "send it as 'Authorization: Bearer <key>'; this one came with"
                f" 'Authorization: Bearer {FOREIGN_TOKEN}'"
            )
            return web.json_response({"error": {"message": message}}, status=400)
        if model in ("echo-401", "echo-400", "echo-503"):
            status = int(model[-3:])
            message = f"credential {credential} refused by the fake server"
            return web.json_response({"error": {"message": message}}, status=status)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "x-request-id": "up-" + str(len(self.requests)),
            }
        )
        await resp.prepare(request)
        await resp.write(chunk({"role": "assistant"}))
        if model in ("echo-stream", "echo-fields-stream"):
            await resp.write(chunk({"content": "partial"}))
            error = {
                "error": {
                    "message": f"generation died; credential was {credential}",
                    "type": "server_error",
                }
            }
            if model == "echo-fields-stream":
                error = {
                    "error": {
                        "message": "generation died",
                        "code": credential,
                        "param": credential,
                        "type": credential,
                    }
                }
            await resp.write(b"data: " + json.dumps(error).encode() + b"\n\n")
            await resp.write_eof()
            return resp
        parts = model.split("-")
        n = int(parts[1]) if len(parts) > 1 and parts[0] == "tok" else 2
        usage = "nousage" not in parts
        slow = "slow" in parts
        if "split" in parts:
            # The role alone first, then the whole answer in one write.
            await asyncio.sleep(self.delay)
            await resp.write(b"".join(chunk({"content": f"w{i} "}) for i in range(n)))
            n = 0
        for i in range(n):
            await resp.write(chunk({"content": f"w{i} "}))
            if slow:
                await asyncio.sleep(self.delay)
        await resp.write(chunk({}, "stop"))
        if usage:
            await resp.write(
                b"data: "
                + json.dumps(
                    {
                        "id": "gen-fake-1",
                        "object": "chat.completion.chunk",
                        "model": "fake",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": PROMPT_TOKENS,
                            "completion_tokens": n,
                            "total_tokens": PROMPT_TOKENS + n,
                        },
                    }
                ).encode()
                + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
