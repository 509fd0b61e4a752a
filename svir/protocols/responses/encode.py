"""OpenAI's Responses API as svir's front end writes it: the canonical events out as the Responses
SSE stream (`ResponseStreamEncoder`), whose output items are also the response object a client
that did not stream gets. The response object itself, its lifecycle events and the `error` of a
failed response are svir.protocols.responses.response; the events' bytes
svir.protocols.responses.frames.

The request side (a Responses request to the canonical chat request, and the sealing of
reasoning) is svir.protocols.responses.request. Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from svir.protocols.responses.frames import (
    DELTA_HEAD,
    DELTA_TAIL,
    DELTA_TAILS,
    ITEM_ADDED,
    ITEM_DONE,
    PART_ADDED,
    PART_DONE,
    TAILS_MADE,
    event_head,
    seq_end,
)
from svir.protocols.responses.response import INCOMPLETE_REASONS, ResponseObject, failure
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

__all__ = ["ResponseStreamEncoder"]

_enc = msgspec.json.encode
_EVENT_TYPES: Final = frozenset(
    {ContentFilter, Done, Finish, Keepalive, ReasoningDelta, ReasoningSignature, RedactedReasoning,
     RefusalDelta, Role, StreamError, TextDelta, ToolCallDelta, ToolCallStart, Usage}
)  # fmt: skip


class _Held:
    """An item that waits for the live function call to close: a later call (its arguments
    gathered), or text, refusal or reasoning that came after the calls began."""

    __slots__ = ("kind", "parts", "start")

    def __init__(self, kind: str, start: ToolCallStart | None = None) -> None:
        self.kind = kind  # "output_text", "refusal", "reasoning" or "function_call"
        self.start = start
        self.parts: list[str] = []


class ResponseStreamEncoder(ResponseObject):
    """Canonical events in, the Responses API's SSE stream out, for one response; the output items
    it wrote are the response object (`response`) the front end stores and answers a client that
    did not stream with.

    The stream is `response.created` then `response.in_progress` (`start`, each with the response
    object under `response`, its output empty), output items, then one end: `response.completed`
    (usage), `response.incomplete` (`incomplete_details.reason` `max_output_tokens` for a length
    finish, `content_filter` for a filter's), or `response.failed` (`error`, see `failure`).
    Every event has `type` and a `sequence_number` rising from 0. Items come one at a time, each
    `response.output_item.added`, its events, `response.output_item.done`:

    - reasoning is a `reasoning` item (`rs_…`): with a `summary` asked for, one summary part
      (`reasoning_summary_part.added`, `reasoning_summary_text.delta` with `summary_index`,
      `.done`, `reasoning_summary_part.done`), else `reasoning_text.delta` / `.done`
      (`content_index`) and the text as its `content`; with `seal`, its `encrypted_content` is
      `seal(text)`. An upstream's own seal (Anthropic's signature, a redacted block) has no
      place in it and is not shown;
    - text is a `message` item (`msg_…`, role assistant) with an `output_text` part
      (`content_part.added`, `output_text.delta`, `output_text.done`, `content_part.done`); a
      refusal is a `refusal` part of the same message (`refusal.delta` / `.done`). An item
      opens on its first non-empty piece, so there is never an empty one;
    - a tool call is a `function_call` item (`fc_…`) with its `call_id` (made unique when the
      server's is empty, repeated, or one of `taken_call_ids`, the conversation's) and name (a
      flat name in `names` as the `namespace` and `name` it stands for, as Codex reads a
      namespaced call), its arguments as `function_call_arguments.delta` pieces then `.done`.

    Switching between reasoning and text closes one item and opens the other. Once a call is
    open it stays open until the answer ends, since servers interleave the pieces of several
    calls and an item closed cannot take more: later calls, and text or reasoning after the calls
    began, are held and written whole, each its own item, at the end.

    A failure (`error`, or a `StreamError`) writes `response.failed` at once, with the items so
    far (the open one `incomplete`) in its response, and no `output_item.done` for the open item:
    a client must not run a call whose arguments were cut. `close` fails a stream whose events
    ran out before its end, so that a stream never just ends. `keepalive` (and a `Keepalive`
    event) is a `response.in_progress` event: a data event, since Codex's idle timeout counts
    only events, and SSE comments are not events.
    """

    __slots__ = (
        "_call_ids",
        "_held",
        "_held_calls",
        "_item_base",
        "_live_call",
        "_open",
        "_open_index",
        "_part",
        "_part_ids",
        "_part_index",
        "_parts",
        "_prefix",
        "_taken",
        "_texting",
        "names",
        "seal",
        "summary",
    )

    def __init__(
        self,
        *,
        id: str,
        model: str,
        created_at: int,
        echo: Mapping[str, Any],
        summary: str | None,
        names: Mapping[str, tuple[str, str]],
        seal: Callable[[str], str] | None,
        taken_call_ids: Iterable[str] = (),
    ) -> None:
        super().__init__(id=id, model=model, created_at=created_at, echo=echo)
        self.summary = summary
        self.names = names
        self.seal = seal
        self._item_base = id[5:] if id.startswith("resp_") else id
        self._open: str | None = None  # the open item's type
        self._open_index = -1
        self._part: str | None = None  # the open message part's type
        # Whether a text delta is simply the next piece of the open text part: that part is
        # open, no call is live and the stream has not ended (`encode`'s common case).
        self._texting = False
        self._part_index = -1
        self._parts: list[str] = []  # the open part's (or reasoning's, or call's) pieces
        self._prefix = b""  # the open text part's delta event, up to its delta
        self._part_ids = b""  # the open part's ids as its events' JSON begins with them
        self._live_call: int | None = None
        # The conversation's call ids count as used: a server that numbers its calls per answer
        # (`call_0` every turn) would repeat one, and a client's next request would hold it twice.
        # Made into a set (`_call_ids`) when the first call opens: most answers make none.
        self._taken = taken_call_ids
        self._call_ids: set[str] | None = None
        self._held: list[_Held] = []
        self._held_calls: dict[int, _Held] = {}

    # -- the output

    @property
    def output_items(self) -> list[dict[str, Any]]:
        """The output items as they stand (the open one with what it holds so far)."""
        items = list(self._items)
        if self._open is not None and not self.ended:
            items[self._open_index] = self._snapshot("in_progress")
        return items

    # -- the stream

    def encode(self, event: Event) -> bytes:
        """The bytes for one event (possibly empty)."""
        # Dispatched on the exact type: isinstance against a msgspec Struct class that does not
        # match goes through its metaclass, several times slower, once per check.
        if type(event) is TextDelta and self._texting:
            text = event.text  # the common case, once per piece of the answer
            if not text:
                return b""
            self._parts.append(text)
            seq = self._seq
            self._seq = seq + 1
            if seq < TAILS_MADE:
                return self._prefix + _enc(text) + DELTA_TAILS[seq]
            return self._prefix + _enc(text) + DELTA_TAIL % seq
        if self.ended:
            return b""
        kind: Any = type(event)
        ev: Any = event  # its type is `kind`
        if kind not in _EVENT_TYPES:
            kind = next((k for k in kind.__mro__ if k in _EVENT_TYPES), kind)
        if kind is TextDelta:
            return self._content("output_text", ev.text)
        if kind is ReasoningDelta:
            return self._content("reasoning", ev.text)
        if kind is ToolCallDelta:
            return self._tool_delta(ev)
        if kind is Finish or kind is Usage:
            # Both are written at the end, in the response's status and usage.
            if kind is Finish:
                self._finish = ev.reason
            else:
                self._usage = ev
            return b"" if self._started else self.start()
        if kind is Done:
            return self._end()
        if kind is Role or kind is ContentFilter or kind is ReasoningSignature:
            return self.start()
        if kind is RedactedReasoning:  # an upstream's seal: no place in a Responses stream
            return self.start()
        if kind is ToolCallStart:
            return self._tool_start(ev)
        if kind is RefusalDelta:
            return self._content("refusal", ev.text)
        if kind is Keepalive:
            return self.keepalive()
        if kind is StreamError:
            error = ev.error
            ce = to_client_error(error, before_first_byte=False)
            return self.error(ce, retry_after=error.retry_after)
        raise TypeError(f"not an event: {event!r}")

    def error(self, ce: ClientError, *, retry_after: float | None = None) -> bytes:
        """End the stream with `response.failed` carrying `failure(ce)`, and nothing after it."""
        if self.ended:
            return b""
        out = self.start()
        if self._open is not None:
            self._items[self._open_index] = self._snapshot("incomplete")
        self._open = None
        self._part = None
        self._texting = False
        self.ended = True
        self._status = "failed"
        self._error = failure(ce, retry_after=retry_after)
        return out + self._final("response.failed")

    def close(self) -> bytes:
        """The upstream's events ran out: a stream that has not ended fails (`server_error`)."""
        if self.ended:
            return b""
        return self.error(
            ClientError(
                502,
                "upstream_error",
                "upstream_error",
                "The model server's stream ended before the answer was complete.",
            )
        )

    # -- items

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self._item_base}_{len(self._items)}"

    def _add(self, item: dict[str, Any]) -> bytes:
        self._open_index = len(self._items)
        self._open = item["type"]
        self._items.append(item)
        return self._frame(
            "response.output_item.added", {"output_index": self._open_index, "item": item}
        )

    def _snapshot(self, status: str) -> dict[str, Any]:
        """The open item with what it holds so far, in `status`."""
        item = dict(self._items[self._open_index])
        text = "".join(self._parts)
        if self._open == "message":
            content = list(item["content"])
            if self._part is not None:
                content.append(self._part_object(self._part, text))
            item["content"] = content
        elif self._open == "reasoning":
            item.update(self._reasoning_fields(text, sealed=status != "in_progress"))
        elif self._open == "function_call":
            item["arguments"] = text
        item["status"] = status
        return item

    def _content(self, kind: str, text: str) -> bytes:
        if not text:
            return self.start()
        out = self.start()
        if self._live_call is not None:
            last = self._held[-1] if self._held else None
            if last is None or last.kind != kind:
                last = _Held(kind)
                self._held.append(last)
            last.parts.append(text)
            return out
        if kind == "reasoning":
            if self._open != "reasoning":
                out += self._close() + self._open_reasoning()
            return out + self._reasoning_delta(text)
        if self._open is None and kind == "output_text":  # the answer's first text
            return out + self._open_text() + self._text_delta(text)
        if self._open != "message":
            out += self._close() + self._open_message()
        if self._part != kind:
            out += self._close_part() + self._open_part(kind)
        if kind == "output_text":
            return out + self._text_delta(text)
        self._parts.append(text)
        return out + self._part_frame("response.refusal.delta", {"delta": text})

    def _close(self, status: str = "completed") -> bytes:
        """Close the open item, if any: its last events and `output_item.done`."""
        if self._open is None:
            return b""
        index = self._open_index
        # A message's part has its own last events; the text is joined only where it is written.
        if self._open == "message":
            out = self._close_part()
            # The open item is the encoder's own (a look at it gets a snapshot): its closed
            # parts are in it already.
            item = self._items[index]
            item["status"] = status
        else:
            out = self._close_pieces(index)
            item = self._items[index] = self._snapshot(status)
        self._open = None
        self._parts = []
        data = _enc(item)
        self._written.append(data)
        seq = self._seq
        self._seq = seq + 1
        return b"".join((out, ITEM_DONE, b"%d" % index, b',"item":', data, seq_end(seq)))

    def _close_pieces(self, index: int) -> bytes:
        """The last events of the open reasoning or function call item."""
        item_id = self._items[index]["id"]
        text = "".join(self._parts)
        if self._open == "reasoning":
            if self.summary is not None:
                part = {"type": "summary_text", "text": text}
                ids = {"item_id": item_id, "output_index": index, "summary_index": 0}
                out = self._frame(
                    "response.reasoning_summary_text.done", {**ids, "text": text}
                ) + self._frame("response.reasoning_summary_part.done", {**ids, "part": part})
            else:
                out = self._frame(
                    "response.reasoning_text.done",
                    {"item_id": item_id, "output_index": index, "content_index": 0, "text": text},
                )
        else:
            out = self._frame(
                "response.function_call_arguments.done",
                {
                    "item_id": item_id,
                    "output_index": index,
                    "name": self._items[index]["name"],
                    "arguments": text,
                },
            )
        return out

    # -- messages

    def _open_message(self) -> bytes:
        item = {
            "id": self._item_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self._part = None
        self._part_index = -1
        return self._add(item)

    def _open_text(self) -> bytes:
        """`_open_message` then `_open_part("output_text")` when no item is open, their events
        written from a template."""
        index = len(self._items)
        item_id = f"msg_{self._item_base}_{index}"
        self._items.append(
            {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        )
        self._open = "message"
        self._open_index = index
        self._part = "output_text"
        self._texting = True
        self._part_index = 0
        self._parts = []
        id_json = _enc(item_id)
        ids = self._part_ids = b"".join(
            (b'"item_id":', id_json, b',"output_index":', b"%d" % index, b',"content_index":0,')
        )
        self._prefix = DELTA_HEAD + ids + b'"delta":'
        seq = self._seq
        self._seq = seq + 2
        return b"".join(
            (
                ITEM_ADDED,
                b"%d" % index,
                b',"item":{"id":',
                id_json,
                b',"type":"message","status":"in_progress","role":"assistant","content":[]}',
                seq_end(seq),
                PART_ADDED,
                ids,
                b'"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}',
                seq_end(seq + 1),
            )
        )

    @staticmethod
    def _part_object(kind: str, text: str) -> dict[str, Any]:
        if kind == "output_text":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "refusal", "refusal": text}

    def _open_part(self, kind: str) -> bytes:
        self._part = kind
        # Parts open only while no call is live (a call's later text is held).
        self._texting = kind == "output_text"
        self._part_index += 1
        self._parts = []
        # The part's events all begin with its ids: encoded once.
        ids = self._part_ids = b'"item_id":%b,"output_index":%d,"content_index":%d,' % (
            _enc(self._items[self._open_index]["id"]),
            self._open_index,
            self._part_index,
        )
        if kind == "output_text":
            self._prefix = event_head("response.output_text.delta") + ids + b'"delta":'
        return self._part_frame(
            "response.content_part.added", {"part": self._part_object(kind, "")}
        )

    def _part_frame(self, type: str, fields: dict[str, Any]) -> bytes:
        """`_frame` of an event of the open part: its ids, then `fields` (a fresh dict, taken)."""
        fields["sequence_number"] = self._seq
        self._seq += 1
        return event_head(type) + self._part_ids + _enc(fields)[1:] + b"\n\n"

    def _text_delta(self, text: str) -> bytes:
        # `encode` writes the same frame inline, for the common case.
        self._parts.append(text)
        seq = self._seq
        self._seq = seq + 1
        tail = DELTA_TAILS[seq] if seq < TAILS_MADE else DELTA_TAIL % seq
        return b"".join((self._prefix, _enc(text), tail))

    def _close_part(self) -> bytes:
        kind = self._part
        if kind is None:
            return b""
        text = "".join(self._parts)
        # The open item is the encoder's own: the part joins its content in place.
        self._items[self._open_index]["content"].append(self._part_object(kind, text))
        self._part = None
        self._texting = False
        self._parts = []
        data = _enc(text)
        ids = self._part_ids
        seq = self._seq
        self._seq = seq + 2
        done, field, tail, part_done, part, part_tail = PART_DONE[kind]
        return b"".join(
            (
                done, ids, field, data, tail, seq_end(seq),
                part_done, ids, part, data, part_tail, seq_end(seq + 1),
            )
        )  # fmt: skip

    # -- reasoning

    def _reasoning_fields(self, text: str, *, sealed: bool) -> dict[str, Any]:
        if self.summary is not None:
            fields: dict[str, Any] = {
                "summary": [{"type": "summary_text", "text": text}] if text else []
            }
        else:
            fields = {"summary": [], "content": [{"type": "reasoning_text", "text": text}]}
        if self.seal is not None:
            # Sealed once, when the item closes; a snapshot while it is open holds none yet.
            fields["encrypted_content"] = self.seal(text) if sealed and text else None
        return fields

    def _open_reasoning(self) -> bytes:
        item: dict[str, Any] = {
            "id": self._item_id("rs"),
            "type": "reasoning",
            "status": "in_progress",
            "summary": [],
        }
        if self.summary is None:
            item["content"] = []
        self._parts = []
        out = self._add(item)
        if self.summary is not None:
            out += self._frame(
                "response.reasoning_summary_part.added",
                {
                    "item_id": item["id"],
                    "output_index": self._open_index,
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""},
                },
            )
        return out

    def _reasoning_delta(self, text: str) -> bytes:
        self._parts.append(text)
        ids = {"item_id": self._items[self._open_index]["id"], "output_index": self._open_index}
        if self.summary is not None:
            return self._frame(
                "response.reasoning_summary_text.delta", {**ids, "summary_index": 0, "delta": text}
            )
        return self._frame(
            "response.reasoning_text.delta", {**ids, "content_index": 0, "delta": text}
        )

    # -- function calls

    def _open_call(self, start: ToolCallStart) -> bytes:
        # A call_id names one call: clients match their outputs to it (the SDK fails a response
        # whose calls share one), so a server's empty or repeated id is made unique.
        call_id = start.id
        taken = self._call_ids
        if taken is None:
            taken = self._call_ids = set(self._taken)
        if not call_id or call_id in taken:
            call_id = f"call_{self._item_base}_{len(self._items)}"
        taken.add(call_id)
        item: dict[str, Any] = {
            "id": self._item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": start.name,
            "arguments": "",
        }
        spaced = self.names.get(start.name)
        if spaced is not None:
            item["namespace"], item["name"] = spaced
        self._parts = []
        return self._add(item)

    def _call_delta(self, arguments: str) -> bytes:
        self._parts.append(arguments)
        return self._frame(
            "response.function_call_arguments.delta",
            {
                "item_id": self._items[self._open_index]["id"],
                "output_index": self._open_index,
                "delta": arguments,
            },
        )

    def _tool_start(self, event: ToolCallStart) -> bytes:
        out = self.start()
        if self._live_call is not None:
            held = _Held("function_call", event)
            self._held.append(held)
            self._held_calls[event.index] = held
            return out
        self._live_call = event.index
        return out + self._close() + self._open_call(event)

    def _tool_delta(self, event: ToolCallDelta) -> bytes:
        if event.index == self._live_call:
            return self._call_delta(event.arguments) if event.arguments else b""
        # A later call's pieces wait with it (a piece of a call never started is not an event
        # the decoder makes).
        if event.index in self._held_calls:
            self._held_calls[event.index].parts.append(event.arguments)
        return b""

    # -- the end

    def _end(self) -> bytes:
        out = self.start()
        if self._held:
            out += self._close()
        self._live_call = None
        for held in self._held:
            if held.kind == "function_call":
                assert held.start is not None
                out += self._close() + self._open_call(held.start)
                if held.parts:
                    out += self._call_delta("".join(held.parts))
            else:
                out += self._content(held.kind, "".join(held.parts))
        incomplete = self._finish in INCOMPLETE_REASONS
        # The item open when a length or a filter cut the answer is the one cut.
        out += self._close("incomplete" if incomplete else "completed")
        self._held.clear()
        self._held_calls.clear()
        self.ended = True
        self._status = "incomplete" if incomplete else "completed"
        kind = "response.incomplete" if incomplete else "response.completed"
        return out + self._final(kind)
