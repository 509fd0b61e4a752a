"""An Anthropic Messages request as svir's canonical chat request: every field the front end
translates, what Claude Code 2.1 sends, the mistakes named in a typed 400, and a fuzz that no
JSON value gets another exception out of it."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.protocols.anthropic.request import MessagesRequestError, count_tokens, translate_request
from svir.providers.request import validate_chat_request
from svir.wire.errors import BodyError
from svir.wire.request import EFFORT_KEY, THINKING_KEY, build_messages

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()


def chat(**body: Any) -> dict[str, Any]:
    body.setdefault("model", "claude-x")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return translate_request(body).chat


def messages(*msgs: dict[str, Any], **body: Any) -> list[dict[str, Any]]:
    return chat(messages=list(msgs), **body)["messages"]


def error(body: Any) -> MessagesRequestError:
    with pytest.raises(MessagesRequestError) as info:
        translate_request(body)
    assert isinstance(info.value, BodyError)  # the chat core answers BodyError as a 400
    return info.value


EPHEMERAL = {"type": "ephemeral"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
ASKED = {"role": "assistant", "content": [CALL]}


def test_claude_code_first_turn() -> None:
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Tools follow.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what's here?"}]},
            {"role": "system", "content": "<env>cwd: /w</env>"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "List it.", "signature": ""},
                    {"type": "text", "text": "Looking."},
                    CALL,
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\n"},
                    {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Runs a command",
                "input_schema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                    "additionalProperties": False,
                },
                "defer_loading": True,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
    }
    got = translate_request(body)
    assert got.chat == {
        "model": "claude-sonnet-4-5-20250929",
        "stream": True,
        "max_tokens": 32000,
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
                    {"type": "text", "text": "Tools follow.", "cache_control": EPHEMERAL},
                    {"type": "text", "text": "Be brief."},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "what's here?"}]},
            {"role": "system", "content": "<env>cwd: /w</env>"},
            {
                "role": "assistant",
                "content": "Looking.",
                "reasoning_content": "List it.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\n"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "go on", "cache_control": EPHEMERAL}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": "Runs a command",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string"}},
                        "required": ["command"],
                        "additionalProperties": False,
                    },
                },
                "cache_control": EPHEMERAL,
            }
        ],
        "tool_choice": "auto",
        "reasoning_effort": "medium",
        THINKING_KEY: {"type": "adaptive"},
        EFFORT_KEY: "medium",
    }
    assert got.stream and not got.image_urls
    assert got.user_id == body["metadata"]["user_id"]
    assert got.warnings == ("context_management ignored: svir does not translate it",)
    # The chat core takes it as it is.
    validate_chat_request(got.chat)
    built = build_messages(got.chat["messages"], reasoning_key="reasoning_content")
    assert built[3]["reasoning_content"] == "List it." and built[1]["content"] == "what's here?"
    # Every upstream but Anthropic gets the system prompt as one string, without the marks.
    assert built[0] == {
        "role": "system",
        "content": "You are Claude Code.\nTools follow.\nBe brief.",
    }


def test_a_system_note_between_the_calls_and_their_results_goes_after_the_results() -> None:
    msgs = messages(
        {"role": "user", "content": "go"},
        ASKED,
        {"role": "system", "content": "note"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    )
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "system"]


def test_a_leading_system_message_joins_the_system_prompt() -> None:
    msgs = messages(
        {"role": "system", "content": "b"}, {"role": "user", "content": "u"}, system="a"
    )
    assert msgs[0] == {"role": "system", "content": "a\nb"} and len(msgs) == 2


def test_tool_results_as_blocks_errors_and_images() -> None:
    msgs = messages(
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [CALL, {**CALL, "id": "toolu_2", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "after"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "line 1"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                        {"type": "text", "text": "line 2"},
                    ],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "boom",
                    "is_error": True,
                },
            ],
        },
    )
    assert msgs[1]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert msgs[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "line 1\nline 2"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom", "is_error": True},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "after"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]
    built = build_messages(msgs, reasoning_key=None)
    assert built[4]["content"][1]["type"] == "image_url"


def test_images_base64_and_url() -> None:
    got = translate_request(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                    ],
                }
            ],
        }
    )
    assert got.image_urls
    urls = [p["image_url"]["url"] for p in got.chat["messages"][0]["content"]]
    assert urls == ["https://x.test/a.png", f"data:image/png;base64,{PNG}"]
    assert not translate_request(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    ).image_urls


def test_documents_with_text_sources_are_file_blocks() -> None:
    text64 = base64.b64encode("é text".encode()).decode()
    msgs = messages(
        {
            "role": "user",
            "content": [
                {
                    "type": "document",
                    "title": "a.md",
                    "source": {"type": "text", "media_type": "text/plain", "data": "# A"},
                },
                {
                    "type": "document",
                    "source": {"type": "content", "content": [{"type": "text", "text": "B"}]},
                },
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "text/plain", "data": text64},
                    "context": "ctx",
                },
            ],
        }
    )
    texts = [p["text"] for p in msgs[0]["content"]]
    assert texts == [
        '<file name="a.md">\n# A\n</file>',
        '<file name="document">\nB\n</file>',
        '<file name="document">\nctx\né text\n</file>',
    ]


def test_a_pdf_document_is_refused_by_name() -> None:
    exc = error(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "base64",
                                "media_type": "application/pdf",
                                "data": "JVBERi0=",
                            },
                        }
                    ],
                }
            ],
        }
    )
    assert exc.param == "messages.0.content.0.source" and "only text documents" in exc.message


def test_redacted_thinking_is_dropped_and_thinking_never_inlined() -> None:
    msgs = messages(
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "EncryptedBlob=="},
                {"type": "thinking", "thinking": "a", "signature": "sig"},
                {"type": "thinking", "thinking": "b"},
                {"type": "text", "text": "answer"},
            ],
        },
    )
    assert msgs[1]["content"] == "answer" and msgs[1]["reasoning_content"] == "a\nb"
    built = build_messages(msgs, reasoning_key=None)
    assert built[1] == {"role": "assistant", "content": "answer"}


def test_server_tools_are_dropped_with_a_warning() -> None:
    got = translate_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "custom", "name": "f", "input_schema": {"type": "object"}},
            ],
        }
    )
    assert got.chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert got.warnings == (
        "tool web_search (web_search_20250305) dropped: only custom tools are translated",
    )


def test_only_server_tools_means_no_tools() -> None:
    got = chat(tools=[{"type": "bash_20250124", "name": "bash"}], tool_choice={"type": "any"})
    assert "tools" not in got and got["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "f"},
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
        ),
        (
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    got = chat(tool_choice=choice)
    assert {k: got[k] for k in ("tool_choice", "parallel_tool_calls") if k in got} == expected


@pytest.mark.parametrize(
    ("settings", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4000}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 10000}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
        ({"thinking": {"type": "disabled"}}, "none"),
        ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, "none"),
        ({"thinking": {"type": "adaptive"}}, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "xhigh"),
        (
            {
                "thinking": {"type": "enabled", "budget_tokens": 2000},
                "output_config": {"effort": "high"},
            },
            "high",
        ),
        ({"output_config": {"effort": "low"}}, "low"),
        ({}, None),
    ],
)
def test_thinking_as_reasoning_effort(settings: dict[str, Any], effort: str | None) -> None:
    assert chat(**settings).get("reasoning_effort") == effort


def test_sampling_and_limits() -> None:
    got = chat(
        max_tokens=100,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "\n\n"],
        stream=False,
    )
    assert {
        k: got[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stop", "stream")
    } == {
        "max_tokens": 100,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END", "\n\n"],
        "stream": False,
    }
    assert "stop" not in chat(stop_sequences=[])
    validate_chat_request(got)


def test_unknown_fields_are_warnings_not_errors() -> None:
    got = translate_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "service_tier": "auto",
            "brand_new": 1,
            "cache_control": {"type": "ephemeral"},
            "output_config": {"effort": "low", "task_budget": 9},
        }
    )
    assert sorted(got.warnings) == [
        "brand_new ignored: svir does not translate it",
        "output_config.task_budget ignored: svir does not translate it",
        "service_tier ignored: svir does not translate it",
    ]


def test_structured_output_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    got = chat(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert got["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    validate_chat_request(got)
    assert "response_format" not in chat(output_config={"format": None})


# -- mistakes, named


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ([], None, "must be an object"),
        ({"messages": []}, "model", "non-empty string"),
        ({"model": "m"}, "messages", "must be an array"),
        ({"model": "m", "messages": []}, "messages", "at least one"),
        ({"model": "m", "messages": ["hi"]}, "messages.0", "must be an object"),
        (
            {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
            "'user' or 'assistant'",
        ),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages.0.content", "is required"),
        (
            {"model": "m", "messages": [{"role": "user", "content": 3}]},
            "messages.0.content",
            "not a number",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
            "messages.0.content.0.type",
            "unsupported content block type 'audio'",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages.0.content.0.type",
            "must be a string",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}],
            },
            "messages.0.content.0.text",
            "must be a string",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
                ],
            },
            "messages.0.content.0.tool_use_id",
            "no matching tool_use",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [CALL]}]},
            "messages.0.content.0.type",
            "a user message takes no tool_use",
        ),
        (
            {"model": "m", "messages": [{"role": "assistant", "content": [{"type": "image"}]}]},
            "messages.0.content.0.type",
            "takes no 'image'",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "assistant", "content": [{**CALL, "input": "ls"}]}],
            },
            "messages.0.content.0.input",
            "must be an object",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/tiff",
                                    "data": "AA==",
                                },
                            }
                        ],
                    }
                ],
            },
            "messages.0.content.0.source.media_type",
            "image/png",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "file:///etc/passwd"},
                            }
                        ],
                    }
                ],
            },
            "messages.0.content.0.source.url",
            "http(s)",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "system": [{"type": "image"}],
            },
            "system.0",
            "must be a text block",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
            "positive integer",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": True},
            "max_tokens",
            "positive integer",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "temperature",
            "must be a number",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            "stream",
            "must be a boolean",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop_sequences": [1]},
            "stop_sequences.0",
            "must be a string",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "f"}],
            },
            "tools.0.input_schema",
            "must be an object",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "", "input_schema": {}}],
            },
            "tools.0.name",
            "must not be empty",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"},
            "tool_choice",
            "must be an object",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "some"},
            },
            "tool_choice.type",
            "'auto', 'any'",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "enabled"},
            },
            "thinking.budget_tokens",
            "positive integer",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "on"},
            },
            "thinking.type",
            "'enabled'",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "output_config": {"effort": "huge"},
            },
            "output_config.effort",
            "one of",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "output_config": 1},
            "output_config",
            "must be an object",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "output_config": {"format": {"type": "json_schema", "schema": []}},
            },
            "output_config.format.schema",
            "must be an object",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "output_config": {"format": {"type": "text"}},
            },
            "output_config.format",
            "json_schema",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "metadata": {"user_id": 5},
            },
            "metadata.user_id",
            "must be a string",
        ),
    ],
)
def test_mistakes_are_named(body: Any, param: str | None, words: str) -> None:
    exc = error(body)
    assert exc.param == param
    assert words in exc.message
    if param is not None:
        assert exc.message.startswith(f"{param}: ")


def test_a_result_must_answer_the_previous_message() -> None:
    exc = error(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "a"},
                ASKED,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
            ],
        }
    )
    assert exc.param == "messages.3.content.0.tool_use_id"


def test_a_call_answered_twice_is_named() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1"}
    exc = error({"model": "m", "messages": [ASKED, {"role": "user", "content": [result, result]}]})
    assert exc.param == "messages.1.content.1.tool_use_id" and "twice" in exc.message


# -- count_tokens


def conversation(thinking: str, result: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking}, CALL]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
            },
        ],
    }


def test_count_tokens_counts_every_part() -> None:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    n = count_tokens(base)
    assert n > 0
    assert count_tokens({**base, "system": "S" * 400}) >= n + 100
    tool = {"name": "f", "input_schema": {"type": "object", "description": "D" * 400}}
    assert count_tokens({**base, "tools": [tool]}) >= n + 100
    # The thinking and the tool result count, not only the text blocks.
    both = count_tokens(conversation("T" * 400, "R" * 400))
    assert both - count_tokens(conversation("", "R" * 400)) >= 100
    assert both - count_tokens(conversation("T" * 400, "")) >= 100


def test_count_tokens_refuses_what_translation_refuses() -> None:
    with pytest.raises(MessagesRequestError):
        count_tokens({"model": "m", "messages": "x"})


# -- fuzz

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` nine times in ten, any JSON value the tenth: most bodies translate, and every
    field is still wrong in some."""
    return st.integers(0, 9).flatmap(lambda i: valid if i else JSON)


