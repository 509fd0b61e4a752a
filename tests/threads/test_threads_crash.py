"""Crash safety and replicas, with real svir processes over one store (SQLite file or
PostgreSQL schema): `kill -9` in the middle of a continuation, and two svir processes serving the
same threads."""

from __future__ import annotations

import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream
from tests.support.waiting import wait_until
from tests.threads.conftest import store_url
from tests.threads.support import Threads, parse_frames, start_svir

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

LEASE = 2.0


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="event", drip=0.05)) as server:
        yield server


@pytest.fixture
def shared_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    postgres = request.getfixturevalue("postgres") if store_kind == "postgres" else None
    return store_url(store_kind, tmp_path, postgres)


@pytest.fixture
def procs() -> Iterator[list[SvirProcess]]:
    started: list[SvirProcess] = []
    yield started
    for p in started:
        p.stop()


def test_kill_9_mid_continue_then_restart(
    shared_url: str,
    store_kind: str,
    tmp_path: Path,
    replay: ScriptedServer,
    procs: list[SvirProcess],
) -> None:
    replay.handler.drip_count = None
    first = start_svir(tmp_path / "first", replay.base_url, shared_url, lease_seconds=LEASE)
    procs.append(first)
    api = Threads(first.base_url)
    tid = api.create(model="plain/slow-drip")["id"]
    api.say(tid, "Tell me a long story.")
    before = api.get(tid)

    got = b""
    # The stream breaks when svir dies under it.
    with (
        pytest.raises(httpx.HTTPError),
        api.http.stream("POST", f"/threads/{tid}/continue", json={"stream": True}) as r,
    ):
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            got += chunk
            if got.count(b"\n\n") >= 5 and first.proc is not None and first.proc.poll() is None:
                first.proc.send_signal(signal.SIGKILL)
                first.proc.wait()
    assert [f["type"] for f in parse_frames(got)][:5] == ["delta"] * 5

    second = start_svir(tmp_path / "second", replay.base_url, shared_url, lease_seconds=LEASE)
    procs.append(second)
    api = Threads(second.base_url)
    after = api.get(tid)
    # Intact, with no trace of the answer that was being written.
    assert after["messages"] == before["messages"]
    assert after["message_count"] == 1
    if store_kind == "sqlite":
        path = shared_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert (
                db.execute("SELECT COUNT(*) FROM messages WHERE thread_id = ?", (tid,)).fetchone()[
                    0
                ]
                == 1
            )
    # The dead process's lease lapses by itself; then the thread goes on.
    wait_until(lambda: not api.get(tid)["busy"], "the dead process's lease lapsing")
    r = api.continue_(tid, model="plain/llama-cpp")
    assert r.status_code == 200 and r.json()["type"] == "done"
    assert api.roles(tid) == ["user", "assistant"]


def test_two_replicas_share_threads_and_exclude_each_other(
    shared_url: str, tmp_path: Path, replay: ScriptedServer, procs: list[SvirProcess]
) -> None:
    replay.handler.drip_count = None
    a = start_svir(tmp_path / "a", replay.base_url, shared_url, lease_seconds=LEASE)
    b = start_svir(tmp_path / "b", replay.base_url, shared_url, lease_seconds=LEASE)
    procs += [a, b]
    on_a, on_b = Threads(a.base_url), Threads(b.base_url)
    tid = on_a.create(model="plain/slow-drip")["id"]
    on_a.say(tid, "go")
    assert on_b.get(tid)["message_count"] == 1  # one store behind both

    frames: list[dict[str, Any]] = []

    def stream_on_a() -> None:
        frames.extend(on_a.stream(tid))

    runner = threading.Thread(target=stream_on_a)
    runner.start()
    try:
        wait_until(lambda: on_b.get(tid)["busy"], "replica b seeing the thread busy")
        r = on_b.continue_(tid, stream=True)
        assert r.status_code == 409 and r.json()["error"]["code"] == "thread_busy"
        r = on_b.post(tid, {"content": "sneaking in"})
        assert r.status_code == 409
        # A cancel sent to the other replica reaches the running continuation through the store.
        assert on_b.http.post(f"/threads/{tid}/cancel").json()["cancelled"] is True
        runner.join(LEASE + 10)
        assert not runner.is_alive()
    finally:
        runner.join(30)
    assert frames[-1]["type"] == "error" and frames[-1]["error"]["code"] == "continuation_cancelled"
    assert on_a.roles(tid) == ["user"] and not on_b.get(tid)["busy"]
    r = on_b.continue_(tid, model="plain/llama-cpp")
    assert r.json()["type"] == "done"
    assert on_a.roles(tid) == ["user", "assistant"]


def test_graceful_shutdown_mid_continue_appends_nothing_and_frees_the_thread(
    shared_url: str, tmp_path: Path, replay: ScriptedServer, procs: list[SvirProcess]
) -> None:
    replay.handler.drip_count = None
    first = start_svir(tmp_path / "first", replay.base_url, shared_url, lease_seconds=30)
    procs.append(first)
    api, waiting = Threads(first.base_url), Threads(first.base_url)
    streamed, unstreamed = (api.create(model="plain/slow-drip")["id"] for _ in range(2))
    for tid in (streamed, unstreamed):
        api.say(tid, "go")
    answers: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: answers.append(waiting.continue_(unstreamed)))
    runner.start()
    try:
        wait_until(lambda: api.get(unstreamed)["busy"], "the continuation starting")
        got = b""
        with api.http.stream("POST", f"/threads/{streamed}/continue", json={"stream": True}) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                got += chunk
                if got.count(b"\n\n") >= 3 and first.proc is not None and first.proc.poll() is None:
                    first.stop()  # SIGTERM
    finally:
        runner.join(30)
    # The client still there is told, in the error's own shape, and nothing was appended.
    shutting_down = {
        "message": "svir is shutting down. Nothing was appended to the thread.",
        "type": "server_error",
        "param": None,
        "code": "server_shutting_down",
    }
    frames = parse_frames(got)
    assert frames[0]["type"] == "delta"
    assert frames[-1] == {"type": "error", "error": shutting_down, "appended": None}
    [answer] = answers
    assert answer.status_code == 503
    assert answer.json() == {"type": "error", "error": shutting_down, "appended": None}
    # (A cut connection would have no frame and no body: the frame says it was ended, not cut.)
    second = start_svir(tmp_path / "second", replay.base_url, shared_url, lease_seconds=30)
    procs.append(second)
    api = Threads(second.base_url)
    for tid in (streamed, unstreamed):
        thread = api.get(tid)
        # With a 30 s lease, only a lease given back on the way out explains a free thread now.
        assert thread["message_count"] == 1 and thread["busy"] is False


def test_a_store_that_cannot_open_stops_startup_with_a_clear_message(
    tmp_path: Path, replay: ScriptedServer
) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    for url, words in [
        (
            "postgresql://postgres@127.0.0.1:1/test?schema=nope",
            "cannot connect to the PostgreSQL store",
        ),
        (f"sqlite:///{blocker}/svir.db", "cannot open the SQLite store"),
    ]:
        with pytest.raises(RuntimeError) as info:
            start_svir(tmp_path / words.split()[-2], replay.base_url, url)
        assert words in str(info.value)
