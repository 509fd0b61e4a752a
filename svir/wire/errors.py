"""The wire core's typed errors: every failure the core reports is one of these.

`WireError` is the root; nothing else escapes the core on bad input. `UpstreamError` describes a
failure of the model server (an HTTP error, an error inside a stream, a truncated stream) as one
classified value that the policy layer can retry, fall back on, or hand to the client.
"""

from __future__ import annotations

import enum
from typing import Any


class WireError(Exception):
    """Root of every error the wire core raises."""


class SSEError(WireError):
    """The byte stream is not valid SSE within the configured limits."""


class LineTooLong(SSEError):
    """A line grew past the parser's line cap."""


class EventTooLarge(SSEError):
    """An event's joined data grew past the parser's event cap."""


class ProtocolError(WireError):
    """A chunk was valid SSE but not a valid chat-completion chunk (bad JSON, wrong types)."""


class ToolCallError(WireError):
    """The assembled tool calls are not a valid set (§3.3)."""


class BodyError(WireError):
    """A request body could not be built from the client's input."""


class BaseURLError(WireError):
    """A configured base URL cannot be used (§1)."""


class ErrorKind(enum.StrEnum):
    """What kind of failure an upstream error is; decides retry, fallback and client status."""

    AUTH = "auth"
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    REJECTED = "rejected"
    CONTEXT_OVERFLOW = "context_overflow"
    CONTENT_FILTER = "content_filter"
    UNSUPPORTED_INPUT = "unsupported_input"
    # The server has no such model (a 404 that says so); another deployment may have it.
    MODEL_NOT_FOUND = "model_not_found"
    # The server failed on what the model wrote (a tool call its parser could not read): the
    # request and the server are fine, this answer was not.
    MODEL_OUTPUT = "model_output"
    NOT_A_STREAM = "not_a_stream"
    INCOMPLETE = "incomplete"
    PROTOCOL = "protocol"
    OTHER = "other"


# The one retry decision (svir.policy.resilience retries exactly these, before the first byte):
# failures that the same request, sent again, may not meet. A stream cut before its end is one of
# them: nothing of it reached the client yet when the policy retries.
RETRYABLE_KINDS = frozenset(
    {ErrorKind.RATE_LIMITED, ErrorKind.TIMEOUT, ErrorKind.TRANSIENT, ErrorKind.INCOMPLETE}
)


class UpstreamError(WireError):
    """One classified failure of an upstream model server."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        code: str | int | None = None,
        type: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        in_stream: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.code = code
        self.type = type
        self.param = param
        self.retry_after = retry_after
        self.in_stream = in_stream
        self.details = details or {}

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again may succeed (`RETRYABLE_KINDS`)."""
        return self.kind in RETRYABLE_KINDS

    def replaced(
        self,
        *,
        message: str | None = None,
        code: str | int | None = None,
        type: str | None = None,
        param: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> UpstreamError:
        """The same failure in other words: the fields given replaced, every other one kept."""
        return UpstreamError(
            self.kind,
            self.message if message is None else message,
            status=self.status,
            code=self.code if code is None else code,
            type=self.type if type is None else type,
            param=self.param if param is None else param,
            retry_after=self.retry_after,
            in_stream=self.in_stream,
            details=self.details if details is None else details,
        )

    def __repr__(self) -> str:
        return (
            f"UpstreamError(kind={self.kind.value!r}, message={self.message!r}, "
            f"status={self.status!r}, code={self.code!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UpstreamError):
            return NotImplemented
        return (
            self.kind,
            self.message,
            self.status,
            self.code,
            self.type,
            self.retry_after,
            self.in_stream,
        ) == (
            other.kind,
            other.message,
            other.status,
            other.code,
            other.type,
            other.retry_after,
            other.in_stream,
        )

    __hash__ = None  # type: ignore[assignment]
