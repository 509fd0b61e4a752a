"""The real llama.cpp streams recorded in llamacpp-live/ (see its README) decode as they must."""

from __future__ import annotations

import json
from pathlib import Path

from svir.wire.classify import classify_http_error
from svir.wire.errors import ErrorKind
from tests.conformance.summary import decode, summarize

LIVE = Path(__file__).parent / "llamacpp-live"


def test_text_stream() -> None:
    raw = (LIVE / "text.sse").read_bytes()
    assert b'"delta":{"role":"assistant","content":null}' in raw  # llama.cpp's first delta (§3.2)
    got = summarize(decode([raw[i : i + 7] for i in range(0, len(raw), 7)], {}))
    assert got["complete"] and got["error"] is None
    assert got["answer"]
    assert got["usage"] is not None and got["usage"]["completion_tokens"] > 0


def test_tool_call_stream() -> None:
    got = summarize(decode([(LIVE / "tool-call.sse").read_bytes()], {}))
    assert got["complete"] and got["finish_reason"] == "tool_calls"
    call = got["tool_calls"][0]
    assert call["name"] == "get_weather" and call["id"]
    assert isinstance(json.loads(call["arguments"]), dict)


def test_json_schema_stream() -> None:
    got = summarize(decode([(LIVE / "json-schema.sse").read_bytes()], {}))
    assert got["complete"]
    assert isinstance(json.loads(got["answer"]), dict)


def test_error_bodies_classify() -> None:
    overflow = classify_http_error(400, {}, (LIVE / "overflow-400.json").read_bytes())
    assert overflow.kind is ErrorKind.CONTEXT_OVERFLOW
    assert overflow.details["n_ctx"] > 0
    image = classify_http_error(500, {}, (LIVE / "image-500.json").read_bytes())
    assert image.kind is ErrorKind.UNSUPPORTED_INPUT and not image.retryable
