"""The store's schema, as numbered migrations per database.

A migration is never edited once released: a change to the schema is a new migration with the next
number. On start, the store applies, in order and each in the same transaction as its record in
`svir_schema`, the migrations the database has not seen; a database that has seen a number this
version does not know was written by a newer svir, and the store refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from svir.errors import SchemaTooNew
from svir.store.base import Tx

__all__ = ["MIGRATIONS", "SCHEMA_TABLE", "Migration", "apply_migrations", "latest"]

SCHEMA_TABLE: Final = "svir_schema"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


_SQLITE_1 = (
    """CREATE TABLE threads (
        pk INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        model TEXT,
        system TEXT,
        metadata TEXT,
        lease_id TEXT,
        lease_until REAL,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        message_count INTEGER NOT NULL DEFAULT 0,
        attachment_bytes INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX threads_owner ON threads (owner, pk)",
    """CREATE TABLE messages (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        created_at REAL NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        tool_calls TEXT,
        tool_call_id TEXT,
        reasoning TEXT,
        reasoning_carrier TEXT,
        refusal TEXT,
        finish_reason TEXT,
        model TEXT,
        usage TEXT,
        UNIQUE (thread_id, seq)
    )""",
    """CREATE TABLE blobs (
        hash TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        data BLOB NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE thread_blobs (
        thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
        hash TEXT NOT NULL REFERENCES blobs (hash),
        media_type TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (thread_id, hash)
    )""",
    "CREATE INDEX thread_blobs_hash ON thread_blobs (hash)",
)

_POSTGRES_1 = (
    """CREATE TABLE threads (
        pk BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        model TEXT,
        system TEXT,
        metadata TEXT,
        lease_id TEXT,
        lease_until DOUBLE PRECISION,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        message_count BIGINT NOT NULL DEFAULT 0,
        attachment_bytes BIGINT NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX threads_owner ON threads (owner, pk)",
    """CREATE TABLE messages (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        tool_calls TEXT,
        tool_call_id TEXT,
        reasoning TEXT,
        reasoning_carrier TEXT,
        refusal TEXT,
        finish_reason TEXT,
        model TEXT,
        usage TEXT,
        UNIQUE (thread_id, seq)
    )""",
    """CREATE TABLE blobs (
        hash TEXT PRIMARY KEY,
        size BIGINT NOT NULL,
        data BYTEA NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE thread_blobs (
        thread_id TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
        hash TEXT NOT NULL REFERENCES blobs (hash),
        media_type TEXT NOT NULL,
        size BIGINT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (thread_id, hash)
    )""",
    "CREATE INDEX thread_blobs_hash ON thread_blobs (hash)",
)

# 2: svir's own API keys (svir.keys) and the usage ledger (svir.ledger).
_SQLITE_2 = (
    """CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        hint TEXT NOT NULL,
        models TEXT,
        rpm INTEGER,
        tpm INTEGER,
        concurrent INTEGER,
        tokens_per_day INTEGER,
        tokens_per_month INTEGER,
        cost_per_day INTEGER,
        cost_per_month INTEGER,
        created_at REAL NOT NULL,
        expires_at REAL,
        revoked_at REAL
    )""",
    """CREATE TABLE usage_ledger (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        request_id TEXT NOT NULL,
        key_id TEXT,
        api TEXT NOT NULL,
        model TEXT NOT NULL,
        served_model TEXT,
        provider TEXT,
        status TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER,
        cached_tokens INTEGER,
        usage_source TEXT NOT NULL,
        cost_micros INTEGER,
        latency_ms REAL,
        ttft_ms REAL,
        tokens_per_second REAL,
        upstream_request_id TEXT,
        upstream_id TEXT
    )""",
    "CREATE INDEX usage_ledger_ts ON usage_ledger (ts)",
    "CREATE INDEX usage_ledger_key_ts ON usage_ledger (key_id, ts)",
)

_POSTGRES_2 = (
    """CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        hint TEXT NOT NULL,
        models TEXT,
        rpm BIGINT,
        tpm BIGINT,
        concurrent BIGINT,
        tokens_per_day BIGINT,
        tokens_per_month BIGINT,
        cost_per_day BIGINT,
        cost_per_month BIGINT,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        revoked_at DOUBLE PRECISION
    )""",
    """CREATE TABLE usage_ledger (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts DOUBLE PRECISION NOT NULL,
        request_id TEXT NOT NULL,
        key_id TEXT,
        api TEXT NOT NULL,
        model TEXT NOT NULL,
        served_model TEXT,
        provider TEXT,
        status TEXT NOT NULL,
        prompt_tokens BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        reasoning_tokens BIGINT,
        cached_tokens BIGINT,
        usage_source TEXT NOT NULL,
        cost_micros BIGINT,
        latency_ms DOUBLE PRECISION,
        ttft_ms DOUBLE PRECISION,
        tokens_per_second DOUBLE PRECISION,
        upstream_request_id TEXT,
        upstream_id TEXT
    )""",
    "CREATE INDEX usage_ledger_ts ON usage_ledger (ts)",
    "CREATE INDEX usage_ledger_key_ts ON usage_ledger (key_id, ts)",
)

# 3: the end user the client named (Anthropic's `metadata.user_id`, OpenAI's `user`) in the ledger.
_LEDGER_CLIENT_USER_3 = ("ALTER TABLE usage_ledger ADD COLUMN client_user TEXT",)


# 4: the Responses API's stored responses (svir.store.responses) and svir's own secrets (the key
# that seals reasoning items, shared by every replica on the store).
def _responses_4(real: str, serial: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE responses (
        pk {serial},
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        created_at {real} NOT NULL,
        model TEXT NOT NULL,
        previous_response_id TEXT,
        input_items TEXT NOT NULL,
        output_items TEXT NOT NULL,
        response TEXT NOT NULL
    )""",
        f"""CREATE TABLE svir_secrets (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        created_at {real} NOT NULL
    )""",
    )


