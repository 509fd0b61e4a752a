"""Anthropic's Messages API as svir's front end writes it: the canonical events out as Anthropic's
SSE stream (`MessageStreamEncoder`), the shared fold as Anthropic's `message` object
(`MessageAggregator`), svir's errors in Anthropic's error shape (`anthropic_error`); and the
vocabulary both directions share (stop reasons, error types and their statuses), which the
`anthropic` upstream kind (svir.providers.anthropic_dialect) imports from here.

The request side (an Anthropic request to the canonical chat request, and count_tokens) is
svir.protocols.anthropic.request. Everything here is pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from svir.providers.anthropic_dialect import json_object, tool_input
from svir.wire.answer import AnswerFold
from svir.wire.classify import ClientError, to_client_error
from svir.wire.events import (
    ContentFilter,
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    RefusalDelta,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)

__all__ = [
    "ERROR_STATUS",
    "STOP_REASONS",
    "MessageAggregator",
    "MessageStreamEncoder",
    "anthropic_error",
    "error_body",
    "error_type",
    "message_id",
    "model_list",
    "stop_reason",
]

# ---------------------------------------------------------------------------------------------
# The shared vocabulary: stop reasons and finish reasons, error types and statuses


# Anthropic's stop_reason for each OpenAI finish_reason svir's events carry. A stop at one of
# the client's stop sequences is a plain `stop` in the canonical events (servers do not say which
# sequence, and strip it), so `stop_sequence` is never claimed: `end_turn` is.
STOP_REASONS: Final[Mapping[str, str]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

# Anthropic's error types and the status each comes with (docs.claude.com/en/api/errors).
ERROR_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# Anthropic's words for a prompt over the context, which Claude Code matches on (it compacts the
# conversation when it reads them) along with the two numbers after them.
OVERFLOW_START: Final = "prompt is too long"


def stop_reason(finish: str | None, *, tool_use: bool) -> str:
    """Anthropic's stop_reason for a canonical finish. `tool_use` exactly when a tool_use block
    went out, whatever the finish said: a client runs the tools only on that reason and looks
    for the blocks on it, and servers end a turn with tool calls as `stop` as often as not. An
    unknown or missing finish is `end_turn`."""
    if tool_use:
        return "tool_use"
    if finish is None:
        return "end_turn"
    reason = STOP_REASONS.get(finish, "end_turn")
    return "end_turn" if reason == "tool_use" else reason


def error_type(status: int, code: str | None = None) -> str:
    """Anthropic's error type for an answer of this status: a 503 (svir's every deployment cooling
    down, an upstream unavailable) and a 529 are `overloaded_error`, which clients retry after a
    pause; any other 5xx is `api_error`, any other 4xx `invalid_request_error`."""
    if code in ("context_length_exceeded", "context_window_exceeded"):
        return "invalid_request_error"
    if status in (503, 529):
        return "overloaded_error"
    for name, known in ERROR_STATUS.items():
        if known == status and name not in ("timeout_error", "billing_error"):
            return name
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(type: str, message: str) -> dict[str, Any]:
    """Anthropic's error object: the body of an HTTP error and the data of an `error` event."""
    return {"type": "error", "error": {"type": type, "message": message}}


# The numbers in svir's overflow message (classify._overflow_message, in OpenAI's words).
_CONTEXT_SIZE = re.compile(r"maximum context length is ([0-9]{1,9}) tokens")
_PROMPT_SIZE = re.compile(r"resulted in ([0-9]{1,9}) tokens")


def anthropic_error(ce: ClientError) -> tuple[int, dict[str, Any]]:
    """The status and body of svir's error `ce` answered to an Anthropic client. The status is
    kept (the SDKs pick their error class from it: BadRequestError, RateLimitError, …); the type
    follows it. A context overflow says `prompt is too long: N tokens > M maximum` as Anthropic
    does when svir knows both numbers, then svir's message. The caller sends `ce.headers`."""
    message = ce.message
    if ce.code in ("context_length_exceeded", "context_window_exceeded"):
        ctx = _CONTEXT_SIZE.search(message)
        prompt = _PROMPT_SIZE.search(message)
        if ctx and prompt:
            head = f"{OVERFLOW_START}: {prompt.group(1)} tokens > {ctx.group(1)} maximum"
        else:
            head = OVERFLOW_START
        message = f"{head}. {message}"
    return ce.status, error_body(error_type(ce.status, ce.code), message)


