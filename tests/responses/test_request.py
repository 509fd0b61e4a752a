"""An OpenAI Responses request as svir's canonical chat request: every field the translation
honours, ignores or refuses, the turn shapes Codex sends, a namespace tool's names both ways,
the reasoning restored from a sealed token (and a changed one ignored), and the mistakes named
in a typed 400."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from svir.protocols.responses.checks import ResponsesRequestError
from svir.protocols.responses.request import ResponsesRequest, _plain, translate_request
from svir.protocols.responses.response import ECHO_KEYS
from svir.protocols.responses.sealed import seal_reasoning, sealed_key_id, unseal_reasoning
from svir.protocols.responses.tools import flat_tool_name
from svir.providers.request import validate_chat_request
from svir.wire.errors import BodyError
from svir.wire.request import build_messages

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()
KEY = bytes(range(32))
NONCE = b"\x07" * 12


def translated(**body: Any) -> ResponsesRequest:
    body.setdefault("model", "lab/m")
    body.setdefault("input", "hi")
    got = translate_request(body)
    # Whatever it translates is a chat request the core takes, and whose messages build.
    validate_chat_request(got.chat)
    build_messages(got.chat["messages"], reasoning_key="reasoning_content")
    return got


def chat(**body: Any) -> dict[str, Any]:
    return translated(**body).chat


def messages(*items: dict[str, Any], **body: Any) -> list[dict[str, Any]]:
    return chat(input=list(items), **body)["messages"]


def error(body: Any, **kwargs: Any) -> ResponsesRequestError:
    with pytest.raises(ResponsesRequestError) as info:
        translate_request(body, **kwargs)
    assert isinstance(info.value, BodyError)  # the chat core answers BodyError as a 400
    return info.value


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, name: str = "exec_command", args: str = '{"cmd":"ls"}', **extra: Any):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args, **extra}


def output(call_id: str, out: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": out}


def chat_call(call_id: str, name: str = "exec_command", args: str = '{"cmd":"ls"}'):
    """A call as the canonical assistant message holds it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
# EXEC as a chat tool.
EXEC_CHAT = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Runs a command.",
        "parameters": EXEC["parameters"],
        "strict": False,
    },
}
# Codex's namespace tool, as codex-rs/tools serializes ResponsesApiNamespace.
NAMESPACE = {
    "type": "namespace",
    "name": "mcp__files__",
    "description": "Tools of the files MCP server.",
    "tools": [
        {
            "type": "function",
            "name": "read",
            "description": "Reads a file.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
        {
            "type": "function",
            "name": "write",
            "description": "Writes a file.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    ],
}
DEVELOPER = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}],
}
CONTEXT = {
    "type": "message",
    "role": "user",
    "content": [
        {"type": "input_text", "text": "<environment_context>cwd=/w</environment_context>"}
    ],
}


