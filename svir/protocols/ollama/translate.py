"""Ollama's native API in svir's terms: pure translation, both ways, with no I/O.

An Ollama client's `POST /api/chat` body becomes the OpenAI-shaped request the gateway takes
(`to_openai_request`), and the gateway's normalized events become Ollama's answer: NDJSON lines
for a stream (`NDJSONEncoder`), one object otherwise (`ChatAggregator`). Model listings
(`/api/tags`, `/api/show`, `/api/ps`) are built here too. The edge that serves them over HTTP is
`svir.protocols.ollama.routes`; see docs/ollama.md for the mapping in prose.

Every client mistake is an `OllamaError` with status 400 and Ollama's plain error string;
nothing else escapes `to_openai_request` for any JSON value.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec

from svir.errors import BadRequest, OllamaError, SvirError
from svir.providers import check_tools
from svir.wire.answer import AnswerFold
from svir.wire.classify import ClientError
from svir.wire.encoder import stream_error_fields
from svir.wire.errors import BodyError, ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from svir.wire.jsonbody import json_type, shown
from svir.wire.media import decode_base64, sniff_image
from svir.wire.model_meta import ModelFacts, parameter_size
from svir.wire.request import message_role
from svir.wire.toolcalls import ToolCall

__all__ = [
    "MODIFIED_AT",
    "OLLAMA_API_VERSION",
    "ChatAggregator",
    "GenerateAggregator",
    "GenerateEncoder",
    "Metrics",
    "NDJSONEncoder",
    "created_at",
    "details",
    "done_reason",
    "error_line",
    "error_message",
    "model_name",
    "not_managed",
    "num_ctx",
    "parameters_text",
    "ps_entry",
    "pull_lines",
    "schema_name",
    "show_response",
    "tags_entry",
    "template_text",
    "to_generate_request",
    "to_openai_request",
]

# The Ollama API version svir answers `GET /api/version` with. Clients gate on it: GitHub
# Copilot's Ollama provider refuses a server older than 0.6.4. svir speaks the API as Ollama
# 0.12 does (`think` levels, `thinking`, `tool_name`, tool-call ids).
OLLAMA_API_VERSION: Final = "0.12.0"

# svir does not know when an upstream's model was made; Ollama's listings need a time.
MODIFIED_AT: Final = "2023-11-14T22:13:20Z"  # the `created` of /v1/models, 1700000000

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


# ---------------------------------------------------------------------------------------------
# Names and times


def model_name(name: str) -> str:
    """The svir model an Ollama client means: `lab/x:latest` is `lab/x`.

    Ollama clients add the default tag to a name without one; svir's names have no tags, so only
    that default is taken off. Any other tag is part of the upstream's id (Ollama upstreams
    name models `llama3.2:3b`).
    """
    if name.endswith(_LATEST) and len(name) > len(_LATEST):
        return name[: -len(_LATEST)]
    return name


def created_at(moment: datetime.datetime | None = None) -> str:
    """An Ollama timestamp: RFC 3339 in UTC with microseconds, as `created_at` carries it."""
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def done_reason(finish: str | None) -> str:
    """Ollama's `done_reason` for an OpenAI `finish_reason`.

    Ollama ends an answer with tool calls as `stop`; other reasons it does not have
    (`content_filter`) are passed on as they are rather than hidden.
    """
    if finish is None or finish in ("tool_calls", "function_call"):
        return "stop"
    return finish


# ---------------------------------------------------------------------------------------------
# Requests


def to_openai_request(body: Any) -> dict[str, Any]:
    """The gateway request (OpenAI Chat Completions fields) for an Ollama `/api/chat` body.

    The result still goes through `validate_chat_request` and the upstream body builder, which
    check what they rely on; this checks every Ollama field it reads and raises `OllamaError`
    (400) for any that is malformed. An empty `messages` list is kept: Ollama answers it by
    loading the model, which the edge does without an upstream call.
    """
    if not isinstance(body, dict):
        raise OllamaError(f"the request body must be a JSON object, not {json_type(body)}")
    model = body.get("model")
    if model is None or model == "":
        model = body.get("name")  # the field's name before Ollama 0.1.30; clients still send it
    if model is None or model == "":
        raise OllamaError("model is required")
    if not isinstance(model, str):
        raise OllamaError(f"model must be a string, not {json_type(model)}")

    stream = body.get("stream")
    if stream is None:
        stream = True  # Ollama streams unless told not to
    elif not isinstance(stream, bool):
        raise OllamaError(f"stream must be a boolean, not {json_type(stream)}")

    raw_messages = body.get("messages")
    if raw_messages is None:
        raw_messages = []
    elif not isinstance(raw_messages, list):
        raise OllamaError(f"messages must be an array, not {json_type(raw_messages)}")

    out: dict[str, Any] = {
        "model": model_name(model),
        "messages": _messages(raw_messages),
        "stream": stream,
    }
    tools = body.get("tools")
    if tools is not None:
        checked = _tools(tools)
        if checked:
            out["tools"] = checked
    response_format = _format(body.get("format"))
    if response_format is not None:
        out["response_format"] = response_format
    out.update(_options(body.get("options")))
    effort = _think(body.get("think"))
    if effort is not None:
        out["reasoning_effort"] = effort
    return out


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # Calls of the latest assistant turn not answered yet, as (id, name): Ollama clients answer a
    # call with a `tool_name`, and usually without any id, which OpenAI servers need.
    pending: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        try:
            role = message_role(where, msg)
        except BodyError as exc:
            raise OllamaError(str(exc)) from None
        content = _string(f"{where}.content", msg.get("content"))
        images = msg.get("images")
        if images is not None and not isinstance(images, list):
            raise OllamaError(f"{where}.images must be an array, not {json_type(images)}")
        if images and role != "user":
            raise OllamaError(f"{where}.images: only user messages take images, not {role}")

        built: dict[str, Any] = {"role": role}
        if role == "user":
            built["content"] = _user_content(where, content, images or [])
            pending = []
        elif role == "assistant":
            built["content"] = content
            thinking = _string(f"{where}.thinking", msg.get("thinking"))
            if thinking:
                built["reasoning_content"] = thinking
            calls = _tool_calls(where, msg.get("tool_calls"), i)
            if calls:
                built["tool_calls"] = calls
                pending = [(c["id"], c["function"]["name"]) for c in calls]
            else:
                pending = []
        elif role == "tool":
            name = msg.get("tool_name")
            if name is not None and not isinstance(name, str):
                raise OllamaError(f"{where}.tool_name must be a string, not {json_type(name)}")
            call_id = msg.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise OllamaError(
                    f"{where}.tool_call_id must be a string, not {json_type(call_id)}"
                )
            built["tool_call_id"] = _answered_call(pending, call_id or None, name, i)
            built["content"] = content
        else:
            built["content"] = content
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


def _user_content(where: str, content: str, images: list[Any]) -> str | list[dict[str, Any]]:
    if not images:
        return content
    parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    for j, image in enumerate(images):
        url = _image_url(f"{where}.images[{j}]", image)
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _image_url(where: str, image: Any) -> str:
    """A data URL for one Ollama image: base64 without a prefix, its type read from its bytes."""
    if not isinstance(image, str):
        raise OllamaError(f"{where} must be a base64 string, not {json_type(image)}")
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


def _tool_calls(where: str, calls: Any, i: int) -> list[dict[str, Any]]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise OllamaError(f"{where}.tool_calls must be an array, not {json_type(calls)}")
    out: list[dict[str, Any]] = []
    for k, call in enumerate(calls):
        here = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise OllamaError(f"{here} must be an object, not {json_type(call)}")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise OllamaError(f"{here}.function must be an object, not {json_type(fn)}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise OllamaError(f"{here}.function.name must be a non-empty string")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise OllamaError(f"{here}.id must be a string, not {json_type(call_id)}")
        arguments = fn.get("arguments")
        if arguments is None:
            text = "{}"
        elif isinstance(arguments, dict):
            text = _json_text(f"{here}.function.arguments", arguments)
        elif isinstance(arguments, str):
            text = arguments  # the OpenAI form; some clients send it back as they got it
        else:
            raise OllamaError(
                f"{here}.function.arguments must be an object, not {json_type(arguments)}"
            )
        out.append(
            {
                # Ollama clients drop the ids they were given; a stable one per call links the
                # call to its result for servers that need it.
                "id": call_id or f"call_{i}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": text},
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


def _format(value: Any) -> dict[str, Any] | None:
    """`format`: "json" is any JSON object, a schema is that schema, "" or null is free text."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": schema_name(value), "schema": value}}
    raise OllamaError(f'format must be "json" or a JSON schema, not {shown(value)}')


