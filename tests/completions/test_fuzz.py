"""The completion request parsers, fuzzed: any JSON value gives the canonical request or the
front end's own error, and every canonical request gives a body each upstream dialect can be
sent (JSON, the prompt where that dialect takes it)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.errors import OllamaError
from svir.protocols.completions.request import CompletionRequestError, parse_completion_request
from svir.protocols.ollama.request import to_generate_request
from svir.wire.completions import (
    is_completion,
    is_fim,
    llama_body,
    openai_body,
)
from tests.test_bad_input import json_values

FIELDS = [
    "prompt", "suffix", "max_tokens", "stream", "stop", "echo", "logprobs", "n", "best_of",
    "temperature", "top_p", "seed", "stream_options", "user", "logit_bias", "raw", "system",
    "template", "images", "format", "options", "think", "keep_alive", "context", "name",
]  # fmt: skip
bodies = st.builds(
    lambda model, extra: {"model": model, **extra},
    st.sampled_from(["lab/m", "", 3, None]),
    st.dictionaries(
        st.sampled_from(FIELDS),
        json_values
        | st.sampled_from(["x", "", ["a"], [1, 2], 0, 1, True, {"num_predict": 4, "top_k": 3}]),
        max_size=5,
    ),
)


def check_bodies(request: dict[str, Any]) -> None:
    assert is_completion(request)
    for build in (llama_body, openai_body):
        body = build(request, "m")
        msgspec.json.encode(body)
        assert body["stream"] is True
    native = llama_body(request, "m")
    if is_fim(request):
        assert native["input_prefix"] == request["prompt"] and "prompt" not in native
    else:
        assert native["prompt"] == request["prompt"] and "input_suffix" not in native


@settings(max_examples=400, deadline=None)
@given(body=bodies | json_values)
def test_completions_parser_raises_only_its_error(body: Any) -> None:
    try:
        request = parse_completion_request(body)
    except CompletionRequestError as exc:
        message = exc.message
        assert message
        return
    assert isinstance(request["prompt"], str) and request["max_tokens"] >= 1
    check_bodies(request)


@settings(max_examples=400, deadline=None)
@given(body=bodies | json_values)
def test_generate_translation_raises_only_ollama_errors(body: Any) -> None:
    try:
        request = to_generate_request(body)
    except OllamaError as exc:
        status, message = exc.status, exc.message
        assert status == 400 and message
        return
    if is_completion(request):
        check_bodies(request)
    else:
        assert isinstance(request["messages"], list)