def codex_body(*turn: dict[str, Any]) -> dict[str, Any]:
    """What Codex 0.169 sends: stream, store false, the whole history, its instructions as a
    developer message, function tools, a namespace tool, web_search."""
    return {
        "model": "lab/qwen3",
        "instructions": "",
        "input": [DEVELOPER, CONTEXT, user("list the files"), *turn],
        "tools": [
            EXEC,
            {**EXEC, "name": "write_stdin"},
            NAMESPACE,
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a0c4-conversation",
        "text": {"verbosity": "low"},
    }


# -- Codex


def test_codex_first_turn() -> None:
    got = translated(**codex_body())
    assert got.chat["messages"] == [
        {"role": "system", "content": "You are Codex, a coding agent."},
        {"role": "user", "content": "<environment_context>cwd=/w</environment_context>"},
        {"role": "user", "content": "list the files"},
    ]
    assert got.stream is True and got.chat["stream"] is True
    assert got.store is False
    assert got.summary == "auto" and got.include_encrypted is True
    assert got.cache_key == "0199a0c4-conversation"
    assert got.chat["prompt_cache_key"] == "0199a0c4-conversation"
    assert got.chat["reasoning_effort"] == "medium"
    assert got.chat["parallel_tool_calls"] is True and got.chat["tool_choice"] == "auto"
    assert got.chat["verbosity"] == "low"
    names = [t["function"]["name"] for t in got.chat["tools"]]
    assert names == ["exec_command", "write_stdin", "mcp__files__read", "mcp__files__write"]
    assert got.names == {
        "mcp__files__read": ("mcp__files__", "read"),
        "mcp__files__write": ("mcp__files__", "write"),
    }
    assert got.warnings == ("web_search tool dropped: svir serves function tools only",)
    # Nothing of the request's own state goes upstream.
    for key in ("store", "include", "reasoning", "text", "instructions", "metadata"):
        assert key not in got.chat


def test_codex_second_turn_is_one_assistant_message_then_the_result() -> None:
    turn = [
        {
            "type": "reasoning",
            "id": "rs_0a1",
            "summary": [],
            "content": None,
            "encrypted_content": None,
        },
        call("call_Ab1", id="fc_0a2"),
        output("call_Ab1", "a.txt\nb.txt"),
    ]
    got = translated(**codex_body(*turn))
    assert got.chat["messages"][3:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [chat_call("call_Ab1")],
        },
        {"role": "tool", "tool_call_id": "call_Ab1", "content": "a.txt\nb.txt"},
    ]
    assert got.warnings == ("web_search tool dropped: svir serves function tools only",)
    # The input as input_items lists it: the given ids kept, the others made.
    ids = [i["id"] for i in got.input_items]
    assert ids[3:5] == ["rs_0a1", "fc_0a2"]
    assert ids[0].startswith("msg_") and ids[5].startswith("fco_")
    assert len(set(ids)) == len(ids)


def test_codex_third_turn_folds_reasoning_text_and_calls() -> None:
    turn = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "ls"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "content": [{"type": "output_text", "text": "Listing.", "annotations": []}],
            "phase": "commentary",
        },
        call("call_1", id="fc_1"),
        call("call_2", "mcp__files__read", "{}", id="fc_2"),
        output("call_1", "a"),
        output("call_2", "b"),
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": None},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Two files."}],
        },
        user("thanks"),
    ]
    got = messages(*turn)
    assert got == [
        {
            "role": "assistant",
            "content": "Listing.",
            "tool_calls": [
                chat_call("call_1"),
                chat_call("call_2", "mcp__files__read", "{}"),
            ],
            "reasoning_content": "ls",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "thanks"},
    ]


def test_text_and_calls_stay_one_assistant_message() -> None:
    # LiteLLM splits these and then loses the calls ("Missing corresponding tool call").
    got = messages(
        user("q"),
        {"type": "message", "role": "assistant", "content": "Let me check."},
        call("c1"),
        call("c2"),
        output("c2", "two"),
        output("c1", "one"),
    )
    assert [m["role"] for m in got] == ["user", "assistant", "tool", "tool"]
    assert got[1]["content"] == "Let me check."
    assert [c["id"] for c in got[1]["tool_calls"]] == ["c1", "c2"]
    assert [m["tool_call_id"] for m in got[2:]] == ["c2", "c1"]


def test_interleaved_calls_and_results_are_turns_of_their_own() -> None:
    got = messages(user("q"), call("c1"), output("c1"), call("c2"), output("c2"))
    assert [m["role"] for m in got] == ["user", "assistant", "tool", "assistant", "tool"]


def test_a_message_between_a_call_and_its_result_comes_after_the_result() -> None:
    got = messages(user("q"), call("c1"), user("meanwhile"), output("c1", "r"))
    assert got == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": got[1]["tool_calls"]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "user", "content": "meanwhile"},
    ]


