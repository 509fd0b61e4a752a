"""One mechanism per job across the front ends (issue 14): the same mistake reads the same in
the OpenAI chat core, the Ollama translation and the threads API."""

from __future__ import annotations

from typing import Any

import pytest

from svir.errors import BadRequest, GatewayError, OllamaError
from svir.protocols.ollama.request import to_openai_request
from svir.providers import validate_chat_request, validate_chat_settings
from svir.threads.content import Limits, parse_messages
from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown
from svir.wire.request import build_messages

LIMITS = Limits(max_attachment_bytes=1 << 20)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "null"),
        (True, "a boolean"),
        (3, "a number"),
        (2.5, "a number"),
        ("x", "a string"),
        ([1], "an array"),
        ({"a": 1}, "an object"),
    ],
)
def test_json_type_names_every_json_type(value: Any, words: str) -> None:
    assert json_type(value) == words


def test_shown_quotes_strings_cut_at_forty_and_names_other_types() -> None:
    assert shown("bot") == "'bot'"
    assert shown("x" * 50) == repr("x" * 40 + "…")
    assert shown([]) == "an array"


def test_the_chat_core_names_json_types_not_python_types() -> None:
    # It said "not list" and "not int" where the other front ends said "not an array".
    with pytest.raises(BodyError) as exc:
        build_messages([{"role": "user", "content": 5}], reasoning_key=None)
    assert exc.value.args[0].endswith("not a number")
    with pytest.raises(BodyError) as exc:
        build_messages([{"role": "assistant", "tool_calls": {}}], reasoning_key=None)
    assert exc.value.args[0] == "messages[0].tool_calls must be an array, not an object"


def _ollama_error(body: Any) -> str:
    with pytest.raises(OllamaError) as exc:
        to_openai_request(body)
    return exc.value.message


def _threads_error(body: Any) -> str:
    with pytest.raises(GatewayError) as exc:
        parse_messages(body, LIMITS)
    return exc.value.error.message


def _chat_error(messages: Any) -> str:
    with pytest.raises(BodyError) as exc:
        build_messages(messages, reasoning_key=None)
    return str(exc.value.args[0])


def test_a_message_that_is_not_an_object_reads_the_same_everywhere() -> None:
    words = "messages[0] must be an object, not an array"
    assert _chat_error([[]]) == words
    assert _ollama_error({"model": "m", "messages": [[]]}) == words
    assert _threads_error({"messages": [[]]}) == words


def test_one_data_url_rule_set_for_the_chat_core_and_the_threads_api() -> None:
    # The chat core took any "x/y" as a media type, the threads API only RFC 6838 tokens.
    url = "data:image/p<n>g;base64,AAAA"
    chat = _chat_error([{"role": "user", "content": [{"type": "image_url", "image_url": url}]}])
    threads = _threads_error(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    )
    assert chat == "messages[0].content[0].image_url.url: 'image/p<n>g' is not a media type"
    assert threads.endswith(": 'image/p<n>g' is not a media type")


def test_bad_base64_reads_the_same_in_ollama_and_the_chat_core() -> None:
    ollama = _ollama_error(
        {"model": "m", "messages": [{"role": "user", "content": "", "images": ["@@@@"]}]}
    )
    file_part = {"type": "file", "file": {"filename": "a", "file_data": "@@@@"}}
    chat = _chat_error([{"role": "user", "content": [file_part]}])
    assert ollama.startswith("messages[0].images[0]: the data is not valid base64 (")
    assert chat.startswith("messages[0].content[0].file.file_data: the data is not valid base64 (")


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"content": "hi"}, "messages[0].role is missing"),
        ({"role": 5, "content": "hi"}, "messages[0].role must be a string, not a number"),
        ({"role": "bot", "content": "hi"}, "messages[0].role: unknown role 'bot'"),
    ],
)
def test_a_bad_role_reads_the_same_in_the_chat_core_and_ollama(
    message: dict[str, Any], words: str
) -> None:
    # Ollama said "role must be a string, not null" for a missing role; the chat core said
    # "unknown role a number" for a role that is not a string.
    assert _chat_error([message]) == words
    assert _ollama_error({"model": "m", "messages": [message]}) == words


def test_the_threads_api_checks_a_role_in_the_same_words() -> None:
    # A missing role is a user message there; any other mistake reads as everywhere.
    assert _threads_error({"messages": [{"role": 5, "content": "hi"}]}) == (
        "messages[0].role must be a string, not a number"
    )
    assert _threads_error({"messages": [{"role": "bot", "content": "hi"}]}) == (
        "messages[0].role: unknown role 'bot'"
    )
    messages, single = parse_messages({"content": "hi"}, LIMITS)
    assert single and messages[0].role == "user"


def test_chat_settings_are_checked_without_messages() -> None:
    # The threads API sends a thread's messages: it checks the rest with no stand-in message.
    assert validate_chat_settings({"model": "lab/m", "temperature": 1}) == {
        "model": "lab/m",
        "temperature": 1,
    }
    with pytest.raises(BadRequest) as exc:
        validate_chat_settings({"model": "lab/m", "temperature": "hot"})
    assert exc.value.message == "temperature must be a number, not a string"
    with pytest.raises(BadRequest) as exc:
        validate_chat_request({"model": "lab/m", "temperature": 1})
    assert exc.value.message == "messages is required"


def test_a_tool_result_reads_the_same_in_the_chat_core_and_the_threads_api() -> None:
    # The threads API said "every text part needs a string text"; it now names the part.
    content = [{"type": "text", "text": 5}]
    chat = _chat_error([{"role": "tool", "tool_call_id": "c", "content": content}])
    threads = _threads_error(
        {"messages": [{"role": "tool", "tool_call_id": "c", "content": content}]}
    )
    assert chat == threads == "messages[0].content[0].text must be a string, not a number"
    parts = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": ""},
        {"type": "text", "text": "b"},
    ]
    messages, _ = parse_messages({"role": "tool", "tool_call_id": "c", "content": parts}, LIMITS)
    built = build_messages(
        [{"role": "tool", "tool_call_id": "c", "content": parts}], reasoning_key=None
    )
    assert messages[0].content == [{"type": "text", "text": "a\nb"}]
    assert built[0]["content"] == "a\nb"
    structured, _ = parse_messages(
        {"role": "tool", "tool_call_id": "c", "content": {"x": 1}}, LIMITS
    )
    assert structured[0].content == [{"type": "text", "text": '{"x":1}'}]
