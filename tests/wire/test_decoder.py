"""Stream decoder behaviours beyond the corpus: speed, ordering, and robustness."""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind
from svir.wire.events import (
    Done,
    Event,
    Finish,
    ReasoningDelta,
    Role,
    StreamError,
    TextDelta,
    Usage,
)

enc = msgspec.json.encode


def chunk(delta: dict | None = None, finish: str | None = None, **extra: object) -> bytes:
    body: dict = {"id": "c1", "model": "m", "choices": []}
    if delta is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    body.update(extra)
    return b"data: " + enc(body) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def run(raw: bytes, **kw: object) -> list[Event]:
    d = StreamDecoder(**kw)  # type: ignore[arg-type]
    return [*d.feed(raw), *d.close()]


def test_canonical_order_finish_usage_done_even_when_usage_came_with_finish() -> None:
    raw = chunk({"content": "hi"}, "stop", usage={"prompt_tokens": 1, "completion_tokens": 2})
    events = run(raw + DONE)
    assert events == [
        Role("assistant", "c1", "m", 0),
        TextDelta("hi"),
        Finish("stop"),
        Usage(1, 2, 3, None, None),
        Done(),
    ]


def test_same_reasoning_under_both_keys_is_one_text() -> None:
    raw = chunk({"reasoning_content": "x", "reasoning": "x"}) + chunk({}, "stop") + DONE
    assert [e for e in run(raw) if isinstance(e, ReasoningDelta)] == [
        ReasoningDelta("x", "reasoning_content")
    ]


def test_done_without_finish_infers_stop() -> None:
    assert Finish("stop") in run(chunk({"content": "a"}) + DONE)


def test_nothing_after_done_or_error_counts() -> None:
    events = run(chunk({"content": "a"}, "stop") + DONE + chunk({"content": "late"}))
    assert TextDelta("late") not in events
    events = run(b'data: {"error":{"message":"boom","code":500}}\n\n' + chunk({"content": "x"}))
    assert [type(e) for e in events] == [StreamError]
    assert events[0].error.in_stream  # type: ignore[union-attr]


def test_truncated_stream_is_incomplete() -> None:
    events = run(chunk({"content": "a"}))
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.INCOMPLETE


def test_wrong_types_are_a_protocol_error() -> None:
    events = run(chunk({"content": 5}))
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.PROTOCOL


def test_line_cap_is_a_protocol_error_not_memory() -> None:
    d = StreamDecoder(max_line=1000)
    events = d.feed(b"data: " + b"x" * 5000)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.PROTOCOL
    assert d.feed(b"more") == []


def test_speed_counts_visible_tokens_only() -> None:
    ticks = itertools.count()
    clock = lambda: next(ticks) * 0.1  # noqa: E731
    d = StreamDecoder(think_tags=True, clock=clock)
    raw = (
        chunk({"content": "<thi"})  # only part of a marker: not a token
        + chunk({"content": "nk>"})
        + chunk({"content": "r"})
        + chunk({"content": "</think>"})
        + chunk({"content": "a"})
        + chunk({"content": "b"})
        + chunk({}, "stop")
        + DONE
    )
    for event in raw.split(b"\n\n")[:-1]:
        d.feed(event + b"\n\n")
    # Three visible tokens (r, a, b) at clock reads 0.0, 0.1, 0.2: only a feed that brought
    # something visible reads the clock (the marker's pieces, the finish and [DONE] do not).
    assert d.rate.count == 3
    assert d.tokens_per_second == 2 / 0.2


def test_speed_reads_the_clock_once_per_feed() -> None:
    """Chunks that came in one read arrived together: one clock read for all of them."""
    reads = []

    def clock() -> float:
        reads.append(len(reads) * 0.1)
        return reads[-1]

    d = StreamDecoder(clock=clock)
    d.feed(chunk({"content": "a"}) + chunk({"content": "b"}) + chunk({"content": "c"}))
    d.feed(chunk({"content": "d"}) + chunk({}, "stop") + DONE)
    assert len(reads) == 2 and d.rate.count == 4
    assert d.rate.first == 0.0 and d.rate.last == 0.1


def test_no_rate_for_one_token_or_a_short_window() -> None:
    d = StreamDecoder(clock=lambda: 1.0)
    d.feed(chunk({"content": "a"}) + chunk({"content": "b"}))
    assert d.tokens_per_second is None
    d = StreamDecoder(clock=lambda: 1.0)
    d.feed(chunk({"content": "a"}))
    assert d.tokens_per_second is None


def test_decoder_without_clock_reads_no_clock() -> None:
    d = StreamDecoder()
    d.feed(chunk({"content": "a"}) + chunk({"content": "b"}))
    assert d.rate.count == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(
            ["id", "model", "choices", "delta", "content", "reasoning", "reasoning_content",
             "tool_calls", "index", "function", "name", "arguments", "finish_reason", "usage",
             "error", "refusal", "role", "prompt_filter_results", "content_filter_results",
             "filtered", "detected", "message", "code"]
        ),
        inner,
        max_size=4,
    ),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, max_size=5), st.booleans(), st.booleans())
def test_arbitrary_json_never_raises(payloads: list[object], think: bool, done: bool) -> None:
    raw = b"".join(b"data: " + enc(p) + b"\n\n" for p in payloads) + (DONE if done else b"")
    events = run(raw, think_tags=think)
    ends = [e for e in events if isinstance(e, (Done, StreamError))]
    assert len(ends) == 1 and ends[0] is events[-1]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    events = run(raw, think_tags=True)
    assert isinstance(events[-1], (Done, StreamError))
