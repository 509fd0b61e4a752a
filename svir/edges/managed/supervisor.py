"""The `llama-server` processes svir runs itself: one supervisor per `llamacpp-managed` provider.

A request for `<provider>/<model-id>` first awaits `Supervisor.ensure(model_id)`, which returns
the base URL of a running, healthy server for that model, starting it if need be (a free loopback
port; `/health` polled without blocking the event loop). Like llama-swap, at most `max_loaded`
servers run at once: asking for another stops the least recently used one without requests in
flight, and if every one is busy, waits until one is idle (and keeps new requests off it in the
meantime, so the swap cannot starve). The call gives the model back with `release(model_id)`
when it closes; every start and stop happens under one lock, and concurrent requests for a model
that is starting wait for that one start.

A watcher task notices a server that exits by itself: it logs the exit and the log's last lines,
and restarts the server when it was in use (the next request would otherwise restart it). It also
stops servers idle for `idle_unload` seconds. On shutdown every server is stopped; the Linux
parent-death signal set in `svir.edges.llama_server` covers a svir that is killed outright.
Servers are started from the event loop's thread, since that signal follows the starting thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svir.config.model import (
    MANAGED_KIND,
    PYPI_GEMMA,
    ManagedConfig,
    ManagedModel,
    ProviderConfig,
)
from svir.edges.llama_server import (
    DEFAULT_MODEL_DIR,
    LlamaServer,
    ensure_gemma_model,
    find_llama_server,
)
from svir.edges.managed.launch import (
    BIND_ATTEMPTS,
    BIND_FAILED,
    NOT_RUN,
    file_name,
    file_size,
    last_lines,
    server_args,
    template_path,
)
from svir.errors import LlamaServerError
from svir.policy.catalog import Loaded
from svir.wire.errors import ErrorKind, UpstreamError

if TYPE_CHECKING:
    pass

__all__ = ["Supervisor"]

log = logging.getLogger("svir.managed")

# How often the watcher looks at the processes (at most; less for a short idle_unload).
WATCH_INTERVAL = 0.5
# A server that dies after a request within this many seconds is restarted at once.
RECENT_USE = 60.0
# How long stopping a server waits after SIGTERM before SIGKILL.
STOP_GRACE = 5.0


class _Load:
    """One start of a model's server, and the requests waiting for it (each gets the model)."""

    def __init__(self) -> None:
        self.waiting = 0
        self.task: asyncio.Task[bool] | None = None

    def running(self) -> bool:
        return self.task is not None and not self.task.done()


@dataclass(eq=False)
class _Model:
    """One configured model and the server that runs it, if any."""

    id: str
    spec: ManagedModel
    server: LlamaServer | None = None
    # Healthy: `/health` answered 200 since the server started.
    ready: bool = False
    in_flight: int = 0
    # Someone needs this server's place: new requests wait instead of using it.
    draining: bool = False
    loading: _Load | None = None
    last_used: float = 0.0
    last_used_wall: float | None = None
    loads: int = 0
    exits: int = 0
    last_exit: int | None = None
    last_error: str | None = None
    log_path: Path | None = None
    # The context its server starts with (a request's num_ctx may raise it), the one the
    # running server has, and the size of its model file.
    ctx: int = 4096
    running_ctx: int = 0
    file_size: int = 0
    # The settings its server was started with: another `spec` (a config reload) restarts it
    # once its requests end.
    running_spec: ManagedModel | None = None

    def usable(self) -> bool:
        server = self.server
        return server is not None and self.ready and not self.draining and server.returncode is None

    def alive(self) -> bool:
        return self.server is not None and self.server.returncode is None

    def stale(self) -> bool:
        """Its server runs with settings a reload has since changed."""
        return self.server is not None and self.running_spec is not self.spec


@dataclass
class _Settings:
    max_loaded: int
    idle_unload: float
    start_timeout: float
    # The longest a request waits for a busy server to give its place.
    drain_timeout: float
    models: dict[str, ManagedModel] = field(default_factory=dict)


