"""The Ollama handlers in process, where a test can stand in for a managed server or the clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from svir.config.load import parse_config
from svir.edges.app import App
from svir.protocols.ollama import routes as ollama
from svir.wire.errors import ErrorKind, UpstreamError

CONFIG = """
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://127.0.0.1:9/v1"
discover = false
models = ["m"]
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def app() -> App:
    return App(parse_config(CONFIG), {})


async def request(app: App, method: str, path: str, body: Any = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        return await client.request(method, path, json=body)


async def test_load_starts_a_managed_server(app: App) -> None:
    ollama.install(app)
    started: list[str] = []

    async def ensure(model_id: str) -> str:
        started.append(model_id)
        return "http://127.0.0.1:9/v1"

    app.router.set_ensure("lab", ensure)
    r = await request(app, "POST", "/api/chat", {"model": "lab/m:latest"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    assert started == ["m"]
    # Unloading is left to the server's idle timer: nothing is started for it.
    r = await request(app, "POST", "/api/chat", {"model": "lab/m", "keep_alive": 0})
    assert r.json()["done_reason"] == "unload" and started == ["m"]


async def test_a_load_that_fails_is_an_ollama_error(app: App) -> None:
    ollama.install(app)

    async def ensure(model_id: str) -> str:
        raise UpstreamError(ErrorKind.TIMEOUT, "llama-server did not become healthy")

    app.router.set_ensure("lab", ensure)
    r = await request(app, "POST", "/api/chat", {"model": "lab/m", "messages": []})
    assert r.status_code == 504
    assert r.json() == {"error": "llama-server did not become healthy"}


async def test_ps_forgets_a_model_after_the_keep_alive(app: App) -> None:
    clock = Clock()
    api = ollama.OllamaAPI(app, clock=clock)
    for method, path, handler in api.routes():
        app.routes.add(method, path, handler)
    api.recent["lab/m"] = clock.now
    api.recent["lab/old"] = clock.now - 200
    r = await request(app, "GET", "/api/ps")
    models = r.json()["models"]
    assert [m["name"] for m in models] == ["lab/m", "lab/old"]
    assert models[0]["expires_at"] == "2027-01-15T08:05:00.000000Z"
    assert models[0]["details"]["format"] == "gguf"
    clock.now += 150
    r = await request(app, "GET", "/api/ps")
    assert [m["name"] for m in r.json()["models"]] == ["lab/m"]
    clock.now += 300
    assert (await request(app, "GET", "/api/ps")).json() == {"models": []}


async def test_show_needs_a_model(app: App) -> None:
    ollama.install(app)
    for body in ({}, {"model": ""}, {"model": 3}, [1]):
        r = await request(app, "POST", "/api/show", body)
        assert r.status_code == 400 and set(r.json()) == {"error"}
    r = await request(app, "POST", "/api/show", {"name": "lab/m"})  # the old field
    assert r.status_code == 200 and r.json()["details"]["format"] == "gguf"
    r = await request(app, "POST", "/api/show", {"model": "nobody"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
