"""Large base64 data URLs kept out of the JSON round trip (§2.3).

A request with photos is tens of megabytes, nearly all of it base64 inside data URLs. Decoding it
to Python strings and encoding it again for the upstream would hold it three times. Instead the
data of each large data URL is left where it is in the received bytes: the JSON that is decoded
gets a short placeholder in its place (itself valid base64, so the URL still checks), and the
upstream body is sent as the encoded JSON with views of the received bytes spliced back in.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

# A data URL's base64 payload of at least this many characters is kept out of the round trip.
MIN_BLOB = 1 << 16
_INDEX_WIDTH = 4

_DATA_URL = re.compile(
    rb'"data:[A-Za-z0-9.+-]{1,64}/[A-Za-z0-9.+-]{1,64}(?:;[A-Za-z0-9.=+-]{1,64}){0,4};base64,'
    rb"([A-Za-z0-9+/]{%d,}={0,2})\"" % MIN_BLOB
)


@dataclass(slots=True)
class Blobs:
    """The payloads taken out of one request body, and the token their placeholders carry."""

    token: bytes
    views: list[memoryview] = field(default_factory=list)

    def placeholder(self, index: int) -> bytes:
        return self.token + b"%0*d" % (_INDEX_WIDTH, index)

    def splice(self, encoded: bytes) -> list[bytes | memoryview]:
        """The upstream body in pieces: `encoded` with each placeholder's payload put back."""
        if not self.views:
            return [encoded]
        parts: list[bytes | memoryview] = []
        token = self.token
        width = len(token) + _INDEX_WIDTH
        pos = 0
        while True:
            at = encoded.find(token, pos)
            if at < 0:
                break
            index = int(encoded[at + len(token) : at + width])
            parts.append(encoded[pos:at])
            parts.append(self.views[index])
            pos = at + width
        parts.append(encoded[pos:])
        return parts


def _escaped(buf: bytes | bytearray, quote: int) -> bool:
    """Whether the quote at `quote` is escaped (an odd run of backslashes before it)."""
    n = 0
    while quote - n - 1 >= 0 and buf[quote - n - 1] == 0x5C:
        n += 1
    return n % 2 == 1


def extract_blobs(buf: bytes | bytearray, token: bytes) -> tuple[bytes | bytearray, Blobs]:
    """Replace every large data-URL payload in a JSON body with a placeholder.

    `token` must be unpredictable to the client (random bytes, base64-encoded to a multiple of
    4 characters) so that no text of the request can pass for a placeholder.
    """
    blobs = Blobs(token)
    if len(buf) < MIN_BLOB:
        return buf, blobs
    parts: list[bytes] = []
    pos = 0
    view = memoryview(buf)
    for m in _DATA_URL.finditer(buf):
        if _escaped(buf, m.start()):
            continue
        start, end = m.span(1)
        parts.append(bytes(view[pos:start]))
        parts.append(blobs.placeholder(len(blobs.views)))
        blobs.views.append(view[start:end])
        pos = end
    if not blobs.views:
        return buf, blobs
    parts.append(bytes(view[pos:]))
    return b"".join(parts), blobs


def new_token(random_bytes: bytes) -> bytes:
    """A placeholder token from 15 random bytes: 20 base64 characters, no padding."""
    if len(random_bytes) != 15:
        raise ValueError("a token takes 15 random bytes")
    return base64.b64encode(random_bytes)