def test_a_result_with_images_puts_them_in_a_user_message_after_the_results() -> None:
    got = messages(
        user("q"),
        call("c1", "view_image"),
        call("c2", "view_image"),
        output(
            "c1",
            [
                {"type": "input_text", "text": "the image:"},
                {"type": "input_image", "image_url": PNG, "detail": "high"},
            ],
        ),
        output("c2", [{"type": "input_image", "image_url": PNG}]),
    )
    assert [m["role"] for m in got] == ["user", "assistant", "tool", "tool", "user"]
    assert got[2]["content"] == "the image:" and got[3]["content"] == ""
    assert got[4]["content"] == [
        {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]


# -- the previous_response_id chain


def test_history_comes_before_the_input_and_its_calls_are_answered() -> None:
    history = [
        {
            "type": "message",
            "id": "msg_a",
            "role": "user",
            "content": [{"type": "input_text", "text": "q"}],
        },
        {"type": "reasoning", "id": "rs_a", "summary": [], "encrypted_content": None},
        {**call("call_h"), "id": "fc_h", "status": "completed"},
    ]
    got = translate_request(
        {"model": "lab/m", "input": [output("call_h", "done")], "previous_response_id": "resp_1"},
        history=history,
    )
    assert got.previous_response_id == "resp_1"
    assert [m["role"] for m in got.chat["messages"]] == ["user", "assistant", "tool"]
    # Only this request's input is its input_items.
    assert [i["type"] for i in got.input_items] == ["function_call_output"]


def test_history_with_no_new_input_continues() -> None:
    got = translate_request(
        {"model": "lab/m", "previous_response_id": "resp_1"}, history=[user("q")]
    )
    assert got.chat["messages"] == [{"role": "user", "content": "q"}]
    assert got.input_items == []


def test_item_reference_is_the_item_of_that_id() -> None:
    history = [{**user("first"), "id": "msg_1"}]
    got = translate_request(
        {
            "model": "lab/m",
            "input": [{"type": "item_reference", "id": "msg_1"}, user("second")],
        },
        history=history,
    )
    assert [m["content"] for m in got.chat["messages"]] == ["first", "first", "second"]
    assert got.input_items[0]["id"] == "msg_1" and got.input_items[0]["role"] == "user"
    assert error({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}).param == (
        "input[0].id"
    )


# -- namespace tools


def test_namespace_round_trip() -> None:
    # Turn 1: the namespace's functions are offered flat, and `names` maps the flat name back.
    first = translated(input="read it", tools=[NAMESPACE])
    tool = first.chat["tools"][0]["function"]
    assert tool["name"] == "mcp__files__read"
    assert tool["description"] == "Tools of the files MCP server.\nReads a file."
    assert first.names["mcp__files__read"] == ("mcp__files__", "read")
    # The output item the front end makes of the model's call carries (namespace, name); sent
    # back, it is the call under the flat name again.
    ns, name = first.names["mcp__files__read"]
    item = call("c1", name, '{"path":"a"}', namespace=ns, id="fc_1")
    got = messages(user("read it"), item, output("c1", "text"), tools=[NAMESPACE])
    assert got[1]["tool_calls"][0]["function"] == {
        "name": "mcp__files__read",
        "arguments": '{"path":"a"}',
    }


def test_additional_tools_item_adds_its_tools() -> None:
    # What Codex sends instead of `tools` to a model name it knows as OpenAI's.
    extra = {"type": "additional_tools", "role": "developer", "tools": [EXEC, NAMESPACE]}
    got = translated(input=[extra, user("q")])
    assert [t["function"]["name"] for t in got.chat["tools"]] == [
        "exec_command",
        "mcp__files__read",
        "mcp__files__write",
    ]
    assert got.input_items[0]["type"] == "additional_tools"
    assert got.input_items[0]["id"].startswith("at_")
    # The same tools given again (tools, and the history's item) are offered once.
    again = translate_request(
        {"model": "lab/m", "input": [extra, user("q2")], "tools": [EXEC]},
        history=[extra, user("q")],
    )
    assert len(again.chat["tools"]) == 3


def test_the_default_namespace_is_offered_under_its_own_names() -> None:
    # A Responses-lite client (Codex) wraps its top-level tools in the namespace "functions",
    # and takes a call back with or without it.
    lite = {"type": "namespace", "name": "functions", "description": "Tools.", "tools": [EXEC]}
    extra = {"type": "additional_tools", "role": "developer", "tools": [lite]}
    got = translated(input=[extra, user("q")])
    assert got.chat["tools"] == [EXEC_CHAT]
    assert got.names == {"exec_command": ("functions", "exec_command")}
    assert chat(tools=[EXEC, lite])["tools"] == chat(tools=[EXEC])["tools"]
    # Calls sent back under the default namespace, or one named after the function (the Agents
    # SDK's deferred top-level functions), are calls of the function itself.
    got = messages(
        user("q"),
        call("c1", namespace="functions"),
        call("c2", namespace="exec_command"),
        output("c1"),
        output("c2"),
    )
    assert [c["function"]["name"] for c in got[1]["tool_calls"]] == ["exec_command"] * 2


def test_flat_names_are_unique_valid_and_short() -> None:
    assert flat_tool_name("crm", "lookup") == "crm__lookup"
    assert flat_tool_name("mcp__x__", "y") == "mcp__x__y"
    long = flat_tool_name("n" * 60, "f" * 30)
    assert len(long) == 64 and long != flat_tool_name("n" * 60, "f" * 31)
    odd = flat_tool_name("my.tools", "go")
    assert len(odd) <= 64 and all(c.isalnum() or c in "_-" for c in odd)
    colliding = {
        "type": "namespace",
        "name": "a",
        "description": "",
        "tools": [{"type": "function", "name": "b"}],
    }
    other = {**colliding, "name": "a_", "tools": [{"type": "function", "name": "_b"}]}
    got = translated(tools=[colliding, other])
    assert [t["function"]["name"] for t in got.chat["tools"]] == ["a__b", "a__b_2"]
    assert got.names == {"a__b": ("a", "b"), "a__b_2": ("a_", "_b")}


def test_a_custom_tool_in_a_namespace_is_dropped() -> None:
    ns = {**NAMESPACE, "tools": [*NAMESPACE["tools"], {"type": "custom", "name": "patch"}]}
    got = translated(tools=[ns])
    assert len(got.chat["tools"]) == 2
    assert got.warnings == (
        "custom tool in namespace mcp__files__ dropped: svir serves function tools only",
    )


# -- tools and tool_choice


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search"},
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["v"]},
        {"type": "image_generation"},
        {"type": "computer_use_preview", "display_width": 1, "display_height": 1},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        {"type": "mcp", "server_label": "x"},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "a_tool_of_next_year"},
    ],
)
def test_tools_svir_cannot_serve_are_dropped_with_a_warning(tool: dict[str, Any]) -> None:
    got = translated(tools=[tool, EXEC])
    assert [t["function"]["name"] for t in got.chat["tools"]] == ["exec_command"]
    assert len(got.warnings) == 1 and tool["type"] in got.warnings[0]


