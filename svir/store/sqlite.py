"""The thread store on SQLite: one file, WAL, no server (the default).

One connection (aiosqlite runs it on its own thread) serves the process, one transaction at a
time. Writes take the database's write lock at their start (`BEGIN IMMEDIATE`), so a check and the
write that depends on it can never be separated by another writer, in this process or another one
on the same file.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any, Final

import aiosqlite

from svir.errors import StoreError, Unavailable
from svir.store.base import Row, SqlStore, Tx
from svir.store.migrations import apply_migrations

__all__ = ["SqliteStore"]

# CPython's sqlite3 binds an int, float, str or bytearray at once, but anything else (None among
# them) only after looking for an adapter: a registered one, else `__adapt__` and `__conform__`,
# failed attribute lookups whose AttributeErrors are formatted and dropped (~15k instructions for
# the dozen None fields of a ledger row). Registered, None's adapter is found first; it gives None
# back, which is bound as NULL as before. The registry is the module's, for the process: every
# sqlite3 connection of svir's binds None this way, only the path to the NULL changes.
sqlite3.register_adapter(type(None), lambda value: value)


class _SqliteTx(Tx):
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        async with self._db.execute(sql, args) as cursor:
            return list(await cursor.fetchall())

    async def execute(self, sql: str, *args: Any) -> int:
        async with self._db.execute(sql, args) as cursor:
            return cursor.rowcount

    async def now(self) -> float:
        # One machine, one clock: every process on this file reads the same time.
        return time.time()


# Rows per INSERT statement, largest first. A statement of many rows costs less per row than one
# run per row (each run opens the table's and its indexes' cursors anew: 40k against 52k
# instructions a ledger row in batches of 500, under callgrind), and these few sizes keep each
# batch's statements among those sqlite3 has prepared, whatever the batch's size.
_ROWS_PER_STATEMENT: Final = (50, 10, 1)


def _insert_rows(
    conn: sqlite3.Connection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    one = "(" + ", ".join("?" * len(columns)) + ")"
    # OR ROLLBACK: a row the table refuses ends the whole transaction, as the caller wants
    # anyway. With the default (ABORT), SQLite must be able to undo one statement of many rows
    # within the transaction, and keeps a statement journal in a temporary file for it: ~1.1
    # writes to that file a request under load, two thirds of svir's pwrite calls (strace).
    head = f"INSERT OR ROLLBACK INTO {table} ({', '.join(columns)}) VALUES "
    most = max(1, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(columns))
    conn.execute("BEGIN IMMEDIATE")
    try:
        start = 0
        for wanted in _ROWS_PER_STATEMENT:
            size = min(wanted, most)
            end = start + (len(rows) - start) // size * size
            if end > start:
                sql = head + ", ".join([one] * size)
                groups = (
                    tuple(chain.from_iterable(rows[i : i + size])) for i in range(start, end, size)
                )
                conn.executemany(sql, rows[start:end] if size == 1 else groups)
                start = end
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise


class SqliteStore(SqlStore):
    dialect = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._version = 0

    async def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = await aiosqlite.connect(self.path, isolation_level=None, timeout=self.busy_timeout)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the SQLite store at {self.path}: {exc}") from None
        db.row_factory = sqlite3.Row
        try:
            await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            mode = await self._retry_locked(db, "PRAGMA journal_mode=WAL")
            if mode is None or str(mode[0]).lower() != "wal":
                raise StoreError(f"SQLite at {self.path} cannot use WAL (got {mode!r})")
            # A committed answer survives a crash of the process and of the machine.
            await db.execute("PRAGMA synchronous=FULL")
            await db.execute("PRAGMA foreign_keys=ON")
            self._db = db
            async with self.transaction(write=True) as tx:
                self._version = await apply_migrations(tx, self.dialect)
        except BaseException:
            self._db = None
            await db.close()
            raise

    async def _retry_locked(self, db: aiosqlite.Connection, sql: str) -> Any:
        """Run `sql`, waiting out "database is locked": switching a new file to WAL while another
        process opens it is refused at once, without SQLite's busy handler."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return await (await db.execute(sql)).fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            async with self._lock:
                await db.close()

    async def schema_version(self) -> int:
        async with self.transaction(write=False) as tx:
            return int(await tx.fetchval("SELECT MAX(version) FROM svir_schema"))

    async def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        async with self._lock:
            db = self._db
            if db is None:
                raise StoreError("the store is not open")
            try:
                # The whole transaction in one call on the connection's thread: each call is a
                # hand-off to that thread and back, which costs more CPU than inserting a row, and
                # `transaction` with a statement in it takes three or four. aiosqlite has no public
                # way to run a function there; `_execute` is the one its own methods use. A
                # cancelled caller cannot leave the transaction open: the function runs to its end.
                await db._execute(  # type: ignore[no-untyped-call]
                    _insert_rows, db._conn, table, columns, rows
                )
            except sqlite3.Error as exc:
                raise Unavailable(f"SQLite: {exc}") from exc

    @contextlib.asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[Tx]:
        async with self._lock:
            db = self._db
            if db is None:
                raise StoreError("the store is not open")
            try:
                await db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield _SqliteTx(db)
                except BaseException:
                    # Shielded: a cancelled request must still leave the connection out of its
                    # transaction for the next one.
                    await asyncio.shield(db.rollback())
                    raise
                else:
                    await asyncio.shield(db.commit())
            except sqlite3.Error as exc:
                raise Unavailable(f"SQLite: {exc}") from exc
