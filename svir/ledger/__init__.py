"""The usage ledger: one row per chat request (table `usage_ledger`, migrations 2 and 3),
written in batches by a background task so that no request waits on the store.

A row holds the key, the model asked for and the one that served, the provider, the outcome, the
tokens in, out, of reasoning and from the cache, where those counts came from ("reported" by the
upstream, or "counted" by svir from what streamed and an estimate of the prompt), the cost in
micro-USD, the latency, the time to the first token, the tokens per second (§3.6), and the
request ids (svir's, the upstream's `x-request-id` and the answer's id, OpenRouter's generation
id among them), and the end user the client named (`client_user`: Anthropic's `metadata.user_id`,
OpenAI's `user`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from svir.call import CallRecord
from svir.store.base import SqlStore

__all__ = ["COLUMNS", "Ledger"]

log = logging.getLogger("svir.ledger")

# A row is a `svir.call.CallRecord`, as the key gate settles a call into one.
COLUMNS: Final = CallRecord.__struct_fields__
# A record's values in COLUMNS' order (its fields' order), 4x faster than an attrgetter of them.
_values = msgspec.structs.astuple
# The most rows one write takes. Turning rows into a statement's values runs on the event loop
# and holds it: a busy second's 6,000 rows held it 3-23 ms at once, and every request in flight
# waited (c=16 p99 doubled, BENCHMARKS.md). A slice of 500 holds it under a millisecond, and a
# row costs the same in slices of 500 as in batches of thousands (bench.ledger_rows).
SLICE_ROWS: Final = 500


class Ledger:
    """Collects rows (`record`, no await, no I/O) and writes them every `flush_seconds`."""

    def __init__(
        self, store: SqlStore, *, flush_seconds: float = 1.0, max_pending: int = 100_000
    ) -> None:
        self.store = store
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self.pending: list[CallRecord] = []
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    def record(self, row: CallRecord) -> None:
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            return
        self.pending.append(row)

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not write the usage ledger; will try again", exc_info=True)

    async def flush(self) -> int:
        """Write what is pending, in slices of at most `SLICE_ROWS` rows, each in a transaction
        of its own; on failure the rows not yet written go back to the front of the queue."""
        async with self._lock:
            rows, self.pending = self.pending, []
            start = 0
            try:
                while start < len(rows):
                    batch = rows[start : start + SLICE_ROWS]
                    await asyncio.shield(self._insert(batch))
                    self.written += len(batch)
                    start += len(batch)
            except BaseException:
                self.failures += 1
                rows = rows[start:]
                room = max(0, self.max_pending - len(self.pending))
                self.dropped += max(0, len(rows) - room)
                self.pending[:0] = rows[:room]
                raise
            return len(rows)

    async def _insert(self, rows: list[CallRecord]) -> None:
        # `flush` calls this with one row at least.
        values: list[tuple[Any, ...]] = list(map(_values, rows))
        columns: Sequence[str] = COLUMNS
        # A column that is None in every row of the batch is left out: the table's default for
        # it is NULL too, and a None costs SQLite's binding more than any other value (sqlite3
        # looks its adapter up, ~1.5k instructions; a row has about six when no key, price or
        # reasoning is involved). Only the first row's None columns can be such; the rows are
        # read in C (transposed, counted, transposed back), the loops in Python are per batch.
        maybe = [i for i, value in enumerate(values[0]) if value is None]
        if maybe:
            by_column = list(zip(*values, strict=True))
            empty = {i for i in maybe if by_column[i].count(None) == len(values)}
            if empty:
                kept = [i for i in range(len(COLUMNS)) if i not in empty]
                columns = [COLUMNS[i] for i in kept]
                values = list(zip(*[by_column[i] for i in kept], strict=True))
        await self.store.insert_rows("usage_ledger", columns, values)
