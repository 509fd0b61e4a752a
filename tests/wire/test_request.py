"""Tests for the request side of the wire core: message building, sizes, and streaming bodies."""

from __future__ import annotations

import base64
import copy
import io
import random
from collections.abc import Generator
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.wire.errors import BodyError
from svir.wire.request import (
    FileRef,
    StreamingBody,
    base64_length,
    build_messages,
    json_escape,
    json_escaped_length,
)

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG fake image").decode()


def data_url(raw: bytes, media_type: str = "text/plain") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def file_part(name: str | None, raw: bytes, *, as_data_url: bool = True) -> dict[str, Any]:
    encoded = data_url(raw) if as_data_url else base64.b64encode(raw).decode()
    file: dict[str, Any] = {"file_data": encoded}
    if name is not None:
        file["filename"] = name
    return {"type": "file", "file": file}


def image(url: str, detail: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"url": url}
    if detail is not None:
        body["detail"] = detail
    return {"type": "image_url", "image_url": body}


def text(value: str, kind: str = "text") -> dict[str, Any]:
    return {"type": kind, "text": value}


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def build(messages: Any, reasoning_key: Any = "reasoning_content") -> list[dict[str, Any]]:
    return build_messages(messages, reasoning_key=reasoning_key)


# ---------------------------------------------------------------------------------------------
# Text content


def test_plain_string_content_is_unchanged() -> None:
    assert build(user("hello")) == [{"role": "user", "content": "hello"}]


def test_text_only_array_is_flattened_to_a_string_joined_by_newlines() -> None:
    out = build(user([text("first"), text("second", "input_text"), text("third")]))
    assert out == [{"role": "user", "content": "first\nsecond\nthird"}]


def test_empty_text_parts_add_no_separators() -> None:
    out = build(user([text(""), text("a"), text(""), text("b"), text("")]))
    assert out[0]["content"] == "a\nb"


def test_empty_text_array_becomes_empty_string() -> None:
    assert build(user([]))[0]["content"] == ""


@pytest.mark.parametrize("role", ["system", "developer"])
def test_system_and_developer_arrays_are_flattened(role: str) -> None:
    out = build([{"role": role, "content": [text("be"), text("brief")]}])
    assert out == [{"role": role, "content": "be\nbrief"}]


def test_system_message_rejects_an_image() -> None:
    with pytest.raises(BodyError, match=r"messages\[0\]\.content\[0\]"):
        build([{"role": "system", "content": [image(PNG)]}])


# ---------------------------------------------------------------------------------------------
# Images


def test_images_follow_one_text_part_holding_all_text_in_order() -> None:
    out = build(user([image(PNG), text("look"), image("https://x.test/a.jpg"), text("here")]))
    assert out[0]["content"] == [
        {"type": "text", "text": "look\nhere"},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
    ]


def test_images_without_text_have_no_text_part() -> None:
    out = build(user([text(""), image(PNG), text("")]))
    assert out[0]["content"] == [{"type": "image_url", "image_url": {"url": PNG}}]


def test_image_detail_is_kept_and_urls_pass_unchanged() -> None:
    url = "HTTP://Example.test/p.png?q=1"
    out = build(user([image(url, "low"), image(PNG, "high")]))
    assert out[0]["content"] == [
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
    ]


def test_image_url_given_as_a_bare_string_is_normalized() -> None:
    out = build(user([{"type": "image_url", "image_url": PNG}]))
    assert out[0]["content"] == [{"type": "image_url", "image_url": {"url": PNG}}]


def test_file_ref_image_url_passes_through() -> None:
    ref = FileRef("/tmp/a.png", 10, "image/png")
    out = build(user([image("x") | {"image_url": {"url": ref}}]))
    assert out[0]["content"][0]["image_url"]["url"] is ref


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,not base64!", "not valid base64"),
        ("data:image/png;base64,abc", "not valid base64"),
        ("data:image/png;base64,", "empty"),
        ("data:image/svg+xml,%3Csvg%3E", "must be base64"),
        ("data:image/png;base64", "comma"),
        ("data:png;base64,AAAA", "not a media type"),
        ("ftp://x.test/a.png", "http"),
        ("/etc/passwd", "http"),
        ("", "http"),
    ],
)
def test_bad_image_urls_are_rejected_naming_the_field(url: str, message: str) -> None:
    with pytest.raises(BodyError, match=message) as info:
        build([{"role": "user", "content": "hi"}, *user([text("a"), image(url)])])
    assert "messages[1].content[1].image_url.url" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Files


