"""The raw protocol relay: the floor of a Python relay, a reference target of `bench.suite`.

No ASGI server and no tasks: an asyncio.Protocol server on uvloop with httptools' request parser,
and a pooled keep-alive upstream connection per request, an asyncio.Protocol with httptools'
response parser. Everything happens in the protocols' callbacks: a request's body goes to the
upstream when it is whole; the upstream's answer goes to the client as it arrives (one write
with a Content-Length when it arrived whole in one read, else chunked pieces). One request at a
time per client connection (no pipelining), as the load generators send them.

    .venv/bin/python -m bench.relay_raw --upstream 127.0.0.1:PORT --port PORT
"""

from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop

REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}


class UpstreamConn(asyncio.Protocol):
    """One keep-alive connection to the upstream, serving one client request at a time."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.client: ClientConn | None = None
        self.lost = False
        self.content_type = b"application/octet-stream"
        self.status = 0
        self.pieces: list[bytes] = []
        self.started = False  # the client's response head was written
        self.complete = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, client: ClientConn, message: bytes) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.content_type = b"application/octet-stream"
        self.pieces = []
        self.started = self.complete = False
        assert self.transport is not None
        self.transport.write(message)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._abort()
            return
        client = self.client
        if client is None:
            return
        pieces = self.pieces
        if not self.started:
            if self.complete:
                body = b"".join(pieces)
                client.write(self._head(b"Content-Length: %d\r\n\r\n" % len(body)) + body)
                self._done(client)
                return
            if self.status == 0:
                return
            self.started = True
            out = [self._head(b"Transfer-Encoding: chunked\r\n\r\n")]
        else:
            out = []
        for piece in pieces:
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        pieces.clear()
        if self.complete:
            out.append(b"0\r\n\r\n")
        client.write(b"".join(out))
        if self.complete:
            self._done(client)

    def _head(self, framing: bytes) -> bytes:
        reason = REASONS.get(self.status, b"-")
        return (
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (self.status, reason, self.content_type)
            + framing
        )

    def _done(self, client: ClientConn) -> None:
        self.client = None
        client.upstream = None
        self.relay.put(self)

    def _abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost:
            self._abort()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class ClientConn(asyncio.Protocol):
    """One client connection; its request goes to an upstream connection when it is whole."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b"/"
        self.body: list[bytes] = []
        self.upstream: UpstreamConn | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream._abort()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        self.body = []
        method = self.parser.get_method()
        message = self.relay.head(method, self.url) + b"Content-Length: %d\r\n\r\n" % len(body)
        self.relay.send(self, message + body)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Relay:
    """The listening side's shared state: the upstream's address and its idle connections."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[UpstreamConn] = []
        self.heads: dict[tuple[bytes, bytes], bytes] = {}
        self.connecting: set[asyncio.Task[None]] = set()

    def head(self, method: bytes, url: bytes) -> bytes:
        head = self.heads.get((method, url))
        if head is None:
            head = b"%s %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n" % (
                method,
                url,
                self.host.encode(),
                self.port,
            )
            if len(self.heads) < 64:
                self.heads[(method, url)] = head
        return head

    def send(self, client: ClientConn, message: bytes) -> None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost:
                client.upstream = conn
                conn.send(client, message)
                return
        task = asyncio.ensure_future(self._connect_and_send(client, message))
        self.connecting.add(task)
        task.add_done_callback(self.connecting.discard)

    async def _connect_and_send(self, client: ClientConn, message: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: UpstreamConn(self), self.host, self.port)
        except OSError:
            client.close()
            return
        client.upstream = conn
        conn.send(client, message)

    def put(self, conn: UpstreamConn) -> None:
        if not conn.lost and len(self.idle) < 256:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()


async def serve(host: str, port: int, up_host: str, up_port: int) -> None:
    relay = Relay(up_host, up_port)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientConn(relay), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    up_host, _, up_port = args.upstream.rpartition(":")
    uvloop.run(serve(args.host, args.port, up_host, int(up_port)))


if __name__ == "__main__":
    main()
