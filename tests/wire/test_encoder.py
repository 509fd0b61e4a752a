"""Canonical encoding: what svir writes, read back by svir and by the OpenAI SDK."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgspec
import openai
import pytest

from svir.wire.decoder import StreamDecoder
from svir.wire.encoder import ChunkEncoder, CompletionAggregator
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    ReasoningDelta,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from tests.conformance.summary import decode, summarize

CORPUS = Path(__file__).parent.parent / "conformance" / "decoder"


def encode(events: list[Event], include_usage: bool = True) -> bytes:
    e = ChunkEncoder(id="chatcmpl-x", model="p/m", created=123, include_usage=include_usage)
    return b"".join(e.encode(ev) for ev in events)


def sdk_client(body: bytes) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return openai.OpenAI(
        api_key="k",
        base_url="http://svir.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


@pytest.mark.parametrize("name", sorted(p.stem for p in CORPUS.glob("*.sse")))
def test_reencoded_corpus_decodes_to_the_same_result(name: str) -> None:
    spec = json.loads((CORPUS / f"{name}.json").read_text())
    events = decode([(CORPUS / f"{name}.sse").read_bytes()], spec["options"])
    again = summarize(decode([encode(events)], {"tool_names": spec["options"].get("tool_names")}))
    first = summarize(events)
    # The canonical stream has svir's id and model, one reasoning carrier, and no filter details.
    for key in ("id", "model", "reasoning_carrier", "content_filter", "keepalives"):
        first.pop(key), again.pop(key)
    if first["error"] is not None:
        assert again["error"]["kind"] in {first["error"]["kind"], "other", "transient"}
        first.pop("error"), again.pop("error")
    assert again == first


def test_sdk_parses_the_canonical_stream() -> None:
    events: list[Event] = [
        Role("assistant", "up", "m", 1),
        ReasoningDelta("think", "reasoning"),
        TextDelta("Hel"),
        TextDelta("lo"),
        ToolCallStart(0, "call-1", "get_weather"),
        ToolCallDelta(0, '{"city":'),
        ToolCallDelta(0, '"Oslo"}'),
        Finish("tool_calls"),
        Usage(5, 7, 12, 3, 1),
        Done(),
    ]
    client = sdk_client(encode(events))
    chunks = list(
        client.chat.completions.create(model="p/m", messages=[], stream=True)  # type: ignore[call-overload]
    )
    assert {c.id for c in chunks} == {"chatcmpl-x"} and {c.model for c in chunks} == {"p/m"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 3  # type: ignore[union-attr]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The SDK's stream helper assembles the call from the canonical pieces.
    with client.chat.completions.stream(model="p/m", messages=[]) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == (  # type: ignore[union-attr]
        "call-1",
        "get_weather",
        '{"city":"Oslo"}',
    )
    assert final.choices[0].message.content == "Hello"


def test_usage_chunk_only_when_asked() -> None:
    events: list[Event] = [TextDelta("a"), Finish("stop"), Usage(1, 1, 2), Done()]
    assert b'"usage"' not in encode(events, include_usage=False)
    assert b'"usage"' in encode(events, include_usage=True)


def test_failure_after_start_is_one_error_frame_and_no_done() -> None:
    err = UpstreamError(ErrorKind.TRANSIENT, "upstream died", in_stream=True)
    body = encode([TextDelta("partial"), StreamError(err), TextDelta("x"), Done()])
    frames = [f for f in body.split(b"\n\n") if f]
    assert b"[DONE]" not in body
    last = msgspec.json.decode(frames[-1].removeprefix(b"data: "))
    assert set(last) == {"error"} and set(last["error"]) == {"message", "type", "code"}
    assert last["error"]["message"] == "upstream died"
    assert sum(b'"error"' in f for f in frames) == 1
    # The SDK surfaces it as an API error, after the partial text.
    with pytest.raises(openai.APIError, match="upstream died"):
        list(sdk_client(body).chat.completions.create(model="p/m", messages=[], stream=True))  # type: ignore[call-overload]


def test_aggregate_completion() -> None:
    agg = CompletionAggregator()
    for ev in [
        Role("assistant", "u", "m", 0),
        ReasoningDelta("r", "think"),
        TextDelta("a"),
        ToolCallStart(0, "c", "f"),
        ToolCallDelta(0, "{}"),
        Finish("tool_calls"),
        Usage(1, 2, 3),
        Done(),
    ]:
        agg.add(ev)
    out = agg.completion(id="chatcmpl-1", model="p/m", created=5)
    assert out["object"] == "chat.completion"
    msg = out["choices"][0]["message"]
    assert msg == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "r",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert out["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    # It parses as the SDK's ChatCompletion.
    assert openai.types.chat.ChatCompletion.model_validate(out).choices[0].message.content == "a"


def test_decoder_memory_is_flat_in_stream_length() -> None:
    d = StreamDecoder()
    piece = b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    d.feed(piece * 10)
    size_small = len(d._sse._buf) + len(d._sse._data)
    for _ in range(1000):
        d.feed(piece * 10)
    assert len(d._sse._buf) + len(d._sse._data) == size_small
    assert not d.tool_calls
