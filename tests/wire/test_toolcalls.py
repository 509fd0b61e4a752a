"""Tool-call assembly (§3.3)."""

from __future__ import annotations

import msgspec
import pytest

from svir.wire.errors import ToolCallError
from svir.wire.events import ToolCallDelta, ToolCallStart
from svir.wire.toolcalls import ToolCall, ToolCallAssembler, ToolCallPiece

decode = msgspec.json.Decoder(list[ToolCallPiece]).decode


def test_seed_interleaved_example() -> None:
    a = ToolCallAssembler()
    out = a.feed(
        decode(
            b'[{"index":0,"id":"call-a","type":"function","function":{"name":"look","arguments":"{\\"value\\":"}},{"index":1,"id":"call-b","type":"function","function":{"name":"lookup","arguments":"{\\"value\\":"}}]'
        )
    )
    # Names may still grow: nothing starts before the finish.
    assert out == []
    assert (
        a.feed(
            decode(
                b'[{"index":1,"function":{"arguments":"2}"}},{"index":0,"function":{"name":"up","arguments":"1}"}}]'
            )
        )
        == []
    )
    assert a.finish() == [
        ToolCallStart(0, "call-a", "lookup"),
        ToolCallDelta(0, '{"value":1}'),
        ToolCallStart(1, "call-b", "lookup"),
        ToolCallDelta(1, '{"value":2}'),
    ]
    assert a.validate() == [
        ToolCall(0, "call-a", "lookup", '{"value":1}'),
        ToolCall(1, "call-b", "lookup", '{"value":2}'),
    ]


def test_declared_names_let_calls_stream() -> None:
    a = ToolCallAssembler(["get_weather", "look", "lookup"])
    out = a.feed(
        decode(
            b'[{"index":0,"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\\"ci"}}]'
        )
    )
    assert out == [ToolCallStart(0, "c1", "get_weather"), ToolCallDelta(0, '{"ci')]
    assert a.feed(decode(b'[{"index":0,"function":{"arguments":"ty\\":1}"}}]')) == [
        ToolCallDelta(0, 'ty":1}')
    ]
    # "look" is a prefix of another declared name: it may still grow, so it waits.
    assert (
        a.feed(decode(b'[{"index":1,"id":"c2","function":{"name":"look","arguments":"{}"}}]')) == []
    )
    assert a.finish() == [ToolCallStart(1, "c2", "look"), ToolCallDelta(1, "{}")]
    assert [c.name for c in a.validate()] == ["get_weather", "look"]


@pytest.mark.parametrize(
    ("pieces", "problem"),
    [
        (b'[{"index":1,"id":"a","function":{"name":"f"}}]', "not contiguous"),
        (b'[{"index":0,"function":{"name":"f"}}]', "no id"),
        (
            b'[{"index":0,"id":"a","function":{"name":"f"}},{"index":1,"id":"a","function":{"name":"g"}}]',
            "used twice",
        ),
        (b'[{"index":0,"id":"a","function":{"arguments":"{}"}}]', "no name"),
    ],
)
def test_invalid_sets_are_typed_errors(pieces: bytes, problem: str) -> None:
    a = ToolCallAssembler()
    a.feed(decode(pieces))
    a.finish()
    with pytest.raises(ToolCallError, match=problem):
        a.validate()


def test_missing_index_uses_ids() -> None:
    a = ToolCallAssembler()
    a.feed(
        decode(
            b'[{"id":"a","function":{"name":"f","arguments":"{"}},{"function":{"arguments":"}"}},{"id":"b","function":{"name":"g","arguments":"[]"}}]'
        )
    )
    a.finish()
    assert a.validate() == [ToolCall(0, "a", "f", "{}"), ToolCall(1, "b", "g", "[]")]
