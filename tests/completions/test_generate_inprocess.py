"""Ollama's `POST /api/generate` through the whole app in process, driven by the `ollama` client:
a templated prompt is a chat of one turn, `raw` and `suffix` are text completions sent to the
upstream's completion endpoint, the answer is `response` lines (or one object) with counts and
durations, and the empty prompt loads the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.completions.test_completions_inprocess import CONFIG, ENV, llama_stream, upstream
from tests.support.inprocess import serve
from tests.support.mock_transport import MockRequest, MockResponse, sse

CHAT = sse(
    {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": " there"}}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    "[DONE]",
)


def handler(request: MockRequest) -> MockResponse:
    if request.path.endswith("/chat/completions"):
        return MockResponse(body=CHAT)
    return upstream(request)


@pytest.fixture
async def svir(tmp_path: Path) -> Any:
    async with serve(tmp_path, CONFIG, handler, ENV) as app:
        yield app


def client(svir: Any) -> ollama.AsyncClient:
    return ollama.AsyncClient(
        host="http://svir", transport=httpx.ASGITransport(app=svir.app), timeout=20
    )


async def test_generate_with_suffix_is_fim_through_infill(svir: Any) -> None:
    answer = await client(svir).generate(
        model="lab/qwen-coder",
        prompt="def add(a, b):\n    ",
        suffix="\n",
        options={"num_predict": 8, "temperature": 0, "top_k": 20, "stop": ["\n\n"]},
    )
    assert answer.response == "return a + b"
    assert answer.done is True and answer.done_reason == "length"
    assert answer.eval_count == 2 and answer.prompt_eval_count == 7
    assert isinstance(answer.total_duration, int) and answer.total_duration >= 0
    sent = svir.transport.requests[-1]
    assert sent.url == "http://lab.test/infill"
    body = sent.json()
    assert body["input_prefix"] == "def add(a, b):\n    " and body["input_suffix"] == "\n"
    assert (body["n_predict"], body["top_k"], body["stop"]) == (8, 20, ["\n\n"])


async def test_generate_streamed_lines_carry_response_then_done(svir: Any) -> None:
    parts = [
        part
        async for part in await client(svir).generate(
            model="lab/qwen-coder", prompt="a", raw=True, stream=True
        )
    ]
    assert "".join(p.response for p in parts) == " Paris."
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 2
    assert parts[-1].context is None  # svir keeps no token context
    assert svir.transport.requests[-1].url == "http://lab.test/completion"


async def test_raw_wire_lines_are_ndjson_with_response(svir: Any) -> None:
    r = await svir.http.post(
        "/api/generate", json={"model": "lab/x", "prompt": "p", "raw": True, "stream": True}
    )
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert all("response" in line and "message" not in line for line in lines)
    assert lines[-1]["done"] is True and "context" not in lines[-1]
    assert {"total_duration", "eval_count", "prompt_eval_count", "eval_duration"} <= set(lines[-1])


async def test_templated_generate_is_a_chat_of_one_turn(svir: Any) -> None:
    answer = await client(svir).generate(
        model="lab/qwen-coder", prompt="hello", system="be brief", think=False
    )
    assert answer.response == "Hi there"
    body = svir.transport.requests[-1].json()
    assert svir.transport.requests[-1].url == "http://lab.test/v1/chat/completions"
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert body["reasoning_effort"] == "none"


async def test_suffix_for_a_model_without_fim_is_an_ollama_400(svir: Any) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        await client(svir).generate(model="lab/gemma", prompt="a", suffix="b")
    assert caught.value.status_code == 400
    assert "'lab/gemma' cannot fill in the middle" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        await client(svir).generate(model="oc/m", prompt="a", suffix="b")
    assert "fim = true" in caught.value.error


async def test_empty_prompt_loads_and_keep_alive_zero_unloads(svir: Any) -> None:
    loaded = await client(svir).generate(model="lab/qwen-coder")
    assert loaded.done_reason == "load" and loaded.response == ""
    unloaded = await client(svir).generate(model="lab/qwen-coder", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert svir.transport.requests == []  # nothing to load on a server svir does not run


async def test_unknown_model_is_ollamas_404(svir: Any) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        await client(svir).generate(model="nope/x", prompt="a", raw=True)
    assert caught.value.status_code == 404
    assert caught.value.error == "model 'nope/x' not found"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": "a", "raw": True, "system": "s"}, "raw mode does not support template"),
        ({"prompt": "a", "template": "{{ .Prompt }}"}, "template is not supported"),
        ({"prompt": "a", "context": [1, 2]}, "context is not supported"),
        ({"prompt": "a", "raw": True, "format": "json"}, "format is not supported with raw"),
        ({"prompt": "a", "suffix": "b", "images": ["aGk="]}, "images is not supported with"),
        ({"prompt": 3}, "prompt must be a string"),
        ({"prompt": "a", "raw": "yes"}, "raw must be a boolean"),
        ({"prompt": "a", "options": {"top_k": "many"}, "raw": True}, "options.top_k"),
        ({"prompt": "a", "options": {"num_predict": "x"}}, "options.num_predict"),
    ],
)
async def test_bad_generate_requests_are_ollama_400s(
    svir: Any, body: dict[str, Any], words: str
) -> None:
    r = await svir.http.post("/api/generate", json={"model": "lab/x", **body})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]
    assert svir.transport.requests == []


async def test_midstream_failure_is_one_error_line(tmp_path: Path) -> None:
    def broken(request: MockRequest) -> MockResponse:
        return MockResponse(body=[*llama_stream("par")[:1], *sse({"error": {"message": "boom"}})])

    async with serve(tmp_path, CONFIG, broken, ENV) as app:
        r = await app.http.post(
            "/api/generate", json={"model": "lab/x", "prompt": "p", "raw": True}
        )
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[0]["response"] == "par"
    assert lines[-1] == {"error": "boom"}


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


async def test_templated_generate_takes_images_and_format_as_chat_does(svir: Any) -> None:
    answer = await client(svir).generate(
        model="lab/qwen-coder", prompt="what is this?", images=[PNG], format="json"
    )
    assert answer.response == "Hi there"
    body = svir.transport.requests[-1].json()
    [user] = body["messages"]
    assert user["content"][0] == {"type": "text", "text": "what is this?"}
    assert user["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert body["response_format"] == {"type": "json_object"}
