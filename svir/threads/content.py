"""What a thread's messages hold, three ways: as a client posts them (JSON parts or a multipart
upload), as svir stores them (parts naming attachments by content hash), and as they go upstream
(OpenAI messages in §2.2's layout, built by the wire core).

Stored parts:
- `{"type": "text", "text": ...}`
- `{"type": "image", "attachment_id": <sha256>, "media_type": "image/png", "size": n}` (+ `detail`)
- `{"type": "file", "attachment_id": <sha256>, "filename": ..., "media_type": ..., "size": n}`
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Final
from urllib.parse import unquote_to_bytes

from svir.errors import GatewayError, request_error
from svir.threads.records import MessageRecord, NewBlob, NewMessage, ThreadRecord
from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown
from svir.wire.media import decode_base64, is_media_type, sniff_image, split_data_url
from svir.wire.request import message_role, tool_result_text

__all__ = [
    "Limits",
    "check_append",
    "check_continue",
    "message_object",
    "parse_messages",
    "parse_multipart",
    "pending_tool_calls",
    "thread_object",
    "upstream_messages",
]

MAX_MESSAGES_PER_POST: Final = 64
_TEXT_TYPES: Final = frozenset({"text", "input_text"})
_MESSAGE_KEYS: Final = frozenset({"role", "content", "tool_call_id"})


@dataclass(frozen=True, slots=True)
class Limits:
    max_attachment_bytes: int


def new_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------------------------
# Input


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return request_error(message, param=param, code=code)


def _too_large(where: str, size: int, limits: Limits) -> GatewayError:
    return request_error(
        f"{where}: the attachment is {size} bytes, over the limit of"
        f" {limits.max_attachment_bytes} bytes per attachment",
        status=413,
        code="attachment_too_large",
    )


def _blob(data: bytes, media_type: str) -> NewBlob:
    return NewBlob(hashlib.sha256(data).hexdigest(), data, media_type)


def _decode_base64(where: str, data: str, limits: Limits) -> bytes:
    # Refuse before decoding: base64 of n bytes is about 4n/3 characters.
    if len(data) // 4 * 3 > limits.max_attachment_bytes + 3:
        raise _too_large(where, len(data) // 4 * 3, limits)
    try:
        raw = decode_base64(where, data)
    except BodyError as exc:
        raise _bad(str(exc), "content") from None
    if len(raw) > limits.max_attachment_bytes:
        raise _too_large(where, len(raw), limits)
    return raw


def _data_url(where: str, url: str, limits: Limits) -> tuple[str, bytes]:
    """The media type and bytes of a data URL."""
    try:
        media_type, is_base64, payload = split_data_url(where, url)
    except BodyError as exc:
        raise _bad(str(exc), "content") from None
    if is_base64:
        return media_type, _decode_base64(where, payload, limits)
    raw = unquote_to_bytes(payload)
    if len(raw) > limits.max_attachment_bytes:
        raise _too_large(where, len(raw), limits)
    return media_type, raw


def _image(
    where: str, data: bytes, media_type: str, detail: Any = None
) -> tuple[dict[str, Any], NewBlob]:
    if not data:
        raise _bad(f"{where}: the image is empty", "content")
    if not media_type.startswith("image/"):
        sniffed = sniff_image(data)
        if sniffed is None:
            raise _bad(
                f"{where}: {media_type or 'data without a media type'} is not an image"
                " (send text files as file parts)",
                "content",
                "unsupported_attachment",
            )
        media_type = sniffed
    blob = _blob(data, media_type)
    part: dict[str, Any] = {
        "type": "image", "attachment_id": blob.hash, "media_type": media_type, "size": len(data),
    }  # fmt: skip
    if detail is not None:
        if not isinstance(detail, str):
            raise _bad(f"{where}.detail must be a string, not {json_type(detail)}", "content")
        part["detail"] = detail
    return part, blob


def _text_file(
    where: str, name: str, data: bytes, media_type: str
) -> tuple[dict[str, Any], NewBlob]:
    # Local servers take files only as text inside the message (§2.2): a file must be UTF-8 text.
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _bad(
            f"{where}: file {name!r} is not UTF-8 text; only images and text files can be sent",
            "content",
            "unsupported_attachment",
        ) from None
    media_type = media_type if media_type and not media_type.startswith("image/") else "text/plain"
    blob = _blob(data, media_type)
    part = {
        "type": "file", "attachment_id": blob.hash, "filename": name,
        "media_type": media_type, "size": len(data),
    }  # fmt: skip
    return part, blob


def _image_part(where: str, part: dict[str, Any], limits: Limits) -> tuple[dict[str, Any], NewBlob]:
    image = part.get("image_url")
    detail = None
    if isinstance(image, dict):
        url = image.get("url")
        detail = image.get("detail")
    else:
        url = image
    if not isinstance(url, str):
        raise _bad(f"{where}.image_url.url must be a string, not {json_type(url)}", "content")
    if url[:5].lower() != "data:":
        # Images go upstream inline (§2.2); servers on a laptop cannot fetch a URL.
        raise _bad(
            f"{where}.image_url.url must be a data URL (data:image/png;base64,...); upload the"
            " image or send its bytes inline",
            "content",
        )
    media_type, data = _data_url(f"{where}.image_url.url", url, limits)
    return _image(where, data, media_type, detail)


def _file_part(where: str, part: dict[str, Any], limits: Limits) -> tuple[dict[str, Any], NewBlob]:
    file = part.get("file")
    if not isinstance(file, dict):
        raise _bad(f"{where}.file must be an object, not {json_type(file)}", "content")
    name = file.get("filename")
    if name is None:
        name = ""
    if not isinstance(name, str):
        raise _bad(f"{where}.file.filename must be a string, not {json_type(name)}", "content")
    data = file.get("file_data")
    if data is None:
        if file.get("file_id") is not None:
            raise _bad(
                f"{where}.file: file_id is not supported; send file_data, or upload the file"
                " with multipart/form-data",
                "content",
            )
        raise _bad(f"{where}.file.file_data is missing", "content")
    if not isinstance(data, str):
        raise _bad(f"{where}.file.file_data must be a string, not {json_type(data)}", "content")
    if data[:5].lower() == "data:":
        media_type, raw = _data_url(f"{where}.file.file_data", data, limits)
    else:
        # OpenAI documents file_data as bare base64.
        media_type, raw = "", _decode_base64(f"{where}.file.file_data", data, limits)
    if media_type.startswith("image/"):
        return _image(where, raw, media_type)
    return _text_file(where, name, raw, media_type)


def _user_message(where: str, msg: dict[str, Any], limits: Limits) -> NewMessage:
    content = msg.get("content")
    parts: list[dict[str, Any]] = []
    blobs: list[NewBlob] = []
    if isinstance(content, str):
        if content:
            parts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, part in enumerate(content):
            here = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise _bad(f"{here} must be an object, not {json_type(part)}", "content")
            kind = part.get("type")
            if kind in _TEXT_TYPES:
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad(f"{here}.text must be a string, not {json_type(text)}", "content")
                if text:
                    parts.append({"type": "text", "text": text})
            elif kind == "image_url":
                stored, blob = _image_part(here, part, limits)
                parts.append(stored)
                blobs.append(blob)
            elif kind == "file":
                stored, blob = _file_part(here, part, limits)
                parts.append(stored)
                blobs.append(blob)
            else:
                raise _bad(
                    f"{here}: unsupported content part type {kind!r} (text, image_url, file)",
                    "content",
                )
    elif content is None:
        raise _bad(f"{where}.content is missing", "content", "missing_required_parameter")
    else:
        raise _bad(
            f"{where}.content must be a string or an array of parts, not {json_type(content)}",
            "content",
        )
    if not parts:
        raise _bad(f"{where}: a message needs text or an attachment", "content")
    return NewMessage(id=new_id(), role="user", content=parts, blobs=tuple(blobs))


def _tool_message(where: str, msg: dict[str, Any]) -> NewMessage:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(
            f"{where}.tool_call_id must be a non-empty string, not {json_type(call_id)}",
            "tool_call_id",
        )
    content = msg.get("content")
    if content is None:
        raise _bad(f"{where}.content is missing", "content", "missing_required_parameter")
    try:
        text = tool_result_text(f"{where}.content", content)
    except BodyError as exc:
        raise _bad(str(exc), "content") from None
    return NewMessage(
        id=new_id(), role="tool", content=[{"type": "text", "text": text}], tool_call_id=call_id
    )


def parse_messages(body: Any, limits: Limits) -> tuple[list[NewMessage], bool]:
    """The messages of a JSON post: one message object, or `{"messages": [...]}`. The flag tells
    which (a single message is answered as one object, a list as a list)."""
    if not isinstance(body, dict):
        raise _bad(
            f"the request body must be a JSON object, not {json_type(body)}", None, "invalid_type"
        )
    if "messages" in body:
        extra = set(body) - {"messages"}
        if extra:
            raise _bad(f"unknown field {sorted(extra)[0]!r} next to messages", sorted(extra)[0])
        items = body["messages"]
        if not isinstance(items, list) or not items:
            raise _bad("messages must be a non-empty array", "messages")
        if len(items) > MAX_MESSAGES_PER_POST:
            raise _bad(f"at most {MAX_MESSAGES_PER_POST} messages per request", "messages")
        single = False
    else:
        items = [body]
        single = True
    out: list[NewMessage] = []
    for i, msg in enumerate(items):
        where = "message" if single else f"messages[{i}]"
        try:
            role = message_role(where, msg, default="user")
        except BodyError as exc:
            raise _bad(str(exc), "role" if isinstance(msg, dict) else "messages") from None
        unknown = set(msg) - _MESSAGE_KEYS
        if unknown:
            name = sorted(unknown)[0]
            raise _bad(f"{where}: unknown field {name!r} (role, content, tool_call_id)", name)
        if role == "user":
            if "tool_call_id" in msg:
                raise _bad(f"{where}: a user message takes no tool_call_id", "tool_call_id")
            out.append(_user_message(where, msg, limits))
        elif role == "tool":
            out.append(_tool_message(where, msg))
        else:
            raise _bad(
                f"{where}.role must be 'user' or 'tool', not {shown(role)}: assistant messages come"
                " from /continue, and the system prompt is the thread's",
                "role",
            )
    return out, single


def parse_multipart(body: bytes, content_type: str, limits: Limits) -> NewMessage:
    """A user message uploaded as multipart/form-data: `text` fields, and files (images, or
    UTF-8 text files) in fields of any name."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    if not msg.is_multipart() or msg.get_boundary() is None:
        raise _bad("the multipart body could not be read (is the boundary right?)", None)
    parts: list[dict[str, Any]] = []
    blobs: list[NewBlob] = []
    seen = 0
    for i, item in enumerate(msg.iter_parts()):
        seen += 1
        name = item.get_param("name", header="content-disposition")
        filename = item.get_filename()
        payload = item.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        where = f"part {i} ({name!r})" if isinstance(name, str) else f"part {i}"
        if filename is None:
            if name == "role":
                if data.decode("utf-8", "replace").strip() != "user":
                    raise _bad("a multipart upload is a user message: role must be 'user'", "role")
                continue
            if name not in ("text", "content"):
                raise _bad(f"{where}: unknown form field (text, role, or files)", str(name))
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise _bad(f"{where}: the text is not UTF-8", "text") from None
            if text:
                parts.append({"type": "text", "text": text})
            continue
        # Form uploads send a name's UTF-8 bytes raw, which the parser leaves escaped.
        filename = filename.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if len(data) > limits.max_attachment_bytes:
            raise _too_large(f"file {filename!r}", len(data), limits)
        media_type = item.get_content_type().lower()
        if not is_media_type(media_type):
            media_type = "application/octet-stream"
        if media_type.startswith("image/") or (
            media_type == "application/octet-stream" and sniff_image(data) is not None
        ):
            stored, blob = _image(f"file {filename!r}", data, media_type)
        else:
            if media_type == "application/octet-stream":
                media_type = "text/plain"
            stored, blob = _text_file(f"file {filename!r}", filename, data, media_type)
        parts.append(stored)
        blobs.append(blob)
    if not seen:
        raise _bad("the multipart body holds no parts", None)
    if not parts:
        raise _bad("a message needs text or an attachment", "content")
    return NewMessage(id=new_id(), role="user", content=parts, blobs=tuple(blobs))


