"""The bare ASGI relay: svir's server stack with no svir logic, a reference target of `bench.suite`.

uvicorn with httptools and uvloop (as `svir serve` runs them), one ASGI app that reads the
request body and forwards it, bytes as they are, to one upstream over a pooled keep-alive client
(an asyncio.Protocol with httptools' response parser, woken once per network read), and streams
the upstream's status, content type and body back. No JSON, no routing, no keys, no logging:
what is left of svir's CPU per request above this one is svir's own machinery.

    .venv/bin/python -m bench.relay_asgi --upstream 127.0.0.1:PORT --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn

HEADS_CACHE = 64
# A reader of one answer's body: each piece read (and whether it is the last) -> what to send.
Reader = Callable[[bytes, bool], bytes]


class _Upstream(asyncio.Protocol):
    """One keep-alive connection to the upstream; the parser's callbacks fill the response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = b"application/octet-stream"
        self.headers_done = False
        self.complete = False
        self.lost = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.lost = True
            if self.transport is not None:
                self.transport.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def start(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers_done = self.complete = False
        self.chunks.clear()


class Relay:
    """The ASGI app: every request to the upstream, the answer back."""

    # What the request body becomes before it is sent, and a new reader of an answer's body
    # (given its content type) whose every piece is what the client gets: none here, where bytes
    # pass as they are (bench.relay_json reads them).
    rewrite_body: Callable[[bytes], bytes] | None = None
    new_reader: Callable[[bytes], Reader] | None = None

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[_Upstream] = []
        self.heads: dict[tuple[str, str], bytes] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if self.rewrite_body is not None:
            body = self.rewrite_body(body)
        conn = await self._conn()
        conn.start()
        assert conn.transport is not None
        head = self._head(scope["method"], scope["path"])
        conn.transport.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        while not conn.headers_done:
            if conn.lost:
                raise ConnectionError("upstream closed the connection")
            await conn.wait()
        await send(
            {
                "type": "http.response.start",
                "status": conn.status,
                "headers": [(b"content-type", conn.content_type)],
            }
        )
        chunks = conn.chunks
        read = self.new_reader(conn.content_type) if self.new_reader is not None else None
        while True:
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                if read is not None:
                    data = read(data, conn.complete)
                if conn.complete:
                    await send({"type": "http.response.body", "body": data, "more_body": False})
                    break
                await send({"type": "http.response.body", "body": data, "more_body": True})
            elif conn.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                break
            elif conn.lost:
                raise ConnectionError("upstream closed the connection")
            else:
                await conn.wait()
        if not conn.lost and len(self.idle) < 256:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def _head(self, method: str, path: str) -> bytes:
        head = self.heads.get((method, path))
        if head is None:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Content-Type: application/json\r\n"
            ).encode("latin-1")
            if len(self.heads) < HEADS_CACHE:
                self.heads[(method, path)] = head
        return head

    async def _conn(self) -> _Upstream:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Upstream, self.host, self.port)
        return conn


def main(argv: list[str] | None = None, relay: type[Relay] = Relay) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--keep-alive-timeout", type=float, default=5.0, help="uvicorn's timeout_keep_alive (s)"
    )
    args = parser.parse_args(argv)
    up_host, _, up_port = args.upstream.rpartition(":")
    uvicorn.run(
        relay(up_host, int(up_port)),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        backlog=4096,
        timeout_keep_alive=args.keep_alive_timeout,
    )


if __name__ == "__main__":
    main()
