"""Small ASGI helpers: read a bounded body, send JSON, start a stream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import msgspec

from svir.errors import BodyTooLarge, ClientGone

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_encode = msgspec.json.encode
JSON_HEADERS = ((b"content-type", b"application/json"),)
SSE_HEADERS = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


def header(scope: Scope, name: bytes) -> bytes | None:
    """One request header's value (the first, if repeated); `name` in lower case."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_body(
    receive: Receive, limit: int, declared: bytes | None = None
) -> bytes | bytearray:
    """The whole request body, refusing more than `limit` bytes before reading them."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise BodyTooLarge
        return bytes(body)
    buf = bytearray(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        buf += message.get("body", b"")
        if len(buf) > limit:
            raise BodyTooLarge
        if not message.get("more_body"):
            return buf  # msgspec decodes any buffer: no second copy of a large body


def headers_with(
    base: Iterable[tuple[bytes, bytes]], extra: dict[str, str]
) -> list[tuple[bytes, bytes]]:
    return [*base, *((k.lower().encode(), v.encode()) for k, v in extra.items())]


async def send_json(
    send: Send, status: int, obj: Any, extra_headers: dict[str, str] | None = None
) -> None:
    body = _encode(obj)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers_with(JSON_HEADERS, extra_headers or {}),
        }
    )
    await send({"type": "http.response.body", "body": body})
