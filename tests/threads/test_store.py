"""The store's contract, run the same against SQLite (a temporary file) and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from typing import Any

import pytest

from svir.errors import BadCursor, Busy, LimitExceeded, NotFound
from svir.store import make_store
from svir.store.migrations import MIGRATIONS, latest
from svir.threads.records import MessageRecord, NewBlob, NewMessage, Store, ThreadRecord

OWNER = "sha256:owner"
OTHER = "sha256:other"


def tid() -> str:
    return "thread_" + uuid.uuid4().hex


def blob(data: bytes, media_type: str = "image/png") -> NewBlob:
    return NewBlob(hashlib.sha256(data).hexdigest(), data, media_type)


def user(text: str, *blobs: NewBlob) -> NewMessage:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "image", "attachment_id": b.hash} for b in blobs]
    return NewMessage(id=str(uuid.uuid4()), role="user", content=content, blobs=blobs)


def answer(text: str, **kw: Any) -> NewMessage:
    return NewMessage(
        id=str(uuid.uuid4()), role="assistant", content=[{"type": "text", "text": text}], **kw
    )


def no_check(*_: Any) -> None:
    return None


async def new_thread(store: Store, owner: str = OWNER, **kw: Any) -> ThreadRecord:
    return await store.create_thread(
        owner,
        tid(),
        model=kw.get("model"),
        system=kw.get("system"),
        metadata=kw.get("metadata", {}),
    )


async def append(
    store: Store, thread: ThreadRecord, *messages: NewMessage, limit: int = 10**9
) -> list[MessageRecord]:
    return await store.append_messages(
        OWNER, thread.id, messages, check=no_check, max_thread_bytes=limit
    )


async def test_migrations_are_applied_once_and_recorded(store: Store, url: str) -> None:
    assert (
        await store.schema_version()
        == latest(store.dialect)
        == max(m.version for m in MIGRATIONS[store.dialect])
    )
    # A second process (or a restart) on the same database applies nothing and keeps the data.
    thread = await new_thread(store)
    again = make_store(url)
    await again.open()
    try:
        assert await again.schema_version() == latest(store.dialect)
        assert (await again.get_thread(OWNER, thread.id)).id == thread.id
    finally:
        await again.close()


async def test_concurrent_first_starts_migrate_once(url: str) -> None:
    stores = [make_store(url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        versions = await asyncio.gather(*(s.schema_version() for s in stores))
        assert set(versions) == {latest(stores[0].dialect)}
    finally:
        for s in stores:
            await s.close()


async def test_create_get_update_and_ownership(store: Store) -> None:
    thread = await new_thread(store, model="lab/m", system="be kind", metadata={"k": "v"})
    got = await store.get_thread(OWNER, thread.id)
    assert (got.model, got.system, got.metadata, got.busy, got.message_count) == (
        "lab/m",
        "be kind",
        {"k": "v"},
        False,
        0,
    )
    with pytest.raises(NotFound):
        await store.get_thread(OTHER, thread.id)
    with pytest.raises(NotFound):
        await store.delete_thread(OTHER, thread.id)
    with pytest.raises(NotFound):
        await store.update_thread(OTHER, thread.id, {"model": "x/y"})
    updated = await store.update_thread(OWNER, thread.id, {"metadata": {"a": "b"}, "system": None})
    assert updated.metadata == {"a": "b"} and updated.system is None and updated.model == "lab/m"


async def test_list_is_per_owner_and_paginates_both_ways(store: Store) -> None:
    owner = f"sha256:{uuid.uuid4().hex}"
    made = [await new_thread(store, owner) for _ in range(5)]
    await new_thread(store, OTHER)
    newest_first = [t.id for t in reversed(made)]
    page = await store.list_threads(owner, limit=2, after=None, order="desc")
    assert [t.id for t in page.items] == newest_first[:2] and page.has_more
    page = await store.list_threads(owner, limit=2, after=page.items[-1].id, order="desc")
    assert [t.id for t in page.items] == newest_first[2:4] and page.has_more
    page = await store.list_threads(owner, limit=2, after=page.items[-1].id, order="desc")
    assert [t.id for t in page.items] == newest_first[4:] and not page.has_more
    page = await store.list_threads(owner, limit=10, after=None, order="asc")
    assert [t.id for t in page.items] == [t.id for t in made] and not page.has_more
    with pytest.raises(BadCursor):
        await store.list_threads(owner, limit=2, after=made[0].id + "x", order="asc")
    with pytest.raises(BadCursor):  # another owner's thread is no cursor either
        await store.list_threads(OTHER, limit=2, after=made[0].id, order="asc")


async def test_messages_are_numbered_and_paginated(store: Store) -> None:
    thread = await new_thread(store)
    stored = await append(store, thread, user("a"), user("b"), user("c"))
    assert [m.seq for m in stored] == [1, 2, 3]
    page = await store.list_messages(OWNER, thread.id, limit=2, after=None, order="asc")
    assert [m.content[0]["text"] for m in page.items] == ["a", "b"] and page.has_more
    page = await store.list_messages(
        OWNER, thread.id, limit=2, after=page.items[-1].id, order="asc"
    )
    assert [m.content[0]["text"] for m in page.items] == ["c"] and not page.has_more
    page = await store.list_messages(OWNER, thread.id, limit=None, after=None, order="desc")
    assert [m.content[0]["text"] for m in page.items] == ["c", "b", "a"]
    assert (await store.get_message(OWNER, thread.id, stored[1].id)).content[0]["text"] == "b"
    with pytest.raises(NotFound):
        await store.get_message(OTHER, thread.id, stored[1].id)
    with pytest.raises(NotFound):
        await store.list_messages(OTHER, thread.id, limit=None, after=None, order="asc")
    assert (await store.get_thread(OWNER, thread.id)).message_count == 3


async def test_append_check_sees_the_tail_and_can_refuse(store: Store) -> None:
    thread = await new_thread(store)
    await append(store, thread, user("q"))
    await store.acquire(OWNER, thread.id, "L", ttl=30, check=no_check)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert (await store.finish(thread.id, "L", answer("", tool_calls=calls)))[0] == "held"
    await append(
        store,
        thread,
        NewMessage(
            id=str(uuid.uuid4()),
            role="tool",
            content=[{"type": "text", "text": "r"}],
            tool_call_id="c1",
        ),
    )
    seen: list[list[str]] = []

    def check(tail: list[MessageRecord], new: Any) -> None:
        seen.append([m.role for m in tail])
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await store.append_messages(
            OWNER, thread.id, [user("x")], check=check, max_thread_bytes=10**9
        )
    assert seen == [["assistant", "tool"]]
    assert (await store.get_thread(OWNER, thread.id)).message_count == 3  # nothing written


async def test_attachments_stored_once_by_hash_with_a_per_thread_limit(store: Store) -> None:
    image = blob(b"\x89PNG\r\n\x1a\n" + b"a" * 100)
    one, two = await new_thread(store), await new_thread(store)
    await append(store, one, user("x", image), user("y", image))
    await append(store, two, user("z", image))
    # Linked to each thread once, counted once per thread, stored once.
    assert (await store.get_thread(OWNER, one.id)).attachment_bytes == len(image.data)
    assert (await store.get_thread(OWNER, two.id)).attachment_bytes == len(image.data)
    assert await store.blob_data([image.hash]) == {image.hash: image.data}
    assert await store.get_attachment(OWNER, one.id, image.hash) == ("image/png", image.data)
    with pytest.raises(NotFound):
        await store.get_attachment(OTHER, one.id, image.hash)
    other = await new_thread(store)
    with pytest.raises(NotFound):  # a hash is readable only through a thread that holds it
        await store.get_attachment(OWNER, other.id, image.hash)
    # The limit counts distinct attachments; an attachment already in the thread costs nothing.
    small = await new_thread(store)
    a, b = blob(b"a" * 60), blob(b"b" * 60)
    await append(store, small, user("1", a), limit=100)
    await append(store, small, user("2", a), limit=100)
    with pytest.raises(LimitExceeded) as info:
        await append(store, small, user("3", b), limit=100)
    assert (info.value.current, info.value.added, info.value.limit) == (60, 60, 100)
    assert (await store.get_thread(OWNER, small.id)).message_count == 2


async def test_delete_removes_messages_and_unshared_blobs(store: Store) -> None:
    shared, own = blob(b"shared" * 10), blob(b"own" * 10)
    keep, gone = await new_thread(store), await new_thread(store)
    await append(store, keep, user("k", shared))
    await append(store, gone, user("g", shared, own))
    await store.delete_thread(OWNER, gone.id)
    with pytest.raises(NotFound):
        await store.get_thread(OWNER, gone.id)
    with pytest.raises(NotFound):
        await store.list_messages(OWNER, gone.id, limit=None, after=None, order="asc")
    assert set(await store.blob_data([shared.hash, own.hash])) == {shared.hash}
    assert await store.get_attachment(OWNER, keep.id, shared.hash) == ("image/png", shared.data)


async def test_lease_excludes_a_second_continuation_and_guards_the_answer(store: Store) -> None:
    thread = await new_thread(store)
    await append(store, thread, user("q"))
    _, messages = await store.acquire(OWNER, thread.id, "A", ttl=30, check=no_check)
    assert [m.role for m in messages] == ["user"]
    assert (await store.get_thread(OWNER, thread.id)).busy
    with pytest.raises(Busy):
        await store.acquire(OWNER, thread.id, "B", ttl=30, check=no_check)
    with pytest.raises(Busy):
        await append(store, thread, user("while busy"))
    with pytest.raises(Busy):
        await store.delete_thread(OWNER, thread.id)
    assert await store.renew(thread.id, "A", ttl=30) == "held"
    assert await store.renew(thread.id, "B", ttl=30) == "lost"
    # Only the holder's answer is written, and writing it gives the thread back.
    assert await store.finish(thread.id, "B", answer("intruder")) == ("lost", None)
    state, stored = await store.finish(thread.id, "A", answer("ok"))
    assert state == "held" and stored is not None and stored.seq == 2
    assert not (await store.get_thread(OWNER, thread.id)).busy
    assert await store.finish(thread.id, "A", answer("twice")) == ("lost", None)
    assert (await store.get_thread(OWNER, thread.id)).message_count == 2


async def test_an_expired_lease_is_taken_over_and_the_old_holder_writes_nothing(
    store: Store,
) -> None:
    thread = await new_thread(store)
    await append(store, thread, user("q"))
    await store.acquire(OWNER, thread.id, "dead", ttl=0.2, check=no_check)
    await asyncio.sleep(0.4)
    assert not (await store.get_thread(OWNER, thread.id)).busy
    await store.acquire(OWNER, thread.id, "alive", ttl=30, check=no_check)
    assert await store.renew(thread.id, "dead", ttl=30) == "lost"
    assert await store.finish(thread.id, "dead", answer("late")) == ("lost", None)
    assert (await store.finish(thread.id, "alive", answer("ok")))[0] == "held"
    page = await store.list_messages(OWNER, thread.id, limit=None, after=None, order="asc")
    assert [m.content[0]["text"] for m in page.items] == ["q", "ok"]


async def test_cancel_marks_the_running_continuation(store: Store) -> None:
    thread = await new_thread(store)
    await append(store, thread, user("q"))
    assert await store.request_cancel(OWNER, thread.id) is False  # nothing runs
    await store.acquire(OWNER, thread.id, "A", ttl=30, check=no_check)
    with pytest.raises(NotFound):
        await store.request_cancel(OTHER, thread.id)
    assert await store.request_cancel(OWNER, thread.id) is True
    assert await store.renew(thread.id, "A", ttl=30) == "cancelled"
    assert await store.finish(thread.id, "A", answer("no")) == ("cancelled", None)
    await store.release(thread.id, "A")
    thread_now = await store.get_thread(OWNER, thread.id)
    assert not thread_now.busy and thread_now.message_count == 1
    # A new continuation starts clean.
    await store.acquire(OWNER, thread.id, "B", ttl=30, check=no_check)
    assert await store.renew(thread.id, "B", ttl=30) == "held"


async def test_acquire_check_refuses_without_taking_the_lease(store: Store) -> None:
    thread = await new_thread(store)

    def refuse(t: ThreadRecord, messages: list[MessageRecord]) -> None:
        raise ValueError("empty")

    with pytest.raises(ValueError, match="empty"):
        await store.acquire(OWNER, thread.id, "A", ttl=30, check=refuse)
    assert not (await store.get_thread(OWNER, thread.id)).busy
    with pytest.raises(NotFound):
        await store.acquire(OTHER, thread.id, "A", ttl=30, check=no_check)


async def test_many_racing_acquires_one_wins(store: Store, url: str) -> None:
    # Several connections (several replicas, on PostgreSQL) race for one thread.
    thread = await new_thread(store)
    await append(store, thread, user("q"))
    others = [make_store(url) for _ in range(3)]
    for s in others:
        await s.open()
    try:
        contenders = [store, *others] * 3

        async def take(s: Store, i: int) -> str:
            try:
                await s.acquire(OWNER, thread.id, f"L{i}", ttl=30, check=no_check)
            except Busy:
                return "busy"
            return f"L{i}"

        results = await asyncio.gather(*(take(s, i) for i, s in enumerate(contenders)))
        winners = [r for r in results if r != "busy"]
        assert len(winners) == 1
        # And the answers: each contender tries to write; only the winner's lands.
        outcomes = await asyncio.gather(
            *(s.finish(thread.id, f"L{i}", answer(f"from L{i}")) for i, s in enumerate(contenders))
        )
        assert sum(state == "held" for state, _ in outcomes) == 1
        page = await store.list_messages(OWNER, thread.id, limit=None, after=None, order="asc")
        assert [m.content[0]["text"] for m in page.items] == ["q", f"from {winners[0]}"]
    finally:
        for s in others:
            await s.close()


async def test_racing_appends_never_share_a_number(store: Store, url: str) -> None:
    thread = await new_thread(store)
    others = [make_store(url) for _ in range(2)]
    for s in others:
        await s.open()
    try:
        writers = [store, *others]
        await asyncio.gather(
            *(
                s.append_messages(
                    OWNER, thread.id, [user(f"{i}-{j}")], check=no_check, max_thread_bytes=10
                )
                for j in range(5)
                for i, s in enumerate(writers)
            )
        )
        page = await store.list_messages(OWNER, thread.id, limit=None, after=None, order="asc")
        assert [m.seq for m in page.items] == list(range(1, 16))
        assert len({m.content[0]["text"] for m in page.items}) == 15
    finally:
        for s in others:
            await s.close()


async def test_sqlite_uses_wal(tmp_path: Any) -> None:
    path = tmp_path / "wal.db"
    s = make_store(f"sqlite:///{path}")
    await s.open()
    await s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_a_newer_schema_is_refused(url: str) -> None:
    s = make_store(url)
    await s.open()
    try:
        async with s.transaction(write=True) as tx:  # type: ignore[attr-defined]
            await tx.execute(
                "INSERT INTO svir_schema (version, name, applied_at) VALUES (?, ?, ?)",
                999,
                "future",
                0.0,
            )
    finally:
        await s.close()
    again = make_store(url)
    with pytest.raises(Exception, match="version 999"):
        await again.open()
