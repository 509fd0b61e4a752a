"""Where svir keeps threads, keys and the usage ledger: the one interface
(`svir.threads.records.Store`), on SQLite by default or on PostgreSQL.

Without `[store] url` the store's place follows the config (docs/threads.md, "Where"): svir run
without a config file keeps `$XDG_DATA_HOME/svir/svir.db` (as it always did), and each config
file gets its own `$XDG_DATA_HOME/svir/configs/<name>-<hash of its path>.db`, so that a key issued
for one config does not turn keys on for every other.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from svir.errors import StoreError
from svir.threads.records import Store

if TYPE_CHECKING:
    from svir.config.model import Config

__all__ = [
    "default_url",
    "make_store",
    "open_store",
    "sqlite_path",
    "store_url",
    "with_store_url",
]

SQLITE = "sqlite:///"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _data_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(base):
        # The XDG spec says a relative value is invalid and is to be ignored.
        home = env.get("HOME") or str(Path.home())
        base = os.path.join(home, ".local", "share")
    return os.path.join(base, "svir")


def default_url(
    environ: Mapping[str, str] | None = None, config_path: str | os.PathLike[str] | None = None
) -> str:
    """`sqlite:///` a file under the user's data directory: without a config file
    $XDG_DATA_HOME/svir/svir.db (or ~/.local/share/svir/svir.db); for the config file at
    `config_path`, `configs/<its name>-<12 hex digits of its absolute path's SHA-256>.db` there.

    The path as named, not resolved through symlinks: a Kubernetes config map swaps its
    `..data` link on every update, and the store must not move with it."""
    env = os.environ if environ is None else environ
    base = _data_dir(env)
    if config_path is None:
        return SQLITE + os.path.join(base, "svir.db")
    named = os.path.abspath(config_path)
    name = _UNSAFE.sub("_", Path(named).stem) or "config"
    digest = hashlib.sha256(named.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return SQLITE + os.path.join(base, "configs", f"{name}-{digest}.db")


def store_url(config: Config, environ: Mapping[str, str] | None = None) -> str:
    """The store a config names: its `[store] url`, else the default one (`default_url`)."""
    return config.store.url or default_url(environ)


def sqlite_path(url: str) -> str | None:
    """The file a `sqlite:///` URL names, else None."""
    return url.removeprefix(SQLITE) if url.startswith(SQLITE) else None


def with_store_url(
    config: Config,
    config_path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Config, str | None]:
    """`config` with `[store] url` filled in when it was left empty (`default_url` for
    `config_path`, None: no config file), and a warning when that leaves data behind: a config
    file's new store that does not exist yet while the shared one of earlier svir versions does.
    Nothing is moved: that store stays where it is, and svir without a config keeps using it."""
    if config.store.url:
        return config, None
    url = default_url(environ, config_path)
    config = msgspec.structs.replace(config, store=msgspec.structs.replace(config.store, url=url))
    warning = None
    path = sqlite_path(url)
    shared = sqlite_path(default_url(environ))
    if config_path is not None and path and shared and not os.path.exists(path):
        if os.path.exists(shared):
            warning = (
                f"this config's store is now {path} (each config file has its own); the store"
                f" {shared} that every svir used before stays as it is, and is still the one of"
                f" svir without a config. To keep using it with this config, set [store] url ="
                f' "{SQLITE}{shared}" in {config_path}'
            )
    return config, warning


def make_store(url: str) -> Store:
    """The store a URL names, not yet opened."""
    path = sqlite_path(url)
    if path is not None:
        from svir.store.sqlite import SqliteStore

        return SqliteStore(path)
    if url.startswith(("postgresql://", "postgres://")):
        from svir.store.postgres import PostgresStore

        return PostgresStore(url)
    raise StoreError("a store URL starts with sqlite:///, postgresql:// or postgres://")


async def open_store(url: str) -> Store:
    """The store a URL names, connected and migrated."""
    store = make_store(url)
    await store.open()
    return store
