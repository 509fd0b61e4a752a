"""What the core needs of an upstream HTTP client, as protocols: the edge's
`svir.edges.upstream.UpstreamClient` is one, and the core (chat, gateway, policy) types against
these, so that it does not import the IO edge. The client is built where the server is composed
(`svir.edges.app`) and handed to the gateway.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Protocol

from svir.config import Timeouts

__all__ = ["StreamResponse", "Transport"]


class StreamResponse(Protocol):
    """An open, successful streamed response."""

    status: int
    headers: Mapping[str, str]

    def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they come; a classified UpstreamError on a timeout or a break."""
        ...

    def close(self) -> None:
        """Drop the connection (the body was not read to its end)."""
        ...

    def finish(self) -> None:
        """The body was read to its end: the connection may be used again."""
        ...


class Transport(Protocol):
    """Open a streamed POST, or GET a small JSON body; failures are classified UpstreamErrors."""

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
    ) -> StreamResponse: ...

    async def get_json_bytes(
        self, url: str, *, headers: Mapping[str, str], timeout: float
    ) -> bytes: ...

    async def close(self) -> None: ...
