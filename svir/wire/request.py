"""The request side of the wire core: client messages rewritten into what every upstream takes
(§2.2), and request bodies whose exact size is known before a byte of an image is read (§2.3).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Final, Literal
from urllib.parse import unquote_to_bytes

import msgspec

from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown
from svir.wire.media import decode_base64, split_data_url

__all__ = [
    "EFFORT_KEY",
    "THINKING_KEY",
    "FileRef",
    "ReasoningKey",
    "StreamingBody",
    "base64_length",
    "build_messages",
    "file_block",
    "file_text",
    "json_escape",
    "json_escaped_length",
    "message_role",
    "split_text",
    "tool_result_text",
]

# The canonical chat request's key for an Anthropic client's own `thinking` object: the
# request side (svir.protocols.anthropic.request) writes it beside the `reasoning_effort` it stands
# for, the anthropic upstream kind sends it as it is, and every other kind's body leaves it out
# (svir.providers.request), since Kimi and others read a `thinking` of their own.
THINKING_KEY: Final = "anthropic_thinking"
# Likewise an Anthropic client's `output_config.effort` as it came (`max` included), beside the
# `reasoning_effort` it stands for.
EFFORT_KEY: Final = "anthropic_effort"

ReasoningKey = Literal["reasoning_content", "reasoning"]

_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
_TEXT_PART_TYPES: Final = frozenset({"text", "input_text"})
# Every part type OpenAI defines for chat content; a tool result made only of these is parts.
_OPENAI_PART_TYPES: Final = frozenset(
    {*_TEXT_PART_TYPES, "image_url", "file", "input_audio", "refusal"}
)
_REASONING_KEYS: Final[tuple[ReasoningKey, ...]] = ("reasoning_content", "reasoning")

# Text parts are joined with one newline. Clients split a message into parts at block boundaries
# (a prompt, then a pasted snippet), so joining with nothing would glue a word from one part to the
# next, while a blank line would invent paragraph structure the client never wrote.
_PART_SEPARATOR: Final = "\n"

_MISSING: Final = object()


# ---------------------------------------------------------------------------------------------
# Messages (§2.2)


def build_messages(
    messages: list[dict[str, Any]], *, reasoning_key: ReasoningKey | None
) -> list[dict[str, Any]]:
    """Rewrite an OpenAI client's messages into the form sent upstream.

    Text-only content becomes one string; content with images becomes a single text part followed
    by the images; text files become `<file name="...">` blocks inside the text. Assistant
    reasoning is sent under `reasoning_key`, or dropped when it is None. Keys svir does not forward
    are dropped. The input is never modified and the result shares no mutable object with it.

    Raises BodyError, naming the message and field, for anything that is not a valid message list.
    """
    if reasoning_key is not None and reasoning_key not in _REASONING_KEYS:
        raise ValueError(f"reasoning_key must be one of {_REASONING_KEYS} or None")
    if not isinstance(messages, list):
        raise BodyError(f"messages must be an array, not {json_type(messages)}")
    return [_build_message(f"messages[{i}]", m, reasoning_key) for i, m in enumerate(messages)]


def message_role(where: str, msg: Any, *, default: str | None = None) -> str:
    """The role of one inbound message, checked in the same words for every front end (OpenAI
    chat, Ollama, threads): the message must be an object and its role one of the five chat
    roles; a missing role is `default`, or a mistake when there is none. Raises BodyError."""
    if not isinstance(msg, dict):
        raise BodyError(f"{where} must be an object, not {json_type(msg)}")
    role = msg.get("role")
    if role is None:
        if default is None:
            raise BodyError(f"{where}.role is missing")
        return default
    if not isinstance(role, str):
        raise BodyError(f"{where}.role must be a string, not {json_type(role)}")
    if role not in _ROLES:
        raise BodyError(f"{where}.role: unknown role {shown(role)}")
    return role


def _build_message(where: str, msg: Any, reasoning_key: ReasoningKey | None) -> dict[str, Any]:
    role = message_role(where, msg)
    out: dict[str, Any] = {"role": role}
    content = msg.get("content", _MISSING)
    if role == "user":
        out["content"] = _user_content(f"{where}.content", content)
    elif role in ("system", "developer"):
        out["content"] = _text_content(f"{where}.content", content, role)
    elif role == "assistant":
        _assistant(where, msg, content, reasoning_key, out)
    else:
        _tool_result(where, msg, content, out)

    name = msg.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise BodyError(f"{where}.name must be a string, not {json_type(name)}")
        out["name"] = name
    return out


def _text_content(where: str, content: Any, role: str) -> str:
    """Content of a message that takes text only (system, developer, tool parts, assistant)."""
    if content is _MISSING or content is None:
        raise BodyError(f"{where} is missing")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BodyError(f"{where} must be a string or an array of parts, not {json_type(content)}")
    texts: list[str] = []
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        kind = _part_type(here, part)
        if kind in _TEXT_PART_TYPES:
            texts.append(_part_string(here, part, "text"))
        elif kind == "refusal" and role == "assistant":
            # A refusal is the model's own words; sent back, it is simply what the model said.
            texts.append(_part_string(here, part, "refusal"))
        else:
            raise BodyError(f"{here}: a {role} message takes no {shown(kind)} part")
    return _join(texts)


def _user_content(where: str, content: Any) -> str | list[dict[str, Any]]:
    if content is _MISSING or content is None:
        raise BodyError(f"{where} is missing")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BodyError(f"{where} must be a string or an array of parts, not {json_type(content)}")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        kind = _part_type(here, part)
        if kind in _TEXT_PART_TYPES:
            texts.append(_part_string(here, part, "text"))
        elif kind == "file":
            texts.append(file_text(f"{here}.file", part.get("file")))
        elif kind == "image_url":
            images.append(_image_part(f"{here}.image_url", part.get("image_url")))
        else:
            raise BodyError(f"{here}: unsupported content part type {shown(kind)}")
    text = _join(texts)
    if not images:
        # Not every server takes the array form, so text alone is always a plain string.
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.extend(images)
    return parts


def _part_type(where: str, part: Any) -> str:
    if not isinstance(part, dict):
        raise BodyError(f"{where} must be an object, not {json_type(part)}")
    kind = part.get("type")
    if not isinstance(kind, str):
        raise BodyError(f"{where}.type must be a string, not {json_type(kind)}")
    return kind


def _part_string(where: str, part: dict[str, Any], key: str) -> str:
    value = part.get(key)
    if not isinstance(value, str):
        raise BodyError(f"{where}.{key} must be a string, not {json_type(value)}")
    return value


def _join(texts: list[str]) -> str:
    # Empty parts carry nothing; keeping them would leave stray separators.
    return _PART_SEPARATOR.join(t for t in texts if t)


def _image_part(where: str, image: Any) -> dict[str, Any]:
    detail: Any = None
    if isinstance(image, str):
        # Some clients send the URL itself instead of the {"url": ...} object.
        url: Any = image
    elif isinstance(image, dict):
        url = image.get("url")
        detail = image.get("detail")
    else:
        raise BodyError(f"{where} must be an object with a url, not {json_type(image)}")
    if isinstance(url, str):
        _check_image_url(f"{where}.url", url)
    elif not isinstance(url, FileRef):
        raise BodyError(f"{where}.url must be a string, not {json_type(url)}")
    body: dict[str, Any] = {"url": url}
    if detail is not None:
        if not isinstance(detail, str):
            raise BodyError(f"{where}.detail must be a string, not {json_type(detail)}")
        body["detail"] = detail
    return {"type": "image_url", "image_url": body}


# One character class, so the check runs at C speed over megabytes; the length is checked apart.
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def _check_image_url(where: str, url: str) -> None:
    lowered = url[:8].lower()
    if lowered.startswith(("http://", "https://")):
        return
    if not lowered.startswith("data:"):
        raise BodyError(f"{where} must be an http(s) URL or a data URL")
    # Only the header is split off: an image is megabytes, and copying it to check it would
    # hold it several times over (§2.3).
    comma = url.find(",", 0, 512)
    if comma < 0:
        raise BodyError(f"{where}: a data URL needs a comma before its data")
    media_type, is_base64, _ = split_data_url(where, url[: comma + 1])
    if not is_base64:
        raise BodyError(f"{where}: an image data URL must be base64 (data:{media_type};base64,...)")
    if comma + 1 == len(url):
        raise BodyError(f"{where}: the image data is empty")
    if _BASE64.fullmatch(url, comma + 1) is None or (len(url) - comma - 1) % 4:
        raise BodyError(f"{where}: the data is not valid base64")


def file_text(where: str, file: Any) -> str:
    """A client's file part (`filename`, `file_data` as base64 or a data URL) as svir's file
    block: local servers take files no other way (§2.2). Raises BodyError naming `where`."""
    if not isinstance(file, dict):
        raise BodyError(f"{where} must be an object, not {json_type(file)}")
    name = file.get("filename")
    if name is None:
        name = ""
    elif not isinstance(name, str):
        raise BodyError(f"{where}.filename must be a string, not {json_type(name)}")
    data = file.get("file_data")
    if data is None:
        if file.get("file_id") is not None:
            raise BodyError(f"{where}: uploaded files (file_id) are not supported; send file_data")
        raise BodyError(f"{where}.file_data is missing")
    if not isinstance(data, str):
        raise BodyError(f"{where}.file_data must be a string, not {json_type(data)}")

    here = f"{where}.file_data"
    if data[:5].lower() == "data:":
        _, is_base64, payload = split_data_url(here, data)
        raw = decode_base64(here, payload) if is_base64 else unquote_to_bytes(payload)
    else:
        # OpenAI documents file_data as bare base64; clients also send a data URL.
        raw = decode_base64(here, data)
    try:
        # utf-8-sig: a byte-order mark is an encoding artefact, not part of the text.
        contents = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BodyError(
            f"{where}: file {shown(name)} is not UTF-8 text; only text files can be sent"
        ) from None
    return file_block(name, contents)


def split_text(parts: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Canonical content parts as a tool message takes them: the text parts' texts joined, and
    the other parts (images), which go into a user message after the results."""
    texts = [p["text"] for p in parts if p["type"] == "text"]
    return _join(texts), [p for p in parts if p["type"] != "text"]


