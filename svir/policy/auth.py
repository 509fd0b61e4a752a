"""Who is calling: `Authorization: Bearer <svir key>`, or `x-api-key: <svir key>` (how Anthropic's
clients send theirs), checked before any route runs.

With no keys issued svir runs open, for clients on this machine only (unless
`[auth] allow_open_non_loopback`). Once a key exists every request needs one, except the health
check, the metrics (which take the admin key or the metrics token: svir.edges.keys_service) and the
admin API under `/admin/` (whose rule, `admin_check`, svir.edges.keys_service gives; its verdict is
noted on the request's `svir.asgi.Exchange`, `admin_access`). The key of the request being served
is noted there too (`svir.asgi.caller_key(scope)`), for the call's context (the limits, the
ledger), and any front end that keeps things per caller (threads).

svir's admin key is also taken where a svir key is (the console's playground): its caller has no
key, so no limits, and the ledger's `key_id` stays null for it; it also passes where svir, open,
serves this machine only.

svir's own refusal is 401 `invalid_api_key`; a model server refusing svir's credentials is 502
`upstream_auth_error` (svir.wire.classify), so a client is never sent to fix the wrong key.
Lookups are cached for `[auth] cache_seconds`: a revocation reaches every replica within that.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from svir.asgi import Scope, exchange, header
from svir.errors import GatewayError, auth_error
from svir.keys.model import KeyRecord
from svir.wire.origins import is_loopback

__all__ = [
    "ADMIN_PREFIX",
    "Authenticator",
    "api_key",
    "bearer_token",
    "is_loopback",
]

_CACHE_CAP: Final = 10_000
# Every path under it is the admin API: `Authenticator.admin_check` decides who may use it.
ADMIN_PREFIX: Final = "/admin/"
# The health check's path: open without a key (`Authenticator.health_check` may still refuse).
HEALTH_PATH: Final = "/healthz"


class KeyLookup(Protocol):
    """What the authenticator asks of the key store (svir.store.keys.KeyStore is one)."""

    async def configured(self) -> bool: ...

    async def by_hash(self, digest: str) -> KeyRecord | None: ...


def bearer_token(scope: Scope) -> bytes | None:
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    return token or None


def api_key(scope: Scope) -> bytes | None:
    """The caller's key: the bearer token, else `x-api-key` (Anthropic's header)."""
    token = bearer_token(scope)
    if token is not None:
        return token
    value = header(scope, b"x-api-key")
    return value.strip() or None if value is not None else None


After = Callable[[dict[str, Any]], None]


class Authenticator:
    def __init__(
        self,
        *,
        cache_seconds: float = 5.0,
        allow_open: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.keys: KeyLookup | None = None
        self.cache_seconds = cache_seconds
        self.allow_open = allow_open
        self.clock = clock
        self.wall = wall
        self.exempt_paths: set[str] = {HEALTH_PATH}
        self.exempt_prefixes: tuple[str, ...] = ()
        # svir's admin key: also a caller of the API, without a key (see the module doc).
        self.admin_key: bytes | None = None
        # Who may use a path under ADMIN_PREFIX: the verdict, or GatewayError. None: such paths
        # are like any other.
        self.admin_check: Callable[[Scope], Awaitable[str]] | None = None
        # Run for the health check (exempt from keys), which may refuse it (GatewayError):
        # svir.edges.keys_service guards `/healthz?verbose=1` with it. Part of this guard rather
        # than a guard of its own, which every request would await.
        self.health_check: Callable[[Scope], Awaitable[None]] | None = None
        self._cache: dict[str, tuple[KeyRecord | None, float]] = {}
        self._configured: tuple[bool, float] | None = None
        self._checking: asyncio.Future[bool] | None = None

    def forget(self) -> None:
        """Drop what is cached (after this process made or revoked a key)."""
        self._cache.clear()
        self._configured = None

    def configured_cached(self) -> bool | None:
        """Whether any key is issued, while the cached answer is fresh; None when the store must
        be asked (`configured`). Every request asks: a fresh answer costs it no await."""
        known = self._configured
        if known is not None and self.clock() - known[1] < self.cache_seconds:
            return known[0]
        return None

    async def configured(self) -> bool:
        """Whether any key is issued (cached; one store query at a time)."""
        cached = self.configured_cached()
        if cached is not None:
            return cached
        if self._checking is None:
            self._checking = asyncio.ensure_future(self._check_configured())
        checking = self._checking
        try:
            return await asyncio.shield(checking)
        finally:
            if checking.done() and self._checking is checking:
                self._checking = None

    async def _check_configured(self) -> bool:
        if self.keys is None:
            raise RuntimeError("the key store is not open")
        value = await self.keys.configured()
        self._configured = (value, self.clock())
        return value

    async def lookup(self, token: bytes) -> KeyRecord | None:
        digest = hashlib.sha256(token).hexdigest()
        now = self.clock()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[1] < self.cache_seconds:
            return cached[0]
        if self.keys is None:
            raise RuntimeError("the key store is not open")
        record = await self.keys.by_hash(digest)
        if len(self._cache) >= _CACHE_CAP:
            self._cache.clear()
        self._cache[digest] = (record, now)
        return record

    def check_unkeyed(self, scope: Scope) -> None:
        """Who a svir without keys serves: this machine only, unless `allow_open`."""
        if self.allow_open:
            return
        client = scope.get("client")
        if client is None or is_loopback(client[0]):
            return
        raise auth_error(
            "svir has no API keys and so serves this machine only: issue a key with"
            " `svir keys create`, or set [auth] allow_open_non_loopback.",
            status=403,
            code="loopback_only",
        )

    def is_admin(self, token: bytes | None) -> bool:
        """Whether `token` is svir's admin key."""
        admin = self.admin_key
        return admin is not None and token is not None and hmac.compare_digest(token, admin)

    async def guard(self, scope: Scope, fields: dict[str, Any]) -> After | None:
        """App guard: set the request's key, or refuse the request."""
        path: str = scope["path"]
        if path.startswith(ADMIN_PREFIX) and self.admin_check is not None:
            exchange(scope).admin_access = await self.admin_check(scope)
            return None
        if path in self.exempt_paths or path.startswith(self.exempt_prefixes):
            if path == HEALTH_PATH and self.health_check is not None:
                await self.health_check(scope)
            return None
        if self.keys is None:
            raise auth_error("svir is starting.", status=503, code="starting")
        configured = self.configured_cached()
        if configured is None:
            configured = await self.configured()
        if not configured:
            try:
                self.check_unkeyed(scope)
            except GatewayError:
                # Refused for where it comes from: the admin key still passes.
                if not self.is_admin(api_key(scope)):
                    raise
                fields["caller"] = "admin"
            return None
        token = api_key(scope)
        if token is None:
            raise auth_error(
                "Missing API key: send it as 'Authorization: Bearer <key>' (a key svir issued)."
            )
        record = await self.lookup(token)
        if record is None:
            # Checked only once no key matched: a key's requests pay nothing for it.
            if self.is_admin(token):
                fields["caller"] = "admin"
                return None
            raise auth_error("Invalid API key: svir issued no such key.")
        state = record.state(self.wall())
        if state != "active":
            raise auth_error(f"This API key is {state}.")
        fields["key_id"] = record.id
        exchange(scope).key = record
        return None
