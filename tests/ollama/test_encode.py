"""Normalized events out as Ollama's answers: every corpus stream, streamed and not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from svir.protocols.ollama.encode import ChatAggregator, Metrics, NDJSONEncoder
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningDelta,
    RefusalDelta,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from tests.support.upstream import CORPUS_DIR

CASES = sorted(p.stem for p in CORPUS_DIR.glob("*.sse"))
NOW = "2026-01-02T03:04:05.000006Z"


def fixed_metrics(usage: Usage | None) -> Metrics:
    return Metrics(
        total_duration=3_000,
        prompt_eval_duration=1_000,
        eval_duration=2_000,
        prompt_eval_count=usage.prompt_tokens if usage else None,
        eval_count=usage.completion_tokens if usage else None,
    )


def corpus_events(name: str) -> tuple[dict[str, Any], list[Event]]:
    spec = json.loads((CORPUS_DIR / f"{name}.json").read_text())
    options = spec["options"]
    decoder = StreamDecoder(think_tags=options["think_tags"], tool_names=options["tool_names"])
    events = decoder.feed(Path(CORPUS_DIR / f"{name}.sse").read_bytes())
    events += decoder.close()
    return spec["expect"], events


def encoder() -> NDJSONEncoder:
    return NDJSONEncoder(model="lab/m:latest", metrics=fixed_metrics, clock=lambda: NOW)


def lines_of(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n") or not data
    return [json.loads(line) for line in data.split(b"\n") if line]


def fold(lines: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"content": "", "thinking": "", "tool_calls": [], "final": None}
    for line in lines[:-1]:
        assert line["done"] is False and "error" not in line
        assert line["model"] == "lab/m:latest" and line["created_at"] == NOW
        msg = line["message"]
        assert msg["role"] == "assistant"
        out["content"] += msg["content"]
        out["thinking"] += msg.get("thinking", "")
        out["tool_calls"] += msg.get("tool_calls", [])
    out["final"] = lines[-1]
    return out


def expected_calls(expect: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": c["id"],
            "function": {
                "index": c["index"],
                "name": c["name"],
                "arguments": json.loads(c["arguments"]) if c["arguments"] else {},
            },
        }
        for c in expect["tool_calls"]
    ]


@pytest.mark.parametrize("batching", ["whole", "one-by-one"])
@pytest.mark.parametrize("name", CASES)
def test_corpus_streamed(name: str, batching: str) -> None:
    expect, events = corpus_events(name)
    enc = encoder()
    batches = [events] if batching == "whole" else [[ev] for ev in events]
    data = b"".join(enc.feed(batch) for batch in batches)
    assert enc.ended
    if not expect["complete"]:
        if enc.early_error is not None:
            assert data == b""  # the edge answers with an HTTP error instead
            return
        last = lines_of(data)[-1]
        assert set(last) == {"error"} and last["error"]
        return
    got = fold(lines_of(data))
    assert got["content"] == expect["answer"] + (expect["refusal"] or "")
    assert got["thinking"] == expect["reasoning"]
    assert got["tool_calls"] == expected_calls(expect)
    final = got["final"]
    assert final["done"] is True
    assert final["message"] == {"role": "assistant", "content": ""}
    reason = expect["finish_reason"]
    assert final["done_reason"] == ("stop" if reason == "tool_calls" else reason)
    assert final["total_duration"] == 3_000 and final["eval_duration"] == 2_000
    usage = expect["usage"]
    if usage is None:
        assert "eval_count" not in final and "prompt_eval_count" not in final
    else:
        assert final["eval_count"] == usage["completion_tokens"]
        assert final["prompt_eval_count"] == usage["prompt_tokens"]


@pytest.mark.parametrize("name", CASES)
def test_corpus_not_streamed(name: str) -> None:
    expect, events = corpus_events(name)
    agg = ChatAggregator()
    for ev in events:
        agg.add(ev)
    if not expect["complete"]:
        assert agg.error is not None
        return
    answer = agg.response(model="lab/m", metrics=fixed_metrics, now=NOW)
    message = answer["message"]
    assert message["content"] == expect["answer"] + (expect["refusal"] or "")
    assert message.get("thinking", "") == expect["reasoning"]
    assert message.get("tool_calls", []) == expected_calls(expect)
    assert answer["done"] is True and answer["created_at"] == NOW
    reason = expect["finish_reason"]
    assert answer["done_reason"] == ("stop" if reason == "tool_calls" else reason)


def test_runs_of_text_and_thinking_are_one_line_each() -> None:
    enc = encoder()
    data = enc.feed(
        [
            Role("assistant", "id", "m", 0),
            ReasoningDelta("a", "reasoning_content"),
            ReasoningDelta("b", "reasoning"),
            TextDelta("c"),
            RefusalDelta("d"),
            Keepalive("x"),
            TextDelta("e"),
            ReasoningDelta("f", "think"),
        ]
    )
    messages = [line["message"] for line in lines_of(data)]
    assert messages == [
        {"role": "assistant", "content": "", "thinking": "ab"},
        {"role": "assistant", "content": "cde"},
        {"role": "assistant", "content": "", "thinking": "f"},
    ]
    assert enc.sent and not enc.ended


def test_tool_calls_go_out_whole_before_the_final_object() -> None:
    enc = encoder()
    first = enc.feed([ToolCallStart(0, "c0", "f"), ToolCallDelta(0, '{"a":')])
    assert first == b""  # nothing to show until the arguments are whole
    data = enc.feed(
        [
            ToolCallDelta(0, " [1, 2]}"),
            ToolCallStart(1, "c1", "g"),
            Finish("tool_calls"),
            Usage(10, 5, 15),
            Done(),
        ]
    )
    lines = lines_of(data)
    assert lines[0]["message"]["tool_calls"] == [
        {"id": "c0", "function": {"index": 0, "name": "f", "arguments": {"a": [1, 2]}}},
        {"id": "c1", "function": {"index": 1, "name": "g", "arguments": {}}},
    ]
    assert lines[1]["done"] is True and lines[1]["done_reason"] == "stop"
    assert lines[1]["prompt_eval_count"] == 10 and lines[1]["eval_count"] == 5
    assert enc.feed([TextDelta("late")]) == b""


@pytest.mark.parametrize("arguments", ['{"a": 1', "[1]", "not json", '"text"'])
def test_arguments_that_are_not_an_object_fail(arguments: str) -> None:
    events: list[Event] = [ToolCallStart(0, "c0", "f"), ToolCallDelta(0, arguments), Finish("stop")]
    # Before any line: the edge can still answer with an HTTP error.
    enc = encoder()
    assert enc.feed(events) == b""
    assert enc.early_error is not None and enc.early_error.kind is ErrorKind.MODEL_OUTPUT
    assert "not a JSON object" in enc.early_error.message
    # After text: one error line.
    enc = encoder()
    lines = lines_of(enc.feed([TextDelta("calling"), *events]))
    assert lines[0]["message"]["content"] == "calling"
    assert set(lines[-1]) == {"error"} and "not a JSON object" in lines[-1]["error"]
    # Not streamed: an UpstreamError for the edge to answer.
    agg = ChatAggregator()
    for ev in events:
        agg.add(ev)
    with pytest.raises(UpstreamError):
        agg.response(model="m", metrics=fixed_metrics)


def test_a_failure_before_any_line_is_left_to_the_caller() -> None:
    error = UpstreamError(ErrorKind.TRANSIENT, "boom", status=500)
    enc = encoder()
    assert enc.feed([Role("assistant", "", "", 0), StreamError(error)]) == b""
    assert enc.early_error is error and enc.ended


def test_a_failure_after_output_is_one_error_line() -> None:
    error = UpstreamError(ErrorKind.TRANSIENT, "boom", status=500, in_stream=True)
    enc = encoder()
    data = enc.feed([TextDelta("partial")]) + enc.feed([StreamError(error), TextDelta("x")])
    lines = lines_of(data)
    assert lines[0]["message"]["content"] == "partial"
    assert lines[-1] == {"error": lines[-1]["error"]} and "boom" in lines[-1]["error"]
    assert len(lines) == 2 and enc.early_error is None


def test_metrics_fields() -> None:
    assert Metrics(5, 2, 3).fields() == {
        "total_duration": 5,
        "load_duration": 0,
        "prompt_eval_duration": 2,
        "eval_duration": 3,
    }
    assert Metrics(5, 2, 3, 7, 9).fields()["eval_count"] == 9
