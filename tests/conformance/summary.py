"""Decode a recorded stream, and compare its summary (svir.wire.conformance.summarize, the one
fold of events into the expected files' form) with what a file expects."""

from __future__ import annotations

from typing import Any

from svir.providers.anthropic_dialect import AnthropicStreamDecoder
from svir.wire.conformance import summarize
from svir.wire.decoder import ChatDecoder, StreamDecoder
from svir.wire.events import Event

__all__ = ["decode", "matches", "summarize"]


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
