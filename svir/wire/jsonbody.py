"""A client's JSON request body, decoded: the one decoder of every front end (OpenAI chat, Ollama,
threads, the admin API), with a bound on how deeply the body may nest.

msgspec decodes nesting as deep as the stack allows (about 900 levels), and deeper input makes it
raise RecursionError rather than its own error. What svir and its libraries then do with the
value (a JSON Schema validator walking a `response_format`, Python's own copying, encoding it
again one call deeper) needs several frames per level, so a body far below msgspec's limit can
still exhaust the stack in the middle of a request. Bounding the nesting once, where the body
comes in, keeps every later walk safe.

`json_type` and `shown` are the words every front end's error messages use for a client's value:
"must be a string, not an array", "unknown role 'bot'". `mistake` reads where msgspec refused a
body converted to a front end's structs, `value_at` finds the value there.

The depth is measured by msgspec itself: `msgspec.json.format` with an indent of one re-writes the
body in C, one space of indentation per level, without building a Python object; a value inside
more than `MAX_DEPTH` arrays and objects is a line indented more than `MAX_DEPTH` spaces. (JSON
strings cannot hold a raw newline, so no string passes for such a line.) Measured on an idle
2-core machine, against msgspec's decode alone: a 1.7 KB chat request +2 µs (decode 1.4 µs); a
26 KB request with 40 tools +37 µs (+47%); 1 MB of conversation with 1,500 tool calls +1.1 ms
(+28%); 1 MB of one text +0.34 ms (a copy of the text, about one decode). Under callgrind a whole
request still costs fewer instructions than before this check came (the deep copies of the
client's fields it made safe to drop cost more).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import msgspec

from svir.wire.errors import WireError

__all__ = [
    "MAX_DEPTH",
    "BadJSON",
    "Mistake",
    "TypeChecks",
    "decode_body",
    "json_type",
    "mistake",
    "shown",
    "value_at",
]

# How many arrays and objects a value may sit inside. Real clients stay far below it: a chat
# request's messages reach 5 levels (body, messages, message, content, part), a tool's parameters
# 5 plus two per level of its schema, and OpenAI's structured outputs allow 10 levels of schema
# nesting (about 25 here). Far enough above that no real request meets it, and far enough below
# Python's recursion limit (1000 frames) that a walk of several frames per level still fits:
# jsonschema takes about ten a level of schema, and a `response_format` schema has at most 48
# levels within 100.
MAX_DEPTH: Final = 100

_format = msgspec.json.format
_decode = msgspec.json.decode


class BadJSON(WireError):
    """A body that is not JSON, or nests too deeply: `message` is the client's answer, `code`
    what is wrong (`invalid_json`, `json_too_deep`)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def decode_body(raw: bytes | bytearray | memoryview, *, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded body; BadJSON when it is not JSON or a value in it sits inside more than
    `max_depth` arrays and objects. Raises nothing else."""
    try:
        indented = _format(raw, indent=1)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except msgspec.DecodeError as exc:
        raise BadJSON(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if b"\n" + b" " * (max_depth + 1) in indented:
        raise _too_deep(max_depth)
    del indented
    try:
        return _decode(raw)
    except msgspec.DecodeError as exc:  # what formatting lets through: bad UTF-8, huge numbers
        raise BadJSON(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # not reached after the check above, whatever the stack holds
        raise _too_deep(max_depth) from None


def _too_deep(limit: int) -> BadJSON:
    return BadJSON(
        f"the request body nests too deeply: a value in it sits inside more than {limit} arrays "
        f"and objects, and svir takes at most {limit} levels",
        code="json_too_deep",
    )


def json_type(value: Any) -> str:
    """A decoded JSON value's type in words, for an error message: "null", "a boolean", "a number",
    "a string", "an array", "an object" (a value JSON does not have: its Python type's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def shown(value: Any) -> str:
    """A client's value in an error message: a string as written (cut at 40 characters), anything
    else as its JSON type."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "…")
    return json_type(value)


class TypeChecks:
    """The JSON-type checks of a translating front end's fields, each raising that front end's
    own error (`error(where, message)`) in the same words: "must be a string, not an array"."""

    __slots__ = ("_error",)

    def __init__(self, error: Callable[[str, str], Exception]) -> None:
        self._error = error

    def _wrong(self, where: str, value: Any, what: str) -> Exception:
        return self._error(where, f"must be {what}, not {json_type(value)}")

    def string(self, where: str, value: Any) -> str:
        if isinstance(value, str):
            return value
        raise self._wrong(where, value, "a string")

    def boolean(self, where: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        raise self._wrong(where, value, "a boolean")

    def number(self, where: str, value: Any) -> float:
        # bool is an int in Python but not in JSON.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        raise self._wrong(where, value, "a number")

    def integer(self, where: str, value: Any, least: int = 1) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            return value
        what = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise self._error(where, f"must be {what}, not {shown(value)}")

    def tagged(self, where: str, value: Any) -> str:
        """The `type` of an object tagged by it (a content block, an item, a tool)."""
        if not isinstance(value, dict):
            raise self._wrong(where, value, "an object")
        return self.string(f"{where}.type", value.get("type"))


class Mistake(NamedTuple):
    """What msgspec refused in a converted value, read from its ValidationError: the keys of the
    value (a missing field's name last), and msgspec's name of the type it expected there ("str",
    "int | float", "object"; without " | null"), None where it names none (a wrong tag, a missing
    field)."""

    keys: list[str | int]
    expected: str | None
    missing: bool


_AT: Final = re.compile(r"\.([^.\[`]+)|\[(\d+)\]")
_MISSING: Final = re.compile(r"^Object missing required field `([^`]+)`")
_EXPECTED: Final = re.compile(r"^Expected `([^`]+)`")


def mistake(error: msgspec.ValidationError) -> Mistake:
    """Where `error` is and what was expected there: the one reading of msgspec's words for every
    front end that converts a body to its structs (each words the mistake its own way)."""
    head, _, at = str(error).partition(" - at `$")
    keys: list[str | int] = [
        int(index) if index else name for name, index in _AT.findall(at.rstrip("`"))
    ]
    missing = _MISSING.match(head)
    if missing:
        keys.append(missing.group(1))
    expected = _EXPECTED.match(head)
    what = expected.group(1).removesuffix(" | null") if expected else None
    return Mistake(keys, what, missing is not None)


def value_at(body: Any, keys: list[str | int]) -> Any:
    """The value at `keys` in a decoded body, None where there is none."""
    for key in keys:
        if isinstance(key, int):
            if not isinstance(body, list) or key >= len(body):
                return None
            body = body[key]
        elif isinstance(body, dict):
            body = body.get(key)
        else:
            return None
    return body