def schema_name(schema: dict[str, Any]) -> str:
    """A `json_schema.name` for an Ollama schema: its title made valid (§2.6), else "response"."""
    title = schema.get("title")
    if isinstance(title, str):
        name = _SCHEMA_NAME_BAD.sub("_", title).strip("_")[:64]
        if name:
            return name
    return "response"


def _options(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise OllamaError(f"options must be an object, not {json_type(options)}")
    out: dict[str, Any] = {}
    for key in _FLOAT_OPTIONS:
        value = options.get(key)
        if value is not None:
            out[key] = _number(f"options.{key}", value)
    limit = options.get("num_predict")
    if limit is not None:
        limit = _integer("options.num_predict", limit)
        # Ollama's -1 is "no limit" and -2 "fill the context"; 0 caps nothing either.
        if limit > 0:
            out["max_tokens"] = limit
    seed = options.get("seed")
    if seed is not None:
        out["seed"] = _integer("options.seed", seed)
    stop = options.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise OllamaError("options.stop must be an array of strings")
        stops = [s for s in stop if s]
        if stops:
            out["stop"] = stops
    return out


def num_ctx(body: dict[str, Any]) -> int | None:
    """`options.num_ctx`, the context a request asks its model to run with; None when it asks
    for none (or for 0 or less, Ollama's "the model's default")."""
    options = body.get("options")
    if not isinstance(options, dict) or options.get("num_ctx") is None:
        return None
    value = _integer("options.num_ctx", options["num_ctx"])
    return value if value > 0 else None


def _think(value: Any) -> str | None:
    """`think` as a `reasoning_effort`: false is none, true is medium, a level is itself."""
    if value is None:
        return None
    if value is False:
        return "none"
    if value is True:
        return _THINK_TRUE
    if isinstance(value, str) and value.lower() in _THINK_LEVELS:
        return value.lower()
    raise OllamaError(f'think must be true, false, "low", "medium" or "high", not {shown(value)}')


def _number(where: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OllamaError(f"{where} must be a number, not {json_type(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise OllamaError(f"{where} must be a finite number")
    if isinstance(value, int) and abs(value) >= _INT64:
        raise OllamaError(f"{where} is out of range")
    return value


def _integer(where: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type; Ollama reads 128.0 as 128
    if isinstance(value, bool) or not isinstance(value, int):
        raise OllamaError(f"{where} must be an integer, not {json_type(value)}")
    if abs(value) >= _INT64:
        raise OllamaError(f"{where} is out of range")
    return value


def _string(where: str, value: Any) -> str:
    # Ollama's clients leave empty fields out, so a missing content is the empty string.
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OllamaError(f"{where} must be a string, not {json_type(value)}")
    return value


def _json_text(where: str, value: Any) -> str:
    try:
        return _encode(value).decode("utf-8")
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
        raise OllamaError(f"{where} cannot be written as JSON") from None


# ---------------------------------------------------------------------------------------------
# Responses


class Metrics(msgspec.Struct, frozen=True, gc=False):
    """The counts and durations (nanoseconds) of a final Ollama object.

    svir loads no model and measures from its side of the wire: the prompt's evaluation is the
    time to the first token, generation the time from it to the end. (A Struct: one is made a
    request, and a frozen dataclass's __init__ costs ~5x a Struct's.)
    """

    total_duration: int
    prompt_eval_duration: int
    eval_duration: int
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    load_duration: int = 0

    def fields(self) -> dict[str, int]:
        out = {
            "total_duration": self.total_duration,
            "load_duration": self.load_duration,
        }
        if self.prompt_eval_count is not None:
            out["prompt_eval_count"] = self.prompt_eval_count
        out["prompt_eval_duration"] = self.prompt_eval_duration
        if self.eval_count is not None:
            out["eval_count"] = self.eval_count
        out["eval_duration"] = self.eval_duration
        return out


MetricsFn = Callable[[Usage | None], Metrics]
Clock = Callable[[], str]


class ToolArgumentsError(SvirError):
    """A tool call whose arguments are not a JSON object, which Ollama's clients need."""


def _ollama_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Assembled tool calls in Ollama's form: each call whole, its arguments an object; raises
    ToolArgumentsError."""
    return [
        {
            "id": c.id,
            "function": {
                "index": c.index,
                "name": c.name,
                "arguments": _arguments(c.name, c.arguments),
            },
        }
        for c in calls
    ]


def _arguments(name: str, text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        value = None
    if not isinstance(value, dict):
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise ToolArgumentsError(
            f"the model called {name!r} with arguments that are not a JSON object: {shown!r}"
        )
    return value


def _tool_error(exc: ToolArgumentsError) -> UpstreamError:
    return UpstreamError(ErrorKind.MODEL_OUTPUT, str(exc), in_stream=True)


def error_message(error: ClientError, model: str) -> str:
    """The words of an error answer: Ollama's own for a model it does not have (its clients
    read the 404 as "pull it first"), svir's for every other."""
    if error.code == "model_not_found":
        return f"model '{model}' not found"
    return error.message


def error_line(message: str) -> bytes:
    """The NDJSON line that ends a failed stream."""
    return _encode({"error": message}) + b"\n"


class NDJSONEncoder:
    """A streamed `/api/chat` answer: normalized events in, NDJSON lines out.

    Consecutive text (or thinking) in one batch is one line. Tool calls go out whole in one line
    when the answer finishes, then the final `done: true` object. A failure is one
    `{"error": ...}` line; a failure before any line (`early_error`) is left to the caller,
    which can still answer it with an HTTP error status.
    """

    def __init__(self, *, model: str, metrics: MetricsFn, clock: Clock = created_at) -> None:
        self.model = model
        self.metrics = metrics
        self.clock = clock
        self.sent = False
        self.ended = False
        self.early_error: UpstreamError | None = None
        self._answer = AnswerFold()  # the tool calls, finish and usage, for the last lines

    def feed(self, events: Iterable[Event]) -> bytes:
        """The lines for one batch of events (possibly none)."""
        if self.ended:
            return b""
        now = self.clock()
        lines: list[bytes] = []
        run: list[str] = []
        run_key: Literal["content", "thinking"] = "content"

        def flush() -> None:
            if run:
                lines.append(self._line(now, {run_key: "".join(run)}))
                run.clear()

        # On the exact type: see svir.wire.events.
        for ev in events:
            if type(ev) is TextDelta or type(ev) is RefusalDelta or type(ev) is ReasoningDelta:
                key: Literal["content", "thinking"] = (
                    "thinking" if type(ev) is ReasoningDelta else "content"
                )
                if key != run_key:
                    flush()
                    run_key = key
                if ev.text:
                    run.append(ev.text)
            elif type(ev) is ToolCallStart or type(ev) is ToolCallDelta or type(ev) is Usage:
                self._answer.add(ev)
            elif type(ev) is Finish:
                flush()
                self._answer.add(ev)
                if self._answer.has_tool_calls:
                    try:
                        calls = _ollama_calls(self._answer.tool_calls())
                    except ToolArgumentsError as exc:
                        self._fail(_tool_error(exc), lines)
                        break
                    lines.append(self._line(now, {"tool_calls": calls}))
            elif type(ev) is Done:
                flush()
                lines.append(self._final(now))
                self.ended = True
                break
            elif type(ev) is StreamError:
                flush()
                self._fail(ev.error, lines)
                break
            # Role, Keepalive and ContentFilter have no Ollama form.
        else:
            flush()
        if lines:
            self.sent = True
        return b"".join(lines)

    def _fail(self, error: UpstreamError, lines: list[bytes]) -> None:
        self.ended = True
        if not self.sent and not lines:
            self.early_error = error
            return
        message, _, _ = stream_error_fields(error)
        lines.append(error_line(message))

    def _line(self, now: str, message: dict[str, Any]) -> bytes:
        obj = {"model": self.model, "created_at": now, **self._content(message), "done": False}
        return _encode(obj) + b"\n"

    def _final(self, now: str) -> bytes:
        obj: dict[str, Any] = {
            "model": self.model,
            "created_at": now,
            **self._content({}),
            "done": True,
            "done_reason": done_reason(self._answer.finish_reason),
        }
        obj.update(self.metrics(self._answer.usage).fields())
        return _encode(obj) + b"\n"

    def _content(self, message: dict[str, Any]) -> dict[str, Any]:
        """What one line carries of the answer: `/api/chat` puts it in a `message`."""
        return {"message": {"role": "assistant", "content": "", **message}}


class ChatAggregator(AnswerFold):
    """A non-streamed `/api/chat` answer: events in, one Ollama chat object out. Ollama has no
    refusal field: a refusal is content."""

    __slots__ = ()

    def response(self, *, model: str, metrics: MetricsFn, now: str | None = None) -> dict[str, Any]:
        """The answer; raises UpstreamError when the model's tool calls cannot be given."""
        content = "".join(self.text) + "".join(self.refusal)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning:
            message["thinking"] = "".join(self.reasoning)
        if self.has_tool_calls:
            try:
                message["tool_calls"] = _ollama_calls(self.tool_calls())
            except ToolArgumentsError as exc:
                raise _tool_error(exc) from None
        out: dict[str, Any] = {
            "model": model,
            "created_at": now or created_at(),
            **self._content(message),
            "done": True,
            "done_reason": done_reason(self.finish_reason),
        }
        out.update(metrics(self.usage).fields())
        return out

    def _content(self, message: dict[str, Any]) -> dict[str, Any]:
        """Where the answer goes: `/api/chat` puts it in a `message`."""
        return {"message": message}


# ---------------------------------------------------------------------------------------------
# /api/generate


def _generate_text(message: dict[str, Any]) -> dict[str, Any]:
    """An answer's text as `/api/generate` carries it: `response`, and `thinking` if any."""
    out: dict[str, Any] = {"response": message.get("content", "")}
    thinking = message.get("thinking")
    if thinking:
        out["thinking"] = thinking
    return out


class GenerateEncoder(NDJSONEncoder):
    """A streamed `/api/generate` answer: the lines of `/api/chat`, with `response` (and
    `thinking`) where a chat line has its `message`; no `context`."""

    def _content(self, message: dict[str, Any]) -> dict[str, Any]:
        return _generate_text(message)


class GenerateAggregator(ChatAggregator):
    """A non-streamed `/api/generate` answer."""

    __slots__ = ()

    def _content(self, message: dict[str, Any]) -> dict[str, Any]:
        return _generate_text(message)


def to_generate_request(body: Any) -> dict[str, Any]:
    """The canonical request for an Ollama `/api/generate` body (docs/ollama.md).

    With `raw: true` or a `suffix` it is a text completion (svir.wire.completions: the prompt as
    it is, or the prefix and suffix the model fills between), otherwise a chat of one user turn
    (and the `system` before it) through the model's own template, as Ollama renders it. An
    empty prompt is Ollama's load (or, with `keep_alive: 0`, unload) form: a chat request with
    no messages, as `/api/chat` has it. Raises OllamaError (400) for anything malformed or not
    honoured, and nothing else, for any JSON value.
    """
    if not isinstance(body, dict):
        raise OllamaError(f"the request body must be a JSON object, not {json_type(body)}")
    head = {k: body[k] for k in ("model", "name", "stream", "options") if k in body}
    base = to_openai_request(head)  # model, stream and options, read as /api/chat reads them
    prompt = _string("prompt", body.get("prompt"))
    suffix = _string("suffix", body.get("suffix"))
    system = _string("system", body.get("system"))
    template = _string("template", body.get("template"))
    raw = body.get("raw")
    if raw is not None and not isinstance(raw, bool):
        raise OllamaError(f"raw must be a boolean, not {json_type(raw)}")
    context = body.get("context")
    if context is not None and not isinstance(context, list):
        raise OllamaError(f"context must be an array, not {json_type(context)}")
    images = body.get("images")
    if images is not None and not isinstance(images, list):
        raise OllamaError(f"images must be an array, not {json_type(images)}")
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
        top_k = body["options"].get("top_k") if isinstance(body.get("options"), dict) else None
        if top_k is not None:
            out["top_k"] = _integer("options.top_k", top_k)  # a completion API's own sampler
        return out
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt, "images": images})
    chat = {k: v for k, v in body.items() if k in ("format", "think")}
    return {**to_openai_request({**head, **chat, "messages": messages}), "model": base["model"]}


# ---------------------------------------------------------------------------------------------
# Model listings

# What svir answers for a model, from what is true of it (svir.policy.catalog's ModelFacts).


def _digest(name: str) -> str:
    # Ollama's digest is the sha256 of the model's manifest; the name's is stable and unique.
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def details(facts: ModelFacts) -> dict[str, Any]:
    """`details`, with every field a string (and `families` a list) as strict clients parse it:
    Zed drops the whole list when one is missing, Roo needs `family` and `parameter_size`."""
    family = facts.architecture
    return {
        "parent_model": "",
        "format": facts.format,
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(facts.parameters, facts.own_id),
        "quantization_level": facts.quantization,
    }


def tags_entry(facts: ModelFacts) -> dict[str, Any]:
    """One model of `GET /api/tags`."""
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": MODIFIED_AT,
        "size": facts.size or 0,
        "digest": _digest(facts.name),
        "details": details(facts),
    }


