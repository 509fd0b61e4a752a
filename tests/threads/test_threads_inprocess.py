"""Continue streams in this process (tests.support.mock_transport.MockTransport as the upstream).

The app driven as raw ASGI, so that every message it sends is seen: the frames of one upstream
read reach the server as one piece, as every other front end sends them (one write for a read of
many events, not one per frame), and the last frame with the response's end, with the bytes the
client reads unchanged.

And the thread API's errors that only a situation brings about, each from that situation, on
SQLite and PostgreSQL: a continuation whose lease lapsed while its renewals failed and another
continuation took the thread (409 `lease_lost`), and a database that fails under a running svir
(503 `store_unavailable`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from svir.errors import Unavailable
from svir.store import make_store
from svir.store.base import SqlStore
from tests.support.asgi import post_raw
from tests.support.inprocess import InProcess, serve
from tests.support.mock_transport import MockRequest, MockResponse, sse
from tests.threads.support import parse_frames

CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 1
"""

WORDS = [f"w{i} " for i in range(20)]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def reads(*events: Any, comment_after: int | None = None, first: int = 0) -> MockResponse:
    """An event stream whose events come in one read, or in two when `first` is given (the
    first `first` events, then the rest); an upstream keep-alive comment after the
    `comment_after`-th event (a comment in the first read only reaches a stream started early)."""
    frames = sse(*events)
    if comment_after is not None:
        frames.insert(comment_after, b": keepalive\n\n")
    if not first:
        return MockResponse(body=b"".join(frames))
    return MockResponse(body=[b"".join(frames[:first]), b"".join(frames[first:])])


def answer(request: MockRequest) -> MockResponse:
    """The first word, then in one read the 19 others (a keep-alive among them) and the end."""
    deltas = [chunk({"content": w}) for w in WORDS]
    return reads(*deltas, chunk({}, "stop"), "[DONE]", comment_after=10, first=1)


def broken(request: MockRequest) -> MockResponse:
    """Three words, then the upstream's error, in one read."""
    deltas = [chunk({"content": w}) for w in WORDS[:3]]
    return reads(*deltas, {"error": {"message": "boom", "type": "server_error"}})


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def new_thread(svir: InProcess) -> str:
    made = await svir.http.post("/v1/threads", json={"model": "up/m"})
    thread: str = made.json()["id"]
    added = await svir.http.post(f"/v1/threads/{thread}/messages", json={"content": "hi"})
    assert added.status_code == 200, added.text
    return thread


async def continue_raw(svir: InProcess, thread: str) -> list[dict[str, Any]]:
    """Every message the app sends for a streamed continue, in order."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await post_raw(svir.app, f"/v1/threads/{thread}/continue", b'{"stream": true}', send)
    return sent


def bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    assert sent[0]["type"] == "http.response.start"
    assert all(m["type"] == "http.response.body" for m in sent[1:])
    return [m["body"] for m in sent[1:]]


async def test_the_frames_of_one_read_are_one_piece(tmp_path: Path) -> None:
    async with serve(tmp_path, CONFIG, answer) as svir:
        thread = await new_thread(svir)
        sent = await continue_raw(svir, thread)
        assert sent[0]["status"] == 200
        pieces = bodies(sent)
        stored = (await svir.http.get(f"/v1/threads/{thread}")).json()["messages"][-1]
        text = "".join(WORDS)
        assert stored["content"] == [{"type": "text", "text": text}]
        words = [frame({"type": "delta", "text": w}) for w in WORDS]
        read = b"".join(words[1:10]) + b": keepalive\n\n" + b"".join(words[10:])
        done = {"type": "done", "message_id": stored["id"], "finish_reason": "stop"}
        end = frame({**done, "appended": text})
        # The second read's frames (a keep-alive among them) in one send; the final frame waits
        # on the answer's commit, and goes with the response's end.
        assert pieces == [words[0], read, end]
        assert sent[-1]["more_body"] is False

        # Not streamed: the same upstream, the last frame alone.
        thread = await new_thread(svir)
        r = await svir.http.post(f"/v1/threads/{thread}/continue", json={"stream": False})
        assert r.status_code == 200
        assert r.json()["type"] == "done" and r.json()["appended"] == text


async def test_an_error_in_the_read_ends_the_stream_after_its_frames(tmp_path: Path) -> None:
    async with serve(tmp_path, CONFIG, broken) as svir:
        thread = await new_thread(svir)
        sent = await continue_raw(svir, thread)
        pieces = bodies(sent)
        assert pieces[0] == b"".join(frame({"type": "delta", "text": w}) for w in WORDS[:3])
        assert len(pieces) == 2 and sent[-1]["more_body"] is False  # the error ends it
        error = json.loads(pieces[1].removeprefix(b"data: "))
        assert error["type"] == "error" and error["appended"] is None
        assert error["error"]["message"].startswith("boom")
        # Nothing was appended to the thread.
        messages = (await svir.http.get(f"/v1/threads/{thread}")).json()["messages"]
        assert [m["role"] for m in messages] == ["user"]


# ---------------------------------------------------------------------------------------------
# The errors a situation brings about, on both stores


class Held:
    """The upstream: `held` answers "partial", then holds its stream until `release` is set;
    any other model answers "quick" at once. `asked` is set once `held` was asked."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    def __call__(self, request: MockRequest) -> MockResponse:
        if request.model != "held":
            return reads(
                chunk({"role": "assistant", "content": "quick"}), chunk({}, "stop"), "[DONE]"
            )
        self.asked.set()
        return MockResponse(body=self._held())

    async def _held(self) -> AsyncIterator[bytes]:
        yield b"".join(sse(chunk({"role": "assistant", "content": "partial"})))
        await self.release.wait()
        yield b"".join(sse(chunk({}, "stop"), "[DONE]"))


