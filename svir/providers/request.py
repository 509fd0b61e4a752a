"""A client's chat request checked, then rewritten into the body one upstream kind is sent.

Every front end (OpenAI chat, Ollama's API once translated, thread continues) checks its request
here, so that the same mistake gets the same words wherever it is made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from svir.errors import BadRequest
from svir.providers.base import ProviderKind, ProviderSettings
from svir.wire.jsonbody import json_type, shown
from svir.wire.request import EFFORT_KEY, THINKING_KEY, build_messages

__all__ = [
    "build_upstream_body",
    "check_chat_fields",
    "check_tools",
    "split_model",
    "validate_chat_request",
    "validate_chat_settings",
]

# Fields rebuilt rather than copied: the rewriting below decides their values.
_REBUILT: Final = frozenset(
    {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}
)
# Fields never copied: the rebuilt ones, and an Anthropic client's thinking object and effort,
# which only the anthropic kind's own body builder reads (svir.providers.anthropic_dialect).
_NOT_COPIED: Final = _REBUILT | {THINKING_KEY, EFFORT_KEY}
# A tool's cache mark (Anthropic's, which the Messages request side keeps for an Anthropic
# upstream): OpenAI-compatible servers take no such key on a tool, and OpenAI refuses it.
_TOOL_MARK: Final = "cache_control"
_LIMIT_NAMES: Final = frozenset({"max_tokens", "max_completion_tokens"})
# Tool settings that mean nothing without tools, and that OpenAI and Azure reject alone (§2.4).
_TOOL_SETTINGS: Final = ("tool_choice", "parallel_tool_calls")


def split_model(model: str) -> tuple[str, str]:
    """`"lab/org/model"` → `("lab", "org/model")`: the provider name, then the upstream's id."""
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, not {json_type(model)}", "model", "invalid_type")
    prefix, slash, model_id = model.partition("/")
    if not slash or not prefix or not model_id:
        raise BadRequest(
            f"model {shown(model)} must be '<provider>/<model-id>', as listed by /v1/models",
            "model",
        )
    return prefix, model_id


def validate_chat_request(body: Any) -> dict[str, Any]:
    """Check a chat request and return the body, unchanged.

    `model` and `messages` must be there; every other field OpenAI's Chat Completions defines is
    checked as `check_chat_fields` says. Messages are checked in depth when the upstream body is
    built. Raises BadRequest and nothing else, for any JSON value.
    """
    checked = _check_model(body)
    messages = checked.get("messages")
    if messages is None:
        raise BadRequest("messages is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise BadRequest(
            f"messages must be an array, not {json_type(messages)}", "messages", "invalid_type"
        )
    if not messages:
        raise BadRequest("messages must not be empty", "messages")
    check_chat_fields(checked)
    return checked


def validate_chat_settings(body: Any) -> dict[str, Any]:
    """Check a chat request whose messages come from elsewhere (a thread's) and return it: as
    `validate_chat_request`, with `messages` left out of it."""
    checked = _check_model(body)
    check_chat_fields(checked)
    return checked


