"""The key of the request being served (set by svir.policy.auth, read by the gate and by any
front end that keeps things per caller). Kept light: the CLI imports svir.keys too."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from svir.keys.model import KeyRecord

__all__ = ["current_key", "key_var"]

key_var: contextvars.ContextVar[KeyRecord | None] = contextvars.ContextVar("svir_key", default=None)


def current_key() -> KeyRecord | None:
    """The key of the request being served; None when svir runs without keys (or outside a
    request)."""
    return key_var.get()
