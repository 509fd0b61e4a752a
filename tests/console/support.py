"""What the console's tests share: the whole app in process (tests/support/inprocess.py) over the
scripted upstream, its config, and clients that come from this machine or from elsewhere."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.inprocess import InProcess
from tests.support.upstream import ScriptedUpstream

ADMIN_KEY = "console-admin-key-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ELSEWHERE = "192.0.2.7"  # TEST-NET-1: never a real client, and not loopback

# The model list the scripted server gives: one configured model with its context, one more
# that only discovery finds.
MODELS = {
    "object": "list",
    "data": [
        {"id": "tok-3", "object": "model", "owned_by": "vllm", "max_model_len": 8192},
        {"id": "found-later", "object": "model", "owned_by": "vllm", "max_model_len": 4096},
    ],
}

CONFIG = """
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "http://lab.test/v1"
api_key_env = "LAB_KEY"
models = ["tok-3"]
discover = true

[[providers]]
name = "down"
kind = "openai-compatible"
base_url = "http://down.test/v1"
models = ["always-503"]
discover = false
[providers.retry]
attempts = 1
[providers.breaker]
failures = 1
cooldown = 30.0

[[routes]]
name = "smart"
targets = [{ model = "lab/tok-3" }]
fallbacks = ["down/always-503"]
"""


def upstream() -> ScriptedUpstream:
    return ScriptedUpstream(models=MODELS)


@asynccontextmanager
async def app(
    tmp: Path,
    *,
    config: str = CONFIG,
    environ: Mapping[str, str] | None = None,
    handler: Any = None,
    start: bool = True,
) -> AsyncIterator[InProcess]:
    """The whole app over the scripted upstream (started unless not `start`), stopped after."""
    svir = InProcess(tmp, config, handler or upstream(), environ)
    if start:
        await svir.start()
    try:
        yield svir
    finally:
        if start:
            await svir.stop()
        else:
            await svir.http.aclose()


def client(svir: InProcess, host: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client of `svir` whose requests come from `host`."""
    transport = httpx.ASGITransport(app=svir.app, client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://svir", timeout=60)


def assert_error(r: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    """`r` is OpenAI's error shape with `status` and `code`."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)