def ps_entry(facts: ModelFacts, expires_at: str, size: int | None = None) -> dict[str, Any]:
    """One model of `GET /api/ps`: svir's servers run on the CPU (`size_vram` 0) unless one
    says otherwise."""
    entry = tags_entry(facts)
    del entry["modified_at"]
    entry["size"] = size if size is not None else entry["size"]
    entry["expires_at"] = expires_at
    entry["size_vram"] = 0
    entry["context_length"] = facts.context_length or 0
    return entry


def template_text(facts: ModelFacts) -> str:
    """A `template` in Ollama's Go-template words that says what svir passes on: clients decide
    by its words (Continue: fill-in-the-middle when it has `.Suffix`; LiteLLM: tools when it has
    "tools"), so each appears exactly when it is true. The upstream applies its own template."""
    lines = ["{{- /* svir passes these on; the model's server applies its own template */ -}}"]
    if facts.embedding:
        return "{{ .Prompt }}"
    if facts.tools:
        lines.append("{{- if .Tools }}{{ range .Tools }}{{ . }}{{ end }}{{ end }}")
    lines.append("{{- range .Messages }}{{ .Role }}: {{ .Content }}{{ end }}")
    if facts.insert:
        lines.append("{{- if .Suffix }}{{ .Prompt }}{{ .Suffix }}{{ else }}{{ .Prompt }}{{ end }}")
    else:
        lines.append("{{ .Prompt }}")
    return "\n".join(lines)


