"""Config reloads of a real `svir serve`, over the scripted upstream on loopback HTTP: on
SIGHUP, on a change of the file (also a Kubernetes-style `..data` symlink swap), on
`POST /admin/reload`; with `--workers 2` every worker reloads; and a config rewritten again and
again under a steady load of streamed requests fails none of them."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

ADMIN = "reload-admin"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def provider(name: str, base_url: str) -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "openai-compatible"\nbase_url = "{base_url}"\n'
        "discover = false\n"
    )


def route(name: str, *targets: str) -> str:
    listed = ", ".join(f'{{ model = "{t}" }}' for t in targets)
    return f'[[routes]]\nname = "{name}"\ntargets = [{listed}]\n'


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(slow_delay=0.02)) as server:
        yield server


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., SvirProcess]]:
    started: list[SvirProcess] = []

    def make(config: str | None, *args: str) -> SvirProcess:
        proc = SvirProcess(config, tmp_path, env={"SVIR_ADMIN_KEY": ADMIN}, args=args)
        started.append(proc)
        return proc.start(timeout=60)

    yield make
    for proc in started:
        proc.stop()


def health(svir: SvirProcess) -> dict[str, Any]:
    with httpx.Client() as http:  # a new connection: with workers, any of them answers
        r = http.get(svir.url + "/healthz?verbose=1", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def wait_for(condition: Callable[[], bool], what: str, svir: SvirProcess) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen: {svir.log()[-3000:]}")


def chat(svir: SvirProcess, model: str) -> httpx.Response:
    return httpx.post(
        svir.base_url + "/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def reloaded(svir: SvirProcess, trigger: str, generation: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        state = health(svir)["reload"]
        return bool(state["trigger"] == trigger and state["generation"] >= generation)

    return check


def test_sighup_reloads(start: Callable[..., SvirProcess], upstream: ScriptedServer) -> None:
    plain = provider("plain", upstream.base_url)
    svir = start(plain)
    assert chat(svir, "alias").status_code == 404
    assert svir.config_path is not None and svir.proc is not None
    svir.config_path.write_text(plain + route("alias", "plain/ok"))
    svir.proc.send_signal(signal.SIGHUP)
    wait_for(reloaded(svir, "SIGHUP"), "a reload on SIGHUP", svir)
    answer = chat(svir, "alias")
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == (
        "hello world"
    )
    state = health(svir)["reload"]
    assert state["source"] == str(svir.config_path) and state["error"] is None
    assert svir.proc.poll() is None  # SIGHUP did not end it
    assert "config reloaded (SIGHUP)" in svir.log()


def test_a_changed_file_is_reloaded(
    start: Callable[..., SvirProcess], upstream: ScriptedServer
) -> None:
    plain = provider("plain", upstream.base_url)
    svir = start(plain)
    assert svir.config_path is not None
    svir.config_path.write_text(plain + route("alias", "plain/ok"))  # edited in place
    wait_for(lambda: chat(svir, "alias").status_code == 200, "the new route", svir)
    state = health(svir)["reload"]
    assert (state["trigger"], state["changed"]) == ("file", ["routes.alias: added"])
    # An invalid file is reported, and changes nothing.
    svir.config_path.write_text(plain + route("alias", "nowhere/ok"))
    wait_for(lambda: health(svir)["reload"]["error"] is not None, "the error reported", svir)
    error = health(svir)["reload"]["error"]
    assert error.startswith(f"{svir.config_path}: routes[0].targets[0].model:")
    assert chat(svir, "alias").status_code == 200
    assert "config reload failed (file), nothing changed" in svir.log()


def test_a_swapped_symlink_is_reloaded(
    start: Callable[..., SvirProcess], upstream: ScriptedServer, tmp_path: Path
) -> None:
    # A Kubernetes config map: svir.toml -> ..data/svir.toml, ..data -> a dated directory;
    # an update writes a new directory and swaps ..data in one rename.
    mount = tmp_path / "config"
    plain = provider("plain", upstream.base_url)
    first = mount / "..2026_12_01_first"
    first.mkdir(parents=True)
    (first / "svir.toml").write_text(plain)
    (mount / "..data").symlink_to(first.name)
    (mount / "svir.toml").symlink_to("..data/svir.toml")
    svir = start(None, "--config", str(mount / "svir.toml"))
    assert chat(svir, "alias").status_code == 404
    second = mount / "..2026_12_01_second"
    second.mkdir()
    (second / "svir.toml").write_text(plain + route("alias", "plain/ok"))
    (mount / "..data_tmp").symlink_to(second.name)
    os.replace(mount / "..data_tmp", mount / "..data")
    wait_for(lambda: chat(svir, "alias").status_code == 200, "the swapped config", svir)
    assert health(svir)["reload"]["trigger"] == "file"


def test_the_admin_endpoint_reloads(
    start: Callable[..., SvirProcess], upstream: ScriptedServer
) -> None:
    plain = provider("plain", upstream.base_url)
    svir = start(plain)
    assert svir.config_path is not None
    svir.config_path.write_text(plain + route("alias", "plain/ok"))
    r = httpx.post(svir.url + "/admin/reload", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    # The file watch may have seen the change first: then this reload found nothing new.
    assert body["ok"] is True and body["error"] is None
    assert body["changed"] in (["routes.alias: added"], [])
    assert chat(svir, "alias").status_code == 200  # applied before the answer
    refused = httpx.post(svir.url + "/admin/reload", timeout=30)
    assert refused.status_code == 401


def generations(svir: SvirProcess, want: int = 2) -> dict[int, dict[str, Any]]:
    """Each worker's reload state, by pid, asked over new connections until `want` answered
    (bounded by a count: the kernel may hand many connections in a row to one worker)."""
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(500):
        body = health(svir)
        seen[body["pid"]] = body["reload"]
        if len(seen) >= want:
            break
    return seen


def test_every_worker_reloads(start: Callable[..., SvirProcess], upstream: ScriptedServer) -> None:
    plain = provider("plain", upstream.base_url)
    svir = start(plain, "--workers", "2")
    assert svir.proc is not None and svir.config_path is not None
    assert len(generations(svir)) == 2
    svir.config_path.write_text(plain + route("alias", "plain/ok"))
    svir.proc.send_signal(signal.SIGHUP)  # to the parent, which sends it to each worker

    def both_reloaded() -> bool:
        seen = generations(svir)
        return len(seen) == 2 and all(
            s["trigger"] == "SIGHUP" and s["generation"] >= 1 for s in seen.values()
        )

    wait_for(both_reloaded, "a reload in both workers", svir)
    before = generations(svir)
    for _ in range(6):
        assert chat(svir, "alias").status_code == 200
    # The admin endpoint reloads the worker it reached, which has the parent signal the others.
    r = httpx.post(svir.url + "/admin/reload", headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["ok"] is True

    def both_again() -> bool:
        seen = generations(svir)
        return len(seen) == 2 and all(
            seen[pid]["generation"] > before[pid]["generation"] for pid in before
        )

    wait_for(both_again, "a reload of both workers from one admin request", svir)
    assert svir.proc.poll() is None
    assert "Traceback" not in svir.log()


async def test_reloads_under_load_fail_no_request(
    start: Callable[..., SvirProcess], upstream: ScriptedServer
) -> None:
    p1, p2, p3 = (provider(n, upstream.base_url) for n in ("p1", "p2", "p3"))
    # Each config moves "smart" elsewhere; the second removes p1 while requests to it stream.
    configs = [
        p1 + p2 + route("smart", "p1/slow"),
        p2 + route("smart", "p2/slow"),
        p1 + p2 + p3 + route("smart", "p1/slow", "p3/slow"),
        p3 + route("smart", "p3/slow") + "[server]\nport = 1\n",
    ]
    svir = start(configs[0])
    assert svir.config_path is not None
    path = svir.config_path
    failures: list[str] = []
    done = 0
    total, parallel = 200, 8

    async def one(http: httpx.AsyncClient) -> None:
        nonlocal done
        body = {"model": "smart", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        try:
            async with http.stream("POST", svir.base_url + "/chat/completions", json=body) as r:
                text = (await r.aread()).decode()
            if r.status_code != 200 or not text.endswith("data: [DONE]\n\n") or "error" in text:
                failures.append(f"{r.status_code}: {text[-300:]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
        done += 1

    async def load() -> None:
        gate = asyncio.Semaphore(parallel)
        async with httpx.AsyncClient(timeout=60) as http:

            async def bounded() -> None:
                async with gate:
                    await one(http)

            await asyncio.gather(*(bounded() for _ in range(total)))

    async def rewrite() -> int:
        reloads = 0
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(1, 4 * len(configs) + 1):
                while done < i * total // (4 * len(configs) + 2):
                    await asyncio.sleep(0.01)
                spare = path.with_suffix(".new")
                spare.write_text(configs[i % len(configs)])
                os.replace(spare, path)
                r = await http.post(svir.url + "/admin/reload", headers=AUTH)
                assert r.status_code == 200 and r.json()["ok"] is True, r.text
                reloads += 1
        return reloads

    _, reloads = await asyncio.gather(load(), rewrite())
    assert failures == []
    assert done == total and reloads == 16
    state = health(svir)["reload"]
    assert state["generation"] >= 16 and state["restart_needed"] in ([], ["server.port"])
    assert "Traceback" not in svir.log()


def test_without_a_config_file_sighup_says_there_is_nothing_to_reload(
    start: Callable[..., SvirProcess],
) -> None:
    svir = start(None)  # the bundled local model's default config
    assert svir.proc is not None
    assert health(svir)["reload"]["source"] is None
    svir.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "there is nothing to reload" in svir.log(), "the log line", svir)
    assert svir.proc.poll() is None and health(svir)["reload"]["generation"] == 0
