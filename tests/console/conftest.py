"""Fixtures of the console tests: the real `llama-server` and Gemma 3 270M of the managed tests
(tests/managed/conftest.py: required, never skipped), and PostgreSQL, a schema of its own per
test, dropped after the session (PostgreSQL runs on every dev and CI machine: when it is down
these tests fail and say so)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest

from tests.keys.conftest import Postgres, _pg_check, _pg_drop
from tests.keys.support import PG_DSN
from tests.managed.conftest import gguf, llama_binary

__all__ = ["console_postgres", "gguf", "llama_binary", "pg_url"]


@pytest.fixture(scope="session")
def console_postgres() -> Iterator[Postgres]:
    try:
        asyncio.run(_pg_check())
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_DSN}: {exc}", pytrace=False)
    pg = Postgres()
    yield pg
    asyncio.run(_pg_drop(pg.schemas))


@pytest.fixture
def pg_url(console_postgres: Postgres) -> str:
    return console_postgres.url()
