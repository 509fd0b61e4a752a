"""Claude behind the OpenAI API: the OpenAI SDK against svir's whole app in this process, over a
`tests.support.mock_transport.MockTransport` that plays Anthropic (the recorded streams of
tests/conformance/anthropic, and its errors), with every request svir sent it checked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from svir.config.load import parse_config
from svir.errors import ConfigError
from tests.support.inprocess import InProcess
from tests.support.mock_transport import MockRequest, MockResponse

CORPUS = Path(__file__).parent / "conformance" / "anthropic"
KEY = "sk-ant-api03-test-key-0123456789"
CONFIG = """
[[providers]]
name = "claude"
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
discover = false
models = ["text", "thinking", "tool-use", "error-overloaded"]
"""
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather at a place",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}


MODELS = {
    "data": [
        {"type": "model", "id": "claude-opus-4-1", "display_name": "Claude Opus 4.1"},
        {"type": "model", "id": "claude-haiku-4-5", "display_name": "Claude Haiku 4.5"},
    ],
    "has_more": False,
}


def anthropic_error(status: int, type_: str, message: str, **headers: str) -> MockResponse:
    body = {"type": "error", "error": {"type": type_, "message": message}}
    return MockResponse.json(body, status, {"request-id": "req_011", **headers})


class Anthropic:
    """The scripted Anthropic API: the model names a recorded stream, or an error."""

    def __init__(self) -> None:
        self.requests: list[MockRequest] = []

    def __call__(self, request: MockRequest) -> MockResponse:
        self.requests.append(request)
        if request.method == "GET":
            return MockResponse.json(MODELS)
        model = request.json()["model"]
        if model == "overloaded":
            return anthropic_error(529, "overloaded_error", "Overloaded")
        if model == "too-long":
            return anthropic_error(
                400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
            )
        if model == "limited":
            return anthropic_error(429, "rate_limit_error", "Slow down", **{"retry-after": "7"})
        return MockResponse(body=[(CORPUS / f"{model}.sse").read_bytes()])

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests]


class Svir(InProcess):
    def __init__(self, tmp: Path, config: str = CONFIG) -> None:
        self.upstream = Anthropic()
        super().__init__(tmp, config, self.upstream, {"ANTHROPIC_API_KEY": KEY})


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[Svir]:
    s = Svir(tmp_path)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_a_streamed_answer_and_the_request_anthropic_got(svir: Svir) -> None:
    stream = await svir.client.chat.completions.create(
        model="claude/text",
        messages=[{"role": "system", "content": "Be kind."}, user("Say hello in French.")],
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.7,
        stop=["###"],
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello! Comment ça va — très bien 🙂"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (2060, 15)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 2048

    (request,) = svir.upstream.requests
    assert request.url == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in request.headers
    assert not any(h.lower() == "anthropic-beta" for h in request.headers)
    assert request.json() == {
        "model": "text",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello in French."}]}
        ],
        "stream": True,
        "system": [{"type": "text", "text": "Be kind."}],
        "max_tokens": 4096,
        "temperature": 0.7,
        "stop_sequences": ["###"],
    }


async def test_reasoning_and_its_signature_come_back_on_the_next_turn(svir: Svir) -> None:
    first = await svir.client.chat.completions.create(
        model="claude/thinking", messages=[user("GCD of 1071 and 462?")], reasoning_effort="low"
    )
    message = first.choices[0].message
    assert message.content == "The greatest common divisor of 1071 and 462 is **21**."
    extra = message.model_extra or {}
    assert extra["reasoning_content"].startswith("I need to find the GCD")
    (block,) = extra["thinking_blocks"]
    assert block["signature"].startswith("EqQBCgIYAhIM")
    assert first.usage is not None
    assert first.usage.completion_tokens_details is not None
    assert first.usage.completion_tokens_details.reasoning_tokens == 160
    assert svir.upstream.bodies()[0]["thinking"] == {"type": "enabled", "budget_tokens": 1024}

    # The client sends the message back as it got it: the thinking block goes back signed.
    await svir.client.chat.completions.create(
        model="claude/text",
        messages=[user("GCD of 1071 and 462?"), message.model_dump(), user("And of 12 and 18?")],
    )
    assistant = svir.upstream.bodies()[1]["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]},
            {"type": "text", "text": message.content},
        ],
    }


async def test_tool_calls_and_their_results_grouped_in_one_user_message(svir: Svir) -> None:
    first = await svir.client.chat.completions.create(
        model="claude/tool-use", messages=[user("Weather in SF, and the time?")], tools=[TOOL]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (
            "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "get_weather",
            {"location": "San Francisco, CA", "unit": "fahrenheit"},
        ),
        ("toolu_01Ab2Cd3Ef4Gh5Ij6Kl7Mn8", "get_time", {}),
    ]
    assert svir.upstream.bodies()[0]["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather at a place",
            "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
        }
    ]

    history = [
        user("Weather in SF, and the time?"),
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "59°F, fog"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "10:42"},
    ]
    await svir.client.chat.completions.create(model="claude/text", messages=history, tools=[TOOL])
    sent = svir.upstream.bodies()[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": calls[0].id, "content": "59°F, fog"},
        {"type": "tool_result", "tool_use_id": calls[1].id, "content": "10:42"},
    ]


async def test_tool_calls_streamed(svir: Svir) -> None:
    stream = await svir.client.chat.completions.create(
        model="claude/tool-use", messages=[user("?")], tools=[TOOL], stream=True
    )
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    finish = None
    async for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or ():
            if call.function and call.function.name:
                names[call.index] = call.function.name
            piece = call.function.arguments if call.function else None
            args[call.index] = args.get(call.index, "") + (piece or "")
        finish = chunk.choices[0].finish_reason or finish
    assert names == {0: "get_weather", 1: "get_time"}
    assert json.loads(args[0]) == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert args[1] == "{}"
    assert finish == "tool_calls"


async def test_a_paused_turn_is_a_stop_in_chat_completions(svir: Svir) -> None:
    # pause_turn: Anthropic paused a server tool's long turn (web search). The answer so far is
    # an ordinary stop, and the server tool's blocks are no tool call for the client to run.
    paused = "claude/pause-turn"
    completion = await svir.client.chat.completions.create(model=paused, messages=[user("x")])
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == "I'll search for that." and not choice.message.tool_calls
    stream = await svir.client.chat.completions.create(
        model=paused, messages=[user("x")], stream=True
    )
    finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert [f for f in finishes if f is not None] == ["stop"]


async def test_a_paused_turn_ends_the_turn_for_the_other_front_ends(svir: Svir) -> None:
    paused = "claude/pause-turn"
    # The Messages API: a stop is `end_turn`, streamed or not.
    http2 = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=svir.app), base_url="http://svir", timeout=20
    )
    messages = anthropic.AsyncAnthropic(
        api_key="unused", base_url="http://svir", max_retries=0, http_client=http2
    ).messages
    try:
        message = await messages.create(model=paused, max_tokens=64, messages=[user("x")])
        assert message.stop_reason == "end_turn"
        assert [b.type for b in message.content] == ["text"]
        async with messages.stream(model=paused, max_tokens=64, messages=[user("x")]) as s:
            streamed = await s.get_final_message()
        assert streamed.stop_reason == "end_turn"
    finally:
        await http2.aclose()
    # The Responses API: a completed response, not an incomplete one.
    response = await svir.client.responses.create(model=paused, input="x", store=False)
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "I'll search for that."
    # Ollama's API: `done_reason` stop.
    r = await svir.http.post(
        "/api/chat", json={"model": paused, "messages": [user("x")], "stream": False}
    )
    assert r.status_code == 200 and r.json()["done_reason"] == "stop"


async def test_an_overloaded_api_is_retried_then_a_server_error(svir: Svir) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await svir.client.chat.completions.create(model="claude/overloaded", messages=[user("x")])
    # Anthropic's busy server is svir's failed upstream (502), after the retries.
    assert info.value.status_code == 502
    assert len(svir.upstream.requests) == 3  # the provider's attempts
    assert len(svir.slept) == 2


async def test_a_rate_limit_is_retried_then_a_429_with_retry_after(svir: Svir) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        await svir.client.chat.completions.create(model="claude/limited", messages=[user("x")])
    assert len(svir.upstream.requests) == 3
    assert info.value.response.headers["retry-after"] == "7"


async def test_a_prompt_too_long_is_context_length_exceeded(svir: Svir) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await svir.client.chat.completions.create(model="claude/too-long", messages=[user("x")])
    assert len(svir.upstream.requests) == 1
    body: Any = info.value.body
    assert body["code"] == "context_length_exceeded"
    assert body["message"].startswith(
        "This model's maximum context length is 200000 tokens. However, your messages resulted in"
        " 208310 tokens."
    )


async def test_an_error_event_after_text_ends_the_stream_with_an_error(svir: Svir) -> None:
    stream = await svir.client.chat.completions.create(
        model="claude/error-overloaded", messages=[user("x")], stream=True
    )
    text = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            text.append(chunk.choices[0].delta.content or "")
    assert "".join(text) == "Once upon"
    assert "Overloaded" in info.value.message
    assert len(svir.upstream.requests) == 1  # output had gone out: no retry


async def test_relay_is_refused_for_the_anthropic_kind() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG + "relay = true\n")
    assert info.value.field == "providers[0].relay"


async def test_models_are_listed_from_anthropics_list(tmp_path: Path) -> None:
    s = Svir(tmp_path, CONFIG.replace("discover = false", "discover = true"))
    await s.start()
    try:
        listed = [m.id async for m in s.client.models.list()]
    finally:
        await s.stop()
    assert {"claude/claude-opus-4-1", "claude/claude-haiku-4-5", "claude/text"} <= set(listed)
    (request,) = [r for r in s.upstream.requests if r.method == "GET"]
    assert request.url == "https://api.anthropic.com/v1/models?limit=1000"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
