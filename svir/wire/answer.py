"""The one fold of normalized events into an answer, for every front end that does not stream it
event by event: the OpenAI `chat.completion` (`encoder.CompletionAggregator`), Ollama's
non-streamed answer and its tool-call line (`svir.protocols.ollama.encode`), the assistant
message the threads API stores, and the terminal client's transcript.

`AnswerFold` only collects; each front end renders the result in its own shape, and decides there
what it keeps (OpenAI keeps reasoning and refusal apart, Ollama joins refusal to content, the
threads API keeps the reasoning of one carrier).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from svir.wire.errors import UpstreamError
from svir.wire.events import (
    ContentFilter,
    Done,
    Event,
    Finish,
    ReasoningCarrier,
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
from svir.wire.toolcalls import ToolCall

__all__ = ["AnswerFold", "openai_tool_call"]


class AnswerFold:
    """Events in (`add`), the answer's parts out: the pieces of text, reasoning and refusal as
    they came, the tool calls, the finish reason, usage, content-filter verdicts, and whether the
    stream ended complete (`done`) or failed (`error`)."""

    __slots__ = (
        "_args",
        "_by_carrier",
        "_starts",
        "done",
        "error",
        "filters",
        "finish_reason",
        "reasoning",
        "refusal",
        "sealed",
        "text",
        "thinking_blocks",
        "usage",
    )

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.error: UpstreamError | None = None
        self.done = False
        self.filters: list[ContentFilter] = []
        self._by_carrier: dict[ReasoningCarrier, list[str]] = {}
        # Reasoning blocks an upstream sealed (Anthropic's), in order, as the canonical request
        # carries them back: {"type": "thinking", "thinking", "signature"} or
        # {"type": "redacted_thinking", "data"}; empty for every other upstream.
        self.thinking_blocks: list[dict[str, str]] = []
        self.sealed = 0  # how many pieces of `reasoning` are in `thinking_blocks`
        self._starts: dict[int, ToolCallStart] = {}
        self._args: dict[int, list[str]] = {}

    def add(self, event: Event) -> None:
        """Take one event (Role and Keepalive carry nothing for the answer)."""
        # On the exact type: see svir.wire.events. The kinds every answer has come first (a
        # non-streamed one is a role, its text, a finish, usage and its end): a kind further down
        # costs a test of each kind above it.
        if type(event) is TextDelta:
            self.text.append(event.text)
        elif type(event) is Role:
            return
        elif type(event) is Finish:
            self.finish_reason = event.reason
        elif type(event) is Usage:
            self.usage = event
        elif type(event) is Done:
            self.done = True
        elif type(event) is ReasoningDelta:
            self.reasoning.append(event.text)
            self._by_carrier.setdefault(event.carrier, []).append(event.text)
        elif type(event) is ToolCallDelta:
            self._args.setdefault(event.index, []).append(event.arguments)
        elif type(event) is ToolCallStart:
            self._starts[event.index] = event
            self._args.setdefault(event.index, [])
        elif type(event) is RefusalDelta:
            self.refusal.append(event.text)
        elif type(event) is ReasoningSignature:
            text = "".join(self.reasoning[self.sealed :])
            self.sealed = len(self.reasoning)
            self.thinking_blocks.append(
                {"type": "thinking", "thinking": text, "signature": event.signature}
            )
        elif type(event) is RedactedReasoning:
            self.thinking_blocks.append({"type": "redacted_thinking", "data": event.data})
        elif type(event) is StreamError:
            self.error = event.error
        elif type(event) is ContentFilter:
            self.filters.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        """`add` each of `events` in turn; a piece of text (an answer's every chunk, most of
        what a batch holds) is taken here, without a call of `add` each."""
        text = self.text
        for event in events:
            if type(event) is TextDelta:
                text.append(event.text)
            else:
                self.add(event)

    @property
    def carriers(self) -> tuple[ReasoningCarrier, ...]:
        """The reasoning carriers the answer used, in the order they first came."""
        return tuple(self._by_carrier)

    def reasoning_of(self, carrier: ReasoningCarrier | None) -> str:
        """The reasoning that came under one carrier ("" for None)."""
        return "".join(self._by_carrier.get(carrier, ())) if carrier is not None else ""

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._starts)

    def tool_calls(self) -> list[ToolCall]:
        """The started calls by index, each with its argument pieces joined."""
        return [
            ToolCall(i, s.id, s.name, "".join(self._args[i]))
            for i, s in sorted(self._starts.items())
        ]


def openai_tool_call(call: ToolCall) -> dict[str, Any]:
    """A call as an OpenAI assistant message's `tool_calls` holds it."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
