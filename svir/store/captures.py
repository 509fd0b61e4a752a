"""The console's captures (table `captures`, migration 5), as queries over the store's
transactions, on SQLite and PostgreSQL alike (the ledger's history the console reads beside them
is the ledger's: svir.ledger.queries).

A capture is one request's four byte streams, already redacted and bounded when they get here
(svir.console.capture): kept in the shared store so that every worker's console shows every
worker's captures, and pruned by age and by count as new ones are written.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from svir.store.base import Row, SqlStore

__all__ = ["CaptureRecord", "CaptureStore"]

_encode = msgspec.json.encode
_decode = msgspec.json.decode


class CaptureRecord(msgspec.Struct, gc=False):
    """One request's capture, as stored."""

    request_id: str
    created_at: float
    api: str | None
    provider: str | None
    model: str | None
    # The upstream kind whose decoder reads `upstream_stream`, and its options (think_tags,
    # tool_names): what a conformance case needs to replay it.
    server: str | None
    options: dict[str, Any]
    client_headers: list[list[str]]
    client_body: bytes
    upstream_url: str | None
    upstream_headers: list[list[str]]
    upstream_body: bytes
    upstream_status: int | None
    upstream_stream: bytes
    client_status: int | None
    client_stream: bytes
    truncated: bool


_FIELDS: Final = CaptureRecord.__struct_fields__
_JSON_FIELDS: Final = frozenset({"options", "client_headers", "upstream_headers"})
_BYTES_FIELDS: Final = frozenset(
    {"client_body", "upstream_body", "upstream_stream", "client_stream"}
)


def _value(record: CaptureRecord, name: str) -> Any:
    value = getattr(record, name)
    if name in _JSON_FIELDS:
        return _encode(value).decode()
    if name == "truncated":
        return int(value)
    return value


def _record(row: Row) -> CaptureRecord:
    values: dict[str, Any] = {}
    for name in _FIELDS:
        value = row[name]
        if name in _JSON_FIELDS:
            value = _decode(value)
        elif name in _BYTES_FIELDS:
            value = bytes(value)
        elif name == "truncated":
            value = bool(value)
        elif name == "created_at":
            value = float(value)
        values[name] = value
    return CaptureRecord(**values)


class CaptureStore:
    """Captures in `store` (opened and closed by its owner, the keys service), kept at most
    `max_rows` and `max_age` seconds by `clock` (Unix seconds)."""

    def __init__(self, store: SqlStore, *, max_rows: int, max_age: float, clock: Any) -> None:
        self.store = store
        self.max_rows = max_rows
        self.max_age = max_age
        self.clock = clock

    async def put(self, record: CaptureRecord) -> None:
        """Keep `record`, and let go of what is now too old or past the count."""
        names = ", ".join(_FIELDS)
        marks = ", ".join("?" * len(_FIELDS))
        async with self.store.transaction(write=True) as tx:
            await tx.execute(
                f"INSERT INTO captures ({names}) VALUES ({marks})",
                *[_value(record, n) for n in _FIELDS],
            )
        await self.prune()

    async def prune(self) -> int:
        """Delete the captures older than `max_age` and all but the newest `max_rows`."""
        async with self.store.transaction(write=True) as tx:
            gone = await tx.execute(
                "DELETE FROM captures WHERE created_at < ?", self.clock() - self.max_age
            )
            edge = await tx.fetchval(
                "SELECT pk FROM captures ORDER BY pk DESC LIMIT 1 OFFSET ?", self.max_rows
            )
            if edge is not None:
                gone += await tx.execute("DELETE FROM captures WHERE pk <= ?", edge)
        return gone

    async def get(self, request_id: str) -> CaptureRecord | None:
        """The newest capture of `request_id` still within `max_age`."""
        async with self.store.transaction(write=False) as tx:
            row = await tx.fetchrow(
                f"SELECT {', '.join(_FIELDS)} FROM captures WHERE request_id = ?"
                " AND created_at >= ? ORDER BY pk DESC LIMIT 1",
                request_id,
                self.clock() - self.max_age,
            )
        return None if row is None else _record(row)

    async def count(self) -> int:
        async with self.store.transaction(write=False) as tx:
            return int(await tx.fetchval("SELECT COUNT(*) FROM captures"))
