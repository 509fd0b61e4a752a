"""Fixtures for the thread tests: a store of each kind, and the database URLs behind them.

PostgreSQL is part of the test setup (127.0.0.1:5432, trust auth, database `test`): when it is not
running, the tests that need it fail and say how to start it; they are not skipped. Every run
keeps its tables in schemas of its own, dropped at the end, so runs side by side do not collide.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from svir.store import make_store
from svir.threads.records import Store

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_DATABASE = "test"
PG_USERS = ("postgres", "root")
START_HINT = (
    "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
)


def _pg_dsn(user: str) -> str:
    return f"postgresql://{user}@{PG_HOST}:{PG_PORT}/{PG_DATABASE}"


async def _probe() -> str:
    errors = []
    for user in PG_USERS:
        try:
            conn = await asyncpg.connect(_pg_dsn(user), timeout=5)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            errors.append(f"{user}: {exc}")
            continue
        await conn.close()
        return _pg_dsn(user)
    raise RuntimeError("; ".join(errors))


async def _run_sql(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


class Postgres:
    """The test database, and schemas made for this run (all dropped at the end)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.prefix = f"svir_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.schemas: list[str] = []

    def schema(self) -> str:
        """A new schema name for this run; the store creates it."""
        name = f"{self.prefix}_{len(self.schemas)}"
        self.schemas.append(name)
        return name

    def url(self, schema: str | None = None) -> str:
        return f"{self.dsn}?schema={schema or self.schema()}"

    def drop_all(self) -> None:
        for name in self.schemas:
            asyncio.run(_run_sql(self.dsn, f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        dsn = asyncio.run(_probe())
    except RuntimeError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} (database {PG_DATABASE!r},"
            f" users {', '.join(PG_USERS)}): {exc}.\nThe thread store tests need it: "
            f"{START_HINT}.",
            pytrace=False,
        )
    pg = Postgres(dsn)
    yield pg
    pg.drop_all()


STORES = ("sqlite", "postgres")


def store_url(kind: str, tmp_path: Path, postgres: Postgres | None) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'threads.db'}"
    assert postgres is not None
    return postgres.url()


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    postgres = request.getfixturevalue("postgres") if store_kind == "postgres" else None
    return store_url(store_kind, tmp_path, postgres)


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    s = make_store(url)
    await s.open()
    yield s
    await s.close()
