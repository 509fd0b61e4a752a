"""The encoder: normalized events out as canonical OpenAI chat-completion bytes.

`ChunkEncoder` writes the `chat.completion.chunk` SSE stream every client gets: one id and model,
reasoning only as `reasoning_content`, the usage chunk only when asked for, `[DONE]` only after a
complete answer, and a failure as exactly one error frame. `CompletionAggregator` renders the
shared fold of the same events (`svir.wire.answer`) as the `chat.completion` object for clients
that did not stream.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from svir.wire.answer import AnswerFold, openai_tool_call
from svir.wire.classify import to_client_error
from svir.wire.errors import UpstreamError
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

_enc = msgspec.json.encode
_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keepalive\n\n"
_MID = b'},"finish_reason":null}]}\n\n'
_DELTA_END = _MID[1:]
_TEXT_END = b"}" + _DELTA_END


def usage_dict(u: Usage) -> dict[str, Any]:
    """The OpenAI usage object, with the details the server reported."""
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }
    if u.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out


def stream_error_fields(err: UpstreamError) -> tuple[str, str, str | None]:
    """Message, type and code of the error frame that reports an upstream failure mid-stream."""
    ce = to_client_error(err, before_first_byte=False)
    return ce.message, ce.type, None if ce.code is None else str(ce.code)


def error_frame(message: str, type: str, code: str | None) -> bytes:
    """The one frame that ends a failed stream, in place of `[DONE]`."""
    return b"data: " + _enc({"error": {"message": message, "type": type, "code": code}}) + b"\n\n"


class ChunkEncoder:
    """Encodes one response's events. Stateful: it tracks the role chunk and the stream's end."""

    __slots__ = ("_delta_prefix", "_ended", "_head", "_role_sent", "_text_prefix", "include_usage")
    # Each chunk's `object` (svir.wire.completions' encoder writes `text_completion`s).
    OBJECT: ClassVar[bytes] = b"chat.completion.chunk"

    def __init__(self, *, id: str, model: str, created: int, include_usage: bool = False) -> None:
        self.include_usage = include_usage
        self._head = (
            b'data: {"id":'
            + _enc(id)
            + b',"object":"'
            + self.OBJECT
            + b'","created":'
            + str(int(created)).encode()
            + b',"model":'
            + _enc(model)
            + b',"choices":'
        )
        self._delta_prefix = self._head + b'[{"index":0,"delta":'
        # A piece of the answer, once per chunk of it: its frame is this, the text, _TEXT_END.
        self._text_prefix = self._delta_prefix + b'{"content":'
        self._role_sent = False
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether `[DONE]` or an error frame was written."""
        return self._ended

    def encode(self, event: Event) -> bytes:
        """The bytes for one event (possibly empty: not every event shows on the wire)."""
        if self._ended:
            return b""
        # On the exact type: see svir.wire.events.
        if type(event) is TextDelta:
            if self._role_sent:  # the common case, once per chunk of answer: no extra call
                return self._text_prefix + _enc(event.text) + _TEXT_END
            return self._delta(b'{"content":' + _enc(event.text) + b"}")
        if type(event) is ReasoningDelta:
            return self._delta(b'{"reasoning_content":' + _enc(event.text) + b"}")
        if type(event) is ToolCallDelta:
            return self._delta(
                b'{"tool_calls":[{"index":'
                + str(event.index).encode()
                + b',"function":{"arguments":'
                + _enc(event.arguments)
                + b"}}]}"
            )
        if type(event) is Role:
            return self._role()
        if type(event) is ToolCallStart:
            piece = {
                "index": event.index,
                "id": event.id,
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
            return self._delta(b'{"tool_calls":[' + _enc(piece) + b"]}")
        if type(event) is RefusalDelta:
            return self._delta(b'{"refusal":' + _enc(event.text) + b"}")
        if type(event) is Finish:
            return (
                self._role()
                + self._delta_prefix
                + b'{},"finish_reason":'
                + _enc(event.reason)
                + b"}]}\n\n"
            )
        if type(event) is Usage:
            if not self.include_usage:
                return b""
            return self._head + b'[],"usage":' + _enc(usage_dict(event)) + b"}\n\n"
        if type(event) is Done:
            self._ended = True
            return _DONE
        if type(event) is Keepalive:
            return _KEEPALIVE
        if type(event) is StreamError:
            return self.error(*stream_error_fields(event.error))
        if (
            type(event) is ContentFilter
            or type(event) is ReasoningSignature
            or type(event) is RedactedReasoning
        ):
            # A streamed OpenAI answer has no place for a reasoning block's seal; the
            # non-streamed one keeps it in `thinking_blocks`.
            return b""
        raise TypeError(f"not an event: {event!r}")

    def error(self, message: str, type: str = "upstream_error", code: str | None = None) -> bytes:
        """End the stream with one error frame, and nothing after it."""
        if self._ended:
            return b""
        self._ended = True
        return error_frame(message, type, code)

    def _role(self) -> bytes:
        if self._role_sent:
            return b""
        self._role_sent = True
        return self._delta_prefix + b'{"role":"assistant","content":""' + _MID

    def _delta(self, delta: bytes) -> bytes:
        if self._role_sent:
            return self._delta_prefix + delta + _DELTA_END
        return self._role() + self._delta_prefix + delta + _DELTA_END


class CompletionAggregator(AnswerFold):
    """Folds events into one `chat.completion` for a client that did not stream."""

    __slots__ = ()

    def message(self) -> dict[str, Any]:
        """The assistant message."""
        calls = self.tool_calls()
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text) if self.text or not calls else None,
        }
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.thinking_blocks:
            # LiteLLM's key for the same blocks: a client that sends the message back as it got
            # it lets the next turn carry the signatures (docs/providers.md, `anthropic`).
            msg["thinking_blocks"] = self.thinking_blocks
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        if calls:
            msg["tool_calls"] = [openai_tool_call(c) for c in calls]
        return msg

    def completion(self, *, id: str, model: str, created: int) -> dict[str, Any]:
        """The `chat.completion` object."""
        out: dict[str, Any] = {
            "id": id,
            "object": "chat.completion",
            "created": int(created),
            "model": model,
            "choices": [
                {"index": 0, "message": self.message(), "finish_reason": self.finish_reason}
            ],
        }
        if self.usage is not None:
            out["usage"] = usage_dict(self.usage)
        return out
