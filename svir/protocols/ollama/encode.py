"""svir's canonical events as Ollama's answers: pure, with no I/O.

A streamed answer is NDJSON lines (`NDJSONEncoder` for `/api/chat`, `GenerateEncoder` for
`/api/generate`), a non-streamed one a single object (`ChatAggregator`, `GenerateAggregator`,
over the shared fold svir.wire.answer); both end with the final object's `done_reason` and
`Metrics`. A failure is Ollama's `{"error": ...}` (`error_message`, `error_line`). The request
side is svir.protocols.ollama.request.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from svir.errors import SvirError
from svir.wire.answer import AnswerFold
from svir.wire.classify import ClientError
from svir.wire.encoder import stream_error_fields
from svir.wire.errors import ErrorKind, UpstreamError
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
from svir.wire.toolcalls import ToolCall

__all__ = [
    "ChatAggregator",
    "GenerateAggregator",
    "GenerateEncoder",
    "Metrics",
    "NDJSONEncoder",
    "created_at",
    "done_reason",
    "error_line",
    "error_message",
]

_encode = msgspec.json.encode


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
