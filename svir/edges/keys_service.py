"""Keys, limits, the usage ledger, metrics and tracing, installed on an App (`install`).

Routes: the admin API under `/admin/` (every path under it guarded by one rule, `admin_access`),
`GET /v1/usage` (a key's own figures), `GET /metrics` (once keys exist, for the admin key or the
metrics token `[auth] metrics_token_env`, unless `[auth] metrics_public`). Guards, in order:
tracing (when on), authentication (which also guards `/healthz?verbose=1`). The gateway gets
the gate (svir.policy.key_gate) around every chat call. The traces, the metrics and the ledger are
observers (svir.observers: `KeysService.observers()`, which the app's builder composes): the
metrics count each request when it ends, and what each call came to (its
`svir.call.CallRecord`) goes from the gate to the ledger and the metrics.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
import math
import time
from typing import Any, Final

from svir.asgi import Receive, Scope, Send, caller_key, exchange
from svir.edges.app import VERBOSE, App
from svir.edges.metrics import CONTENT_TYPE, Counter, Gauge, Metrics
from svir.errors import (
    GatewayError,
    LimitsUnavailable,
    auth_error,
    request_error,
)
from svir.keys.limits import LIMIT_NAMES, Backend, Figures, Limits, MemoryBackend
from svir.keys.model import KeyRecord, KeySpec, is_key_id, parse_expiry, usd_to_micros
from svir.ledger import Ledger
from svir.ledger.queries import ALL_KEYS, GROUPS, summarize
from svir.observers import CallSettled, Observer
from svir.policy.auth import Authenticator, bearer_token, is_loopback
from svir.policy.key_gate import Gate
from svir.protocols.http import query_params, read_json, send_json
from svir.protocols.router import Handler
from svir.store import make_store, store_url
from svir.store.base import SqlStore
from svir.store.keys import KeyStore
from svir.wire.classify import ClientError

__all__ = ["KeysService", "admin_access", "install", "parse_since"]

log = logging.getLogger("svir.keys")
_MAX_ADMIN_BODY: Final = 64 * 1024
_INT_FIELDS: Final = ("rpm", "tpm", "concurrent", "tokens_per_day", "tokens_per_month")
_COST_FIELDS: Final = ("cost_per_day", "cost_per_month")
_CREATE_FIELDS: Final = frozenset(
    {"name", "models", "expires_at", "expires", *_INT_FIELDS, *_COST_FIELDS}
)


def parse_since(text: str | None, now: float, default: float) -> float:
    """`24h`, `7d` (back from now), a date, an ISO time, or Unix seconds."""
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        pass
    from svir.keys.model import parse_duration

    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    moment = datetime.datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def admin_access(scope: Scope) -> str:
    """Who is using an admin route: "admin_key" (the request carries svir's admin key) or
    "loopback" (no admin key is set, no key is issued, and the client is on this machine).

    The rule (`KeysService.check_admin`) runs before any route under `/admin/`: a request it
    refuses never reaches one. A route calls this for the verdict; outside `/admin/`, or in an
    app without svir.edges.keys_service, there is none, and the request is refused.
    """
    access = exchange(scope).admin_access
    if access is None:
        raise auth_error("This needs svir's admin key.", status=403, code="admin_disabled")
    return access


def start_of_day(now: float) -> float:
    return math.floor(now / 86400) * 86400.0


def spec_from_json(body: Any) -> KeySpec:
    """A KeySpec from the admin API's JSON; ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    name = body.get("name")
    if not isinstance(name, str):
        raise ValueError("name is required (a string)")
    models = body.get("models")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) for m in models)
    ):
        raise ValueError("models must be a list of model names or prefixes")
    values: dict[str, int | None] = {}
    for field in _INT_FIELDS:
        value = body.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{field} must be a whole number")
        values[field] = value
    for field in _COST_FIELDS:
        value = body.get(field)
        if value is not None and (
            not isinstance(value, int | float) or isinstance(value, bool) or not value > 0
        ):
            raise ValueError(f"{field} must be a positive number of USD")
        values[field] = usd_to_micros(value) if value is not None else None
    expires_at: float | None = None
    if body.get("expires_at") is not None:
        raw = body["expires_at"]
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            raise ValueError("expires_at must be Unix seconds")
        expires_at = float(raw)
    elif body.get("expires") is not None:
        if not isinstance(body["expires"], str):
            raise ValueError("expires must be a duration (30d) or a date (2026-12-31)")
        expires_at = parse_expiry(body["expires"])
    spec = KeySpec(
        name=name,
        models=tuple(models) if models is not None else None,
        limits=Limits(**values),
        expires_at=expires_at,
    )
    problem = spec.check()
    if problem is not None:
        raise ValueError(problem)
    return spec


