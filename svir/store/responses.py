"""The Responses API's stored responses (table `responses`, migration 4) and svir's own secrets
(`svir_secrets`), as queries over the store's transactions, on SQLite and PostgreSQL alike.

A response's row keeps what a continuation needs (the request's input items and the answer's
output items, in the Responses API's item shapes) and what retrieval answers (the response
object); `previous_response_id` links a row to the one it continued, and a chain is read back in
one recursive query, each hop of the same owner.
"""

from __future__ import annotations

import os
from typing import Any, Final

import msgspec

from svir.errors import NotFound
from svir.protocols.responses.routes import ResponseStore, StoredResponse
from svir.store import make_store
from svir.store.base import Row, SqlStore

__all__ = ["SqlResponseStore"]

_encode = msgspec.json.encode
_decode = msgspec.json.decode
_COLUMNS: Final = (
    "id, owner, created_at, model, previous_response_id, input_items, output_items, response"
)
# A chain longer than this is cut (its oldest part dropped): no client keeps one so long, and a
# hostile one cannot make the query run without end.
MAX_CHAIN: Final = 10_000


def _record(row: Row) -> StoredResponse:
    return StoredResponse(
        id=row["id"],
        owner=row["owner"],
        created_at=float(row["created_at"]),
        model=row["model"],
        previous_response_id=row["previous_response_id"],
        input_items=_decode(row["input_items"]),
        output_items=_decode(row["output_items"]),
        response=_decode(row["response"]),
    )


class SqlResponseStore(ResponseStore):
    """The responses in the SQL store `url` names (opened at start-up by the front end)."""

    def __init__(self, url: str) -> None:
        store = make_store(url)
        if not isinstance(store, SqlStore):
            raise RuntimeError("svir's stored responses need an SQL store")
        self.store = store
        self.dialect = store.dialect
        self._secrets: dict[str, bytes] = {}

    async def open(self) -> None:
        await self.store.open()

    async def close(self) -> None:
        await self.store.close()

    async def put(self, record: StoredResponse) -> None:
        async with self.store.transaction(write=True) as tx:
            await tx.execute(
                f"INSERT INTO responses ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                record.id,
                record.owner,
                record.created_at,
                record.model,
                record.previous_response_id,
                _encode(record.input_items).decode(),
                _encode(record.output_items).decode(),
                _encode(record.response).decode(),
            )

    async def get(self, owner: str, response_id: str) -> StoredResponse:
        async with self.store.transaction(write=False) as tx:
            row = await tx.fetchrow(
                f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND owner = ?",
                response_id,
                owner,
            )
        if row is None:
            raise NotFound(response_id)
        return _record(row)

    async def delete(self, owner: str, response_id: str) -> None:
        async with self.store.transaction(write=True) as tx:
            changed = await tx.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ?", response_id, owner
            )
        if not changed:
            raise NotFound(response_id)

    async def chain(self, owner: str, response_id: str) -> list[StoredResponse]:
        columns = ", ".join(f"r.{c.strip()}" for c in _COLUMNS.split(","))
        async with self.store.transaction(write=False) as tx:
            rows = await tx.fetch(
                f"WITH RECURSIVE chain ({_COLUMNS}, depth) AS ("
                f" SELECT {_COLUMNS}, 0 FROM responses WHERE id = ? AND owner = ?"
                f" UNION ALL SELECT {columns}, c.depth + 1 FROM responses r"
                " JOIN chain c ON r.id = c.previous_response_id"
                " WHERE r.owner = ? AND c.depth < ?)"
                f" SELECT {_COLUMNS} FROM chain ORDER BY depth DESC",
                response_id,
                owner,
                owner,
                MAX_CHAIN,
            )
        if not rows:
            raise NotFound(response_id)
        return [_record(r) for r in rows]

    async def secret(self, name: str) -> bytes:
        """A random 32-byte secret kept under `name`, made on first use; every replica on the
        store reads the same one (the first writer's)."""
        known = self._secrets.get(name)
        if known is not None:
            return known
        async with self.store.transaction(write=True) as tx:
            await tx.execute(
                "INSERT INTO svir_secrets (name, value, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                name,
                os.urandom(32).hex(),
                await tx.now(),
            )
            value: Any = await tx.fetchval("SELECT value FROM svir_secrets WHERE name = ?", name)
        secret = bytes.fromhex(str(value))
        self._secrets[name] = secret
        return secret
