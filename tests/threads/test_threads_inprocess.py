"""A continue stream in this process (svir.testing.MockTransport as the upstream, the app driven
as raw ASGI so that every message it sends is seen): the frames of one upstream read reach the
server as one piece, as every other front end sends them (one write for a read of many events,
not one per frame), and the last frame with the response's end, with the bytes the client reads
unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from svir.testing import MockRequest, MockResponse, sse
from tests.support.asgi import post_raw
from tests.support.inprocess import InProcess, serve

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
