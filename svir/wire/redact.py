"""Credentials out of what an upstream said: a bearer token, an `sk-` key or a known secret in a
text, a password in a URL, and every string an `UpstreamError` carries. Some servers quote the
credential they refused or were sent; neither a log nor a client may see one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from svir.wire.errors import UpstreamError

__all__ = ["redact", "redact_error", "redact_url"]

_REDACTED = "[redacted]"
# A credential after "Bearer": RFC 6750's b64token characters. A placeholder such as svir's own
# `Bearer <key>` is not made of them, and words ("a Bearer token") are not credentials: a token
# counts when it has a digit and 8 characters, or 20 characters whatever they are.
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9\-._~+/]+=*)")
# A key, or the masked key a server quotes back ("sk-proj-****abcd"): neither is shown.
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-*]{8,}")
# How much of an error's details is read for secrets: anything deeper or past the count is
# dropped, not shown unread.
_DETAILS_DEPTH = 8
_DETAILS_ITEMS = 256


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` with each of `secrets` and anything shaped like a credential (a bearer token, an
    `sk-` key) replaced by `[redacted]`: some servers quote the credential they refused or were
    sent, and neither a log nor a client may see one."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, _REDACTED)
    return _BEARER.sub(_bearer_token, _SK_KEY.sub(_REDACTED, text))


def redact_url(url: str, mask: str = "***") -> str:
    """`url` with its password (a store's, Redis's) replaced by `mask`; a text that does not
    parse as a URL is `mask` whole; other text as it is."""
    if "://" not in url or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return mask
    if password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{mask}@{host}"))


def _bearer_token(match: re.Match[str]) -> str:
    token = match.group(2)
    secret = len(token) >= 20 or (len(token) >= 8 and any(ch.isdigit() for ch in token))
    return match.group(1) + _REDACTED if secret else match.group(0)


def redact_error(err: UpstreamError, secrets: Sequence[str] = ()) -> UpstreamError:
    """`err` with every string it carries (message, code, type, param, and its details, nested up
    to a bound) passed through `redact`; `err` itself when nothing had to go.

    The one scrub of an upstream's words: what comes out may go to the client, a log line, the
    ledger, a metric or a trace.
    """
    message = redact(err.message, secrets)
    code = redact(err.code, secrets) if isinstance(err.code, str) else err.code
    type_ = redact(err.type, secrets) if err.type is not None else None
    param = redact(err.param, secrets) if err.param is not None else None
    budget = [_DETAILS_ITEMS]
    details = _redact_value(err.details, secrets, _DETAILS_DEPTH, budget)
    if (message, code, type_, param) == (err.message, err.code, err.type, err.param) and (
        details is err.details
    ):
        return err
    # A field redacted to None was None before: `replaced` keeps it so.
    return err.replaced(
        message=message,
        code=code,
        type=type_,
        param=param,
        details=details if isinstance(details, dict) else {},
    )


def _redact_value(value: Any, secrets: Sequence[str], depth: int, budget: list[int]) -> Any:
    """`value` (JSON-like) redacted; the same object when nothing changed. Containers past the
    depth and items past the budget are left out."""
    if isinstance(value, str):
        text = redact(value, secrets)
        return value if text == value else text
    if not isinstance(value, dict | list | tuple):
        return value  # numbers, None, and svir's own objects (a ClientError) say no secret
    if depth <= 0:
        return type(value)()
    changed = False
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            budget[0] -= 1
            if budget[0] < 0:
                changed = True
                break
            new_key = redact(key, secrets) if isinstance(key, str) else key
            new = _redact_value(item, secrets, depth - 1, budget)
            changed = changed or new_key is not key or new is not item
            out[new_key] = new
        return out if changed else value
    items: list[Any] = []
    for item in value:
        budget[0] -= 1
        if budget[0] < 0:
            changed = True
            break
        new = _redact_value(item, secrets, depth - 1, budget)
        changed = changed or new is not item
        items.append(new)
    if not changed:
        return value
    return items if isinstance(value, list) else tuple(items)
