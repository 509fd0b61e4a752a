"""The key of the request being served: what the authenticator (svir.keys.auth) noted on the
request's `svir.asgi.Exchange`, read by the gate (through the call's context), the usage route and
the model lists. Kept light: the CLI imports svir.keys too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from svir.asgi import Scope, exchange

if TYPE_CHECKING:
    from svir.keys.model import KeyRecord

__all__ = ["caller_key"]


def caller_key(scope: Scope) -> KeyRecord | None:
    """The key of the request `scope` is; None when svir runs without keys (or for a caller
    without one: the admin key, this machine while svir runs open)."""
    return exchange(scope).key
