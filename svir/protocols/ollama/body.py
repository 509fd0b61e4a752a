"""Ollama's `/api/chat` and `/api/generate` request bodies as msgspec structs, and msgspec's type
errors in the words of svir's 400s ("messages[0].content must be a string, not an array").

`decode_chat` and `decode_generate` convert the decoded body (a front end reads every body with
`read_json`, which bounds its nesting); a mistake is an `OllamaError` naming the field in Ollama's
own form (`messages[0].tool_calls[1].function.name`, msgspec's path as it is). Messages are a
tagged union on their `role`, so each role reads only its own fields; fields the structs do not
name are ignored, as Ollama ignores them. What svir passes on or checks elsewhere stays as the
client sent it: a schema `format` and a call's `arguments` are `dict[str, Any]`, and `tools` are
checked as every front end's tools are (svir.providers.check_tools), in the same words.

Where a body has several mistakes the first in the body's own key order is named (msgspec's
order), a missing field last.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from svir.errors import OllamaError
from svir.wire.jsonbody import json_type, mistake, shown, value_at

__all__ = [
    "FORMAT_MUST",
    "THINK_MUST",
    "AssistantMessage",
    "ChatBody",
    "GenerateBody",
    "Message",
    "Options",
    "OtherMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "decode_chat",
    "decode_generate",
    "decode_option",
]

_INT64: Final = 2**63
# An integer Ollama takes (int64), or a number JSON wrote with a fraction, whose being whole the
# translation checks (Ollama reads 128.0 as 128).
Integer = Annotated[int, msgspec.Meta(ge=1 - _INT64, le=_INT64 - 1)] | float
# A finite number: JSON has no other, but a value that is not JSON may be infinite.
Number = (
    Annotated[int, msgspec.Meta(ge=1 - _INT64, le=_INT64 - 1)]
    | Annotated[float, msgspec.Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]
)


class _Message(msgspec.Struct, frozen=True, gc=False, tag_field="role"):
    # Ollama's clients leave empty fields out, so a missing content is the empty string.
    content: str | None = None


class UserMessage(_Message, frozen=True, gc=False, tag="user"):
    images: list[str] | None = None


class Function(msgspec.Struct, frozen=True, gc=False):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    # An object, or the OpenAI form's JSON text, which some clients send back as they got it.
    arguments: dict[str, Any] | str | None = None


class ToolCall(msgspec.Struct, frozen=True, gc=False):
    function: Function
    id: str | None = None


# Only a user message takes images: another's must be empty (or null).
NoImages = Annotated[list[Any], msgspec.Meta(max_length=0)] | None


class AssistantMessage(_Message, frozen=True, gc=False, tag="assistant"):
    images: NoImages = None
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Message, frozen=True, gc=False, tag="tool"):
    images: NoImages = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class OtherMessage(_Message, frozen=True, gc=False, tag="system"):
    images: NoImages = None


class DeveloperMessage(OtherMessage, frozen=True, gc=False, tag="developer"):
    pass


Message = UserMessage | AssistantMessage | ToolMessage | OtherMessage | DeveloperMessage


class Options(msgspec.Struct, frozen=True, gc=False):
    """The options that have an OpenAI field of the same meaning; the rest (load-time options such
    as num_ctx, and samplers OpenAI does not define such as top_k) are not read here."""

    temperature: Number | None = None
    top_p: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    num_predict: Integer | None = None
    seed: Integer | None = None
    stop: str | list[str] | None = None


class _Head(msgspec.Struct, frozen=True, gc=False):
    model: str | None = None
    # `model`'s name before Ollama 0.1.30, which clients still send: read (and checked) only when
    # `model` is missing or empty.
    name: Any = None
    stream: bool | None = None
    options: Options | None = None


class ChatBody(_Head, frozen=True, gc=False):
    messages: list[Message] | None = None
    tools: Any = None  # checked by svir.providers.check_tools, as every front end's tools
    format: str | dict[str, Any] | None = None
    think: bool | str | None = None


class GenerateBody(_Head, frozen=True, gc=False):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool | None = None
    context: list[Any] | None = None
    # Read as /api/chat reads them, in the chat the prompt becomes (or refused with raw: true).
    images: list[Any] | None = None
    format: Any = None
    think: Any = None


def decode_chat(body: Any) -> ChatBody:
    """An `/api/chat` body as a ChatBody; OllamaError (400) names its first mistake."""
    try:
        return msgspec.convert(body, ChatBody)
    except msgspec.ValidationError as exc:
        raise _refusal(body, exc) from None


def decode_generate(body: Any) -> GenerateBody:
    """An `/api/generate` body as a GenerateBody; OllamaError (400) names its first mistake."""
    try:
        return msgspec.convert(body, GenerateBody)
    except msgspec.ValidationError as exc:
        raise _refusal(body, exc) from None


def decode_option(body: dict[str, Any], name: str) -> int | float | None:
    """An integer option the translation reads on its own (`top_k`, `num_ctx`), of a body whose
    options are an object; OllamaError when it is no number."""
    try:
        value: int | float | None = msgspec.convert(body["options"].get(name), Integer | None)
    except msgspec.ValidationError as exc:
        raise _refusal(body, exc, ["options", name]) from None
    return value


# -- msgspec's errors in svir's words

# The words of fields whose mistakes Ollama's errors say their own way, whatever was wrong (also
# a mistake of meaning: a string that is no level, no format).
THINK_MUST: Final = 'must be true, false, "low", "medium" or "high"'
FORMAT_MUST: Final = 'must be "json" or a JSON schema'
_WHAT: Final = {
    "str": "a string",
    "object": "an object",
    "bool": "a boolean",
    "array": "an array",
}


def _refusal(
    body: Any, error: msgspec.ValidationError, prefix: list[str | int] | None = None
) -> OllamaError:
    found = mistake(error)
    keys = (prefix or []) + found.keys
    if keys[:2] == ["options", "stop"]:
        keys = keys[:2]  # a stop's mistake is the whole list's
    value = value_at(body, keys)
    where = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in keys)[1:]
    return OllamaError(f"{where}{_worded(body, keys, value, found.expected, found.missing)}")


def _worded(body: Any, keys: list[str | int], value: Any, what: str | None, missing: bool) -> str:
    """The words after the field's name for the mistake at `keys` in the body, whose value is
    `value`."""
    got = json_type(value)
    if not keys:
        return f"the request body must be a JSON object, not {got}"
    last = keys[-1]
    n = len(keys)
    if keys == ["format"]:
        return f" {FORMAT_MUST}, not {shown(value)}"
    if keys == ["think"]:
        return f" {THINK_MUST}, not {shown(value)}"
    if keys == ["options", "stop"]:
        return " must be an array of strings"
    if last == "role" and n == 3:  # in the words of every front end (svir.wire.request)
        if missing or value is None:
            return " is missing"
        if isinstance(value, str):
            return f": unknown role {shown(value)}"
    if n == 3 and last == "images" and isinstance(value, list):
        return f": only user messages take images, not {value_at(body, [*keys[:2], 'role'])}"
    if n == 4 and keys[2] == "images":
        return f" must be a base64 string, not {got}"
    if n == 6 and keys[2] == "tool_calls" and last == "name":
        return " must be a non-empty string"
    if n == 6 and keys[2] == "tool_calls" and last == "arguments":  # or the OpenAI form's text
        return f" must be an object, not {got}"
    if keys[0] == "options" and n == 2:  # an Integer or a Number
        if isinstance(value, int | float) and not isinstance(value, bool):
            return " must be a finite number" if isinstance(value, float) else " is out of range"
        integer = last in ("num_predict", "seed", "top_k")
        return f" must be {'an integer' if integer else 'a number'}, not {got}"
    if missing:  # a required object (a call's `function`): a missing one is null
        return f" must be an object, not {got}"
    said = _WHAT.get(what or "")
    return f" must be {said or what}, not {got}"
