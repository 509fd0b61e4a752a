"""What an HTTP request is to svir: the ASGI types and the request-header reader, for every layer
that reads a request (the front ends, the authenticator, tracing). The helpers that read a body
and send an answer are the front ends' shared plumbing, `svir.protocols.http`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from svir.call import CallContext

__all__ = [
    "CALL_CONTEXT",
    "DISCONNECT_WATCH",
    "GRACEFUL_STOP_SECONDS",
    "RESPONSE_STATUS",
    "SEND_PIECE",
    "SERVER_STOPPING",
    "DisconnectWatch",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "call_context",
    "disconnect_watch",
    "header",
    "piece_sender",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# Where a request's scope keeps the context of the chat call its front end made for it
# (svir.protocols.http.new_call_context); the app writes the request's log fields from it.
CALL_CONTEXT: Final = "svir.call"


# Where the app leaves, in the lifespan's state, what a server calls when it starts to stop, before
# it waits for the open responses to end (svir's server, svir.edges.h1_server): responses that
# last as long as the page that reads them (the console's live feed) end then, not at the
# server's graceful timeout.
SERVER_STOPPING: Final = "svir.server_stopping"

# How long the server lets open responses run once it starts to stop, before it cancels them
# (uvicorn's `timeout_graceful_shutdown`, set from this by svir.server).
GRACEFUL_STOP_SECONDS: Final = 5.0


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


class DisconnectWatch:
    """A connection's word that its client went away, for a server that notices it itself
    (svir's, svir.edges.h1_server): the request being served sets `callback`, which the server
    calls once when the connection is lost, so that no task needs to wait on `receive` for it."""

    __slots__ = ("callback", "gone")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.gone = False

    def fire(self) -> None:
        """The connection is lost (the server calls this once)."""
        self.gone = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


# The attribute by which such a server gives a request's `receive` (a bound method) its
# connection's DisconnectWatch: on the object `receive` is bound to.
DISCONNECT_WATCH: Final = "svir_disconnect_watch"


def disconnect_watch(receive: Receive) -> DisconnectWatch | None:
    """The DisconnectWatch of the connection `receive` reads, if its server keeps one."""
    watch = getattr(getattr(receive, "__self__", None), DISCONNECT_WATCH, None)
    return watch if isinstance(watch, DisconnectWatch) else None


# The attribute by which such a server notes, on the object a request's `send` is bound to, the
# status its response started with (None before it starts): an app that must know reads it there
# instead of wrapping `send` to see it go by, a call fewer for every piece of a stream.
RESPONSE_STATUS: Final = "svir_response_status"


# The method by which such a server sends a piece of a body with more to come: `send_piece(body)`
# is `send({"type": "http.response.body", "body": body, "more_body": True})` without the message
# built for each of a stream's chunks, then taken apart again.
SEND_PIECE: Final = "svir_send_piece"


def piece_sender(send: Send) -> Callable[[bytes], Awaitable[None]]:
    """What sends a piece of a response's body with more to come on `send`: its server's own
    method (SEND_PIECE) when it has one, else an ASGI message through `send`."""
    own: Callable[[bytes], Awaitable[None]] | None = getattr(
        getattr(send, "__self__", None), SEND_PIECE, None
    )
    if own is not None:
        return own

    def send_piece(body: bytes) -> Awaitable[None]:
        return send({"type": "http.response.body", "body": body, "more_body": True})

    return send_piece