def limits_view(limits: Limits, figures: Figures) -> dict[str, Any]:
    """Each limit the key has: its value, what is used, and what is left."""
    out: dict[str, Any] = {}
    for name in LIMIT_NAMES:
        value = limits.value(name)
        if value is None:
            continue
        used = figures.used.get(name, 0.0)
        entry: dict[str, Any] = {"limit": value, "used": round(used, 2)}
        entry["remaining"] = round(max(0.0, value - used), 2)
        if name.startswith("cost_"):
            entry = {f"{k}_usd": v / 1_000_000 for k, v in entry.items()}
        out[name] = entry
    return out


class KeysService:
    def __init__(
        self,
        app: App,
        *,
        backend: Backend | None = None,
        span_exporter: Any = None,
    ) -> None:
        config = app.config
        environ = app.environ
        self.app = app
        self.config = config
        self.auth = Authenticator(
            cache_seconds=config.auth.cache_seconds,
            allow_open=config.auth.allow_open_non_loopback,
        )
        self.auth.exempt_paths.add("/metrics")
        self.admin_key = config.auth.admin_key(environ)
        self.auth.admin_key = self.admin_key.encode() if self.admin_key is not None else None
        self.auth.admin_check = self.check_admin
        self.auth.health_check = self.check_verbose_health
        self.metrics_token = config.auth.metrics_token(environ)
        self.metrics = Metrics() if config.telemetry.metrics else None
        self.tracing: Any = None
        if config.telemetry.otel:
            from svir.edges.tracing import Tracing

            self.tracing = Tracing(
                config.telemetry, environ, exporter=span_exporter, batch=span_exporter is None
            )
        limits = config.limits
        if backend is None:
            if limits.backend == "redis":
                from svir.keys.limits_redis import RedisBackend

                backend = RedisBackend(
                    limits.redis_url, prefix=limits.redis_prefix, lease_seconds=limits.lease_seconds
                )
            else:
                backend = MemoryBackend(lease_seconds=limits.lease_seconds)
        self.backend = backend
        self.store: SqlStore | None = None
        self.keys: KeyStore | None = None
        self.ledger: Ledger | None = None
        self.gate = Gate(
            backend=backend,
            limits=limits,
            prices=config.prices,
            observers=app.gateway.observers,
        )

    def observers(self) -> list[Observer]:
        """What of this service watches requests and calls (svir.observers), in the order they
        are told: the traces, the metrics, the ledger (those that are on)."""
        out: list[Observer] = []
        if self.tracing is not None:
            out.append(self.tracing)
        if self.metrics is not None:
            out.append(self.metrics)
        if self.config.ledger.enabled:
            out.append(_LedgerRows(self))
        return out

    # Lifespan

    async def startup(self) -> None:
        url = store_url(self.config, self.app.environ)
        store = make_store(url)
        if not isinstance(store, SqlStore):
            raise RuntimeError("svir's keys need an SQL store")
        await store.open()
        self.store = store
        try:
            await self.backend.start()
        except LimitsUnavailable:
            await store.close()
            self.store = None
            raise
        self.keys = KeyStore(store)
        self.auth.keys = self.keys
        ledger = self.config.ledger
        if ledger.enabled:
            self.ledger = Ledger(
                store, flush_seconds=ledger.flush_seconds, max_pending=ledger.max_pending
            )
            await self.ledger.start()
        log.info(
            "keys and limits ready",
            extra={
                "fields": {
                    "keys": await self.keys.configured(),
                    "limits": self.config.limits.backend,
                    "ledger": ledger.enabled,
                    "otel": self.tracing is not None,
                }
            },
        )

    async def shutdown(self) -> None:
        await self.gate.drain()
        if self.ledger is not None:
            await self.ledger.close()
        await self.backend.close()
        if self.store is not None:
            store, self.store = self.store, None
            self.auth.keys = None
            await store.close()
        if self.tracing is not None:
            await self.tracing.close()

    def _ledger_metrics(self) -> list[Any]:
        ledger = self.ledger
        written = Counter("svir_ledger_rows_written_total", "Ledger rows written to the store.")
        dropped = Counter(
            "svir_ledger_rows_dropped_total", "Ledger rows dropped (the queue was full)."
        )
        pending = Gauge("svir_ledger_rows_pending", "Ledger rows waiting to be written.")
        if ledger is not None:
            written.inc((), ledger.written)
            dropped.inc((), ledger.dropped)
            pending.set((), len(ledger.pending))
        return [written, dropped, pending]

    # GET /metrics

    async def serve_metrics(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        await self._check_metrics(scope)  # a refusal is answered by the app's one error mapper
        assert self.metrics is not None
        body = self.metrics.render()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE.encode()),
                    (b"x-request-id", rid.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return 200

    async def _check_metrics(self, scope: Scope, what: str = "GET /metrics") -> None:
        """Who may read the operator's views (`/metrics`, `/healthz?verbose=1`): anyone with
        `[auth] metrics_public`; once keys exist (or with `metrics_need_admin`), the holder of the
        admin key or of the metrics token; with no keys, whom svir serves then (this machine,
        unless `allow_open_non_loopback`)."""
        auth = self.config.auth
        if auth.metrics_public:
            return
        if not auth.metrics_need_admin:
            if self.auth.keys is None:
                raise auth_error("svir is starting.", status=503, code="starting")
            if not await self.auth.configured():
                self.auth.check_unkeyed(scope)
                return
        tokens = [t.encode() for t in (self.admin_key, self.metrics_token) if t is not None]
        if not tokens:
            raise auth_error(
                f"{what} takes the admin key or the metrics token, and neither is set: set"
                f" the environment variable {auth.metrics_token_env} (or"
                f" {auth.admin_key_env}), or open it to anyone with [auth] metrics_public = true.",
                status=403,
                code="metrics_locked",
            )
        token = bearer_token(scope)
        if token is None or not any(hmac.compare_digest(token, t) for t in tokens):
            raise auth_error(
                f"{what} needs the metrics token (the environment variable"
                f" {auth.metrics_token_env}) or svir's admin key, sent as"
                " 'Authorization: Bearer <token>'.",
                code="invalid_metrics_token",
            )

    async def check_verbose_health(self, scope: Scope) -> None:
        """`/healthz?verbose=1` shows what only the operator may see (deployments, pids, managed
        models' log files): it takes what `/metrics` takes. Plain `/healthz` stays open. Run by
        the authenticator's guard for `/healthz` (`Authenticator.health_check`)."""
        if VERBOSE in scope.get("query_string", b"").split(b"&"):
            await self._check_metrics(scope, "GET /healthz?verbose=1")

    # GET /v1/usage

    async def usage(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        headers = {"x-request-id": rid}
        key = caller_key(scope)
        query = query_params(scope)
        now = time.time()
        try:
            since = parse_since(query.get("since"), now, start_of_day(now))
        except ValueError:
            raise request_error(
                "since must be like 24h, 7d, 2026-01-31 or Unix seconds", param="since"
            ) from None
        body: dict[str, Any] = {
            "object": "usage",
            "key": _key_view(key),
            "since": since,
            "until": now,
        }
        if key is not None:
            try:
                figures = await self.backend.figures(key.id, key.limits)
            except LimitsUnavailable:
                figures = Figures()
            body["limits"] = limits_view(key.limits, figures)
        else:
            body["limits"] = {}
        if self.ledger is not None and self.store is not None:
            await self.ledger.flush()
            who: str | None = key.id if key is not None else None
            totals = await summarize(self.store, since=since, key=who, by=())
            body["totals"] = totals[0] if totals else None
            body["by_model"] = await summarize(self.store, since=since, key=who, by=("model",))
        else:
            body["totals"] = None
            body["by_model"] = []
        await send_json(send, 200, body, headers)
        return 200

    # /admin/

    async def check_admin(self, scope: Scope) -> str:
        """Who may use the admin API (what `admin_access` returns), else GatewayError:
        - with an admin key set (`[auth] admin_key_env`), its holder only, from anywhere: the
          key as `Authorization: Bearer <admin key>` (401 `invalid_admin_key`);
        - without one, while no key is issued, clients on this machine (403 `loopback_only`
          otherwise, whatever `allow_open_non_loopback` says: it opens the API, not its admin);
        - without one once keys exist, nobody (403 `admin_disabled`).
        No cookie is read: a page sends the key as a header, so there is no CSRF to guard."""
        env = self.config.auth.admin_key_env
        if self.admin_key is not None:
            token = bearer_token(scope)
            if token is None or not hmac.compare_digest(token, self.admin_key.encode()):
                raise auth_error(
                    "This needs svir's admin key (the environment variable"
                    f" {env}), sent as 'Authorization: Bearer <admin key>'.",
                    code="invalid_admin_key",
                )
            return "admin_key"
        if self.auth.keys is None:
            raise auth_error("svir is starting.", status=503, code="starting")
        if await self.auth.configured():
            raise auth_error(
                "The admin API is off: keys are issued and no admin key is set. Set the"
                f" environment variable {env} to an admin key of your choosing.",
                status=403,
                code="admin_disabled",
            )
        client = scope.get("client")
        if client is None or is_loopback(client[0]):
            return "loopback"
        raise auth_error(
            "Without an admin key, the admin API answers this machine only: set the"
            f" environment variable {env} to an admin key of your choosing to use it from"
            " elsewhere.",
            status=403,
            code="loopback_only",
        )

    def _admin_keys(self, scope: Scope) -> KeyStore:
        """The key store, for an admin request once svir has started."""
        admin_access(scope)
        keys = self.keys
        if keys is None or self.store is None:
            raise GatewayError(ClientError(503, "server_error", "starting", "svir is starting."))
        return keys

    def admin_routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/admin/keys", self.create_key),
            ("GET", "/admin/keys", self.list_keys),
            ("GET", "/admin/keys/{key_id}", self.get_key),
            ("DELETE", "/admin/keys/{key_id}", self.revoke_key),
            ("POST", "/admin/keys/{key_id}/revoke", self.revoke_key),
            ("GET", "/admin/usage", self.admin_usage),
        ]

    async def create_key(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        keys = self._admin_keys(scope)
        body = await read_json(scope, receive, _MAX_ADMIN_BODY, empty={})
        try:
            spec = spec_from_json(body)
        except ValueError as exc:
            raise request_error(str(exc)) from None
        record, secret = await keys.create(spec)
        self.auth.forget()
        fields["created_key"] = record.id
        log.info("key created", extra={"fields": {"key_id": record.id, "name": spec.name}})
        await send_json(send, 201, {**record.public(), "key": secret}, {"x-request-id": rid})
        return 201

    async def list_keys(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        keys = self._admin_keys(scope)
        query = query_params(scope)
        every = query.get("all") in ("1", "true")
        records = await keys.list(include_revoked=every)
        data = [r.public() for r in records]
        if query.get("usage") in ("1", "true"):
            # Each key's limits with what is used now (the console's budget bars).
            figures = await asyncio.gather(*(self._figures(r) for r in records))
            for view, record, found in zip(data, records, figures, strict=True):
                view["usage"] = limits_view(record.limits, found)
        await send_json(send, 200, {"object": "list", "data": data}, {"x-request-id": rid})
        return 200

    async def _figures(self, key: KeyRecord) -> Figures:
        """What `key` used of its limits now (none known while the limits' store is down)."""
        try:
            return await self.backend.figures(key.id, key.limits)
        except LimitsUnavailable:
            return Figures()

    async def get_key(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        keys = self._admin_keys(scope)
        key_id = _key_id(scope)
        found = await keys.get(key_id)
        if found is None:
            raise _no_key(key_id)
        view = {**found.public(), "usage": limits_view(found.limits, await self._figures(found))}
        await send_json(send, 200, view, {"x-request-id": rid})
        return 200

    async def revoke_key(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        keys = self._admin_keys(scope)
        key_id = _key_id(scope)
        revoked = await keys.revoke(key_id)
        if revoked is None:
            raise _no_key(key_id)
        self.auth.forget()
        log.info("key revoked", extra={"fields": {"key_id": key_id}})
        await send_json(send, 200, revoked.public(), {"x-request-id": rid})
        return 200

    async def admin_usage(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        self._admin_keys(scope)
        query = query_params(scope)
        now = time.time()
        try:
            since = parse_since(query.get("since"), now, now - 86400)
        except ValueError:
            raise request_error("since must be like 24h, 7d or 2026-01-31", param="since") from None
        by = tuple(g for g in (query.get("by") or "key,model").split(",") if g)
        if any(g not in GROUPS for g in by):
            raise request_error(f"by takes {', '.join(GROUPS)}", param="by")
        assert self.store is not None
        if self.ledger is not None:
            await self.ledger.flush()
        key = query.get("key")
        rows = await summarize(self.store, since=since, key=key if key else ALL_KEYS, by=by)
        body = {"object": "usage", "since": since, "until": now, "data": rows}
        await send_json(send, 200, body, {"x-request-id": rid})
        return 200


def _key_view(key: KeyRecord | None) -> dict[str, Any] | None:
    if key is None:
        return None
    view = key.public()
    view.pop("limits", None)
    return view


def _key_id(scope: Scope) -> str:
    """The key a route's path names: a 404 unless it is one's form."""
    key_id: str = scope["path_params"]["key_id"]
    if not is_key_id(key_id):
        raise _no_key(key_id)
    return key_id


def _no_key(key_id: str) -> GatewayError:
    return request_error(f"No key {key_id!r}", status=404, code="key_not_found")


def _listed_for_key(scope: Scope, model: str) -> bool:
    """A key restricted to some models sees only those in model lists."""
    key = caller_key(scope)
    return key is None or key.allows(model)


class _LedgerRows(Observer):
    """The ledger's feed: each settled call's record, a row (once the ledger is open)."""

    def __init__(self, service: KeysService) -> None:
        self.service = service

    def settled(self, event: CallSettled) -> None:
        ledger = self.service.ledger
        if ledger is not None:
            ledger.record(event.record)


def install(app: App, *, backend: Backend | None = None, span_exporter: Any = None) -> KeysService:
    """Put keys, limits, the ledger, metrics and tracing on `app` (see the module doc); what of
    them watches requests and calls is `KeysService.observers()`, for the app's builder to
    compose."""
    service = KeysService(app, backend=backend, span_exporter=span_exporter)
    if service.tracing is not None:
        app.add_guard(service.tracing.request_guard())
    if service.metrics is not None:
        service.metrics.watch_policy(app.gateway.policy)
        service.metrics.registry.collectors.append(service._ledger_metrics)
        app.routes.add("GET", "/metrics", service.serve_metrics)
    app.add_guard(service.auth.guard)
    app.gateway.add_interceptor(service.gate)
    app.model_filters.append(_listed_for_key)
    for method, template, handler in service.admin_routes():
        app.routes.add(method, template, handler)
    app.routes.add("GET", "/v1/usage", service.usage)
    app.on_startup(service.startup)
    app.on_shutdown(service.shutdown)
    return service
