"""The Messages stream encoder, driven through the official SDK: what Claude Code and every SDK
client assemble from svir's events, and the bugs peers' gateways shipped, each pinned."""

from __future__ import annotations

import anthropic
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.protocols.anthropic.encode import MessageStreamEncoder, stop_reason
from svir.providers.anthropic_dialect import tool_input
from svir.wire.answer import AnswerFold
from svir.wire.classify import ClientError
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind, UpstreamError
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
from tests.anthropic.sdk import blocks, check_grammar, encode, stream, text_of, thinking_of

ROLE = Role("assistant", "up-1", "upstream-model", 0)


def test_text_thinking_and_tools_assemble_in_the_sdk() -> None:
    body = encode(
        [
            ROLE,
            ReasoningDelta("Look it ", "reasoning_content"),
            ReasoningDelta("up.", "reasoning_content"),
            TextDelta("Checking"),
            TextDelta(" now."),
            ToolCallStart(0, "call_1", "lookup"),
            ToolCallDelta(0, '{"q": '),
            ToolCallDelta(0, '"x"}'),
            Finish("tool_calls"),
            Usage(120, 30, 150, cached_tokens=100),
            Done(),
        ],
        input_tokens=118,
    )
    frames = check_grammar(body)
    got = stream(body)
    assert got.error is None
    m = got.message
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    assert thinking_of(m) == "Look it up."
    assert text_of(m) == "Checking now." and got.texts == ["Checking", " now."]
    (call,) = blocks(m, "tool_use")
    assert (call.id, call.name, call.input) == ("call_1", "lookup", {"q": "x"})
    assert m.stop_reason == "tool_use"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (20, 30)
    assert m.usage.cache_read_input_tokens == 100
    assert m.id == "msg_req1" and m.model == "claude-test"
    assert frames[0][1]["message"]["usage"]["input_tokens"] == 118


def test_a_plain_answer_ends_its_turn() -> None:
    body = encode([ROLE, TextDelta("Hello."), Finish("stop"), Usage(5, 2, 7), Done()])
    check_grammar(body)
    m = stream(body).message
    assert text_of(m) == "Hello." and m.stop_reason == "end_turn"
    assert m.usage.cache_read_input_tokens is None


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("stop", "end_turn"),
        (None, "end_turn"),
    ],
)
def test_stop_reason_follows_the_finish(finish: str | None, reason: str) -> None:
    events: list[Event] = [ROLE, TextDelta("x")]
    if finish is not None:
        events.append(Finish(finish))
    body = encode([*events, Done()])
    check_grammar(body)
    assert stream(body).message.stop_reason == reason


# -- the peers' bugs


def test_stop_reason_is_tool_use_after_a_tool_call_whatever_the_finish_said() -> None:
    # LiteLLM answered `end_turn` when the server's finish after a call was `stop`: Claude Code
    # then ends the turn instead of running the tool.
    body = encode(
        [ROLE, ToolCallStart(0, "c", "ls"), ToolCallDelta(0, "{}"), Finish("stop"), Done()]
    )
    check_grammar(body)
    assert stream(body).message.stop_reason == "tool_use"


def test_arguments_only_in_the_last_piece_still_reach_the_input() -> None:
    # The arguments came in one piece at the end of the stream (after a second call started):
    # peers dropped them and the tool ran with `{}`.
    body = encode(
        [
            ROLE,
            ToolCallStart(0, "a", "read"),
            ToolCallStart(1, "b", "read"),
            ToolCallDelta(1, '{"path": "b.txt"}'),
            ToolCallDelta(0, '{"path": "a.txt"}'),
            Finish("tool_calls"),
            Done(),
        ]
    )
    frames = check_grammar(body)
    calls = blocks(stream(body).message, "tool_use")
    assert [(c.id, c.input) for c in calls] == [("a", {"path": "a.txt"}), ("b", {"path": "b.txt"})]
    json_deltas = [d for n, d in frames if n == "content_block_delta"]
    assert all(d["delta"]["type"] == "input_json_delta" for d in json_deltas)


