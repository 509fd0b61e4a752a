"""Reads of the usage ledger: summaries for `svir usage`, GET /v1/usage and the admin API, and
the history the console pages through (`ledger_page`, `ledger_rows`)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from svir.ledger import COLUMNS
from svir.store.base import Row, SqlStore

__all__ = ["ALL_KEYS", "GROUPS", "LedgerFilter", "ledger_page", "ledger_rows", "summarize"]


class _AllKeys:
    def __repr__(self) -> str:
        return "ALL_KEYS"


ALL_KEYS: Final = _AllKeys()
GROUPS: Final = ("key", "model", "served_model", "provider", "api", "status", "day")


def _group_expr(group: str, dialect: str) -> str:
    if group == "key":
        return "key_id"
    if group == "day":
        # Whole UTC days since the epoch (turned into a date below).
        if dialect == "postgresql":
            return "CAST(FLOOR(ts / 86400) AS BIGINT)"
        return "CAST(ts / 86400 AS INTEGER)"
    return group


async def summarize(
    store: SqlStore,
    *,
    since: float,
    until: float | None = None,
    key: str | _AllKeys | None = ALL_KEYS,
    by: tuple[str, ...] = ("model",),
) -> list[dict[str, Any]]:
    """Totals per group over `since` ≤ ts < `until`; `key` None is the requests made without a
    key (svir running open), ALL_KEYS every request."""
    for group in by:
        if group not in GROUPS:
            raise ValueError(f"cannot group by {group!r} (choose from {', '.join(GROUPS)})")
    exprs = [_group_expr(g, store.dialect) for g in by]
    where = ["ts >= ?"]
    args: list[Any] = [since]
    if until is not None:
        where.append("ts < ?")
        args.append(until)
    if key is None:
        where.append("key_id IS NULL")
    elif isinstance(key, str):
        where.append("key_id = ?")
        args.append(key)
    selected = [f"{e} AS g{i}" for i, e in enumerate(exprs)]
    sql = (
        "SELECT "
        + ", ".join(
            [
                *selected,
                "COUNT(*) AS requests",
                "SUM(CASE WHEN status = 'ok' THEN 0 ELSE 1 END) AS errors",
                "SUM(prompt_tokens) AS prompt_tokens",
                "SUM(completion_tokens) AS completion_tokens",
                "SUM(COALESCE(reasoning_tokens, 0)) AS reasoning_tokens",
                "SUM(COALESCE(cached_tokens, 0)) AS cached_tokens",
                "SUM(CASE WHEN usage_source = 'counted' THEN 1 ELSE 0 END) AS counted",
                "SUM(COALESCE(cost_micros, 0)) AS cost_micros",
                "AVG(latency_ms) AS latency_ms",
                "AVG(ttft_ms) AS ttft_ms",
                "AVG(tokens_per_second) AS tokens_per_second",
            ]
        )
        + " FROM usage_ledger WHERE "
        + " AND ".join(where)
    )
    if exprs:
        positions = ", ".join(str(i + 1) for i in range(len(exprs)))
        sql += f" GROUP BY {positions} ORDER BY {positions}"
    async with store.transaction(write=False) as tx:
        rows = await tx.fetch(sql, *args)
    out: list[dict[str, Any]] = []
    for row in rows:
        entry: dict[str, Any] = {}
        for i, group in enumerate(by):
            value = row[f"g{i}"]
            if group == "day" and value is not None:
                value = _day(int(value))
            entry[group] = value
        entry.update(
            requests=int(row["requests"] or 0),
            errors=int(row["errors"] or 0),
            prompt_tokens=int(row["prompt_tokens"] or 0),
            completion_tokens=int(row["completion_tokens"] or 0),
            reasoning_tokens=int(row["reasoning_tokens"] or 0),
            cached_tokens=int(row["cached_tokens"] or 0),
            counted=int(row["counted"] or 0),
            cost_usd=int(row["cost_micros"] or 0) / 1_000_000,
            latency_ms=_round(row["latency_ms"]),
            ttft_ms=_round(row["ttft_ms"]),
            tokens_per_second=_round(row["tokens_per_second"]),
        )
        entry["total_tokens"] = entry["prompt_tokens"] + entry["completion_tokens"]
        if entry["requests"] == 0:
            continue
        out.append(entry)
    return out


def _round(value: Any) -> float | None:
    return None if value is None else round(float(value), 2)


def _day(days: int) -> str:
    import datetime

    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=days)).isoformat()


class LedgerFilter(msgspec.Struct, frozen=True):
    """Which ledger rows a history page shows: each field that is set must match (`key` "none"
    is the requests made without a key), `since` <= ts < `until`, and ids below `before`."""

    key: str | None = None
    model: str | None = None
    provider: str | None = None
    api: str | None = None
    status: str | None = None
    since: float | None = None
    until: float | None = None
    before: int | None = None


_LEDGER_COLUMNS: Final = ("id", *COLUMNS)


def _ledger_row(row: Row) -> dict[str, Any]:
    return {name: row[name] for name in _LEDGER_COLUMNS}


async def ledger_page(
    store: SqlStore, where: LedgerFilter, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """The newest rows that match, at most `limit`, and the `before` cursor of the next page
    (None on the last)."""
    clauses: list[str] = []
    args: list[Any] = []
    if where.key is not None:
        if where.key == "none":
            clauses.append("key_id IS NULL")
        else:
            clauses.append("key_id = ?")
            args.append(where.key)
    for name in ("model", "provider", "api", "status"):
        value = getattr(where, name)
        if value is not None:
            clauses.append(f"{name} = ?")
            args.append(value)
    if where.since is not None:
        clauses.append("ts >= ?")
        args.append(where.since)
    if where.until is not None:
        clauses.append("ts < ?")
        args.append(where.until)
    if where.before is not None:
        clauses.append("id < ?")
        args.append(where.before)
    sql = f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM usage_ledger"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY id DESC LIMIT ?"
    async with store.transaction(write=False) as tx:
        rows = await tx.fetch(sql, *args, limit + 1)
    page = [_ledger_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    return page, (int(page[-1]["id"]) if more and page else None)


async def ledger_rows(store: SqlStore, request_id: str) -> list[dict[str, Any]]:
    """Every ledger row of one request, oldest first."""
    async with store.transaction(write=False) as tx:
        rows = await tx.fetch(
            f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM usage_ledger WHERE request_id = ?"
            " ORDER BY id",
            request_id,
        )
    return [_ledger_row(r) for r in rows]
