"""A reload and the `llama-server` processes svir runs, over the real server and Gemma 3 270M: a
model whose own settings changed (its context) restarts once its requests end, and only it; a
change that is not the server's (another model, the supervisor's settings, a route) restarts
nothing; a removed model's server stops. Through the supervisor in process, and through a real
`svir serve` taking SIGHUP."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from svir.config.load import parse_config
from svir.config.model import ProviderConfig
from svir.edges.managed.supervisor import Supervisor
from svir.wire.errors import UpstreamError
from tests.managed.conftest import children_servers, servers_with
from tests.support.svir_proc import SvirProcess
from tests.support.waiting import eventually

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external


def managed(models: str, settings: str = "idle_unload = 0\nmax_loaded = 2") -> str:
    return (
        '[[providers]]\nname = "m"\nkind = "llamacpp-managed"\n'
        f'[providers.managed]\nchat_template = "builtin:gemma3-tools"\n{settings}\n'
        f"[providers.managed.models]\n{models}\n"
    )


def provider(models: str, settings: str = "idle_unload = 0\nmax_loaded = 2") -> ProviderConfig:
    return parse_config(managed(models, settings)).providers[0]


def ctx_of(proc: psutil.Process) -> str:
    args = proc.cmdline()
    return str(args[args.index("--ctx-size") + 1])


async def answer(base_url: str) -> str:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            base_url + "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def one(path: Path) -> psutil.Process | None:
    found = servers_with(path)
    return found[0] if len(found) == 1 else None


async def test_a_context_change_restarts_that_model_once_its_requests_end(
    gguf: Path, llama_binary: str, tmp_path: Path
) -> None:
    other = tmp_path / "other.gguf"
    other.symlink_to(gguf.resolve())
    both = 'a = {{ path = "{a}", ctx = {ctx} }}\nb = {{ path = "{b}", ctx = 1024 }}'
    sup = Supervisor(provider(both.format(a=gguf, b=other, ctx=1024)), binary=llama_binary)
    await sup.start()
    try:
        url_a = await sup.ensure("a")  # in flight until released
        await sup.ensure("b")
        sup.release("b")
        [a1], [b1] = servers_with(gguf), servers_with(other)
        assert sup.reconfigure(provider(both.format(a=gguf, b=other, ctx=2048))) == ["a"]
        # A new request waits for the restart; the one in flight goes on with the old server.
        a_again = asyncio.create_task(sup.ensure("a"))

        def waits_for_the_restart() -> bool:
            a = sup.snapshot()["models"]["a"]
            return bool(a["state"] == "draining" and a["waiting"] == 1)

        await eventually(waits_for_the_restart, "the new request waiting for a's restart")
        assert not a_again.done()
        assert servers_with(gguf) == [a1] and await answer(url_a)
        sup.release("a")
        url = await asyncio.wait_for(a_again, 90)
        [a2] = servers_with(gguf)
        assert a2.pid != a1.pid and ctx_of(a2) == "2048"
        assert await answer(url)
        sup.release("a")
        assert servers_with(other) == [b1]  # b's settings did not change: untouched
        state = sup.snapshot()["models"]
        assert (state["a"]["loads"], state["b"]["loads"], state["a"]["ctx"]) == (2, 1, 2048)
    finally:
        await sup.close()
    assert servers_with(gguf) == [] and servers_with(other) == []


async def test_changes_that_are_not_the_servers_restart_nothing(
    gguf: Path, llama_binary: str, tmp_path: Path
) -> None:
    other = tmp_path / "other.gguf"
    other.symlink_to(gguf.resolve())
    sup = Supervisor(provider(f'a = {{ path = "{gguf}", ctx = 1024 }}'), binary=llama_binary)
    await sup.start()
    try:
        url = await sup.ensure("a")
        sup.release("a")
        [a1] = servers_with(gguf)
        changed = provider(
            f'a = {{ path = "{gguf}", ctx = 1024 }}\nb = "{other}"',
            "idle_unload = 0\nmax_loaded = 3\nstart_timeout = 60",
        )
        assert sup.reconfigure(changed) == []
        await asyncio.sleep(1.0)  # the watcher looked (every 0.5 s) and found nothing to do
        assert await sup.ensure("a") == url
        sup.release("a")
        assert servers_with(gguf) == [a1] and sup.snapshot()["models"]["a"]["loads"] == 1
        assert sup.snapshot()["max_loaded"] == 3
        # A removed model's server stops once idle, and the model is no more.
        assert sup.reconfigure(provider(f'b = "{other}"')) == []
        await eventually(lambda: servers_with(gguf) == [], "the removed model's server stopping")
        with pytest.raises(UpstreamError, match="does not exist"):
            await sup.ensure("a")
    finally:
        await sup.close()


def test_svir_restarts_a_managed_model_on_sighup_only_when_it_changed(
    gguf: Path, tmp_path: Path
) -> None:
    model = 'local = {{ path = "{path}", ctx = {ctx} }}'
    config = managed(model.format(path=gguf, ctx=1024), "idle_unload = 0")
    svir = SvirProcess(config, tmp_path).start(timeout=60)
    try:
        assert svir.proc is not None and svir.config_path is not None
        pid = svir.proc.pid

        def chat() -> None:
            r = httpx.post(
                svir.base_url + "/chat/completions",
                json={"model": "m/local", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 4},
                timeout=120,
            )  # fmt: skip
            assert r.status_code == 200, (r.text, svir.log()[-3000:])

        def generation() -> int:
            r = httpx.get(svir.url + "/healthz?verbose=1", timeout=10)
            return int(r.json()["reload"]["generation"])

        def settle(want: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 90
            while not want():
                assert time.monotonic() < deadline, f"{what}: {svir.log()[-3000:]}"
                time.sleep(0.1)

        chat()
        [first] = children_servers(pid)
        assert ctx_of(first) == "1024"
        alias = '[[routes]]\nname = "alias"\ntargets = [{ model = "m/local" }]\n'
        svir.config_path.write_text(config + alias)
        svir.proc.send_signal(signal.SIGHUP)
        settle(lambda: generation() >= 1, "the reload of a new route")
        chat()
        assert children_servers(pid) == [first]  # nothing of its server changed
        svir.config_path.write_text(managed(model.format(path=gguf, ctx=2048), "idle_unload = 0"))
        svir.proc.send_signal(signal.SIGHUP)
        settle(lambda: generation() >= 2, "the reload of a new context")

        def restarted() -> bool:
            now = children_servers(pid)
            return len(now) == 1 and now[0].pid != first.pid and ctx_of(now[0]) == "2048"

        settle(restarted, "the restart with the new context")
        chat()
        assert "restart: its settings changed in the config" in svir.log()
    finally:
        svir.stop()
