"""uvicorn's HTTP/1.1 protocol (httptools) with its socket writes coalesced per loop turn.

uvicorn writes a response's head as soon as the app sends `http.response.start`, then each body
piece: two system calls for a non-streamed answer, and more for a stream. Here the writes one
connection makes during one turn of the event loop go out together, in one write, when the turn
ends, when the response is complete, at once past `FLUSH_AT` bytes, or before the connection
closes: a whole short response costs one system call, and nothing waits past its last send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Past this many bytes waiting, write at once: a large body is not held back for the turn's end.
FLUSH_AT = 64 * 1024


class CoalescingTransport:
    """A transport that gathers the writes of one loop turn into one; the rest is delegated."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Iterable[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Write what is waiting (dropped if the connection is already going away)."""
        self._scheduled = False
        if not self._pending:
            return
        pending = self._pending
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        # The response is whole: it goes out now, not after the app's bookkeeping that follows
        # in the same turn (the log line, the ledger, the metrics).
        transport = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()
        super().on_response_complete()
