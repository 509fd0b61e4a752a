"""svir's errors: one tree, rooted at `SvirError`, beside the wire core's, rooted at `WireError`.

Our exception hierarchy (`+` a class of this module, `-` one of the module named):

* SvirError                    every error svir raises on purpose, outside the wire core
  + GatewayError                 an answer to the client in OpenAI's error shape (a ClientError)
    + ThreadError                  ... with more fields in the error object (threads API)
  + BadRequest                   a client's request svir will not send upstream; becomes a 400
  + OllamaError                  a request Ollama's translation (or its request structs,
                                 svir.protocols.ollama.body) refuses (a message and a status);
                                 its front end raises it as a GatewayError, in Ollama's shape
  + BodyTooLarge                 the request body is over its route's limit; becomes a 413
  + ClientGone                   the client left before its body was read or while its request's
                                 work ran (svir.protocols.http.UntilDisconnect); nothing is
                                 answered (499 in the log)
  + ConfigError                  a configuration that cannot be used (`<file>: <field>: <reason>`)
  + LimitsUnavailable            the limits' backend is unreachable: calls are refused
  + StoreError                   the thread store's errors raised on purpose
    + NotFound, Busy, BadCursor, LimitExceeded    the client's fault or the thread's state
    + Unavailable                  the database failed; the request may be sent again
      + Conflict                     a lost race the transaction simply runs again
    + SchemaTooNew                 the database was migrated by a newer svir
  + H1Error                      the upstream connection failed or broke (the h1 client's own;
                                 svir.edges.upstream turns it into an UpstreamError)
    + ProxyError                   the proxy on the way could not be reached or refused the tunnel
    + TLSSetupError                the upstream's certificate was refused, or svir's was
  + LlamaServerError             the managed llama.cpp server is missing, or did not start or stop
  - ListenError                  svir cannot listen where it was asked to (svir.server)
  - ToolArgumentsError           a model's tool call whose arguments are not a JSON object, which
                                 Ollama's clients need; becomes an UpstreamError
                                 (svir.protocols.ollama.encode)
  - AttachError                  a file `svir chat` cannot attach (svir.client.attach)
  - ClientFailure                what the user of svir's command line has to fix or know
                                 (svir.client.connection)
    - Unreachable                  no answer from the server at all

* WireError                    every error the sans-IO wire core raises (svir.wire.errors); the
                               wire imports nothing outside svir/wire, so it cannot hang here
  - SSEError                     not valid SSE within the limits
    - LineTooLong, EventTooLarge
  - ProtocolError                valid SSE, but not a valid chat-completion chunk
  - ToolCallError                the assembled tool calls are not a valid set
  - BodyError                    a request body could not be built from the client's input
    - CompletionRequestError       (svir.protocols.completions.request)
    - EmbeddingInputError          (svir.wire.embeddings)
    - MessagesRequestError         (svir.protocols.anthropic.request)
    - Refusal                      a body Anthropic's request structs do not take, named in
                                   Anthropic's terms; raised on as a MessagesRequestError
                                   (svir.protocols.anthropic.body)
    - ResponsesRequestError        (svir.protocols.responses.request)
  - BaseURLError                 a configured base URL cannot be used
  - BadJSON                      a client body that is not JSON, or nests too deep
                                 (svir.wire.jsonbody)
  - PatternError                 an allowed_origins or allowed_hosts entry that means nothing
                                 (svir.wire.origins)
  - ProxyURLError, ConnectRefused    a proxy URL svir cannot use; a CONNECT refused
                                     (svir.wire.proxy)
  - UpstreamError                one classified failure of an upstream (an ErrorKind)

The trees meet in GatewayError: `error` is the ClientError the client gets (to_client_error of an
UpstreamError, or one built here), `upstream` the UpstreamError behind it, if any. GatewayErrors
are built by request_error (any 4xx), invalid_request (a BadRequest's 400), body_too_large (413),
auth_error (401/403); elsewhere by svir.policy.key_gate.limit_error (429 of a key's limit) and
svir.threads.service.store_errors (a StoreError as the threads API answers it).

No class subclasses a builtin exception besides Exception: nothing catches one of them as a
ValueError or a RuntimeError. tests/test_errors.py keeps every exception class of svir in one of
the two trees, and in this drawing.

This module is core: it imports only from svir.wire, so that any layer can raise its errors
without importing the chat core or an IO edge.
"""

from __future__ import annotations

import os
from typing import Any

from svir.wire.classify import ClientError
from svir.wire.errors import UpstreamError

__all__ = [
    "BadCursor",
    "BadRequest",
    "BodyTooLarge",
    "Busy",
    "ClientGone",
    "ConfigError",
    "Conflict",
    "GatewayError",
    "H1Error",
    "LimitExceeded",
    "LimitsUnavailable",
    "LlamaServerError",
    "NotFound",
    "OllamaError",
    "ProxyError",
    "SchemaTooNew",
    "StoreError",
    "SvirError",
    "TLSSetupError",
    "ThreadError",
    "Unavailable",
    "auth_error",
    "body_too_large",
    "invalid_request",
    "request_error",
]


