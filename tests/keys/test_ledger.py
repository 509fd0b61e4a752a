"""The usage ledger: a row per request in the store (SQLite and PostgreSQL), written in batches
off the hot path; summaries for `svir usage`, GET /v1/usage and the admin API."""

from __future__ import annotations

import asyncio
import io
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args, get_type_hints

import msgspec
import pytest

from svir.call import CallRecord
from svir.errors import Unavailable
from svir.ledger import COLUMNS, SLICE_ROWS, Ledger
from svir.ledger.queries import ALL_KEYS, summarize
from svir.store import make_store
from svir.store.base import SqlStore
from tests.keys.conftest import Postgres
from tests.keys.support import Harness
from tests.support.upstream import CHUNK_ID, PROMPT_TOKENS, ScriptedServer
from tests.support.waiting import eventually


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.url()


@pytest.fixture
async def sql_store(store_url: str) -> AsyncIterator[SqlStore]:
    store = make_store(store_url)
    assert isinstance(store, SqlStore)
    await store.open()
    yield store
    await store.close()


def row(**kw: Any) -> CallRecord:
    base: dict[str, Any] = {
        "ts": time.time(),
        "request_id": "r",
        "key_id": "key_aaaaaaaaaaaaaaaa",
        "api": "openai",
        "model": "fake/m",
        "served_model": "fake/m",
        "provider": "fake",
        "status": "ok",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "reasoning_tokens": None,
        "cached_tokens": None,
        "usage_source": "reported",
        "cost_micros": 100,
        "latency_ms": 12.5,
        "ttft_ms": 3.0,
        "tokens_per_second": 40.0,
        "upstream_request_id": "up-1",
        "upstream_id": "gen-1",
        "client_user": None,
    }
    base.update(kw)
    return CallRecord(**base)


async def test_rows_batch_and_summaries(store_url: str) -> None:
    store = make_store(store_url)
    assert isinstance(store, SqlStore)
    await store.open()
    try:
        ledger = Ledger(store, flush_seconds=3600)
        day = 86400 * 20000.0  # 2024-10-04 00:00 UTC
        for i in range(450):  # more than one INSERT statement's worth
            ledger.record(
                row(
                    ts=day + i,
                    request_id=f"r{i}",
                    model="fake/a" if i % 3 else "fake/b",
                    key_id=None if i % 5 == 0 else "key_aaaaaaaaaaaaaaaa",
                    status="ok" if i % 10 else "timeout",
                    reasoning_tokens=2 if i % 2 else None,
                )
            )
        assert len(ledger.pending) == 450
        assert await ledger.flush() == 450
        assert ledger.pending == [] and ledger.written == 450
        totals = await summarize(store, since=day, by=())
        assert totals[0]["requests"] == 450 and totals[0]["errors"] == 45
        assert totals[0]["prompt_tokens"] == 4500 and totals[0]["total_tokens"] == 6750
        assert totals[0]["reasoning_tokens"] == 2 * 225
        assert totals[0]["cost_usd"] == pytest.approx(450 * 100 / 1e6)
        by_model = await summarize(store, since=day, by=("model",))
        assert [(r["model"], r["requests"]) for r in by_model] == [("fake/a", 300), ("fake/b", 150)]
        anonymous = await summarize(store, since=day, key=None, by=())
        assert anonymous[0]["requests"] == 90
        keyed = await summarize(store, since=day, key="key_aaaaaaaaaaaaaaaa", by=("day",))
        assert keyed == [
            {**keyed[0], "day": "2024-10-04", "requests": 360},
        ]
        window = await summarize(store, since=day + 100, until=day + 110, key=ALL_KEYS, by=())
        assert window[0]["requests"] == 10
        with pytest.raises(ValueError, match="cannot group"):
            await summarize(store, since=0, by=("colour",))
    finally:
        await store.close()


async def test_a_failed_write_keeps_the_rows(store_url: str) -> None:
    store = make_store(store_url)
    assert isinstance(store, SqlStore)
    await store.open()
    ledger = Ledger(store, flush_seconds=3600, max_pending=3)
    for i in range(3):
        ledger.record(row(request_id=f"r{i}"))
    ledger.record(row(request_id="over"))
    assert ledger.dropped == 1
    await store.close()  # the store goes away
    with pytest.raises(Exception, match="not open"):
        await ledger.flush()
    assert [r.request_id for r in ledger.pending] == ["r0", "r1", "r2"]
    await store.open()
    assert await ledger.flush() == 3
    await store.close()


async def count_rows(store: SqlStore) -> int:
    async with store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT COUNT(*) FROM usage_ledger"))