# ---------------------------------------------------------------------------------------------
# Checks, run on what the thread holds inside the store's transaction


def pending_tool_calls(tail: Sequence[MessageRecord]) -> list[str]:
    """The ids of the last assistant turn's tool calls that no tool message answers yet."""
    if not tail or tail[0].role != "assistant" or not tail[0].tool_calls:
        return []
    answered = {m.tool_call_id for m in tail[1:] if m.role == "tool"}
    return [c["id"] for c in tail[0].tool_calls if c.get("id") not in answered]


def check_append(tail: list[MessageRecord], new: Sequence[NewMessage]) -> None:
    pending = pending_tool_calls(tail)
    for m in new:
        if m.role == "tool":
            if m.tool_call_id in pending:
                pending.remove(m.tool_call_id)
                continue
            calls = tail[0].tool_calls if tail and tail[0].role == "assistant" else None
            if not calls:
                raise _bad(
                    "a tool result answers a tool call of the last assistant turn, and it called"
                    " no tool",
                    "tool_call_id",
                    "no_pending_tool_calls",
                )
            if any(c.get("id") == m.tool_call_id for c in calls):
                raise _bad(
                    f"tool call {m.tool_call_id!r} already has its result",
                    "tool_call_id",
                    "duplicate_tool_result",
                )
            ids = ", ".join(repr(c.get("id")) for c in calls)
            raise _bad(
                f"the last assistant turn made no tool call {m.tool_call_id!r} (its calls: {ids})",
                "tool_call_id",
                "unknown_tool_call_id",
            )
        elif pending:
            raise _tool_results_pending(pending)


