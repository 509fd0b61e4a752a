"""Migrations 2 (keys and the usage ledger) and 3 (the client's user in the ledger) on stores that
an older svir made at versions 1 and 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from svir.call import CallRecord
from svir.keys.model import KeySpec
from svir.keys.store import KeyStore
from svir.ledger import Ledger
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
        assert await store.schema_version() == 3
        assert (await store.get_thread("someone", "thread-1")).id == "thread-1"
        keys = KeyStore(store)
        assert not await keys.configured()
        record, _ = await keys.create(KeySpec(name="after the upgrade"))
        assert await keys.configured() and (await keys.get(record.id)) == record
    finally:
        await store.close()


def ledger_row(request_id: str, client_user: str | None) -> CallRecord:
    return CallRecord(
        ts=1.0,
        request_id=request_id,
        key_id=None,
        api="openai",
        model="fake/m",
        served_model="fake/m",
        provider="fake",
        status="ok",
        prompt_tokens=1,
        completion_tokens=1,
        reasoning_tokens=None,
        cached_tokens=None,
        usage_source="reported",
        cost_micros=None,
        latency_ms=1.0,
        ttft_ms=None,
        tokens_per_second=None,
        upstream_request_id=None,
        upstream_id=None,
        client_user=client_user,
    )


async def test_upgrade_from_version_two_adds_the_client_user(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = {d: m[:2] for d, m in migrations.MIGRATIONS.items()}
    monkeypatch.setattr(migrations, "MIGRATIONS", second)
    old = make_store(url)
    assert isinstance(old, SqlStore)
    await old.open()
    assert await old.schema_version() == 2
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
    monkeypatch.undo()

    store = make_store(url)
    assert isinstance(store, SqlStore)
    await store.open()
    try:
        assert await store.schema_version() == 3
        ledger = Ledger(store, flush_seconds=3600)
        ledger.record(ledger_row("after", "u-1"))
        assert await ledger.flush() == 1
        async with store.transaction(write=False) as tx:
            sql = "SELECT request_id, client_user FROM usage_ledger ORDER BY id"
            rows = [(r["request_id"], r["client_user"]) for r in await tx.fetch(sql)]
        assert rows == [("before", None), ("after", "u-1")]
    finally:
        await store.close()
