"""`svir serve --workers N`: several processes on one port, each a whole svir, sharing the store.

Driven with the OpenAI SDK and httpx over the scripted upstream (tests/support/upstream.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream
from tests.support.waiting import PATIENCE

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

CONFIG = """
[[providers]]
name = "plain"
kind = "openai-compatible"
base_url = "{base_url}"
discover = false
"""


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="event", pieces=3)) as server:
        yield server


@pytest.fixture
def svir2(replay: ScriptedServer, tmp_path: Path) -> Iterator[SvirProcess]:
    proc = SvirProcess(CONFIG.format(base_url=replay.base_url), tmp_path, args=["--workers", "2"])
    with proc:
        yield proc


def worker_pids(url: str, *, want: int, timeout: float = PATIENCE) -> set[int]:
    """The pids answering /healthz?verbose=1 over fresh connections, until `want` are seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        # A new connection each time: the kernel hands it to whichever worker accepts first.
        with httpx.Client() as http:
            response = http.get(url + "/healthz?verbose=1", timeout=5)
        if response.status_code == 200:
            seen.add(response.json()["pid"])
    return seen


def live_children(proc: SvirProcess) -> list[psutil.Process]:
    assert proc.proc is not None
    return [c for c in psutil.Process(proc.proc.pid).children(recursive=True) if c.is_running()]


def test_two_workers_serve_one_port(svir2: SvirProcess) -> None:
    pids = worker_pids(svir2.url, want=2)
    assert len(pids) == 2
    assert svir2.proc is not None and svir2.proc.pid not in pids  # the parent only supervises
    client = openai.OpenAI(api_key="k", base_url=svir2.base_url, max_retries=0)
    for _ in range(6):  # new connections each time (the SDK's pool aside): both workers answer
        stream = client.chat.completions.create(
            model="plain/llama-cpp", messages=[{"role": "user", "content": "17*3?"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "17 × 3 = 51."
        done = client.chat.completions.create(
            model="plain/llama-cpp", messages=[{"role": "user", "content": "17*3?"}]
        )
        assert done.choices[0].message.content == "17 × 3 = 51."
    log = svir2.log()
    assert 'limits.backend = "memory" counts per worker' in log
    assert "Traceback" not in log


def test_workers_share_the_thread_store(svir2: SvirProcess) -> None:
    created = httpx.post(svir2.url + "/v1/threads", json={"metadata": {"n": "1"}}, timeout=10)
    assert created.status_code in (200, 201), created.text
    thread_id = created.json()["id"]
    pids = set()
    # A new connection a request, until both workers have answered (a worker's own connection
    # says its pid). The kernel hands connections to whichever worker accepts first, and on a
    # loaded machine one worker may take many in a row: bounded by a count, not a clock.
    for _ in range(500):
        with httpx.Client() as http:
            got = http.get(f"{svir2.url}/v1/threads/{thread_id}", timeout=10)
            pids.add(http.get(svir2.url + "/healthz?verbose=1").json()["pid"])
        assert got.status_code == 200, got.text
        assert got.json()["id"] == thread_id
        if len(pids) == 2:
            break
    assert len(pids) == 2  # both workers read the thread the other may have written


def test_a_dead_worker_is_replaced_and_sigterm_stops_all(svir2: SvirProcess) -> None:
    pids = worker_pids(svir2.url, want=2)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    # The supervisor starts a new worker; the port keeps answering meanwhile.
    deadline = time.monotonic() + PATIENCE
    now: set[int] = set()
    while time.monotonic() < deadline:
        now = worker_pids(svir2.url, want=2, timeout=3)
        if len(now) == 2 and victim not in now:
            break
    assert len(now) == 2 and victim not in now, now
    children = live_children(svir2)
    assert svir2.proc is not None
    svir2.proc.send_signal(signal.SIGTERM)
    assert svir2.proc.wait(15) == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {alive}"


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        (
            '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
            '[providers.managed]\nmodels = { m = "pypi:gemma3-270m" }\n',
            ["--workers", "2"],
            "serve them with one worker",
        ),
        (CONFIG.format(base_url="http://127.0.0.1:9/v1"), ["--workers", "0"], "at least 1"),
        (
            CONFIG.format(base_url="http://127.0.0.1:9/v1") + "\n[server]\nworkers = -3\n",
            [],
            "at least 1, not -3",
        ),
    ],
)
def test_refused_worker_counts(tmp_path: Path, config: str, args: list[str], message: str) -> None:
    path = tmp_path / "svir.toml"
    path.write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "svir", "serve", "--config", str(path), "--port", "9", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
