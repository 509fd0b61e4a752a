"""What an HTTP request is to svir: the ASGI types and the request-header reader, for every layer
that reads a request (the front ends, the authenticator, tracing). The helpers that read a body
and send an answer are the front ends' shared plumbing, `svir.frontends.http`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from svir.call import CallContext

__all__ = ["CALL_CONTEXT", "Message", "Receive", "Scope", "Send", "call_context", "header"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# Where a request's scope keeps the context of the chat call its front end made for it
# (svir.frontends.http.new_call_context); the app writes the request's log fields from it.
CALL_CONTEXT: Final = "svir.call"


def call_context(scope: Scope) -> CallContext | None:
    """The context of the chat call this request made, if it made one."""
    ctx: CallContext | None = scope.get(CALL_CONTEXT)
    return ctx


def header(scope: Scope, name: bytes) -> bytes | None:
    """One request header's value (the first, if repeated); `name` in lower case."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
