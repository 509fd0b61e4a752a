"""An OpenAI Responses request (`POST /v1/responses`) as svir's canonical chat request, the OpenAI
Chat Completions body every upstream kind is built from.

`translate_request` is the whole translation, pure; the front end loads the items of the
`previous_response_id` chain from its store and passes them as `history`, checks the result as
any chat request (`validate_chat_request`), turns `warnings` into `x-svir-warning`, and keeps
`input_items` and `echo` for the response object and the store. Every client mistake is a
`ResponsesRequestError` naming the field as OpenAI does (`input[3].call_id`), for a 400 in
OpenAI's error shape; nothing else escapes for any JSON value. Field by field:

- `input`: a string (one user message) or items, and the history's items before them, as the
  chat messages they make (svir.protocols.responses.items: messages, the assistant side of a
  turn as one assistant message, function calls and their outputs, reasoning restored from a
  token svir sealed (svir.protocols.responses.sealed; null, Codex's, is nothing), item
  references). `instructions` is the first system message.
- tools: `function` tools as chat functions, a `namespace` tool's functions each as one flat
  function, which `names` maps back to (namespace, name) for the output, and the tools of
  `additional_tools` input items (svir.protocols.responses.tools).
  Tool types no upstream of svir runs (web_search, file_search, image_generation, computer,
  local_shell, shell, apply_patch, mcp, code_interpreter, custom/grammar tools, tool_search) are
  dropped with a warning, as are items those tools leave in a history.
- `tool_choice` (auto, none, required, a function, allowed_tools as a filter of the offered
  tools); `parallel_tool_calls`; `max_output_tokens` -> `max_tokens`; `temperature`, `top_p`;
  `reasoning.effort` -> `reasoning_effort`; `text.format` json_schema / json_object ->
  `response_format` (text is the default and sent as nothing); `text.verbosity` -> `verbosity`;
  `user`, `safety_identifier` and `prompt_cache_key` as they are.
- Kept for the front end, not sent upstream: `stream`, `store` (default true),
  `previous_response_id`, `reasoning.summary`, `include`, `metadata`, and the fields a response
  object repeats (`echo`). `truncation`, `service_tier`, `background: false`, `top_logprobs`,
  `max_tool_calls`, `stream_options`, `prompt_cache_retention`, `context_management` are
  accepted and ignored; `background: true`, `conversation` and `prompt` are refused (svir has no
  background runs, conversations or stored prompts); any other field is ignored with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from svir.protocols.responses.checks import ResponsesRequestError, Warnings, check
from svir.protocols.responses.items import ID_PREFIXES, Conversation, fresh_id
from svir.protocols.responses.tools import ToolTable
from svir.wire.jsonbody import json_type, shown

__all__ = ["ResponsesRequest", "translate_request"]


class ResponsesRequest(msgspec.Struct, frozen=True):
    """A translated request.

    - `chat`: the canonical chat request, for validate_chat_request;
    - `warnings`: what was dropped or ignored, one line each (for `x-svir-warning`);
    - `stream`, `store` (OpenAI's default: true), `previous_response_id`;
    - `summary`: `reasoning.summary` (auto, concise, detailed) or None: whether reasoning is
      streamed as summary parts or as reasoning text;
    - `include_encrypted`: whether `include` asks for `reasoning.encrypted_content`;
    - `names`: a flat function name offered upstream -> (namespace, name), for namespace tools;
    - `input_items`: this request's input as items, each with an id (as input_items lists them);
    - `echo`: the request fields a response object repeats (`previous_response_id` among them),
      with OpenAI's defaults, in the response object's order;
    - `cache_key`: `prompt_cache_key`, to keep a conversation on one deployment;
    - `image_urls`: whether an image is given by URL (not every upstream fetches one);
    - `metadata`: the request's metadata (strings), for the response object.
    """

    chat: dict[str, Any]
    warnings: tuple[str, ...] = ()
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    summary: str | None = None
    include_encrypted: bool = False
    names: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)
    input_items: list[dict[str, Any]] = msgspec.field(default_factory=list)
    echo: dict[str, Any] = msgspec.field(default_factory=dict)
    cache_key: str | None = None
    image_urls: bool = False
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


# Fields translated below.
_TRANSLATED: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "reasoning",
        "text",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "include",
        "stream",
        "store",
        "previous_response_id",
        "background",
        "conversation",
        "prompt",
    }
)
# Fields known and deliberately not translated: they change nothing svir can honour (no warning).
_IGNORED: Final = frozenset(
    {
        "truncation",
        "service_tier",
        "top_logprobs",
        "max_tool_calls",
        "stream_options",
        "prompt_cache_retention",
        "context_management",
        "client_metadata",
    }
)
_KNOWN: Final = _TRANSLATED | _IGNORED
_EFFORTS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
_SUMMARIES: Final = frozenset({"auto", "concise", "detailed"})
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def translate_request(
    body: Any,
    *,
    history: Sequence[dict[str, Any]] = (),
    unseal: Callable[[str], str | None] | None = None,
    new_id: Callable[[str], str] | None = None,
) -> ResponsesRequest:
    """The canonical chat request for a Responses request body (see the module's docstring).

    `history` is the items of the `previous_response_id` chain, oldest first (earlier input
    items and output items, as stored); they come before this request's input. `unseal(token)`
    is the reasoning text sealed in a reasoning item's `encrypted_content`, or None when it does
    not verify. `new_id(prefix)` is a fresh item id (`msg_…`) for an input item sent without
    one; without it, ids are derived from the item and its place (the same request, the same
    ids). Raises ResponsesRequestError, and nothing else, for any JSON."""
    if not isinstance(body, dict):
        raise ResponsesRequestError(
            None, f"the request body must be an object, not {json_type(body)}"
        )
    # The commonest request, translated without the general walk (`_plain`).
    if (type(history) is tuple or type(history) is list) and not history:
        plain = _plain(body, new_id)
        if plain is not None:
            return plain
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ResponsesRequestError("model", f"must be a non-empty string, not {shown(model)}")
    _refuse_unsupported(body)
    chat: dict[str, Any] = {"model": model}

    stream = _opt_bool(body, "stream", False)
    store = _opt_bool(body, "store", True)
    previous = _previous_response_id(body.get("previous_response_id"))
    _check_history(history)
    items = _input_items(body.get("input"), bool(history))
    warnings = Warnings()
    # Tools first: a history's namespace calls are sent under the flat names the tools get.
    tools = _offered_tools(body.get("tools"), history, items, warnings)
    conversation = Conversation(
        _instructions(body.get("instructions")), tools, warnings, unseal, new_id
    )
    input_items = conversation.walk(history, items)
    chat["messages"] = conversation.messages
    chat["stream"] = stream
    if tools.chat_tools:
        chat["tools"] = tools.chat_tools
    _sampling(body, chat, tools)
    summary = _reasoning(body.get("reasoning"), chat)
    _text(body.get("text"), chat)
    metadata = _metadata(body.get("metadata"))
    include = _include(body.get("include"))

    for key in body:
        if key not in _KNOWN:
            warnings.add(f"{key} ignored: svir does not translate it")
    return ResponsesRequest(
        chat=chat,
        warnings=tuple(warnings.lines),
        stream=stream,
        store=store,
        previous_response_id=previous,
        summary=summary,
        include_encrypted="reasoning.encrypted_content" in include,
        names=tools.names,
        input_items=input_items,
        echo=_echo(body, store, metadata, previous),
        cache_key=chat.get("prompt_cache_key"),
        image_urls=conversation.parts.image_urls,
        metadata=metadata,
    )


def _previous_response_id(previous: Any) -> str | None:
    if previous is None:
        return None
    text = check.string("previous_response_id", previous)
    if not text:
        raise ResponsesRequestError("previous_response_id", "must not be empty")
    return text


def _check_history(history: Any) -> None:
    # The exact types first: the default `()` would otherwise cost an ABC check per request.
    if (
        type(history) is not tuple
        and type(history) is not list
        and (not isinstance(history, Sequence) or isinstance(history, str | bytes))
    ):
        raise ResponsesRequestError("previous_response_id", "the stored history is not a list")


def _offered_tools(
    tools_raw: Any, history: Sequence[Any], items: list[Any], warnings: Warnings
) -> ToolTable:
    """The tools of `tools` and of the `additional_tools` items."""
    tools = ToolTable(warnings)
    if tools_raw is not None:
        if not isinstance(tools_raw, list):
            raise ResponsesRequestError("tools", f"must be an array, not {json_type(tools_raw)}")
        tools.tools("tools", tools_raw)
    tools.additional_tools(history, items)
    return tools


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    """The messages the conversation starts with: `instructions` as its first system message."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        text = check.string("instructions", instructions)
        if text:
            messages.append({"role": "system", "content": text})
    return messages


def _sampling(body: dict[str, Any], chat: dict[str, Any], tools: ToolTable) -> None:
    """The tool choice, the output limit and the sampling fields, into `chat`."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        chat["parallel_tool_calls"] = check.boolean("parallel_tool_calls", parallel)
    choice = body.get("tool_choice")
    if choice is not None:
        tools.tool_choice(choice, chat)
    limit = body.get("max_output_tokens")
    if limit is not None:
        chat["max_tokens"] = check.integer("max_output_tokens", limit)
    for key, check_type in _COPIED:
        value = body.get(key)
        if value is not None:
            chat[key] = check_type(key, value)


# The fields of a plain request (`_plain`).
_PLAIN_FIELDS: Final = frozenset({"model", "input", "stream", "store", "instructions"})


def _plain(body: dict[str, Any], new_id: Callable[[str], str] | None) -> ResponsesRequest | None:
    """The translation of the commonest request, made without the general walk: a first request
    (no history) of `model`, `input` as a string or as user messages whose content is a string
    (`{role, content}`, `type` message or left out), and at most `stream`, `store` and
    `instructions`, each of its type. None for any other request, a mistake among them: the
    general walk translates it (or words the mistake), to the same result."""
    if not _PLAIN_FIELDS.issuperset(body):
        return None
    model = body.get("model")
    stream = body.get("stream", False)
    store = body.get("store", True)
    instructions = body.get("instructions")
    raw = body.get("input")
    if (
        type(model) is not str
        or not model
        or (stream is not None and type(stream) is not bool)
        or (store is not None and type(store) is not bool)
        or (instructions is not None and type(instructions) is not str)
    ):
        return None
    stream = stream or False
    store = True if store is None else store
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = _plain_input(raw)
    if given is None:
        return None
    # Only now, every item taken: no id is made for a request the general walk translates.
    input_items: list[dict[str, Any]] = []
    for k, item in enumerate(given):
        content = item["content"]
        messages.append({"role": "user", "content": content})
        parts = [{"type": "input_text", "text": content}]
        item_id = (
            new_id(_MESSAGE_PREFIX)
            if new_id is not None
            else fresh_id(None, "message", f"input[{k}]", item)
        )
        input_items.append({"type": "message", "role": "user", "content": parts, "id": item_id})
    metadata: dict[str, str] = {}
    return ResponsesRequest(
        chat={"model": model, "messages": messages, "stream": stream},
        stream=stream,
        store=store,
        input_items=input_items,
        echo=_plain_echo(instructions, store, metadata),
        metadata=metadata,
    )


def _plain_input(raw: Any) -> list[dict[str, Any]] | None:
    """A plain request's input as its user message items, or None when it is not plain."""
    if type(raw) is str:
        if not raw:
            return None
        # A string is the one user message the walk makes of it (its id derived from this item).
        return [{"type": "message", "role": "user", "content": raw}]
    if type(raw) is list and raw:
        for item in raw:
            if (
                type(item) is not dict
                or item.get("role") != "user"
                or item.get("type", "message") != "message"
                or not _PLAIN_ITEM_FIELDS.issuperset(item)
                or type(item.get("content")) is not str
            ):
                return None
        return raw
    return None


def _plain_echo(instructions: str | None, store: bool, metadata: dict[str, str]) -> dict[str, Any]:
    """The echo of a plain request: `_PLAIN_ECHO` with the fields made fresh per request."""
    echo = _PLAIN_ECHO.copy()
    if instructions is not None:
        echo["instructions"] = instructions
    echo["metadata"] = metadata
    echo["reasoning"] = {"effort": None, "summary": None}
    echo["store"] = store
    echo["text"] = {"format": {"type": "text"}}
    echo["tools"] = []
    return echo


# The id prefix of a message item, for `_plain`'s.
_MESSAGE_PREFIX: Final = ID_PREFIXES["message"]
# The fields of an input item `_plain` takes.
_PLAIN_ITEM_FIELDS: Final = frozenset({"type", "role", "content"})


def _refuse_unsupported(body: dict[str, Any]) -> None:
    background = body.get("background")
    if background is not None and check.boolean("background", background):
        raise ResponsesRequestError(
            "background", "background responses are not supported by svir; send background: false"
        )
    if body.get("conversation") is not None:
        raise ResponsesRequestError(
            "conversation",
            "conversations are not supported by svir; continue with previous_response_id",
        )
    if body.get("prompt") is not None:
        raise ResponsesRequestError(
            "prompt", "stored prompt templates are not supported by svir; send input"
        )


def _input_items(raw: Any, continued: bool) -> list[Any]:
    if raw is None:
        if continued:
            return []
        raise ResponsesRequestError("input", "is required")
    if isinstance(raw, str):
        if not raw and not continued:
            raise ResponsesRequestError("input", "must not be empty")
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ResponsesRequestError(
            "input", f"must be a string or an array of items, not {json_type(raw)}"
        )
    if not raw and not continued:
        raise ResponsesRequestError("input", "must not be empty")
    return raw


def _reasoning(reasoning: Any, chat: dict[str, Any]) -> str | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise ResponsesRequestError("reasoning", f"must be an object, not {json_type(reasoning)}")
    effort = reasoning.get("effort")
    if effort is not None:
        if not isinstance(effort, str) or effort not in _EFFORTS:
            raise ResponsesRequestError(
                "reasoning.effort",
                f"must be one of {', '.join(sorted(_EFFORTS))}, not {shown(effort)}",
            )
        chat["reasoning_effort"] = effort
    summary = None
    for key in ("summary", "generate_summary"):  # the second is the deprecated name
        value = reasoning.get(key)
        if value is not None and summary is None:
            if not isinstance(value, str) or value not in _SUMMARIES:
                raise ResponsesRequestError(
                    f"reasoning.{key}",
                    f"must be one of {', '.join(sorted(_SUMMARIES))}, not {shown(value)}",
                )
            summary = value
    return summary


def _text(text: Any, chat: dict[str, Any]) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise ResponsesRequestError("text", f"must be an object, not {json_type(text)}")
    verbosity = text.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            raise ResponsesRequestError(
                "text.verbosity", f"must be 'low', 'medium' or 'high', not {shown(verbosity)}"
            )
        chat["verbosity"] = verbosity
    fmt = text.get("format")
    if fmt is None:
        return
    kind = check.tagged("text.format", fmt)
    if kind == "text":
        return
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
        return
    if kind != "json_schema":
        raise ResponsesRequestError(
            "text.format.type",
            f"must be 'text', 'json_object' or 'json_schema', not {shown(kind)}",
        )
    name = fmt.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ResponsesRequestError(
            "text.format.name", "must be 1 to 64 ASCII letters, digits, '_' or '-'"
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise ResponsesRequestError(
            "text.format.schema", f"must be an object, not {json_type(schema)}"
        )
    spec: dict[str, Any] = {"name": name, "schema": schema}
    description = fmt.get("description")
    if description is not None:
        spec["description"] = check.string("text.format.description", description)
    strict = fmt.get("strict")
    if strict is not None:
        spec["strict"] = check.boolean("text.format.strict", strict)
    chat["response_format"] = {"type": "json_schema", "json_schema": spec}


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ResponsesRequestError("metadata", f"must be an object, not {json_type(metadata)}")
    for key, value in metadata.items():
        check.string(f"metadata.{key}", value)
    return dict(metadata)


def _include(include: Any) -> list[str]:
    if include is None:
        return []
    if not isinstance(include, list):
        raise ResponsesRequestError("include", f"must be an array, not {json_type(include)}")
    for k, value in enumerate(include):
        check.string(f"include[{k}]", value)
    return include


# The request fields a response object repeats as they were sent, in the order the response
# object has them (svir.protocols.responses.response writes an echo in that order as it is),
# each with OpenAI's default when unset (those `_echo` derives are None here and set there, in
# place).
_ECHOED: Final = (
    ("instructions", None),
    ("max_output_tokens", None),
    ("metadata", None),
    ("parallel_tool_calls", True),
    ("previous_response_id", None),
    ("reasoning", None),
    ("store", None),
    ("temperature", 1.0),
    ("text", None),
    ("tool_choice", "auto"),
    ("tools", None),
    ("top_p", 1.0),
    ("truncation", "disabled"),
    ("user", None),
    ("safety_identifier", None),
    ("prompt_cache_key", None),
    ("service_tier", "auto"),
    ("background", None),
    ("top_logprobs", 0),
    ("max_tool_calls", None),
)

_ECHO_DEFAULTS: Final = dict(_ECHOED)
# The echo of a request that sets none of the echoed fields, but for the few `_echo` makes
# fresh per request (`_plain` sets them).
_PLAIN_ECHO: Final[dict[str, Any]] = {**_ECHO_DEFAULTS, "background": False}


def _echo(
    body: dict[str, Any], store: bool, metadata: dict[str, str], previous: str | None
) -> dict[str, Any]:
    """The request fields a response object repeats, each with OpenAI's default when unset."""
    get = body.get
    # The defaults in their order, then the body's few fields over them (in place, so the order
    # stays): a walk of the body's keys, not a lookup per echoed field.
    echo: dict[str, Any] = _ECHO_DEFAULTS.copy()
    for key, value in body.items():
        if value is not None and key in echo:
            echo[key] = value
    if echo["tools"] is None:
        echo["tools"] = []
    # Both were checked to be objects or null.
    text = get("text")
    text = dict(text) if text else {}
    if "format" not in text:
        text["format"] = {"type": "text"}
    echo["metadata"] = metadata
    echo["text"] = text
    reasoning = get("reasoning")
    if reasoning:
        echo["reasoning"] = {
            "effort": reasoning.get("effort"),
            "summary": reasoning.get("summary") or reasoning.get("generate_summary"),
        }
    else:
        echo["reasoning"] = {"effort": None, "summary": None}
    echo["store"] = store
    echo["background"] = False
    echo["previous_response_id"] = previous
    return echo


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    return default if value is None else check.boolean(key, value)


# Fields sent upstream as they came, once their type is checked.
_COPIED: Final = (
    ("temperature", check.number),
    ("top_p", check.number),
    ("user", check.string),
    ("safety_identifier", check.string),
    ("prompt_cache_key", check.string),
)