def message_id(request_id: str) -> str:
    """An Anthropic message id (`msg_…`) for svir's request id."""
    return request_id if request_id.startswith("msg_") else "msg_" + request_id


def model_list(models: list[str], created_at: str) -> dict[str, Any]:
    """Anthropic's model list (`GET /v1/models` with `anthropic-version`): one page, all of it.
    `created_at` (RFC 3339) is given: svir does not know when a model was made."""
    data = [{"type": "model", "id": m, "display_name": m, "created_at": created_at} for m in models]
    return {
        "data": data,
        "has_more": False,
        "first_id": models[0] if models else None,
        "last_id": models[-1] if models else None,
    }


def _input_json(arguments: str) -> str:
    """A tool_use block's input as the JSON text of its one input_json_delta: the model's own
    text when it is an object, else `{}` (the same input `tool_input` gives)."""
    return arguments if json_object(arguments) is not None else "{}"


# ---------------------------------------------------------------------------------------------
# The stream

_enc = msgspec.json.encode
_PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'
_STOP: Final = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_DELTA_END: Final = b"}}\n\n"


def _frame(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _enc(data) + b"\n\n"


class _Held:
    """Output that waits for the open tool_use block to close: a later call, or text or
    reasoning (with its seal) after the calls began."""

    __slots__ = ("kind", "parts", "signature", "start")

    def __init__(self, kind: str, start: ToolCallStart | None = None) -> None:
        self.kind = kind  # "text", "thinking", "redacted_thinking" (data in parts) or "tool_use"
        self.start = start
        self.parts: list[str] = []
        self.signature: str | None = None  # a thinking block's, which closes it


class MessageStreamEncoder:
    """Canonical events in, Anthropic's Messages SSE bytes out, for one answer.

    The stream is `message_start` (once, before anything else, with the input tokens known so
    far), blocks, then `message_delta` (stop_reason, usage) and `message_stop` at `Done`; or, on a
    failure, one `error` event and nothing after it. Blocks come one at a time, each
    `content_block_start`, its deltas, `content_block_stop`:

    - reasoning is a `thinking` block, with `signature: ""` at its start (svir signs nothing: a
      signature of its own would verify nowhere; clients send the empty one back, and the
      request side takes it). An Anthropic upstream's signature (`ReasoningSignature`) is the
      block's last delta, `signature_delta`, and closes it, as Anthropic's stream does; one
      with no reasoning before it (Anthropic's omitted thinking display) is a thinking block of
      the signature alone. A `RedactedReasoning` is a `redacted_thinking` block, whole at its
      start, with no delta;
    - text, and a refusal (the model's own words declining; Anthropic has no refusal block, and
      its `refusal` stop_reason is a safety classifier stopping the stream, which is what a
      content-filter finish is, so a refusal is shown as the text it is), is a `text` block,
      opened on the first non-empty piece only, so there is never an empty text block;
    - a tool call is a `tool_use` block with `input: {}` at its start, and its arguments as one
      `input_json_delta` when it closes: the model's JSON text as it came when it is an object,
      `{}` when it is empty or not an object (the input the non-streamed message gives). They
      are not passed on piece by piece because clients parse the pieces as partial JSON (the
      SDKs do) and fail the whole stream on a model's broken arguments, and `input` can hold
      only an object; a client acts on a call only once its block is complete anyway. So every
      tool_use block has its one delta, however the upstream sent the arguments.

    Switching between reasoning and text closes the open block and opens the other, so a
    thinking_delta never lands in a text block. Once a tool call is open it stays open until the
    answer ends: servers interleave the argument pieces of several calls, and an Anthropic block
    cannot be reopened, so the later calls (and any text or reasoning after the calls began)
    are held and written, in order, each as its own block, at the end.

    `stop_reason` is `tool_use` when a tool_use block went out, else the finish's (see
    `stop_reason`). Usage: `input_tokens` is the prompt less its cached tokens, which are
    `cache_read_input_tokens` (Anthropic counts the two apart; OpenAI's prompt_tokens holds both).
    `Keepalive` is a `ping`; `Role`, `Finish`, `Usage` and `ContentFilter` write nothing of their
    own.
    """

    __slots__ = (
        "_block",
        "_finish",
        "_held",
        "_held_calls",
        "_index",
        "_input_tokens",
        "_live_call",
        "_live_parts",
        "_started",
        "_text_prefix",
        "_tool_use",
        "_usage",
        "ended",
        "id",
        "model",
    )

    def __init__(self, *, id: str, model: str, input_tokens: int = 0) -> None:
        self.id = message_id(id)
        self.model = model
        self.ended = False
        self._input_tokens = input_tokens
        self._started = False
        self._block: str | None = None  # the open block's type
        self._index = -1  # the open (or last) block's index
        self._text_prefix = b""
        self._live_call: int | None = None
        self._live_parts: list[str] = []
        self._held: list[_Held] = []
        self._held_calls: dict[int, _Held] = {}
        self._tool_use = False
        self._finish: str | None = None
        self._usage: Usage | None = None

    @property
    def started(self) -> bool:
        """Whether `message_start` went out (before it, a failure can still be an HTTP error)."""
        return self._started

    def start(self) -> bytes:
        """`message_start`, if it has not gone out; every event writes it first anyway."""
        if self._started:
            return b""
        self._started = True
        return _frame(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
                },
            },
        )

    def encode(self, event: Event) -> bytes:
        """The bytes for one event (possibly empty)."""
        if self.ended:
            return b""
        # On the exact type: see svir.wire.events.
        if type(event) is TextDelta:
            if self._block == "text" and self._live_call is None:  # the common case
                return self._text_prefix + _enc(event.text) + _DELTA_END if event.text else b""
            return self._content("text", event.text)
        if type(event) is RefusalDelta:
            return self._content("text", event.text)
        if type(event) is ReasoningDelta:
            return self._content("thinking", event.text)
        if type(event) is ToolCallDelta:
            return self._tool_delta(event)
        if type(event) is ToolCallStart:
            return self._tool_start(event)
        if type(event) is Finish:
            self._finish = event.reason
            return self.start()
        if type(event) is Usage:
            self._usage = event
            return self.start()
        if type(event) is Done:
            return self._end()
        if type(event) is Keepalive:
            return self.start() + _PING
        if type(event) is StreamError:
            ce = to_client_error(event.error, before_first_byte=False)
            return self.error(ce)
        if type(event) is Role or type(event) is ContentFilter:
            return self.start()
        if type(event) is ReasoningSignature or type(event) is RedactedReasoning:
            return self._sealed(event)
        raise TypeError(f"not an event: {event!r}")

    def _sealed(self, event: ReasoningSignature | RedactedReasoning) -> bytes:
        """An Anthropic upstream's seal on its reasoning, passed on so that the client can send
        the block back: the signature closing its thinking block, a redacted block as its own;
        held in order, like the reasoning, once a tool call began."""
        out = self.start()
        if self._live_call is not None:
            if isinstance(event, RedactedReasoning):
                held = _Held("redacted_thinking")
                held.parts.append(event.data)
                self._held.append(held)
                return out
            last = self._held[-1] if self._held else None
            if last is None or last.kind != "thinking" or last.signature is not None:
                last = _Held("thinking")
                self._held.append(last)
            last.signature = event.signature
            return out
        if isinstance(event, RedactedReasoning):
            return out + self._close() + self._redacted(event.data)
        if self._block != "thinking":
            out += self._close() + self._open("thinking")
        return out + self._signature(event.signature) + self._close()

    def _signature(self, signature: str) -> bytes:
        delta = {"type": "signature_delta", "signature": signature}
        return _frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def _redacted(self, data: str) -> bytes:
        self._index += 1
        block = {"type": "redacted_thinking", "data": data}
        return _frame(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        ) + _frame("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def error(self, ce: ClientError) -> bytes:
        """End the stream with one `error` event, and nothing after it."""
        if self.ended:
            return b""
        self.ended = True
        _, body = anthropic_error(ce)
        return _frame("error", body)

    # -- blocks

    def _content(self, kind: str, text: str) -> bytes:
        if not text:
            return self.start()
        if self._live_call is not None:
            last = self._held[-1] if self._held else None
            if last is None or last.kind != kind or last.signature is not None:
                last = _Held(kind)
                self._held.append(last)
            last.parts.append(text)
            return self.start()
        out = self.start()
        if self._block != kind:
            out += self._close() + self._open(kind)
        return out + self._delta(kind, text)

    def _open(self, kind: str, start: ToolCallStart | None = None) -> bytes:
        self._index += 1
        self._block = kind
        if kind == "text":
            block: dict[str, Any] = {"type": "text", "text": ""}
            self._text_prefix = (
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                + str(self._index).encode()
                + b',"delta":{"type":"text_delta","text":'
            )
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            assert start is not None
            self._tool_use = True
            block = {"type": "tool_use", "id": start.id, "name": start.name, "input": {}}
        return _frame(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, kind: str, text: str) -> bytes:
        if kind == "text":
            return self._text_prefix + _enc(text) + _DELTA_END
        if kind == "thinking":
            delta: dict[str, Any] = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "input_json_delta", "partial_json": text}
        return _frame(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        out = b""
        if self._block == "tool_use":
            out = self._delta("tool_use", _input_json("".join(self._live_parts)))
        self._block = None
        return out + _frame(
            "content_block_stop", {"type": "content_block_stop", "index": self._index}
        )

    def _tool_start(self, event: ToolCallStart) -> bytes:
        out = self.start()
        if self._live_call is not None:
            held = _Held("tool_use", event)
            self._held.append(held)
            self._held_calls[event.index] = held
            return out
        out += self._close() + self._open("tool_use", event)
        self._live_call = event.index
        self._live_parts = []
        return out

    def _tool_delta(self, event: ToolCallDelta) -> bytes:
        if event.index == self._live_call:
            self._live_parts.append(event.arguments)
            return b""
        held = self._held_calls.get(event.index)
        if held is not None:
            held.parts.append(event.arguments)
        # A piece of a call never started is not an event the decoder makes.
        return b""

    def _end(self) -> bytes:
        out = self.start() + self._close()
        for held in self._held:
            if held.kind == "redacted_thinking":
                out += self._redacted(held.parts[0])
                continue
            if held.kind == "tool_use":
                out += self._open("tool_use", held.start)
                self._live_parts = held.parts
            else:
                out += self._open(held.kind)
                if held.parts:
                    out += self._delta(held.kind, "".join(held.parts))
                if held.signature is not None:
                    out += self._signature(held.signature)
            out += self._close()
        self._held.clear()
        self._held_calls.clear()
        self._live_call = None
        self.ended = True
        reason = stop_reason(self._finish, tool_use=self._tool_use)
        return (
            out
            + _frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": None},
                    "usage": _usage(self._usage, self._input_tokens),
                },
            )
            + _STOP
        )


