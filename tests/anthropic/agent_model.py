"""A scripted OpenAI-compatible model that plays an agent's model, for the Claude Code and the
Responses tests (served over loopback by `tests.support.mock_server.MockServerThread`, or in process). A
request with the tool `tool` (default `TOOL`) and fewer than `calls` (default 1) tool results is
answered with one call of it (its arguments `arguments`, the same call id every time); a request
whose last message is the last tool result, with `FINAL` and the result's first line; any other
request (Claude Code's side tasks), with "ok". Every request is kept in `requests`."""

from __future__ import annotations

import json
from typing import Any

from tests.support.mock_transport import MockRequest, MockResponse, sse

TOOL = "Read"
FINAL = "The file says:"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-agent",
        "object": "chat.completion.chunk",
        "model": "agent",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class AgentModel:
    def __init__(self, arguments: dict[str, Any], tool: str = TOOL, calls: int = 1) -> None:
        self.arguments = arguments
        self.tool = tool
        self.calls = calls
        self.requests: list[MockRequest] = []

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests]

    def __call__(self, request: MockRequest) -> MockResponse:
        self.requests.append(request)
        return MockResponse(body=sse(*self.reply(request.json()), "[DONE]"))

    def reply(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        tools = [t["function"]["name"] for t in body.get("tools") or ()]
        role = _chunk({"role": "assistant"})
        results = sum(m.get("role") == "tool" for m in messages)
        if last.get("role") == "tool" and results >= self.calls:
            text = f"{FINAL} {str(last.get('content', '')).strip().splitlines()[0]}"
            return [role, _chunk({"content": text}), _chunk({}, "stop")]
        if self.tool in tools and results < self.calls:
            # The same id on every answer, as servers that number their calls per answer do.
            call = {
                "index": 0,
                "id": "call_agent_1",
                "type": "function",
                "function": {"name": self.tool, "arguments": json.dumps(self.arguments)},
            }
            return [role, _chunk({"tool_calls": [call]}), _chunk({}, "tool_calls")]
        return [role, _chunk({"content": "ok"}), _chunk({}, "stop")]
