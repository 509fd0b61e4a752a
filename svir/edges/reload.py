"""Config reload without a restart: on SIGHUP, on a change of the config file, and on
`POST /admin/reload`.

The whole new file is read and checked first; an invalid one changes nothing and is reported (a
log line, `/healthz?verbose=1`'s "reload", the admin answer). A valid one is applied as a diff
(svir.config_diff) in one step with no await in it, so that no request sees half of it: the
router's table is swapped whole (a call opened before keeps the one it started with, to its
end), the learned state of changed servers is dropped and the rest carries on, managed
providers are added, reconfigured (a model's server restarts only when its own settings changed,
once its requests end) or retired. Fields a running svir cannot change (where it listens, the
store, the limits backend, auth, telemetry, the ledger, capture) keep their old values and are
reported as needing a restart.

The file is watched by polling its stat and real path once a second (`fingerprint`): a
Kubernetes config map swaps a `..data` symlink, and a watch on the file's inode would not see
that; two system calls a second cost nothing, and need no dependency. With several workers each
worker watches the file itself; `svir serve`'s parent forwards SIGHUP to every worker; the
admin endpoint reloads the worker that got the request and sends SIGHUP to the parent, so that
every worker reloads too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from svir.asgi import Receive, Scope, Send
from svir.config.load import check_keys, load_config
from svir.config.model import Config
from svir.config_diff import diff_configs, effective
from svir.edges.app import App
from svir.edges.keys_service import admin_access
from svir.errors import ConfigError, LlamaServerError
from svir.policy.routing import RoutingTable
from svir.protocols.http import send_json

if TYPE_CHECKING:
    from svir.edges.keys_service import KeysService
    from svir.edges.managed.install import Managed

__all__ = ["POLL_SECONDS", "Reloader", "fingerprint", "install"]

log = logging.getLogger("svir.reload")

# How often the config file's stat is read.
POLL_SECONDS = 1.0

# What identifies the file's content without reading it: its real path (a swapped symlink),
# device, inode (a file replaced by rename), modification time and size (one edited in place).
Fingerprint = tuple[str, int, int, int, int]


def fingerprint(path: str) -> Fingerprint | None:
    """The file at `path` as `Fingerprint` says, following symlinks; None when it is not there."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return (real, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class Outcome:
    """What one reload did: the admin endpoint's answer."""

    ok: bool
    changed: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()
    error: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "changed": list(self.changed),
            "restart_needed": list(self.restart_needed),
            "error": self.error,
        }