def file_block(name: str, contents: str) -> str:
    """A text file as local servers take it, inside the prompt's text: `<file name="...">`."""
    return f'<file name="{_xml_attribute(name)}">\n{contents}\n</file>'


def _xml_attribute(value: str) -> str:
    # & first, so the entities added after it are not escaped again.
    return (
        value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _assistant(
    where: str,
    msg: dict[str, Any],
    content: Any,
    reasoning_key: ReasoningKey | None,
    out: dict[str, Any],
) -> None:
    # A turn that only called tools has no content; "" rather than null, because some chat
    # templates test or split the content string and fail on null.
    if content is _MISSING or content is None:
        out["content"] = ""
    else:
        out["content"] = _text_content(f"{where}.content", content, "assistant")

    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise BodyError(f"{where}.tool_calls must be an array, not {json_type(calls)}")
        built = [_tool_call(f"{where}.tool_calls[{k}]", c) for k, c in enumerate(calls)]
        if built:  # an empty array is rejected by some servers and says nothing
            out["tool_calls"] = built

    found: dict[str, str] = {}
    for key in _REASONING_KEYS:
        value = msg.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise BodyError(f"{where}.{key} must be a string, not {json_type(value)}")
        if value:
            found[key] = value
    if reasoning_key is not None and found:
        # A server that sends both keys sends the same text twice (§4): one text, one key.
        out[reasoning_key] = found.get(reasoning_key) or next(iter(found.values()))


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise BodyError(f"{where} must be an object, not {json_type(call)}")
    call_id = call.get("id")
    if not isinstance(call_id, str):
        raise BodyError(f"{where}.id must be a string, not {json_type(call_id)}")
    kind = call.get("type")
    if kind is not None and kind != "function":
        raise BodyError(f"{where}.type must be 'function', not {shown(kind)}")
    function = call.get("function")
    if not isinstance(function, dict):
        raise BodyError(f"{where}.function must be an object, not {json_type(function)}")
    name = function.get("name")
    if not isinstance(name, str):
        raise BodyError(f"{where}.function.name must be a string, not {json_type(name)}")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        # Upstreams take arguments only as the raw JSON text the model produced.
        arguments = _json_text(f"{where}.function.arguments", arguments)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _tool_result(where: str, msg: dict[str, Any], content: Any, out: dict[str, Any]) -> None:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str):
        raise BodyError(f"{where}.tool_call_id must be a string, not {json_type(call_id)}")
    out["tool_call_id"] = call_id
    here = f"{where}.content"
    if content is _MISSING:
        raise BodyError(f"{here} is missing")
    out["content"] = tool_result_text(here, content)


