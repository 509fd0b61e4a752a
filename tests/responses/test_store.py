"""The response store's contract (svir.store.responses), the same on SQLite and PostgreSQL: a
response is read back by its owner only, a chain comes oldest first and stops at a deleted
link, and the sealing secret is made once and shared by every store on the database."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from svir.errors import NotFound
from svir.protocols.responses.routes import StoredResponse
from svir.store.migrations import MIGRATIONS, latest
from svir.store.responses import SqlResponseStore

OWNER = "sha256:owner"
OTHER = "sha256:other"


@pytest.fixture
async def store(url: str) -> AsyncIterator[SqlResponseStore]:
    s = SqlResponseStore(url)
    await s.open()
    yield s
    await s.close()


def record(
    previous: str | None = None, owner: str = OWNER, text: str = "hi", **kw: Any
) -> StoredResponse:
    rid = "resp_" + uuid.uuid4().hex
    user = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "user", "content": text}
    answer = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant"}
    return StoredResponse(
        id=rid,
        owner=owner,
        created_at=1.5,
        model="up/ok",
        previous_response_id=previous,
        input_items=[user],
        output_items=[{**answer, "content": [{"type": "output_text", "text": text.upper()}]}],
        response={"id": rid, "object": "response", "status": "completed", **kw},
    )


def test_every_dialect_has_the_responses_migration() -> None:
    for dialect, migrations in MIGRATIONS.items():
        assert latest(dialect) >= 4
        [fourth] = [m for m in migrations if m.version == 4]
        assert any("CREATE TABLE responses" in s for s in fourth.statements)


async def test_a_response_is_its_owners_only(store: SqlResponseStore) -> None:
    first = record(metadata={"k": "v"})
    await store.put(first)
    assert await store.get(OWNER, first.id) == first
    with pytest.raises(NotFound):
        await store.get(OTHER, first.id)
    with pytest.raises(NotFound):
        await store.delete(OTHER, first.id)
    with pytest.raises(NotFound):
        await store.chain(OTHER, first.id)
    await store.delete(OWNER, first.id)
    with pytest.raises(NotFound):
        await store.get(OWNER, first.id)
    with pytest.raises(NotFound):
        await store.delete(OWNER, first.id)


async def test_a_chain_is_read_oldest_first_and_stops_at_a_deleted_link(
    store: SqlResponseStore,
) -> None:
    a = record(text="one")
    b = record(a.id, text="two")
    c = record(b.id, text="three")
    for r in (a, b, c):
        await store.put(r)
    assert [r.id for r in await store.chain(OWNER, c.id)] == [a.id, b.id, c.id]
    assert [r.id for r in await store.chain(OWNER, b.id)] == [a.id, b.id]
    # Another owner's response named as the previous one is not followed.
    foreign = record(owner=OTHER)
    d = record(foreign.id, text="four")
    await store.put(foreign)
    await store.put(d)
    assert [r.id for r in await store.chain(OWNER, d.id)] == [d.id]
    await store.delete(OWNER, b.id)
    assert [r.id for r in await store.chain(OWNER, c.id)] == [c.id]


async def test_the_sealing_secret_is_made_once_for_every_store_on_the_database(
    url: str, store: SqlResponseStore
) -> None:
    others = [SqlResponseStore(url) for _ in range(3)]
    for other in others:
        await other.open()
    try:
        got = await asyncio.gather(*(s.secret("seal") for s in [store, *others]))
        assert len(got[0]) == 32 and len(set(got)) == 1
        assert await store.secret("another") != got[0]
    finally:
        for other in others:
            await other.close()