@pytest.fixture
async def held(tmp_path: Path, url: str) -> AsyncIterator[tuple[InProcess, Held]]:
    upstream = Held()
    # The least lease svir takes, so that a lapsed one lapses soon.
    svir = InProcess(
        tmp_path, CONFIG, upstream, store_url=url, store_fields="lease_seconds = 0.5\n"
    )
    await svir.start()
    try:
        yield svir, upstream
    finally:
        upstream.release.set()
        await svir.stop()


async def until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def roles(svir: InProcess, thread: str) -> list[str]:
    messages = (await svir.http.get(f"/v1/threads/{thread}")).json()["messages"]
    return [m["role"] for m in messages]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_continuation_whose_lease_was_taken_over_ends_with_lease_lost(
    held: tuple[InProcess, Held], monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    svir, upstream = held

    async def stalled(self: SqlStore, thread_id: str, lease_id: str, *, ttl: float) -> str:
        raise Unavailable("renewals stall")

    # The first continuation's renewals fail: its lease lapses while its answer is still coming.
    monkeypatch.setattr(SqlStore, "renew", stalled)
    made = await svir.http.post("/v1/threads", json={"model": "up/held"})
    thread = made.json()["id"]
    await svir.http.post(f"/v1/threads/{thread}/messages", json={"content": "hi"})
    first = asyncio.ensure_future(
        svir.http.post(f"/v1/threads/{thread}/continue", json={"stream": stream})
    )
    try:
        await asyncio.wait_for(upstream.asked.wait(), 30)

        async def free() -> bool:
            return (await svir.http.get(f"/v1/threads/{thread}")).json()["busy"] is False

        await until(free, "the stalled continuation's lease never lapsed")
        # Another continuation takes the thread and answers.
        second = await svir.http.post(f"/v1/threads/{thread}/continue", json={"model": "up/quick"})
        assert second.status_code == 200 and second.json()["type"] == "done", second.text
    finally:
        upstream.release.set()
    r = await first
    lost = {
        "message": "The continuation lost its hold on the thread (its lease expired and another"
        " continuation took it). Nothing was appended to the thread.",
        "type": "invalid_request_error",
        "param": None,
        "code": "lease_lost",
    }
    if stream:
        assert r.status_code == 200  # the status went out with the first frame
        frames = parse_frames(r.content)
        assert frames[0] == {"type": "delta", "text": "partial"}
        assert frames[-1] == {"type": "error", "error": lost, "appended": None}
    else:
        assert r.status_code == 409
        assert r.json() == {"type": "error", "error": lost, "appended": None}
    # Only the continuation that held the thread stored its answer.
    messages = (await svir.http.get(f"/v1/threads/{thread}")).json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"] == [{"type": "text", "text": "quick"}]


async def test_a_failing_database_is_503_store_unavailable(
    held: tuple[InProcess, Held], url: str
) -> None:
    svir, _ = held
    made = await svir.http.post("/v1/threads", json={"model": "up/quick"})
    thread = made.json()["id"]
    await svir.http.post(f"/v1/threads/{thread}/messages", json={"content": "hi"})
    # The database fails under svir: the table it reads is gone (as far as svir can tell).
    outside = make_store(url)
    assert isinstance(outside, SqlStore)
    await outside.open()
    try:
        async with outside.transaction(write=True) as tx:
            await tx.execute("ALTER TABLE threads RENAME TO threads_gone")
        for method, path in [("GET", ""), ("GET", f"/{thread}"), ("POST", f"/{thread}/messages")]:
            r = await svir.http.request(method, f"/v1/threads{path}", json={"content": "more"})
            assert r.status_code == 503, (method, path, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert (error["type"], error["code"]) == ("server_error", "store_unavailable")
            assert error["message"].startswith("The thread store failed: ")
        # A continuation answers with the error frame's object, in both modes.
        for stream in (True, False):
            r = await svir.http.post(f"/v1/threads/{thread}/continue", json={"stream": stream})
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["type"] == "error" and body["appended"] is None
            assert body["error"]["code"] == "store_unavailable"
        async with outside.transaction(write=True) as tx:
            await tx.execute("ALTER TABLE threads_gone RENAME TO threads")
    finally:
        await outside.close()

    # The database is back: the same requests are answered (a request may be sent again).
    async def answered() -> bool:
        return (await svir.http.get(f"/v1/threads/{thread}")).status_code == 200

    await until(answered, "the thread store never came back")
    r = await svir.http.post(f"/v1/threads/{thread}/continue", json={})
    assert r.status_code == 200 and r.json()["type"] == "done"
    assert await roles(svir, thread) == ["user", "assistant"]
