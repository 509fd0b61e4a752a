"""`/attach FILE`: an image or a text file read from disk into a user message's content parts.

Images go inline as data URLs whose media type comes from the bytes, not the file name (§2.2).
Text files go as OpenAI `file` parts; svir puts them in the message as `<file name="...">` blocks
for the model (§2.2), since local servers take files no other way.
"""

from __future__ import annotations

import base64
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from svir.errors import SvirError
from svir.wire.media import sniff_image

__all__ = [
    "MAX_ATTACHMENT_BYTES",
    "AttachError",
    "Attachment",
    "load",
    "sniff_image",
    "user_content",
]

# svir's default limit for one attachment of a thread (store.max_attachment_bytes).
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024


class AttachError(SvirError):
    """A file that cannot be attached, and why."""


@dataclass(frozen=True)
class Attachment:
    name: str
    kind: str  # "image" or "file"
    media_type: str
    size: int
    part: dict[str, Any]

    def describe(self) -> str:
        return f"{self.name} ({self.media_type}, {_size(self.size)})"


def load(path: str | Path, *, limit: int = MAX_ATTACHMENT_BYTES) -> Attachment:
    """Read `path` as an image (by its content) or a UTF-8 text file; AttachError otherwise."""
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise AttachError(f"{path}: not a file")
        if size > limit:
            raise AttachError(f"{path}: {_size(size)} is over the limit of {_size(limit)}")
        data = p.read_bytes()
    except OSError as exc:
        raise AttachError(f"{path}: {exc.strerror or exc}") from None
    if not data:
        raise AttachError(f"{path}: the file is empty")
    name = p.name
    image_type = sniff_image(data)
    if image_type is not None:
        url = f"data:{image_type};base64,{base64.b64encode(data).decode('ascii')}"
        part = {"type": "image_url", "image_url": {"url": url}}
        return Attachment(name, "image", image_type, len(data), part)
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise AttachError(
            f"{path}: neither an image (PNG, JPEG, GIF, WebP) nor UTF-8 text"
        ) from None
    guessed, _ = mimetypes.guess_type(name)
    media_type = guessed if guessed and guessed.startswith("text/") else "text/plain"
    file_data = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
    part = {"type": "file", "file": {"filename": name, "file_data": file_data}}
    return Attachment(name, "file", media_type, len(data), part)


def user_content(text: str, attachments: list[Attachment]) -> str | list[dict[str, Any]]:
    """A user message's content: plain text alone, else one text part and then the attachments
    (no empty text part, §2.2)."""
    if not attachments:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.extend(a.part for a in attachments)
    return parts


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} kB"
    return f"{n / (1024 * 1024):.1f} MB"
