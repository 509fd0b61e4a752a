"""Every recorded stream decodes to its expected result, however the bytes are split."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.summary import decode, matches, summarize

CORPUS = Path(__file__).parent / "decoder"
# Anthropic's Messages streams, which the upstream kind `anthropic` decodes.
ANTHROPIC = Path(__file__).parent / "anthropic"
CASES = sorted(p.stem for p in CORPUS.glob("*.sse")) + sorted(
    f"anthropic/{p.stem}" for p in ANTHROPIC.glob("*.sse")
)


def load(name: str) -> tuple[bytes, dict]:
    base = CORPUS.parent / name if name.startswith("anthropic/") else CORPUS / name
    raw = base.with_suffix(".sse").read_bytes()
    return raw, json.loads(base.with_suffix(".json").read_text())


def decode_case(chunks: list[bytes], spec: dict) -> dict:
    return summarize(decode(chunks, spec["options"], spec["server"]))


def test_corpus_is_complete() -> None:
    required = {
        "lmstudio-reasoning", "lmstudio-error", "mlx-lm", "mlx-vlm", "llama-cpp",
        "llama-cpp-error", "vllm-named-tool", "vllm-no-reasoning-parser", "azure",
        "azure-async", "azure-async-flagged", "interleaved-tools", "refusal", "truncated",
        "crlf-multiline",
    }  # fmt: skip
    assert required <= set(CASES), sorted(required - set(CASES))
    anthropic = {
        "text", "thinking", "redacted-thinking", "tool-use", "error-overloaded", "max-tokens",
        "refusal", "truncated", "pause-turn",
    }  # fmt: skip
    assert {f"anthropic/{n}" for n in anthropic} <= set(CASES)
    for name in CASES:
        assert load(name)[1]["expect"], name


@pytest.mark.parametrize("name", CASES)
def test_whole(name: str) -> None:
    raw, spec = load(name)
    got = decode_case([raw], spec)
    assert matches(got, spec["expect"]) == []


@pytest.mark.parametrize("name", CASES)
def test_byte_by_byte(name: str) -> None:
    raw, spec = load(name)
    got = decode_case([raw[i : i + 1] for i in range(len(raw))], spec)
    assert matches(got, spec["expect"]) == []


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_splits(name: str, data: st.DataObject) -> None:
    raw, spec = load(name)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(raw)), max_size=30))))
    bounds = [0, *cuts, len(raw)]
    chunks = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    got = decode_case(chunks, spec)
    assert matches(got, spec["expect"]) == []
