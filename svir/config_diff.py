"""What changed between two configs, and what a running svir does about it (a config reload,
svir.edges.reload): which providers and routes came, went or changed, which managed models'
servers must restart, whose learned state no longer holds, and which fields apply only after a
restart (the rest apply live).

Pure: two checked `Config`s in, a `ConfigDiff` out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from svir.config.model import Config, ProviderConfig

__all__ = ["LIVE_SERVER_FIELDS", "SERVER_IDENTITY", "ConfigDiff", "diff_configs", "effective"]

# The fields of a provider that say which server it is and how svir speaks to it: when one
# changes, what svir learned of the old server (breakers, learned quirks, retry budget, listed
# models) no longer holds. Any other field (timeouts, retry, breaker thresholds, models...) applies
# to new calls and keeps that state. The way there (proxy, TLS trust, client certificate) counts:
# what failed through a wrong proxy or CA says nothing of the server once they are fixed.
SERVER_IDENTITY: Final = (
    "kind",
    "base_url",
    "api_key_env",
    "api_version",
    "extra_headers",
    "proxy",
    "proxy_env",
    "ca_file",
    "client_cert",
    "client_key",
)
# `[server]` fields a running svir takes at once; every other one is read once at start.
LIVE_SERVER_FIELDS: Final = frozenset({"models_cache_ttl"})
# Whole sections that apply live (besides [[providers]] and [[routes]]).
LIVE_SECTIONS: Final = frozenset({"providers", "routes", "prices"})


@dataclass(frozen=True)
class ConfigDiff:
    """The changes from one config to the next, as a person reads them (`changed`, one entry a
    change: `<where>: <what>`) and as the reload applies them."""

    changed: tuple[str, ...] = ()
    # Dotted fields that differ but take effect only after a restart (svir keeps the old value).
    restart_needed: tuple[str, ...] = ()
    providers_added: frozenset[str] = frozenset()
    providers_removed: frozenset[str] = frozenset()
    # Same name, some field differs (caches of what its server listed are dropped).
    providers_changed: frozenset[str] = frozenset()
    # Same name, another server (`SERVER_IDENTITY`): its breakers and quirks start afresh.
    servers_changed: frozenset[str] = frozenset()
    # Managed provider -> its models whose server must restart (command, model file, context...),
    # and those removed; a model's deployment state starts afresh with its new server.
    managed_restart: dict[str, frozenset[str]] = field(default_factory=dict)
    managed_removed: dict[str, frozenset[str]] = field(default_factory=dict)

    def fresh_deployments(self) -> set[str]:
        """`<provider>/<model-id>` prefixes and names whose breaker state must not carry over:
        every model of a provider gone or of another server (`<provider>/`), and each managed
        model that restarts or is gone."""
        out = {f"{p}/" for p in self.providers_removed | self.servers_changed}
        for p, models in (*self.managed_restart.items(), *self.managed_removed.items()):
            out.update(f"{p}/{m}" for m in models)
        return out


def diff_configs(old: Config, new: Config) -> ConfigDiff:
    """What changed from `old` to `new` (both checked, as `load_config` returns them)."""
    changed: list[str] = []
    old_p = {p.name: p for p in old.providers}
    new_p = {p.name: p for p in new.providers}
    added = frozenset(new_p.keys() - old_p.keys())
    removed = frozenset(old_p.keys() - new_p.keys())
    changed.extend(f"providers.{n}: added" for n in sorted(added))
    changed.extend(f"providers.{n}: removed" for n in sorted(removed))
    provider_changed: set[str] = set()
    servers: set[str] = set()
    restart: dict[str, frozenset[str]] = {}
    gone: dict[str, frozenset[str]] = {}
    for name in sorted(old_p.keys() & new_p.keys()):
        a, b = old_p[name], new_p[name]
        if a == b:
            continue
        provider_changed.add(name)
        fields = _fields_changed(a, b, skip=("managed",))
        if any(f.partition(".")[0] in SERVER_IDENTITY for f in fields):
            servers.add(name)
        changed.extend(f"providers.{name}.{f}: changed" for f in fields)
        if a.managed != b.managed:
            r, g, lines = _managed_changes(name, a, b)
            if r:
                restart[name] = r
            if g:
                gone[name] = g
            changed.extend(lines)
    old_r = {r.name: r for r in old.routes}
    new_r = {r.name: r for r in new.routes}
    changed.extend(f"routes.{n}: added" for n in sorted(new_r.keys() - old_r.keys()))
    changed.extend(f"routes.{n}: removed" for n in sorted(old_r.keys() - new_r.keys()))
    for name in sorted(old_r.keys() & new_r.keys()):
        changed.extend(
            f"routes.{name}.{f}: changed" for f in _fields_changed(old_r[name], new_r[name])
        )
    if old.prices != new.prices:
        changed.append("prices: changed")
    for f in _fields_changed(old.server, new.server):
        if f in LIVE_SERVER_FIELDS:
            changed.append(f"server.{f}: changed")
    return ConfigDiff(
        changed=tuple(changed),
        restart_needed=tuple(_restart_needed(old, new)),
        providers_added=added,
        providers_removed=removed,
        providers_changed=frozenset(provider_changed),
        servers_changed=frozenset(servers),
        managed_restart=restart,
        managed_removed=gone,
    )


def effective(old: Config, new: Config) -> Config:
    """The config a running svir serves after reloading `new` over `old`: `new`, but with every
    field that needs a restart kept at its value in `old` (what still runs)."""
    server = msgspec.structs.replace(
        old.server, **{f: getattr(new.server, f) for f in LIVE_SERVER_FIELDS}
    )
    kept: dict[str, Any] = {
        f: getattr(old, f) for f in new.__struct_fields__ if f not in LIVE_SECTIONS
    }
    kept["server"] = server
    return msgspec.structs.replace(new, **kept)


def _restart_needed(old: Config, new: Config) -> list[str]:
    out: list[str] = []
    for section in new.__struct_fields__:
        if section in LIVE_SECTIONS:
            continue
        a, b = getattr(old, section), getattr(new, section)
        if a == b:
            continue
        skip = tuple(LIVE_SERVER_FIELDS) if section == "server" else ()
        out.extend(f"{section}.{f}" for f in _fields_changed(a, b, skip=skip))
    return out


def _fields_changed(a: Any, b: Any, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The fields of two structs of one type that differ, dotted one level into nested
    structs (`timeouts.first_byte`)."""
    out: list[str] = []
    for f in a.__struct_fields__:
        if f in skip:
            continue
        x, y = getattr(a, f), getattr(b, f)
        if x == y:
            continue
        if isinstance(x, msgspec.Struct) and type(x) is type(y):
            out.extend(f"{f}.{inner}" for inner in _fields_changed(x, y))
        else:
            out.append(f)
    return out


