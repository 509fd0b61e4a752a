"""The Responses API's response object as svir writes it: the fields a request leaves out
(OpenAI's defaults), the order an echo of the request's fields comes in (`ECHO_KEYS`), the
usage (`response_usage`), the `error` of a failed response (`failure`), and `ResponseObject`,
the response as it stands and the lifecycle events that nest it, which the stream encoder
(svir.protocols.responses.encode) builds on. Pure: no I/O, no clock."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from svir.protocols.responses.frames import (
    CREATED,
    IN_PROGRESS,
    STARTED_MODEL,
    STARTED_TAIL,
    STATUS,
    event_head,
    seq_end,
)
from svir.wire.classify import ClientError
from svir.wire.events import Usage

__all__ = [
    "ECHO_KEYS",
    "INCOMPLETE_REASONS",
    "ResponseObject",
    "failure",
    "response_usage",
]

# The canonical finishes that end a response as `incomplete`, and the reason it then gives.
INCOMPLETE_REASONS: Final[Mapping[str, str]] = {
    "length": "max_output_tokens",
    "content_filter": "content_filter",
}

_OVERFLOW_CODES: Final = frozenset({"context_length_exceeded", "context_window_exceeded"})
# Codex reads the wait of a rate-limit failure from its message with this pattern
# (codex-rs/codex-api/src/sse/responses.rs, `rate_limit_regex`), as OpenAI words it.
_WAIT_SAID: Final = re.compile(r"(?i)try again in\s*\d+(?:\.\d+)?\s*(?:s|ms|seconds?)\b")

# The fields of the response object svir fills when the request's `echo` leaves them out: what
# OpenAI answers for a request that did not set them (the SDK's `Response` requires
# `parallel_tool_calls`, `tool_choice` and `tools`).
_DEFAULTS: Final[Mapping[str, Any]] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "disabled",
    "user": None,
}
# The response object's fields before `echo`'s: its own first three (`id` and `created_at` set
# per response), then the defaults.
_BASE: Final[dict[str, Any]] = {"id": "", "object": "response", "created_at": 0, **_DEFAULTS}
# The keys of the echo svir.protocols.responses.request makes, in the response object's order: the
# table's, then the request fields OpenAI repeats beyond it. Such an echo is written as it is.
ECHO_KEYS: Final = (
    *_DEFAULTS,
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "background",
    "top_logprobs",
    "max_tool_calls",
)
# The fields the encoder owns, whatever `echo` holds.
_OWN: Final = frozenset(
    {"id", "object", "created_at", "status", "model", "output", "usage", "error",
     "incomplete_details"}
)  # fmt: skip

_enc = msgspec.json.encode


def response_usage(u: Usage | None) -> dict[str, Any] | None:
    """The Responses usage object for the upstream's counts (None when it reported none): the
    details OpenAI always gives are 0 when the server left them out (Codex requires both)."""
    if u is None:
        return None
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens or 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens or 0},
        "total_tokens": u.total_tokens,
    }


def _seconds(wait: float) -> str:
    """A wait as OpenAI writes it in a rate-limit message: `7s`, `6.5s`, `120ms`."""
    if wait < 1:
        return f"{max(1, math.ceil(wait * 1000))}ms"
    if wait == int(wait):
        return f"{int(wait)}s"
    return f"{math.ceil(wait * 1000) / 1000:g}s"


def failure(ce: ClientError, *, retry_after: float | None = None) -> dict[str, Any]:
    """The `error` of a failed response for svir's error `ce`, with the codes clients act on: a
    context overflow is `context_length_exceeded` (Codex compacts its history on it), a rate
    limit `rate_limit_exceeded` with the wait in its message ("Please try again in 7s", which
    Codex reads before it retries), any 5xx `server_error` (retried); any other keeps svir's code
    (`invalid_prompt` without one). The wait is `retry_after`, else the error's Retry-After."""
    message = ce.message
    if ce.code in _OVERFLOW_CODES:
        code = "context_length_exceeded"
    elif ce.status == 429 or ce.code == "rate_limit_exceeded":
        code = "rate_limit_exceeded"
        if retry_after is None:
            try:
                retry_after = float(ce.headers.get("Retry-After", ""))
            except ValueError:
                retry_after = None
        if (
            retry_after is not None
            and math.isfinite(retry_after)
            and retry_after >= 0
            and not _WAIT_SAID.search(message)
        ):
            message = f"{message.rstrip()} Please try again in {_seconds(retry_after)}.".lstrip()
    elif ce.status >= 500:
        code = "server_error"
    else:
        code = ce.code or "invalid_prompt"
    return {"code": code, "message": message, "type": ce.type, "param": ce.param}