async def test_a_batch_is_written_whole_or_not_at_all(sql_store: SqlStore) -> None:
    ledger = Ledger(sql_store, flush_seconds=3600)
    # 373 rows: SQLite writes them as statements of 50 rows, then of 10, then of one.
    rows = [
        row(request_id=f"r{i}", ts=1e9 + i / 8, prompt_tokens=i, key_id=None if i % 3 else f"k{i}")
        for i in range(373)
    ]
    rows[371].status = None  # type: ignore[assignment]  # NOT NULL: the database refuses it
    for r in rows:
        ledger.record(r)
    with pytest.raises(Unavailable):
        await ledger.flush()
    assert await count_rows(sql_store) == 0  # not the 371 rows before the bad one
    assert ledger.pending == rows and ledger.written == 0 and ledger.failures == 1
    rows[371].status = "ok"
    assert await ledger.flush() == 373
    async with sql_store.transaction(write=False) as tx:
        stored = await tx.fetch(f"SELECT {', '.join(COLUMNS)} FROM usage_ledger ORDER BY id")
    assert [tuple(r[c] for c in COLUMNS) for r in stored] == [
        msgspec.structs.astuple(r) for r in rows
    ]


async def test_a_large_flush_is_written_in_slices_each_whole(sql_store: SqlStore) -> None:
    # More rows than a slice: each slice is a write of its own, so no loop turn turns more than
    # SLICE_ROWS rows into values. A failure in the second slice keeps the first one written and
    # puts the rest back, in order; the next flush writes them, none twice.
    ledger = Ledger(sql_store, flush_seconds=3600)
    sizes: list[int] = []
    insert_rows = sql_store.insert_rows

    async def noted(table: str, columns: Any, values: Any) -> None:
        sizes.append(len(values))
        await insert_rows(table, columns, values)

    sql_store.insert_rows = noted  # type: ignore[method-assign]
    total = 2 * SLICE_ROWS + 234
    rows = [row(request_id=f"r{i}", ts=1e9 + i, prompt_tokens=i) for i in range(total)]
    bad = SLICE_ROWS + 7
    rows[bad].status = None  # type: ignore[assignment]  # NOT NULL: the database refuses it
    for r in rows:
        ledger.record(r)
    with pytest.raises(Unavailable):
        await ledger.flush()
    assert sizes == [SLICE_ROWS, SLICE_ROWS]
    assert await count_rows(sql_store) == SLICE_ROWS
    assert ledger.pending == rows[SLICE_ROWS:]
    assert (ledger.written, ledger.failures, ledger.dropped) == (SLICE_ROWS, 1, 0)
    rows[bad].status = "ok"
    ledger.record(extra := row(request_id="later", ts=2e9))
    assert await ledger.flush() == total - SLICE_ROWS + 1
    assert sizes[2:] == [SLICE_ROWS, total - 2 * SLICE_ROWS + 1]
    assert ledger.written == total + 1 and ledger.pending == []
    async with sql_store.transaction(write=False) as tx:
        stored = await tx.fetch(f"SELECT {', '.join(COLUMNS)} FROM usage_ledger ORDER BY ts")
    assert [tuple(r[c] for c in COLUMNS) for r in stored] == [
        msgspec.structs.astuple(r) for r in [*rows, extra]
    ]


# The row's columns that may be NULL (a key, a price, reasoning, the upstream's ids, the user).
NULLABLE = tuple(
    name for name, hint in get_type_hints(CallRecord).items() if type(None) in get_args(hint)
)


async def test_none_patterns_round_trip(sql_store: SqlStore) -> None:
    # Batches whose None columns vary: None in every row (the column is left out of the INSERT),
    # in the first row only, in all but the first, at random; each batch reads back as written.
    rng = random.Random(20)
    ledger = Ledger(sql_store, flush_seconds=3600)
    written: list[CallRecord] = []
    for batch in range(24):
        size = rng.choice([1, 2, 11, 63])
        always = set(rng.sample(NULLABLE, rng.randrange(len(NULLABLE) + 1)))
        first_only = set(rng.sample(NULLABLE, 2)) - always
        rows = []
        for i in range(size):
            record = row(request_id=f"b{batch}-{i}", ts=1e9 + len(written) + i)
            for name in NULLABLE:
                if (
                    name in always
                    or (name in first_only and i == 0)
                    or (name not in first_only and rng.random() < 0.3)
                ):
                    setattr(record, name, None)
            rows.append(record)
        for record in rows:
            ledger.record(record)
        assert await ledger.flush() == size
        written += rows
    async with sql_store.transaction(write=False) as tx:
        stored = await tx.fetch(f"SELECT {', '.join(COLUMNS)} FROM usage_ledger ORDER BY ts")
    assert [tuple(r[c] for c in COLUMNS) for r in stored] == [
        msgspec.structs.astuple(r) for r in written
    ]


