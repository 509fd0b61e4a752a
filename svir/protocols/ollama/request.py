"""An Ollama client's request as svir's canonical chat request: pure, with no I/O.

`to_openai_request` is an `/api/chat` body as the OpenAI-shaped request the gateway takes,
`to_generate_request` an `/api/generate` body as a chat of one turn or a text completion;
`model_name` is the svir model an Ollama name means, `num_ctx` the context a request asks for.
The answers go back out by svir.protocols.ollama.encode; see docs/ollama.md for the mapping in
prose.

Every client mistake is an `OllamaError` with status 400 and Ollama's plain error string;
nothing else escapes `to_openai_request` or `to_generate_request` for any JSON value.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from svir.errors import BadRequest, OllamaError
from svir.protocols.ollama.body import (
    FORMAT_MUST,
    THINK_MUST,
    AssistantMessage,
    ChatBody,
    GenerateBody,
    Message,
    Options,
    ToolCall,
    ToolMessage,
    UserMessage,
    decode_chat,
    decode_generate,
    decode_option,
)
from svir.providers import check_tools
from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown
from svir.wire.media import decode_base64, sniff_image

__all__ = [
    "model_name",
    "num_ctx",
    "schema_name",
    "to_generate_request",
    "to_openai_request",
]

_LATEST: Final = ":latest"
_THINK_LEVELS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
# `think: true` asks for reasoning without naming a level; servers that reason only when asked
# (mlx-vlm, §2.5) need some level, and medium is every server's middle.
_THINK_TRUE: Final = "medium"
_SCHEMA_NAME_BAD: Final = re.compile(r"[^A-Za-z0-9_-]+")
_INT64: Final = 2**63

# Ollama options with an OpenAI Chat Completions field of the same meaning. The rest (load-time
# options such as num_ctx, and samplers OpenAI does not define such as top_k) are dropped: a
# hosted API rejects a field it does not know.
_FLOAT_OPTIONS: Final = ("temperature", "top_p", "frequency_penalty", "presence_penalty")

_encode = msgspec.json.encode


def model_name(name: str) -> str:
    """The svir model an Ollama client means: `lab/x:latest` is `lab/x`.

    Ollama clients add the default tag to a name without one; svir's names have no tags, so only
    that default is taken off. Any other tag is part of the upstream's id (Ollama upstreams
    name models `llama3.2:3b`).
    """
    if name.endswith(_LATEST) and len(name) > len(_LATEST):
        return name[: -len(_LATEST)]
    return name


def to_openai_request(body: Any) -> dict[str, Any]:
    """The gateway request (OpenAI Chat Completions fields) for an Ollama `/api/chat` body.

    The result still goes through `validate_chat_request` and the upstream body builder, which
    check what they rely on; this reads the body as its structs (svir.protocols.ollama.body) and
    raises `OllamaError` (400) for any field that is malformed. An empty `messages` list is kept:
    Ollama answers it by loading the model, which the edge does without an upstream call.
    """
    return _chat(decode_chat(body))


def _chat(request: ChatBody) -> dict[str, Any]:
    model, stream = _head(request)
    out: dict[str, Any] = {
        "model": model,
        "messages": _messages(request.messages or []),
        "stream": stream,
    }
    if request.tools is not None:
        checked = _tools(request.tools)
        if checked:
            out["tools"] = checked
    response_format = _format(request.format)
    if response_format is not None:
        out["response_format"] = response_format
    out.update(_options(request.options))
    effort = _think(request.think)
    if effort is not None:
        out["reasoning_effort"] = effort
    return out


def _head(request: ChatBody | GenerateBody) -> tuple[str, bool]:
    """The model and `stream`, which both endpoints read alike."""
    model: Any = request.model or request.name
    if model is None or model == "":
        raise OllamaError("model is required")
    if not isinstance(model, str):
        raise OllamaError(f"model must be a string, not {json_type(model)}")  # a `name`
    return model_name(model), request.stream is not False  # Ollama streams unless told not to


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # Calls of the latest assistant turn not answered yet, as (id, name): Ollama clients answer a
    # call with a `tool_name`, and usually without any id, which OpenAI servers need.
    pending: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        content = msg.content or ""
        built: dict[str, Any]
        if isinstance(msg, UserMessage):
            built = {"role": "user", "content": _user_content(where, content, msg.images or [])}
            pending = []
        elif isinstance(msg, AssistantMessage):
            built = {"role": "assistant", "content": content}
            if msg.thinking:
                built["reasoning_content"] = msg.thinking
            calls = _tool_calls(where, msg.tool_calls or [], i)
            if calls:
                built["tool_calls"] = calls
                pending = [(c["id"], c["function"]["name"]) for c in calls]
            else:
                pending = []
        elif isinstance(msg, ToolMessage):
            call_id = _answered_call(pending, msg.tool_call_id or None, msg.tool_name, i)
            built = {"role": "tool", "tool_call_id": call_id, "content": content}
        else:
            built = {"role": msg.__struct_config__.tag, "content": content}
            pending = []
        out.append(built)
    return out


def _answered_call(
    pending: list[tuple[str, str]], call_id: str | None, name: str | None, i: int
) -> str:
    """The id of the call a tool result answers, taken off `pending`.

    By id when the client sent one; else the first unanswered call of that tool; else the first
    unanswered call; a result that answers no call gets an id of its own.
    """
    if call_id is not None:
        for k, (pid, _) in enumerate(pending):
            if pid == call_id:
                del pending[k]
                break
        return call_id
    if pending:
        for k, (pid, pname) in enumerate(pending):
            if name is not None and pname == name:
                del pending[k]
                return pid
        return pending.pop(0)[0]
    return f"call_{i}"


def _user_content(where: str, content: str, images: list[str]) -> str | list[dict[str, Any]]:
    if not images:
        return content
    parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    for j, image in enumerate(images):
        url = _image_url(f"{where}.images[{j}]", image)
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _image_url(where: str, image: str) -> str:
    """A data URL for one Ollama image: base64 without a prefix, its type read from its bytes."""
    if image[:5].lower() == "data:":
        return image  # already a data URL: some clients send one; the body builder checks it
    try:
        data = decode_base64(where, image)
    except BodyError as exc:
        raise OllamaError(str(exc)) from None
    if not data:
        raise OllamaError(f"{where} is empty")
    media_type = sniff_image(data)
    if media_type is None:
        raise OllamaError(f"{where} is not a PNG, JPEG, GIF or WebP image")
    return f"data:{media_type};base64,{image}"


def _tool_calls(where: str, calls: list[ToolCall], i: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k, call in enumerate(calls):
        arguments = call.function.arguments
        if arguments is None:
            text = "{}"
        elif isinstance(arguments, dict):
            text = _json_text(f"{where}.tool_calls[{k}].function.arguments", arguments)
        else:
            text = arguments  # the OpenAI form; some clients send it back as they got it
        out.append(
            {
                # Ollama clients drop the ids they were given; a stable one per call links the
                # call to its result for servers that need it.
                "id": call.id or f"call_{i}_{k}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": text},
            }
        )
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    # Checked as every front end's tools are, so that a mistake reads the same everywhere.
    try:
        check_tools(tools)
    except BadRequest as exc:
        raise OllamaError(exc.message) from None
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool["function"]
        function: dict[str, Any] = {"name": fn["name"]}
        description = fn.get("description")
        if description is not None:
            function["description"] = description
        parameters = fn.get("parameters")
        function["parameters"] = parameters if parameters is not None else {"type": "object"}
        out.append({"type": "function", "function": function})
    return out


def _format(value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """`format`: "json" is any JSON object, a schema is that schema, "" or null is free text."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": schema_name(value), "schema": value}}
    raise OllamaError(f"format {FORMAT_MUST}, not {shown(value)}")


