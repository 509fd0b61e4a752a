"""What an HTTP request is to svir: the ASGI types and the request-header reader, for every layer
that reads a request (the front ends, the authenticator, tracing). The helpers that read a body
and send an answer are the front ends' shared plumbing, `svir.frontends.http`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["Message", "Receive", "Scope", "Send", "header"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """One request header's value (the first, if repeated); `name` in lower case."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