def test_text_file_is_wrapped_with_an_escaped_name() -> None:
    out = build(user([file_part('a&b<c>"d.txt', b"hello\nworld")]))
    assert out[0]["content"] == '<file name="a&amp;b&lt;c&gt;&quot;d.txt">\nhello\nworld\n</file>'


def test_files_and_text_keep_their_order() -> None:
    out = build(user([text("before"), file_part("x.py", b"x = 1\n"), text("after")]))
    assert out[0]["content"] == 'before\n<file name="x.py">\nx = 1\n\n</file>\nafter'


def test_file_text_joins_the_text_part_before_images() -> None:
    out = build(user([image(PNG), file_part("n.md", "é ü 😀".encode())]))
    assert out[0]["content"] == [
        {"type": "text", "text": '<file name="n.md">\né ü 😀\n</file>'},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]


def test_file_data_as_bare_base64_and_percent_encoded_data_url() -> None:
    bare = build(user([file_part("a", b"plain", as_data_url=False)]))
    percent = build(
        user([{"type": "file", "file": {"filename": "b", "file_data": "data:,50%25%20off"}}])
    )
    assert bare[0]["content"] == '<file name="a">\nplain\n</file>'
    assert percent[0]["content"] == '<file name="b">\n50% off\n</file>'


def test_file_without_a_name_and_with_a_bom() -> None:
    out = build(user([file_part(None, b"\xef\xbb\xbfhi")]))
    assert out[0]["content"] == '<file name="">\nhi\n</file>'


def test_binary_file_is_rejected_with_a_clear_message() -> None:
    with pytest.raises(BodyError, match=r"messages\[0\]\.content\[1\]\.file.*'photo\.bin'.*UTF-8"):
        build(user([text("see"), file_part("photo.bin", b"\x89PNG\r\n\x1a\n\xff\xfe")]))


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ({"file_id": "file-123"}, "file_id"),
        ({"filename": "a"}, "file_data is missing"),
        ({"file_data": 5}, "file_data must be a string"),
        ({"file_data": "@@@"}, "not valid base64"),
        ({"file_data": "aGk=", "filename": 3}, "filename must be a string"),
    ],
)
def test_bad_file_parts(file: dict[str, Any], message: str) -> None:
    with pytest.raises(BodyError, match=message):
        build(user([{"type": "file", "file": file}]))


# ---------------------------------------------------------------------------------------------
# Assistant turns and tool results


def test_assistant_tool_calls_are_kept_with_raw_and_serialized_arguments() -> None:
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "index": 0,
                    "function": {"name": "f", "arguments": '{"a": 1, "b":'},
                },
                {"id": "call_2", "function": {"name": "g", "arguments": {"x": [1, "é"]}}},
                {"id": "call_3", "function": {"name": "h"}},
            ],
        }
    ]
    out = build(messages)
    assert out == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": a}}
                for n, name, a in [
                    (1, "f", '{"a": 1, "b":'),
                    (2, "g", '{"x":[1,"é"]}'),
                    (3, "h", "{}"),
                ]
            ],
        }
    ]


