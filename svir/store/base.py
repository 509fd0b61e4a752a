"""The thread store's one implementation in SQL, shared by SQLite and PostgreSQL (its interface
and records: svir.threads.records).

A thread is a row of `threads`; its messages are rows of `messages`, numbered by `seq`. Attachments
(images, text files) are stored once per content hash in `blobs` and linked to the threads that
use them in `thread_blobs`, which is what the per-thread limit counts.

A running continuation holds its thread through a lease: `lease_id` and `lease_until` on the
thread's row, taken and checked under the row's lock (a write transaction on SQLite, `FOR UPDATE`
on PostgreSQL), renewed while the answer streams, and given back when it ends. Another
continuation finds the lease and is refused; a process that died leaves a lease that expires. The
assistant message is written in the same transaction that gives the lease back, and only while
the lease is still held: a half-written answer is never stored.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from svir.errors import BadCursor, Busy, Conflict, LimitExceeded, NotFound
from svir.threads.records import (
    AcquireCheck,
    AppendCheck,
    LeaseState,
    MessageRecord,
    NewBlob,
    NewMessage,
    Order,
    Page,
    Store,
    ThreadRecord,
)

__all__ = ["Row", "SqlStore", "Tx"]

_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode


class Row(Protocol):
    def __getitem__(self, key: str) -> Any: ...


class Tx(abc.ABC):
    """One open transaction: SQL with `?` placeholders, whatever the database's own are."""

    @abc.abstractmethod
    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    @abc.abstractmethod
    async def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; the number of rows it changed."""

    @abc.abstractmethod
    async def now(self) -> float:
        """The time (Unix seconds) every replica agrees on: the database's clock where it has
        one to share."""

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]  # type: ignore[index]


_THREAD_COLUMNS = (
    "id, owner, created_at, updated_at, model, system, metadata, lease_id, lease_until,"
    " message_count, attachment_bytes"
)
_MESSAGE_COLUMNS = (
    "id, thread_id, seq, created_at, role, content, tool_calls, tool_call_id, reasoning,"
    " reasoning_carrier, refusal, finish_reason, model, usage"
)


def _in(n: int) -> str:
    return "(" + ",".join("?" * n) + ")"


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _json_encode(value).decode()


def _load(value: str | None) -> Any:
    return None if value is None else _json_decode(value)


class SqlStore(Store):
    """The store over any SQL database the subclass connects to."""

    # Appended to a SELECT of the thread's row to lock it for the transaction.
    lock_clause = ""

    @abc.abstractmethod
    def transaction(self, *, write: bool) -> contextlib.AbstractAsyncContextManager[Tx]: ...

    @abc.abstractmethod
    async def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert `rows` (each its values in `columns`' order) into `table`, all in one write
        transaction of their own: every row is written, or none is. The database's own way
        of writing many rows at once."""

    # Rows

    def _thread(self, row: Row, now: float) -> ThreadRecord:
        lease_until = row["lease_until"]
        return ThreadRecord(
            id=row["id"],
            owner=row["owner"],
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
            model=row["model"],
            system=row["system"],
            metadata=_load(row["metadata"]) or {},
            busy=row["lease_id"] is not None and lease_until is not None and lease_until > now,
            message_count=int(row["message_count"]),
            attachment_bytes=int(row["attachment_bytes"]),
        )

    @staticmethod
    def _message(row: Row) -> MessageRecord:
        return MessageRecord(
            id=row["id"],
            thread_id=row["thread_id"],
            seq=int(row["seq"]),
            created_at=float(row["created_at"]),
            role=row["role"],
            content=_load(row["content"]) or [],
            tool_calls=_load(row["tool_calls"]),
            tool_call_id=row["tool_call_id"],
            reasoning=row["reasoning"],
            reasoning_carrier=row["reasoning_carrier"],
            refusal=row["refusal"],
            finish_reason=row["finish_reason"],
            model=row["model"],
            usage=_load(row["usage"]),
        )

    async def _locked_thread(self, tx: Tx, owner: str | None, thread_id: str) -> Row:
        if owner is None:
            sql = f"SELECT {_THREAD_COLUMNS} FROM threads WHERE id = ?"
            args: tuple[Any, ...] = (thread_id,)
        else:
            sql = f"SELECT {_THREAD_COLUMNS} FROM threads WHERE id = ? AND owner = ?"
            args = (thread_id, owner)
        row = await tx.fetchrow(sql + self.lock_clause, *args)
        if row is None:
            raise NotFound(thread_id)
        return row

    # Threads

    async def create_thread(
        self,
        owner: str,
        thread_id: str,
        *,
        model: str | None,
        system: str | None,
        metadata: Mapping[str, str],
    ) -> ThreadRecord:
        async with self.transaction(write=True) as tx:
            now = await tx.now()
            await tx.execute(
                "INSERT INTO threads (id, owner, created_at, updated_at, model, system, metadata,"
                " cancel_requested, message_count, attachment_bytes)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, 0)",
                thread_id,
                owner,
                now,
                now,
                model,
                system,
                _json_or_none(dict(metadata)),
            )
            row = await self._locked_thread(tx, owner, thread_id)
            return self._thread(row, now)

    async def update_thread(
        self, owner: str, thread_id: str, changes: Mapping[str, Any]
    ) -> ThreadRecord:
        async with self.transaction(write=True) as tx:
            await self._locked_thread(tx, owner, thread_id)
            now = await tx.now()
            sets = ["updated_at = ?"]
            args: list[Any] = [now]
            for key in ("model", "system"):
                if key in changes:
                    sets.append(f"{key} = ?")
                    args.append(changes[key])
            if "metadata" in changes:
                sets.append("metadata = ?")
                args.append(_json_or_none(dict(changes["metadata"] or {})))
            await tx.execute(f"UPDATE threads SET {', '.join(sets)} WHERE id = ?", *args, thread_id)
            return self._thread(await self._locked_thread(tx, owner, thread_id), now)

    async def get_thread(self, owner: str, thread_id: str) -> ThreadRecord:
        async with self.transaction(write=False) as tx:
            row = await tx.fetchrow(
                f"SELECT {_THREAD_COLUMNS} FROM threads WHERE id = ? AND owner = ?",
                thread_id,
                owner,
            )
            if row is None:
                raise NotFound(thread_id)
            return self._thread(row, await tx.now())

    async def list_threads(
        self, owner: str, *, limit: int, after: str | None, order: Order
    ) -> Page[ThreadRecord]:
        direction, compare = ("DESC", "<") if order == "desc" else ("ASC", ">")
        async with self.transaction(write=False) as tx:
            where = "owner = ?"
            args: list[Any] = [owner]
            if after is not None:
                cursor = await tx.fetchval(
                    "SELECT pk FROM threads WHERE id = ? AND owner = ?", after, owner
                )
                if cursor is None:
                    raise BadCursor(after)
                where += f" AND pk {compare} ?"
                args.append(cursor)
            rows = await tx.fetch(
                f"SELECT {_THREAD_COLUMNS} FROM threads WHERE {where}"
                f" ORDER BY pk {direction} LIMIT ?",
                *args,
                limit + 1,
            )
            now = await tx.now()
        items = [self._thread(r, now) for r in rows[:limit]]
        return Page(items, len(rows) > limit)

    async def delete_thread(self, owner: str, thread_id: str) -> None:
        async with self.transaction(write=True) as tx:
            row = await self._locked_thread(tx, owner, thread_id)
            if self._thread(row, await tx.now()).busy:
                raise Busy(thread_id)
            hashes = [
                r["hash"]
                for r in await tx.fetch(
                    "SELECT hash FROM thread_blobs WHERE thread_id = ?", thread_id
                )
            ]
            await tx.execute("DELETE FROM messages WHERE thread_id = ?", thread_id)
            await tx.execute("DELETE FROM thread_blobs WHERE thread_id = ?", thread_id)
            await tx.execute("DELETE FROM threads WHERE id = ?", thread_id)
        if hashes:
            await self._collect_blobs(hashes)

    async def _collect_blobs(self, hashes: Sequence[str]) -> None:
        """Delete the blobs no thread links to any more. Best effort, after the thread's own
        transaction: a concurrent append that links one of them again keeps it (the foreign key
        refuses the delete), and a blob left over costs only space."""
        with contextlib.suppress(Exception):
            async with self.transaction(write=True) as tx:
                await tx.execute(
                    f"DELETE FROM blobs WHERE hash IN {_in(len(hashes))} AND NOT EXISTS"
                    " (SELECT 1 FROM thread_blobs tb WHERE tb.hash = blobs.hash)",
                    *hashes,
                )

    # Messages

    async def list_messages(
        self, owner: str, thread_id: str, *, limit: int | None, after: str | None, order: Order
    ) -> Page[MessageRecord]:
        direction, compare = ("DESC", "<") if order == "desc" else ("ASC", ">")
        async with self.transaction(write=False) as tx:
            found = await tx.fetchval(
                "SELECT 1 FROM threads WHERE id = ? AND owner = ?", thread_id, owner
            )
            if found is None:
                raise NotFound(thread_id)
            where = "thread_id = ?"
            args: list[Any] = [thread_id]
            if after is not None:
                cursor = await tx.fetchval(
                    "SELECT seq FROM messages WHERE id = ? AND thread_id = ?", after, thread_id
                )
                if cursor is None:
                    raise BadCursor(after)
                where += f" AND seq {compare} ?"
                args.append(cursor)
            sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY seq {direction}"
            if limit is not None:
                sql += " LIMIT ?"
                args.append(limit + 1)
            rows = await tx.fetch(sql, *args)
        items = [self._message(r) for r in rows]
        if limit is not None and len(items) > limit:
            return Page(items[:limit], True)
        return Page(items, False)

    async def get_message(self, owner: str, thread_id: str, message_id: str) -> MessageRecord:
        async with self.transaction(write=False) as tx:
            row = await tx.fetchrow(
                f"SELECT {', '.join('m.' + c.strip() for c in _MESSAGE_COLUMNS.split(','))}"
                " FROM messages m JOIN threads t ON t.id = m.thread_id"
                " WHERE m.id = ? AND m.thread_id = ? AND t.owner = ?",
                message_id,
                thread_id,
                owner,
            )
        if row is None:
            raise NotFound(message_id)
        return self._message(row)

    async def _tail(self, tx: Tx, thread_id: str) -> list[MessageRecord]:
        start = await tx.fetchval(
            "SELECT COALESCE("
            "(SELECT MAX(seq) FROM messages WHERE thread_id = ? AND role = 'assistant'),"
            "(SELECT MAX(seq) FROM messages WHERE thread_id = ?))",
            thread_id,
            thread_id,
        )
        if start is None:
            return []
        rows = await tx.fetch(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
            " ORDER BY seq",
            thread_id,
            start,
        )
        return [self._message(r) for r in rows]

    async def _insert_messages(
        self, tx: Tx, thread: Row, messages: Sequence[NewMessage], now: float
    ) -> list[MessageRecord]:
        thread_id = thread["id"]
        seq = int(
            await tx.fetchval(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE thread_id = ?", thread_id
            )
        )
        out: list[MessageRecord] = []
        for m in messages:
            seq += 1
            record = MessageRecord(
                id=m.id,
                thread_id=thread_id,
                seq=seq,
                created_at=now,
                role=m.role,
                content=m.content,
                tool_calls=m.tool_calls,
                tool_call_id=m.tool_call_id,
                reasoning=m.reasoning,
                reasoning_carrier=m.reasoning_carrier,
                refusal=m.refusal,
                finish_reason=m.finish_reason,
                model=m.model,
                usage=m.usage,
            )
            await tx.execute(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES {_in(14)}",
                record.id,
                thread_id,
                seq,
                now,
                record.role,
                _json_or_none(record.content),
                _json_or_none(record.tool_calls),
                record.tool_call_id,
                record.reasoning,
                record.reasoning_carrier,
                record.refusal,
                record.finish_reason,
                record.model,
                _json_or_none(record.usage),
            )
            out.append(record)
        await tx.execute(
            "UPDATE threads SET message_count = message_count + ?, updated_at = ? WHERE id = ?",
            len(messages),
            now,
            thread_id,
        )
        return out

    async def _link_blobs(
        self, tx: Tx, thread: Row, blobs: Sequence[NewBlob], max_thread_bytes: int, now: float
    ) -> None:
        thread_id = thread["id"]
        distinct = {b.hash: b for b in blobs}
        if not distinct:
            return
        hashes = list(distinct)
        linked = {
            r["hash"]
            for r in await tx.fetch(
                f"SELECT hash FROM thread_blobs WHERE thread_id = ? AND hash IN {_in(len(hashes))}",
                thread_id,
                *hashes,
            )
        }
        # In hash order, so that two transactions writing the same blobs never wait on each other
        # in opposite orders.
        new = sorted((distinct[h] for h in hashes if h not in linked), key=lambda b: b.hash)
        if not new:
            return
        current = int(thread["attachment_bytes"])
        added = sum(len(b.data) for b in new)
        if current + added > max_thread_bytes:
            raise LimitExceeded(current, added, max_thread_bytes)
        stored = {
            r["hash"]
            for r in await tx.fetch(
                f"SELECT hash FROM blobs WHERE hash IN {_in(len(new))}", *(b.hash for b in new)
            )
        }
        for b in new:
            if b.hash not in stored:
                # Stored once: the same bytes sent again, in any thread, are not written again.
                await tx.execute(
                    "INSERT INTO blobs (hash, size, data, created_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (hash) DO NOTHING",
                    b.hash,
                    len(b.data),
                    b.data,
                    now,
                )
            await tx.execute(
                "INSERT INTO thread_blobs (thread_id, hash, media_type, size, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                thread_id,
                b.hash,
                b.media_type,
                len(b.data),
                now,
            )
        await tx.execute(
            "UPDATE threads SET attachment_bytes = attachment_bytes + ? WHERE id = ?",
            added,
            thread_id,
        )

    async def append_messages(
        self,
        owner: str,
        thread_id: str,
        messages: Sequence[NewMessage],
        *,
        check: AppendCheck,
        max_thread_bytes: int,
    ) -> list[MessageRecord]:
        for attempt in range(3):
            try:
                async with self.transaction(write=True) as tx:
                    thread = await self._locked_thread(tx, owner, thread_id)
                    now = await tx.now()
                    if self._thread(thread, now).busy:
                        raise Busy(thread_id)
                    check(await self._tail(tx, thread_id), messages)
                    blobs = [b for m in messages for b in m.blobs]
                    await self._link_blobs(tx, thread, blobs, max_thread_bytes, now)
                    return await self._insert_messages(tx, thread, messages, now)
            except Conflict:
                # Two appends writing the same new attachments, or a blob collected under this
                # one: the other transaction has finished, and this one runs again.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # Leases

    async def acquire(
        self, owner: str, thread_id: str, lease_id: str, *, ttl: float, check: AcquireCheck
    ) -> tuple[ThreadRecord, list[MessageRecord]]:
        async with self.transaction(write=True) as tx:
            row = await self._locked_thread(tx, owner, thread_id)
            now = await tx.now()
            thread = self._thread(row, now)
            if thread.busy:
                raise Busy(thread_id)
            rows = await tx.fetch(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? ORDER BY seq",
                thread_id,
            )
            messages = [self._message(r) for r in rows]
            check(thread, messages)
            await tx.execute(
                "UPDATE threads SET lease_id = ?, lease_until = ?, cancel_requested = 0"
                " WHERE id = ?",
                lease_id,
                now + ttl,
                thread_id,
            )
        return thread, messages

    async def renew(self, thread_id: str, lease_id: str, *, ttl: float) -> LeaseState:
        async with self.transaction(write=True) as tx:
            row = await tx.fetchrow(
                "SELECT lease_id, cancel_requested FROM threads WHERE id = ?" + self.lock_clause,
                thread_id,
            )
            if row is None or row["lease_id"] != lease_id:
                return "lost"
            if row["cancel_requested"]:
                return "cancelled"
            now = await tx.now()
            await tx.execute(
                "UPDATE threads SET lease_until = ? WHERE id = ?", now + ttl, thread_id
            )
            return "held"

    async def finish(
        self, thread_id: str, lease_id: str, message: NewMessage
    ) -> tuple[LeaseState, MessageRecord | None]:
        async with self.transaction(write=True) as tx:
            row = await tx.fetchrow(
                f"SELECT {_THREAD_COLUMNS}, cancel_requested FROM threads WHERE id = ?"
                + self.lock_clause,
                thread_id,
            )
            if row is None or row["lease_id"] != lease_id:
                return "lost", None
            if row["cancel_requested"]:
                return "cancelled", None
            now = await tx.now()
            [record] = await self._insert_messages(tx, row, [message], now)
            await tx.execute(
                "UPDATE threads SET lease_id = NULL, lease_until = NULL, cancel_requested = 0"
                " WHERE id = ?",
                thread_id,
            )
            return "held", record

    async def release(self, thread_id: str, lease_id: str) -> None:
        async with self.transaction(write=True) as tx:
            await tx.execute(
                "UPDATE threads SET lease_id = NULL, lease_until = NULL, cancel_requested = 0"
                " WHERE id = ? AND lease_id = ?",
                thread_id,
                lease_id,
            )

    async def request_cancel(self, owner: str, thread_id: str) -> bool:
        async with self.transaction(write=True) as tx:
            row = await self._locked_thread(tx, owner, thread_id)
            if not self._thread(row, await tx.now()).busy:
                return False
            await tx.execute("UPDATE threads SET cancel_requested = 1 WHERE id = ?", thread_id)
            return True

    # Attachments

    async def blob_data(self, hashes: Sequence[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(hashes))
        if not wanted:
            return {}
        async with self.transaction(write=False) as tx:
            rows = await tx.fetch(
                f"SELECT hash, data FROM blobs WHERE hash IN {_in(len(wanted))}", *wanted
            )
        return {r["hash"]: bytes(r["data"]) for r in rows}

    async def get_attachment(self, owner: str, thread_id: str, blob_hash: str) -> tuple[str, bytes]:
        async with self.transaction(write=False) as tx:
            row = await tx.fetchrow(
                "SELECT tb.media_type, b.data FROM thread_blobs tb"
                " JOIN threads t ON t.id = tb.thread_id JOIN blobs b ON b.hash = tb.hash"
                " WHERE tb.thread_id = ? AND tb.hash = ? AND t.owner = ?",
                thread_id,
                blob_hash,
                owner,
            )
        if row is None:
            raise NotFound(blob_hash)
        return row["media_type"], bytes(row["data"])
