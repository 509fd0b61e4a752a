"""The one JSON request decoder: the value msgspec decodes, or BadJSON for a body that is not JSON
or nests too deeply, and never anything else."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.wire.jsonbody import MAX_DEPTH, BadJSON, decode_body


def arrays(depth: int, inner: bytes = b"1") -> bytes:
    """`inner` inside `depth` arrays."""
    return b"[" * depth + inner + b"]" * depth


def objects(depth: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * depth + inner + b"}" * depth


@pytest.mark.parametrize("nest", [arrays, objects])
def test_a_value_may_sit_inside_max_depth_containers(nest: Any) -> None:
    value = decode_body(nest(MAX_DEPTH))
    for _ in range(MAX_DEPTH):
        value = value[0] if isinstance(value, list) else value["a"]
    assert value == 1


@pytest.mark.parametrize("nest", [arrays, objects])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 5000, 100_000])
def test_deeper_is_refused(nest: Any, depth: int) -> None:
    with pytest.raises(BadJSON) as info:
        decode_body(nest(depth))
    assert info.value.code == "json_too_deep"
    assert f"inside more than {MAX_DEPTH} arrays and objects" in info.value.message


def test_depth_inside_a_field_counts_from_the_top() -> None:
    body = b'{"model": "p/m", "metadata": ' + objects(MAX_DEPTH) + b"}"
    with pytest.raises(BadJSON):
        decode_body(body)
    assert decode_body(b'{"m": ' + objects(MAX_DEPTH - 1) + b"}")["m"]["a"]


def test_brackets_in_strings_are_text() -> None:
    text = "[" * 5000 + '\\"{' * 100 + "\n"
    body = msgspec.json.encode({"messages": [{"content": text}]})
    assert decode_body(body) == {"messages": [{"content": text}]}


def test_mixed_nesting_and_empty_containers() -> None:
    # 100 levels of alternating arrays and objects, ending in an empty one inside the 100th.
    raw = b""
    for i in range(MAX_DEPTH):
        raw += b"[" if i % 2 else b'{"k":'
    raw += b"[]"
    for i in reversed(range(MAX_DEPTH)):
        raw += b"]" if i % 2 else b"}"
    decode_body(raw)
    with pytest.raises(BadJSON):
        decode_body(b"[" + raw + b"]")


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[1,]", b"\xff", b'["\xff"]', b'{"a": 1e999}', b"[1] x", b"nul"]
)
def test_what_is_not_json(raw: bytes) -> None:
    with pytest.raises(BadJSON) as info:
        decode_body(raw)
    assert info.value.code == "invalid_json"
    assert info.value.message.startswith("the request body is not valid JSON: ")


def test_a_buffer_decodes_like_bytes() -> None:
    assert decode_body(bytearray(b'{"a": [1]}')) == {"a": [1]}
    assert decode_body(memoryview(b'{"a": [1]}')) == {"a": [1]}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)


@settings(max_examples=300)
@given(json_values)
def test_what_msgspec_decodes_comes_back_the_same(value: Any) -> None:
    raw = msgspec.json.encode(value)
    assert decode_body(raw) == msgspec.json.decode(raw)


@settings(max_examples=500)
@given(st.binary(max_size=200) | st.text(alphabet='[]{}",:\\ 1an', max_size=300).map(str.encode))
def test_any_bytes_are_a_value_or_bad_json(raw: bytes) -> None:
    error: BadJSON | None = None
    try:
        decode_body(raw)
    except BadJSON as exc:
        error = exc
    if error is not None:
        assert error.message and error.code in ("invalid_json", "json_too_deep")
