"""What an HTTP request is to svir: the ASGI types, the request-header reader, and what svir keeps
about one request under ASGI's own extension point, `scope["extensions"]`, for every layer that
reads a request (the front ends, the authenticator, tracing). The helpers that read a body and
send an answer are the front ends' shared plumbing, `svir.protocols.http`.

Two extensions, each a typed record under one key: `svir.server`, what svir's own server
(svir.edges.h1_server) gives a request of its connection (`ServerExtension`: the disconnect watch,
the piece sender); `svir.exchange`, what svir's app and its guards note about the request while it
is served (`Exchange`: the matched route, the caller's key, the admin verdict, whether it is
captured, the context of its call). Nothing else of svir's is kept in the scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from svir.call import CallContext, Capture
    from svir.keys.model import KeyRecord

__all__ = [
    "EXCHANGE",
    "GRACEFUL_STOP_SECONDS",
    "SERVER_EXTENSION",
    "SERVER_STOPPING",
    "DisconnectWatch",
    "Exchange",
    "Message",
    "Receive",
    "Response",
    "Scope",
    "Send",
    "ServerExtension",
    "caller_key",
    "exchange",
    "header",
    "piece_sender",
    "server_extension",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# Where the app leaves, in the lifespan's state, what a server calls when it starts to stop, before
# it waits for the open responses to end (svir's server, svir.edges.h1_server): responses that
# last as long as the page that reads them (the console's live feed) end then, not at the
# server's graceful timeout.
SERVER_STOPPING: Final = "svir.server_stopping"

# How long the server lets open responses run once it starts to stop, before it cancels them
# (uvicorn's `timeout_graceful_shutdown`, set from this by svir.server).
GRACEFUL_STOP_SECONDS: Final = 5.0

# The keys of svir's two records in `scope["extensions"]` (see the module doc).
SERVER_EXTENSION: Final = "svir.server"
EXCHANGE: Final = "svir.exchange"


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


class ServerExtension(Protocol):
    """What svir's own server gives each request, under `scope["extensions"][SERVER_EXTENSION]`:
    its connection's `watch`, and `send_piece(body)`, which is `send({"type":
    "http.response.body", "body": body, "more_body": True})` without the message built for each
    of a stream's chunks, then taken apart again."""

    @property
    def watch(self) -> DisconnectWatch: ...

    def send_piece(self, body: bytes) -> Awaitable[None]: ...


def server_extension(scope: Scope) -> ServerExtension | None:
    """What svir's own server gives this request, if svir's server serves it."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    found: ServerExtension | None = extensions.get(SERVER_EXTENSION)
    return found


class Exchange:
    """What svir's app and its guards note about one request while it is served, under
    `scope["extensions"][EXCHANGE]`: the template of the route it matched (None: no route; the
    metrics' and traces' label), the caller's key (svir.policy.auth; None without keys), the admin
    rule's verdict on a path under `/admin/` ("admin_key" or "loopback"), the request's capture
    while it is captured (svir.console.capture), and the context of the call its front end made
    (svir.protocols.http.new_call_context)."""

    __slots__ = ("admin_access", "call", "capture", "key", "route")

    def __init__(self, route: str | None = None) -> None:
        self.route = route
        self.key: KeyRecord | None = None
        self.admin_access: str | None = None
        self.capture: Capture | None = None
        self.call: CallContext | None = None


def exchange(scope: Scope) -> Exchange:
    """The request's `Exchange`: the app's, or (a handler or guard run without svir's app, as
    tests do) a new one, kept in the scope from then on."""
    extensions = scope.get("extensions")
    if extensions is None:
        extensions = scope["extensions"] = {}
    found: Exchange | None = extensions.get(EXCHANGE)
    if found is None:
        found = extensions[EXCHANGE] = Exchange()
    return found


def caller_key(scope: Scope) -> KeyRecord | None:
    """The key of the request `scope` is, as the authenticator (svir.policy.auth) noted it; None
    when svir runs without keys (or for a caller without one: the admin key, this machine while
    svir runs open)."""
    return exchange(scope).key


class Response:
    """A request's `send` as svir's app gives it to a handler: it notes the status the response
    started with (`status`, None before), which the app's error mapper reads, and carries its
    server's piece sender (`piece`, None when the server has none: svir.asgi.ServerExtension)."""

    __slots__ = ("_send", "piece", "status")

    def __init__(self, send: Send, piece: Callable[[bytes], Awaitable[None]] | None = None) -> None:
        self._send = send
        self.piece = piece
        self.status: int | None = None

    def __call__(self, message: Message) -> Awaitable[None]:
        if self.status is None:  # the first message starts the response
            self.status = message.get("status", 200)
        return self._send(message)


def piece_sender(send: Send) -> Callable[[bytes], Awaitable[None]]:
    """What sends a piece of a response's body with more to come on `send`: its server's own
    (`Response.piece`) when `send` is the app's Response on svir's server, else an ASGI message
    through `send`."""
    if type(send) is Response and send.piece is not None:
        return send.piece

    def send_piece(body: bytes) -> Awaitable[None]:
        return send({"type": "http.response.body", "body": body, "more_body": True})

    return send_piece
