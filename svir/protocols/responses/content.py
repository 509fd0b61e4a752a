"""The content of a Responses message and of a tool's output as canonical content parts.

User content takes `input_text`, `input_image` (by data URL or http(s) URL) and `input_file`
(with `file_data`, as svir's file block); assistant content `output_text` and `refusal` (a
refusal sent back is simply what the model said); system and developer content text only. Each
is given back with the item's parts as the item lists them.
"""

from __future__ import annotations

from typing import Any, Final

from svir.protocols.responses.checks import ResponsesRequestError, check
from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown
from svir.wire.request import file_text

__all__ = ["InputParts", "assistant_content", "part_list", "system_content"]

_IMAGE_DETAILS: Final = frozenset({"auto", "low", "high"})


def system_content(where: str, content: Any) -> tuple[str, list[dict[str, Any]]]:
    """A system or developer message's content: its text, and its parts."""
    if isinstance(content, str):
        return content, [{"type": "input_text", "text": content}]
    parts = part_list(where, content)
    texts = []
    for j, part in enumerate(parts):
        here = f"{where}[{j}]"
        kind = check.tagged(here, part)
        if kind not in ("input_text", "text"):
            raise ResponsesRequestError(
                f"{here}.type", f"a system or developer message takes no {shown(kind)} part"
            )
        texts.append(check.string(f"{here}.text", part.get("text")))
    return "\n".join(t for t in texts if t), [dict(p) for p in parts]


def assistant_content(where: str, content: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """An assistant message's content: its texts, and its parts."""
    if isinstance(content, str):
        return [content], [{"type": "output_text", "text": content, "annotations": []}]
    parts = part_list(where, content)
    texts = []
    for j, part in enumerate(parts):
        here = f"{where}[{j}]"
        kind = check.tagged(here, part)
        if kind in ("output_text", "input_text", "text"):
            texts.append(check.string(f"{here}.text", part.get("text")))
        elif kind == "refusal":
            # A refusal sent back is simply what the model said.
            texts.append(check.string(f"{here}.refusal", part.get("refusal")))
        else:
            raise ResponsesRequestError(
                f"{here}.type", f"an assistant message takes no {shown(kind)} part"
            )
    return texts, [dict(p) for p in parts]


class InputParts:
    """Reads user content and tool output parts, noting whether an image came by URL
    (`image_urls`: not every upstream fetches one)."""

    __slots__ = ("image_urls",)

    def __init__(self) -> None:
        self.image_urls = False

    def user_content(
        self, where: str, content: Any
    ) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
        """A user message's content: a string, or canonical parts when it holds more than text;
        and its parts."""
        if isinstance(content, str):
            return content, [{"type": "input_text", "text": content}]
        parts = part_list(where, content)
        chat_parts: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            chat_parts.append(self.input_part(f"{where}[{j}]", part))
        if all(p["type"] == "text" for p in chat_parts):
            return "\n".join(p["text"] for p in chat_parts if p["text"]), [dict(p) for p in parts]
        return chat_parts, [dict(p) for p in parts]

    def input_part(self, here: str, part: Any) -> dict[str, Any]:
        """An input_text, input_image or input_file part as a canonical content part."""
        kind = check.tagged(here, part)
        if kind in ("input_text", "text", "output_text"):
            return {"type": "text", "text": check.string(f"{here}.text", part.get("text"))}
        if kind == "input_image":
            return self.image(here, part)
        if kind == "input_file":
            return {"type": "text", "text": _file_text(here, part)}
        raise ResponsesRequestError(f"{here}.type", f"unsupported content part type {shown(kind)}")

    def image(self, here: str, part: dict[str, Any]) -> dict[str, Any]:
        url = part.get("image_url")
        if url is None:
            if part.get("file_id") is not None:
                raise ResponsesRequestError(
                    f"{here}.file_id", "uploaded files are not supported; send image_url"
                )
            raise ResponsesRequestError(f"{here}.image_url", "is required")
        url = check.string(f"{here}.image_url", url)
        head = url[:8].lower()
        if head.startswith(("http://", "https://")):
            self.image_urls = True
        elif not head.startswith("data:"):
            raise ResponsesRequestError(f"{here}.image_url", "must be an http(s) URL or a data URL")
        # The data URL itself is checked (strict base64) where the upstream body is built.
        image: dict[str, Any] = {"url": url}
        detail = part.get("detail")
        if detail is not None and check.string(f"{here}.detail", detail) in _IMAGE_DETAILS:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}


def part_list(where: str, content: Any) -> list[Any]:
    """`content` as an array of parts, or the mistake it is."""
    if not isinstance(content, list):
        raise ResponsesRequestError(
            where, f"must be a string or an array of parts, not {json_type(content)}"
        )
    return content


def _file_text(here: str, part: dict[str, Any]) -> str:
    """An `input_file` part as svir's file block: only `file_data` is taken."""
    if part.get("file_data") is None:
        if part.get("file_url") is not None:
            raise ResponsesRequestError(
                f"{here}.file_url", "files by URL are not supported; send file_data"
            )
        if part.get("file_id") is not None:
            raise ResponsesRequestError(
                f"{here}.file_id", "uploaded files are not supported; send file_data"
            )
    try:
        return file_text(here, part)
    except ResponsesRequestError:
        raise
    except BodyError as exc:
        raise ResponsesRequestError(here, str(exc)) from None