def _check_model(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(
            f"the request body must be a JSON object, not {json_type(body)}", None, "invalid_type"
        )
    model = body.get("model")
    if model is None or model == "":
        raise BadRequest("model is required", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise BadRequest(f"model must be a string, not {json_type(model)}", "model", "invalid_type")
    # Whether the name is a route or `<provider>/<model-id>` is the router's to say (404).
    return body


def check_chat_fields(body: Mapping[str, Any]) -> None:
    """Check the fields of a chat request other than `model` and `messages`.

    Each field OpenAI's Chat Completions defines must have its type (null is "not set"), so that
    a wrong one is the client's 400 and not a failure further in; what svir relies on is checked
    in depth (`tools`, `response_format`, `stream_options`, `n`, the token limits). Values within
    their type, and fields OpenAI does not define, are left to the upstream, which knows its own
    limits. Raises BadRequest.
    """
    for key, value in body.items():
        if value is None:
            continue
        check = _FIELD_CHECKS.get(key)
        if check is not None:
            check(key, value)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """`tools`: an array of function tools, each with a name; raises BadRequest."""
    if not isinstance(tools, list):
        raise BadRequest(f"tools must be an array, not {json_type(tools)}", "tools", "invalid_type")
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise BadRequest(
                f"{where} must be an object, not {json_type(tool)}", where, "invalid_type"
            )
        kind = tool.get("type")
        if kind is not None and kind != "function":
            # svir's stream carries function calls only (§3).
            raise BadRequest(f"{where}.type must be 'function', not {shown(kind)}", where)
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise BadRequest(
                f"{where}.function must be an object, not {json_type(fn)}",
                f"{where}.function",
                "invalid_type",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(
                f"{where}.function.name must be a non-empty string", f"{where}.function.name"
            )
        description = fn.get("description")
        if description is not None:
            _STRING(f"{where}.function.description", description)
        parameters = fn.get("parameters")
        if parameters is not None:
            _OBJECT(f"{where}.function.parameters", parameters)
    return tools


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # bool is an int in Python but not in JSON.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _is_array(value: Any) -> bool:
    return isinstance(value, list)


def _is_choice(value: Any) -> bool:
    return isinstance(value, str | dict)


_Check = Callable[[str, Any], None]


def _typed(what: str, ok: Callable[[Any], bool]) -> _Check:
    """A check that `key`'s value is `what` (a JSON type, in words)."""

    def check(key: str, value: Any) -> None:
        if not ok(value):
            raise BadRequest(f"{key} must be {what}, not {json_type(value)}", key, "invalid_type")

    return check


_BOOLEAN = _typed("a boolean", _is_bool)
_NUMBER = _typed("a number", _is_number)
_INTEGER = _typed("an integer", _is_integer)
_STRING = _typed("a string", _is_string)
_OBJECT = _typed("an object", _is_object)
_ARRAY = _typed("an array", _is_array)
_CHOICE = _typed("a string or an object", _is_choice)


def _check_stream_options(key: str, value: Any) -> None:
    _OBJECT(key, value)
    usage = value.get("include_usage")
    if usage is not None:
        _BOOLEAN(f"{key}.include_usage", usage)


def _check_stop(key: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise BadRequest(
            f"{key} must be a string or an array of strings, not {json_type(value)}",
            key,
            "invalid_type",
        )
    for i, item in enumerate(value):
        _STRING(f"{key}[{i}]", item)


def _check_n(key: str, value: Any) -> None:
    _check_positive_int(key, value)
    if value > 1:
        # The stream carries one choice (§3.2); more would need n streams merged into one.
        raise BadRequest("only n=1 is supported", "n", "unsupported_value")


def _check_tools_field(key: str, value: Any) -> None:
    check_tools(value)


_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_response_format(key: str, rf: Any) -> None:
    if not isinstance(rf, dict):
        raise BadRequest(
            f"response_format must be an object, not {json_type(rf)}",
            "response_format",
            "invalid_type",
        )
    kind = rf.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            "response_format.type must be 'text', 'json_object' or 'json_schema', "
            f"not {shown(kind)}",
            "response_format.type",
            "invalid_value",
        )
    if kind != "json_schema":
        return
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            "response_format.json_schema must be an object with a name and a schema",
            "response_format.json_schema",
            "invalid_type",
        )
    name = spec.get("name")
    # The name is required, of ASCII letters, digits, '_' and '-', at most 64 (§2.6).
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise BadRequest(
            "response_format.json_schema.name must be 1 to 64 ASCII letters, digits, '_' or '-'",
            "response_format.json_schema.name",
            "invalid_value",
        )
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise BadRequest(
            "response_format.json_schema.schema must be an object",
            "response_format.json_schema.schema",
            "invalid_type",
        )


def _check_positive_int(key: str, value: Any) -> None:
    _INTEGER(key, value)
    if value < 1:
        raise BadRequest(f"{key} must be at least 1, not {value}", key)


# Every field of OpenAI's Chat Completions request but `model` and `messages`, and its check.
_FIELD_CHECKS: Final[Mapping[str, _Check]] = {
    "stream": _BOOLEAN,
    "stream_options": _check_stream_options,
    "n": _check_n,
    "max_tokens": _check_positive_int,
    "max_completion_tokens": _check_positive_int,
    "response_format": _check_response_format,
    "tools": _check_tools_field,
    "tool_choice": _CHOICE,
    "parallel_tool_calls": _BOOLEAN,
    "functions": _ARRAY,
    "function_call": _CHOICE,
    "stop": _check_stop,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "frequency_penalty": _NUMBER,
    "presence_penalty": _NUMBER,
    "seed": _INTEGER,
    "logprobs": _BOOLEAN,
    "top_logprobs": _INTEGER,
    "logit_bias": _OBJECT,
    "user": _STRING,
    "metadata": _OBJECT,
    "store": _BOOLEAN,
    "reasoning_effort": _STRING,
    "verbosity": _STRING,
    "service_tier": _STRING,
    "modalities": _ARRAY,
    "audio": _OBJECT,
    "prediction": _OBJECT,
    "web_search_options": _OBJECT,
    "prompt_cache_key": _STRING,
    "safety_identifier": _STRING,
}


def build_upstream_body(
    client: dict[str, Any], *, kind: ProviderKind, provider: ProviderSettings, model_id: str
) -> dict[str, Any]:
    """The body sent upstream for a request that passed `validate_chat_request`.

    `client` is left as it was, whatever is done to the result's fields: the messages and
    `stream_options` are built anew, and the other values are the client's own, shared, not
    copied (a copy would walk the client's JSON again for every attempt); nothing here or in a
    kind's `adapt_body` changes them in place, it replaces them. A message that cannot be sent
    raises svir.wire.errors.BodyError, naming the message and field; it is the client's fault, to
    be answered as a bad `messages`.

    A kind that speaks another API (`ProviderKind.build_body`, Anthropic's) builds its own body
    from the same request; the dropping and the kind's `adapt_body` apply to it as to this one.
    """
    if kind.build_body is not None:
        return _finished(kind.build_body(client, model_id), kind, provider)
    messages = build_messages(client["messages"], reasoning_key=kind.reasoning_key)

    # Usage is always asked for, whatever the client wants: svir keeps it for every call, and
    # whether the client sees it is decided when the stream is written back.
    stream_options = dict(client.get("stream_options") or {})
    stream_options["include_usage"] = True
    body: dict[str, Any] = {
        "model": model_id,
        "messages": messages,
        "stream": True,
        "stream_options": stream_options,
    }

    # max_completion_tokens is the newer name; a client that sends both means it.
    limit = client.get("max_completion_tokens")
    if limit is None:
        limit = client.get("max_tokens")
    if limit is not None:
        body[kind.max_tokens_field] = limit

    for key, value in client.items():
        # null means "not set" in this API, and leaving it out says so to every server, including
        # those that would reject a null.
        if key in _NOT_COPIED or value is None:
            continue
        body[key] = value

    if body.get("n") == 1:
        del body["n"]
    tools = body.get("tools")
    if not tools:
        # An empty tool list offers nothing, and some servers reject it as too short.
        body.pop("tools", None)
        for key in _TOOL_SETTINGS:
            body.pop(key, None)
    elif any(_TOOL_MARK in t for t in tools):
        body["tools"] = [{k: v for k, v in t.items() if k != _TOOL_MARK} for t in tools]
    return _finished(body, kind, provider)


def _finished(
    body: dict[str, Any], kind: ProviderKind, provider: ProviderSettings
) -> dict[str, Any]:
    """The body without the fields the provider drops, through the kind's `adapt_body`."""
    dropped = kind.drop_params_for(provider)
    if dropped & _LIMIT_NAMES:
        # Either name means the output cap, whichever one this kind is sent.
        dropped = dropped | _LIMIT_NAMES
    for key in dropped:
        body.pop(key, None)
    return kind.adapt_body(body)