def _managed_changes(
    name: str, a: ProviderConfig, b: ProviderConfig
) -> tuple[frozenset[str], frozenset[str], list[str]]:
    """The models of managed provider `name` whose server must restart, those removed, and the
    lines saying so (with the provider-wide settings that changed)."""
    lines: list[str] = []
    ma, mb = a.managed, b.managed
    if ma is None or mb is None:  # a kind change: another server, its supervisor comes or goes
        return frozenset(), frozenset(), lines
    where = f"providers.{name}.managed"
    for f in ("idle_unload", "max_loaded", "start_timeout"):
        if getattr(ma, f) != getattr(mb, f):
            lines.append(f"{where}.{f}: changed")
    restart: set[str] = set()
    for model_id in sorted(mb.models.keys() - ma.models.keys()):
        lines.append(f"{where}.models.{model_id}: added")
    removed = frozenset(ma.models.keys() - mb.models.keys())
    for model_id in sorted(removed):
        lines.append(f"{where}.models.{model_id}: removed (its server stops once idle)")
    for model_id in sorted(ma.models.keys() & mb.models.keys()):
        sa, sb = ma.model(model_id), mb.model(model_id)
        assert sa is not None and sb is not None
        fields = _fields_changed(sa, sb)
        if fields:
            restart.add(model_id)
            lines.append(
                f"{where}.models.{model_id}: {', '.join(fields)} changed"
                " (its server restarts once its requests end)"
            )
    return frozenset(restart), removed, lines
