"""Every upstream behaviour of the conformance corpus reaches an Anthropic client correctly: each
recorded stream is decoded as svir decodes it, encoded for the Messages API, and assembled by the
official SDK into the text, reasoning and tool calls the corpus expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.anthropic.sdk import check_as_expected, check_grammar, encode, stream
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
    check_as_expected(expect, got.message, got.error)