def tool_result_text(where: str, content: Any) -> str:
    """A tool result's content as the one string upstreams take, for every front end: a string
    as it is, text parts joined, any other value (a structured result) as its JSON text.
    Raises BodyError."""
    if isinstance(content, str):
        return content
    if _is_parts(content):
        return _text_content(where, content, "tool")
    # Upstreams take a tool result only as a string, so structured results become JSON text.
    return _json_text(where, content)


def _is_parts(value: Any) -> bool:
    """Whether a tool's list is a content-parts array rather than a structured (JSON) result."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(p, dict) and p.get("type") in _OPENAI_PART_TYPES for p in value)
    )


def _json_text(where: str, value: Any) -> str:
    try:
        return msgspec.json.encode(value).decode("utf-8")
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise BodyError(f"{where} cannot be serialized as JSON ({exc})") from None


# ---------------------------------------------------------------------------------------------
# Sizes (§2.3)


def base64_length(n: int) -> int:
    """Length of the padded base64 encoding of `n` bytes."""
    if n < 0:
        raise ValueError("a byte count cannot be negative")
    return 4 * ((n + 2) // 3)


# Bytes that JSON escapes: control bytes, the quote and the backslash. The five controls with a
# short escape (and the quote and backslash) take 2 bytes; every other control takes 6 (\u00XX).
_ORDINARY: Final = bytes(b for b in range(256) if b >= 0x20 and b not in (0x22, 0x5C))
_SHORT_ESCAPED: Final = b'"\\\n\r\t\b\f'


def json_escaped_length(data: bytes) -> int:
    """Length of UTF-8 text `data` once escaped inside a JSON string, quotes excluded."""
    # Deleting the ordinary bytes leaves only those that grow; both passes run in C.
    escaped = data.translate(None, _ORDINARY)
    if not escaped:
        return len(data)
    long_escaped = len(escaped.translate(None, _SHORT_ESCAPED))
    return len(data) + len(escaped) + 4 * long_escaped


def json_escape(text: str) -> bytes:
    """`text` escaped as the inside of a JSON string: UTF-8 kept raw, controls escaped (§2.3).

    The result is what msgspec writes between the quotes, so escaped pieces and msgspec-encoded
    bodies agree byte for byte. Raises BodyError for a lone surrogate, which UTF-8 cannot carry.
    """
    try:
        encoded = msgspec.json.encode(text)
    except UnicodeEncodeError as exc:
        raise BodyError(f"text holds a lone surrogate at position {exc.start}") from None
    return encoded[1:-1]


# ---------------------------------------------------------------------------------------------
# Streaming bodies (§2.3)


class FileRef(msgspec.Struct, frozen=True):
    """A file on disk standing for the data URL of an image, of `size` bytes of `media_type`."""

    path: str
    size: int
    media_type: str

    def __post_init__(self) -> None:
        if self.size < 0:
            raise BodyError(f"file {self.path!r}: size cannot be negative")
        # A comma or a bare type would make the data URL unparseable upstream.
        if "/" not in self.media_type or "," in self.media_type:
            raise BodyError(f"file {self.path!r}: {self.media_type!r} is not a media type")


class StreamingBody:
    """A JSON request body whose image data URLs are streamed from disk as base64.

    The payload is encoded up front except for the files, so `content_length` is exact without
    reading them; `iter_chunks` then holds at most about one chunk of any file in memory.
    """

    __slots__ = ("_files", "_length", "_segments")

    def __init__(self, payload: dict[str, Any]) -> None:
        if not isinstance(payload, dict):
            raise BodyError(f"a request payload must be an object, not {json_type(payload)}")
        pieces: list[bytes | FileRef] = []
        _encode_into(payload, pieces)
        segments: list[bytes | FileRef] = []
        run: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, FileRef):
                segments.append(b"".join(run))
                segments.append(piece)
                run = []
            else:
                run.append(piece)
        segments.append(b"".join(run))
        self._segments: tuple[bytes | FileRef, ...] = tuple(s for s in segments if s)
        self._files = tuple(s for s in self._segments if isinstance(s, FileRef))
        self._length = sum(
            base64_length(s.size) if isinstance(s, FileRef) else len(s) for s in self._segments
        )

    @property
    def content_length(self) -> int:
        """The exact number of bytes `iter_chunks` yields when every file has its stated size."""
        return self._length

    @property
    def files(self) -> tuple[FileRef, ...]:
        """The files the body streams, in the order they are written."""
        return self._files

    def iter_chunks(
        self, opener: Callable[[str], BinaryIO], chunk_size: int = 3 * 65536
    ) -> Iterator[bytes]:
        """Yield the body; each file is opened with `opener` and read `chunk_size` bytes at a time.

        `chunk_size` is rounded down to a multiple of 3 so each piece encodes to base64 without
        padding. Raises BodyError when a file's length differs from its stated size, since the
        announced Content-Length would then be false.
        """
        if chunk_size < 3:
            raise ValueError("chunk_size must be at least 3")
        step = chunk_size - chunk_size % 3
        for segment in self._segments:
            if isinstance(segment, FileRef):
                yield from _stream_base64(segment, opener, step)
            else:
                yield segment


def _encode_into(value: Any, out: list[bytes | FileRef]) -> None:
    """Append `value`'s JSON as msgspec writes it, leaving each FileRef's base64 as a marker."""
    if isinstance(value, FileRef):
        # The prefix is encoded as a JSON string minus its closing quote; base64 needs no escaping.
        out.append(_encode(f"data:{value.media_type};base64,")[:-1])
        out.append(value)
        out.append(b'"')
    elif isinstance(value, dict):
        out.append(b"{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(b",")
            out.append(_encode_key(key))
            out.append(b":")
            _encode_into(item, out)
        out.append(b"}")
    elif isinstance(value, list | tuple):
        out.append(b"[")
        for i, item in enumerate(value):
            if i:
                out.append(b",")
            _encode_into(item, out)
        out.append(b"]")
    else:
        out.append(_encode(value))


def _encode(value: Any) -> bytes:
    try:
        return msgspec.json.encode(value)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise BodyError(f"the request payload cannot be encoded as JSON ({exc})") from None


def _encode_key(key: Any) -> bytes:
    if isinstance(key, str):
        return _encode(key)
    # msgspec turns some non-string keys (numbers, enums) into strings; let it decide, exactly.
    return _encode({key: None})[1 : -len(b":null}")]


def _stream_base64(ref: FileRef, opener: Callable[[str], BinaryIO], step: int) -> Iterator[bytes]:
    done = 0
    carry = b""
    try:
        stream = opener(ref.path)
    except OSError as exc:
        raise BodyError(f"file {ref.path!r} cannot be opened ({exc})") from None
    with stream:
        while True:
            remaining = ref.size - done
            # Once the stated size is read, one more byte is asked for: getting it means the file
            # is longer than announced.
            want = min(step, remaining) or 1
            try:
                piece = stream.read(want)
            except OSError as exc:
                raise BodyError(f"file {ref.path!r} cannot be read ({exc})") from None
            if not piece:
                break
            done += len(piece)
            if done > ref.size:
                raise BodyError(
                    f"file {ref.path!r} holds more than its stated {ref.size} bytes;"
                    " the announced Content-Length would be wrong"
                )
            if carry:
                piece = carry + piece
            # A read may come back short; only whole 3-byte groups encode without padding.
            cut = len(piece) - len(piece) % 3
            if cut:
                yield binascii.b2a_base64(piece[:cut], newline=False)
            carry = piece[cut:]
    if done != ref.size:
        raise BodyError(
            f"file {ref.path!r} holds {done} bytes, not its stated {ref.size};"
            " the announced Content-Length would be wrong"
        )
    if carry:
        yield binascii.b2a_base64(carry, newline=False)
