"""The thread store on PostgreSQL, for several svir replicas over one database (asyncpg).

Each transaction runs on a pooled connection. The thread's row is locked (`SELECT … FOR UPDATE`)
by every transaction that checks and then changes a thread, so two replicas cannot both take a
thread's lease or both append after the same last message. Times come from the database's clock,
which every replica shares.

The URL is a libpq one; `?schema=NAME` (svir's own parameter) keeps svir's tables in that schema,
created if missing. Passwords belong in PGPASSWORD or ~/.pgpass rather than in the URL.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]

from svir.errors import Conflict, StoreError, Unavailable
from svir.store.base import Row, SqlStore, Tx
from svir.store.migrations import apply_migrations
from svir.wire.redact import redact_url

__all__ = ["PostgresStore", "split_schema"]

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_PLACEHOLDER: Final = re.compile(r"\?")
# Any constant will do: it names svir's migration lock among the database's advisory locks.
_MIGRATION_LOCK: Final = 0x53564952  # "SVIR"
_converted: dict[str, str] = {}
_RETRYABLE: Final = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.ForeignKeyViolationError,
    asyncpg.UniqueViolationError,
)


def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1`, `$2`, …; svir's SQL has no other `?`."""
    out = _converted.get(sql)
    if out is None:
        counter = iter(range(1, 10_000))
        out = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
        if len(_converted) < 1024:
            _converted[sql] = out
    return out


def split_schema(url: str) -> tuple[str, str | None]:
    """The URL without svir's `schema` parameter, and the schema it names (or None)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = None
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
        raise StoreError(f"schema {schema!r} is not a plain identifier (letters, digits, _)")
    return urlunsplit(parts._replace(query=urlencode(kept))), schema


class _PgTx(Tx):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return list(await self.conn.fetch(_numbered(sql), *args))

    async def execute(self, sql: str, *args: Any) -> int:
        status = await self.conn.execute(_numbered(sql), *args)
        # "UPDATE 3", "INSERT 0 1", "DELETE 0": the count is the last word.
        tail = status.rsplit(" ", 1)[-1] if isinstance(status, str) else ""
        return int(tail) if tail.isdigit() else 0

    async def now(self) -> float:
        return float(await self.conn.fetchval("SELECT EXTRACT(EPOCH FROM clock_timestamp())"))


class PostgresStore(SqlStore):
    dialect = "postgresql"
    lock_clause = " FOR UPDATE"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.dsn, self.schema = split_schema(url)
        self.min_size = min_size
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        settings = {"search_path": self.schema} if self.schema else None
        try:
            if self.schema:
                conn = await asyncpg.connect(self.dsn)
                try:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                except asyncpg.UniqueViolationError:
                    pass  # another replica created it at the same moment
                finally:
                    await conn.close()
            pool = await asyncpg.create_pool(
                self.dsn, min_size=self.min_size, max_size=self.max_size, server_settings=settings
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(
                f"cannot connect to the PostgreSQL store at {redact_url(self.dsn)}: {exc}"
            ) from None
        self._pool = pool
        try:
            async with self.transaction(write=True) as tx:
                await tx.execute(
                    "SELECT pg_advisory_xact_lock(?, hashtext(current_schema()))", _MIGRATION_LOCK
                )
                await apply_migrations(tx, self.dialect)
        except BaseException:
            self._pool = None
            await pool.close()
            raise

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def schema_version(self) -> int:
        async with self.transaction(write=False) as tx:
            return int(await tx.fetchval("SELECT MAX(version) FROM svir_schema"))

    async def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        async with self.transaction(write=True) as tx:
            assert isinstance(tx, _PgTx)
            # COPY, not an INSERT run for each row: under half the server's CPU per row in
            # batches of hundreds (bench.ledger_rows), and no statement text per batch size.
            await tx.conn.copy_records_to_table(table, records=rows, columns=list(columns))

    @contextlib.asynccontextmanager
    async def transaction(self, *, write: bool) -> AsyncIterator[Tx]:
        pool = self._pool
        if pool is None:
            raise StoreError("the store is not open")
        try:
            async with pool.acquire() as conn:
                if write:
                    transaction = conn.transaction()
                else:
                    # One snapshot for the reads of a page and its cursor.
                    transaction = conn.transaction(isolation="repeatable_read", readonly=True)
                async with transaction:
                    yield _PgTx(conn)
        except _RETRYABLE as exc:
            raise Conflict(str(exc)) from exc
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise Unavailable(f"PostgreSQL: {exc}") from exc
