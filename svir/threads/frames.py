"""The frames of `/v1/threads/{id}/continue` (seed 002): one JSON object per SSE `data:` line, told
apart by `type`, with no `[DONE]`: the stream ends after a `done` or an `error` frame.

- `delta`      `{"type":"delta","text":...}`: a piece of the answer.
- `reasoning`  `{"type":"reasoning","text":...}`: a piece of the model's reasoning, whichever way
               the server sent it (a reasoning field or inline `<think>`).
- `refusal`    `{"type":"refusal","text":...}`: a piece of a refusal the server marked as one.
- `tool_call`  `{"type":"tool_call","index":i,"id":...,"name":...,"arguments":"<raw JSON>"}`:
               one complete tool call, sent once the answer is complete and stored.
- `usage`      `{"type":"usage","prompt_tokens":p,"completion_tokens":c,"total_tokens":t}`:
               token counts, when the server gave them, just before `done`.
- `done`       `{"type":"done","message_id":...,"finish_reason":...,"appended":"<answer text>"}`:
               the answer is stored in the thread as message `message_id`.
- `error`      `{"type":"error","error":{OpenAI error object},"appended":null}`: the continuation
               failed or was cancelled; nothing was appended to the thread.

With `"stream": false` the response is the last frame's object alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from svir.wire.classify import ClientError, error_body
from svir.wire.events import Usage
from svir.wire.sse import encode_comment, encode_data
from svir.wire.toolcalls import ToolCall

__all__ = [
    "delta",
    "done",
    "encode",
    "encode_all",
    "error",
    "is_last",
    "keepalive",
    "reasoning",
    "refusal",
    "tool_call",
    "usage",
]

_encode = msgspec.json.encode

Frame = dict[str, Any]

_LAST = frozenset({"done", "error"})


def delta(text: str) -> Frame:
    return {"type": "delta", "text": text}


def reasoning(text: str) -> Frame:
    return {"type": "reasoning", "text": text}


def refusal(text: str) -> Frame:
    return {"type": "refusal", "text": text}


def tool_call(call: ToolCall) -> Frame:
    return {
        "type": "tool_call",
        "index": call.index,
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


def usage(u: Usage) -> Frame:
    return {
        "type": "usage",
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def done(message_id: str, finish_reason: str, appended: str) -> Frame:
    return {
        "type": "done",
        "message_id": message_id,
        "finish_reason": finish_reason,
        "appended": appended,
    }


def error(ce: ClientError, **extra: Any) -> Frame:
    """An error frame; `extra` adds fields to the error object (such as `sizes`)."""
    body = error_body(ce)
    body["error"].update(extra)
    return {"type": "error", "error": body["error"], "appended": None}


def encode(frame: Frame) -> bytes:
    return encode_data(_encode(frame))


def keepalive() -> bytes:
    return encode_comment("keepalive")


def is_last(frame: Frame | None) -> bool:
    """Whether `frame` ends the stream (a `done` or an `error` frame)."""
    return frame is not None and frame["type"] in _LAST


def encode_all(items: Iterable[Frame | None]) -> bytes:
    """Frames as one piece of the stream (those of one upstream read); None is a keep-alive."""
    return b"".join([keepalive() if f is None else encode(f) for f in items])