async def test_a_batch_waits_for_the_open_transaction(sql_store: SqlStore) -> None:
    columns = ("request_id", "ts", "api", "model", "status", "prompt_tokens", "completion_tokens",
               "usage_source")  # fmt: skip
    insert = f"INSERT INTO usage_ledger ({', '.join(columns)}) VALUES ({', '.join('?' * 8)})"

    def values(request_id: str | None, ts: float) -> tuple[Any, ...]:
        return (request_id, ts, "openai", "m", "ok", 1, 1, "x")

    async with sql_store.transaction(write=True) as tx:
        await tx.execute(insert, *values("in-tx-1", 1.0))
        batch = asyncio.ensure_future(
            sql_store.insert_rows(
                "usage_ledger", columns, [values(f"batch-{i}", 2.0) for i in range(5)]
            )
        )
        await asyncio.sleep(0.05)  # the batch's turn, were it not to wait
        await tx.execute(insert, *values("in-tx-2", 3.0))
    await batch
    async with sql_store.transaction(write=False) as tx:
        found = [r["request_id"] for r in await tx.fetch("SELECT request_id FROM usage_ledger")]
    assert sorted(found) == ["batch-0", "batch-1", "batch-2", "batch-3", "batch-4",
                             "in-tx-1", "in-tx-2"]  # fmt: skip
    with pytest.raises(Unavailable):
        await sql_store.insert_rows("usage_ledger", columns, [values("ok", 4.0), values(None, 5.0)])
    async with sql_store.transaction(write=True) as tx:  # the connection is out of the failed one
        await tx.execute(insert, *values("after", 6.0))
    assert await count_rows(sql_store) == 8


async def test_background_task_writes_without_blocking(store_url: str) -> None:
    store = make_store(store_url)
    assert isinstance(store, SqlStore)
    await store.open()
    ledger = Ledger(store, flush_seconds=0.02)
    await ledger.start()
    for i in range(1000):
        ledger.record(row(request_id=f"r{i}"))
    # Recording does no I/O: every row is queued, none written, until the task's turn comes.
    assert len(ledger.pending) == 1000 and ledger.written == 0
    await eventually(lambda: ledger.written == 1000, "the background task writing the rows")
    await ledger.close()
    await store.close()