def test_function_tool_fields() -> None:
    got = chat(tools=[EXEC, {"type": "function", "name": "bare"}])
    assert got["tools"] == [EXEC_CHAT, {"type": "function", "function": {"name": "bare"}}]


def test_items_of_hosted_tools_are_dropped_with_a_warning() -> None:
    got = translated(
        input=[
            user("q"),
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
            {"type": "custom_tool_call", "call_id": "x", "name": "apply_patch", "input": "*"},
            {"type": "custom_tool_call_output", "call_id": "x", "output": "ok"},
        ]
    )
    assert got.chat["messages"] == [{"role": "user", "content": "q"}]
    assert len(got.warnings) == 3


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "exec_command"},
            {"type": "function", "function": {"name": "exec_command"}},
        ),
        (
            {"type": "function", "name": "read", "namespace": "mcp__files__"},
            {"type": "function", "function": {"name": "mcp__files__read"}},
        ),
        (
            {"type": "function", "name": "mcp__files__read"},
            {"type": "function", "function": {"name": "mcp__files__read"}},
        ),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    assert chat(tools=[EXEC, NAMESPACE], tool_choice=choice)["tool_choice"] == expected


def test_tool_choice_allowed_tools_filters_the_offer() -> None:
    got = chat(
        tools=[EXEC, NAMESPACE],
        tool_choice={
            "type": "allowed_tools",
            "mode": "required",
            "tools": [{"type": "function", "name": "exec_command"}, {"type": "web_search"}],
        },
    )
    assert got["tool_choice"] == "required"
    assert [t["function"]["name"] for t in got["tools"]] == ["exec_command"]


def test_tool_choice_of_a_hosted_tool_is_ignored_with_a_warning() -> None:
    got = translated(tools=[EXEC], tool_choice={"type": "web_search_preview"})
    assert "tool_choice" not in got.chat and got.warnings


# -- settings