def parameters_text(facts: ModelFacts) -> str:
    """`parameters`: Ollama's lines of `name value`, each matching Continue's pattern (it reads
    `num_ctx` there, and stops reading at a line that does not match)."""
    if facts.context_length is None:
        return ""
    return f"num_ctx {facts.context_length}"


def show_response(facts: ModelFacts, provider: str) -> dict[str, Any]:
    """`POST /api/show` for one model: only true things. `<arch>.context_length` is the context
    it runs with (Copilot, Roo and LiteLLM read the first key with `context_length` in it, so
    there is just one); the context it was trained for is svir's own key."""
    arch = facts.architecture
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.basename": facts.basename,
    }
    if facts.parameters is not None:
        info["general.parameter_count"] = facts.parameters
    if facts.context_length is not None:
        info[f"{arch}.context_length"] = facts.context_length
    if facts.context_train is not None:
        info["general.svir.n_ctx_train"] = facts.context_train
    info["general.svir.provider"] = provider
    info["general.svir.kind"] = facts.kind
    return {
        "modelfile": "",
        "parameters": parameters_text(facts),
        "template": template_text(facts),
        "details": details(facts),
        "model_info": info,
        "capabilities": facts.capabilities,
        "modified_at": MODIFIED_AT,
    }


# ---------------------------------------------------------------------------------------------
# Model files: svir serves models, it does not keep them


def pull_lines(name: str) -> list[dict[str, Any]]:
    """`POST /api/pull` of a model svir serves: it is there already, so the status lines an
    Ollama pull ends with, and `success`."""
    digest = "sha256:" + _digest(name)
    return [
        {"status": "pulling manifest"},
        {"status": f"pulling {digest[7:19]}", "digest": digest, "total": 0, "completed": 0},
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]


def not_managed(action: str) -> str:
    """The error for `/api/<action>` of a model file."""
    return (
        f"svir does not manage model files: /api/{action} is not supported; configure the "
        "model in svir's config ([[providers]]) instead"
    )
