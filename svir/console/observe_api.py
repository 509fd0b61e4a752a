"""The console's data routes, under `/admin/` and so behind the admin rule
(svir.edges.keys_service.admin_access; docs/capture.md, and the console API in docs/console.md):

- `GET /admin/events`: the live feed of this process (SSE): `request.started`,
  `request.progress`, `request.finished`, `stats` each second, `lagged` when the page fell behind,
  `: ping` comments.
- `GET /admin/stats?minutes=15`: this process's per-second points and per-model figures.
- `GET /admin/requests`: the usage ledger's history (the shared store: every worker's requests),
  newest first, filtered, a page at a time.
- `GET /admin/requests/{request_id}`: its ledger rows, this process's live record of it (if this
  process served it recently) and its capture (the shared store).
- `GET /admin/requests/{request_id}/conformance`: its captured upstream stream and the events it
  decodes to, as a case of the conformance corpus (a zip).

Installed last by `svir.server.build_app` (`install`): it feeds on the keys service's gate.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any, Final

from svir import observers as flow
from svir.asgi import Receive, Scope, Send
from svir.console.capture import Capturer
from svir.console.observe import Observer, Subscriber
from svir.edges.app import App
from svir.edges.keys_service import KeysService, admin_access, parse_since
from svir.errors import GatewayError, request_error
from svir.ledger.queries import LedgerFilter, ledger_page, ledger_rows
from svir.protocols.http import UntilDisconnect, query_params, send_json
from svir.providers import KINDS
from svir.store.captures import CaptureRecord, CaptureStore
from svir.wire.classify import ClientError
from svir.wire.conformance import case_files, case_name, case_zip

__all__ = ["Console", "console_of", "install"]

# Seconds between `: ping` comments on a quiet feed.
PING_SECONDS: Final = 15.0
MAX_PAGE: Final = 500
_MAX_FILTER: Final = 256
_MAX_CURSOR: Final = 2**63 - 1
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def console_of(app: App) -> Console:
    """The console installed on `app`."""
    return app.part(Console)


def _starting() -> GatewayError:
    return GatewayError(ClientError(503, "server_error", "starting", "svir is starting."))


def _not_found(what: str) -> GatewayError:
    return request_error(what, status=404, code="not_found")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def capture_view(c: CaptureRecord) -> dict[str, Any]:
    """A capture as the request page shows it (the bytes as text)."""
    return {
        "created_at": c.created_at,
        "api": c.api,
        "provider": c.provider,
        "model": c.model,
        "server": c.server,
        "client_request": {"headers": c.client_headers, "body": _text(c.client_body)},
        "upstream_request": {
            "url": c.upstream_url,
            "headers": c.upstream_headers,
            "body": _text(c.upstream_body),
        },
        "upstream_status": c.upstream_status,
        "upstream_stream": _text(c.upstream_stream),
        "client_status": c.client_status,
        "client_stream": _text(c.client_stream),
        "truncated": c.truncated,
    }


class Console:
    """The observer, the capturer (when `[capture] enabled`), and their routes."""

    def __init__(self, app: App, service: KeysService) -> None:
        self.app = app
        self.service = service
        # The wall clock captures are dated and pruned by (a test's own, to age them).
        self.clock = time.time
        self.observer = Observer(secrets=self.secrets)
        capture = app.config.capture
        self.captures: CaptureStore | None = None
        self.capturer: Capturer | None = None
        if capture.enabled:
            self.capturer = Capturer(
                capture, self.capture_store, clock=self.now, secrets=self.secrets
            )

    def now(self) -> float:
        return self.clock()

    def secrets(self) -> tuple[str, ...]:
        return self.app.secrets

    def observers(self) -> list[flow.Observer]:
        """What of the console watches requests and calls (svir.observers), in the order they are
        told: the live view, then capture (when on)."""
        out: list[flow.Observer] = [self.observer]
        if self.capturer is not None:
            out.append(self.capturer)
        return out

    def capture_store(self) -> CaptureStore | None:
        """The captures in the keys service's store (None until it is open)."""
        store = self.service.store
        if store is None:
            return None
        if self.captures is None or self.captures.store is not store:
            c = self.app.config.capture
            self.captures = CaptureStore(
                store, max_rows=c.max_rows, max_age=c.max_age, clock=self.now
            )
        return self.captures

    async def shutdown(self) -> None:
        await self.observer.close()
        if self.capturer is not None:
            await self.capturer.drain()

    # GET /admin/events

    async def events(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        sub = self.observer.subscribe()
        try:
            with UntilDisconnect(scope, receive):
                return await self._feed(send, sub, rid)
        finally:
            self.observer.unsubscribe(sub)

    async def _feed(self, send: Send, sub: Subscriber, rid: str) -> int:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*_SSE_HEADERS, (b"x-request-id", rid.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b": connected\n\n", "more_body": True})
        observer = self.observer
        loop = asyncio.get_running_loop()
        while not observer.closing:
            # A timer rather than wait_for: the wait is cancelled at once when the client goes.
            timer = loop.call_later(PING_SECONDS, sub.ping)
            try:
                await sub.wake.wait()
            finally:
                timer.cancel()
            data = sub.take()
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200

    # GET /admin/stats

    async def stats(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        query = query_params(scope)
        minutes = 15.0
        if query.get("minutes"):
            try:
                minutes = float(query["minutes"])
            except ValueError:
                minutes = math.nan
            if not 0 < minutes <= 15:
                raise request_error(
                    "minutes must be a number above 0 and at most 15",
                    param="minutes",
                    code="invalid_value",
                )
        body = {"pid": os.getpid(), **self.observer.stats(minutes)}
        await send_json(send, 200, body, {"x-request-id": rid})
        return 200

    # GET /admin/requests

    async def requests(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        where, limit = _ledger_filter(query_params(scope))
        store = self.service.store
        if store is None:
            raise _starting()
        ledger = self.service.ledger
        if ledger is None:  # [ledger] enabled = false: there is no history
            await send_json(send, 200, {"data": [], "next": None}, {"x-request-id": rid})
            return 200
        await ledger.flush()
        rows, after = await ledger_page(store, where, limit)
        await send_json(send, 200, {"data": rows, "next": after}, {"x-request-id": rid})
        return 200

    # GET /admin/requests/{request_id}

    async def request(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        request_id = scope["path_params"]["request_id"]
        store = self.service.store
        captures = self.capture_store()
        if store is None or captures is None:
            raise _starting()
        rows: list[dict[str, Any]] = []
        if self.service.ledger is not None:
            await self.service.ledger.flush()
            rows = await ledger_rows(store, request_id)
        live = self.observer.detail(request_id)
        capture = await captures.get(request_id)
        if not rows and live is None and capture is None:
            raise _not_found(f"No request {request_id!r} in the ledger, this process or captures.")
        body = {
            "request_id": request_id,
            "rows": rows,
            "live": live,
            "pid": os.getpid(),
            "capture": capture_view(capture) if capture is not None else None,
        }
        await send_json(send, 200, body, {"x-request-id": rid})
        return 200

    # GET /admin/requests/{request_id}/conformance

    async def conformance(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        request_id = scope["path_params"]["request_id"]
        captures = self.capture_store()
        if captures is None:
            raise _starting()
        capture = await captures.get(request_id)
        if capture is None:
            raise _not_found(
                f"No capture of the request {request_id!r} (captures are kept while [capture]"
                " is enabled, for max_age seconds)."
            )
        kind = KINDS.get(capture.server or "")
        if kind is None or not capture.upstream_stream:
            raise request_error(
                f"The capture of {request_id!r} holds no chat stream from an upstream (a refused"
                " or failed call, a text completion or embeddings): there is no conformance case"
                " to make of it.",
                status=409,
                code="invalid_request",
            )
        options = capture.options
        decoder = kind.new_decoder(
            think_tags=bool(options.get("think_tags")), tool_names=options.get("tool_names")
        )
        raw = capture.upstream_stream
        events = [*decoder.feed(raw), *decoder.close()]
        proves = (
            f"captured by svir from provider {capture.provider!r} (kind {capture.server}),"
            f" model {capture.model!r}, request {request_id}; expect is what svir's decoder made"
            " of it: check it against the wire reference before adding it to the corpus"
        )
        if capture.truncated:
            proves += " (the capture was cut at [capture] max_body_bytes)"
        name = case_name(request_id)
        archive = case_zip(
            case_files(
                name, raw, events, server=capture.server or "", options=options, proves=proves
            )
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/zip"),
                    (b"content-disposition", f'attachment; filename="{name}.zip"'.encode()),
                    (b"content-length", str(len(archive)).encode()),
                    (b"x-request-id", rid.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": archive})
        return 200


def _filter_text(query: dict[str, str], name: str) -> str | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if len(value) > _MAX_FILTER or "\x00" in value:
        raise request_error(
            f"{name} must be at most {_MAX_FILTER} characters, without NUL",
            param=name,
            code="invalid_value",
        )
    return value


def _ledger_filter(query: dict[str, str]) -> tuple[LedgerFilter, int]:
    """The filter and page size of `GET /admin/requests`; a 400 naming a bad parameter."""
    limit = 50
    if query.get("limit"):
        try:
            limit = int(query["limit"])
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE:
            raise request_error(
                f"limit must be a whole number from 1 to {MAX_PAGE}",
                param="limit",
                code="invalid_value",
            )
    before = None
    if query.get("before"):
        try:
            before = int(query["before"])
        except ValueError:
            before = 0
        if not 1 <= before <= _MAX_CURSOR:
            raise request_error(
                "before must be the `next` of an earlier page (a ledger id)",
                param="before",
                code="invalid_cursor",
            )
    now = time.time()
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        text = _filter_text(query, name)
        value = None
        if text is not None:
            try:
                value = parse_since(text, now, now)
            except (ValueError, OverflowError):
                value = math.nan
            if not math.isfinite(value):
                raise request_error(
                    f"{name} must be like 24h, 7d, 2026-01-31, an ISO time or Unix seconds",
                    param=name,
                    code="invalid_value",
                )
        times[name] = value
    where = LedgerFilter(
        key=_filter_text(query, "key"),
        model=_filter_text(query, "model"),
        provider=_filter_text(query, "provider"),
        api=_filter_text(query, "api"),
        status=_filter_text(query, "status"),
        since=times["since"],
        until=times["until"],
        before=before,
    )
    return where, limit


def install(app: App, service: KeysService) -> Console:
    """Put the console's data on `app`; what of it watches and captures requests is the
    Console's `observers()` and `capturer`, for the app's builder to compose into the app."""
    console = Console(app, service)
    observer = console.observer
    app.gateway.add_interceptor(observer.intercept)
    app.routes.add("GET", "/admin/events", console.events)
    app.routes.add("GET", "/admin/stats", console.stats)
    app.routes.add("GET", "/admin/requests", console.requests)
    app.routes.add("GET", "/admin/requests/{request_id}", console.request)
    app.routes.add("GET", "/admin/requests/{request_id}/conformance", console.conformance)
    app.on_stopping(observer.end_feeds)
    app.on_shutdown(console.shutdown)
    app.add_part(console)
    return console
