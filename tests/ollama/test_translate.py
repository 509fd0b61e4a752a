"""The Ollama request translation, field by field: what each Ollama field becomes, and the 400s."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from svir.config.model import ProviderConfig
from svir.errors import OllamaError
from svir.protocols.ollama.encode import done_reason
from svir.protocols.ollama.request import (
    model_name,
    schema_name,
    to_openai_request,
)
from svir.providers import build_upstream_body, get_kind, validate_chat_request
from svir.wire.media import sniff_image

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 16
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 8
GIF = b"GIF89a\x01\x00\x01\x00" + b"\x00" * 8
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 8


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "lab/m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return to_openai_request(body)


def bad(body: Any) -> str:
    with pytest.raises(OllamaError) as info:
        to_openai_request(body)
    assert info.value.status == 400
    assert info.value.body() == {"error": info.value.message}
    return info.value.message


# Model names and the basic shape


def test_plain_request() -> None:
    assert chat() == {
        "model": "lab/m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,  # Ollama streams unless told not to
    }
    assert chat(stream=False)["stream"] is False


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("lab/gemma-3-270m", "lab/gemma-3-270m"),
        ("lab/gemma-3-270m:latest", "lab/gemma-3-270m"),
        ("ollama/llama3.2:3b", "ollama/llama3.2:3b"),  # other tags belong to the upstream's id
        (":latest", ":latest"),
        ("smart", "smart"),
    ],
)
def test_model_name(given: str, want: str) -> None:
    assert model_name(given) == want
    assert chat(model=given)["model"] == want


def test_old_name_field_is_taken() -> None:
    assert to_openai_request({"name": "lab/m:latest", "messages": []})["model"] == "lab/m"


def test_empty_messages_are_kept_for_the_load_answer() -> None:
    assert to_openai_request({"model": "lab/m"})["messages"] == []
    assert to_openai_request({"model": "lab/m", "messages": None})["messages"] == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "must be a JSON object"),
        ({"messages": []}, "model is required"),
        ({"model": ""}, "model is required"),
        ({"model": 3}, "model must be a string"),
        ({"model": "lab/m", "stream": "yes"}, "stream must be a boolean"),
        ({"model": "lab/m", "messages": {}}, "messages must be an array"),
        ({"model": "lab/m", "messages": ["hi"]}, "messages[0] must be an object"),
        ({"model": "lab/m", "messages": [{"content": "hi"}]}, "messages[0].role is missing"),
        ({"model": "lab/m", "messages": [{"role": "bot"}]}, "unknown role 'bot'"),
        (
            {"model": "lab/m", "messages": [{"role": "user", "content": 1}]},
            "content must be a string",
        ),
        (
            {"model": "lab/m", "messages": [{"role": "user", "images": "x"}]},
            "images must be an array",
        ),
    ],
)
def test_malformed_requests_are_400(body: Any, fragment: str) -> None:
    assert fragment in bad(body)


# Messages


def test_roles_and_missing_content() -> None:
    # The official client leaves empty fields out: no content is the empty string.
    got = to_openai_request(
        {
            "model": "lab/m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user"},
                {"role": "assistant", "content": "ok", "thinking": "the user said nothing"},
            ],
        }
    )["messages"]
    assert got == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "ok", "reasoning_content": "the user said nothing"},
    ]


@pytest.mark.parametrize(
    ("data", "media_type"),
    [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (WEBP, "image/webp")],
)
def test_images_become_data_urls_typed_by_their_bytes(data: bytes, media_type: str) -> None:
    assert sniff_image(data) == media_type
    msg = chat(messages=[{"role": "user", "content": "what is it?", "images": [b64(data)]}])
    assert msg["messages"][0]["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{b64(data)}"}},
    ]


def test_images_without_text_have_no_empty_text_part() -> None:
    msg = chat(messages=[{"role": "user", "images": [b64(PNG), b64(JPEG)]}])
    parts = msg["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_an_image_sent_as_a_data_url_is_kept() -> None:
    url = "data:image/png;base64," + b64(PNG)
    msg = chat(messages=[{"role": "user", "images": [url]}])
    assert msg["messages"][0]["content"][0]["image_url"]["url"] == url


def test_images_go_upstream_as_the_wire_core_builds_them() -> None:
    request = chat(messages=[{"role": "user", "content": "look", "images": [b64(PNG)]}])
    body = build_upstream_body(
        validate_chat_request(request),
        kind=get_kind("llamacpp"),
        provider=ProviderConfig(name="lab", kind="llamacpp", base_url="http://x/v1"),
        model_id="m",
    )
    assert body["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;")


@pytest.mark.parametrize(
    ("image", "fragment"),
    [
        (3, "images[0] must be a base64 string"),
        ("not base64!", "is not valid base64"),
        ("", "is empty"),
        (b64(b"plain text, not an image"), "is not a PNG, JPEG, GIF or WebP image"),
    ],
)
def test_bad_images_are_400(image: Any, fragment: str) -> None:
    message = bad({"model": "lab/m", "messages": [{"role": "user", "images": [image]}]})
    assert message.startswith("messages[0].images[0]") and fragment in message


def test_images_only_on_user_messages() -> None:
    message = bad(
        {
            "model": "lab/m",
            "messages": [{"role": "assistant", "content": "x", "images": [b64(PNG)]}],
        }
    )
    assert "only user messages take images" in message


# Tools and tool calls


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_pass_through() -> None:
    assert chat(tools=[WEATHER])["tools"] == [WEATHER]
    # `type` may be left out, and parameters too.
    got = chat(tools=[{"function": {"name": "now"}}])["tools"]
    assert got == [
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    ]
    assert "tools" not in chat(tools=[])


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        ({}, "tools must be an array"),
        ([1], "tools[0] must be an object"),
        ([{"type": "code", "function": {"name": "x"}}], "tools[0].type must be 'function'"),
        ([{"type": "function"}], "tools[0].function must be an object"),
        ([{"function": {"name": ""}}], "tools[0].function.name"),
        ([{"function": {"name": "x", "parameters": []}}], "parameters must be an object"),
        ([{"function": {"name": "x", "description": 1}}], "description must be a string"),
    ],
)
def test_bad_tools_are_400(tools: Any, fragment: str) -> None:
    assert fragment in bad({"model": "lab/m", "messages": [], "tools": tools})


def test_tool_calls_and_results_round_trip() -> None:
    messages = [
        {"role": "user", "content": "weather in Paris and Oslo, and the time?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"function": {"name": "get_time", "arguments": {}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            ],
        },
        # Results answer by tool name, in any order; the first unanswered call of that tool.
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_name": "get_weather", "content": "rain"},
    ]
    got = chat(messages=messages)["messages"]
    calls = got[1]["tool_calls"]
    assert got[1]["content"] == ""
    assert [c["id"] for c in calls] == ["call_1_0", "call_1_1", "call_1_2"]
    assert calls[0] == {
        "id": "call_1_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    assert calls[1]["function"]["arguments"] == "{}"
    assert [m["tool_call_id"] for m in got[2:]] == ["call_1_1", "call_1_0", "call_1_2"]
    assert got[3] == {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"}


def test_tool_results_without_names_answer_in_order_and_ids_are_kept() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "a1", "function": {"name": "f", "arguments": '{"x":1}'}},
                {"id": "b2", "function": {"name": "g"}},
            ],
        },
        {"role": "tool", "content": "one"},
        {"role": "tool", "tool_call_id": "b2", "content": "two"},
        {"role": "tool", "tool_name": "h", "content": "an answer to no call"},
    ]
    got = chat(messages=messages)["messages"]
    assert [c["id"] for c in got[1]["tool_calls"]] == ["a1", "b2"]
    assert got[1]["tool_calls"][0]["function"]["arguments"] == '{"x":1}'  # a string is kept
    assert [m["tool_call_id"] for m in got[2:]] == ["a1", "b2", "call_4"]


@pytest.mark.parametrize(
    ("calls", "fragment"),
    [
        ({}, "tool_calls must be an array"),
        ([1], "tool_calls[0] must be an object"),
        ([{"function": 1}], "tool_calls[0].function must be an object"),
        ([{"function": {"arguments": {}}}], "function.name must be a non-empty string"),
        ([{"function": {"name": "f", "arguments": 3}}], "arguments must be an object"),
        ([{"id": 3, "function": {"name": "f"}}], "tool_calls[0].id must be a string"),
    ],
)
def test_bad_tool_calls_are_400(calls: Any, fragment: str) -> None:
    body = {"model": "lab/m", "messages": [{"role": "assistant", "tool_calls": calls}]}
    assert fragment in bad(body)


def test_bad_tool_results_are_400() -> None:
    assert "tool_name must be a string" in bad(
        {"model": "lab/m", "messages": [{"role": "tool", "content": "x", "tool_name": 1}]}
    )
    assert "tool_call_id must be a string" in bad(
        {"model": "lab/m", "messages": [{"role": "tool", "content": "x", "tool_call_id": []}]}
    )


# Format, options, think


def test_format() -> None:
    assert "response_format" not in chat(format="")
    assert "response_format" not in chat(format=None)
    assert chat(format="json")["response_format"] == {"type": "json_object"}
    schema = {"title": "Person", "type": "object", "properties": {"age": {"type": "integer"}}}
    assert chat(format=schema)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Person", "schema": schema},
    }
    assert "format must be" in bad({"model": "lab/m", "format": "yaml"})
    assert "format must be" in bad({"model": "lab/m", "format": 3})


@pytest.mark.parametrize(
    ("schema", "name"),
    [
        ({"type": "object"}, "response"),
        ({"title": "Person"}, "Person"),
        ({"title": "A person, with age!"}, "A_person_with_age"),
        ({"title": "人"}, "response"),
        ({"title": "x" * 100}, "x" * 64),
        ({"title": 3}, "response"),
    ],
)
def test_schema_names_are_valid(schema: dict[str, Any], name: str) -> None:
    assert schema_name(schema) == name
    # The gateway checks the name as OpenAI does (§2.6).
    validate_chat_request(chat(format=schema))


def test_options() -> None:
    got = chat(
        options={
            "temperature": 0.2,
            "top_p": 0.9,
            "num_predict": 64,
            "stop": ["\n\n", ""],
            "seed": 42,
            "frequency_penalty": 0.5,
            "presence_penalty": 1,
            # Dropped: load-time options and samplers OpenAI has no field for.
            "num_ctx": 8192,
            "top_k": 40,
            "repeat_penalty": 1.1,
        }
    )
    assert {k: v for k, v in got.items() if k not in ("model", "messages", "stream")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "stop": ["\n\n"],
        "seed": 42,
        "frequency_penalty": 0.5,
        "presence_penalty": 1,
    }


@pytest.mark.parametrize(
    ("options", "want"),
    [
        ({"num_predict": -1}, {}),  # Ollama's "no limit"
        ({"num_predict": -2}, {}),
        ({"num_predict": 128.0}, {"max_tokens": 128}),
        ({"stop": "END"}, {"stop": ["END"]}),
        ({"stop": []}, {}),
        ({"temperature": 0}, {"temperature": 0}),
        ({"temperature": None}, {}),
        ({}, {}),
    ],
)
def test_option_edges(options: dict[str, Any], want: dict[str, Any]) -> None:
    got = chat(options=options)
    assert {k: v for k, v in got.items() if k not in ("model", "messages", "stream")} == want


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ([], "options must be an object"),
        ({"temperature": "hot"}, "options.temperature must be a number"),
        ({"temperature": True}, "options.temperature must be a number"),
        ({"num_predict": 1.5}, "options.num_predict must be an integer"),
        ({"seed": "x"}, "options.seed must be an integer"),
        ({"seed": 2**70}, "options.seed is out of range"),
        ({"stop": [1]}, "options.stop must be an array of strings"),
    ],
)
def test_bad_options_are_400(options: Any, fragment: str) -> None:
    assert fragment in bad({"model": "lab/m", "options": options})


@pytest.mark.parametrize(
    ("think", "effort"),
    [(True, "medium"), (False, "none"), ("low", "low"), ("HIGH", "high"), ("medium", "medium")],
)
def test_think_is_a_reasoning_effort(think: Any, effort: str) -> None:
    assert chat(think=think)["reasoning_effort"] == effort
    assert "reasoning_effort" not in chat(think=None)


def test_bad_think_is_400() -> None:
    assert "think must be" in bad({"model": "lab/m", "think": "lots"})
    assert "think must be" in bad({"model": "lab/m", "think": 1})


def test_the_result_passes_the_gateway_checks() -> None:
    request = chat(
        tools=[WEATHER], format="json", options={"num_predict": 5, "temperature": 1}, think=False
    )
    assert validate_chat_request(request) is request


# Answers and listings


def test_done_reason() -> None:
    assert done_reason("stop") == "stop"
    assert done_reason("length") == "length"
    assert done_reason("tool_calls") == "stop"  # Ollama ends a tool call with stop
    assert done_reason(None) == "stop"
    assert done_reason("content_filter") == "content_filter"