def test_settings() -> None:
    got = translated(
        max_output_tokens=300,
        temperature=0.2,
        top_p=0.9,
        user="u-1",
        safety_identifier="s-1",
        metadata={"ticket": "42"},
        reasoning={"effort": "high", "summary": "detailed"},
        truncation="auto",
        service_tier="flex",
        background=False,
        top_logprobs=0,
        stream_options={"include_obfuscation": False},
    )
    assert {k: got.chat[k] for k in ("max_tokens", "temperature", "top_p", "user")} == {
        "max_tokens": 300,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "u-1",
    }
    assert got.chat["reasoning_effort"] == "high" and got.summary == "detailed"
    assert got.chat["safety_identifier"] == "s-1"
    assert got.metadata == {"ticket": "42"} and "metadata" not in got.chat
    assert "service_tier" not in got.chat and "truncation" not in got.chat
    assert got.warnings == ()
    assert got.stream is False and got.store is True  # OpenAI's defaults


def test_echo_repeats_the_request_with_openai_defaults() -> None:
    got = translated(tools=[EXEC], instructions="Be brief.", max_output_tokens=9)
    assert got.echo == {
        "instructions": "Be brief.",
        "tools": [EXEC],
        "tool_choice": "auto",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_output_tokens": 9,
        "metadata": {},
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": None, "summary": None},
        "truncation": "disabled",
        "user": None,
        "safety_identifier": None,
        "prompt_cache_key": None,
        "store": True,
        "service_tier": "auto",
        "background": False,
        "top_logprobs": 0,
        "max_tool_calls": None,
    }


def test_the_echo_is_in_the_order_the_encoder_writes_as_it_is() -> None:
    # Any other echo is written right too, but by way of a dict of the response's fields.
    for got in (translated(), translated(tools=[EXEC], instructions="Be brief.", top_p=0.5)):
        assert tuple(got.echo) == ECHO_KEYS


def test_unknown_fields_are_ignored_with_a_warning() -> None:
    assert translated(frobnicate=1).warnings == ("frobnicate ignored: svir does not translate it",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"format": {"type": "text"}}, None),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {
                "format": {
                    "type": "json_schema",
                    "name": "Answer",
                    "schema": {"type": "object"},
                    "strict": True,
                    "description": "d",
                }
            },
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "Answer",
                    "schema": {"type": "object"},
                    "description": "d",
                    "strict": True,
                },
            },
        ),
    ],
)
def test_text_format_as_response_format(text: dict[str, Any], expected: Any) -> None:
    assert chat(text=text).get("response_format") == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [("background", True), ("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"})],
)
def test_refused_fields(field: str, value: Any) -> None:
    got = error({"model": "m", "input": "hi", field: value})
    assert got.param == field and "not supported" in got.message


# -- messages and parts


def test_instructions_and_leading_system_messages_join_later_ones_stay() -> None:
    got = messages(
        DEVELOPER,
        {"role": "system", "content": "Second."},
        user("q"),
        {"role": "developer", "content": [{"type": "input_text", "text": "Later note."}]},
        instructions="First.",
    )
    assert got == [
        {"role": "system", "content": "First.\nYou are Codex, a coding agent.\nSecond."},
        {"role": "user", "content": "q"},
        {"role": "system", "content": "Later note."},
    ]


def test_easy_messages_without_type() -> None:
    got = translated(
        input=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"},
        ]
    )
    assert [m["content"] for m in got.chat["messages"]] == ["q", "a", "q2"]
    assert got.input_items[1]["content"] == [
        {"type": "output_text", "text": "a", "annotations": []}
    ]
    assert got.input_items[0]["content"] == [{"type": "input_text", "text": "q"}]


def test_user_parts_image_url_and_file() -> None:
    notes = base64.b64encode(b"line 1\n").decode()
    got = translated(
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": PNG, "detail": "auto"},
                    {"type": "input_image", "image_url": "https://example.org/a.png"},
                    {"type": "input_file", "filename": "notes.txt", "file_data": notes},
                ],
            }
        ]
    )
    assert got.image_urls is True
    assert got.chat["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
        {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
        {"type": "text", "text": '<file name="notes.txt">\nline 1\n\n</file>'},
    ]


def test_a_text_file_alone_is_a_string() -> None:
    data = "data:text/plain;base64," + base64.b64encode(b"x = 1").decode()
    got = messages(
        {"role": "user", "content": [{"type": "input_file", "filename": "a.py", "file_data": data}]}
    )
    assert got == [{"role": "user", "content": '<file name="a.py">\nx = 1\n</file>'}]


def test_assistant_refusal_is_its_words() -> None:
    got = messages(
        user("q"),
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't."}],
        },
        user("ok"),
    )
    assert got[1] == {"role": "assistant", "content": "I can't."}


