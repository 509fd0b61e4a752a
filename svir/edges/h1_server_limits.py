"""The limits on client connections of svir's HTTP/1.1 server (svir.edges.h1_server; the module
doc there says what they are): the answer to a refused head (408, 431), the tally of connections
refused or evicted at the cap."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from svir.asgi import Receive, Scope, Send
from svir.chat import unique_id
from svir.config.model import ServerConfig
from svir.protocols.http import send_json
from svir.wire.classify import ClientError, error_body

__all__ = ["EVICTED", "REFUSED", "CapTally", "refusal", "refusal_app", "too_large_message"]

log = logging.getLogger("svir.server")

# A refused or evicted connection is logged at most this often (seconds), with how many were.
CAP_WARNING_EVERY: Final = 60.0

_CODES = {408: "request_timeout", 431: "request_header_fields_too_large"}


def too_large_message(limits: ServerConfig) -> str:
    """Why a head over `limits` is refused (431)."""
    return (
        f"Request header fields too large: at most {limits.max_head_bytes} bytes and "
        f"{limits.max_header_fields} fields"
    )


def refusal(status: int, message: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers (but the content type) and the body of the answer to a refused request."""
    rid = unique_id()
    log.info(message, extra={"request_id": rid, "fields": {"status": status}})
    ce = ClientError(status, "invalid_request_error", _CODES[status], message)
    return {"x-request-id": rid, "connection": "close"}, error_body(ce)


def refusal_app(status: int, message: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI app that answers with `_refusal`."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        headers, body = refusal(status, message)
        await send_json(send, status, body, headers)

    return refuse


class CapTally:
    """Connections refused or evicted at the cap since the last line that said so, said at most
    every CAP_WARNING_EVERY seconds."""

    def __init__(self, level: int, message: str) -> None:
        self.level = level
        self.message = message  # formatted with the count and the cap
        self.count = 0
        self.said_at = -CAP_WARNING_EVERY

    def add(self, loop: asyncio.AbstractEventLoop, cap: int) -> None:
        self.count += 1
        now = loop.time()
        if now - self.said_at >= CAP_WARNING_EVERY:
            log.log(self.level, self.message, self.count, cap)
            self.count = 0
            self.said_at = now


REFUSED: Final = CapTally(
    logging.WARNING,
    "refused %d new connection(s) since the last such warning: %d are open, the limit"
    " (server.max_connections), and each has a request under way",
)
EVICTED: Final = CapTally(
    logging.INFO,
    "closed %d connection(s) at rest (idle, or an unfinished head) since the last such line, to"
    " admit new ones: %d were open, the limit (server.max_connections)",
)