class SvirError(Exception):
    """Root of svir's own errors, everywhere but the wire core (whose root is WireError)."""


class GatewayError(SvirError):
    """A failure answered to the client as an OpenAI-shaped HTTP error.

    `upstream` is the classified upstream failure behind it, when there is one: the policy
    decides on retries and fallbacks from it.
    """

    def __init__(self, error: ClientError, upstream: UpstreamError | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.upstream = upstream


class ThreadError(GatewayError):
    """A GatewayError whose error object carries more fields (`sizes` of a context overflow)."""

    def __init__(self, error: ClientError, **extra: Any) -> None:
        super().__init__(error)
        self.extra = extra


def request_error(
    message: str,
    *,
    status: int = 400,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> GatewayError:
    return GatewayError(ClientError(status, type, code, message, param, headers or {}))


def invalid_request(exc: BadRequest) -> GatewayError:
    """The 400 for a request the shared checks (svir.providers) refused with a BadRequest."""
    return request_error(exc.message, param=exc.param, code=exc.code)


def body_too_large(limit: int) -> GatewayError:
    """The 413 for a request body over the configured limit."""
    return request_error(
        f"The request body is larger than the limit of {limit} bytes",
        status=413,
        code="request_too_large",
    )


def auth_error(message: str, *, status: int = 401, code: str = "invalid_api_key") -> GatewayError:
    headers = {"WWW-Authenticate": 'Bearer realm="svir"'} if status == 401 else {}
    return GatewayError(ClientError(status, "invalid_request_error", code, message, None, headers))


class BadRequest(SvirError):
    """A client's request that svir will not send upstream; it becomes a 400 for the client.

    `param` names the offending field, `code` says what is wrong with it, as OpenAI's errors do.
    """

    # Named for the answer it becomes (400 Bad Request). Not "RequestError": httpx's (the HTTP
    # client of svir's command line and tests) means the opposite, a request that was not sent.

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return f"BadRequest({self.message!r}, param={self.param!r}, code={self.code!r})"


class BodyTooLarge(SvirError):
    """The request body is over `limit` bytes (the route's limit); answered as body_too_large."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit


class ClientGone(SvirError):
    """The client disconnected before the body was read, or while the request's work ran."""


class OllamaError(SvirError):
    """A request svir answers with Ollama's error shape: `{"error": message}` and `status`."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict[str, str]:
        return {"error": self.message}


class ConfigError(SvirError):
    """A configuration that cannot be used. `field` is a path such as `providers[0].kind`, or None
    for a fault of the file as a whole; its str is `<file>: <field>: <reason>`.
    """

    def __init__(self, path: str | os.PathLike[str], field: str | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.field = field
        self.reason = reason
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {reason}")


class LimitsUnavailable(SvirError):
    """The limits' backend cannot be reached: calls are refused rather than let through."""


class StoreError(SvirError):
    """Root of the errors the store raises on purpose."""


class NotFound(StoreError):
    """No such thread, message or attachment for this owner."""


class Busy(StoreError):
    """A continuation holds the thread."""


class BadCursor(StoreError):
    """A pagination cursor (`after`) that names nothing in the list."""


class Unavailable(StoreError):
    """The database failed (gone, refused, out of space); the request may be sent again."""


class Conflict(Unavailable):
    """A transaction lost a race it can simply run again (a deadlock, a row deleted under it)."""


class LimitExceeded(StoreError):
    """The thread's attachments would grow past the per-thread limit."""

    def __init__(self, current: int, added: int, limit: int) -> None:
        super().__init__(
            f"the thread holds {current} bytes of attachments; {added} more would pass the limit"
            f" of {limit} bytes"
        )
        self.current = current
        self.added = added
        self.limit = limit


class SchemaTooNew(StoreError):
    """The database was migrated by a newer svir than this one."""


class H1Error(SvirError):
    """The request failed: could not connect (`connect` true) or the connection broke."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


class ProxyError(H1Error):
    """The proxy on the way to the upstream failed before the request reached the upstream: it
    could not be reached, or refused the tunnel (`status`: its answer to CONNECT, None when there
    was none). `proxy` is its host:port, never its credentials. A connect failure (`connect`):
    retried as one."""

    def __init__(self, message: str, *, proxy: str, status: int | None = None) -> None:
        super().__init__(message, connect=True)
        self.proxy = proxy
        self.status = status


class TLSSetupError(H1Error):
    """The TLS handshake with the upstream failed on a certificate: the upstream's was not
    trusted (no `ca_file` for its CA), or it refused svir's (mTLS: no `client_cert`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, connect=True)


class LlamaServerError(SvirError):
    """The binary or model is missing, or the server did not start, answer, or stop."""
