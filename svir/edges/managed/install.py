"""An app's managed providers: one `Supervisor` each (`install`), added, reconfigured and retired
by a config reload (`Managed.prepare`, then `Managed.commit`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from svir.config.model import (
    MANAGED_KIND,
    Config,
    ProviderConfig,
)
from svir.edges.managed.supervisor import Supervisor
from svir.policy.routing import Hooks

if TYPE_CHECKING:
    from svir.edges.app import App

__all__ = ["Managed", "install"]


class Managed:
    """The supervisors of an app, by provider name; a config reload adds, reconfigures and
    retires them (`prepare`, then `commit`)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.supervisors: dict[str, Supervisor] = {}
        # Supervisors of providers a reload removed: closed once their requests end.
        self._retiring: dict[Supervisor, asyncio.Task[None]] = {}

    def add(self, provider: ProviderConfig) -> Supervisor:
        """A supervisor for `provider`, its requests routed through it (not started)."""
        sup = Supervisor(provider)
        self.supervisors[provider.name] = sup
        self.app.router.set_ensure(provider.name, sup.ensure, sup.release, sup.unload)
        self.app.catalog.set_runtime(provider.name, sup)
        return sup

    async def start(self) -> None:
        for sup in list(self.supervisors.values()):
            await sup.start()

    async def close(self) -> None:
        retiring = list(self._retiring)
        for task in self._retiring.values():
            task.cancel()
        await asyncio.gather(*self._retiring.values(), return_exceptions=True)
        await asyncio.gather(*(s.close() for s in [*self.supervisors.values(), *retiring]))

    async def prepare(self, config: Config) -> dict[str, Supervisor]:
        """Started supervisors for the managed providers `config` adds (not serving yet: see
        `commit`). Raises LlamaServerError, with none left running, when one cannot start."""
        new: dict[str, Supervisor] = {}
        try:
            for provider in config.providers:
                if provider.kind == MANAGED_KIND and provider.name not in self.supervisors:
                    sup = new[provider.name] = Supervisor(provider)
                    await sup.start()
        except BaseException:
            await asyncio.gather(*(s.close() for s in new.values()), return_exceptions=True)
            raise
        return new

    def hooks(self, config: Config, new: dict[str, Supervisor]) -> dict[str, Hooks]:
        """The ensure/release/unload of every managed provider of `config`, once committed."""
        out: dict[str, Hooks] = {}
        for provider in config.providers:
            if provider.kind == MANAGED_KIND:
                sup = new.get(provider.name) or self.supervisors[provider.name]
                out[provider.name] = (sup.ensure, sup.release, sup.unload)
        return out

    def commit(self, config: Config, new: dict[str, Supervisor]) -> list[str]:
        """Serve `config`'s managed providers (no await: part of a reload's one swap): the new
        supervisors from `prepare` join, the others take their new settings, and those of
        removed providers close once their requests end. Returns what restarts."""
        restarting: list[str] = []
        wanted = {p.name: p for p in config.providers if p.kind == MANAGED_KIND}
        for name in [n for n in self.supervisors if n not in wanted]:
            self.app.catalog.set_runtime(name, None)
            self._retire(self.supervisors.pop(name))
        for name, provider in wanted.items():
            added = new.get(name)
            if added is not None:
                self.supervisors[name] = added
            else:
                restarting += [f"{name}/{m}" for m in self.supervisors[name].reconfigure(provider)]
            self.app.catalog.set_runtime(name, self.supervisors[name])
        return restarting

    def _retire(self, sup: Supervisor) -> None:
        """Close `sup` once no request uses it (or at shutdown)."""

        async def retire() -> None:
            while not sup.idle():
                await sup.next_change()
            await sup.close()

        task = asyncio.get_running_loop().create_task(retire(), name=f"retire {sup.name}")
        self._retiring[sup] = task
        task.add_done_callback(lambda _: self._retiring.pop(sup, None))

    def snapshot(self) -> dict[str, Any]:
        if not self.supervisors:
            return {}
        return {"managed": {name: s.snapshot() for name, s in self.supervisors.items()}}


def install(app: App) -> Managed:
    """Run the servers of every managed provider of `app`: requests to them ensure their
    model first; the servers stop when the app shuts down."""
    managed = Managed(app)
    for provider in app.config.providers:
        if provider.kind == MANAGED_KIND:
            managed.add(provider)
    app.on_startup(managed.start)
    app.on_shutdown(managed.close)
    app.health_extras.append(managed.snapshot)
    return managed