class Reloader:
    """Reloads `app`'s config from `source` (None: svir runs without a file, and nothing
    reloads). `check` refuses a config this process cannot serve (managed providers under
    several workers); `managed` and `keys` get their part of each reload."""

    def __init__(
        self,
        app: App,
        source: str | None,
        *,
        managed: Managed | None = None,
        keys: KeysService | None = None,
        check: Callable[[Config], str | None] | None = None,
        workers: int = 1,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.app = app
        self.source = os.path.abspath(source) if source else None
        self.managed = managed
        self.keys = keys
        self.check = check
        self.workers = workers
        self.poll_seconds = poll_seconds
        # Whether start-up watches the file and takes SIGHUP (`svir serve` sets them; a test's
        # in-process app reloads when it asks).
        self.watch_file = False
        self.take_sighup = False
        self.generation = 0
        self.last_attempt: float | None = None
        self.last_success: float | None = None
        self.trigger: str | None = None
        self.error: str | None = None
        self.changed: tuple[str, ...] = ()
        self.restart_needed: tuple[str, ...] = ()
        # The file as it was when last read (the watcher reloads when it differs).
        self._seen = fingerprint(self.source) if self.source else None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sighup = False

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The reload state, for `/healthz?verbose=1` and the console's `/admin/config`."""
        return {
            "source": self.source,
            "generation": self.generation,
            "trigger": self.trigger,
            "last_attempt": self.last_attempt,
            "last_success": self.last_success,
            "error": self.error,
            "changed": list(self.changed),
            "restart_needed": list(self.restart_needed),
        }

    def health(self) -> dict[str, Any]:
        return {"reload": self.status()}

    # -- the reload ------------------------------------------------------------------------

    async def reload(self, trigger: str) -> Outcome:
        """Read the file, check it whole, and apply it as a diff (see the module doc); one
        reload at a time. `trigger` says what asked ("SIGHUP", "file", "admin")."""
        if self.source is None:
            message = (
                "svir runs without a config file (the default config): there is nothing to"
                " reload; start it with --config FILE to reload that file"
            )
            log.warning(f"config reload ({trigger}): {message}")
            return Outcome(False, error=message)
        async with self._lock:
            return await self._reload(self.source, trigger)

    async def _reload(self, source: str, trigger: str) -> Outcome:
        self.last_attempt = time.time()
        self.trigger = trigger
        self._seen = fingerprint(source)
        environ = self.app.environ
        try:
            new = load_config(source)
            refusal = self.check(new) if self.check is not None else None
            if refusal is not None:
                raise ConfigError(source, "providers", refusal)
            old = self.app.config
            if not new.store.url:
                # The store svir chose at start (the default one depends on the file's real
                # path, which a swapped symlink changes): unset still means that one.
                new = msgspec.structs.replace(
                    new, store=msgspec.structs.replace(new.store, url=old.store.url)
                )
            diff = diff_configs(old, new)
            config = effective(old, new)
            added = await self.managed.prepare(config) if self.managed is not None else {}
        except (ConfigError, LlamaServerError) as exc:
            self.error = str(exc)
            log.error(
                f"config reload failed ({trigger}), nothing changed: {exc}",
                extra={"fields": {"source": source, "trigger": trigger, "error": str(exc)}},
            )
            return Outcome(False, error=self.error)
        # The swap: no await from here to the end, so that no request sees half of it.
        self.app.take_secrets(config)
        hooks = self.managed.hooks(config, added) if self.managed is not None else {}
        table = RoutingTable.build(config, environ, hooks)
        self.app.config = config
        self.app.gateway.reconfigure(config, table, diff)
        self.app.catalog.forget(diff.fresh_deployments())
        if self.managed is not None:
            self.managed.commit(config, added)
        if self.keys is not None and old.prices != config.prices:
            self.keys.gate.set_prices(config.prices)
        self.generation += 1
        self.last_success = self.last_attempt
        self.error = None
        self.changed = diff.changed
        self.restart_needed = diff.restart_needed
        said = ", ".join(diff.changed) or "nothing changed"
        message = f"config reloaded ({trigger}) from {source}: {said}"
        if diff.restart_needed:
            message += f"; these apply only after a restart: {', '.join(diff.restart_needed)}"
        (log.warning if diff.restart_needed else log.info)(
            message,
            extra={
                "fields": {
                    "source": source,
                    "trigger": trigger,
                    "generation": self.generation,
                    "changed": list(diff.changed),
                    "restart_needed": list(diff.restart_needed),
                }
            },
        )
        added_names = diff.providers_added | diff.providers_changed
        for warning in check_keys(config, environ):
            if any(f"provider {name!r}" in warning for name in added_names):
                log.warning(warning)
        return Outcome(True, diff.changed, diff.restart_needed)

    # -- triggers --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching the file and take SIGHUP, as `svir serve` asked (App start-up)."""
        if self.take_sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True
        if self.watch_file and self.source is not None:
            self._spawn(self._watch(self.source), "svir-reload-watch")

    async def stop(self) -> None:
        if self._sighup:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                # Ignored again, as before start-up: its default would end the process.
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
            self._sighup = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_sighup(self) -> None:
        self._spawn(self.reload("SIGHUP"), "svir-reload-sighup")

    def _spawn(self, work: Awaitable[Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, source: str) -> None:
        """Reload when the file's fingerprint differs from the one last read and has held for
        one poll (an editor that writes in two steps is not read half-way)."""
        pending: Fingerprint | None = None
        while True:
            await asyncio.sleep(self.poll_seconds)
            now = fingerprint(source)
            if now is None or now == self._seen:
                pending = None
                continue
            if now != pending:
                pending = now
                continue
            pending = None
            try:
                await self.reload("file")
            except Exception:  # svir's own failure: said, and the watch goes on
                log.exception("config reload failed unexpectedly")

    # -- POST /admin/reload ----------------------------------------------------------------

    async def admin_reload(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        """Reload now: 200 with {"ok": true, "changed", "restart_needed", "error": null}, or 422
        with "ok": false and the error (nothing changed). With several workers, the others
        are sent the signal too (through `svir serve`'s parent)."""
        admin_access(scope)  # the admin rule, which ran before any /admin/ route: its verdict
        outcome = await self.reload("admin")
        if outcome.ok and self.workers > 1:
            with contextlib.suppress(OSError):
                os.kill(os.getppid(), signal.SIGHUP)
        status = 200 if outcome.ok else 422
        await send_json(send, status, outcome.body(), {"x-request-id": rid})
        return status


async def _logged(work: Awaitable[Any]) -> None:
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("config reload failed unexpectedly")


def install(
    app: App,
    source: str | None,
    *,
    managed: Managed | None = None,
    keys: KeysService | None = None,
    check: Callable[[Config], str | None] | None = None,
    workers: int = 1,
    watch: bool = False,
) -> Reloader:
    """Put config reloads on `app`: `POST /admin/reload`, the "reload" of
    `/healthz?verbose=1` (and `App.reload_status`), and with `watch` (`svir serve`) the file
    watch and SIGHUP."""
    reloader = Reloader(app, source, managed=managed, keys=keys, check=check, workers=workers)
    reloader.watch_file = reloader.take_sighup = watch
    app.reload_state = reloader.status
    app.routes.add("POST", "/admin/reload", reloader.admin_reload)
    app.health_extras.append(reloader.health)
    app.on_startup(reloader.start)
    app.on_shutdown(reloader.stop)
    return reloader