TYPES = st.sampled_from(
    [
        "text",
        "image",
        "document",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "audio",
    ]
)
IDS = st.sampled_from(["t1", "t2"])
SOURCE = st.fixed_dictionaries(
    {"type": st.sampled_from(["base64", "url", "text", "content", "x"])},
    optional={
        "media_type": mostly(st.sampled_from(["image/png", "text/plain", "application/pdf"])),
        "data": mostly(st.just(PNG) | st.text(max_size=4)),
        "url": mostly(st.just("https://x.test/i.png")),
        "content": mostly(st.text(max_size=4)),
    },
)
INNER = st.fixed_dictionaries({"type": TYPES, "text": st.text(max_size=3)})
BLOCK = st.fixed_dictionaries(
    {"type": TYPES},
    optional={
        "text": mostly(st.text(max_size=4)),
        "id": mostly(IDS),
        "tool_use_id": mostly(IDS),
        "name": mostly(st.text(max_size=3)),
        "input": mostly(st.dictionaries(st.text(max_size=3), JSON, max_size=2)),
        "content": mostly(st.text(max_size=4) | st.lists(INNER, max_size=2)),
        "is_error": mostly(st.booleans()),
        "thinking": mostly(st.text(max_size=4)),
        "signature": mostly(st.just("")),
        "data": mostly(st.just(PNG)),
        "source": mostly(SOURCE),
    },
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant", "system"])),
        "content": mostly(st.text(max_size=4) | st.lists(BLOCK, max_size=4)),
    }
)
TOOL = st.fixed_dictionaries(
    {"name": mostly(st.text(min_size=1, max_size=3))},
    optional={
        "type": mostly(st.sampled_from(["custom", "web_search_20250305"])),
        "input_schema": mostly(st.just({"$schema": "x", "type": "object"})),
        "description": mostly(st.text(max_size=3)),
    },
)
BODY = st.fixed_dictionaries(
    {"model": mostly(st.just("claude-x")), "messages": mostly(st.lists(MESSAGE, max_size=4))},
    optional={
        "system": mostly(st.text(max_size=4) | st.lists(BLOCK, max_size=2)),
        "max_tokens": mostly(st.integers(-1, 10)),
        "stream": mostly(st.booleans()),
        "stop_sequences": mostly(st.lists(st.text(max_size=3), max_size=2)),
        "temperature": mostly(st.floats(0, 2)),
        "top_k": mostly(st.integers(-1, 50)),
        "tools": mostly(st.lists(TOOL, max_size=2)),
        "tool_choice": mostly(
            st.fixed_dictionaries(
                {"type": mostly(st.sampled_from(["auto", "any", "tool", "none"]))},
                optional={"name": mostly(st.text(max_size=2)), "disable_parallel_tool_use": JSON},
            )
        ),
        "thinking": mostly(
            st.fixed_dictionaries(
                {"type": mostly(st.sampled_from(["enabled", "disabled", "adaptive"]))},
                optional={"budget_tokens": mostly(st.integers(0, 40000))},
            )
        ),
        "output_config": mostly(
            st.fixed_dictionaries(
                {},
                optional={
                    "effort": mostly(st.sampled_from(["low", "max"])),
                    "format": mostly(
                        st.fixed_dictionaries(
                            {"type": mostly(st.just("json_schema"))},
                            optional={"schema": mostly(st.just({"type": "object"}))},
                        )
                    ),
                },
            )
        ),
        "metadata": mostly(
            st.fixed_dictionaries({}, optional={"user_id": mostly(st.text(max_size=3))})
        ),
        "context_management": JSON,
    },
)


# Conversations of valid blocks only, each translating, so that the checks after translation
# run often: a text, an image, a call and its result, thinking.
TURN = st.sampled_from(
    [
        [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    }
                ],
            }
        ],
        [
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "t", "signature": ""}, CALL],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "r"}],
                    }
                ],
            },
        ],
        [{"role": "system", "content": "note"}],
        [{"role": "assistant", "content": "a"}],
    ]
)
CONVERSATION = st.builds(
    lambda turns, rest: {"model": "claude-x", "messages": [m for t in turns for m in t], **rest},
    st.lists(TURN, min_size=1, max_size=5),
    BODY.map(lambda b: {k: v for k, v in b.items() if k not in ("model", "messages")}),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(JSON, BODY, CONVERSATION))
def test_any_json_translates_or_is_a_named_400(body: Any) -> None:
    try:
        got = translate_request(body)
    except MessagesRequestError:
        return
    # A translated request is one the chat core takes: its fields pass the shared check, and its
    # messages build, or fail only as a client's BodyError (a bad base64 image).
    validate_chat_request(got.chat)
    with contextlib.suppress(BodyError):
        build_messages(got.chat["messages"], reasoning_key="reasoning_content")
    assert count_tokens(body) > 0
