"""svir's own API keys: what a key is, how its secret is made and kept, and what it may do.

A key's secret (`sk-svir-` and 43 characters of a 256-bit random value) is shown once, when it is
made; the store keeps its SHA-256 only (a hash of that much entropy needs no slow KDF to resist a
guess). Clients send it as `Authorization: Bearer <secret>`. A key is known by its id (`key_…`),
which the ledger, the logs and the admin API use, and shown by a hint (its last four characters).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Final

from svir.keys.limits import Limits

__all__ = [
    "SECRET_PREFIX",
    "KeyRecord",
    "KeySpec",
    "hash_secret",
    "model_allowed",
    "new_key_id",
    "new_secret",
    "parse_budget",
    "parse_duration",
    "parse_expiry",
    "usd_to_micros",
]

SECRET_PREFIX: Final = "sk-svir-"
_ID: Final = re.compile(r"key_[0-9a-f]{16}")


def new_secret() -> str:
    return SECRET_PREFIX + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()


def hash_secret(secret: str | bytes) -> str:
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(raw).hexdigest()


def new_key_id() -> str:
    return "key_" + os.urandom(8).hex()


def is_key_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def usd_to_micros(usd: float) -> int:
    return round(usd * 1_000_000)


def model_allowed(patterns: tuple[str, ...] | None, model: str) -> bool:
    """Whether `model` is among `patterns`: an exact name, a prefix ending in `/` or `*`, or `*`.
    None allows every model."""
    if patterns is None:
        return True
    for pattern in patterns:
        if pattern in ("*", model):
            return True
        if pattern.endswith("*") and model.startswith(pattern[:-1]):
            return True
        if pattern.endswith("/") and model.startswith(pattern):
            return True
    return False


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What a new key may do; checked by `check()`."""

    name: str
    models: tuple[str, ...] | None = None
    limits: Limits = field(default_factory=Limits)
    expires_at: float | None = None

    def check(self, now: float | None = None) -> str | None:
        """Why this spec cannot make a key, or None."""
        if not self.name.strip() or len(self.name) > 200:
            return "name must be 1 to 200 characters"
        if self.models is not None:
            if not self.models:
                return "models must name at least one model (leave it out to allow every model)"
            for m in self.models:
                if not m.strip() or len(m) > 300:
                    return "every models entry must be 1 to 300 characters"
        for name in (
            "rpm",
            "tpm",
            "concurrent",
            "tokens_per_day",
            "tokens_per_month",
            "cost_per_day",
            "cost_per_month",
        ):
            value = self.limits.value(name)
            if value is not None and (isinstance(value, bool) or value < 1):
                return f"{name} must be at least 1"
        if self.expires_at is not None:
            current = time.time() if now is None else now
            if not math.isfinite(self.expires_at) or self.expires_at <= current:
                return "expires must be in the future"
        return None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    name: str
    hint: str
    models: tuple[str, ...] | None
    limits: Limits
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def allows(self, model: str) -> bool:
        return model_allowed(self.models, model)

    def public(self, now: float | None = None) -> dict[str, Any]:
        """The key as the admin API and `svir keys list` show it: never its secret."""
        limits = self.limits
        return {
            "id": self.id,
            "object": "api_key",
            "name": self.name,
            "hint": self.hint,
            "state": self.state(time.time() if now is None else now),
            "models": list(self.models) if self.models is not None else None,
            "limits": {
                "rpm": limits.rpm,
                "tpm": limits.tpm,
                "concurrent": limits.concurrent,
                "tokens_per_day": limits.tokens_per_day,
                "tokens_per_month": limits.tokens_per_month,
                "cost_per_day_usd": _usd(limits.cost_per_day),
                "cost_per_month_usd": _usd(limits.cost_per_month),
            },
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
        }


def _usd(micros: int | None) -> float | None:
    return None if micros is None else micros / 1_000_000


def hint_of(secret: str) -> str:
    return f"{SECRET_PREFIX}…{secret[-4:]}"


# Command-line and admin API spellings


_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `15m`, `12h`, `30d`, `2w` as seconds; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h or 15m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_expiry(text: str, now: float | None = None) -> float:
    """A duration from now (`30d`), a date (`2026-12-31`, midnight UTC), or an ISO 8601 time."""
    current = time.time() if now is None else now
    try:
        return current + parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (30d) nor a date or time (2026-12-31)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


_BUDGET: Final = re.compile(r"\$?\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*/\s*(day|month|d|mo)")


def parse_budget(text: str) -> tuple[float, str]:
    """`100000/day` or `2000000/month` (or `5.50/day` for a cost): (amount, "day" | "month")."""
    match = _BUDGET.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a budget such as 100000/day or 2000000/month")
    period = "day" if match.group(2) in ("day", "d") else "month"
    return float(match.group(1).replace("_", "")), period