def test_a_call_without_arguments_gets_input_json_delta_of_an_empty_object() -> None:
    body = encode([ROLE, ToolCallStart(0, "c", "now"), Finish("tool_calls"), Done()])
    frames = check_grammar(body)
    assert [d["delta"] for n, d in frames if n == "content_block_delta"] == [
        {"type": "input_json_delta", "partial_json": "{}"}
    ]
    (call,) = blocks(stream(body).message, "tool_use")
    assert call.input == {}


def test_an_empty_tool_calls_array_is_no_tool_block() -> None:
    # A server that sends `tool_calls: []` beside its text: peers opened a tool_use block with an
    # empty input_json_delta instead of the text.
    sse = (
        b'data: {"id":"x","model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
        b'"content":"","tool_calls":[]}}]}\n\n'
        b'data: {"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"Hi",'
        b'"tool_calls":[]}}]}\n\n'
        b'data: {"id":"x","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
        b"\n\ndata: [DONE]\n\n"
    )
    dec = StreamDecoder()
    body = encode([*dec.feed(sse), *dec.close()])
    frames = check_grammar(body)
    starts = [d["content_block"]["type"] for n, d in frames if n == "content_block_start"]
    assert starts == ["text"]
    m = stream(body).message
    assert text_of(m) == "Hi" and m.stop_reason == "end_turn"


def test_thinking_after_text_opens_a_thinking_block_and_there_is_one_message_start() -> None:
    # Peers wrote thinking_delta into the block they had opened as text, and a second
    # message_start: Claude Code fails with "Content block is not a thinking block".
    body = encode(
        [
            ROLE,
            TextDelta("First."),
            ReasoningDelta("Then think.", "reasoning"),
            ROLE,
            TextDelta("Answer."),
            Done(),
        ]
    )
    frames = check_grammar(body)
    assert [n for n, _ in frames].count("message_start") == 1
    m = stream(body).message
    assert [b.type for b in m.content] == ["text", "thinking", "text"]
    assert thinking_of(m) == "Then think."


def test_reasoning_is_not_dropped_and_a_thinking_block_closes_before_text() -> None:
    body = encode([ROLE, ReasoningDelta("r", "think"), TextDelta("t"), Done()])
    frames = check_grammar(body)
    names = [(n, d.get("index")) for n, d in frames][1:5]
    assert names == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
    ]
    assert thinking_of(stream(body).message) == "r"


def test_no_empty_leading_text_block() -> None:
    # Peers opened a text block on the role chunk's empty content, before the thinking.
    body = encode(
        [ROLE, TextDelta(""), ReasoningDelta("hm", "reasoning_content"), TextDelta("ok"), Done()]
    )
    check_grammar(body)
    assert [b.type for b in stream(body).message.content] == ["thinking", "text"]


def test_an_answer_of_nothing_has_no_blocks() -> None:
    body = encode([ROLE, TextDelta(""), Finish("stop"), Done()])
    check_grammar(body)
    assert stream(body).message.content == []


# -- the rest of the events


def test_keepalive_is_a_ping_the_sdk_skips() -> None:
    body = encode([Keepalive("x"), ROLE, Keepalive("x"), TextDelta("a"), Done()])
    frames = check_grammar(body)
    assert [n for n, _ in frames][:2] == ["message_start", "ping"]
    assert text_of(stream(body).message) == "a"


def test_a_refusal_is_text() -> None:
    body = encode([ROLE, RefusalDelta("I can't help with that."), Finish("stop"), Done()])
    check_grammar(body)
    m = stream(body).message
    assert text_of(m) == "I can't help with that." and m.stop_reason == "end_turn"


def test_a_content_filter_verdict_writes_nothing_but_its_finish_is_a_refusal() -> None:
    verdict = ContentFilter("completion", True, ("hate",), {})
    body = encode([ROLE, TextDelta("a"), verdict, Finish("content_filter"), Done()])
    check_grammar(body)
    assert stream(body).message.stop_reason == "refusal"