# -- reasoning restored


def test_sealed_reasoning_is_restored() -> None:
    token = seal_reasoning(KEY, "I should list the files.", nonce=NONCE)
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": token}
    got = translate_request(
        {"model": "m", "input": [user("q"), item, call("c"), output("c")]},
        unseal=lambda t: unseal_reasoning(KEY, t),
    )
    assert got.chat["messages"][1]["reasoning_content"] == "I should list the files."
    assert got.warnings == ()


def test_a_changed_token_is_ignored_never_trusted() -> None:
    token = seal_reasoning(KEY, "secret plan", nonce=NONCE)
    changed = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "a summary"}],
        "encrypted_content": changed,
    }
    got = translate_request(
        {"model": "m", "input": [user("q"), item, call("c"), output("c")]},
        unseal=lambda t: unseal_reasoning(KEY, t),
    )
    # The summary stands in for it; the changed text is nowhere.
    assert got.chat["messages"][1]["reasoning_content"] == "a summary"
    assert "secret" not in json.dumps(got.chat)
    assert len(got.warnings) == 1 and "encrypted_content ignored" in got.warnings[0]


def test_reasoning_content_before_summary() -> None:
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "short"}],
        "content": [{"type": "reasoning_text", "text": "the whole thought"}],
    }
    got = messages(user("q"), item, {"role": "assistant", "content": "a"})
    assert got[1] == {"role": "assistant", "content": "a", "reasoning_content": "the whole thought"}


# -- sealing


def test_seal_round_trip_and_key_id() -> None:
    token = seal_reasoning(KEY, "thought ✓", nonce=NONCE, key_id="k2")
    assert token.startswith("svir1.k2.") and "thought" not in token
    assert sealed_key_id(token) == "k2"
    assert unseal_reasoning({"k2": KEY}, token) == "thought ✓"
    # Under key id "1", a single key stands alone.
    assert unseal_reasoning(KEY, seal_reasoning(KEY, "t", nonce=NONCE)) == "t"


def test_every_changed_character_fails() -> None:
    token = seal_reasoning(KEY, "thought", nonce=NONCE)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
    for i in range(len(token)):
        other = alphabet[(alphabet.index(token[i]) + 1) % len(alphabet)]
        assert unseal_reasoning(KEY, token[:i] + other + token[i + 1 :]) is None, i


@pytest.mark.parametrize(
    "token",
    [
        "",
        "svir1",
        "svir1.1.",
        "svir1.1.AAAA",
        "svir2.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "gAAAAABo-openai-encrypted-content",
        "svir1.1.é",
        "svir1.1." + "A" * 60 + "%",
    ],
)
def test_tokens_that_are_not_svir_s_are_none(token: str) -> None:
    assert unseal_reasoning(KEY, token) is None


def test_another_key_or_key_id_fails() -> None:
    token = seal_reasoning(KEY, "t", nonce=NONCE, key_id="k1")
    assert unseal_reasoning({"k1": bytes(32)}, token) is None
    assert unseal_reasoning({"k9": KEY}, token) is None
    relabelled = token.replace("svir1.k1.", "svir1.k9.")
    assert unseal_reasoning({"k9": KEY}, relabelled) is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"key": b"short"}, "key is"),
        ({"nonce": b"\0" * 8}, "nonce"),
        ({"key_id": "has.dot"}, "key id"),
        ({"key_id": ""}, "key id"),
    ],
)
def test_seal_refuses_bad_arguments(kwargs: dict[str, Any], words: str) -> None:
    args: dict[str, Any] = {"key": KEY, "nonce": NONCE, "key_id": "1", **kwargs}
    key = args.pop("key")
    with pytest.raises(ValueError, match=words):
        seal_reasoning(key, "t", **args)


