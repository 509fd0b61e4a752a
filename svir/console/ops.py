"""The console's operator endpoints: who the page is (`/admin/console/session`), every model and
what runs it (`/admin/models`, load, unload, a managed server's log), `svir probe` run on a
provider (`/admin/probe`), and the running config with its secrets redacted (`/admin/config`).

Every route is under `/admin/`, so the admin rule (svir.edges.keys_service.admin_access) has passed
before a handler runs; each still asks for the verdict, so that none is served without it.
Nothing here runs on a chat request: the endpoints read the state the gateway, the policy and
the managed supervisors keep anyway.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from rich.console import Console

from svir import __version__
from svir.asgi import Receive, Scope, Send
from svir.chat import UpstreamTarget
from svir.client.connection import ClientFailure, Connection
from svir.client.probe.payloads import GROUPS as PROBE_GROUPS
from svir.client.probe.prober import Prober
from svir.client.probe.report import Report, render
from svir.config.model import MANAGED_KIND, Config
from svir.edges.app import App
from svir.edges.keys_service import KeysService, admin_access
from svir.edges.managed.install import Managed
from svir.edges.managed.supervisor import Supervisor
from svir.errors import GatewayError, request_error
from svir.protocols.http import query_params, read_json, send_json
from svir.protocols.router import Handler
from svir.wire.classify import to_client_error
from svir.wire.errors import ProtocolError, UpstreamError
from svir.wire.model_meta import ModelFacts
from svir.wire.redact import redact, redact_url

__all__ = ["Ops", "install", "redacted_config"]

_MAX_BODY: Final = 64 * 1024
REDACTED: Final = "[redacted]"
# GET /admin/models/log: lines by default and at most, the bytes read from the file's end for
# them, and the longest line kept (llama-server's lines are short; a runaway one is cut).
LOG_LINES: Final = 200
LOG_LINES_MAX: Final = 2000
LOG_BYTES_MAX: Final = 512 * 1024
LOG_LINE_CHARS: Final = 2000
# POST /admin/probe: no check starts past `timeout` seconds (by default, at most), and one
# request waits at most PROBE_REQUEST_SECONDS: a run ends within the sum.
PROBE_SECONDS: Final = 300.0
PROBE_SECONDS_MAX: Final = 900.0
PROBE_REQUEST_SECONDS: Final = 60.0
# The plain table's width (what `svir probe` prints into a pipe).
PROBE_TEXT_WIDTH: Final = 160

# Names of config fields and headers whose values are credentials (compared lower-cased); a
# name ending in `_env` names the variable that holds one, which is not secret.
_SECRET_NAME: Final = re.compile(
    r"auth|api[-_]?key|token|secret|passw|cookie|session|signature|credential|(?:^|[-_])key$"
)
_BREAKER_STATES: Final = {"half-open": "half_open"}


def _reload_status(app: App) -> dict[str, Any] | None:
    """What the config reloader says of itself, or None while svir has none (h19-reload)."""
    status = getattr(app, "reload_status", None)
    return status() if callable(status) else None


def _capture_on(app: App) -> bool:
    """Whether request capture is on (`[capture] enabled`)."""
    return app.config.capture.enabled


@dataclass(frozen=True, slots=True)
class _Managed:
    """A managed model named by a request: its supervisor and its id there."""

    name: str
    model_id: str
    supervisor: Supervisor


class Ops:
    """The handlers; `routes()` lists them."""

    def __init__(
        self,
        app: App,
        keys: KeysService,
        managed: Managed,
        *,
        source: str | None = None,
        workers: int = 1,
    ) -> None:
        self.app = app
        self.keys = keys
        self.managed = managed
        self.source = source
        self.workers = workers
        self._probing = False

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/admin/console/session", self.session),
            ("GET", "/admin/models", self.list_models),
            ("POST", "/admin/models/load", self.load),
            ("POST", "/admin/models/unload", self.unload),
            ("GET", "/admin/models/log", self.model_log),
            ("POST", "/admin/probe", self.probe),
            ("GET", "/admin/config", self.config),
        ]

    # GET /admin/console/session

    async def session(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        access = admin_access(scope)
        auth = self.keys.auth
        keys_on = auth.keys is not None and await auth.configured()
        body = {
            "auth": access,
            "keys_on": keys_on,
            "pid": os.getpid(),
            "workers": self.workers,
            "version": __version__,
            "capture": _capture_on(self.app),
        }
        await send_json(send, 200, body, {"x-request-id": rid})
        return 200

    # GET /admin/models

    async def list_models(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        listed = await self.app.router.models()
        deployments = self._deployments()
        data = list(await asyncio.gather(*(self._entry(name, deployments) for name, _ in listed)))
        counts: dict[str, int] = {}
        for entry in data:
            counts[entry["provider"]] = counts.get(entry["provider"], 0) + 1
        names = {entry["id"] for entry in data}
        for route in self.app.config.routes:
            view = {
                "targets": [{"model": t.model, "weight": t.weight} for t in route.targets],
                "strategy": route.strategy,
                "fallbacks": list(route.fallbacks),
                "context_fallback": route.context_fallback,
            }
            if route.name in names:  # a real model given fallbacks
                next(e for e in data if e["id"] == route.name)["route"] = view
                continue
            data.append(
                {
                    "id": route.name,
                    "provider": None,
                    "model": None,
                    "kind": None,
                    "source": "route",
                    "context_length": None,
                    "capabilities": [],
                    "breaker": None,
                    "in_flight": sum(
                        deployments.get(t.model, {}).get("in_flight", 0) for t in route.targets
                    ),
                    "managed": None,
                    "route": view,
                }
            )
        environ = self.app.environ
        providers = [
            {
                "name": p.name,
                "kind": p.kind,
                # The config refuses credentials in a base URL: it is shown as it is.
                "base_url": None if p.kind == MANAGED_KIND else p.base_url,
                "api_key_env": p.api_key_env,
                "key_set": p.api_key(environ) is not None,
                "models": counts.get(p.name, 0),
            }
            for p in self.app.config.providers
        ]
        await send_json(send, 200, {"providers": providers, "data": data}, {"x-request-id": rid})
        return 200

    def _deployments(self) -> dict[str, Any]:
        found: dict[str, Any] = self.app.gateway.policy.snapshot()["deployments"]
        return found

    async def _entry(self, name: str, deployments: Mapping[str, Any]) -> dict[str, Any]:
        """One model as `/admin/models` lists it."""
        route = self.app.router.resolve(name)
        provider = route.provider
        facts = await self._facts(name, route)
        deployment = deployments.get(name)
        breaker = None
        if deployment is not None:
            state = deployment["state"]
            breaker = {
                "state": _BREAKER_STATES.get(state, state),
                "failures": deployment["failures"],
                "cooldown_left": deployment["cooldown_left"],
            }
        model_id = name.partition("/")[2]
        supervisor = self.managed.supervisors.get(provider.name)
        return {
            "id": name,
            "provider": provider.name,
            "model": model_id,
            "kind": provider.kind,
            "source": "configured" if model_id in provider.models else "discovered",
            "context_length": facts.context_length if facts is not None else None,
            "capabilities": facts.capabilities if facts is not None else [],
            "breaker": breaker,
            "in_flight": deployment["in_flight"] if deployment is not None else 0,
            "managed": _managed_view(supervisor, model_id) if supervisor is not None else None,
            "route": None,
        }

    async def _facts(self, name: str, route: UpstreamTarget) -> ModelFacts | None:
        try:
            return await self.app.catalog.facts(name, route)
        except (GatewayError, UpstreamError, ProtocolError):
            return None

    # POST /admin/models/load, /admin/models/unload

    async def load(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        target = self._managed_model(await _model_of(scope, receive))
        sup = target.supervisor
        try:
            await sup.ensure(target.model_id)
        except UpstreamError as exc:
            # The operator is told what svir's log says (a client is told less).
            detail = sup.snapshot()["models"][target.model_id].get("last_error")
            error = to_client_error(exc)
            if detail:
                error = msgspec.structs.replace(error, message=f"{error.message}: {detail}")
            raise GatewayError(error, exc) from None
        sup.release(target.model_id)  # loaded, and not held: the idle timer runs from now
        fields["model"] = target.name
        return await self._send_entry(send, rid, target.name)

    async def unload(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        target = self._managed_model(await _model_of(scope, receive))
        sup = target.supervisor
        state = sup.snapshot()["models"][target.model_id]
        if state["pid"] is not None or state["state"] == "loading":
            if not await sup.unload(target.model_id):
                state = sup.snapshot()["models"][target.model_id]
                if state["pid"] is not None or state["state"] == "loading":
                    raise request_error(
                        f"{target.name} is {state['state']} with {state['in_flight']} request(s)"
                        " in flight: it is stopped once idle (idle_unload), or try again then",
                        status=409,
                        code="model_busy",
                        param="model",
                    )
        fields["model"] = target.name
        return await self._send_entry(send, rid, target.name)

    async def _send_entry(self, send: Send, rid: str, name: str) -> int:
        entry = await self._entry(name, self._deployments())
        await send_json(send, 200, entry, {"x-request-id": rid})
        return 200

    def _managed_model(self, name: str) -> _Managed:
        """The managed model `name` names: 404 for no such model, 400 for one svir does not run."""
        route = self.app.router.resolve(name)  # 404 model_not_found
        sup = self.managed.supervisors.get(route.provider.name)
        if sup is None:
            raise request_error(
                f"{name} is not a managed model: svir runs the servers of kind"
                f" {MANAGED_KIND!r} providers only, and {route.provider.name!r} is"
                f" {route.provider.kind!r}",
                code="model_not_managed",
                param="model",
            )
        if route.model_id not in sup.snapshot()["models"]:
            raise request_error(
                f"The model {name!r} does not exist", status=404, code="model_not_found",
                param="model",
            )  # fmt: skip
        return _Managed(f"{route.provider.name}/{route.model_id}", route.model_id, sup)

    # GET /admin/models/log?model=&lines=

    async def model_log(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        query = query_params(scope)
        name = query.get("model")
        if not name:
            raise request_error("model is required (?model=<provider>/<model-id>)", param="model")
        count = LOG_LINES
        if query.get("lines"):
            try:
                count = int(query["lines"])
            except ValueError:
                count = 0
            if not 1 <= count <= LOG_LINES_MAX:
                raise request_error(
                    f"lines must be a whole number from 1 to {LOG_LINES_MAX}", param="lines"
                )
        target = self._managed_model(name)
        path = target.supervisor.snapshot()["models"][target.model_id]["log"]
        lines = await asyncio.to_thread(_tail, path, count) if path is not None else []
        # The lines only: where the file lies is the machine's business (it is in
        # /admin/models and /healthz?verbose=1 for the operator).
        await send_json(send, 200, {"model": target.name, "lines": lines}, {"x-request-id": rid})
        return 200

    # POST /admin/probe

    async def probe(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        body = await read_json(scope, receive, _MAX_BODY)
        ask = _probe_request(body)
        provider = self.app.router.providers.get(ask.provider)
        if provider is None:
            known = ", ".join(sorted(self.app.router.providers)) or "none configured"
            raise request_error(
                f"No provider {ask.provider!r}: the providers are {known}",
                status=404,
                code="not_found",
                param="provider",
            )
        if self._probing:
            raise request_error(
                "A probe is running: one at a time, try again once it ends",
                status=409,
                code="probe_busy",
            )
        config = provider.config
        model = ask.model
        if model is not None and model.startswith(config.name + "/"):
            model = model[len(config.name) + 1 :]
        if model is None and config.models:
            model = config.models[0]
        # Shielded: a page that goes away leaves the probe to end by its deadline, still
        # counted as the one running (its thread cannot be stopped sooner).
        run = asyncio.ensure_future(self._run_probe(config.name, model, ask, provider.api_key))
        self._probing = True
        run.add_done_callback(self._probe_ended)
        report = await asyncio.shield(run)
        secrets = self._secrets()
        rows = _scrub([f.to_json() for f in report.findings], secrets)
        out = io.StringIO()
        render(report, Console(file=out, width=PROBE_TEXT_WIDTH, color_system=None))
        fields["provider"] = config.name
        answer = {
            "provider": config.name,
            "model": report.model,
            "rows": rows,
            "text": redact(out.getvalue(), secrets),
            "report": _scrub(report.to_json(), secrets),
        }
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    def _probe_ended(self, run: asyncio.Future[Report]) -> None:
        self._probing = False
        if not run.cancelled():
            run.exception()  # retrieved: the handler that awaited it answered it, if any

    async def _run_probe(
        self, name: str, model: str | None, ask: _ProbeAsk, api_key: str | None
    ) -> Report:
        sup = self.managed.supervisors.get(name)
        held: str | None = None  # the managed model this probe holds in flight
        if sup is not None:
            target = self._managed_model(f"{name}/{model}")
            try:
                base = await sup.ensure(target.model_id)
            except UpstreamError as exc:
                raise GatewayError(to_client_error(exc), exc) from None
            held = target.model_id
        else:
            base = self.app.router.providers[name].base_url.rstrip("/")
            # svir probe speaks to `<base>/v1/chat/completions`: a server whose API lives
            # elsewhere (Azure's deployments, Gemini's /v1beta/openai) is not one to probe.
            if not base.endswith("/v1"):
                raise request_error(
                    f"svir probe speaks to an OpenAI-compatible server under /v1, and provider"
                    f" {name!r} ({self.app.router.providers[name].kind.name}) is not one",
                    code="unsupported_value",
                    param="provider",
                )
        conn = Connection(base, api_key)
        deadline = time.monotonic() + ask.seconds
        prober = Prober(
            conn,
            model,
            timeout=PROBE_REQUEST_SECONDS,
            only=ask.only,
            deadline=deadline,
        )
        try:
            return await asyncio.to_thread(prober.run)
        except ClientFailure as exc:
            raise request_error(
                f"svir probe {name}: {redact(str(exc), self._secrets())}",
                status=502,
                type="upstream_error",
                code="probe_failed",
                param="provider",
            ) from None
        finally:
            if sup is not None and held is not None:
                sup.release(held)

    # GET /admin/config

    async def config(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        admin_access(scope)
        config = self.app.config
        environ = self.app.environ
        where: list[dict[str, Any]] = []
        for i, p in enumerate(config.providers):
            if p.api_key_env is not None:
                where.append(
                    {
                        "where": f"providers[{i}].api_key_env",
                        "provider": p.name,
                        "env": p.api_key_env,
                        "set": p.api_key(environ) is not None,
                    }
                )
        auth = config.auth
        for field, env, value in (
            ("admin_key_env", auth.admin_key_env, auth.admin_key(environ)),
            ("metrics_token_env", auth.metrics_token_env, auth.metrics_token(environ)),
        ):
            where.append({"where": f"auth.{field}", "env": env, "set": value is not None})
        secrets = self._secrets()
        body = {
            "source": self.source,
            "config": redacted_config(config, secrets),
            "secrets": where,
            "reload": _scrub(_reload_status(self.app), secrets),
        }
        await send_json(send, 200, body, {"x-request-id": rid})
        return 200

    def _secrets(self) -> list[str]:
        """Every secret svir read from its environment (provider keys, admin key, metrics token)."""
        config = self.app.config
        environ = self.app.environ
        found = [p.api_key(environ) for p in config.providers]
        found += [config.auth.admin_key(environ), config.auth.metrics_token(environ)]
        # The longest first: one secret inside another is not left half shown.
        return sorted({s for s in found if s}, key=len, reverse=True)


def install(
    app: App, keys: KeysService, managed: Managed, *, source: str | None = None, workers: int = 1
) -> Ops:
    """Add the console's operator routes to `app` (see the module doc); `source` is the config
    file the app's config came from (None: the default config), `workers` the processes serving
    the port."""
    ops = Ops(app, keys, managed, source=source, workers=workers)
    for method, template, handler in ops.routes():
        app.routes.add(method, template, handler)
    return ops


# ---------------------------------------------------------------------------------------------
# Requests


async def _model_of(scope: Scope, receive: Receive) -> str:
    """The `model` of a load or unload body."""
    body = await read_json(scope, receive, _MAX_BODY)
    if not isinstance(body, dict):
        raise request_error('the body must be a JSON object: {"model": "<provider>/<model-id>"}')
    unknown = sorted(set(body) - {"model"})
    if unknown:
        raise request_error(f"unknown field {unknown[0]!r}", param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise request_error("model is required: a string, <provider>/<model-id>", param="model")
    return model


@dataclass(frozen=True, slots=True)
class _ProbeAsk:
    provider: str
    model: str | None
    only: frozenset[str] | None
    seconds: float


_PROBE_FIELDS: Final = frozenset({"provider", "model", "only", "timeout"})


def _probe_request(body: Any) -> _ProbeAsk:
    if not isinstance(body, dict):
        raise request_error('the body must be a JSON object: {"provider": "<name>"}')
    unknown = sorted(set(body) - _PROBE_FIELDS)
    if unknown:
        raise request_error(f"unknown field {unknown[0]!r}", param=unknown[0])
    provider = body.get("provider")
    if not isinstance(provider, str) or not provider:
        raise request_error("provider is required: a provider's name", param="provider")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise request_error("model must be a model id of the provider", param="model")
    only = body.get("only")
    if only is not None:
        if (
            not isinstance(only, list)
            or not only
            or not all(isinstance(g, str) and g in PROBE_GROUPS for g in only)
        ):
            raise request_error(f"only takes a list of {', '.join(PROBE_GROUPS)}", param="only")
        only = frozenset(only)
    seconds = body.get("timeout", PROBE_SECONDS)
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 1 <= seconds <= PROBE_SECONDS_MAX
    ):
        raise request_error(
            f"timeout must be seconds from 1 to {PROBE_SECONDS_MAX:g}", param="timeout"
        )
    return _ProbeAsk(provider, model, only, float(seconds))


# ---------------------------------------------------------------------------------------------
# What is shown


def _managed_view(supervisor: Supervisor, model_id: str) -> dict[str, Any] | None:
    state = supervisor.snapshot()["models"].get(model_id)
    if state is None:
        return None
    pid = state["pid"]
    return {
        # An exited server is forgotten within a watch interval: it is stopped.
        "state": "stopped" if state["state"] == "exited" else state["state"],
        "pid": pid,
        "port": state["port"],
        "rss_bytes": rss_bytes(pid) if pid is not None else None,
        "last_used": state["last_used"],
        "in_flight": state["in_flight"],
        "log_file": state["log"],
        "ctx": state["ctx"],
        "loads": state["loads"],
        "unexpected_exits": state["unexpected_exits"],
        "last_error": state["last_error"],
    }


def rss_bytes(pid: int) -> int | None:
    """The resident memory of process `pid`, from /proc (None where there is no /proc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            resident = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE")


def _tail(path: str, count: int) -> list[str]:
    """The last `count` lines of the file at `path` (none when it cannot be read)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - LOG_BYTES_MAX))
            data = log.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if len(data) == LOG_BYTES_MAX and size > LOG_BYTES_MAX and lines:
        lines = lines[1:]  # the first line read began before the bytes read
    return [line[:LOG_LINE_CHARS] for line in lines[-count:]]


def redacted_config(config: Config, secrets: list[str]) -> dict[str, Any]:
    """`config` as JSON with every credential replaced by "[redacted]": a value whose name is a
    credential's (an `Authorization` header in `extra_headers`), a password in a URL (the
    store's, Redis's), each of `secrets` wherever it appears, and anything shaped like a key."""
    doc: dict[str, Any] = msgspec.to_builtins(config)
    scrubbed: dict[str, Any] = _scrub(doc, secrets)
    return scrubbed


def _scrub(value: Any, secrets: list[str], name: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v, secrets, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secrets, name) for v in value]
    if not isinstance(value, str):
        return value
    lowered = name.lower()
    if value and _SECRET_NAME.search(lowered) and not lowered.endswith("_env"):
        return REDACTED
    return redact(redact_url(value, REDACTED), secrets)
