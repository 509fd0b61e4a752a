"""What the Responses front-end tests share: the config (an OpenAI-compatible upstream under two
providers, no retries, and the route `pair` balanced over both), and the scripted upstream: `up/agent` plays an agent's model (tests/anthropic/
agent_model.py, its tool `get_weather`), `up/structured` answers `ANSWER` as JSON text, every other
model is the scripted upstream's behaviour of that name (tests/support/upstream.py)."""

from __future__ import annotations

import json
from typing import Any

from tests.anthropic.agent_model import AgentModel
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import SSE, ScriptedUpstream, token_stream

CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 1

[[providers]]
name = "up2"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 1

[[routes]]
name = "pair"
targets = [{ model = "up/ok" }, { model = "up2/ok" }]
"""
TOOL = "get_weather"
ARGUMENTS = {"city": "Paris"}
ANSWER = {"city": "Paris", "temperature": 21}


class Upstream:
    """The handler; `agent` and `scripted` keep what each got."""

    def __init__(self) -> None:
        self.agent = AgentModel(ARGUMENTS, tool=TOOL)
        self.scripted = ScriptedUpstream()
        self.requests: list[MockRequest] = []

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.method == "POST"]

    def __call__(self, request: MockRequest) -> Any:
        self.requests.append(request)
        model = request.json().get("model") if request.method == "POST" else None
        if model == "agent":
            return self.agent(request)
        if model == "structured":
            return MockResponse(body=token_stream("structured", [json.dumps(ANSWER)]), headers=SSE)
        return self.scripted(request)
