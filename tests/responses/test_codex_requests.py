"""The request bodies Codex 0.169 was recorded sending (tests/responses/codex/, docs/responses.md
"Codex 0.169 in detail"), each sent to the whole app in process with Codex's headers: answered
with a stream Codex's parser takes, and the upstream gets the chat request that conversation
means (its tools flat, the namespace ones under their flat names, web_search dropped, a turn's
text and calls one assistant message, each output the tool message of its call)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.responses.sdk import check_codex, frames
from tests.responses.support import CONFIG, Upstream
from tests.support.inprocess import InProcess, serve

CAPTURED = Path(__file__).parent / "codex"
HEADERS = {
    k: v
    for k, v in json.loads((CAPTURED / "headers.json").read_text())["headers"].items()
    if k not in ("host", "content-length", "authorization")
}


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[tuple[InProcess, Upstream]]:
    upstream = Upstream()
    async with serve(tmp_path, CONFIG, upstream) as app:
        yield app, upstream


async def codex_turn(svir: tuple[InProcess, Upstream], name: str) -> tuple[Any, dict[str, Any]]:
    """The recorded body `name` sent as Codex sent it (to the scripted agent model): svir's
    answer, and the chat request the upstream got."""
    app, upstream = svir
    body = json.loads((CAPTURED / name).read_text())
    body["model"] = "up/agent"
    answer = await app.http.post(
        "/v1/responses", json=body, headers={**HEADERS, "authorization": "Bearer k"}
    )
    assert answer.status_code == 200, answer.text
    events = frames(answer.content)
    check_codex(events)
    assert events[-1]["type"] == "response.completed", events[-1]
    (chat,) = [r.json() for r in upstream.agent.requests]
    return answer, chat


def tools(chat: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in chat.get("tools") or ()}


async def test_the_first_turn(svir: tuple[InProcess, Upstream]) -> None:
    answer, chat = await codex_turn(svir, "turn1.json")
    # Codex's two developer messages are the one system message; then its two user messages.
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "user"]
    assert "Codex CLI" in chat["messages"][0]["content"]
    assert {"exec_command", "write_stdin", "multi_agent_v1__close_agent"} <= tools(chat)
    assert "web_search" not in tools(chat) and "web_search" in answer.headers["x-svir-warning"]
    assert chat["stream"] is True and chat["parallel_tool_calls"] is True


async def test_the_turn_after_a_shell_call(svir: tuple[InProcess, Upstream]) -> None:
    _, chat = await codex_turn(svir, "turn2.json")
    call, result = chat["messages"][-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["id"] == "call_1"
    assert call["tool_calls"][0]["function"]["name"] == "exec_command"
    assert result == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": json.loads((CAPTURED / "turn2.json").read_text())["input"][-1]["output"],
    }


async def test_text_and_parallel_calls_are_one_assistant_turn(
    svir: tuple[InProcess, Upstream],
) -> None:
    _, chat = await codex_turn(svir, "turn2-text-and-calls.json")
    assistant, first, second = chat["messages"][-3:]
    assert assistant["role"] == "assistant" and assistant["content"] == "I will write the file."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1", "call_2"]
    assert (first["tool_call_id"], second["tool_call_id"]) == ("call_1", "call_2")


async def test_a_known_openai_models_turn(svir: tuple[InProcess, Upstream]) -> None:
    answer, chat = await codex_turn(svir, "gpt-5.5-turn1.json")
    # apply_patch is a grammar tool and tool_search a hosted one: dropped, said in the warning.
    assert "exec_command" in tools(chat) and not {"apply_patch", "tool_search"} & tools(chat)
    assert "apply_patch" in answer.headers["x-svir-warning"]
    assert chat["reasoning_effort"] == "medium"


@pytest.mark.parametrize("name", ["additional-tools-turn1.json", "additional-tools-turn2.json"])
async def test_additional_tools_are_offered(svir: tuple[InProcess, Upstream], name: str) -> None:
    _, chat = await codex_turn(svir, name)
    # The namespace `functions` is offered under the bare names, the others flat.
    assert {"wait", "request_user_input", "clock__sleep", "collaboration__spawn_agent"} <= tools(
        chat
    )
    assert "exec" not in tools(chat)  # its JavaScript grammar tool
