"""An ASGI app's lifespan driven in this process: started as a server starts it, stopped as one
stops it (the keys harness and the in-process policy tests use it); and one request sent to the
app as raw ASGI, for the tests whose client must see each message as the app sends it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from svir.asgi import Receive, Scope, Send

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Lifespan:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._task: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def start(self) -> None:
        async def receive() -> dict[str, Any]:
            return await self._inbox.get()

        async def send(message: dict[str, Any]) -> None:
            await self._outbox.put(message)

        self._task = asyncio.ensure_future(
            self.app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        )
        await self._inbox.put({"type": "lifespan.startup"})
        message = await asyncio.wait_for(self._outbox.get(), 30)
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"svir did not start: {message}")

    async def stop(self) -> None:
        if self._task is not None:
            await self._inbox.put({"type": "lifespan.shutdown"})
            await asyncio.wait_for(self._task, 30)
            self._task = None


async def post_raw(app: ASGIApp, path: str, body: bytes, send: Send) -> None:
    """POST `body` (JSON) to `path` of `app`, every message of the answer handed to `send` as
    the app sends it; the client stays connected until the app is done."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
    }
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    await app(scope, receive, send)
