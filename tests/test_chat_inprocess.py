"""What an answered request leaves behind in the process: svir in process (keys, limits, ledger,
metrics, the Ollama API; httpx's ASGI transport) against the replay upstream.

A request's objects must be freed when it ends. Left in a reference cycle, they wait for the
garbage collector, whose collections then walk every request in flight: before this was tested,
that was ~6% of svir's CPU under load and pauses of 1-7 ms in the tail latency.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import AsyncGeneratorType, CodeType, CoroutineType, FrameType, FunctionType
from typing import Any

import pytest

from svir.edges.upstream import UpstreamClient
from tests.keys.support import Harness, config_text
from tests.support.upstream import ScriptedServer, ScriptedUpstream
from tests.support.waiting import eventually

CASE = "llama-cpp"  # its recorded answer: "17 × 3 = 51."
PATHS = ["/v1/chat/completions", "/api/chat"]


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="whole")) as server:
        yield server


@pytest.fixture
async def svir(replay: ScriptedServer, tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    text = config_text(replay.base_url, f"sqlite:///{tmp_path / 'svir.db'}")
    harness = Harness(text, fronts=("ollama",))
    await harness.start()
    key, _ = await harness.new_key()
    try:
        yield harness, key
    finally:
        await harness.stop()


async def answer(harness: Harness, key: str, path: str, stream: bool) -> None:
    assert harness.http is not None
    body = {"model": f"fake/{CASE}", "messages": [{"role": "user", "content": "hi"}]}
    body["stream"] = stream
    headers = {"Authorization": f"Bearer {key}"}
    r = await harness.http.post(path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    assert b"51." in r.content


def _code(obj: object) -> CodeType | None:
    if isinstance(obj, FunctionType):
        return obj.__code__
    if isinstance(obj, CoroutineType):
        return obj.cr_code
    if isinstance(obj, AsyncGeneratorType):
        return obj.ag_code
    if isinstance(obj, FrameType):
        return obj.f_code
    return None


def made_by_svir(obj: object) -> bool:
    code = _code(obj)
    if code is not None:
        return "/svir/" in code.co_filename
    return type(obj).__module__.startswith("svir.")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", PATHS)
async def test_an_answered_request_leaves_no_generator_for_the_loop_to_close(
    svir: tuple[Harness, str], path: str, stream: bool
) -> None:
    """An async generator dropped before its end is closed by the event loop's finalizer hook,
    which schedules a task through the loop's self-pipe: a system call, a loop turn and a task
    per request."""
    harness, key = svir
    left: list[str] = []
    firstiter, finalizer = sys.get_asyncgen_hooks()

    def counting(agen: AsyncGeneratorType[Any, Any]) -> None:
        if made_by_svir(agen):
            left.append(agen.__qualname__)
        if finalizer is not None:
            finalizer(agen)

    sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=counting)
    try:
        for _ in range(3):
            await answer(harness, key, path, stream)
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    assert left == []


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", PATHS)
async def test_an_answered_request_leaves_no_cycle_for_the_collector(
    svir: tuple[Harness, str], path: str, stream: bool
) -> None:
    harness, key = svir
    await answer(harness, key, path, stream)  # what the first request sets up for good
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        for _ in range(3):
            await answer(harness, key, path, stream)
        gc.collect()
        cyclic = sorted({type(o).__qualname__ for o in gc.garbage if made_by_svir(o)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []


@pytest.mark.parametrize("stream", [False, True])
async def test_requests_one_after_another_share_one_upstream_connection(
    svir: tuple[Harness, str], replay: ScriptedServer, stream: bool
) -> None:
    """The scripted upstream sends a streamed body's terminating chunk after an await, so
    it comes after the `[DONE]` svir stops at (as a separate segment can from any server over a
    real network): the connection must still go back to the pool, not be opened anew (a TLS
    handshake, for a cloud API) for every request."""
    harness, key = svir
    upstream = harness.app.gateway.client
    assert isinstance(upstream, UpstreamClient)
    pool = upstream.pool
    replay.clear()
    for _ in range(4):
        await answer(harness, key, "/v1/chat/completions", stream)
        # Back in the pool once the terminating chunk arrived: waited for, not slept for (a
        # request sent before then opens a connection of its own, as it should).
        await eventually(lambda: any(pool._idle.values()), "the upstream connection pooled")
    peers = {r.peer for r in replay.chat_requests}
    assert len(replay.chat_requests) == 4 and len(peers) == 1