# -- mistakes, each a named 400


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"input": "hi"}, "model"),
        ({"model": 3, "input": "hi"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": [5]}, "input[0]"),
        ({"model": "m", "input": [{"type": "frobnicate"}]}, "input[0].type"),
        ({"model": "m", "input": [{"type": 1}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "bot", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user"}]}, "input[0].content"),
        ({"model": "m", "input": [{"role": "user", "content": 1}]}, "input[0].content"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "audio"}]}]},
            "input[0].content[0].type",
        ),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}],
            },
            "input[0].content[0].text",
        ),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
            },
            "input[0].content[0].file_id",
        ),
        (
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]}
                ],
            },
            "input[0].content[0].image_url",
        ),
        (
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": [{"type": "input_file", "file_url": "https://x"}]}
                ],
            },
            "input[0].content[0].file_url",
        ),
        (
            {
                "model": "m",
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_file", "filename": "a", "file_data": "%%"}],
                    }
                ],
            },
            "input[0].content[0]",
        ),
        ({"model": "m", "input": [user("q"), output("nope")]}, "input[1].call_id"),
        ({"model": "m", "input": [user("q"), call("c"), user("next")]}, "input[1].call_id"),
        (
            {"model": "m", "input": [user("q"), call("c"), output("c"), output("c")]},
            "input[3].call_id",
        ),
        ({"model": "m", "input": [user("q"), call("c"), call("c")]}, "input[2].call_id"),
        (
            {"model": "m", "input": [user("q"), {**call("c"), "arguments": {}}]},
            "input[1].arguments",
        ),
        ({"model": "m", "input": [user("q"), {**call("c"), "name": ""}]}, "input[1].name"),
        ({"model": "m", "input": [user("q"), call("c"), output("c", 3)]}, "input[2].output"),
        (
            {"model": "m", "input": [{"type": "reasoning", "summary": "x"}]},
            "input[0].summary",
        ),
        (
            {"model": "m", "input": [{"type": "reasoning", "summary": [{"type": "x"}]}]},
            "input[0].summary[0].type",
        ),
        (
            {"model": "m", "input": [{"type": "reasoning", "summary": [], "encrypted_content": 1}]},
            "input[0].encrypted_content",
        ),
        ({"model": "m", "input": [{"type": "additional_tools", "tools": 1}]}, "input[0].tools"),
        ({"model": "m", "input": "hi", "instructions": 1}, "instructions"),
        ({"model": "m", "input": "hi", "tools": {}}, "tools"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "hi", "tools": [{"name": "x"}]}, "tools[0].type"),
        (
            {
                "model": "m",
                "input": "hi",
                "tools": [{"type": "function", "name": "f", "parameters": 1}],
            },
            "tools[0].parameters",
        ),
        (
            {"model": "m", "input": "hi", "tools": [{"type": "namespace", "name": "n"}]},
            "tools[0].tools",
        ),
        ({"model": "m", "input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "x"}},
            "tool_choice.name",
        ),
        ({"model": "m", "input": "hi", "tool_choice": 1}, "tool_choice"),
        ({"model": "m", "input": "hi", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "max_output_tokens": True}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature"),
        ({"model": "m", "input": "hi", "reasoning": "high"}, "reasoning"),
        ({"model": "m", "input": "hi", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"model": "m", "input": "hi", "reasoning": {"effort": ["high"]}}, "reasoning.effort"),
        ({"model": "m", "input": "hi", "reasoning": {"summary": "long"}}, "reasoning.summary"),
        ({"model": "m", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        (
            {
                "model": "m",
                "input": "hi",
                "text": {"format": {"type": "json_schema", "schema": {}}},
            },
            "text.format.name",
        ),
        (
            {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "a"}}},
            "text.format.schema",
        ),
        ({"model": "m", "input": "hi", "text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"model": "m", "input": "hi", "metadata": {"a": 1}}, "metadata.a"),
        ({"model": "m", "input": "hi", "include": "all"}, "include"),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "hi", "store": 1}, "store"),
        ({"model": "m", "input": "hi", "previous_response_id": 1}, "previous_response_id"),
        ({"model": "m", "input": "hi", "user": 1}, "user"),
        ({"model": "m", "input": "hi", "prompt_cache_key": 1}, "prompt_cache_key"),
    ],
)
def test_mistakes_name_the_field(body: Any, param: str | None) -> None:
    got = error(body)
    assert got.param == param
    if param:
        assert got.message.startswith(param)


