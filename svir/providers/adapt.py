"""Answer-side adaptations: fixing what a server does to a structured-output answer (§2.6).

LM Studio holds a reasoning model's reasoning to the response schema, so with reasoning on the
JSON answer arrives as reasoning and the content stays empty: that reasoning is the answer.
Servers that ignore `response_format` (mlx-lm) may be set to have the answer checked against
the schema, so a client never takes free text, or JSON cut off by `length`, for a valid answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jsonschema
import msgspec

from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    ReasoningDelta,
    StreamError,
    TextDelta,
    Usage,
)

if TYPE_CHECKING:
    from svir.providers.base import ProviderKind

Transform = Callable[[list[Event]], list[Event]]


def json_asked(request: dict[str, Any]) -> dict[str, Any] | None:
    """The request's response_format when it asks for JSON."""
    rf = request.get("response_format")
    if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
        return rf
    return None


def answer_transform(
    kind: ProviderKind, response_format: str, request: dict[str, Any]
) -> Transform | None:
    """The event transform a call to a server of `kind` needs, if any; `response_format` is the
    provider's setting ("pass" or "validate")."""
    rf = json_asked(request)
    if rf is None:
        return None
    steps: list[Transform] = []
    if kind.json_in_reasoning:
        steps.append(ReasoningAsAnswer())
    if response_format == "validate":
        steps.append(AnswerValidator(rf))
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def chain(events: list[Event]) -> list[Event]:
        for step in steps:
            events = step(events)
        return events

    return chain


class ReasoningAsAnswer:
    """Hold reasoning back; if the answer ends with no content, the reasoning was the answer."""

    def __init__(self) -> None:
        self.held: list[ReasoningDelta] = []
        self.saw_content = False

    def __call__(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for ev in events:
            if type(ev) is ReasoningDelta and not self.saw_content:
                self.held.append(ev)
                continue
            if type(ev) is TextDelta and not self.saw_content:
                # Real content: what was held was reasoning after all.
                self.saw_content = True
                out.extend(self.held)
                self.held = []
            elif (type(ev) is Finish or type(ev) is StreamError) and self.held:
                as_text = "".join(h.text for h in self.held)
                out.append(
                    TextDelta(as_text)
                    if type(ev) is Finish
                    else ReasoningDelta(as_text, self.held[0].carrier)
                )
                self.held = []
            out.append(ev)
        return out


class AnswerValidator:
    """Check the finished answer against the requested JSON; a mismatch ends the stream failed."""

    def __init__(self, response_format: dict[str, Any]) -> None:
        self.kind = response_format.get("type")
        spec = response_format.get("json_schema")
        self.schema = spec.get("schema") if isinstance(spec, dict) else None
        self.text: list[str] = []
        self.failed = False

    def __call__(self, events: list[Event]) -> list[Event]:
        if self.failed:
            return []
        out: list[Event] = []
        for ev in events:
            if type(ev) is TextDelta:
                self.text.append(ev.text)
            elif type(ev) is Finish:
                problem = self.problem(ev.reason)
                if problem is not None:
                    self.failed = True
                    out.append(StreamError(UpstreamError(
                        ErrorKind.PROTOCOL, problem, code="response_format_mismatch", in_stream=True
                    )))  # fmt: skip
                    return out
            elif (type(ev) is Usage or type(ev) is Done) and self.failed:
                continue
            out.append(ev)
        return out

    def problem(self, finish: str) -> str | None:
        if finish == "length":
            return "The answer was cut off by the token limit, so its JSON is incomplete."
        text = "".join(self.text)
        try:
            value = msgspec.json.decode(text)
        except msgspec.DecodeError:
            return "The server ignored response_format: the answer is not JSON."
        except RecursionError:  # the model's words, which the client's prompt may shape
            return "The answer nests too deeply to be checked against response_format."
        if self.kind == "json_object" and not isinstance(value, dict):
            return "The server ignored response_format: the answer is not a JSON object."
        if isinstance(self.schema, dict):
            try:
                jsonschema.validate(value, self.schema)
            except jsonschema.ValidationError as exc:
                return (
                    "The server ignored response_format: the answer does not match the "
                    f"schema ({exc.message})."
                )
            except jsonschema.SchemaError as exc:
                return f"The requested schema is not valid: {exc.message}"
        return None
