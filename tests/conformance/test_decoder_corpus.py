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
CASES = sorted(p.stem for p in CORPUS.glob("*.sse"))


def load(name: str) -> tuple[bytes, dict]:
    return (CORPUS / f"{name}.sse").read_bytes(), json.loads((CORPUS / f"{name}.json").read_text())


def test_corpus_is_complete() -> None:
    required = {
        "lmstudio-reasoning", "lmstudio-error", "mlx-lm", "mlx-vlm", "llama-cpp",
        "llama-cpp-error", "vllm-named-tool", "vllm-no-reasoning-parser", "azure",
        "azure-async", "azure-async-flagged", "interleaved-tools", "refusal", "truncated",
        "crlf-multiline",
    }  # fmt: skip
    assert required <= set(CASES), sorted(required - set(CASES))
    for name in CASES:
        assert (CORPUS / f"{name}.json").exists(), name


@pytest.mark.parametrize("name", CASES)
def test_whole(name: str) -> None:
    raw, spec = load(name)
    got = summarize(decode([raw], spec["options"]))
    assert matches(got, spec["expect"]) == []


@pytest.mark.parametrize("name", CASES)
def test_byte_by_byte(name: str) -> None:
    raw, spec = load(name)
    got = summarize(decode([raw[i : i + 1] for i in range(len(raw))], spec["options"]))
    assert matches(got, spec["expect"]) == []


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_splits(name: str, data: st.DataObject) -> None:
    raw, spec = load(name)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(raw)), max_size=30))))
    bounds = [0, *cuts, len(raw)]
    chunks = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    got = summarize(decode(chunks, spec["options"]))
    assert matches(got, spec["expect"]) == []
