"""Fixtures for the keys tests: the scripted upstream, PostgreSQL and Redis (both run on every dev
and CI machine: when one is down these tests fail and say so; they are not skipped), and an
in-process svir (the App with its lifespan, driven over ASGI)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.keys.support import PG_DSN, REDIS_URL, Harness, drop_redis_prefix
from tests.support.upstream import ScriptedServer, ScriptedUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(slow_delay=0.02, fallback="tok-2")) as server:
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


class OwnRedis:
    """A redis-server of one test's own, on a free port: the Redis a test may stop (the shared
    one on 6379 is never stopped)."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 30) -> None:
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    assert self.proc.poll() is None, "redis-server exited at start"
                    assert time.monotonic() < deadline, f"redis-server never answered on {self.url}"
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", "redis"])
def limits_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def harness_factory(
    tmp_path: Path, upstream: ScriptedServer, request: pytest.FixtureRequest
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
