"""svir.edges.coalesce: a response's writes reach the socket as one write, through uvicorn's own
protocol (a fake transport records every write the protocol makes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from svir.edges.coalesce import FLUSH_AT, CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def json_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await receive()
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    # Bookkeeping after the response (svir: log line, ledger): the response must not wait on it.
    app_state["after_response_writes"] = len(transport_of[0].writes)


async def stream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]}
    await send(start)
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await asyncio.sleep(0.01)  # the upstream is slow: what was sent must not wait for more
    app_state["mid_stream_writes"] = len(transport_of[0].writes)
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


app_state: dict[str, Any] = {}
transport_of: list[RecordingTransport] = []

REQUEST = b"GET / HTTP/1.1\r\nHost: svir\r\n\r\n"


async def serve_one(app: Any) -> tuple[RecordingTransport, CoalescingHttpToolsProtocol]:
    config = Config(app=app, http=CoalescingHttpToolsProtocol, lifespan="off", log_level="error")
    state = ServerState()
    protocol = CoalescingHttpToolsProtocol(config, state, {}, asyncio.get_running_loop())
    transport = RecordingTransport()
    transport_of[:] = [transport]
    protocol.connection_made(transport)
    protocol.data_received(REQUEST)
    for _ in range(200):
        await asyncio.sleep(0.005)
        if state.total_requests == 1 and not state.tasks:
            break
    app_state["closed_before_end"] = transport.closed
    protocol.connection_lost(None)
    return transport, protocol


async def test_a_whole_response_is_one_write_before_the_app_goes_on() -> None:
    transport, _ = await serve_one(json_app)
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"ok":true}'
    assert app_state["after_response_writes"] == 1  # written when complete, not at turn's end
    assert not app_state["closed_before_end"]  # keep-alive kept


async def test_a_stream_goes_out_piece_by_piece_as_the_app_sends() -> None:
    transport, _ = await serve_one(stream_app)
    assert app_state["mid_stream_writes"] == 1  # head and first piece together, not held back
    assert len(transport.writes) == 2
    assert b"data: 1" in transport.writes[0] and transport.writes[0].startswith(b"HTTP/1.1 200")
    assert transport.writes[1] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


async def test_coalescing_transport_edges() -> None:
    loop = asyncio.get_running_loop()
    inner = RecordingTransport()
    t = CoalescingTransport(inner, loop)
    t.write(b"a")
    t.writelines([b"b", b""])
    assert inner.writes == [] and t.get_write_buffer_size() == 2
    await asyncio.sleep(0)
    assert inner.writes == [b"ab"]
    big = b"x" * FLUSH_AT
    t.write(big)  # past the threshold: at once
    assert inner.writes[-1] == big
    t.write(b"last")
    t.close()  # flushes first
    assert inner.writes[-1] == b"last" and inner.closed
    t.write(b"late")
    await asyncio.sleep(0)
    assert inner.writes[-1] == b"last"  # a closing connection gets nothing more


@pytest.fixture(autouse=True)
def _clean() -> None:
    app_state.clear()


async def test_a_lost_connection_cancels_the_request_without_a_watcher_task() -> None:
    """svir's protocol tells `until_disconnect` itself that the client went away: the request's
    work is cancelled and answered 499, and no task was made to wait on `receive` for it."""
    from svir.frontends.http import until_disconnect

    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the body
        tasks_before = len(asyncio.all_tasks())

        async def work() -> int:
            # Whatever until_disconnect made is running by now.
            app_state["tasks_made"] = len(asyncio.all_tasks()) - tasks_before
            started.set()
            try:
                await asyncio.sleep(3600)  # an upstream that never answers
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 200

        app_state["status"] = await until_disconnect(receive, work())

    config = Config(app=app, http=CoalescingHttpToolsProtocol, lifespan="off", log_level="error")
    state = ServerState()
    protocol = CoalescingHttpToolsProtocol(config, state, {}, asyncio.get_running_loop())
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(REQUEST)
    await asyncio.wait_for(started.wait(), 30)
    protocol.connection_lost(None)  # the client went away
    await asyncio.wait_for(cancelled.wait(), 30)
    for _ in range(2000):
        if "status" in app_state:
            break
        await asyncio.sleep(0.005)
    assert app_state["status"] == 499
    assert app_state["tasks_made"] == 0
    assert transport.writes == []  # nothing was answered to a client that is gone
