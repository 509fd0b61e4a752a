"""A client's chat request checked, then rewritten into the body one upstream kind is sent."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any, Final

from svir.providers.base import ProviderKind
from svir.wire.request import build_messages

if TYPE_CHECKING:
    from svir.config import ProviderConfig

__all__ = ["RequestError", "build_upstream_body", "split_model", "validate_chat_request"]

# Fields rebuilt rather than copied: the rewriting below decides their values.
_REBUILT: Final = frozenset(
    {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}
)
_LIMIT_NAMES: Final = frozenset({"max_tokens", "max_completion_tokens"})
# Tool settings that mean nothing without tools, and that OpenAI and Azure reject alone (§2.4).
_TOOL_SETTINGS: Final = ("tool_choice", "parallel_tool_calls")


class RequestError(Exception):
    """A client's request that svir will not send upstream; it becomes a 400 for the client.

    `param` names the offending field, `code` says what is wrong with it, as OpenAI's errors do.
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return f"RequestError({self.message!r}, param={self.param!r}, code={self.code!r})"


def split_model(model: str) -> tuple[str, str]:
    """`"lab/org/model"` → `("lab", "org/model")`: the provider name, then the upstream's id."""
    if not isinstance(model, str):
        raise RequestError(
            f"model must be a string, not {_json_type(model)}", "model", "invalid_type"
        )
    prefix, slash, model_id = model.partition("/")
    if not slash or not prefix or not model_id:
        raise RequestError(
            f"model {_show(model)} must be '<provider>/<model-id>', as listed by /v1/models",
            "model",
        )
    return prefix, model_id


def validate_chat_request(body: Any) -> dict[str, Any]:
    """Check the fields svir itself relies on and return the body, unchanged.

    Everything else is left to the upstream, which knows its own limits. Messages are checked in
    depth when the upstream body is built. Raises RequestError and nothing else.
    """
    if not isinstance(body, dict):
        raise RequestError(
            f"the request body must be a JSON object, not {_json_type(body)}", None, "invalid_type"
        )
    model = body.get("model")
    if model is None or model == "":
        raise RequestError("model is required", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise RequestError(
            f"model must be a string, not {_json_type(model)}", "model", "invalid_type"
        )
    # Whether the name is a route or `<provider>/<model-id>` is the router's to say (404).

    messages = body.get("messages")
    if messages is None:
        raise RequestError("messages is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise RequestError(
            f"messages must be an array, not {_json_type(messages)}", "messages", "invalid_type"
        )
    if not messages:
        raise RequestError("messages must not be empty", "messages")

    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(
            f"stream must be a boolean, not {_json_type(stream)}", "stream", "invalid_type"
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(
            f"stream_options must be an object, not {_json_type(options)}",
            "stream_options",
            "invalid_type",
        )

    n = body.get("n")
    if n is not None:
        _check_positive_int("n", n)
        if n > 1:
            # The stream carries one choice (§3.2); more would need n streams merged into one.
            raise RequestError("only n=1 is supported", "n", "unsupported_value")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None:
            _check_positive_int(key, value)
    _check_response_format(body.get("response_format"))
    return body


_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_response_format(rf: Any) -> None:
    if rf is None:
        return
    if not isinstance(rf, dict):
        raise RequestError(
            f"response_format must be an object, not {_json_type(rf)}",
            "response_format",
            "invalid_type",
        )
    kind = rf.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise RequestError(
            "response_format.type must be 'text', 'json_object' or 'json_schema', "
            f"not {_show(str(kind))}",
            "response_format.type",
            "invalid_value",
        )
    if kind != "json_schema":
        return
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError(
            "response_format.json_schema must be an object with a name and a schema",
            "response_format.json_schema",
            "invalid_type",
        )
    name = spec.get("name")
    # The name is required, of ASCII letters, digits, '_' and '-', at most 64 (§2.6).
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise RequestError(
            "response_format.json_schema.name must be 1 to 64 ASCII letters, digits, '_' or '-'",
            "response_format.json_schema.name",
            "invalid_value",
        )
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise RequestError(
            "response_format.json_schema.schema must be an object",
            "response_format.json_schema.schema",
            "invalid_type",
        )


def _check_positive_int(key: str, value: Any) -> None:
    # bool is an int in Python but not in JSON.
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(
            f"{key} must be an integer, not {_json_type(value)}", key, "invalid_type"
        )
    if value < 1:
        raise RequestError(f"{key} must be at least 1, not {value}", key)


def build_upstream_body(
    client: dict[str, Any], *, kind: ProviderKind, provider: ProviderConfig, model_id: str
) -> dict[str, Any]:
    """The body sent upstream for a request that passed `validate_chat_request`.

    The result shares no mutable object with `client`, which is left as it was. A message that
    cannot be sent raises svir.wire.errors.BodyError, naming the message and field; it is the
    client's fault, to be answered as a bad `messages`.
    """
    messages = build_messages(client["messages"], reasoning_key=kind.reasoning_key)

    # Usage is always asked for, whatever the client wants: svir keeps it for every call, and
    # whether the client sees it is decided when the stream is written back.
    stream_options = copy.deepcopy(client.get("stream_options") or {})
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
        if key in _REBUILT or value is None:
            continue
        body[key] = copy.deepcopy(value)

    if body.get("n") == 1:
        del body["n"]
    if not body.get("tools"):
        # An empty tool list offers nothing, and some servers reject it as too short.
        body.pop("tools", None)
        for key in _TOOL_SETTINGS:
            body.pop(key, None)
    dropped = kind.drop_params_for(provider)
    if dropped & _LIMIT_NAMES:
        # Either name means the output cap, whichever one this kind is sent.
        dropped = dropped | _LIMIT_NAMES
    for key in dropped:
        body.pop(key, None)
    return kind.adapt_body(body)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:60] + "…")
