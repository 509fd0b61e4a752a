"""The bytes of the Responses API's SSE events, made once where they can be: each event's head
(`event: <type>` and the start of its JSON), the ends that carry a sequence number, and the
templates of the events the encoder writes most (svir.protocols.responses.encode) and of the
response object's lifecycle events (svir.protocols.responses.response). Joining these is the
encoder's fast path: a bytes `%`-format costs a few joins."""

from __future__ import annotations

import functools
from typing import Final

import msgspec

__all__ = [
    "CREATED",
    "DELTA_HEAD",
    "DELTA_TAIL",
    "DELTA_TAILS",
    "IN_PROGRESS",
    "ITEM_ADDED",
    "ITEM_DONE",
    "PART_ADDED",
    "PART_DONE",
    "SEQ_END",
    "STARTED_MODEL",
    "STARTED_TAIL",
    "STATUS",
    "TAILS_MADE",
    "event_head",
    "seq_end",
]

_enc = msgspec.json.encode
# What follows the delta of an `output_text.delta` event, its sequence number and end included:
# made once for the first numbers (a 1,000-piece answer's), so that a piece is two joins, not a
# `%`-format (a third of a piece's cost).
DELTA_TAIL: Final = b',"logprobs":[],"sequence_number":%d}\n\n'
DELTA_TAILS: Final = tuple(DELTA_TAIL % n for n in range(1024))
TAILS_MADE: Final = len(DELTA_TAILS)
SEQ_END: Final = b',"sequence_number":%d}\n\n'
_SEQ_ENDS: Final = tuple(SEQ_END % n for n in range(TAILS_MADE))
# The encoder's own fields of the response as it starts, around its model (`_own_fields`' order).
STARTED_MODEL: Final = b'"status":"in_progress","model":'
STARTED_TAIL: Final = b',"output":[],"usage":null,"error":null,"incomplete_details":null}'


@functools.cache
def event_head(type: str) -> bytes:
    """An event's bytes up to its fields: `event: <type>` and `data: {"type":"<type>",` (the types
    are the encoder's own constants, so the cache stays small)."""
    return b"event: " + type.encode() + b"\ndata: " + _enc({"type": type})[:-1] + b","


# The last two events of a message's part, around its ids and its text (encoded once for both),
# each then ended by `seq_end`: joined, not `%`-formatted (a bytes `%` costs a few joins).
PART_DONE: Final = {
    "output_text": (
        event_head("response.output_text.done"),
        b'"text":',
        b',"logprobs":[]',
        event_head("response.content_part.done"),
        b'"part":{"type":"output_text","text":',
        b',"annotations":[],"logprobs":[]}',
    ),
    "refusal": (
        event_head("response.refusal.done"),
        b'"refusal":',
        b"",
        event_head("response.content_part.done"),
        b'"part":{"type":"refusal","refusal":',
        b"}",
    ),
}
ITEM_DONE: Final = event_head("response.output_item.done") + b'"output_index":'
CREATED: Final = event_head("response.created") + b'"response":'
ITEM_ADDED: Final = event_head("response.output_item.added") + b'"output_index":'
PART_ADDED: Final = event_head("response.content_part.added")
DELTA_HEAD: Final = event_head("response.output_text.delta")
IN_PROGRESS: Final = event_head("response.in_progress") + b'"response":'
# The final response's status as JSON.
STATUS: Final = {s: _enc(s) for s in ("completed", "incomplete", "failed", "in_progress")}


def seq_end(seq: int) -> bytes:
    """An event's end from its sequence number on."""
    return _SEQ_ENDS[seq] if seq < TAILS_MADE else SEQ_END % seq
