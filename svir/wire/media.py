"""Media a client sends inline: data URLs and base64, parsed by one set of rules for every front
end (the chat core's messages, the threads API's attachments, Ollama's images), and the images
svir handles, recognized from their first bytes (for uploads and base64 images that come
without a type).

The rules of a data URL, `data:<media type>[;params][;base64],<data>` (RFC 2397): the media type
is case-insensitive, so it is lowercased, and it must be RFC 6838's `type/subtype` in token
characters (it goes into a stored record and an HTTP header as it is); it may be left out; the
data is base64 when the last parameter is `base64`, percent-encoded otherwise. Base64 is strict
(RFC 4648: no characters outside the alphabet, correct padding).
"""

from __future__ import annotations

import binascii
import re
from typing import Final, NamedTuple

from svir.wire.errors import BodyError
from svir.wire.jsonbody import shown

__all__ = ["DataURL", "decode_base64", "is_media_type", "sniff_image", "split_data_url"]

# type/subtype in RFC 6838's characters: what may go into a header and a data URL unescaped.
_TOKEN: Final = r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE: Final = re.compile(f"{_TOKEN}/{_TOKEN}")

# Magic numbers of the image formats model servers take.
_IMAGE_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


class DataURL(NamedTuple):
    """A data URL's parts: its media type (lowercase, "" when left out), whether its data is
    base64, and the data as written."""

    media_type: str
    is_base64: bool
    data: str


def is_media_type(value: str) -> bool:
    """Whether a lowercase `value` is a `type/subtype` that may go into a header unescaped."""
    return _MEDIA_TYPE.fullmatch(value) is not None


def split_data_url(where: str, url: str) -> DataURL:
    """Split a `data:` URL (the caller checked the scheme); raises BodyError naming `where`."""
    header, comma, data = url[5:].partition(",")
    if not comma:
        raise BodyError(f"{where}: a data URL needs a comma before its data")
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if media_type and not is_media_type(media_type):
        raise BodyError(f"{where}: {shown(media_type)} is not a media type")
    return DataURL(media_type, params[-1].lower() == "base64", data)


def decode_base64(where: str, data: str) -> bytes:
    """Strict base64; raises BodyError naming `where`."""
    try:
        return binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise BodyError(f"{where}: the data is not valid base64 ({exc})") from None


def sniff_image(data: bytes) -> str | None:
    """The media type of an image from its first bytes: PNG, JPEG, GIF or WebP; else None."""
    for magic, media_type in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