def _tool_results_pending(pending: Sequence[str]) -> GatewayError:
    return _bad(
        "the last assistant turn's tool calls await their results first: "
        + ", ".join(repr(p) for p in pending),
        "messages",
        "tool_results_pending",
    )


def check_continue(thread: ThreadRecord, messages: list[MessageRecord]) -> None:
    if not messages:
        raise _bad(
            "the thread has no messages to answer; post a user message first", None, "empty_thread"
        )
    start = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    if start is not None:
        pending = pending_tool_calls(messages[start:])
        if pending:
            raise _tool_results_pending(pending)
    if messages[-1].role == "assistant":
        raise _bad(
            "the thread ends with an assistant message; post a user message or tool results first",
            None,
            "nothing_to_answer",
        )


# ---------------------------------------------------------------------------------------------
# Output


def attachment_url(thread_id: str, blob_hash: str) -> str:
    return f"/v1/threads/{thread_id}/attachments/{blob_hash}"


def _part_object(thread_id: str, part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") in ("image", "file") and "attachment_id" in part:
        return {**part, "url": attachment_url(thread_id, part["attachment_id"])}
    return dict(part)


def message_object(m: MessageRecord) -> dict[str, Any]:
    return {
        "id": m.id,
        "object": "thread.message",
        "thread_id": m.thread_id,
        "created_at": int(m.created_at),
        "role": m.role,
        "content": [_part_object(m.thread_id, p) for p in m.content],
        "tool_calls": m.tool_calls,
        "tool_call_id": m.tool_call_id,
        "reasoning": m.reasoning,
        "reasoning_carrier": m.reasoning_carrier,
        "refusal": m.refusal,
        "finish_reason": m.finish_reason,
        "model": m.model,
        "usage": m.usage,
    }


def thread_object(t: ThreadRecord) -> dict[str, Any]:
    return {
        "id": t.id,
        "object": "thread",
        "created_at": int(t.created_at),
        "updated_at": int(t.updated_at),
        "model": t.model,
        "system": t.system,
        "metadata": t.metadata,
        "busy": t.busy,
        "message_count": t.message_count,
        "attachment_bytes": t.attachment_bytes,
    }


# ---------------------------------------------------------------------------------------------
# Upstream


def blob_hashes(messages: Sequence[MessageRecord]) -> list[str]:
    return [
        p["attachment_id"]
        for m in messages
        for p in m.content
        if p.get("type") in ("image", "file") and "attachment_id" in p
    ]


def _data_url_of(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def _text_of(parts: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(p["text"] for p in parts if p.get("type") == "text" and p.get("text"))


def upstream_messages(
    thread: ThreadRecord, messages: Sequence[MessageRecord], blobs: Mapping[str, bytes]
) -> list[dict[str, Any]]:
    """The thread as OpenAI client messages, which the wire core then lays out as §2.2 says.

    An assistant turn carries its reasoning under the key the server sent it with; the provider's
    kind decides whether it goes back and under which key. Reasoning that came inline
    (`<think>`) is not sent back (D23)."""
    out: list[dict[str, Any]] = []
    if thread.system:
        out.append({"role": "system", "content": thread.system})
    for m in messages:
        if m.role == "user":
            parts: list[dict[str, Any]] = []
            for p in m.content:
                kind = p.get("type")
                if kind == "text":
                    parts.append({"type": "text", "text": p["text"]})
                elif kind == "image":
                    url = _data_url_of(p["media_type"], blobs[p["attachment_id"]])
                    image: dict[str, Any] = {"url": url}
                    if p.get("detail"):
                        image["detail"] = p["detail"]
                    parts.append({"type": "image_url", "image_url": image})
                elif kind == "file":
                    data = _data_url_of(p["media_type"], blobs[p["attachment_id"]])
                    parts.append(
                        {"type": "file", "file": {"filename": p["filename"], "file_data": data}}
                    )
            out.append({"role": "user", "content": parts})
        elif m.role == "assistant":
            text = _text_of(m.content)
            msg: dict[str, Any] = {"role": "assistant"}
            if not text and m.refusal:
                msg["content"] = [{"type": "refusal", "refusal": m.refusal}]
            else:
                msg["content"] = text
            if m.tool_calls:
                msg["tool_calls"] = m.tool_calls
            if m.reasoning and m.reasoning_carrier in ("reasoning_content", "reasoning"):
                msg[m.reasoning_carrier] = m.reasoning
            out.append(msg)
        elif m.role == "tool":
            out.append(
                {"role": "tool", "tool_call_id": m.tool_call_id, "content": _text_of(m.content)}
            )
    return out
