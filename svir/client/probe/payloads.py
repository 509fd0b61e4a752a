"""What the probe sends: its tools, the JSON schema it asks for, the image, the reasoning efforts,
and the groups of checks `--only` picks from.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

__all__ = [
    "GROUPS",
    "LOCKER_SCHEMA",
    "OVERFLOW_WORDS_MAX",
    "OVERFLOW_WORDS_UNKNOWN",
    "REASONING_EFFORTS",
    "TOOLS",
    "tiny_png",
]

REASONING_EFFORTS = ("none", "low", "medium", "high", "xhigh")
# The groups of checks `--only` can pick; the plain request that reports usage always runs.
GROUPS = ("usage", "tools", "json", "reasoning", "image", "overflow")
# A prompt this many words long exceeds any context a server lists; used when it lists none.
OVERFLOW_WORDS_UNKNOWN = 300_000
# The overflow body stays bounded whatever context a server claims (about 3 MB).
OVERFLOW_WORDS_MAX = 1_000_000

LOCKER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "open_locker",
        "description": "Open a locker by its number.",
        "parameters": {
            "type": "object",
            "properties": {"locker": {"type": "integer", "description": "The locker number"}},
            "required": ["locker"],
        },
    },
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
TOOLS = [LOCKER_TOOL, WEATHER_TOOL]
LOCKER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"locker": {"type": "integer"}, "open": {"type": "boolean"}},
    "required": ["locker", "open"],
    "additionalProperties": False,
}


def tiny_png(width: int = 64, height: int = 64, rgb: tuple[int, int, int] = (220, 30, 30)) -> bytes:
    """A solid-colour RGB PNG, made here: no image file or library needed."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )
