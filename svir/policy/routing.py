"""Routing by model prefix, and the model catalog that `/v1/models` lists.

A model name is `<provider>/<model-id>`: the provider's name picks where the request goes and the
rest is the id that server knows. The catalog joins each provider's configured models with what
its server lists, keeps chat models only (§6), and caches the result for a while; a server that
cannot be reached drops out of the list without failing the request (and is logged). A model a
server lists by its file path (llama-server's GGUF path) is listed by the file's stem, and the
stem routes to the path, which also still routes as it is.

The models the config names or a server listed are the known ones (`known`): state svir keeps per
model is held for them, and for at most `[server] max_unlisted_models` others (`bounded`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from svir.chat import UpstreamTarget
from svir.config.model import Config, ProviderConfig, RouteConfig, Timeouts
from svir.errors import BadRequest, request_error
from svir.policy.bounded import BoundedMap
from svir.providers import ProviderKind, get_kind, split_model
from svir.transport import Network, Transport, network_of
from svir.wire.errors import ProtocolError, UpstreamError
from svir.wire.models import ModelInfo, clean_model_id, is_chat_model, parse_model_list
from svir.wire.proxy import rules_from_env

log = logging.getLogger("svir.routing")

DISCOVERY_TIMEOUT = 5.0
FAILED_RETRY = 5.0
# Resolved routes kept (per model name asked for) before the memo starts over.
ROUTES_KEPT = 4096

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Provider:
    config: ProviderConfig
    kind: ProviderKind
    base_url: str
    api_key: str | None
    timeouts: Timeouts
    ensure: Callable[[str], Awaitable[str]] | None = None
    release: Callable[[str], None] | None = None
    unload: Callable[[str], Awaitable[bool]] | None = None
    network: Network | None = None


# A managed provider's ensure, release and unload (`Router.set_ensure`).
Hooks = tuple[
    Callable[[str], Awaitable[str]] | None,
    Callable[[str], None] | None,
    Callable[[str], Awaitable[bool]] | None,
]


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """What one config says of routing: providers and routes by name, the model names it names
    (`Router.known`), and how long a model list is cached. A config reload builds a new table
    and swaps it in whole (`Router.table`): a call that captured the old one goes on with it."""

    providers: Mapping[str, Provider]
    routes: Mapping[str, RouteConfig]
    named: frozenset[str]
    ttl: float

    @classmethod
    def build(
        cls,
        config: Config,
        environ: Mapping[str, str],
        hooks: Mapping[str, Hooks] | None = None,
    ) -> RoutingTable:
        """The table of `config`; `hooks` are the ensure/release/unload of providers whose
        servers svir runs (by provider name, see `Router.set_ensure`)."""
        providers: dict[str, Provider] = {}
        # Read once: every provider that follows the environment's proxies shares these.
        env_rules = rules_from_env(environ)
        for p in config.providers:
            ensure, release, unload = (hooks or {}).get(p.name, (None, None, None))
            providers[p.name] = Provider(
                config=p,
                kind=get_kind(p.kind),
                base_url=p.base_url,
                api_key=p.api_key(environ),
                timeouts=p.timeouts,
                ensure=ensure,
                release=release,
                unload=unload,
                network=network_of(p, env_rules, environ),
            )
        named = {m for p in config.providers for m in (f"{p.name}/{i}" for i in p.models)}
        for r in config.routes:
            named.add(r.name)
            named.update(t.model for t in r.targets)
            named.update(r.fallbacks)
            if r.context_fallback:
                named.add(r.context_fallback)
        return cls(
            providers=providers,
            routes={r.name: r for r in config.routes},
            named=frozenset(named),
            ttl=config.server.models_cache_ttl,
        )


class Router:
    """Providers by name, and the routes and model list built from them."""

    def __init__(
        self,
        config: Config,
        environ: Mapping[str, str],
        client: Transport,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._clock = clock
        # Everything the config says, swapped whole by a reload (`reconfigure`).
        self.table = RoutingTable.build(config, environ)
        self._cache: dict[str, tuple[float, list[str]]] = {}
        # Read once at start: the bounded maps made with it keep their bound.
        self.max_unlisted = config.server.max_unlisted_models
        # What each server listed when it last answered: an outage does not unlist its models.
        self._listed: dict[str, frozenset[str]] = {}
        # What each server said of its models when it last listed them (svir.policy.catalog).
        self._infos: dict[str, dict[str, ModelInfo]] = {}
        # Per provider, the clean ids of models its server lists by file path -> that path.
        self._aliases: dict[str, dict[str, str]] = {}
        # The routes resolved so far (an UpstreamTarget is immutable and the same for every request
        # to its model): forgotten whenever what makes one changes (a provider's hooks, its
        # aliases).
        self._routes: dict[str, UpstreamTarget] = {}

    @property
    def providers(self) -> Mapping[str, Provider]:
        return self.table.providers

    @property
    def ttl(self) -> float:
        return self.table.ttl

    def reconfigure(self, table: RoutingTable, forget: Iterable[str]) -> None:
        """Serve `table` from now on (one swap: a call that resolved with the old table keeps
        it), and forget what the servers of the providers in `forget` listed (they changed)."""
        self.table = table
        self._routes.clear()
        for name in forget:
            self._cache.pop(name, None)
            self._listed.pop(name, None)
            self._infos.pop(name, None)
            self._aliases.pop(name, None)

    def known(self, model: str) -> bool:
        """Whether the config names `model` (as a provider's model or in a route) or its server
        listed it: the names whose state is held however many others clients invent."""
        if model in self.table.named:
            return True
        prefix, _, model_id = model.partition("/")
        listed = self._listed.get(prefix)
        return listed is not None and model_id in listed

    def bounded(self, idle: Callable[[V], bool] | None = None) -> BoundedMap[str, V]:
        """A map for state per model name: the known ones and `max_unlisted` others."""
        return BoundedMap(self.max_unlisted, keep=self.known, idle=idle)

    def set_ensure(
        self,
        name: str,
        ensure: Callable[[str], Awaitable[str]],
        release: Callable[[str], None] | None = None,
        unload: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """Have requests to provider `name` first call `ensure(model_id)` for the base URL
        (a server svir starts itself), and `release(model_id)` when a call that ensure served
        closes; `unload(model_id)` stops a model's server on a client's word."""
        table = self.table
        provider = replace(table.providers[name], ensure=ensure, release=release, unload=unload)
        self.table = replace(table, providers={**table.providers, name: provider})
        self._routes.clear()

    def resolve(self, model: str, table: RoutingTable | None = None) -> UpstreamTarget:
        """The route for a `<provider>/<model-id>` name, or a 404 naming what exists (also for
        a model a provider of closed models does not have); by `table` when given (the one a
        call started with), else the current one. The current table's routes are kept once
        resolved (an UpstreamTarget is immutable), an older table's are resolved anew."""
        if table is not None and table is not self.table:
            return self._resolve(model, table)
        route = self._routes.get(model)
        if route is None:
            route = self._resolve(model, self.table)
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()  # invented model ids cannot make it grow
            self._routes[model] = route
        return route

    def _resolve(self, model: str, table: RoutingTable) -> UpstreamTarget:
        try:
            prefix, model_id = split_model(model)
        except BadRequest:
            prefix, model_id = "", ""
        providers = table.providers
        provider = providers.get(prefix)
        if provider is None or not model_id:
            known = ", ".join(sorted(providers)) or "none configured"
            raise request_error(
                f"The model {model!r} does not exist: ask for <provider>/<model-id> with one "
                f"of these providers: {known}",
                status=404,
                code="model_not_found",
                param="model",
            )
        model_id = self._aliases.get(prefix, {}).get(model_id, model_id)
        if provider.kind.closed_models and model_id not in provider.config.models:
            raise request_error(
                f"The model {model!r} does not exist: provider {prefix!r} serves "
                f"{', '.join(provider.config.models) or 'no model'}",
                status=404,
                code="model_not_found",
                param="model",
            )
        return UpstreamTarget(
            provider=provider.config,
            kind=provider.kind,
            model_id=model_id,
            base_url=provider.base_url,
            api_key=provider.api_key,
            timeouts=provider.timeouts,
            ensure=provider.ensure,
            release=provider.release,
            unload=provider.unload,
            network=provider.network,
        )

    async def models(self) -> list[tuple[str, str]]:
        """(model name with prefix, provider name) for every chat model, providers in order."""
        providers = self.table.providers
        lists = await asyncio.gather(*(self._models_of(p) for p in providers.values()))
        out: list[tuple[str, str]] = []
        for provider, ids in zip(providers.values(), lists, strict=True):
            name = provider.config.name
            out.extend((f"{name}/{model_id}", name) for model_id in ids)
        return out

    async def _models_of(self, provider: Provider) -> list[str]:
        name = provider.config.name
        now = self._clock()
        cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        ids = list(provider.config.models or ())
        if provider.kind.discover_for(provider.config):
            try:
                body = await self.client.get_json_bytes(
                    provider.kind.models_url(provider.base_url, provider.config),
                    headers=provider.kind.auth_headers(provider.api_key)
                    if provider.api_key
                    else {},
                    timeout=DISCOVERY_TIMEOUT,
                    network=provider.network,
                )
                if not self._current(provider):
                    return ids  # the config changed meanwhile: what this server said is moot
                aliases: dict[str, str] = {}
                infos = parse_model_list(body)
                for info in infos:
                    clean = clean_model_id(info.id)
                    listed = info.id if clean is None or clean in ids else clean
                    if listed not in ids and is_chat_model(listed, info.name):
                        ids.append(listed)
                        if listed != info.id:
                            aliases[listed] = info.id
                if aliases != self._aliases.get(name):
                    self._routes.clear()
                self._aliases[name] = aliases
                self._infos[name] = {info.id: info for info in infos}
            except (UpstreamError, ProtocolError) as exc:
                # An unreachable server drops out of the list; configured models stay.
                url = provider.kind.models_url(provider.base_url, provider.config)
                log.warning(
                    f"provider {name!r}: could not list its models at {url}, so /v1/models"
                    f" leaves its server's models out ({exc})",
                    extra={"fields": {"provider": name, "url": url, "error": str(exc)}},
                )
                # Ask again soon rather than after the whole TTL.
                self._cache[name] = (now - self.ttl + min(FAILED_RETRY, self.ttl), ids)
                return ids
        self._cache[name] = (now, ids)
        self._listed[name] = frozenset(ids) | frozenset(self._aliases.get(name, {}).values())
        return ids

    def _current(self, provider: Provider) -> bool:
        """Whether `provider` is still configured as it was (no reload changed it)."""
        now = self.table.providers.get(provider.config.name)
        return now is not None and (now is provider or now.config == provider.config)

    async def listed_info(self, provider: str, model_id: str) -> ModelInfo | None:
        """What `provider`'s server said of `model_id` in its model list (the cached list,
        fetched if stale), or None."""
        found = self.providers.get(provider)
        if found is None:
            return None
        await self._models_of(found)
        listed = self._aliases.get(provider, {}).get(model_id, model_id)
        return self._infos.get(provider, {}).get(listed)
