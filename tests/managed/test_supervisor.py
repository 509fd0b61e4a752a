"""The supervisor in process, over real `llama-server` processes serving Gemma 3 270M: one start
for concurrent requests, swaps that never stop a server with requests in flight, a start that
fails, and no process left after `close()`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from svir.config.load import parse_config
from svir.config.model import ProviderConfig
from svir.edges.managed.supervisor import Supervisor
from svir.wire.errors import ErrorKind, UpstreamError
from tests.managed.conftest import servers_with
from tests.support.waiting import eventually

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external


def provider(models: str, settings: str = "") -> ProviderConfig:
    text = (
        '[[providers]]\nname = "m"\nkind = "llamacpp-managed"\n'
        f'[providers.managed]\nchat_template = "builtin:gemma3-tools"\n{settings}\n'
        f"[providers.managed.models]\n{models}\n"
    )
    return parse_config(text).providers[0]


@pytest.fixture
async def two_models(gguf: Path, llama_binary: str) -> AsyncIterator[Supervisor]:
    sup = Supervisor(
        provider(
            f'a = {{ path = "{gguf}", ctx = 1024 }}\nb = {{ path = "{gguf}", ctx = 2048 }}',
            "max_loaded = 1\nidle_unload = 0",
        ),
        binary=llama_binary,
    )
    await sup.start()
    yield sup
    await sup.close()
    assert servers_with(gguf) == []


async def answer(base_url: str) -> str:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            base_url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def ctx_of(proc: psutil.Process) -> str:
    args = proc.cmdline()
    return str(args[args.index("--ctx-size") + 1])


async def test_concurrent_requests_start_the_model_once(two_models: Supervisor, gguf: Path) -> None:
    urls = await asyncio.gather(*(two_models.ensure("a") for _ in range(5)))
    assert len(set(urls)) == 1
    [proc] = servers_with(gguf)
    state = two_models.snapshot()["models"]["a"]
    assert (state["state"], state["loads"], state["in_flight"], state["pid"]) == (
        "ready",
        1,
        5,
        proc.pid,
    )
    assert await answer(urls[0])
    for _ in range(5):
        two_models.release("a")
    assert two_models.snapshot()["models"]["a"]["in_flight"] == 0


async def test_a_swap_waits_for_the_requests_in_flight(two_models: Supervisor, gguf: Path) -> None:
    await two_models.ensure("a")  # held: a request in flight
    [a] = servers_with(gguf)

    def state(model: str) -> dict[str, Any]:
        found: dict[str, Any] = two_models.snapshot()["models"][model]
        return found

    b_wanted = asyncio.create_task(two_models.ensure("b"))
    # b's load has seen a busy and waits for it (polled for: no time is assumed enough).
    await eventually(lambda: state("a")["state"] == "draining", "a asked to give its place")
    # b waits; a keeps serving, and a new request for a waits too (a is giving its place).
    assert not b_wanted.done() and state("b")["waiting"] == 1
    assert servers_with(gguf) == [a]
    a_again = asyncio.create_task(two_models.ensure("a"))
    await eventually(lambda: state("a")["waiting"] == 1, "the new request for a waiting")
    assert not a_again.done()

    two_models.release("a")
    b_url = await asyncio.wait_for(b_wanted, 60)
    [b] = servers_with(gguf)
    assert b.pid != a.pid and ctx_of(b) == "2048"
    assert not psutil.pid_exists(a.pid) or a.status() == psutil.STATUS_ZOMBIE
    assert await answer(b_url)
    # b is in flight now: a comes back only once b is released.
    await eventually(lambda: state("b")["state"] == "draining", "b asked to give its place")
    assert not a_again.done()
    two_models.release("b")
    a_url = await asyncio.wait_for(a_again, 60)
    [a2] = servers_with(gguf)
    assert ctx_of(a2) == "1024"
    assert await answer(a_url)
    two_models.release("a")
    snap = two_models.snapshot()
    assert snap["loaded"] == ["a"]
    assert (snap["models"]["a"]["loads"], snap["models"]["b"]["loads"]) == (2, 1)


async def test_an_idle_model_is_swapped_at_once(two_models: Supervisor, gguf: Path) -> None:
    for name, ctx in [("a", "1024"), ("b", "2048"), ("a", "1024")]:
        url = await two_models.ensure(name)
        [proc] = servers_with(gguf)
        assert ctx_of(proc) == ctx
        assert await answer(url)
        two_models.release(name)


async def test_a_request_that_gives_up_while_waiting_holds_nothing(
    two_models: Supervisor, gguf: Path
) -> None:
    waiting = asyncio.create_task(two_models.ensure("a"))
    await eventually(
        lambda: two_models.snapshot()["models"]["a"]["waiting"] == 1, "the request waiting"
    )
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # The start goes on for whoever asks next; nobody holds the model.
    url = await two_models.ensure("a")
    assert await answer(url)
    two_models.release("a")
    assert two_models.snapshot()["models"]["a"]["in_flight"] == 0
    # So it can be swapped out at once.
    await two_models.ensure("b")
    two_models.release("b")
    assert two_models.snapshot()["loaded"] == ["b"]


async def test_an_unknown_model_is_refused(two_models: Supervisor) -> None:
    with pytest.raises(UpstreamError) as info:
        await two_models.ensure("c")
    err = info.value
    assert (err.kind, err.status, err.code, err.param) == (
        ErrorKind.REJECTED,
        404,
        "model_not_found",
        "model",
    )
    assert "'m/c' does not exist" in err.message and "serves a, b" in err.message


async def test_a_model_that_cannot_load_fails_with_the_log(
    tmp_path: Path, llama_binary: str
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all" * 100)
    sup = Supervisor(provider(f'x = "{broken}"'), binary=llama_binary)
    await sup.start()
    try:
        with pytest.raises(UpstreamError) as info:
            await asyncio.wait_for(sup.ensure("x"), 60)
        assert info.value.kind is ErrorKind.OTHER
        assert "exited with status" in info.value.message
        assert "before it was ready" in info.value.message
        state = sup.snapshot()["models"]["x"]
        assert state["state"] == "stopped" and state["last_error"]
        assert servers_with(broken) == []
    finally:
        await sup.close()


async def test_close_stops_every_server(gguf: Path, llama_binary: str) -> None:
    sup = Supervisor(
        provider(f'a = "{gguf}"\nb = {{ path = "{gguf}", ctx = 2048 }}', "max_loaded = 2"),
        binary=llama_binary,
    )
    await sup.start()
    await asyncio.gather(sup.ensure("a"), sup.ensure("b"))  # both in flight
    procs = servers_with(gguf)
    assert len(procs) == 2
    await sup.close()
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == []
    assert servers_with(gguf) == []
    with pytest.raises(UpstreamError, match="shutting down"):
        await sup.ensure("a")
