"""The one fold of events into an answer (svir.wire.answer), and the front ends that render it."""

from __future__ import annotations

import msgspec

from svir.protocols.ollama.encode import ChatAggregator, Metrics
from svir.wire.answer import AnswerFold, openai_tool_call
from svir.wire.encoder import CompletionAggregator
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    ContentFilter,
    Done,
    Event,
    Finish,
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

EVENTS: list[Event] = [
    Role("assistant", "id", "m", 0),
    ReasoningDelta("a", "think"),
    ReasoningDelta("b", "reasoning_content"),
    ReasoningDelta("c", "think"),
    TextDelta("hel"),
    TextDelta("lo"),
    RefusalDelta("no"),
    ToolCallStart(1, "c1", "second"),
    ToolCallStart(0, "c0", "first"),
    ToolCallDelta(0, '{"x"'),
    ToolCallDelta(1, "{}"),
    ToolCallDelta(0, ": 1}"),
    ContentFilter("completion", False, ("hate",), {}),
    Finish("tool_calls"),
    Usage(1, 2, 3),
    Done(),
]


def fold(events: list[Event], into: AnswerFold | None = None) -> AnswerFold:
    answer = into if into is not None else AnswerFold()
    for ev in events:
        answer.add(ev)
    return answer


def test_the_fold_keeps_every_part_of_the_answer() -> None:
    answer = fold(EVENTS)
    assert "".join(answer.text) == "hello"
    assert "".join(answer.reasoning) == "abc"
    assert answer.carriers == ("think", "reasoning_content")
    assert answer.reasoning_of("think") == "ac"
    assert answer.reasoning_of(None) == ""
    assert "".join(answer.refusal) == "no"
    assert answer.tool_calls() == [
        ToolCall(0, "c0", "first", '{"x": 1}'),
        ToolCall(1, "c1", "second", "{}"),
    ]
    assert answer.finish_reason == "tool_calls"
    assert answer.usage == Usage(1, 2, 3)
    assert [f.categories for f in answer.filters] == [("hate",)]
    assert answer.done and answer.error is None


def test_a_failure_is_kept_and_arguments_of_a_call_never_started_are_not_a_call() -> None:
    err = UpstreamError(ErrorKind.PROTOCOL, "bad", in_stream=True)
    answer = fold([ToolCallDelta(3, "{}"), StreamError(err)])
    assert answer.tool_calls() == []
    assert answer.error is err and not answer.done


def test_openai_and_ollama_render_the_same_fold_in_their_own_shape() -> None:
    openai = fold(EVENTS, CompletionAggregator()).message()
    assert openai["content"] == "hello"
    assert openai["reasoning_content"] == "abc"
    assert openai["refusal"] == "no"
    assert openai["tool_calls"][0] == openai_tool_call(ToolCall(0, "c0", "first", '{"x": 1}'))
    ollama = fold(EVENTS, ChatAggregator()).response(
        model="m", metrics=lambda _: Metrics(1, 1, 1), now="t"
    )["message"]
    assert ollama["content"] == "hellono"  # Ollama has no refusal field
    assert ollama["thinking"] == "abc"
    assert [c["function"]["arguments"] for c in ollama["tool_calls"]] == [{"x": 1}, {}]


def _parts(answer: AnswerFold) -> dict[str, object]:
    return {name: getattr(answer, name) for name in AnswerFold.__slots__}


def test_extend_folds_a_batch_as_add_does_event_by_event() -> None:
    # Every kind of event, in batches of every size: `extend`'s own handling of text must leave
    # exactly what `add` leaves, and render the same `chat.completion` byte for byte.
    signed = [ReasoningSignature("sig"), RedactedReasoning("opaque")]
    events = [*EVENTS[:4], *signed, *EVENTS[4:]]
    for size in (1, 2, 3, len(events)):
        extended = CompletionAggregator()
        for i in range(0, len(events), size):
            extended.extend(events[i : i + size])
        added = fold(events, CompletionAggregator())
        assert _parts(extended) == _parts(added)
        assert "".join(extended.text) == "hello" and extended.thinking_blocks
        assert msgspec.json.encode(
            extended.completion(id="i", model="m", created=1)
        ) == msgspec.json.encode(added.completion(id="i", model="m", created=1))