def test_an_output_answering_a_call_of_the_history() -> None:
    history = [user("q"), call("call_h")]
    assert translate_request({"model": "m", "input": [output("call_h")]}, history=history).chat[
        "messages"
    ][-1] == {"role": "tool", "tool_call_id": "call_h", "content": "ok"}
    # A call of the previous response left unanswered is a mistake, as OpenAI says.
    got = error({"model": "m", "input": [user("and?")]}, history=history)
    assert got.param == "input" and "'call_h' has no function_call_output" in got.message
    # Answered in the history already: a second answer is a mistake.
    got = error({"model": "m", "input": [output("call_h")]}, history=[*history, output("call_h")])
    assert got.param == "input[0].call_id"


def test_ids_come_from_new_id_when_given() -> None:
    made: list[str] = []

    def new_id(prefix: str) -> str:
        made.append(prefix)
        return f"{prefix}_{len(made)}"

    got = translate_request(
        {"model": "m", "input": [user("q"), call("c"), output("c")]}, new_id=new_id
    )
    assert [i["id"] for i in got.input_items] == ["msg_1", "fc_2", "fco_3"]
    # Without it, the same request gets the same ids.
    body = {"model": "m", "input": [user("q"), user("q")]}
    first, second = translate_request(body), translate_request(body)
    assert [i["id"] for i in first.input_items] == [i["id"] for i in second.input_items]
    assert first.input_items[0]["id"] != first.input_items[1]["id"]


# The commonest request is translated without the general walk (`_plain`): to the same result,
# ids included, and anything outside its shape (a mistake among them) goes the general way.
PLAIN_BODIES: list[dict[str, Any]] = [
    {"model": "m", "input": "hi"},
    {"model": "m", "input": "hi", "stream": True, "store": False},
    {"model": "m", "input": "hi", "stream": None, "store": None, "instructions": ""},
    {"model": "m", "input": "hi", "instructions": "Be brief."},
    {
        "model": "m",
        "input": [
            {"role": "user", "content": "a"},
            {"type": "message", "role": "user", "content": ""},
        ],
        "instructions": "Be brief.",
        "store": True,
        "stream": False,
    },
    # Outside the shape: the general walk's, whatever `_plain` makes of the first items.
    {
        "model": "m",
        "input": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    },
    {"model": "m", "input": [{"role": "user", "content": "a", "id": "msg_given"}]},
    {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]},
    {"model": "m", "input": [{"type": None, "role": "user", "content": "a"}]},
    {"model": "m", "input": "hi", "temperature": 1},
]


def _translated(body: dict[str, Any], *, walk: bool) -> bytes:
    """The translation's encoding (every field, in order: the echo's too), ids counted from 0."""
    made = iter(range(100))
    with pytest.MonkeyPatch.context() as mp:
        if walk:
            mp.setattr("svir.protocols.responses.request._PLAIN_FIELDS", frozenset())
        t = translate_request(body, new_id=lambda prefix: f"{prefix}_{next(made)}")
    return msgspec.json.encode(t)


def test_the_plain_bodies_take_the_plain_way() -> None:
    taken = [_plain(body, None) is not None for body in PLAIN_BODIES]
    assert taken == [True] * 5 + [False] * (len(PLAIN_BODIES) - 5)


@pytest.mark.parametrize("body", PLAIN_BODIES)
def test_a_plain_request_translates_as_the_general_walk_does(body: dict[str, Any]) -> None:
    assert _translated(body, walk=False) == _translated(body, walk=True)
    # Without new_id, the ids derived from the item and its place are the same too.
    with pytest.MonkeyPatch.context() as mp:
        plain = translate_request(body)
        mp.setattr("svir.protocols.responses.request._PLAIN_FIELDS", frozenset())
        assert translate_request(body) == plain


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "hi", "store": 1}, "store"),
        ({"model": "m", "input": "hi", "instructions": 3}, "instructions"),
        ({"model": "", "input": "hi"}, "model"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "user"}]}, "input[0].content"),
    ],
)
def test_a_plain_shaped_mistake_is_the_general_walks_error(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(ResponsesRequestError) as caught:
        translate_request(body)
    assert caught.value.param == param
