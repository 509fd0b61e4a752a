"""What the official SDK sends is what the translation takes: requests written by the SDK's own
serializer (typed params, tools, thinking, images, documents, count_tokens) are captured at its
transport, translated, and answered from svir's wire core."""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import httpx2
import msgspec

from svir.protocols.anthropic.encode import MessageAggregator
from svir.protocols.anthropic.request import count_tokens, translate_request
from svir.wire.events import Done, Finish, TextDelta

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()


def capturing_client(sent: list[dict[str, Any]]) -> anthropic.Anthropic:
    """A client whose requests are translated by svir, and answered: count_tokens with svir's
    estimate, a message with a short answer."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        sent.append(body)
        if request.url.path.endswith("/count_tokens"):
            return httpx2.Response(200, json={"input_tokens": count_tokens(body)})
        translated = translate_request(body)
        fold = MessageAggregator()
        for e in (
            TextDelta(f"{len(translated.chat['messages'])} messages"),
            Finish("stop"),
            Done(),
        ):
            fold.add(e)
        message = fold.message(id="r", model=body["model"], input_tokens=count_tokens(body))
        return httpx2.Response(
            200, content=msgspec.json.encode(message), headers={"content-type": "application/json"}
        )

    return anthropic.Anthropic(
        api_key="x",
        base_url="http://svir.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )


CONVERSATION: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look at this and the notes."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {
                "type": "document",
                "title": "notes.txt",
                "source": {"type": "text", "media_type": "text/plain", "data": "n1"},
            },
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Check the weather.", "signature": ""},
            {"type": "tool_use", "id": "toolu_9", "name": "weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "-3 C", "is_error": False}
        ],
    },
]
TOOLS: list[Any] = [
    {
        "name": "weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def test_an_sdk_request_translates_and_the_answer_reads_back() -> None:
    sent: list[dict[str, Any]] = []
    m = capturing_client(sent).messages.create(
        model="claude-haiku-4-5",
        max_tokens=256,
        system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}],
        messages=CONVERSATION,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
        stop_sequences=["###"],
        # SDK 2.x dropped the sampling parameters from its signature; older clients send them.
        extra_body={"temperature": 0.2, "top_k": 20},
        metadata={"user_id": "u-1"},
    )
    got = translate_request(sent[0])
    chat = got.chat
    assert [x["role"] for x in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["reasoning_content"] == "Check the weather."
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_9", "content": "-3 C"}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "low"
    assert (chat["stop"], chat["temperature"], chat["top_k"], chat["max_tokens"]) == (
        ["###"],
        0.2,
        20,
        256,
    )
    assert got.user_id == "u-1" and got.warnings == ()
    assert m.content[0].text == "4 messages" and m.stop_reason == "end_turn"
    assert m.usage.input_tokens == count_tokens(sent[0]) > 1000  # the image counts


def test_sdk_count_tokens_counts_the_whole_request() -> None:
    sent: list[dict[str, Any]] = []
    client = capturing_client(sent)
    short = client.messages.count_tokens(
        model="claude-x", messages=[{"role": "user", "content": "hi"}]
    )
    full = client.messages.count_tokens(
        model="claude-x",
        system="Be terse.",
        messages=CONVERSATION,
        tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert 0 < short.input_tokens < full.input_tokens
    assert "max_tokens" not in sent[0]  # count_tokens bodies have none, and need none