_SQLITE_4 = _responses_4("REAL", "INTEGER PRIMARY KEY AUTOINCREMENT")
_POSTGRES_4 = _responses_4("DOUBLE PRECISION", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY")


# 5: the console's captures (svir.store.captures: a request's four byte streams, secrets redacted,
# read by every worker on the store) and the ledger looked up by request id (a request's page).
def _captures_5(real: str, serial: str, blob: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE captures (
        pk {serial},
        request_id TEXT NOT NULL,
        created_at {real} NOT NULL,
        api TEXT,
        provider TEXT,
        model TEXT,
        server TEXT,
        options TEXT NOT NULL,
        client_headers TEXT NOT NULL,
        client_body {blob} NOT NULL,
        upstream_url TEXT,
        upstream_headers TEXT NOT NULL,
        upstream_body {blob} NOT NULL,
        upstream_status INTEGER,
        upstream_stream {blob} NOT NULL,
        client_status INTEGER,
        client_stream {blob} NOT NULL,
        truncated INTEGER NOT NULL
    )""",
        "CREATE INDEX captures_request_id ON captures (request_id)",
        "CREATE INDEX captures_created_at ON captures (created_at)",
        "CREATE INDEX usage_ledger_request_id ON usage_ledger (request_id)",
    )


_SQLITE_5 = _captures_5("REAL", "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB")
_POSTGRES_5 = _captures_5(
    "DOUBLE PRECISION", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "BYTEA"
)

MIGRATIONS: Final[dict[str, tuple[Migration, ...]]] = {
    "sqlite": (
        Migration(1, "threads, messages and attachments", _SQLITE_1),
        Migration(2, "api keys and the usage ledger", _SQLITE_2),
        Migration(3, "the client's user in the usage ledger", _LEDGER_CLIENT_USER_3),
        Migration(4, "stored responses and svir's secrets", _SQLITE_4),
        Migration(5, "the console's captures", _SQLITE_5),
    ),
    "postgresql": (
        Migration(1, "threads, messages and attachments", _POSTGRES_1),
        Migration(2, "api keys and the usage ledger", _POSTGRES_2),
        Migration(3, "the client's user in the usage ledger", _LEDGER_CLIENT_USER_3),
        Migration(4, "stored responses and svir's secrets", _POSTGRES_4),
        Migration(5, "the console's captures", _POSTGRES_5),
    ),
}


def latest(dialect: str) -> int:
    return max(m.version for m in MIGRATIONS[dialect])


async def apply_migrations(tx: Tx, dialect: str) -> int:
    """Bring the schema up to date inside `tx`, which the caller holds exclusively (a write
    transaction on SQLite, an advisory lock on PostgreSQL). Returns the schema's version."""
    real = "REAL" if dialect == "sqlite" else "DOUBLE PRECISION"
    await tx.execute(
        f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER PRIMARY KEY,"
        f" name TEXT NOT NULL, applied_at {real} NOT NULL)"
    )
    done = {int(r["version"]) for r in await tx.fetch(f"SELECT version FROM {SCHEMA_TABLE}")}
    known = MIGRATIONS[dialect]
    newest = latest(dialect)
    if done and max(done) > newest:
        raise SchemaTooNew(
            f"the database's schema is at version {max(done)}, and this svir knows versions up"
            f" to {newest} only: run a newer svir, or point [store] url at another database"
        )
    for migration in known:
        if migration.version in done:
            continue
        for statement in migration.statements:
            await tx.execute(statement)
        await tx.execute(
            f"INSERT INTO {SCHEMA_TABLE} (version, name, applied_at) VALUES (?, ?, ?)",
            migration.version,
            migration.name,
            await tx.now(),
        )
    return newest
