"""Migration 2 (keys and the usage ledger) on a store that an older svir made at version 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from svir.keys.model import KeySpec
from svir.keys.store import KeyStore
from svir.store import make_store, migrations
from svir.store.base import SqlStore
from tests.keys.conftest import Postgres


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.url()


async def test_upgrade_from_version_one(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = {d: m[:1] for d, m in migrations.MIGRATIONS.items()}
    monkeypatch.setattr(migrations, "MIGRATIONS", first)
    old = make_store(url)
    await old.open()
    assert await old.schema_version() == 1
    await old.create_thread("someone", "thread-1", model=None, system=None, metadata={})
    await old.close()
    monkeypatch.undo()

    store = make_store(url)
    assert isinstance(store, SqlStore)
    await store.open()
    try:
        assert await store.schema_version() == 2
        assert (await store.get_thread("someone", "thread-1")).id == "thread-1"
        keys = KeyStore(store)
        assert not await keys.configured()
        record, _ = await keys.create(KeySpec(name="after the upgrade"))
        assert await keys.configured() and (await keys.get(record.id)) == record
    finally:
        await store.close()
