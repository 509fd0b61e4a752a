"""Every upstream behaviour of the conformance corpus reaches an Anthropic client correctly: each
recorded stream is decoded as svir decodes it, encoded for the Messages API, and assembled by the
official SDK into the text, reasoning and tool calls the corpus expects."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from svir.wire.anthropic import stop_reason, tool_input
from tests.anthropic.sdk import blocks, check_grammar, encode, stream, text_of, thinking_of
from tests.conformance.summary import decode

CORPUS = Path(__file__).parents[1] / "conformance" / "decoder"
CASES = sorted(p.stem for p in CORPUS.glob("*.sse"))


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", CASES)
def test_corpus_stream_through_the_sdk(name: str) -> None:
    spec = json.loads((CORPUS / f"{name}.json").read_text())
    expect = spec["expect"]
    events = decode([(CORPUS / f"{name}.sse").read_bytes()], spec["options"])
    body = encode(events)
    check_grammar(body)
    got = stream(body)
    answer = expect["answer"] + (expect["refusal"] or "")
    calls = [(c["id"], c["name"], tool_input(c["arguments"])) for c in expect["tool_calls"]]
    assembled = [(b.id, b.name, b.input) for b in blocks(got.message, "tool_use")]
    if expect["error"] is None:
        assert got.error is None
        m = got.message
        assert text_of(m) == answer
        assert thinking_of(m) == expect["reasoning"]
        # Blocks come in the order the calls started (a stream cannot go back), which is not
        # always the calls' index order (interleaved-tools starts index 1 first).
        assert sorted(assembled, key=str) == sorted(calls, key=str)
        assert m.stop_reason == stop_reason(expect["finish_reason"], tool_use=bool(calls))
        usage = expect["usage"]
        if usage is not None:
            cached = usage["cached_tokens"] or 0
            assert m.usage.input_tokens == usage["prompt_tokens"] - cached
            assert m.usage.output_tokens == usage["completion_tokens"]
            assert m.usage.cache_read_input_tokens == usage["cached_tokens"]
    else:
        # A failed stream raises, with what streamed before the failure assembled.
        assert isinstance(got.error, anthropic.APIStatusError)
        assert expect["answer"].startswith(text_of(got.message))
        assert expect["reasoning"].startswith(thinking_of(got.message))