def _usage(u: Usage | None, input_tokens: int) -> dict[str, Any]:
    """Anthropic's usage: the prompt less its cached tokens, the cached tokens apart."""
    if u is None:
        return {"input_tokens": input_tokens, "output_tokens": 0}
    cached = u.cached_tokens or 0
    out: dict[str, Any] = {
        "input_tokens": max(0, u.prompt_tokens - cached),
        "output_tokens": u.completion_tokens,
    }
    if u.cached_tokens is not None:
        out["cache_read_input_tokens"] = u.cached_tokens
    return out


# ---------------------------------------------------------------------------------------------
# The answer not streamed


class MessageAggregator(AnswerFold):
    """The shared fold of an answer's events, rendered as Anthropic's `message` object for a
    client that did not stream: blocks in the order thinking, text (with any refusal after it,
    as the stream shows it), tool_use (input parsed, `tool_input`)."""

    __slots__ = ()

    def message(self, *, id: str, model: str, input_tokens: int = 0) -> dict[str, Any]:
        # An Anthropic upstream's blocks as they came (signed), then any other reasoning.
        content: list[dict[str, Any]] = list(self.thinking_blocks)
        unsealed = "".join(self.reasoning[self.sealed :])
        if unsealed:
            content.append({"type": "thinking", "thinking": unsealed, "signature": ""})
        text = "".join(self.text) + "".join(self.refusal)
        if text:
            content.append({"type": "text", "text": text})
        calls = self.tool_calls()
        for call in calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": tool_input(call.arguments),
                }
            )
        return {
            "id": message_id(id),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason(self.finish_reason, tool_use=bool(calls)),
            "stop_sequence": None,
            "usage": _usage(self.usage, input_tokens),
        }
