"""The whole svir app (`build_app`, every front end) served in this process over a
`tests.support.mock_transport.MockTransport` whose handler plays the upstream: the one harness of the in-process
tests. The policy's sleep, random source and clock are injected (nothing waits for real time), and
clients reach the app through httpx's ASGI transport."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from svir.config.load import load_config, parse_config
from svir.edges.app import App
from svir.policy.resilience import Timing
from svir.server import build_app
from svir.transport import Transport
from tests.support.asgi import Lifespan
from tests.support.mock_transport import MockTransport

__all__ = ["InProcess", "serve"]


class InProcess:
    """The app built from `config` (a store in `tmp` added) with `handler` as its upstream.

    `slept` records every wait the policy asked for; `now` is its clock, for a test to move.
    With `config_file`, the config is written there and read from it, and the app reloads that
    file (svir.edges.reload) when asked. `store_url` is the store instead of a SQLite file in
    `tmp`, and `store_fields` more `[store]` lines. `upstream_client`, given, is the app's
    transport in place of the MockTransport (the real client, for tests of the network below it).
    """

    def __init__(
        self,
        tmp: Path,
        config: str,
        handler: Callable[..., Any],
        environ: Mapping[str, str] | None = None,
        *,
        config_file: Path | None = None,
        store_url: str | None = None,
        store_fields: str = "",
        upstream_client: Transport | None = None,
    ) -> None:
        self.transport = MockTransport(handler)
        url = store_url or f"sqlite:///{tmp / 'svir.db'}"
        text = config + f'\n[store]\nurl = "{url}"\n{store_fields}'
        self.slept: list[float] = []
        self.now = 1000.0
        timing = Timing(sleep=self._sleep, rng=random.Random(1), clock=lambda: self.now)
        if config_file is not None:
            config_file.write_text(text)
        self.app: App = build_app(
            load_config(config_file) if config_file is not None else parse_config(text),
            dict(environ or {}),
            transport=upstream_client or self.transport,
            timing=timing,
            source=str(config_file) if config_file is not None else None,
        )
        self.lifespan = Lifespan(self.app)
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://svir", timeout=20
        )
        self.client = self.openai()

    def openai(self, api_key: str = "k") -> openai.AsyncOpenAI:
        """The OpenAI SDK pointed at the app, without its own retries."""
        return openai.AsyncOpenAI(
            api_key=api_key, base_url="http://svir/v1", max_retries=0, http_client=self.http
        )

    def bodies(self) -> list[dict[str, Any]]:
        """Every request body the upstream got, in order."""
        return [r.json() for r in self.transport.requests]

    async def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    async def start(self) -> None:
        await self.lifespan.start()

    async def stop(self) -> None:
        await self.http.aclose()
        await self.lifespan.stop()


@asynccontextmanager
async def serve(
    tmp: Path,
    config: str,
    handler: Callable[..., Any],
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[InProcess]:
    """An `InProcess` app, started, and stopped on the way out."""
    svir = InProcess(tmp, config, handler, environ)
    await svir.start()
    try:
        yield svir
    finally:
        await svir.stop()