def test_assistant_content_is_kept_next_to_tool_calls_and_empty_calls_dropped() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = build(
        [
            {"role": "assistant", "content": "calling", "tool_calls": [call]},
            {"role": "assistant", "content": [text("a"), {"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "tool_calls": []},
        ]
    )
    assert out == [
        {"role": "assistant", "content": "calling", "tool_calls": [call]},
        {"role": "assistant", "content": "a\nno"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("plain", "plain"),
        ({"ok": True, "n": [1, 2]}, '{"ok":true,"n":[1,2]}'),
        ([1, "two"], '[1,"two"]'),
        ([], "[]"),
        ([{"type": "row", "v": 1}], '[{"type":"row","v":1}]'),
        (3.5, "3.5"),
        (False, "false"),
        (None, "null"),
        ([text("part one"), text("part two", "input_text")], "part one\npart two"),
    ],
)
def test_tool_result_content_is_always_a_string(content: Any, expected: str) -> None:
    out = build([{"role": "tool", "tool_call_id": "call_1", "content": content}])
    assert out == [{"role": "tool", "tool_call_id": "call_1", "content": expected}]


def test_tool_result_needs_an_id_and_content() -> None:
    with pytest.raises(BodyError, match=r"messages\[0\]\.tool_call_id"):
        build([{"role": "tool", "content": "x"}])
    with pytest.raises(BodyError, match=r"messages\[0\]\.content is missing"):
        build([{"role": "tool", "tool_call_id": "c"}])


def test_unserializable_arguments_are_a_body_error() -> None:
    call = {"id": "c", "function": {"name": "f", "arguments": {"x": object()}}}
    with pytest.raises(BodyError, match=r"tool_calls\[0\]\.function\.arguments"):
        build([{"role": "assistant", "tool_calls": [call]}])


# ---------------------------------------------------------------------------------------------
# Reasoning sent back


@pytest.mark.parametrize("sent", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_is_sent_under_the_configured_key_only(sent: str, key: str) -> None:
    out = build([{"role": "assistant", "content": "4", sent: "2+2"}], key)
    assert out == [{"role": "assistant", "content": "4", key: "2+2"}]


def test_reasoning_under_both_keys_is_sent_once() -> None:
    msg = {"role": "assistant", "content": "x", "reasoning_content": "A", "reasoning": "B"}
    assert build([msg], "reasoning") == [{"role": "assistant", "content": "x", "reasoning": "B"}]
    only = build([msg], "reasoning_content")
    assert only == [{"role": "assistant", "content": "x", "reasoning_content": "A"}]


def test_reasoning_is_dropped_without_a_key_or_when_empty() -> None:
    msg = {"role": "assistant", "content": "x", "reasoning_content": "A", "reasoning": None}
    assert build([msg], None) == [{"role": "assistant", "content": "x"}]
    empty = {"role": "assistant", "content": "x", "reasoning": ""}
    assert build([empty], "reasoning") == [{"role": "assistant", "content": "x"}]


def test_reasoning_must_be_text() -> None:
    with pytest.raises(BodyError, match=r"messages\[0\]\.reasoning must be a string"):
        build([{"role": "assistant", "content": "x", "reasoning": ["a"]}], None)


def test_name_passes_and_unknown_keys_are_dropped() -> None:
    out = build([{"role": "user", "content": "hi", "name": "ann", "x_custom": 1, "reasoning": "r"}])
    assert out == [{"role": "user", "content": "hi", "name": "ann"}]


def test_unknown_reasoning_key_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="reasoning_key"):
        build(user("x"), "thinking")


# ---------------------------------------------------------------------------------------------
# Bad input and immutability


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ({"role": "user"}, "messages must be an array"),
        ("hi", "messages must be an array"),
        ([1], r"messages\[0\] must be an object"),
        ([{"content": "x"}], r"messages\[0\]\.role is missing"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\]\.role: unknown role 'robot'"),
        ([{"role": ["user"], "content": "x"}], r"messages\[0\]\.role"),
        ([{"role": "user", "content": 5}], r"messages\[0\]\.content must be"),
        ([{"role": "user"}], r"messages\[0\]\.content is missing"),
        ([{"role": "system", "content": None}], r"messages\[0\]\.content is missing"),
        ([{"role": "user", "content": ["x"]}], r"messages\[0\]\.content\[0\] must be an object"),
        ([{"role": "user", "content": [{"text": "x"}]}], r"content\[0\]\.type"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "'input_audio'"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], r"content\[0\]\.text"),
        ([{"role": "user", "content": [image("x") | {"image_url": 3}]}], r"\.image_url must be"),
        ([{"role": "user", "content": [image("x") | {"image_url": {"url": 3}}]}], r"url must be"),
        (user([{"type": "image_url", "image_url": {"url": PNG, "detail": 1}}]),
         "detail must be a string"),
        ([{"role": "user", "content": "x", "name": 1}], r"messages\[0\]\.name"),
        ([{"role": "assistant", "tool_calls": {}}], r"messages\[0\]\.tool_calls must be an array"),
        ([{"role": "assistant", "tool_calls": [{"id": "c"}]}], r"tool_calls\[0\]\.function must"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
         r"tool_calls\[0\]\.id"),
        ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}], r"function\.name"),
        ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "x", "function": {}}]}],
         "type must be 'function'"),
        ([{"role": "assistant", "content": {"a": 1}}], r"messages\[0\]\.content must be"),
        ([{"role": "tool", "tool_call_id": "c", "content": [text("a"), {"type": "image_url"}]}],
         r"messages\[0\]\.content\[1\]: a tool message takes no 'image_url'"),
    ],
)  # fmt: skip
def test_bad_input_is_a_body_error_naming_the_place(messages: Any, where: str) -> None:
    with pytest.raises(BodyError, match=where):
        build(messages)


