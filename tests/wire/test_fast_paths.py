"""The wire core's fast paths give what its general paths give, whatever the bytes and splits.

`SSEParser.feed_plain` against `SSEParser.feed`, and a decoder that takes it (`feed`,
`feed_frames`) against the same decoder made to take the general path only: the same events,
frames, errors and state after every read.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import svir.wire.decoder as decoder_module
from svir.wire.decoder import DONE_MARKER, StreamDecoder, _chunk_decoder
from svir.wire.errors import SSEError
from svir.wire.events import Event, TextDelta
from svir.wire.sse import SSEEvent, SSEParser

enc = msgspec.json.encode


class GeneralDecoder(StreamDecoder):
    """The decoder with its fast paths off: every read through `SSEParser.feed` and `_event`,
    every chunk through `_take`."""

    _plain_ok = False

    def _data(self, data: bytes, out: list[Event]) -> None:
        if data == DONE_MARKER:
            self._done(out)
            return
        chunk = self._chunk(_chunk_decoder, data, out)
        if chunk is not None:
            self._take(chunk, out)


def _chunk(choice: dict[str, Any] | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}
    body["created"] = 7
    body["choices"] = [] if choice is None else [choice]
    body.update(extra)
    return enc(body)


def _delta(**delta: Any) -> bytes:
    return _chunk({"index": 0, "delta": delta, "finish_reason": None})


# The data of events a stream may carry: the common ones many times over, and the rest.
# A chunk with no id (the first chunk may be one: the id comes later, or never).
NO_ID = enc({"choices": [{"delta": {"content": "no id"}}]})
# The bytes around a content chunk's text (`StreamDecoder._around`, learnt from `_delta`'s), with
# what may sit between them: other texts, written as a server may write them, and what is not one
# text at all.
HEAD, _, TAIL = _delta(content="\x00").partition(b'"\\u0000"')
AROUND = [
    HEAD + b'"a\\"b\\\\"' + TAIL,
    HEAD + b'"\\u00e9\\n\\ud83d\\ude00"' + TAIL,
    HEAD + b'"\\u003cthink>"' + TAIL,
    HEAD + b'"x" ' + TAIL,
    HEAD + b'""' + TAIL,
    HEAD + b"null" + TAIL,
    HEAD + b"5" + TAIL,
    HEAD + b'"a","refusal":"r"' + TAIL,
    HEAD + b'"a"},"finish_reason":"stop"}]}' + TAIL,
    HEAD + b'"unclosed' + TAIL,
    HEAD + b'"\xff"' + TAIL,
    HEAD + TAIL,
    HEAD[:-3] + TAIL,
    # Another field's "content" first, with the delta's text or another: not the text's place.
    enc({"id": "c1", "x": {"content": "b"}, "choices": [{"index": 0, "delta": {"content": "b"}}]}),
    enc({"id": "c1", "x": {"content": "d"}, "choices": [{"index": 0, "delta": {"content": "b"}}]}),
    # The delta's key written with an escape, another field's plainly.
    b'{"id":"c1","choices":[{"delta":{"\\u0063ontent":"e"}}],"x":{"content":"e"}}',
    b'{"id":"c1","choices":[{"delta":{"\\u0063ontent":"e"}}],"x":{"content":"f"}}',
]
PAYLOADS = [
    *AROUND,
    _delta(role="assistant", content=""),
    _delta(content="hi"),
    _delta(content=" there\u00e9"),
    _delta(content="<think>a</think>b"),
    _delta(content=""),
    _delta(reasoning_content="r"),
    _delta(reasoning="r", reasoning_content="r"),
    _delta(refusal="no"),
    _delta(tool_calls=[{"index": 0, "id": "t1", "function": {"name": "f", "arguments": ""}}]),
    _delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":1}'}}]),
    _delta(content="x", role="assistant"),
    # Content with something else: what the content-only fast path must leave to `_take`.
    _delta(content="c", refusal="r"),
    _delta(content="c", reasoning_content="r"),
    _delta(content="c", reasoning="r"),
    _delta(content="c", tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]),
    _chunk({"index": 0, "delta": {"content": "c"}, "finish_reason": "stop"}),
    _chunk({"index": 2, "delta": {"content": "c"}}),
    _chunk(
        {
            "index": 0,
            "delta": {"content": "c"},
            "content_filter_results": {"x": {"detected": True}},
        }
    ),
    _chunk({"index": 0, "delta": {"content": "c"}}, usage={"prompt_tokens": 5}),
    _chunk(
        {"index": 0, "delta": {"content": "c"}},
        prompt_annotations=[{"content_filter_results": {"x": {"filtered": True}}}],
    ),
    _chunk({"index": 0, "delta": {"content": "c"}}, id="c2", model="m2"),
    _chunk(
        {"index": 0, "delta": {"content": "c"}},
        prompt_filter_results=[{"content_filter_results": {"sex": {"filtered": True}}}],
    ),
    NO_ID,
    enc({"choices": [{"delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}]}),
    _chunk({"index": 1, "delta": {"content": "other choice"}}),
    _chunk({"index": 0, "delta": {}, "finish_reason": "stop"}),
    _chunk({"index": 0, "delta": {}, "finish_reason": "length"}),
    _chunk(usage={"prompt_tokens": 3, "completion_tokens": 4}),
    _chunk(
        {"index": 0, "delta": {"content": "u"}, "finish_reason": "stop"},
        usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    ),
    _chunk({"index": 0, "content_filter_results": {"hate": {"filtered": True}}}),
    _chunk(prompt_filter_results=[{"content_filter_results": {"sex": {"detected": True}}}]),
    _chunk(error={"message": "boom", "code": 500}),
    enc({"error": {"message": "overloaded", "type": "overloaded_error"}}),
    b'{"choices": 3}',
    b'{"error": "plain"}',
    b"not json",
    b"{}",
    b"[1,2]",
    b"",
    b"[DONE]",
]
payloads = st.sampled_from(PAYLOADS)
# Events framed as they come: mostly one data line, sometimes what only `feed` takes.
frames = st.one_of(
    payloads.map(lambda p: b"data: " + p + b"\n\n"),
    payloads.map(lambda p: b"data: " + p + b"\n\n"),
    payloads.map(lambda p: b"data: " + p + b"\n\n"),
    payloads.map(lambda p: b"data: " + p + b"\r\n\r\n"),
    payloads.map(lambda p: b"data:" + p + b"\n\n"),
    payloads.map(lambda p: b"id: 5\ndata: " + p + b"\n\n"),
    payloads.map(lambda p: b"event: error\ndata: " + p + b"\n\n"),
    st.sampled_from(
        [
            b": keepalive\n\n",
            b":\n\n",
            b'data: {"id":"c1",\ndata: "choices":[]}\n\n',
            b"retry: 10\n\n",
            b"\n",
            b"data: x\n",
            b"data: [DONE]\n\n",
            b"data: {}\rdata: [DONE]\n\n",
            b"data: {}\r",
            b"data: {}\n\n\n",
        ]
    ),
)


def _splits(raw: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(c % (len(raw) + 1) for c in cuts), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


def _parse(parser: SSEParser, reads: list[bytes], plain: bool) -> list[Any]:
    out: list[Any] = []
    for read in reads:
        try:
            got = parser.feed_plain(read) if plain else None
            if got is not None:
                out += [SSEEvent(d, None, parser.last_event_id, parser._retry) for d in got]
            else:
                out += parser.feed(read)
        except SSEError as exc:
            out.append(repr(exc))
            break
    return out


@settings(max_examples=400, deadline=None)
@given(
    st.lists(frames, max_size=12),
    st.lists(st.integers(0, 4000), max_size=6),
    st.sampled_from([(1 << 20, 4 << 20), (64, 128), (200, 100), (40, 1000)]),
)
def test_feed_plain_gives_what_feed_gives(
    events: list[bytes], cuts: list[int], limits: tuple[int, int]
) -> None:
    reads = _splits(b"".join(events), cuts)
    max_line, max_event = limits
    general = _parse(SSEParser(max_line=max_line, max_event=max_event), reads, False)
    fast = _parse(SSEParser(max_line=max_line, max_event=max_event), reads, True)
    assert fast == general


@settings(max_examples=400, deadline=None)
@given(
    st.lists(frames, max_size=12),
    st.sampled_from([(1 << 20, 4 << 20), (64, 128), (200, 100), (40, 1000)]),
)
def test_feed_plain_gives_what_feed_gives_an_event_a_read(
    events: list[bytes], limits: tuple[int, int]
) -> None:
    # Each frame its own read, as a server that writes each token as it makes it is read.
    max_line, max_event = limits
    general = _parse(SSEParser(max_line=max_line, max_event=max_event), events, False)
    fast = _parse(SSEParser(max_line=max_line, max_event=max_event), events, True)
    assert fast == general


def test_feed_plain_takes_plain_events_and_keeps_the_unfinished_one() -> None:
    p = SSEParser()
    assert p.feed_plain(b'data: {"a":1}\n\ndata: [DONE]\n\ndata: {"b"') == [b'{"a":1}', b"[DONE]"]
    assert p.feed_plain(b":2}\n\n") == [b'{"b":2}']
    assert p.feed_plain(b": keepalive\n\n") is None  # a comment: `feed`'s
    assert p.feed_plain(b'data: {"c":3}\n\n') == [b'{"c":3}']  # a read of one event
    assert p.feed_plain(b"data: {}\r\n\r\n") is None  # CRs: `feed`'s
    assert p.feed(b": keepalive\n\n")[0].text == "keepalive"  # type: ignore[union-attr]


def _state(d: StreamDecoder) -> tuple[Any, ...]:
    error = d.error
    return (
        d.id,
        d.model,
        d.created,
        d.reasoning_carrier,
        d.finish_reason,
        d.usage,
        None if error is None else (error.kind, str(error)),
        d.complete,
        d.rate.count,
        d.rate.first,
        d.rate.last,
        d.tool_calls,
    )


def _clock() -> Any:
    return itertools.count(1).__next__


def _events(evs: list[Any]) -> list[Any]:
    # StreamError holds an exception, which compares by identity: compare what it says.
    return [
        (type(e).__name__, e.error.kind, str(e.error)) if hasattr(e, "error") else e for e in evs
    ]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(frames, max_size=14),
    st.lists(st.integers(0, 4000), max_size=6),
    st.booleans(),
    st.sampled_from([None, True, False]),
)
def test_decoder_fast_path_is_the_general_path(
    events: list[bytes], cuts: list[int], think: bool, usage_frames: bool | None
) -> None:
    reads = _splits(b"".join(events), cuts)
    fast = StreamDecoder(think_tags=think, clock=_clock(), max_line=400, max_event=800)
    general = GeneralDecoder(think_tags=think, clock=_clock(), max_line=400, max_event=800)
    for read in reads:
        if usage_frames is None:
            assert _events(fast.feed(read)) == _events(general.feed(read))
        else:
            f_frames, f_events = fast.feed_frames(read, usage_frames)
            g_frames, g_events = general.feed_frames(read, usage_frames)
            assert f_frames == g_frames
            assert _events(f_events) == _events(g_events)
        assert _state(fast) == _state(general)
    assert _events(fast.close()) == _events(general.close())
    assert _state(fast) == _state(general)


def test_the_fast_path_is_taken_for_plain_chunks() -> None:
    # Proof that the differential test above compares two paths: the fast one was taken.
    d = StreamDecoder()
    d._sse = _Spy()
    d.feed(b"data: " + _delta(content="hi") + b"\n\n")
    assert d._sse.plain == 1 and d._sse.general == 0


class _Spy(SSEParser):
    def __init__(self) -> None:
        super().__init__()
        self.plain = self.general = 0

    def feed_plain(self, chunk: bytes) -> list[bytes] | None:
        got = super().feed_plain(chunk)
        self.plain += got is not None
        return got

    def feed(self, chunk: bytes) -> list[Any]:
        self.general += 1
        return super().feed(chunk)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("first", [_delta(role="assistant"), _delta(content="a"), NO_ID])
def test_each_chunk_mid_stream_decodes_as_the_general_path(payload: bytes, first: bytes) -> None:
    # Every payload after a stream's start (the state the fast paths need), read by read.
    reads = [b"data: " + p + b"\n\n" for p in (first, _delta(content="b"), payload)]
    reads += [b"data: " + _delta(content="c") + b"\n\ndata: [DONE]\n\n"]
    for usage_frames in (True, False):
        fast, general = StreamDecoder(clock=_clock()), GeneralDecoder(clock=_clock())
        for read in reads:
            f_frames, f_events = fast.feed_frames(read, usage_frames)
            g_frames, g_events = general.feed_frames(read, usage_frames)
            assert (f_frames, _events(f_events)) == (g_frames, _events(g_events))
            assert _state(fast) == _state(general)


class _CountingDecoder:
    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.calls = 0

    def decode(self, data: bytes) -> Any:
        self.calls += 1
        return self.decoder.decode(data)


def test_a_content_chunk_like_the_last_one_but_for_its_text_decodes_only_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Proof that the differential tests above compare the learnt shape with the general path:
    # once learnt, a chunk of the same shape is not decoded as a chunk.
    counting = _CountingDecoder(decoder_module._body_decoder)
    monkeypatch.setattr(decoder_module, "_body_decoder", counting)
    d = StreamDecoder()
    d.feed(b"".join(b"data: " + _delta(content=t) + b"\n\n" for t in ("a", "b")))
    assert d._around == (HEAD, TAIL, len(HEAD), len(TAIL))
    counting.calls = 0
    events = d.feed(b"".join(b"data: " + p + b"\n\n" for p in AROUND[:3]))
    assert counting.calls == 0
    assert events == [TextDelta('a"b\\'), TextDelta("\u00e9\n\U0001f600"), TextDelta("<think>")]


@pytest.mark.parametrize("payload", PAYLOADS[-4:])
def test_a_chunk_whose_first_content_key_is_not_its_texts_teaches_nothing(payload: bytes) -> None:
    d = StreamDecoder()
    d.feed(b"data: " + _delta(role="assistant") + b"\n\ndata: " + payload + b"\n\n")
    assert d._around is None
