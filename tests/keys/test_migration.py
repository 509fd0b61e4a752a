"""Migrations 2 (keys and the usage ledger), 3 (the client's user in the ledger) and 4 (stored
responses and svir's secrets) on stores that an older svir made at versions 1, 2 and 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from svir.keys.model import KeySpec
from svir.ledger import Ledger
from svir.store import make_store, migrations
from svir.store.base import SqlStore
from svir.store.keys import KeyStore
from svir.store.responses import SqlResponseStore
from tests.keys.conftest import Postgres
from tests.keys.test_ledger import row
from tests.responses.test_store import record


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.url()


async def opened(url: str, monkeypatch: pytest.MonkeyPatch, knows: int | None = None) -> SqlStore:
    """The store at `url` opened by an svir that knows the migrations up to `knows` (all of this
    svir's, without it)."""
    if knows is not None:
        older = {d: m[:knows] for d, m in migrations.MIGRATIONS.items()}
        monkeypatch.setattr(migrations, "MIGRATIONS", older)
    store = make_store(url)
    assert isinstance(store, SqlStore)
    await store.open()
    monkeypatch.undo()
    assert await store.schema_version() == (knows or migrations.latest(store.dialect))
    return store


async def test_upgrade_from_version_one(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = await opened(url, monkeypatch, knows=1)
    await old.create_thread("someone", "thread-1", model=None, system=None, metadata={})
    await old.close()

    store = await opened(url, monkeypatch)
    try:
        assert (await store.get_thread("someone", "thread-1")).id == "thread-1"
        keys = KeyStore(store)
        assert not await keys.configured()
        record, _ = await keys.create(KeySpec(name="after the upgrade"))
        assert await keys.configured() and (await keys.get(record.id)) == record
    finally:
        await store.close()


async def test_upgrade_from_version_two_adds_the_client_user(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await opened(url, monkeypatch, knows=2)
    async with old.transaction(write=True) as tx:
        await tx.execute(
            "INSERT INTO usage_ledger (ts, request_id, api, model, status, prompt_tokens,"
            " completion_tokens, usage_source) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            1.0,
            "before",
            "openai",
            "fake/m",
            "ok",
            1,
            1,
            "reported",
        )
    await old.close()

    store = await opened(url, monkeypatch)
    try:
        ledger = Ledger(store, flush_seconds=3600)
        ledger.record(row(request_id="after", client_user="u-1"))
        assert await ledger.flush() == 1
        async with store.transaction(write=False) as tx:
            sql = "SELECT request_id, client_user FROM usage_ledger ORDER BY id"
            rows = [(r["request_id"], r["client_user"]) for r in await tx.fetch(sql)]
        assert rows == [("before", None), ("after", "u-1")]
    finally:
        await store.close()


async def test_upgrade_from_version_three_adds_stored_responses(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await opened(url, monkeypatch, knows=3)
    await old.create_thread("someone", "thread-3", model=None, system=None, metadata={})
    await old.close()

    store = SqlResponseStore(url)
    await store.open()
    try:
        assert await store.store.schema_version() == migrations.latest(store.store.dialect)
        assert (await store.store.get_thread("someone", "thread-3")).id == "thread-3"
        made = record()
        await store.put(made)
        assert await store.get(made.owner, made.id) == made
        assert len(await store.secret("seal")) == 32
    finally:
        await store.close()
