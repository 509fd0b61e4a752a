"""Anthropic in and Anthropic out, at the wire: a Messages request translated to the canonical chat
request (translate_request), then built as the anthropic upstream kind's body (messages_body),
gives the upstream what the client sent, so that a later turn loses nothing (cache marks, signed
and redacted thinking, tool results and their errors, the thinking setting). The same canonical
request gives every other kind its body of today: one system string, no Anthropic-only keys."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from svir.protocols.anthropic.request import translate_request
from svir.providers import build_upstream_body, get_kind
from svir.providers.anthropic_dialect import messages_body
from svir.wire.request import EFFORT_KEY, THINKING_KEY

E = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
SYSTEM = [
    {"type": "text", "text": "You are Claude Code.", "cache_control": E},
    {"type": "text", "text": "Tools follow.", "cache_control": HOUR},
    {"type": "text", "text": "Be brief."},
]
ASSISTANT = [
    {"type": "redacted_thinking", "data": "EncryptedBlob=="},
    {"type": "thinking", "thinking": "List it, then read it.", "signature": "SIG1"},
    {"type": "text", "text": "Looking."},
    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
    {
        "type": "tool_use",
        "id": "toolu_2",
        "name": "Bash",
        "input": {"command": "cat x"},
        "cache_control": E,
    },
]
RESULTS = [
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\n"},
    {
        "type": "tool_result",
        "tool_use_id": "toolu_2",
        "content": "no such file",
        "is_error": True,
        "cache_control": E,
    },
    {"type": "text", "text": "go on", "cache_control": E},
]
TOOLS = [
    {"name": "Bash", "description": "Runs a command", "input_schema": SCHEMA, "cache_control": E}
]


def request(thinking: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "model": "a/claude",
        "max_tokens": 8000,
        "system": SYSTEM,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "what's here?", "cache_control": E}],
            },
            {"role": "assistant", "content": ASSISTANT},
            {"role": "user", "content": RESULTS},
        ],
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},
        "thinking": thinking,
        **fields,
    }


class Provider:
    discover = None
    drop_params: tuple[str, ...] | None = None
    think_tags = None
    images = None
    api_version = None


def upstream_body(kind: str, chat: dict[str, Any]) -> dict[str, Any]:
    return build_upstream_body(chat, kind=get_kind(kind), provider=Provider(), model_id="m")


@pytest.mark.parametrize(
    ("thinking", "effort"),
    [
        ({"type": "enabled", "budget_tokens": 5000}, None),
        ({"type": "adaptive"}, "max"),
        ({"type": "disabled"}, None),
    ],
)
def test_what_the_client_sent_is_what_an_anthropic_upstream_gets(
    thinking: dict[str, Any], effort: str | None
) -> None:
    client = request(thinking, **({"output_config": {"effort": effort}} if effort else {}))
    sent = copy.deepcopy(client)
    chat = translate_request(client).chat
    got = upstream_body("anthropic", chat)
    assert client == sent  # nothing of the client's request is changed on the way
    assert got == messages_body(chat, "m")  # the kind's body is its builder's, nothing dropped

    # Equal: the system blocks with their marks, the thinking object, the tools with theirs,
    # the first user turn, the assistant turn (seals first, then text, the calls, the mark on
    # the call it was on).
    assert got["system"] == SYSTEM
    assert got["thinking"] == thinking
    assert got.get("output_config") == ({"effort": effort} if effort else None)
    assert got["tools"] == TOOLS
    assert got["tool_choice"] == {"type": "auto"}
    assert got["max_tokens"] == 8000
    first, assistant, results = got["messages"]
    assert first == client["messages"][0]
    assert assistant == {"role": "assistant", "content": ASSISTANT}
    # Equivalent: a failed result's text says "Error: " first, as every other upstream reads
    # it, beside the is_error flag itself; everything else of the turn is as it came.
    failed = {**RESULTS[1], "content": "Error: no such file"}
    assert results == {"role": "user", "content": [RESULTS[0], failed, RESULTS[2]]}


def test_claude_codes_unsigned_thinking_is_not_sent_back_to_anthropic() -> None:
    # Claude Code echoes svir's own thinking blocks with `signature: ""`: Anthropic refuses a
    # thinking block it did not sign, so it is left out (the reasoning reaches other upstreams).
    client = request({"type": "adaptive"})
    client["messages"][1] = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "mine", "signature": ""}, *ASSISTANT[2:]],
    }
    chat = translate_request(client).chat
    assert [b["type"] for b in upstream_body("anthropic", chat)["messages"][1]["content"]] == [
        "text",
        "tool_use",
        "tool_use",
    ]
    assert upstream_body("llamacpp", chat)["messages"][2]["reasoning_content"] == "mine"


@pytest.mark.parametrize("kind", ["openai-compatible", "openai", "llamacpp", "vllm", "kimi"])
def test_every_other_kind_gets_its_body_of_today(kind: str) -> None:
    settings = request({"type": "adaptive"}, output_config={"effort": "medium"})
    chat = translate_request(settings).chat
    got = upstream_body(kind, chat)
    system, first, assistant, ok, failed, rest = got["messages"]
    # One system string, as OpenAI-compatible servers (and their chat templates) take it.
    assert system == {
        "role": "system",
        "content": "You are Claude Code.\nTools follow.\nBe brief.",
    }
    assert first == {"role": "user", "content": "what's here?"}
    assert assistant["content"] == "Looking."
    assert "thinking_blocks" not in assistant and "cache_control" not in assistant
    assert failed == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such file"}
    assert ok == {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\n"}
    assert rest == {"role": "user", "content": "go on"}
    assert got["tools"] == [
        {
            "type": "function",
            "function": {"name": "Bash", "description": "Runs a command", "parameters": SCHEMA},
        }
    ]
    assert got["reasoning_effort"] == "medium"
    # The client's thinking object is Anthropic's: no other kind is sent it (Kimi, which reads a
    # `thinking` of its own, gets its default).
    assert THINKING_KEY not in got and EFFORT_KEY not in got and "output_config" not in got
    assert got.get("thinking") == ({"type": "disabled"} if kind == "kimi" else None)
    # The canonical request the other kinds were built from still holds it all.
    assert chat[THINKING_KEY] == {"type": "adaptive"} and chat[EFFORT_KEY] == "medium"
    assert chat["tools"][0]["cache_control"] == E


def test_an_openai_clients_own_thinking_still_reaches_kimi() -> None:
    chat = {"model": "k/m", "messages": [{"role": "user", "content": "x"}]}
    got = upstream_body("kimi", {**chat, "thinking": {"type": "enabled"}})
    assert got["thinking"] == {"type": "enabled"}