def test_an_error_after_output_is_one_error_event_the_sdk_raises() -> None:
    err = UpstreamError(ErrorKind.TRANSIENT, "the server fell over", in_stream=True)
    body = encode([ROLE, TextDelta("partial"), StreamError(err), TextDelta("never"), Done()])
    frames = check_grammar(body)
    assert frames[-1][0] == "error"
    assert frames[-1][1]["error"]["type"] == "api_error"
    got = stream(body)
    assert isinstance(got.error, anthropic.APIStatusError)
    assert "the server fell over" in str(got.error)
    assert text_of(got.message) == "partial"


def test_an_overflow_mid_stream_says_prompt_is_too_long() -> None:
    err = UpstreamError(
        ErrorKind.CONTEXT_OVERFLOW,
        "request (9000 tokens) exceeds the available context size (8192 tokens)",
    )
    frames = check_grammar(encode([ROLE, StreamError(err)]))
    error = frames[-1][1]["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: 9000 tokens > 8192 maximum")


def test_an_error_before_anything_is_the_error_alone() -> None:
    enc = MessageStreamEncoder(id="r", model="m")
    err = UpstreamError(ErrorKind.RATE_LIMITED, "slow down")
    body = enc.encode(StreamError(err))
    assert not enc.started and enc.ended
    assert check_grammar(body)[0][1]["error"]["type"] == "rate_limit_error"
    assert enc.encode(Done()) == b""


def test_the_caller_can_end_the_stream_with_its_own_error() -> None:
    enc = MessageStreamEncoder(id="r", model="m")
    body = enc.encode(ROLE) + enc.encode(TextDelta("a"))
    body += enc.error(ClientError(429, "rate_limit_error", "tokens_exceeded", "budget spent"))
    body += enc.error(ClientError(500, "server_error", None, "twice"))
    assert check_grammar(body)[-1][1] == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "budget spent"},
    }


def test_start_writes_message_start_once() -> None:
    enc = MessageStreamEncoder(id="msg_given", model="m", input_tokens=3)
    first = enc.start()
    assert first.startswith(b"event: message_start\n") and b'"id":"msg_given"' in first
    assert enc.start() == b"" and enc.started
    assert not enc.encode(ROLE).startswith(b"event: message_start")


# -- any event sequence the decoder can make


