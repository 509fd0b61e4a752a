"""A real `svir serve` with a `llamacpp-managed` provider, over real `llama-server` processes:
the first request starts the server; a killed server is restarted; two models swap with only one
process alive; an idle server is stopped and comes back; SIGTERM to svir leaves no process; and
without a config svir serves `local/gemma-3-270m`.

Gemma 3 270M is a base model that never stops by itself: every request bounds it with max_tokens.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.managed.conftest import children_servers, servers_with
from tests.support.svir_proc import SvirProcess
from tests.support.waiting import PATIENCE, wait_until

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

TIMEOUT = httpx.Timeout(120.0, connect=5.0)


def config(models: str, settings: str = "") -> str:
    return (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
        f'[providers.managed]\nchat_template = "builtin:gemma3-tools"\n{settings}\n'
        f"[providers.managed.models]\n{models}\n"
    )


@pytest.fixture
def start_svir(tmp_path: Path) -> Iterator[Callable[[str | None], SvirProcess]]:
    started: list[SvirProcess] = []

    def start(text: str | None) -> SvirProcess:
        # A store of its own (threads, keys), not the user's.
        proc = SvirProcess(text, tmp_path, env={"XDG_DATA_HOME": str(tmp_path / "data")}).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def chat(svir: SvirProcess, model: str = "local/gemma-3-270m", **extra: Any) -> dict[str, Any]:
    r = httpx.post(
        svir.base_url + "/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        },
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, (r.status_code, r.text, svir.log()[-3000:])
    body: dict[str, Any] = r.json()
    assert body["choices"][0]["message"]["content"], body
    return body


def pid_of(svir: SvirProcess) -> int:
    assert svir.proc is not None
    return svir.proc.pid


def managed_state(svir: SvirProcess) -> dict[str, Any]:
    r = httpx.get(svir.url + "/healthz?verbose=1", timeout=PATIENCE)
    state: dict[str, Any] = r.json()["managed"]["local"]
    return state


def hang_up_when(
    svir: SvirProcess, body: dict[str, Any], ready: Callable[[], bool], what: str
) -> None:
    """Send `body` as a chat request, and close the connection unanswered once `ready()` holds:
    a client gone at the stage `ready` says, however long the stage before it took."""
    payload = json.dumps(body).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
    )
    with socket.create_connection(("127.0.0.1", svir.port), timeout=PATIENCE) as sock:
        sock.sendall(head + payload)
        wait_until(ready, what)


def test_the_first_request_starts_the_server(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"'))
    assert children_servers(pid_of(svir)) == []  # nothing runs before it is asked for
    models = httpx.get(svir.base_url + "/models", timeout=PATIENCE).json()
    assert [m["id"] for m in models["data"]] == ["local/gemma-3-270m"]

    body = chat(svir)
    assert body["model"] == "local/gemma-3-270m"
    assert body["usage"]["completion_tokens"] == 8
    [server] = children_servers(pid_of(svir))
    assert str(gguf) in server.cmdline()
    state = managed_state(svir)
    model = state["models"]["gemma-3-270m"]
    assert state["loaded"] == ["gemma-3-270m"]
    assert (model["state"], model["pid"], model["loads"], model["in_flight"]) == (
        "ready",
        server.pid,
        1,
        0,
    )
    assert model["port"] > 0 and model["last_used"] > 0
    # Streamed too, on the same server.
    with httpx.stream(
        "POST",
        svir.base_url + "/chat/completions",
        json={
            "model": "local/gemma-3-270m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        },
        timeout=TIMEOUT,
    ) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert text.rstrip().endswith("data: [DONE]")
    assert [p.pid for p in children_servers(pid_of(svir))] == [server.pid]


def test_a_killed_server_is_restarted(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"'))
    chat(svir)
    [first] = children_servers(pid_of(svir))
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # The next request gets an answer from a new server.
    chat(svir)
    [second] = children_servers(pid_of(svir))
    assert second.pid != first.pid
    model = managed_state(svir)["models"]["gemma-3-270m"]
    assert model["unexpected_exits"] == 1
    assert model["last_exit"] == -signal.SIGKILL
    assert model["pid"] == second.pid
    assert '"llama-server exited by itself"' in svir.log()


def test_the_watcher_restarts_a_server_in_use(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"'))
    chat(svir)
    [first] = children_servers(pid_of(svir))
    first.send_signal(signal.SIGKILL)
    # Used a moment ago: restarted without waiting for the next request.
    wait_until(
        lambda: [p.pid for p in children_servers(pid_of(svir))] not in ([], [first.pid]),
        "a new llama-server",
    )
    wait_until(
        lambda: managed_state(svir)["models"]["gemma-3-270m"]["state"] == "ready",
        "the new server is ready",
    )
    chat(svir)


def test_two_models_swap_with_one_process_alive(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(
        config(
            f'small = {{ path = "{gguf}", ctx = 1024 }}\nlarge = {{ path = "{gguf}", ctx = 2048 }}',
            "max_loaded = 1",
        )
    )
    pids = []
    for model, ctx in [("small", "1024"), ("large", "2048"), ("small", "1024"), ("large", "2048")]:
        chat(svir, f"local/{model}")
        servers = children_servers(pid_of(svir))
        assert len(servers) == 1, servers
        args = servers[0].cmdline()
        assert args[args.index("--ctx-size") + 1] == ctx
        pids.append(servers[0].pid)
        assert managed_state(svir)["loaded"] == [model]
    assert len(set(pids)) == 4
    state = managed_state(svir)["models"]
    assert (state["small"]["loads"], state["large"]["loads"]) == (2, 2)
    assert (state["small"]["state"], state["large"]["state"]) == ("stopped", "ready")


def test_an_idle_server_is_stopped_and_comes_back(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"', "idle_unload = 2"))
    chat(svir)
    [server] = children_servers(pid_of(svir))
    server.wait(PATIENCE)  # stopped by svir once idle for 2 s
    assert children_servers(pid_of(svir)) == []
    assert managed_state(svir)["models"]["gemma-3-270m"]["state"] == "stopped"
    assert '"reason":"idle for 2 s"' in svir.log()
    chat(svir)
    [again] = children_servers(pid_of(svir))
    assert again.pid != server.pid


def test_sigterm_leaves_no_server_behind(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(
        config(
            f'a = "{gguf}"\nb = {{ path = "{gguf}", ctx = 2048 }}',
            "max_loaded = 2",
        )
    )
    chat(svir, "local/a")
    chat(svir, "local/b")
    servers = children_servers(pid_of(svir))
    assert len(servers) == 2
    assert svir.proc is not None
    svir.proc.send_signal(signal.SIGTERM)
    # uvicorn ends by raising the signal again once it has shut down.
    assert svir.proc.wait(20) in (0, -signal.SIGTERM)
    _, alive = psutil.wait_procs(servers, timeout=10)
    assert alive == []
    assert servers_with(gguf) == []  # no orphan anywhere with this model in its command line
    log = svir.log()
    assert log.count('"reason":"shutdown"') == 2
    assert "llama-server exited by itself" not in log
    # Nor a folder: the servers' logs went with svir.
    assert list(svir.temp_dir.iterdir()) == []


def test_a_killed_svir_leaves_no_server_behind(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"'))
    chat(svir)
    servers = children_servers(pid_of(svir))
    assert len(servers) == 1
    assert svir.proc is not None
    svir.proc.kill()  # no shutdown hook runs: the kernel's parent-death signal ends the server
    svir.proc.wait(10)
    _, alive = psutil.wait_procs(servers, timeout=10)
    assert alive == []
    assert servers_with(gguf) == []
    # What nothing could remove is in this test's temp dir (pytest's to clean), not the machine's.
    left = [p.name for p in svir.temp_dir.iterdir()]
    assert len(left) == 1 and left[0].startswith("svir-local-"), left


def test_without_a_config_svir_serves_the_local_gemma(
    start_svir: Callable[[str | None], SvirProcess],
) -> None:
    svir = start_svir(None)  # and without $SVIR_CONFIG
    models = httpx.get(svir.base_url + "/models", timeout=PATIENCE).json()
    assert [m["id"] for m in models["data"]] == ["local/gemma-3-270m"]
    body = chat(svir)
    assert body["model"] == "local/gemma-3-270m"
    [server] = children_servers(pid_of(svir))
    assert "--chat-template-file" in server.cmdline()
    assert "no config: serving the bundled local model (local/gemma-3-270m)" in svir.log()


def test_clients_that_go_away_hold_no_model(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(
        config(
            f'a = "{gguf}"\nb = {{ path = "{gguf}", ctx = 2048 }}',
            "max_loaded = 1",
        )
    )
    request = {"model": "local/a", "messages": [{"role": "user", "content": "hi"}]}

    def a() -> dict[str, Any]:
        found: dict[str, Any] = managed_state(svir)["models"]["a"]
        return found

    # Gone while the model loads.
    hang_up_when(svir, {**request, "max_tokens": 8}, lambda: a()["state"] == "loading", "a loading")
    wait_until(lambda: a()["state"] == "ready" and a()["in_flight"] == 0, "a loaded, held by none")
    # Gone while the server reads a long prompt and writes a long answer (svir has the model,
    # nothing of the answer has gone out).
    long_prompt = [{"role": "user", "content": "Tell me more about this. " * 400}]
    busy = {**request, "messages": long_prompt, "max_tokens": 2000}
    hang_up_when(svir, busy, lambda: a()["in_flight"] == 1, "a in flight")
    wait_until(lambda: a()["in_flight"] == 0, "a is given back")
    # Gone in the middle of a long answer.
    with httpx.stream(
        "POST",
        svir.base_url + "/chat/completions",
        json={**request, "max_tokens": 2000, "stream": True},
        timeout=TIMEOUT,
    ) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    wait_until(lambda: a()["in_flight"] == 0, "a is given back")
    # So b takes its place at once.
    chat(svir, "local/b")
    assert managed_state(svir)["loaded"] == ["b"]
