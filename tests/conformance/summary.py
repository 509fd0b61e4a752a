"""Fold a decoder's events into the summary form the corpus's expected files use."""

from __future__ import annotations

from typing import Any

from svir.wire.anthropic_upstream import AnthropicStreamDecoder
from svir.wire.decoder import ChatDecoder, StreamDecoder
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


def decode(chunks: list[bytes], options: dict[str, Any], server: str = "") -> list[Event]:
    """The events of a recorded stream, through the decoder of its protocol: Anthropic's
    Messages stream for the `anthropic` corpus, OpenAI's chunks for every other."""
    factory = AnthropicStreamDecoder if server == "anthropic" else StreamDecoder
    dec: ChatDecoder = factory(
        think_tags=options.get("think_tags", False), tool_names=options.get("tool_names")
    )
    events: list[Event] = []
    for chunk in chunks:
        events.extend(dec.feed(chunk))
    events.extend(dec.close())
    return events


def summarize(events: list[Event]) -> dict[str, Any]:
    answer: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    carrier = None
    calls: dict[int, dict[str, Any]] = {}
    blocks: list[dict[str, str]] = []
    sealed = 0  # pieces of reasoning already in a sealed block
    out: dict[str, Any] = {
        "id": None,
        "model": None,
        "finish_reason": None,
        "usage": None,
        "content_filter": [],
        "keepalives": 0,
        "error": None,
        "complete": False,
    }
    finished = False
    for ev in events:
        assert out["error"] is None and not out["complete"], f"event after the end: {ev!r}"
        if isinstance(ev, Role):
            assert out["id"] is None, "two role events"
            out["id"], out["model"] = ev.id or None, ev.model or None
        elif isinstance(ev, TextDelta):
            assert not finished
            answer.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            assert not finished
            reasoning.append(ev.text)
            carrier = carrier or ev.carrier
        elif isinstance(ev, RefusalDelta):
            refusal.append(ev.text)
        elif isinstance(ev, ReasoningSignature):
            text = "".join(reasoning[sealed:])
            sealed = len(reasoning)
            blocks.append({"type": "thinking", "thinking": text, "signature": ev.signature})
        elif isinstance(ev, RedactedReasoning):
            blocks.append({"type": "redacted_thinking", "data": ev.data})
        elif isinstance(ev, ToolCallStart):
            assert ev.index not in calls, "a call started twice"
            calls[ev.index] = {"index": ev.index, "id": ev.id, "name": ev.name, "arguments": ""}
        elif isinstance(ev, ToolCallDelta):
            calls[ev.index]["arguments"] += ev.arguments
        elif isinstance(ev, Finish):
            finished = True
            out["finish_reason"] = ev.reason
        elif isinstance(ev, Usage):
            out["usage"] = {
                "prompt_tokens": ev.prompt_tokens,
                "completion_tokens": ev.completion_tokens,
                "total_tokens": ev.total_tokens,
                "reasoning_tokens": ev.reasoning_tokens,
                "cached_tokens": ev.cached_tokens,
            }
        elif isinstance(ev, ContentFilter):
            out["content_filter"].append(
                {"scope": ev.scope, "filtered": ev.filtered, "categories": list(ev.categories)}
            )
        elif isinstance(ev, Keepalive):
            out["keepalives"] += 1
        elif isinstance(ev, StreamError):
            out["error"] = {"kind": ev.error.kind.value, "message": ev.error.message}
        elif isinstance(ev, Done):
            out["complete"] = True
    out["answer"] = "".join(answer)
    out["reasoning"] = "".join(reasoning)
    out["reasoning_carrier"] = carrier
    out["refusal"] = "".join(refusal) if refusal else None
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    out["thinking_blocks"] = blocks
    return out


def matches(summary: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """The differences between a summary and an expected result (an error's message is compared
    only when the expectation names one)."""
    problems = []
    for key, want in expect.items():
        got = summary.get(key)
        if key == "error" and want is not None and got is not None:
            if got["kind"] != want["kind"] or (
                "message" in want and got["message"] != want["message"]
            ):
                problems.append(f"error: got {got}, want {want}")
        elif got != want:
            problems.append(f"{key}: got {got!r}, want {want!r}")
    return problems
