"""Helpers for the keys tests: an in-process svir (App + lifespan over ASGI), configs, SSE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import httpx

from svir.config.load import parse_config
from svir.config.model import Config
from svir.edges.app import App
from svir.edges.keys_service import KeysService, install
from svir.protocols.anthropic import routes as anthropic
from svir.protocols.completions import routes as completions
from svir.protocols.embeddings import routes as embeddings
from svir.protocols.ollama import routes as ollama
from svir.protocols.openai_chat import routes as openai_chat
from svir.protocols.responses import routes as responses
from svir.protocols.threads import routes as threads
from svir.server import thread_service
from svir.store.responses import SqlResponseStore
from tests.support.asgi import Lifespan

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
ADMIN_KEY = "admin-test-key-0123456789"


def drop_redis_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def config_text(
    upstream: str,
    store_url: str,
    *,
    backend: str = "memory",
    redis_prefix: str = "svir",
    extra: str = "",
    api_key_env: str | None = None,
    redis_url: str = REDIS_URL,
) -> str:
    key_line = f'api_key_env = "{api_key_env}"\n' if api_key_env else ""
    return f"""
[store]
url = "{store_url}"

[limits]
backend = "{backend}"
redis_url = "{redis_url}"
redis_prefix = "{redis_prefix}"
default_completion_tokens = 64
extend_tokens = 4

[ledger]
flush_seconds = 0.05

[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "{upstream}"
discover = false
{key_line}
[[providers]]
name = "other"
kind = "openai-compatible"
base_url = "{upstream}"
discover = false
{extra}
"""


class Harness:
    """An App with keys installed, started, and an httpx client over ASGI."""

    default_upstream: ClassVar[str] = ""
    default_tmp: ClassVar[Path] = Path(".")

    def __init__(
        self,
        text: str | None = None,
        *,
        store_url: str | None = None,
        backend: str = "memory",
        redis_prefix: str = "svir",
        redis_url: str = REDIS_URL,
        extra: str = "",
        environ: dict[str, str] | None = None,
        client_host: str = "127.0.0.1",
        span_exporter: Any = None,
        fronts: tuple[str, ...] = (),
    ) -> None:
        url = store_url or f"sqlite:///{self.default_tmp / 'svir.db'}"
        self.text = text or config_text(
            self.default_upstream,
            url,
            backend=backend,
            redis_prefix=redis_prefix,
            redis_url=redis_url,
            extra=extra,
        )
        self.config: Config = parse_config(self.text)
        self.environ = {"SVIR_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
        self.app = App(self.config, self.environ)
        self.service: KeysService = install(self.app, span_exporter=span_exporter)
        openai_chat.install(self.app)
        if "ollama" in fronts:
            ollama.install(self.app)
        if "threads" in fronts:
            threads.install(self.app, thread_service(self.app))
        if "anthropic" in fronts:
            anthropic.install(self.app)
        if "completions" in fronts:
            completions.install(self.app)
        if "embeddings" in fronts:
            embeddings.install(self.app)
        if "responses" in fronts:
            responses.install(self.app, SqlResponseStore(self.config.store.url))
        # As build_app composes them: the keys service's observers (no console here).
        self.app.compose(self.service.observers())
        self.client_host = client_host
        self._lifespan = Lifespan(self.app)
        self.http: httpx.AsyncClient | None = None

    async def start(self) -> Harness:
        await self._lifespan.start()
        self.http = self.client()
        return self

    def client(self, host: str | None = None) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, client=(host or self.client_host, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://svir", timeout=30)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        await self._lifespan.stop()

    # Helpers

    async def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        return await self.http.request(method, path, headers=headers, **kw)

    async def new_key(self, **spec: Any) -> tuple[str, dict[str, Any]]:
        spec.setdefault("name", "test")
        r = await self.admin("POST", "/admin/keys", json=spec)
        assert r.status_code == 201, r.text
        body = r.json()
        return body["key"], body

    async def chat(
        self, key: str | None, model: str = "fake/tok-3", *, stream: bool = True, **body: Any
    ) -> httpx.Response:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
        payload.update(body)
        return await self.http.post("/v1/chat/completions", json=payload, headers=headers)

    async def chat_usage(self, key: str | None, since: str | None = None) -> dict[str, Any]:
        assert self.http is not None
        await self.flush()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        query = f"?since={since}" if since else ""
        r = await self.http.get(f"/v1/usage{query}", headers=headers)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    async def flush(self) -> None:
        await self.service.gate.drain()
        if self.service.ledger is not None:
            await self.service.ledger.flush()


def sse_data(raw: bytes | str) -> list[str]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                out.append(line[6:])
    return out


def frames(raw: bytes | str) -> list[Any]:
    return [d if d == "[DONE]" else json.loads(d) for d in sse_data(raw)]


def content_of(raw: bytes | str) -> str:
    text = []
    for f in frames(raw):
        if isinstance(f, dict):
            for choice in f.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)
