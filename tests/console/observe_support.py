"""The console tests' harness: svir in process (the whole app, `build_app`) over the scripted
upstream, with an admin key and an upstream key set; a config's own `[store]` may be given (two
apps on one store stand for two workers); and the live feed read as raw ASGI, each frame as the
app sends it."""

from __future__ import annotations

import asyncio
import inspect
import json
import random
from pathlib import Path
from typing import Any

import httpx
import openai

from svir.config.load import parse_config
from svir.console.observe_api import Console, console_of
from svir.edges.app import App
from svir.policy.resilience import Timing
from svir.server import build_app
from tests.support.asgi import Lifespan
from tests.support.mock_transport import MockTransport
from tests.support.upstream import ScriptedUpstream
from tests.support.waiting import eventually

ADMIN = "admin-key-4f1d9a2c7e"
UP_KEY = "sk-upstream-key-8b3e51d0aa"
CLIENT_TOKEN = "client-token-61c2f0e9b7"
ENV = {"SVIR_ADMIN_KEY": ADMIN, "UP_KEY": UP_KEY}
AUTH = {"authorization": f"Bearer {ADMIN}"}
BASE = "http://upstream.test/v1"

PROVIDERS = f"""
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "{BASE}"
api_key_env = "UP_KEY"
discover = false
[providers.retry]
attempts = 3

[[providers]]
name = "alt"
kind = "openai-compatible"
base_url = "{BASE}"
api_key_env = "UP_KEY"
discover = false

[[routes]]
name = "up/always-503"
fallbacks = ["alt/ok"]
"""


def capture_config(**fields: Any) -> str:
    lines = ["[capture]", "enabled = true"] + [f"{k} = {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


class Svir:
    """The app built from `config` (PROVIDERS and a store added: `store` a URL, else a SQLite
    file in `tmp`), the scripted upstream behind it."""

    def __init__(self, tmp: Path, config: str = "", *, store: str | None = None) -> None:
        url = store or f"sqlite:///{tmp / 'svir.db'}"
        text = PROVIDERS + config + f'\n[store]\nurl = "{url}"\n'
        self.upstream = ScriptedUpstream()
        self.transport = MockTransport(self.upstream)
        timing = Timing(sleep=self._sleep, rng=random.Random(1))
        self.app: App = build_app(parse_config(text), ENV, transport=self.transport, timing=timing)
        self.lifespan = Lifespan(self.app)
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://svir", timeout=30
        )

    @property
    def console(self) -> Console:
        return console_of(self.app)

    def openai(self, api_key: str = CLIENT_TOKEN) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=api_key, base_url="http://svir/v1", max_retries=0, http_client=self.http
        )

    async def _sleep(self, seconds: float) -> None:
        return None

    async def __aenter__(self) -> Svir:
        await self.lifespan.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.lifespan.stop()

    async def chat(
        self, model: str, *, stream: bool = True, content: str = "hi", **extra: Any
    ) -> str:
        """One chat through the openai SDK; the request id svir gave it."""
        client = self.openai()
        messages: Any = [{"role": "user", "content": content}]
        if stream:
            response = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, stream=True, **extra
            )
            chunks = response.parse()
            if inspect.isawaitable(chunks):
                chunks = await chunks
            async for _ in chunks:
                pass
        else:
            response = await client.chat.completions.with_raw_response.create(
                model=model, messages=messages, **extra
            )
            parsed = response.parse()
            if inspect.isawaitable(parsed):
                await parsed
        return response.headers["x-request-id"]

    async def admin(self, path: str, **params: Any) -> httpx.Response:
        return await self.http.get(path, params=params, headers=AUTH)

    async def settled(self) -> None:
        """Every capture written, every ledger row flushed."""
        capturer = self.console.capturer
        if capturer is not None:
            await capturer.drain()
        ledger = self.console.service.ledger
        if ledger is not None:
            await ledger.flush()


class Feed:
    """`GET /admin/events` of `app`, as raw ASGI: the body frames as they are sent. `gate`, when
    given, is waited on before each send after the first (a page that reads slowly)."""

    def __init__(self, app: App, *, gate: asyncio.Event | None = None) -> None:
        self.app = app
        self.gate = gate
        self.status: int | None = None
        self.data = bytearray()
        self.ended = False
        self._gone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sends = 0

    async def start(self) -> None:
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/admin/events",
            "query_string": b"",
            "headers": [(b"authorization", f"Bearer {ADMIN}".encode())],
            "client": ("127.0.0.1", 40000),
        }

        async def receive() -> dict[str, Any]:
            await self._gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                return
            if self._sends and self.gate is not None:
                await self.gate.wait()
            self._sends += 1
            self.data += message.get("body", b"")
            if not message.get("more_body", False):
                self.ended = True

        self._task = asyncio.ensure_future(self.app(scope, receive, send))
        await eventually(lambda: b": connected" in self.data, "the feed to start")

    def events(self) -> list[tuple[str, Any]]:
        """(event, data) of every whole event received (comments left out)."""
        out = []
        for block in bytes(self.data).split(b"\n\n"):
            lines = block.split(b"\n")
            name = next((ln[7:].decode() for ln in lines if ln.startswith(b"event: ")), None)
            data = next((ln[6:] for ln in lines if ln.startswith(b"data: ")), None)
            if name is not None and data is not None:
                out.append((name, json.loads(data)))
        return out

    def named(self, event: str) -> list[Any]:
        return [d for n, d in self.events() if n == event]

    async def close(self) -> None:
        self._gone.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)
