"""SSE framing (§3.1)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svir.wire.errors import EventTooLarge, LineTooLong, SSEError
from svir.wire.sse import SSEComment, SSEEvent, SSEParser, encode_comment, encode_data


def parse(chunks: list[bytes], **kw: int) -> list[SSEEvent | SSEComment]:
    p = SSEParser(**kw)
    out: list[SSEEvent | SSEComment] = []
    for c in chunks:
        out.extend(p.feed(c))
    out.extend(p.close())
    return out


def test_lf_crlf_cr_line_ends_give_the_same_events() -> None:
    body = "data: a\n\ndata: b\n\n"
    for ending in ("\n", "\r\n", "\r"):
        raw = body.replace("\n", ending).encode()
        assert parse([raw]) == [SSEEvent(b"a"), SSEEvent(b"b")], repr(ending)


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    # A CR at the end of one feed and the LF at the start of the next must not make a blank line.
    assert parse([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [SSEEvent(b"a\nb")]


def test_cr_then_empty_feed_then_lf() -> None:
    assert parse([b"data: a\r", b"", b"\n\r\n"]) == [SSEEvent(b"a")]


def test_one_leading_space_is_stripped_and_only_one() -> None:
    assert parse([b"data:x\n\ndata:  y\n\n"]) == [SSEEvent(b"x"), SSEEvent(b" y")]


def test_multiple_data_lines_join_with_lf() -> None:
    assert parse([b'data: {"a":\ndata: 1}\n\n']) == [SSEEvent(b'{"a":\n1}')]


def test_comments_are_surfaced() -> None:
    assert parse([b": keepalive 3/10\n\ndata: x\n\n"]) == [
        SSEComment("keepalive 3/10"),
        SSEEvent(b"x"),
    ]


def test_event_id_retry_fields() -> None:
    out = parse([b"event: error\nid: 7\nretry: 1500\ndata: {}\n\ndata: z\n\n"])
    assert out == [SSEEvent(b"{}", "error", "7", 1500), SSEEvent(b"z", None, "7", 1500)]


def test_event_type_resets_after_dispatch_and_on_empty_event() -> None:
    assert parse([b"event: error\n\ndata: x\n\n"]) == [SSEEvent(b"x")]


def test_unknown_fields_and_bad_retry_are_ignored() -> None:
    assert parse([b"foo: bar\nretry: soon\ndata\n\n"]) == [SSEEvent(b"")]


def test_incomplete_event_at_eof_is_dropped() -> None:
    assert parse([b"data: a\n\ndata: b\n"]) == [SSEEvent(b"a")]


def test_utf8_split_anywhere() -> None:
    raw = 'data: {"t":"héllo 🌍 世界"}\n\n'.encode()
    for i in range(len(raw)):
        assert parse([raw[:i], raw[i:]]) == [SSEEvent('{"t":"héllo 🌍 世界"}'.encode())]


def test_line_cap() -> None:
    with pytest.raises(LineTooLong):
        parse([b"data: " + b"x" * 100], max_line=50)
    with pytest.raises(LineTooLong):
        parse([b"data: " + b"x" * 100 + b"\n\n"], max_line=50)
    # Fed a byte at a time, the cap holds before the line ends.
    p = SSEParser(max_line=50)
    with pytest.raises(LineTooLong):
        for _ in range(200):
            p.feed(b"x")


def test_event_cap() -> None:
    with pytest.raises(EventTooLarge):
        parse([b"data: 0123456789\n" * 10 + b"\n"], max_event=64)


def test_encoders_round_trip() -> None:
    assert parse([encode_data(b'{"x":1}') + encode_comment("hi") + encode_comment()]) == [
        SSEEvent(b'{"x":1}'),
        SSEComment("hi"),
        SSEComment(""),
    ]


@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_arbitrary_bytes_raise_only_sse_errors(data: bytes, cuts: list[int]) -> None:
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    p = SSEParser(max_line=64, max_event=128)
    try:
        for a, b in itertools.pairwise(bounds):
            p.feed(data[a:b])
        p.close()
    except SSEError:
        pass


@given(
    st.lists(
        st.text(alphabet=st.characters(exclude_characters="\r\n", exclude_categories=("Cs",))),
        max_size=5,
    )
)
def test_any_split_gives_the_same_events(payloads: list[str]) -> None:
    raw = b"".join(encode_data(s.encode()) for s in payloads)
    whole = parse([raw])
    assert whole == [SSEEvent(s.encode()) for s in payloads]
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == whole