def schema_name(schema: dict[str, Any]) -> str:
    """A `json_schema.name` for an Ollama schema: its title made valid (§2.6), else "response"."""
    title = schema.get("title")
    if isinstance(title, str):
        name = _SCHEMA_NAME_BAD.sub("_", title).strip("_")[:64]
        if name:
            return name
    return "response"


def _options(options: Options | None) -> dict[str, Any]:
    if options is None:
        return {}
    out: dict[str, Any] = {}
    for key in _FLOAT_OPTIONS:
        value = getattr(options, key)
        if value is not None:
            out[key] = value
    if options.num_predict is not None:
        limit = _integer("options.num_predict", options.num_predict)
        # Ollama's -1 is "no limit" and -2 "fill the context"; 0 caps nothing either.
        if limit > 0:
            out["max_tokens"] = limit
    if options.seed is not None:
        out["seed"] = _integer("options.seed", options.seed)
    stop = [options.stop] if isinstance(options.stop, str) else options.stop
    stops = [s for s in stop or () if s]
    if stops:
        out["stop"] = stops
    return out


def num_ctx(body: dict[str, Any]) -> int | None:
    """`options.num_ctx`, the context a request asks its model to run with; None when it asks
    for none (or for 0 or less, Ollama's "the model's default")."""
    if not isinstance(body.get("options"), dict):
        return None
    value = decode_option(body, "num_ctx")
    if value is None:
        return None
    value = _integer("options.num_ctx", value)
    return value if value > 0 else None


