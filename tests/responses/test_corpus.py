"""Every upstream behaviour of the conformance corpus reaches a Responses client correctly: each
recorded stream (OpenAI-style servers and Anthropic's) is decoded as svir decodes it, encoded as
the Responses stream, and assembled by the official SDK's `responses.stream` accumulator into
the reasoning items, message, function calls, end and error code the corpus expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.summary import decode
from tests.responses.sdk import check_codex, check_grammar, encode, encoder, stream

CONFORMANCE = Path(__file__).parents[1] / "conformance"
CASES = sorted(f"decoder/{p.stem}" for p in (CONFORMANCE / "decoder").glob("*.sse")) + sorted(
    f"anthropic/{p.stem}" for p in (CONFORMANCE / "anthropic").glob("*.sse")
)
# The error code a Responses client acts on, for each kind of upstream failure.
CODES = {
    "context_overflow": "context_length_exceeded",
    "rate_limited": "rate_limit_exceeded",
    "transient": "server_error",
    "other": "server_error",
    "incomplete": "server_error",
    "model_output": "server_error",
}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def test_the_corpus_is_there() -> None:
    assert len([c for c in CASES if c.startswith("decoder/")]) >= 30
    assert len([c for c in CASES if c.startswith("anthropic/")]) >= 8


def _parts(response: Any, kind: str) -> str:
    out = []
    for item in response.output:
        if item.type == "message":
            for c in item.content:
                if c.type == kind:
                    out.append(c.text if kind == "output_text" else c.refusal)
    return "".join(out)


def _reasoning(response: Any) -> str:
    out = []
    for item in response.output:
        if item.type == "reasoning":
            out.extend(p.text for p in item.summary)
            out.extend(c.text for c in item.content or ())
    return "".join(out)


@pytest.mark.parametrize("summary", [None, "auto"])
@pytest.mark.parametrize("name", CASES)
def test_corpus_stream_through_the_sdk(name: str, summary: str | None) -> None:
    spec = json.loads((CONFORMANCE / f"{name}.json").read_text())
    expect = spec["expect"]
    events = decode([(CONFORMANCE / f"{name}.sse").read_bytes()], spec["options"], spec["server"])
    enc = encoder(summary=summary, seal=lambda text: "sealed")
    body = encode(events, enc)
    frames = check_grammar(body)
    check_codex(frames)
    got = stream(body)
    end = frames[-1]
    assert end["response"] == enc.response  # the stored object is the streamed one
    error = expect["error"]
    if error is not None:
        # In-stream errors and truncation fail the response, with what came before it.
        assert got.final is None and got.last.status == "failed"
        assert got.last.error.code == CODES[error["kind"]]
        assert expect["answer"].startswith(_parts(got.last, "output_text"))
        assert expect["reasoning"].startswith(_reasoning(got.last))
        done = [f["item"]["type"] for f in frames if f["type"] == "response.output_item.done"]
        assert "function_call" not in done  # a call cut with its stream is never run
        return
    response = got.final if got.final is not None else got.last
    finish = expect["finish_reason"]
    if finish in INCOMPLETE:
        assert got.final is None and response.status == "incomplete"
        assert response.incomplete_details.reason == INCOMPLETE[finish]
    else:
        assert response.status == "completed"
    assert _parts(response, "output_text") == expect["answer"]
    assert _parts(response, "refusal") == (expect["refusal"] or "")
    assert _reasoning(response) == expect["reasoning"]
    rs = [i for i in response.output if i.type == "reasoning"]
    assert all(i.encrypted_content == "sealed" for i in rs)
    if summary is None:
        assert all(i.summary == [] for i in rs)
    calls = [(c["id"], c["name"], c["arguments"]) for c in expect["tool_calls"]]
    assembled = [
        (i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"
    ]
    # One item each, in the order the calls started (interleaved-tools starts index 1 first).
    assert sorted(assembled) == sorted(calls)
    assert all(i.id.startswith("fc_") for i in response.output if i.type == "function_call")
    usage = expect["usage"]
    if usage is None:
        assert response.usage is None
    else:
        assert response.usage.input_tokens == usage["prompt_tokens"]
        assert response.usage.output_tokens == usage["completion_tokens"]
        assert response.usage.total_tokens == usage["total_tokens"]
        assert response.usage.input_tokens_details.cached_tokens == (usage["cached_tokens"] or 0)
        assert response.usage.output_tokens_details.reasoning_tokens == (
            usage["reasoning_tokens"] or 0
        )
