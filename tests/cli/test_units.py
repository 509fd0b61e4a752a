"""The client's parts on their own: attachments, the speed line (§3.6) with an injected clock,
thread frames, the generated PNG, the TOML of suggested settings."""

from __future__ import annotations

import base64
import io
import json
import struct
import tomllib
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from svir.client import attach
from svir.client.chat import Renderer, load_tools, stats_line
from svir.client.connection import ClientFailure, Connection
from svir.client.history import Answer, TurnOutcome, _FrameReader
from svir.client.probe.payloads import tiny_png
from svir.client.probe.report import settings_toml
from svir.config.load import parse_config
from svir.wire.decoder import StreamDecoder
from svir.wire.events import (
    Done,
    Event,
    Finish,
    ReasoningDelta,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from svir.wire.speed import TokenRate

# Attachments


def test_image_type_comes_from_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "picture.txt"
    path.write_bytes(tiny_png(4, 4))
    a = attach.load(path)
    assert (a.kind, a.media_type) == ("image", "image/png")
    url = a.part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == path.read_bytes()


@pytest.mark.parametrize(
    ("head", "media_type"),
    [(b"\xff\xd8\xff\xe0", "image/jpeg"), (b"GIF89a", "image/gif"),
     (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp")],
)  # fmt: skip
def test_image_magic(head: bytes, media_type: str) -> None:
    assert attach.sniff_image(head + b"\x00" * 16) == media_type


def test_text_file_part(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Notes\nplum\n")
    a = attach.load(path)
    assert a.kind == "file"
    assert a.part["file"]["filename"] == "notes.md"
    data_url = a.part["file"]["file_data"]
    assert data_url.startswith("data:text/markdown;base64,")
    assert base64.b64decode(data_url.split(",", 1)[1]) == b"# Notes\nplum\n"


def test_refusals(tmp_path: Path) -> None:
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\x00\x9f\x92\x96")
    with pytest.raises(attach.AttachError, match="neither an image"):
        attach.load(binary)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(attach.AttachError, match="empty"):
        attach.load(empty)
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(attach.AttachError, match="over the limit"):
        attach.load(big, limit=1024)
    with pytest.raises(attach.AttachError):
        attach.load(tmp_path)


def test_user_content_layout(tmp_path: Path) -> None:
    path = tmp_path / "p.png"
    path.write_bytes(tiny_png(2, 2))
    image = attach.load(path)
    assert attach.user_content("hi", []) == "hi"
    parts = attach.user_content("hi", [image])
    assert isinstance(parts, list)
    assert parts[0] == {"type": "text", "text": "hi"}
    assert parts[1]["type"] == "image_url"
    # No empty text part (§2.2).
    assert attach.user_content("", [image]) == [image.part]


# The generated PNG


def test_tiny_png_is_a_valid_png() -> None:
    png = tiny_png(3, 2, (1, 2, 3))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    pos, chunks = 8, {}
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        tag, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + data)
        chunks[tag] = data
        pos += 12 + length
    assert struct.unpack(">II", chunks[b"IHDR"][:8]) == (3, 2)
    assert zlib.decompress(chunks[b"IDAT"]) == (b"\x00" + b"\x01\x02\x03" * 3) * 2


# The speed line (§3.6), measured by the decoder on an injected clock


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chunk(content: str) -> bytes:
    delta = json.dumps({"content": content})
    return f'data: {{"id":"x","choices":[{{"index":0,"delta":{delta}}}]}}\n\n'.encode()


def decoded(clock: FakeClock, steps: list[tuple[float, bytes]]) -> tuple[Answer, TokenRate]:
    decoder = StreamDecoder(clock=clock)

    def events() -> Iterator[Event]:
        for at, data in steps:
            clock.now = at
            yield from decoder.feed(data)

    return Answer(events(), lambda: decoder.tokens_per_second), decoder.rate


def play(answer: Answer, clock: FakeClock, show_reasoning: bool = True) -> tuple[TurnOutcome, str]:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    outcome = Renderer(console, show_reasoning=show_reasoning, clock=clock).play(answer)
    return outcome, out.getvalue()


def test_rate_from_first_to_last_visible_token() -> None:
    clock = FakeClock()
    finish = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}\n\n'
    # The first token comes after a long wait that must not count; then 4 more in 0.5 s.
    answer, _ = decoded(clock, [
        (105.0, chunk("a")), (105.1, chunk("b")), (105.2, chunk("c")), (105.4, chunk("d")),
        (105.5, chunk("e")), (109.0, finish + usage + b"data: [DONE]\n\n"),
    ])  # fmt: skip
    clock.now = 100.0
    outcome, screen = play(answer, clock)
    assert outcome.tokens_per_second == pytest.approx(8.0)  # 4 intervals in 0.5 s
    assert "abcde" in screen
    assert "stop · 5 tokens · 8.0 tokens/s" in screen


def test_no_rate_without_an_honest_window() -> None:
    clock = FakeClock()
    done = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    # Two tokens 30 ms apart: under 50 ms is no honest rate.
    answer, _ = decoded(clock, [(1.0, chunk("a")), (1.03, chunk("b")), (1.1, done)])
    outcome, screen = play(answer, clock)
    assert outcome.tokens_per_second is None
    assert "tokens/s" not in screen
    assert "tokens/s" not in stats_line(outcome)


def test_think_markers_are_not_tokens() -> None:
    clock = FakeClock()
    decoder = StreamDecoder(clock=clock, think_tags=True)
    for at, piece in [(1.0, "<thi"), (1.5, "nk>"), (2.0, "x"), (2.5, "</think>"), (3.0, "y")]:
        clock.now = at
        decoder.feed(chunk(piece))
    # Only "x" and "y" showed anything: two tokens, one second apart.
    assert decoder.tokens_per_second == pytest.approx(1.0)


def scripted(events: list[Event]) -> Answer:
    return Answer(iter(events), lambda: None)


def test_reasoning_folded_and_shown() -> None:
    events: list[Event] = [ReasoningDelta("one two three", "reasoning_content"),
                           TextDelta("Answer."), Finish("stop"), Done()]  # fmt: skip
    outcome, screen = play(scripted(list(events)), FakeClock(), show_reasoning=False)
    assert "▸ reasoned 3 words" in screen and "one two three" not in screen
    assert outcome.reasoning == "one two three" and outcome.reasoning_key == "reasoning_content"
    outcome, screen = play(scripted(list(events)), FakeClock(), show_reasoning=True)
    assert screen.index("one two three") < screen.index("Answer.")


def test_tool_call_shown_and_kept() -> None:
    events: list[Event] = [ToolCallStart(0, "c1", "open_locker"), ToolCallDelta(0, '{"locker":'),
                           ToolCallDelta(0, " 7}"), Finish("tool_calls"), Done()]  # fmt: skip
    outcome, screen = play(scripted(events), FakeClock())
    assert '→ open_locker({"locker": 7})' in screen
    assert [(c.id, c.name, c.arguments) for c in outcome.tool_calls] == [
        ("c1", "open_locker", '{"locker": 7}')
    ]
    assert outcome.complete


def test_error_after_output_is_partial() -> None:
    from svir.wire.errors import ErrorKind, UpstreamError

    err = UpstreamError(ErrorKind.TRANSIENT, "boom", in_stream=True)
    outcome, screen = play(scripted([TextDelta("Half"), StreamError(err)]), FakeClock())
    assert not outcome.complete
    assert "error: boom [transient] (the answer above is partial)" in screen
    assert "not kept in the history" in screen


# Thread frames into events


def test_frames() -> None:
    clock = FakeClock()
    rate = TokenRate()
    reader = _FrameReader(rate, clock)
    seen: list[Event] = []
    frames = [
        (1.0, b'{"type":"reasoning","text":"hm"}'),
        (1.2, b'{"type":"delta","text":"Hi"}'),
        (1.4, b'{"type":"delta","text":" there"}'),
        (1.5, b'{"type":"tool_call","index":0,"id":"c","name":"f","arguments":"{}"}'),
        (1.5, b'{"type":"usage","prompt_tokens":3,"completion_tokens":2,"total_tokens":5}'),
        (1.5, b'{"type":"done","message_id":"m","finish_reason":"stop","appended":"Hi there"}'),
    ]
    for at, data in frames:
        clock.now = at
        seen.extend(reader.read(data))
    assert seen == [
        ReasoningDelta("hm", "reasoning"), TextDelta("Hi"), TextDelta(" there"),
        ToolCallStart(0, "c", "f"), ToolCallDelta(0, "{}"), Finish("stop"), Usage(3, 2, 5),
        Done(),
    ]  # fmt: skip
    assert reader.ended
    assert rate.tokens_per_second == pytest.approx(2 / 0.4)


def test_error_frame() -> None:
    reader = _FrameReader(TokenRate(), FakeClock())
    [event] = reader.read(
        b'{"type":"error","error":{"message":"too long","type":"invalid_request_error",'
        b'"param":"messages","code":"context_length_exceeded"},"appended":null}'
    )
    assert isinstance(event, StreamError)
    assert event.error.kind.value == "context_overflow"
    assert event.error.message == "too long"


# Options


def test_tools_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text('{"tools": [{"name": "f", "parameters": {}}]}')
    assert load_tools(str(path)) == [
        {"type": "function", "function": {"name": "f", "parameters": {}}}
    ]
    path.write_text("[1]")
    with pytest.raises(ClientFailure, match="no function name"):
        load_tools(str(path))


def test_connection_options() -> None:
    conn = Connection.open("http://127.0.0.1:8080/", None, environ={})
    assert conn.base == "http://127.0.0.1:8080/v1" and conn.root == "http://127.0.0.1:8080"
    assert Connection.open(None, None, environ={}).base == "http://127.0.0.1:11434/v1"
    keyed = Connection.open(None, "K", environ={"SVIR_BASE_URL": "http://h:1", "K": "s3"})
    assert keyed.base == "http://h:1/v1"
    assert keyed.headers()["Authorization"] == "Bearer s3"
    env = {"SVIR_API_KEY": "d"}
    assert Connection.open(None, None, environ=env).api_key is None
    assert Connection.open(None, None, environ=env, default_key_env="SVIR_API_KEY").api_key == "d"
    with pytest.raises(ClientFailure, match="K is not set"):
        Connection.open(None, "K", environ={})
    with pytest.raises(ClientFailure, match="query"):
        Connection.open("http://h/v1?x=1", None, environ={})


def test_settings_toml_loads() -> None:
    settings = {"kind": "mlx-lm", "base_url": "http://h:8080/v1", "images": False,
                "response_format": "validate", "drop_params": ["reasoning_effort"],
                "think_tags": True}  # fmt: skip
    # Strings are written so that TOML reads them back exactly.
    assert tomllib.loads(settings_toml({"base_url": 'a "b" \\ c'}))["providers"][0]["base_url"] == (
        'a "b" \\ c'
    )
    provider = parse_config(settings_toml(settings)).providers[0]
    assert provider.name == "probed"
    assert (provider.kind, provider.images, provider.response_format) == (
        "mlx-lm",
        False,
        "validate",
    )
    assert provider.drop_params == ("reasoning_effort",)
    assert provider.think_tags is True
