"""The chat route in process (httpx's ASGI transport) against the replay upstream: what a request
leaves behind on the event loop once it is answered."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from types import AsyncGeneratorType

import httpx
import pytest

from svir.config import parse_config
from svir.edges import ollama_api
from svir.edges.app import App
from tests.support.replay import ReplayServerThread

CASE = "llama-cpp"


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServerThread]:
    with ReplayServerThread(split="whole") as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
async def test_an_answered_request_leaves_no_generator_for_the_loop_to_close(
    replay: ReplayServerThread, path: str, stream: bool
) -> None:
    """An async generator dropped before its end is closed by the event loop's finalizer hook,
    which schedules a task through the loop's self-pipe: a system call, a loop turn and a task
    per request on the hot path. svir closes its generators itself."""
    config = f"""
[[providers]]
name = "r"
kind = "openai-compatible"
base_url = "{replay.base_url}"
discover = false
"""
    app = App(parse_config(config), {})
    ollama_api.install(app)
    left: list[str] = []
    firstiter, finalizer = sys.get_asyncgen_hooks()

    def counting(agen: AsyncGeneratorType[object, object]) -> None:
        if "/svir/" in agen.ag_code.co_filename:
            left.append(agen.__qualname__)
        if finalizer is not None:
            finalizer(agen)

    body = {"model": f"r/{CASE}", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    transport = httpx.ASGITransport(app=app)
    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=counting)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
            for _ in range(3):
                r = await client.post(path, json=body)
                assert r.status_code == 200
                assert b"51." in r.content  # the recorded answer: "17 \u00d7 3 = 51."
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
        await app.gateway.close()
    assert left == []
