"""svir.edges.h1: the minimal HTTP/1.1 upstream client, against a scripted asyncio server; and
svir.edges.upstream's idle clock over it."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from svir.config.model import Timeouts
from svir.edges import h1
from svir.edges.h1 import H1Pool, H1Response, Headers
from svir.edges.upstream import UpstreamClient
from svir.errors import H1Error
from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.waiting import PATIENCE, eventually

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return body


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Server, str]]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> tuple[Server, str]:
        server = Server(handler)
        servers.append(server)
        return server, await server.start()

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()


async def body_of(resp: H1Response) -> bytes:
    parts = []
    while data := await resp.read():
        parts.append(data)
    return b"".join(parts)


def keep_alive(reply: Callable[[bytes], bytes], server_ref: list[Server]) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await server_ref[0].read_request(reader)
            writer.write(reply(body))
            await writer.drain()

    return handler


async def test_content_length_body_and_keep_alive(serve) -> None:
    ref: list[Server] = []
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
    server, url = await serve(keep_alive(lambda body: reply + b'{"ok":true}', ref))
    ref.append(server)
    pool = H1Pool()
    for _ in range(3):
        resp = await pool.request("POST", url, headers={"X-A": "1"}, body=b'{"q":1}')
        assert resp.status == 200
        assert resp.headers["content-type"] == "application/json"
        assert await body_of(resp) == b'{"ok":true}'
        resp.close()  # after a whole read: the connection stays pooled
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-A: 1\r\n" in first and b"Content-Length: 7\r\n" in first
    assert first.endswith(b'{"q":1}')
    pool.close()


async def test_chunked_body_and_pieces(serve) -> None:
    ref: list[Server] = []

    def reply(body: bytes) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        return head + b"6\r\ndata: \r\n" + b"%x\r\n%s\r\n" % (len(body), body) + b"0\r\n\r\n"

    server, url = await serve(keep_alive(reply, ref))
    ref.append(server)
    pool = H1Pool()
    big = b"x" * 100_000  # past the size written together with the head
    resp = await pool.request("POST", url, headers={}, body=[b"ab", memoryview(big), b"cd"])
    assert await body_of(resp) == b"data: ab" + big + b"cd"
    assert b"Content-Length: 100004\r\n" in server.requests[0]
    pool.close()


async def test_body_until_close_and_gzip(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        data = gzip.compress(b"hello " * 1000)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n")
        writer.write(data)
        await writer.drain()

    server, url = await serve(handler)
    pool = H1Pool()
    resp = await pool.request("POST", url, headers={}, body=b"{}")
    assert await body_of(resp) == b"hello " * 1000
    pool.close()


async def test_a_pooled_connection_the_server_closed_is_not_used(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # then closes: the client's pooled connection is stale

    server, url = await serve(handler)
    pool = H1Pool()
    for _ in range(2):
        async with asyncio.timeout(PATIENCE):  # a request on the closed connection would hang
            resp = await pool.request("POST", url, headers={}, body=b"{}")
            assert await body_of(resp) == b"ok"
        await eventually(lambda c=resp._conn: c.lost, "the client sees the server's close")
    assert server.connections == 2 and len(server.requests) == 2
    pool.close()


async def test_a_request_on_a_connection_closed_meanwhile_is_retried_anew(serve) -> None:
    # The server closes a kept-alive connection as the next request arrives on it (its own
    # keep-alive timeout ran out): the client sent it, then finds the connection gone, and sends
    # it again on a new one.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if first:
            await server.read_request(reader)  # and closed unanswered

    server, url = await serve(handler)
    pool = H1Pool()
    for _ in range(2):
        resp = await pool.request("POST", url, headers={}, body=b"{}")
        assert await body_of(resp) == b"ok"
    assert server.connections == 2 and len(server.requests) == 3
    pool.close()


async def test_cut_body_raises_and_close_drops_connection(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    server, url = await serve(handler)
    pool = H1Pool()
    resp = await pool.request("POST", url, headers={}, body=b"{}")
    assert await resp.read() == b"partial"
    with pytest.raises(H1Error):
        await resp.read()
    resp.close()
    assert not pool._idle.get(resp._conn.key)
    pool.close()


def late_end(server_ref: list[Server], delay: float | None) -> Handler:
    """Answers each request with an SSE body whose content is written at once and whose
    terminating chunk follows `delay` s later, in a write of its own (None: never)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await server_ref[0].read_request(reader)
            content = b"data: " + body + b"\n\ndata: [DONE]\n\n"
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(content), content))
            await writer.drain()
            if delay is None:
                await asyncio.sleep(3600)
            await asyncio.sleep(delay)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return handler


