"""Normalized stream events: what every server's chunks decode to, whatever their dialect.

The decoder emits these; the encoder and the aggregator consume them. They are plain immutable
records so that tests can compare whole event lists.

The types are final (tests/wire/test_event_types.py says so): the hot paths dispatch on an
event's exact type (`type(ev) is TextDelta`, `type(ev) in SILENT`), because a failing isinstance
against a msgspec Struct class costs several times an identity test, on every event.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from svir.wire.errors import UpstreamError

ReasoningCarrier = Literal["reasoning_content", "reasoning", "think"]
FilterScope = Literal["prompt", "completion"]


class Role(msgspec.Struct, frozen=True, gc=False):
    """The stream's first chunk: who speaks, and the upstream's id and model."""

    role: str
    id: str
    model: str
    created: int


class TextDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of the answer."""

    text: str


class ReasoningDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of reasoning, with the carrier the server used (§4)."""

    text: str
    carrier: ReasoningCarrier


class ReasoningSignature(msgspec.Struct, frozen=True, gc=False):
    """The signature that closes the reasoning block before it (Anthropic's `signature_delta`):
    the server checks it when the block is sent back on a later turn, and refuses the block
    without it."""

    signature: str


class RedactedReasoning(msgspec.Struct, frozen=True, gc=False):
    """A reasoning block the server keeps encrypted (Anthropic's `redacted_thinking`): nothing to
    show, but its `data` must go back with the turn for the model to continue from it."""

    data: str


class RefusalDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of the model's refusal (§3.2)."""

    text: str


class ToolCallStart(msgspec.Struct, frozen=True, gc=False):
    """A tool call whose id and complete name are known; its arguments follow as deltas."""

    index: int
    id: str
    name: str


class ToolCallDelta(msgspec.Struct, frozen=True, gc=False):
    """A piece of a started tool call's arguments."""

    index: int
    arguments: str


class Finish(msgspec.Struct, frozen=True, gc=False):
    """The answer ended, for this reason (stop, length, tool_calls, content_filter, …)."""

    reason: str


class Usage(msgspec.Struct, frozen=True, gc=False):
    """Token counts the server reported; the details are None when the server left them out."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


class ContentFilter(msgspec.Struct, frozen=True):
    """A content-filter verdict that detected or filtered something (§3.7)."""

    scope: FilterScope
    filtered: bool
    categories: tuple[str, ...]
    results: dict[str, Any]
    offsets: dict[str, Any] | None = None


class StreamError(msgspec.Struct, frozen=True):
    """The stream failed; what came before it is a partial answer."""

    error: UpstreamError


class Keepalive(msgspec.Struct, frozen=True, gc=False):
    """An SSE comment: the server is alive but has nothing yet."""

    comment: str


class Done(msgspec.Struct, frozen=True, gc=False):
    """The stream ended complete (`[DONE]` after a finish)."""


Event = (
    Role
    | TextDelta
    | ReasoningDelta
    | ReasoningSignature
    | RedactedReasoning
    | RefusalDelta
    | ToolCallStart
    | ToolCallDelta
    | Finish
    | Usage
    | ContentFilter
    | StreamError
    | Keepalive
    | Done
)

# Events that put nothing visible on the wire: until one that does arrives, a stream shows nothing.
SILENT: Final = frozenset({Role, Keepalive, ContentFilter})