async def test_a_row_per_request_end_to_end(
    harness_factory: type[Harness], store_url: str, upstream: ScriptedServer
) -> None:
    h = await harness_factory(store_url=store_url).start()
    secret, key = await h.new_key(name="ledgered", rpm=2)
    r = await h.chat(secret, "fake/tok-4", stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert (await h.chat(secret, "fake/tok-2-nousage", stream=False)).status_code == 200
    assert (await h.chat(secret, "fake/tok-2")).status_code == 429
    assert (await h.chat(None, "fake/tok-2")).status_code == 401  # no key: no row
    await h.flush()
    store = h.service.store
    assert store is not None
    async with store.transaction(write=False) as tx:
        rows = [dict(r) for r in await tx.fetch("SELECT * FROM usage_ledger ORDER BY id")]
    assert [r["status"] for r in rows] == ["ok", "ok", "rpm_exceeded"]
    first = rows[0]
    assert first["request_id"] == rid and first["key_id"] == key["id"]
    assert first["model"] == "fake/tok-4" and first["provider"] == "fake"
    assert first["prompt_tokens"] == PROMPT_TOKENS and first["completion_tokens"] == 4
    assert first["usage_source"] == "reported" and first["api"] == "openai"
    assert first["upstream_id"] == CHUNK_ID and first["upstream_request_id"].startswith("up-")
    assert first["latency_ms"] > 0 and first["ttft_ms"] > 0
    assert rows[1]["usage_source"] == "counted" and rows[1]["completion_tokens"] == 2
    view = await h.chat_usage(secret)
    assert view["key"]["id"] == key["id"] and view["totals"]["requests"] == 3
    assert view["limits"]["rpm"]["limit"] == 2
    assert [m["model"] for m in view["by_model"]] == [
        "fake/tok-2",
        "fake/tok-2-nousage",
        "fake/tok-4",
    ]
    admin = (await h.admin("GET", "/admin/usage?by=key")).json()["data"]
    assert admin == [{**admin[0], "key": key["id"], "requests": 3}]


async def test_the_client_s_user_lands_in_the_row(
    harness_factory: type[Harness], store_url: str, upstream: ScriptedServer
) -> None:
    h = await harness_factory(store_url=store_url, fronts=("anthropic",)).start()
    secret, _ = await h.new_key(name="users")
    assert (await h.chat(secret, "fake/tok-2", user="openai-user")).status_code == 200
    assert (await h.chat(secret, "fake/tok-2", user="x" * 500)).status_code == 200
    assert (await h.chat(secret, "fake/tok-2")).status_code == 200
    assert h.http is not None
    messages = {
        "model": "fake/tok-2",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": '{"session_id": "s-1"}'},
    }
    r = await h.http.post("/v1/messages", json=messages, headers={"x-api-key": secret})
    assert r.status_code == 200, r.text
    await h.flush()
    store = h.service.store
    assert store is not None
    async with store.transaction(write=False) as tx:
        sql = "SELECT api, client_user FROM usage_ledger ORDER BY id"
        rows = [(r["api"], r["client_user"]) for r in await tx.fetch(sql)]
    assert rows == [
        ("openai", "openai-user"),
        ("openai", "x" * 200),  # client input, bounded as in the access log
        ("openai", None),
        ("anthropic", '{"session_id": "s-1"}'),
    ]


def test_svir_usage_and_keys_commands(tmp_path: Path, upstream: ScriptedServer) -> None:
    from svir.cli import main

    config = tmp_path / "svir.toml"
    config.write_text(
        f'[store]\nurl = "sqlite:///{tmp_path / "cli.db"}"\n'
        '[[prices]]\nmodel = "fake/"\ninput = 1.0\noutput = 2.0\n'
    )
    out = io.StringIO()
    from svir.edges import keys_cli

    def run(*argv: str) -> tuple[int, str]:
        import argparse

        from svir.cli import build_parser

        args: argparse.Namespace = build_parser().parse_args([*argv, "--config", str(config)])
        buf = io.StringIO()
        code = keys_cli.run(args, buf)
        return code, buf.getvalue()

    code, text = run("keys", "create", "--name", "cli", "--rpm", "5", "--budget", "1000/day",
                     "--cost-budget", "2.5/month", "--models", "fake/,other/x", "--expires", "30d")  # fmt: skip
    assert code == 0 and "sk-svir-" in text
    secret = next(w for w in text.split() if w.startswith("sk-svir-"))
    code, text = run("keys", "list")
    assert code == 0 and "cli" in text and "rpm 5" in text and "tok/day 1000" in text
    assert "$2.5/month" in text and secret not in text
    key_id = next(w for w in text.split() if w.startswith("key_"))
    code, text = run("usage", "--since", "1h")
    assert code == 0 and "No requests" in text
    code, text = run("keys", "revoke", key_id)
    assert code == 0 and "Revoked" in text
    code, text = run("keys", "list")
    assert "No keys" in text
    code, text = run("keys", "list", "--all", "--json")
    assert '"state":"revoked"' in text
    assert main(["keys", "revoke", "key_0000000000000000", "--config", str(config)]) == 1
    assert main(["keys", "create", "--name", "x", "--budget", "lots", "--config", str(config)]) == 2
    del out


async def test_svir_usage_summarises_what_was_served(
    harness_factory: type[Harness], tmp_path: Path, upstream: ScriptedServer
) -> None:
    import argparse

    from svir.cli import build_parser
    from svir.edges import keys_cli

    db = tmp_path / "usage.db"
    h = await harness_factory(store_url=f"sqlite:///{db}").start()
    secret, key = await h.new_key(name="summed")
    for model in ("fake/tok-4", "fake/tok-4", "other/tok-2"):
        assert (await h.chat(secret, model)).status_code == 200
    await h.flush()
    config = tmp_path / "svir.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{db}"\n')

    def usage(*argv: str) -> str:
        args: argparse.Namespace = build_parser().parse_args(
            ["usage", *argv, "--config", str(config)]
        )
        buf = io.StringIO()
        assert keys_cli.run(args, buf) == 0
        return buf.getvalue()

    text = await asyncio.to_thread(usage, "--since", "1h")
    lines = [line.split() for line in text.splitlines()[2:]]
    assert [line[:4] for line in lines] == [
        [key["id"], "fake/tok-4", "2", "0"],
        [key["id"], "other/tok-2", "1", "0"],
    ]
    as_json = await asyncio.to_thread(usage, "--by", "model", "--key", key["id"], "--json")
    import json

    data = json.loads(as_json)["data"]
    assert {d["model"]: d["completion_tokens"] for d in data} == {"fake/tok-4": 8, "other/tok-2": 2}