def test_input_is_never_mutated_and_output_shares_nothing_mutable() -> None:
    messages = [
        {"role": "system", "content": [text("sys")]},
        {"role": "user", "content": [text("a"), image(PNG, "low"), file_part("f", b"x")]},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "r",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"k": [1]}}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": {"ok": [1, 2]}},
    ]
    snapshot = copy.deepcopy(messages)
    out = build(messages, "reasoning_content")
    assert messages == snapshot
    out[1]["content"][1]["image_url"]["url"] = "changed"
    out[2]["tool_calls"][0]["function"]["name"] = "changed"
    assert messages == snapshot


# ---------------------------------------------------------------------------------------------
# Fuzz: anything JSON-ish is either built or rejected with BodyError

KEYS = st.sampled_from(
    [
        "role", "content", "type", "text", "image_url", "url", "detail", "file", "file_data",
        "filename", "file_id", "tool_calls", "id", "function", "name", "arguments",
        "tool_call_id", "reasoning", "reasoning_content", "refusal",
    ]
)  # fmt: skip
WORDS = st.sampled_from(
    [
        "user", "system", "developer", "assistant", "tool", "text", "input_text", "image_url",
        "file", "function", "refusal", PNG, "https://x.test/i.png", "data:,abc",
        "data:image/png;base64,@@", data_url(b"text"), data_url(b"\xff\xfe"), "aGk=", "",
    ]
)  # fmt: skip
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | WORDS
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=30,
)


@given(
    messages=JSONISH | st.lists(JSONISH, max_size=4),
    key=st.sampled_from([None, "reasoning", "reasoning_content"]),
)
@settings(max_examples=500)
def test_fuzz_raises_only_body_error(messages: Any, key: Any) -> None:
    snapshot = copy.deepcopy(messages)
    try:
        out = build_messages(messages, reasoning_key=key)
    except BodyError:
        return
    finally:
        assert repr(messages) == repr(snapshot)  # repr: NaN != NaN defeats ==
    assert len(out) == len(messages)
    for msg in out:
        content = msg["content"]
        assert isinstance(content, str) or (
            isinstance(content, list) and content and content[-1]["type"] == "image_url"
        )
        assert not ("reasoning" in msg and "reasoning_content" in msg)
    msgspec.json.encode(out)


# ---------------------------------------------------------------------------------------------
# Sizes and escaping


def reference_escape(data: bytes) -> bytes:
    """§2.3 byte by byte, written independently of the module under test."""
    short = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
    short |= {0x08: b"\\b", 0x0C: b"\\f"}
    out = bytearray()
    for byte in data:
        if byte in short:
            out += short[byte]
        elif byte < 0x20:
            out += b"\\u%04x" % byte
        else:
            out.append(byte)
    return bytes(out)


@pytest.mark.parametrize(("n", "expected"), [(0, 0), (1, 4), (2, 4), (3, 4), (4, 8), (300, 400)])
def test_base64_length_examples(n: int, expected: int) -> None:
    assert base64_length(n) == expected


@given(st.integers(0, 5000))
def test_base64_length_matches_encoding(n: int) -> None:
    assert base64_length(n) == len(base64.b64encode(bytes(n)))


def test_base64_length_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        base64_length(-1)


def test_json_escaped_length_examples() -> None:
    assert json_escaped_length(b"") == 0
    assert json_escaped_length(b"abc") == 3
    assert json_escaped_length(b'"\\\n\r\t\b\f') == 14
    assert json_escaped_length(b"\x00\x1f\x0b\x7f") == 6 + 6 + 6 + 1
    assert json_escaped_length("é😀".encode()) == 6


@given(st.binary(max_size=2000))
def test_json_escaped_length_matches_reference_for_any_bytes(data: bytes) -> None:
    assert json_escaped_length(data) == len(reference_escape(data))


