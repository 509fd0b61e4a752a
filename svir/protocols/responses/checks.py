"""What a Responses request's translation reports besides its result: a client's mistake as the
error it is (`ResponsesRequestError`, naming the field as OpenAI does), the JSON-type checks that
raise it (`check`), and what the translation dropped or ignored (`Warnings`, for
`x-svir-warning`). Shared by svir.protocols.responses.request and the modules it walks a request
with (tools, items, content)."""

from __future__ import annotations

from typing import Final

from svir.wire.errors import BodyError
from svir.wire.jsonbody import TypeChecks

__all__ = ["ResponsesRequestError", "Warnings", "check"]


class ResponsesRequestError(BodyError):
    """A client's Responses request that cannot be translated: `param` names the field
    (`input[3].call_id`), `message` says what is wrong, naming it too."""

    def __init__(self, param: str | None, message: str) -> None:
        text = f"{param}: {message}" if param and not message.startswith(param) else message
        super().__init__(text)
        self.message = text
        self.param = param


# The type checks of a translation, each raising ResponsesRequestError for the field it names.
check: Final = TypeChecks(ResponsesRequestError)


class Warnings:
    """What one translation dropped or ignored, one line each, in the order it came to it."""

    __slots__ = ("_seen", "lines")

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def add(self, text: str) -> None:
        self.lines.append(text)

    def once(self, text: str) -> None:
        """`text`, unless it was said `once` already (one line for every dropped tool of a kind)."""
        if text not in self._seen:
            self._seen.add(text)
            self.lines.append(text)