def _think(value: bool | str | None) -> str | None:
    """`think` as a `reasoning_effort`: false is none, true is medium, a level is itself."""
    if value is None:
        return None
    if value is False:
        return "none"
    if value is True:
        return _THINK_TRUE
    if value.lower() in _THINK_LEVELS:
        return value.lower()
    raise OllamaError(f"think {THINK_MUST}, not {shown(value)}")


def _integer(where: str, value: int | float) -> int:
    """An integer option: JSON has one number type, and Ollama reads 128.0 as 128."""
    if isinstance(value, int):
        return value  # in int64: its struct says so
    if not value.is_integer():
        raise OllamaError(f"{where} must be an integer, not {json_type(value)}")
    if abs(value) >= _INT64:
        raise OllamaError(f"{where} is out of range")
    return int(value)


def _json_text(where: str, value: Any) -> str:
    try:
        return _encode(value).decode("utf-8")
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
        raise OllamaError(f"{where} cannot be written as JSON") from None


def to_generate_request(body: Any) -> dict[str, Any]:
    """The canonical request for an Ollama `/api/generate` body (docs/ollama.md).

    With `raw: true` or a `suffix` it is a text completion (svir.wire.completions: the prompt as
    it is, or the prefix and suffix the model fills between), otherwise a chat of one user turn
    (and the `system` before it) through the model's own template, as Ollama renders it. An
    empty prompt is Ollama's load (or, with `keep_alive: 0`, unload) form: a chat request with
    no messages, as `/api/chat` has it. Raises OllamaError (400) for anything malformed or not
    honoured, and nothing else, for any JSON value.
    """
    request = decode_generate(body)
    model, stream = _head(request)
    base = {"model": model, "messages": [], "stream": stream, **_options(request.options)}
    prompt = request.prompt or ""
    suffix = request.suffix or ""
    system = request.system or ""
    template = request.template or ""
    raw, context, images = request.raw, request.context, request.images
    if raw and (template or system or context):
        raise OllamaError("raw mode does not support template, system, or context")  # Ollama's
    if template:
        raise OllamaError(
            "template is not supported: svir renders the model's own chat template; send "
            "raw: true with a prompt you formatted"
        )
    if context:
        raise OllamaError(
            "context is not supported (Ollama deprecated it): send the conversation to /api/chat"
        )
    if not prompt and not suffix and not images:
        return base  # Ollama's load form: no messages
    if raw or suffix:
        what = "raw: true" if raw else "a suffix"
        for key in ("images", "format", "think"):
            if body.get(key) not in (None, "", [], False):
                # A completion has no template to put them in, nor a grammar svir sends.
                raise OllamaError(f"{key} is not supported with {what}: leave it out")
        out: dict[str, Any] = {"model": base["model"], "prompt": prompt, "stream": base["stream"]}
        if suffix:
            out["suffix"] = suffix
        out.update((k, v) for k, v in base.items() if k not in ("model", "messages", "stream"))
        top_k = decode_option(body, "top_k") if request.options is not None else None
        if top_k is not None:
            out["top_k"] = _integer("options.top_k", top_k)  # a completion API's own sampler
        return out
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt, "images": images})
    chat = {k: v for k, v in body.items() if k in ("format", "think")}
    head = {k: body[k] for k in ("model", "name", "stream", "options") if k in body}
    return {**to_openai_request({**head, **chat, "messages": messages}), "model": base["model"]}