@given(st.text())
def test_json_escape_is_exact_and_round_trips(value: str) -> None:
    escaped = json_escape(value)
    assert escaped == reference_escape(value.encode())
    assert len(escaped) == json_escaped_length(value.encode())
    assert msgspec.json.decode(b'"' + escaped + b'"') == value


def test_json_escape_exact_form() -> None:
    assert json_escape('a"b\\c\n\x01\x7fé') == b'a\\"b\\\\c\\n\\u0001\x7f\xc3\xa9'


def test_json_escape_rejects_lone_surrogates() -> None:
    with pytest.raises(BodyError, match="surrogate at position 1"):
        json_escape("a\ud800b")


# ---------------------------------------------------------------------------------------------
# Streaming bodies


def open_binary(path: str) -> BinaryIO:
    return open(path, "rb")


class Recorder:
    """An opener that hands out files whose reads come back short and records what it opened."""

    def __init__(self, max_read: int | None = None) -> None:
        self.max_read = max_read
        self.opened: list[_ShortReader] = []

    def __call__(self, path: str) -> BinaryIO:
        reader = _ShortReader(Path(path).read_bytes(), self.max_read)
        self.opened.append(reader)
        return reader


class _ShortReader(io.BytesIO):
    def __init__(self, data: bytes, max_read: int | None) -> None:
        super().__init__(data)
        self.max_read = max_read
        self.requests: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        assert size is not None
        assert size > 0  # the writer never asks for a whole file
        self.requests.append(size)
        return super().read(min(size, self.max_read) if self.max_read else size)


def substitute(value: Any, contents: dict[str, bytes]) -> Any:
    if isinstance(value, FileRef):
        return data_url(contents[value.path], value.media_type)
    if isinstance(value, dict):
        return {k: substitute(v, contents) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, contents) for v in value]
    return value


def write_files(
    tmp_path: Path, sizes: list[int], seed: int
) -> tuple[list[FileRef], dict[str, bytes]]:
    rng = random.Random(seed)
    refs: list[FileRef] = []
    contents: dict[str, bytes] = {}
    for i, size in enumerate(sizes):
        path = tmp_path / f"image{i}.bin"
        data = rng.randbytes(size)
        path.write_bytes(data)
        refs.append(FileRef(str(path), size, rng.choice(["image/png", "image/jpeg"])))
        contents[str(path)] = data
    return refs, contents


def request_payload(prompt: str, refs: list[FileRef]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    parts += [{"type": "image_url", "image_url": {"url": ref, "detail": "high"}} for ref in refs]
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": prompt},
            {"role": "user", "content": parts},
        ],
        "stream": True,
        "temperature": 0.7,
        "max_tokens": 10,
        "stream_options": {"include_usage": True},
        "tools": [],
    }


def check_body(
    body: StreamingBody,
    payload: dict[str, Any],
    contents: dict[str, bytes],
    opener: Any,
    chunk_size: int,
) -> bytes:
    written = b"".join(body.iter_chunks(opener, chunk_size))
    expected = substitute(payload, contents)
    assert len(written) == body.content_length
    assert written == msgspec.json.encode(expected)
    assert msgspec.json.decode(written) == expected
    return written


@given(
    prompt=st.text(),
    sizes=st.lists(st.integers(0, 200_000), max_size=3),
    seed=st.integers(0, 2**32),
    chunk_size=st.sampled_from([3, 4, 5, 8, 3 * 1024, 65536, 3 * 65536]),
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_content_length_equals_bytes_written(
    tmp_path: Path, prompt: str, sizes: list[int], seed: int, chunk_size: int
) -> None:
    refs, contents = write_files(tmp_path, sizes, seed)
    payload = request_payload(prompt, refs)
    body = StreamingBody(payload)
    assert body.files == tuple(refs)
    check_body(body, payload, contents, open_binary, chunk_size)


STEP = 3 * 65536


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, STEP - 1, STEP, STEP + 1, STEP + 2])
def test_sizes_in_every_residue_mod_three(tmp_path: Path, size: int) -> None:
    refs, contents = write_files(tmp_path, [size, size], size)
    payload = request_payload("two images", refs)
    check_body(StreamingBody(payload), payload, contents, open_binary, 3 * 65536)


