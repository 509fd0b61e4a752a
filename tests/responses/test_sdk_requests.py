"""What the OpenAI SDK sends is what the translation takes: requests written by the SDK's own
serializer (typed input items of a tool-using conversation, function and namespace tools, the
structured output of `responses.parse`, reasoning settings) are captured at its transport and
translated into a chat request the core takes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pydantic
from openai.types.responses import (
    EasyInputMessageParam,
    FunctionToolParam,
    NamespaceToolParam,
    ResponseFunctionToolCallParam,
    ResponseInputParam,
    ResponseReasoningItemParam,
    ToolParam,
    WebSearchToolParam,
)
from openai.types.responses.response_input_param import FunctionCallOutput

from svir.protocols.responses.request import ResponsesRequest, translate_request
from svir.providers.request import validate_chat_request
from svir.wire.request import build_messages

EMPTY_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 0,
    "model": "lab/m",
    "output": [],
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


def capturing_client(sent: list[dict[str, Any]]) -> openai.OpenAI:
    """A client whose request bodies are kept (and answered with an empty response, streamed
    as one `response.completed` event when asked for a stream)."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if not body.get("stream"):
            return httpx.Response(200, json=EMPTY_RESPONSE)
        event = {"type": "response.completed", "sequence_number": 0, "response": EMPTY_RESPONSE}
        return httpx.Response(
            200,
            content=f"event: response.completed\ndata: {json.dumps(event)}\n\n".encode(),
            headers={"content-type": "text/event-stream"},
        )

    return openai.OpenAI(
        api_key="x",
        base_url="http://svir.test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )


def checked(body: dict[str, Any]) -> ResponsesRequest:
    got = translate_request(body)
    validate_chat_request(got.chat)
    build_messages(got.chat["messages"], reasoning_key="reasoning_content")
    return got


WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CRM: NamespaceToolParam = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
}
SEARCH: WebSearchToolParam = {"type": "web_search"}


def test_a_tool_conversation_from_typed_items() -> None:
    sent: list[dict[str, Any]] = []
    question: EasyInputMessageParam = {"role": "user", "content": "Weather in Oslo?"}
    thought: ResponseReasoningItemParam = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Ask the tool."}],
        "encrypted_content": None,
    }
    asked: ResponseFunctionToolCallParam = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
    }
    looked_up: ResponseFunctionToolCallParam = {
        "type": "function_call",
        "id": "fc_2",
        "call_id": "call_2",
        "name": "lookup",
        "namespace": "crm",
        "arguments": "{}",
    }
    answered: FunctionCallOutput = {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "-3 C",
    }
    found: FunctionCallOutput = {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "no record"}],
    }
    items: ResponseInputParam = [question, thought, asked, looked_up, answered, found]
    tools: list[ToolParam] = [WEATHER, CRM, SEARCH]
    capturing_client(sent).responses.create(
        model="lab/m",
        instructions="Be brief.",
        input=items,
        tools=tools,
        tool_choice="auto",
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
        max_output_tokens=200,
        metadata={"run": "1"},
    )
    got = checked(sent[0])
    assert [m["role"] for m in got.chat["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    assistant = got.chat["messages"][2]
    assert assistant["reasoning_content"] == "Ask the tool."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["weather", "crm__lookup"]
    assert got.names == {"crm__lookup": ("crm", "lookup")}
    assert got.chat["max_tokens"] == 200 and got.chat["reasoning_effort"] == "low"
    assert got.store is False and got.include_encrypted and got.summary == "auto"
    assert got.metadata == {"run": "1"}
    assert got.warnings == ("web_search tool dropped: svir serves function tools only",)


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


def test_parse_with_a_pydantic_model_is_a_json_schema_response_format() -> None:
    sent: list[dict[str, Any]] = []
    capturing_client(sent).responses.parse(
        model="lab/m", input="Weather in Oslo?", text_format=Forecast
    )
    got = checked(sent[0])
    spec = got.chat["response_format"]["json_schema"]
    assert got.chat["response_format"]["type"] == "json_schema"
    assert spec["name"] == "Forecast" and spec["strict"] is True
    assert spec["schema"]["required"] == ["city", "celsius"]
    assert got.echo["text"]["format"]["name"] == "Forecast"


def test_a_streamed_continuation() -> None:
    sent: list[dict[str, Any]] = []
    client = capturing_client(sent)
    events = list(
        client.responses.create(
            model="lab/m",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "and now?"}]}],
            previous_response_id="resp_0",
            stream=True,
            prompt_cache_key="conv-1",
            parallel_tool_calls=False,
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "weather"},
        )
    )
    assert [e.type for e in events] == ["response.completed"]
    got = translate_request(sent[0], history=[{"role": "user", "content": "before"}])
    validate_chat_request(got.chat)
    assert got.stream is True and got.previous_response_id == "resp_0"
    assert got.cache_key == "conv-1" and got.chat["parallel_tool_calls"] is False
    assert got.chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert [m["content"] for m in got.chat["messages"]] == ["before", "and now?"]
