"""Media types of the images svir handles, recognized from their first bytes (for uploads and
base64 images that come without a type)."""

from __future__ import annotations

from typing import Final

# Magic numbers of the image formats model servers take.
_IMAGE_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_image(data: bytes) -> str | None:
    """The media type of an image from its first bytes: PNG, JPEG, GIF or WebP; else None."""
    for magic, media_type in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
