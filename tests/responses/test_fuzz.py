"""Hostile and careless Responses requests through the whole app in process: whatever the body,
`/v1/responses` answers 200 or a 4xx in OpenAI's error shape naming the field, never a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.responses.support import CONFIG, Upstream
from tests.support.inprocess import InProcess, serve
from tests.test_bad_input import assert_openai_error, json_values, mostly

FIELDS = [
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "reasoning", "text", "metadata", "user", "prompt_cache_key",
    "include", "store", "previous_response_id", "truncation", "service_tier", "stream",
]  # fmt: skip
ITEMS = st.sampled_from(
    [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call_output", "call_id": "nobody", "output": "ok"},
        {"type": "reasoning", "summary": [], "encrypted_content": "svir1.1.AAAA"},
        {"type": "item_reference", "id": "x"},
        {"type": "bogus"},
    ]
)
bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {
            "model": mostly(st.sampled_from(["up/ok", "up/", "nope/m"])),
            "input": mostly(st.just("hi") | st.lists(ITEMS | json_values, max_size=4)),
        }
    ),
    st.dictionaries(
        st.sampled_from(FIELDS),
        json_values
        | st.sampled_from([5, True, "x", [5], [{}], {}, "resp_missing", [{"type": "web_search"}]]),
        max_size=3,
    ),
)


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with serve(tmp_path, CONFIG, Upstream()) as app:
        yield app


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=bodies | json_values)
async def test_responses_answers_only_200_or_openai_errors(svir: InProcess, body: Any) -> None:
    r = await svir.http.post("/v1/responses", content=msgspec.json.encode(body))
    assert r.status_code in (200, 400, 404), (r.status_code, r.text, body)
    if r.status_code != 200:
        error = assert_openai_error(r, r.status_code)
        if r.status_code == 400 and isinstance(body, dict):
            assert error["param"] or error["code"], error