@st.composite
def event_sequences(draw: st.DrawFn) -> list[Event]:
    events: list[Event] = []
    if draw(st.booleans()):
        events.append(ROLE)
    started: list[int] = []
    text = st.text(max_size=6)
    seal = st.text(min_size=1, max_size=4)
    for _ in range(draw(st.integers(0, 14))):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            events.append(TextDelta(draw(text)))
        elif choice == 1:
            events.append(ReasoningDelta(draw(text), "reasoning_content"))
        elif choice == 2:
            events.append(RefusalDelta(draw(text)))
        elif choice == 3:
            index = len(started)
            started.append(index)
            events.append(ToolCallStart(index, f"call_{index}", "tool"))
        elif choice == 4 and started:
            events.append(ToolCallDelta(draw(st.sampled_from(started)), draw(text)))
        elif choice == 5:
            events.append(Keepalive(""))
        elif choice == 6:
            events.append(ContentFilter("completion", False, (), {}))
        elif choice == 7:
            # An Anthropic upstream's seals: after its reasoning, or alone (omitted thinking).
            events.append(ReasoningSignature(draw(seal)))
        elif choice == 8:
            events.append(RedactedReasoning(draw(seal)))
        else:
            events.append(ROLE)
    end = draw(st.integers(0, 2))
    if end == 0:
        events.append(StreamError(UpstreamError(ErrorKind.INCOMPLETE, "cut")))
    else:
        if draw(st.booleans()):
            events.append(
                Finish(draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"])))
            )
        if draw(st.booleans()):
            events.append(Usage(10, 5, 15, cached_tokens=draw(st.none() | st.integers(0, 10))))
        events.append(Done())
    events.extend(
        draw(st.lists(st.sampled_from([TextDelta("late"), Done(), Keepalive("")]), max_size=2))
    )
    return events


@settings(max_examples=300, deadline=None)
@given(event_sequences())
def test_any_event_sequence_is_a_well_formed_stream(events: list[Event]) -> None:
    body = encode(events)
    check_grammar(body)
    # Everything before the end reaches the output: every piece of text and reasoning.
    end = next(i for i, e in enumerate(events) if isinstance(e, Done | StreamError))
    if isinstance(events[end], Done):
        frames = check_grammar(body)
        sent = "".join(
            d["delta"].get("text", "") + d["delta"].get("thinking", "")
            for n, d in frames
            if n == "content_block_delta"
        )
        want = "".join(
            e.text for e in events[:end] if isinstance(e, TextDelta | ReasoningDelta | RefusalDelta)
        )
        assert sorted(sent) == sorted(want)
        # Every seal reaches the client, as the SDK assembles the blocks.
        message = stream(body).message
        sealed = [e for e in events[:end] if isinstance(e, ReasoningSignature | RedactedReasoning)]
        assert sorted(b.signature for b in blocks(message, "thinking") if b.signature) == sorted(
            e.signature for e in sealed if isinstance(e, ReasoningSignature)
        )
        assert [b.data for b in blocks(message, "redacted_thinking")] == [
            e.data for e in sealed if isinstance(e, RedactedReasoning)
        ]


# -- any upstream stream, through svir's decoder, as the SDK assembles it

PIECE = st.text(alphabet='ab {}":,<>/think', max_size=5)


@st.composite
def upstream_streams(draw: st.DrawFn) -> tuple[bytes, bool]:
    """An OpenAI-dialect chat stream: content, reasoning under either key, refusals, tool-call
    pieces of up to three calls in any order (the id and name on a call's first piece), empty
    `tool_calls` arrays, a finish, usage, and `[DONE]` or a cut; and whether think tags are on."""
    chunks = [{"role": "assistant", "content": ""}]
    opened: set[int] = set()
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(
            st.sampled_from(
                ["content", "reasoning_content", "reasoning", "refusal", "tool", "empty"]
            )
        )
        if kind == "tool":
            index = draw(st.integers(0, 2))
            piece: dict = {"index": index, "function": {"arguments": draw(PIECE)}}
            if index not in opened:
                opened.add(index)
                piece.update(id=f"call_{index}", type="function")
                piece["function"]["name"] = "tool"
            chunks.append({"tool_calls": [piece]})
        elif kind == "empty":
            chunks.append({"content": draw(PIECE), "tool_calls": []})
        else:
            chunks.append({kind: draw(PIECE)})
    lines = [
        b"data: "
        + msgspec.json.encode({"id": "x", "model": "m", "choices": [{"index": 0, "delta": d}]})
        + b"\n\n"
        for d in chunks
    ]
    if draw(st.booleans()):
        finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
        lines.append(
            b"data: "
            + msgspec.json.encode(
                {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            )
            + b"\n\n"
        )
        lines.append(
            b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\n'
        )
    if draw(st.integers(0, 3)):
        lines.append(b"data: [DONE]\n\n")
    return b"".join(lines), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(upstream_streams())
def test_any_upstream_stream_reaches_the_sdk_as_the_fold_has_it(case: tuple[bytes, bool]) -> None:
    raw, think_tags = case
    dec = StreamDecoder(think_tags=think_tags)
    events = [*dec.feed(raw), *dec.close()]
    body = encode(events)
    check_grammar(body)
    got = stream(body)
    fold = AnswerFold()
    for e in events:
        fold.add(e)
    if fold.error is not None:
        assert isinstance(got.error, anthropic.APIStatusError)
        return
    assert got.error is None
    m = got.message
    # Text and refusal share the text blocks in the order they came; the fold keeps them apart.
    if fold.refusal:
        assert sorted(text_of(m)) == sorted("".join(fold.text) + "".join(fold.refusal))
    else:
        assert text_of(m) == "".join(fold.text)
    assert thinking_of(m) == "".join(fold.reasoning)
    calls = sorted((c.id, c.name, tool_input(c.arguments)) for c in fold.tool_calls())
    assert sorted((b.id, b.name, b.input) for b in blocks(m, "tool_use")) == calls
    assert m.stop_reason == stop_reason(fold.finish_reason, tool_use=bool(calls))