async def test_finish_keeps_a_connection_whose_last_chunk_comes_later(serve) -> None:
    ref: list[Server] = []
    server, url = await serve(late_end(ref, 0.05))
    ref.append(server)
    pool = H1Pool()
    for n in range(3):
        resp = await pool.request("POST", url, headers={}, body=b"%d" % n)
        assert await resp.read() == b"data: %d\n\ndata: [DONE]\n\n" % n
        resp.finish()  # the answer is whole; the terminating chunk is still on its way
        await eventually(
            lambda c=resp._conn: c in pool._idle.get(c.key, []), "the connection pooled"
        )
    # close() in its place drops the connection each time (the server sees a cancel).
    assert server.connections == 1
    resp = await pool.request("POST", url, headers={}, body=b"x")
    await resp.read()
    resp.close()
    conn = resp._conn
    await eventually(lambda: conn.lost, "the connection closed")
    assert not pool._idle.get(conn.key)
    pool.close()


async def test_finish_drops_a_connection_whose_end_never_comes(serve, monkeypatch) -> None:
    monkeypatch.setattr(h1, "DRAIN_GRACE", 0.05)
    ref: list[Server] = []
    server, url = await serve(late_end(ref, None))
    ref.append(server)
    pool = H1Pool()
    resp = await pool.request("POST", url, headers={}, body=b"1")
    await resp.read()
    resp.finish()
    conn = resp._conn
    # The end never comes: only the drain's grace running out closes the connection.
    await eventually(lambda: conn.lost, "the connection closed after DRAIN_GRACE")
    assert not pool._idle.get(conn.key)
    assert conn._drain_timer is None and conn._drain_to is None  # nothing left referring back
    pool.close()


async def test_connect_refused_is_a_connect_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = H1Pool()
    with pytest.raises(H1Error) as err:
        await pool.request("POST", f"http://127.0.0.1:{port}/", headers={}, body=b"")
    assert err.value.connect


async def test_malformed_response_raises(serve) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    server, url = await serve(handler)
    pool = H1Pool()
    with pytest.raises(H1Error):
        await pool.request("POST", url, headers={}, body=b"{}")


def test_headers_case_insensitive_and_joined() -> None:
    h = Headers([("X-Request-Id", "a"), ("Set-Cookie", "1"), ("set-cookie", "2")])
    assert h["x-request-id"] == h.get("X-REQUEST-ID") == "a"
    assert h["Set-Cookie"] == "1, 2"
    assert "X-Request-ID" in h and "missing" not in h
    assert h.get("missing") is None and len(h) == 2


async def test_response_headers_merged_as_parsed_and_fresh_per_response(serve) -> None:
    ref: list[Server] = []
    replies = iter(
        [
            b"HTTP/1.1 200 OK\r\nSet-Cookie: 1\r\nX-First: y\r\nset-cookie: 2\r\n"
            b"Transfer-Encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n"
            % (20, gzip.compress(b"")),
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nSet-Cookie: 3\r\n\r\nok",
        ]
    )
    server, url = await serve(keep_alive(lambda body: next(replies), ref))
    ref.append(server)
    pool = H1Pool()
    first = await pool.request("POST", url, headers={}, body=b"{}")
    # Repeated and differently cased names joined, in order; the body framed by the last
    # transfer-encoding (chunked), not read until the connection closes.
    assert first.headers["set-cookie"] == "1, 2"
    assert first.headers["Transfer-Encoding"] == "gzip, chunked"
    assert "x-first" in first.headers
    await body_of(first)
    second = await pool.request("POST", url, headers={}, body=b"{}")
    assert server.connections == 1
    assert dict(second.headers) == {"content-length": "2", "set-cookie": "3"}
    assert await body_of(second) == b"ok"
    pool.close()


async def test_close_after_the_whole_message_arrived_keeps_the_connection(serve) -> None:
    ref: list[Server] = []
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndata"
    server, url = await serve(keep_alive(lambda body: reply, ref))
    ref.append(server)
    pool = H1Pool()
    for _ in range(3):
        resp = await pool.request("POST", url, headers={}, body=b"{}")
        while not resp._conn.complete:  # arrived, but not read to its end
            await asyncio.sleep(0.01)
        resp.close()
    assert server.connections == 1
    pool.close()


async def test_silence_after_a_read_that_did_not_wait_is_an_idle_timeout(serve) -> None:
    # The head and the first event in one write, then nothing: the first read finds its bytes
    # already there (no idle clock is armed for it); the second waits, and the idle limit ends it.
    stop = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        event = b"data: {}\n\n"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await stop.wait()

    server, url = await serve(handler)
    client = UpstreamClient()
    timeouts = Timeouts(connect=5, first_byte=30, idle=0.2)
    resp = await client.open_stream(url, headers={}, body=b"{}", timeouts=timeouts)
    try:
        assert await resp.read() == b"data: {}\n\n"
        with pytest.raises(UpstreamError) as info:
            async with asyncio.timeout(60):  # an idle clock that never runs fails, not hangs
                await resp.read()
        assert info.value.kind is ErrorKind.TIMEOUT and info.value.in_stream
        assert "sent nothing for 0.2 s" in info.value.message
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    finally:
        resp.close()
        stop.set()
        await client.close()
