"""What a capture keeps of a request's bytes (svir.console.capture): secrets redacted and each
pane bounded, with nothing of the IO around it.

A secret is redacted wherever it appears (as written, and as a JSON string escapes it); a header
that carries a credential by its name is redacted whatever its value. A pane keeps its first
`limit` bytes: a little more is held while it fills (as much as the longest secret), so that a
secret cut by the bound is still whole when it is redacted, and cut after.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

__all__ = [
    "REDACTED",
    "SECRET_HEADERS",
    "Pane",
    "client_credentials",
    "redact",
    "redact_headers",
    "secret_forms",
]

REDACTED: Final = "[redacted]"
_REDACTED_BYTES: Final = REDACTED.encode()
# Headers whose value is a credential, whatever it holds (clients' and upstreams' spellings).
SECRET_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    }
)
# A value shorter than this is not treated as a secret (it would redact ordinary text).
_SHORTEST: Final = 4


def secret_forms(values: Iterable[str | None]) -> tuple[bytes, ...]:
    """Each secret as bytes, as written and as a JSON string escapes it, longest first (so that a
    secret containing another is redacted whole)."""
    forms: set[bytes] = set()
    for value in values:
        if not value or len(value) < _SHORTEST:
            continue
        forms.add(value.encode("utf-8", "surrogateescape"))
        forms.add(json.dumps(value)[1:-1].encode())
    return tuple(sorted(forms, key=len, reverse=True))


def redact(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """`data` with every secret replaced by `[redacted]`."""
    for secret in secrets:
        if secret in data:
            data = data.replace(secret, _REDACTED_BYTES)
    return data


def redact_headers(
    headers: Iterable[tuple[str, str]], secrets: tuple[bytes, ...]
) -> list[list[str]]:
    """`[name, value]` pairs, the value redacted when the name carries a credential or the value
    holds a secret."""
    out: list[list[str]] = []
    for name, value in headers:
        if name.lower() in SECRET_HEADERS:
            out.append([name, REDACTED])
            continue
        raw = value.encode("utf-8", "surrogateescape")
        clean = redact(raw, secrets)
        out.append([name, value if clean is raw else clean.decode("utf-8", "replace")])
    return out


def client_credentials(headers: Iterable[tuple[str, str]]) -> list[str]:
    """The credentials a client's request carries (a bearer token, an API key header), to be
    redacted wherever else they appear in its capture."""
    found: list[str] = []
    for name, raw in headers:
        if name.lower() not in SECRET_HEADERS:
            continue
        value = raw.strip()
        scheme, _, rest = value.partition(" ")
        if rest and scheme.lower() in ("bearer", "basic", "token"):
            found.append(rest.strip())
        found.append(value)
    return found


class Pane:
    """One stream of bytes as a capture keeps it: the first `limit` bytes (see the module doc),
    and how many there were in all."""

    __slots__ = ("_keep", "_parts", "_size", "limit", "total")

    def __init__(self, limit: int, margin: int = 0) -> None:
        self.limit = limit
        self._keep = limit + margin
        self._parts: list[bytes] = []
        self._size = 0
        self.total = 0

    def add(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        self.total += n
        room = self._keep - self._size
        if room <= 0 or not n:
            return
        piece = bytes(data[:room]) if n > room else bytes(data)
        self._parts.append(piece)
        self._size += len(piece)

    def value(self, secrets: tuple[bytes, ...]) -> tuple[bytes, bool]:
        """The bytes kept, secrets redacted, and whether the pane was cut short."""
        data = redact(b"".join(self._parts), secrets)
        truncated = self.total > self.limit or len(data) > self.limit
        return data[: self.limit], truncated
