"""Where svir keeps threads: the one interface (`svir.threads.records.Store`), on SQLite by default
or on PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from svir.errors import StoreError
from svir.threads.records import Store

__all__ = ["default_url", "make_store", "open_store"]


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """`sqlite:///` a file under the user's data directory: $XDG_DATA_HOME/svir/svir.db, or
    ~/.local/share/svir/svir.db."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(base):
        # The XDG spec says a relative value is invalid and is to be ignored.
        home = env.get("HOME") or str(Path.home())
        base = os.path.join(home, ".local", "share")
    return "sqlite:///" + os.path.join(base, "svir", "svir.db")


def make_store(url: str) -> Store:
    """The store a URL names, not yet opened."""
    if url.startswith("sqlite:///"):
        from svir.store.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"))
    if url.startswith(("postgresql://", "postgres://")):
        from svir.store.postgres import PostgresStore

        return PostgresStore(url)
    raise StoreError("a store URL starts with sqlite:///, postgresql:// or postgres://")


async def open_store(url: str) -> Store:
    """The store a URL names, connected and migrated."""
    store = make_store(url)
    await store.open()
    return store
