"""Fixtures for the keys tests: the fake upstream, PostgreSQL and Redis (both run on every dev
and CI machine: when one is down these tests fail and say so; they are not skipped), and an
in-process svir (the App with its lifespan, driven over ASGI)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.keys.support import PG_DSN, REDIS_URL, Harness, drop_redis_prefix
from tests.keys.upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


class Postgres:
    def __init__(self) -> None:
        self.prefix = f"svir_keys_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.schemas: list[str] = []

    def url(self) -> str:
        name = f"{self.prefix}_{len(self.schemas)}"
        self.schemas.append(name)
        return f"{PG_DSN}?schema={name}"


async def _pg_check() -> None:
    conn = await asyncpg.connect(PG_DSN, timeout=5)
    await conn.close()


async def _pg_drop(names: list[str]) -> None:
    conn = await asyncpg.connect(PG_DSN, timeout=5)
    try:
        for name in names:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        asyncio.run(_pg_check())
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_DSN}: {exc}", pytrace=False)
    pg = Postgres()
    yield pg
    asyncio.run(_pg_drop(pg.schemas))


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}", pytrace=False)
    prefix = f"svirtest{uuid.uuid4().hex[:8]}"
    yield prefix
    drop_redis_prefix(prefix)


@pytest.fixture(params=["memory", "redis"])
def limits_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def harness_factory(
    tmp_path: Path, upstream: FakeUpstream, request: pytest.FixtureRequest
) -> AsyncIterator[type[Harness]]:
    made: list[Harness] = []

    class Made(Harness):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            made.append(self)

    Made.default_upstream = upstream.base_url
    Made.default_tmp = tmp_path
    yield Made
    for h in made:
        await h.stop()