class Supervisor:
    """The servers of one managed provider. `start()` and `close()` bracket its life."""

    def __init__(
        self,
        provider: ProviderConfig,
        *,
        binary: str | None = None,
        model_dir: Path = DEFAULT_MODEL_DIR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        managed = provider.managed
        if managed is None:
            raise ValueError(f"provider {provider.name!r} has no [providers.managed] table")
        self.name = provider.name
        self.config: ManagedConfig = managed
        self._binary = binary
        self._model_dir = model_dir
        self._clock = clock
        self._models: dict[str, _Model] = {}
        # Models a reload removed whose server still runs: stopped once their requests end.
        self._retiring: dict[str, _Model] = {}
        for model_id in managed.models:
            spec = managed.model(model_id)
            assert spec is not None
            self._models[model_id] = _Model(model_id, spec, ctx=spec.ctx or 4096)
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gemma: asyncio.Future[Path] | None = None
        self._log_dir: Path | None = None
        self._closing = False
        self._drain_timeout = provider.timeouts.first_byte

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Find the binary (failing start-up when there is none) and start the watcher."""
        if self._binary is None:
            try:
                self._binary = find_llama_server()
            except LlamaServerError as exc:
                raise LlamaServerError(f"provider {self.name!r} ({MANAGED_KIND}): {exc}") from None
        self._log_dir = Path(tempfile.mkdtemp(prefix=f"svir-{self.name}-"))
        self._watcher = asyncio.create_task(self._watch(), name=f"svir-managed-{self.name}")
        if any(m.spec.path == PYPI_GEMMA for m in self._models.values()):
            self._gemma_file()  # ready by the first request
        log.info(
            "managed provider ready",
            extra={
                "fields": {
                    "provider": self.name,
                    "models": list(self._models),
                    "binary": self._binary,
                    "logs": str(self._log_dir),
                }
            },
        )

    async def close(self) -> None:
        """Stop every server and the watcher; requests after this are refused."""
        self._closing = True
        pending: list[asyncio.Task[Any]] = list(self._tasks)
        if self._watcher is not None:
            pending.append(self._watcher)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(
            *(self._stop(m, "shutdown") for m in self._all() if m.server is not None)
        )
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def reconfigure(self, provider: ProviderConfig) -> list[str]:
        """Serve `provider`'s new settings (a config reload) from now on; returns the models
        whose server restarts. A model whose settings changed keeps serving the requests it has
        and restarts with the new ones once they end (new requests wait for it); a removed
        model's server stops once its requests end; an added model starts on first use; the
        servers of unchanged models go on untouched."""
        managed = provider.managed
        if managed is None:
            raise ValueError(f"provider {provider.name!r} has no [providers.managed] table")
        self.config = managed
        self._drain_timeout = provider.timeouts.first_byte
        restarting: list[str] = []
        for model_id in managed.models:
            spec = managed.model(model_id)
            assert spec is not None
            m = self._models.get(model_id) or self._retiring.pop(model_id, None)
            if m is None:
                self._models[model_id] = _Model(model_id, spec, ctx=spec.ctx or 4096)
                continue
            self._models[model_id] = m
            if m.spec != spec:
                m.spec = spec
                m.ctx = spec.ctx or 4096
                if m.server is not None or (m.loading is not None and m.loading.running()):
                    restarting.append(model_id)
        for model_id in [i for i in self._models if i not in managed.models]:
            m = self._models.pop(model_id)
            if m.server is not None or m.in_flight or (m.loading and m.loading.running()):
                self._retiring[model_id] = m
        self._changed.set()
        return restarting

    def idle(self) -> bool:
        """No request is using any of its servers."""
        return all(m.in_flight == 0 for m in self._all())

    def _all(self) -> list[_Model]:
        return [*self._models.values(), *self._retiring.values()]

    # -- requests --------------------------------------------------------------------------

    async def ensure(self, model_id: str) -> str:
        """The base URL (ending in /v1) of a healthy server for `model_id`, counted in flight
        until `release(model_id)`. Raises UpstreamError when it cannot be had."""
        m = self._model(model_id)
        while True:
            if self._closing:
                raise UpstreamError(ErrorKind.TRANSIENT, "svir is shutting down")
            if m.usable() and m.running_ctx >= m.ctx and m.running_spec is m.spec:
                self._take(m)
                return self._url(m)
            load = m.loading
            if load is None or not load.running():
                load = self._new_load(m, evict=True)
            assert load.task is not None
            task = load.task
            load.waiting += 1
            try:
                granted = await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done() and not task.cancelled() and task.exception() is None:
                    if task.result():
                        self.release(model_id)  # handed the model just before the cancel
                    else:
                        load.waiting -= 1
                else:
                    load.waiting -= 1
                if task.cancelled() and self._closing:
                    raise UpstreamError(ErrorKind.TRANSIENT, "svir is shutting down") from None
                raise
            except BaseException:
                load.waiting -= 1
                raise
            if not granted:
                load.waiting -= 1
                continue
            if m.server is None:  # gone again in between: give it back and start over
                self.release(model_id)
                continue
            return self._url(m)

    def _model(self, model_id: str) -> _Model:
        m = self._models.get(model_id)
        if m is None:
            known = ", ".join(sorted(self._models))
            raise UpstreamError(
                ErrorKind.REJECTED,
                f"The model {self.name + '/' + model_id!r} does not exist: provider "
                f"{self.name!r} serves {known}",
                status=404,
                code="model_not_found",
                param="model",
            )
        return m

    # -- what runs (svir.policy.catalog's Runtime) -----------------------------------------

    def context_of(self, model_id: str) -> int | None:
        m = self._models.get(model_id)
        return m.ctx if m is not None else None

    def server_url(self, model_id: str) -> str | None:
        m = self._models.get(model_id)
        if m is None or m.server is None or not m.usable():
            return None
        return m.server.base_url

    def loaded(self) -> list[Loaded]:
        out = []
        for m in self._models.values():
            if m.server is None or not m.ready or not m.alive():
                continue
            expires = None
            if self.config.idle_unload > 0 and m.last_used_wall is not None:
                expires = m.last_used_wall + self.config.idle_unload
            out.append(Loaded(m.id, m.running_ctx, expires, m.file_size))
        return out

    async def require_context(self, model_id: str, context: int) -> None:
        """From now on, serve `model_id` with at least `context` tokens: its next `ensure`
        restarts a server that runs with less (as a swap: once its requests in flight end)."""
        m = self._model(model_id)
        if context > m.ctx:
            log.info(
                "context raised",
                extra={"fields": {"provider": self.name, "model": model_id, "ctx": context}},
            )
            m.ctx = context

    def release(self, model_id: str) -> None:
        """A request that `ensure` served has ended."""
        m = self._models.get(model_id) or self._retiring.get(model_id)
        if m is None or m.in_flight <= 0:
            return
        m.in_flight -= 1
        m.last_used = self._clock()
        m.last_used_wall = time.time()
        self._changed.set()

    async def unload(self, model_id: str) -> bool:
        """Stop the server of `model_id` now if no request is using it (Ollama's
        `keep_alive: 0`); True if one was stopped. One in use is left to the idle timer."""
        m = self._models.get(model_id)
        if m is None:
            return False
        async with self._lock:
            if (
                m.server is None
                or m.in_flight > 0
                or (m.loading is not None and m.loading.running())
            ):
                return False
            await self._stop(m, "unloaded by a client (keep_alive 0)")
            return True

    def _take(self, m: _Model) -> None:
        m.in_flight += 1
        m.last_used = self._clock()
        m.last_used_wall = time.time()

    def _url(self, m: _Model) -> str:
        assert m.server is not None
        return m.server.base_url + "/v1"

    def _new_load(self, m: _Model, *, evict: bool) -> _Load:
        load = _Load()
        load.task = self._spawn(self._load(m, load, evict=evict), f"load {m.id}")
        m.loading = load
        return load

    def _spawn(self, work: Any, name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.create_task(work, name=f"svir-managed-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A load nobody waits for any more (a proactive restart) must not warn at exit.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    # -- starting and stopping -------------------------------------------------------------

    async def _load(self, m: _Model, load: _Load, *, evict: bool) -> bool:
        """Start `m`'s server unless it runs, and hand it to the requests waiting for `load`.

        With `evict` false (a restart by the watcher) nothing else is stopped to make room, and
        without room nothing starts: False. Failures are UpstreamErrors the waiting requests
        raise.
        """
        async with self._lock:
            if self._closing:
                raise UpstreamError(ErrorKind.TRANSIENT, "svir is shutting down")
            self._reap_dead()
            if m.server is not None and m.running_ctx < m.ctx:
                await self._drain(m)
                await self._stop(m, f"restart with a context of {m.ctx}")
            elif m.stale():
                await self._drain(m)
                await self._stop(m, "restart: its settings changed in the config")
            if m.server is None:
                loaded = sum(1 for x in self._all() if x.server is not None)
                if not evict and loaded >= self.config.max_loaded:
                    return False
                await self._make_room(m)
                await self._start(m)
            # Loaded (already, or now): every request waiting for it gets it, even if it has
            # been asked to give its place meanwhile, so that a swap back and forth cannot
            # starve anyone.
            m.in_flight += load.waiting
            load.waiting = 0
            m.last_used = self._clock()
            m.last_used_wall = time.time()
            return True

    async def _drain(self, m: _Model) -> None:
        """Wait (keeping new requests off it) until `m` has no request in flight."""
        deadline = self._clock() + self._drain_timeout
        m.draining = True
        try:
            while m.in_flight > 0 and m.alive():
                if self._clock() >= deadline:
                    raise UpstreamError(
                        ErrorKind.TRANSIENT,
                        f"Cannot restart {self.name}/{m.id} with a context of {m.ctx}: "
                        f"{m.in_flight} request(s) in flight did not end in time",
                    )
                await self.next_change()
        finally:
            m.draining = False

    async def next_change(self) -> None:
        """Wait for a server to change state (a request ends, a server stops), a short while
        at most: the caller looks again either way."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), 0.25)

    def _reap_dead(self) -> None:
        for x in self._all():
            if x.server is not None and x.server.returncode is not None:
                self._reap(x)

    async def _make_room(self, target: _Model) -> None:
        """Stop servers until one more may run: the least recently used idle one first, else
        wait (keeping new requests off it) for the least recently used busy one to be idle."""
        victim: _Model | None = None
        deadline = self._clock() + self._drain_timeout
        try:
            while True:
                self._reap_dead()
                loaded = [x for x in self._all() if x.server is not None]
                if len(loaded) < self.config.max_loaded:
                    return
                idle = [x for x in loaded if x is not target and x.in_flight == 0]
                if idle:
                    await self._stop(min(idle, key=lambda x: x.last_used), f"swap for {target.id}")
                    continue
                if victim is None:
                    victim = min(loaded, key=lambda x: x.last_used)
                    victim.draining = True
                    log.info(
                        "waiting for a busy model to give its place",
                        extra={
                            "fields": {
                                "provider": self.name,
                                "model": target.id,
                                "busy": victim.id,
                                "in_flight": victim.in_flight,
                            }
                        },
                    )
                if self._clock() >= deadline:
                    busy = ", ".join(f"{x.id} ({x.in_flight} in flight)" for x in loaded)
                    raise UpstreamError(
                        ErrorKind.TRANSIENT,
                        f"Cannot load {self.name}/{target.id}: the {len(loaded)} model(s) "
                        f"provider {self.name!r} may run at once are busy: {busy}",
                    )
                await self.next_change()
        finally:
            if victim is not None:
                victim.draining = False

    async def _start(self, m: _Model) -> None:
        """Start `m`'s server and wait until it is healthy; an UpstreamError if it is not."""
        binary = self._binary
        if binary is None:
            raise UpstreamError(ErrorKind.TRANSIENT, "the managed provider is not started yet")
        spec = m.spec
        try:
            model_path = await self._model_path(spec)
            template = template_path(spec.chat_template)
        except LlamaServerError as exc:
            raise self._not_started(m, NOT_RUN, str(exc)) from None
        extra = server_args(spec)
        assert self._log_dir is not None
        log_path = self._log_dir / f"{file_name(m.id)}.log"
        started = time.perf_counter()
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if log_path.exists():  # keep the previous run's log: it may say why it died
                log_path.replace(log_path.with_suffix(".previous.log"))
            m.log_path = log_path
            try:
                # In this thread, on purpose: see the module doc.
                server = LlamaServer.start(
                    binary,
                    model_path,
                    ctx=m.ctx,
                    threads=spec.threads or 2,
                    extra_args=extra,
                    chat_template_file=template,
                    log_path=log_path,
                    own_group=True,
                )
            except LlamaServerError as exc:
                raise self._not_started(m, NOT_RUN, str(exc)) from None
            m.server, m.ready, m.loads = server, False, m.loads + 1
            m.running_ctx = m.ctx
            m.running_spec = spec
            m.file_size = file_size(model_path)
            fields: dict[str, Any] = {
                "provider": self.name,
                "model": m.id,
                "pid": server.pid,
                "port": server.port,
            }
            log.info("starting llama-server", extra={"fields": {**fields, "args": server.args}})
            try:
                await self._wait_healthy(m, server)
            except BaseException as exc:
                m.server, m.ready = None, False
                await asyncio.shield(asyncio.to_thread(server.stop, 1.0))
                if not isinstance(exc, UpstreamError):
                    raise
                tail = server.log_tail()
                # The free port was taken between choosing it and binding it: choose again.
                if BIND_FAILED in tail and attempt < BIND_ATTEMPTS:
                    fields["error"] = exc.message
                    log.warning("llama-server could not bind", extra={"fields": fields})
                    continue
                detail = f"{exc.message}: {last_lines(tail)} (log: {server.log_path})"
                raise self._not_started(m, exc.message, detail, fields) from None
            m.ready = True
            m.last_error = None
            fields["seconds"] = round(time.perf_counter() - started, 2)
            log.info("llama-server ready", extra={"fields": fields})
            self._changed.set()
            return

    async def _wait_healthy(self, m: _Model, server: LlamaServer) -> None:
        deadline = self._clock() + self.config.start_timeout
        while True:
            code = server.returncode
            if code is not None:
                m.last_exit = code
                raise UpstreamError(
                    ErrorKind.OTHER, f"llama-server exited with status {code} before it was ready"
                )
            if await asyncio.to_thread(server.health_status, 1.0) == 200:
                return
            if self._clock() >= deadline:
                raise UpstreamError(
                    ErrorKind.OTHER,
                    f"llama-server was not ready after {self.config.start_timeout:g} s "
                    "(start_timeout)",
                )
            await asyncio.sleep(0.1)

    def _not_started(
        self, m: _Model, reason: str, detail: str, fields: dict[str, Any] | None = None
    ) -> UpstreamError:
        """The client's error for a model that did not start: `reason`, in words that name no
        file of this machine (the client is not the machine's operator). `detail`, with the log's
        last lines and its path, is for svir's log and `/healthz?verbose=1`."""
        m.last_error = detail
        log.error(
            "llama-server did not start",
            extra={
                "fields": {"provider": self.name, "model": m.id, **(fields or {}), "error": detail}
            },
        )
        return UpstreamError(
            ErrorKind.OTHER, f"Cannot start {self.name}/{m.id}: {reason}; svir's log says why"
        )

    async def _model_path(self, spec: ManagedModel) -> Path:
        if spec.path != PYPI_GEMMA:
            return Path(spec.path)
        return await asyncio.shield(self._gemma_file())

    def _gemma_file(self) -> asyncio.Future[Path]:
        """The PyPI model's file, assembled once (in a thread: 250 MB and its hash take seconds
        the first time); a failure is tried again on the next request."""
        done = self._gemma is not None and self._gemma.done()
        if self._gemma is None or (
            done and (self._gemma.cancelled() or self._gemma.exception() is not None)
        ):
            self._gemma = asyncio.ensure_future(
                asyncio.to_thread(ensure_gemma_model, self._model_dir)
            )
            self._gemma.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._gemma

    async def _stop(self, m: _Model, reason: str) -> None:
        server = m.server
        if server is None:
            return
        m.server, m.ready, m.draining = None, False, False
        code = await asyncio.shield(asyncio.to_thread(server.stop, STOP_GRACE))
        log.info(
            "llama-server stopped",
            extra={
                "fields": {
                    "provider": self.name,
                    "model": m.id,
                    "pid": server.pid,
                    "reason": reason,
                    "status": code,
                }
            },
        )
        self._changed.set()

    def _reap(self, m: _Model) -> None:
        """Forget a server that exited by itself, saying so."""
        server = m.server
        if server is None or server.returncode is None:
            return
        m.server, m.ready, m.draining = None, False, False
        m.last_exit = server.stop()  # reaps it and closes the log
        m.exits += 1
        log.warning(
            "llama-server exited by itself",
            extra={
                "fields": {
                    "provider": self.name,
                    "model": m.id,
                    "pid": server.pid,
                    "status": m.last_exit,
                    "in_flight": m.in_flight,
                    "log": str(server.log_path),
                    "log_tail": last_lines(server.log_tail()),
                }
            },
        )
        self._changed.set()

    # -- the watcher -----------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            idle_unload = self.config.idle_unload  # a reload may change it
            interval = min(WATCH_INTERVAL, idle_unload / 4) if idle_unload > 0 else WATCH_INTERVAL
            await asyncio.sleep(interval)
            try:
                self._watch_once()
            except Exception:
                log.exception("managed watcher failed", extra={"fields": {"provider": self.name}})

    def _watch_once(self) -> None:
        now = self._clock()
        for m in list(self._retiring.values()):
            if m.in_flight or (m.loading is not None and m.loading.running()):
                continue
            if m.server is None:
                del self._retiring[m.id]
            elif not self._lock.locked():
                self._spawn(self._retire(m), f"retire {m.id}")
        for m in self._models.values():
            server = m.server
            if server is None or (m.loading is not None and m.loading.running()):
                continue
            if server.returncode is not None:
                in_use = m.in_flight > 0 or now - m.last_used < RECENT_USE
                self._reap(m)
                if in_use and not self._closing:
                    log.info(
                        "restarting llama-server",
                        extra={"fields": {"provider": self.name, "model": m.id}},
                    )
                    self._new_load(m, evict=False)
            elif m.stale() and m.in_flight == 0 and not self._lock.locked():
                self._spawn(self._restart_stale(m), f"restart {m.id}")
            elif (
                self.config.idle_unload > 0
                and m.in_flight == 0
                and now - m.last_used >= self.config.idle_unload
                and not self._lock.locked()
            ):
                self._spawn(self._unload_idle(m), f"unload {m.id}")

    async def _restart_stale(self, m: _Model) -> None:
        """Restart a server whose settings a reload changed, now that no request uses it."""
        async with self._lock:
            if not m.stale() or m.in_flight or (m.loading is not None and m.loading.running()):
                return
            await self._stop(m, "restart: its settings changed in the config")
        if not self._closing and m.id in self._models:
            self._new_load(m, evict=False)

    async def _retire(self, m: _Model) -> None:
        """Stop the server of a model a reload removed, now that no request uses it."""
        async with self._lock:
            if m.in_flight == 0 and self._retiring.get(m.id) is m:
                await self._stop(m, "removed from the config")
                del self._retiring[m.id]

    async def _unload_idle(self, m: _Model) -> None:
        async with self._lock:
            idle_for = self._clock() - m.last_used
            if m.server is not None and m.in_flight == 0 and idle_for >= self.config.idle_unload:
                await self._stop(m, f"idle for {idle_for:.0f} s")

    # -- state -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What runs, for `/healthz?verbose=1`."""
        now = self._clock()
        models: dict[str, Any] = {}
        for m in self._all():
            server = m.server
            if server is None:
                state = "loading" if m.loading is not None and m.loading.running() else "stopped"
            elif server.returncode is not None:
                state = "exited"
            elif not m.ready:
                state = "loading"
            else:
                state = "draining" if m.draining or m.id in self._retiring else "ready"
            models[m.id] = {
                "state": state,
                "pid": server.pid if server is not None else None,
                "port": server.port if server is not None else None,
                "in_flight": m.in_flight,
                "waiting": m.loading.waiting if m.loading is not None else 0,
                "last_used": m.last_used_wall,
                "idle_seconds": round(now - m.last_used, 1) if m.last_used_wall else None,
                "loads": m.loads,
                "unexpected_exits": m.exits,
                "last_exit": m.last_exit,
                "last_error": m.last_error,
                "log": str(m.log_path) if m.log_path is not None else None,
                "ctx": m.running_ctx if server is not None else m.ctx,
                "path": m.spec.path,
            }
        return {
            "max_loaded": self.config.max_loaded,
            "idle_unload": self.config.idle_unload,
            "loaded": [m.id for m in self._models.values() if m.alive()],
            "models": models,
        }