class ResponseObject:
    """The response object of one Responses stream as it stands (`response`), and the lifecycle
    events that nest it: `response.created` and `response.in_progress` (`start`, and every
    keep-alive), then the last, `response.completed`, `.incomplete` or `.failed` (`_final`).
    Every event's `sequence_number` is counted here. ResponseStreamEncoder writes the output
    items in between."""

    __slots__ = (
        "_base_made",
        "_created_at",
        "_echo",
        "_error",
        "_finish",
        "_items",
        "_seq",
        "_skeleton_bytes",
        "_started",
        "_started_bytes",
        "_status",
        "_usage",
        "_written",
        "ended",
        "id",
        "model",
    )

    def __init__(self, *, id: str, model: str, created_at: int, echo: Mapping[str, Any]) -> None:
        self.id = id
        self.model = model
        self.ended = False
        # Taken as it is: the response's fields are made from it when first written or asked
        # for (`_skeleton`, `_base`).
        self._echo = echo
        self._created_at = int(created_at)
        self._base_made: dict[str, Any] | None = None
        self._skeleton_bytes: bytes | None = None
        self._started_bytes: bytes | None = None
        self._seq = 0
        self._started = False
        self._status = "in_progress"
        self._items: list[dict[str, Any]] = []  # the output, each item as it stands
        # The JSON of each closed item (the first of `_items`), as `output_item.done` wrote it:
        # the final response's output repeats it.
        self._written: list[bytes] = []
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._error: dict[str, Any] | None = None

    # -- the object

    @property
    def started(self) -> bool:
        """Whether `response.created` went out (before it, a failure can be an HTTP error)."""
        return self._started

    @property
    def output_items(self) -> list[dict[str, Any]]:
        """The output items as they stand."""
        return list(self._items)

    @property
    def response(self) -> dict[str, Any]:
        """The response object as it stands; after the end, the final one."""
        out = dict(self._base())
        out.update(self._own_fields())
        return out

    def _base(self) -> dict[str, Any]:
        """The response object's fields the encoder does not own: the table, `id` and
        `created_at`, then `echo` over them (in place, so that the order stays the table's, then
        `echo`'s own)."""
        base = self._base_made
        if base is None:
            base = self._base_made = _BASE.copy()
            base["id"] = self.id
            base["created_at"] = self._created_at
            echo = self._echo
            if _OWN.isdisjoint(echo):
                base.update(echo)
            else:
                base.update((k, v) for k, v in echo.items() if k not in _OWN)
        return base

    def _own_fields(self) -> dict[str, Any]:
        """The response object's fields the encoder owns, as they stand (they follow `_base`'s)."""
        reason = INCOMPLETE_REASONS.get(self._finish or "")
        return {
            "status": self._status,
            "model": self.model,
            "output": self.output_items,
            "usage": response_usage(self._usage),
            "error": self._error,
            "incomplete_details": (
                {"reason": reason} if self._status == "incomplete" and reason else None
            ),
        }

    # -- the lifecycle events

    def start(self) -> bytes:
        """`response.created` and `response.in_progress`, if they have not gone out; every event
        writes them first anyway."""
        if self._started:
            return b""
        self._started = True
        response = self._started_response()
        seq = self._seq
        self._seq = seq + 2
        return b"".join((CREATED, response, seq_end(seq), IN_PROGRESS, response, seq_end(seq + 1)))

    def keepalive(self) -> bytes:
        """A `response.in_progress` event that keeps a client's idle timer from running out while
        the upstream is silent (nothing once the stream ended)."""
        if self.ended:
            return b""
        if not self._started:
            return self.start()
        return self._lifecycle("response.in_progress")

    # -- framing

    def _frame(self, type: str, fields: dict[str, Any]) -> bytes:
        """The event `type` with `fields` (a fresh dict, taken): `{"type": …, **fields,
        "sequence_number": …}` as JSON, its head bytes made once per type."""
        fields["sequence_number"] = self._seq
        self._seq += 1
        return event_head(type) + _enc(fields)[1:] + b"\n\n"

    def _lifecycle(self, type: str, response: bytes | None = None) -> bytes:
        """A lifecycle event nesting `response` (encoded; by default the response as it starts,
        its output empty: encoded once, for `response.created`, `.in_progress` and every
        keep-alive)."""
        if response is None:
            response = self._started_response()
        seq = self._seq
        self._seq = seq + 1
        return b'%b"response":%b,"sequence_number":%d}\n\n' % (event_head(type), response, seq)

    def _started_response(self) -> bytes:
        """The response as it starts, its output empty, encoded once: `_own_fields` written from
        a template."""
        response = self._started_bytes
        if response is None:
            response = self._started_bytes = b"".join(
                (self._skeleton(), STARTED_MODEL, _enc(self.model), STARTED_TAIL)
            )
        return response

    def _skeleton(self) -> bytes:
        """The encoded response object's fields the encoder does not own, open at its end (`{…,`):
        every lifecycle event's response begins with them."""
        skeleton = self._skeleton_bytes
        if skeleton is None:
            echo = self._echo
            if type(echo) is dict and tuple(echo) == ECHO_KEYS:
                # The front end's echo is in the response's order: written as it is after the
                # first three fields, with no dict made.
                skeleton = b"".join(
                    (
                        b'{"id":',
                        _enc(self.id),
                        b',"object":"response","created_at":%d,' % self._created_at,
                        _enc(echo)[1:-1],
                        b",",
                    )
                )
            else:
                skeleton = _enc(self._base())[:-1] + b","
            self._skeleton_bytes = skeleton
        return skeleton

    def _final(self, type: str) -> bytes:
        """The last lifecycle event, nesting the final response (`response`'s bytes, the fields
        in `_own_fields`' order): the closed items as they were written, a failure's cut item
        encoded here."""
        written = self._written
        if len(written) < len(self._items):
            written = written + [_enc(item) for item in self._items[len(written) :]]
        status = self._status
        reason = INCOMPLETE_REASONS.get(self._finish or "") if status == "incomplete" else None
        usage, error = self._usage, self._error
        seq = self._seq
        self._seq = seq + 1
        return b"".join(
            (
                event_head(type),
                b'"response":',
                self._skeleton(),
                b'"status":',
                STATUS[status],
                b',"model":',
                _enc(self.model),
                b',"output":[',
                b",".join(written),
                b'],"usage":',
                b"null" if usage is None else _enc(response_usage(usage)),
                b',"error":',
                b"null" if error is None else _enc(error),
                b',"incomplete_details":',
                b'{"reason":%b}' % _enc(reason) if reason else b"null",
                b"}",
                seq_end(seq),
            )
        )