@pytest.mark.parametrize("max_read", [1, 2, 7, 1000])
def test_short_reads_still_produce_correct_base64(tmp_path: Path, max_read: int) -> None:
    refs, contents = write_files(tmp_path, [5000, 4], 7)
    payload = request_payload("short reads", refs)
    check_body(StreamingBody(payload), payload, contents, Recorder(max_read), 300)


def test_content_length_needs_no_file_and_names_the_size(tmp_path: Path) -> None:
    missing = FileRef(str(tmp_path / "nope.png"), 1_000_000, "image/png")
    body = StreamingBody({"url": missing, "x": "\n"})
    prefix = len(b'{"url":"data:image/png;base64,')
    assert body.content_length == prefix + base64_length(1_000_000) + len(b'","x":"\\n"}')
    with pytest.raises(BodyError, match="cannot be opened"):
        list(body.iter_chunks(open_binary))


def test_memory_is_bounded_by_the_chunk_size(tmp_path: Path) -> None:
    refs, _ = write_files(tmp_path, [100_000], 3)
    recorder = Recorder()
    chunks = list(StreamingBody({"u": refs[0]}).iter_chunks(recorder, 1000))
    reads = recorder.opened[0].requests
    assert max(reads) == 999  # rounded down to a multiple of 3
    # Whole steps, then the file's tail, then a one-byte probe that finds the end.
    assert reads[-2:] == [100_000 % 999, 1]
    assert all(r == 999 for r in reads[:-2])
    assert max(len(c) for c in chunks) <= base64_length(999)
    assert all(not c.endswith(b"=") for c in chunks[1:-2])  # every piece but the last: no padding


@pytest.mark.parametrize(("stated", "actual"), [(10, 9), (10, 11), (0, 1), (3, 0), (6, 300_000)])
def test_a_file_of_another_size_is_a_body_error(tmp_path: Path, stated: int, actual: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"z" * actual)
    body = StreamingBody({"u": FileRef(str(path), stated, "image/png")})
    written = bytearray()

    def drain() -> None:
        for chunk in body.iter_chunks(open_binary, 3):
            written.extend(chunk)

    with pytest.raises(BodyError, match="stated"):
        drain()
    # Nothing beyond what the Content-Length announced was sent before the error.
    assert len(written) <= body.content_length


def test_closing_the_iterator_early_closes_the_file(tmp_path: Path) -> None:
    refs, _ = write_files(tmp_path, [10_000], 1)
    recorder = Recorder()
    chunks = cast(
        "Generator[bytes, None, None]", StreamingBody({"u": refs[0]}).iter_chunks(recorder, 30)
    )
    next(chunks)
    next(chunks)
    assert not recorder.opened[0].closed
    chunks.close()
    assert recorder.opened[0].closed


def test_non_string_keys_and_tuples_encode_as_msgspec_does(tmp_path: Path) -> None:
    refs, contents = write_files(tmp_path, [4], 2)
    payload: dict[Any, Any] = {1: (1.5, None), "f": [refs[0]], "s": "\x00\u2028"}
    written = b"".join(StreamingBody(payload).iter_chunks(open_binary))
    url = data_url(contents[refs[0].path], refs[0].media_type)
    assert written == msgspec.json.encode({1: [1.5, None], "f": [url], "s": "\x00\u2028"})


def test_bad_payloads_and_refs() -> None:
    with pytest.raises(BodyError, match="payload must be an object"):
        StreamingBody([1])  # type: ignore[arg-type]
    with pytest.raises(BodyError, match="cannot be encoded"):
        StreamingBody({"x": object()})
    with pytest.raises(BodyError, match="negative"):
        FileRef("p", -1, "image/png")
    with pytest.raises(BodyError, match="media type"):
        FileRef("p", 1, "png")
    with pytest.raises(ValueError, match="chunk_size"):
        list(StreamingBody({}).iter_chunks(open_binary, 2))


def test_built_messages_stream_with_file_refs(tmp_path: Path) -> None:
    refs, contents = write_files(tmp_path, [1234], 9)
    messages = user([text("what is this?"), image("x") | {"image_url": {"url": refs[0]}}])
    payload = {"model": "m", "messages": build(messages), "stream": True}
    written = check_body(StreamingBody(payload), payload, contents, open_binary, 3 * 65536)
    decoded = msgspec.json.decode(written)
    url = decoded["messages"][0]["content"][1]["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == contents[refs[0].path]
