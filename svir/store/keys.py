"""The keys' rows in the store (table `api_keys`, migration 2): queries over the store's
transactions, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from svir.keys.limits import Limits
from svir.keys.model import KeyRecord, KeySpec, hash_secret, hint_of, new_key_id, new_secret
from svir.store.base import Row, SqlStore

__all__ = ["KeyStore"]

_COLUMNS: Final = (
    "id, name, hint, models, rpm, tpm, concurrent, tokens_per_day, tokens_per_month,"
    " cost_per_day, cost_per_month, created_at, expires_at, revoked_at"
)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def record_of(row: Row) -> KeyRecord:
    models = row["models"]
    return KeyRecord(
        id=row["id"],
        name=row["name"],
        hint=row["hint"],
        models=tuple(msgspec.json.decode(models)) if models is not None else None,
        limits=Limits(
            rpm=_int(row["rpm"]),
            tpm=_int(row["tpm"]),
            concurrent=_int(row["concurrent"]),
            tokens_per_day=_int(row["tokens_per_day"]),
            tokens_per_month=_int(row["tokens_per_month"]),
            cost_per_day=_int(row["cost_per_day"]),
            cost_per_month=_int(row["cost_per_month"]),
        ),
        created_at=float(row["created_at"]),
        expires_at=_float(row["expires_at"]),
        revoked_at=_float(row["revoked_at"]),
    )


class KeyStore:
    def __init__(self, store: SqlStore) -> None:
        self.store = store

    async def create(self, spec: KeySpec) -> tuple[KeyRecord, str]:
        """A new key and its secret (the only time the secret exists outside the client)."""
        secret = new_secret()
        key_id = new_key_id()
        limits = spec.limits
        models = msgspec.json.encode(list(spec.models)).decode() if spec.models else None
        async with self.store.transaction(write=True) as tx:
            now = await tx.now()
            await tx.execute(
                "INSERT INTO api_keys (id, name, secret_hash, hint, models, rpm, tpm, concurrent,"
                " tokens_per_day, tokens_per_month, cost_per_day, cost_per_month, created_at,"
                " expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                key_id,
                spec.name,
                hash_secret(secret),
                hint_of(secret),
                models,
                limits.rpm,
                limits.tpm,
                limits.concurrent,
                limits.tokens_per_day,
                limits.tokens_per_month,
                limits.cost_per_day,
                limits.cost_per_month,
                now,
                spec.expires_at,
            )
            row = await tx.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", key_id)
        assert row is not None
        return record_of(row), secret

    async def by_hash(self, digest: str) -> KeyRecord | None:
        async with self.store.transaction(write=False) as tx:
            row = await tx.fetchrow(
                f"SELECT {_COLUMNS} FROM api_keys WHERE secret_hash = ?", digest
            )
        return None if row is None else record_of(row)

    async def get(self, key_id: str) -> KeyRecord | None:
        async with self.store.transaction(write=False) as tx:
            row = await tx.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", key_id)
        return None if row is None else record_of(row)

    async def list(self, *, include_revoked: bool = False) -> list[KeyRecord]:
        where = "" if include_revoked else " WHERE revoked_at IS NULL"
        async with self.store.transaction(write=False) as tx:
            rows = await tx.fetch(f"SELECT {_COLUMNS} FROM api_keys{where} ORDER BY created_at, id")
        return [record_of(r) for r in rows]

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke a key (again is a no-op); None when there is no such key."""
        async with self.store.transaction(write=True) as tx:
            now = await tx.now()
            await tx.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                now,
                key_id,
            )
            row = await tx.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", key_id)
        return None if row is None else record_of(row)

    async def configured(self) -> bool:
        """Whether svir has keys: any key not revoked (an expired key still counts, so that a key
        running out never opens svir up)."""
        async with self.store.transaction(write=False) as tx:
            row = await tx.fetchrow("SELECT id FROM api_keys WHERE revoked_at IS NULL LIMIT 1")
        return row is not None
