"""What a streamed request's commit deadline costs when its upstream answers in time (the common
case): opening and streaming under `EarlyStart` (its commit's timer set, then cancelled) against the same
without it (`send_stream` alone). Alternating rounds in one process, the loop run between
requests as a server runs it; the best of each.

    .venv/bin/python -m bench.early_start
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from svir.protocols.http import open_early, send_stream, sse_early_start

HEADERS = {"x-request-id": "bench"}


async def _send(message: Any) -> None:
    pass


async def _opened() -> int:
    return 1


async def _pieces() -> AsyncIterator[bytes]:
    yield b'data: {"choices":[]}\n\n'
    yield b"data: [DONE]\n\n"


async def with_deadline() -> None:
    early = sse_early_start(_send, dict(HEADERS))
    early.commit.due_after(5.0)  # the policy says it for each attempt
    await open_early(_opened(), early)
    await early.stream(_pieces())


async def without() -> None:
    await _opened()
    await send_stream(_send, _pieces(), dict(HEADERS))


async def _best(work: Callable[[], Awaitable[None]], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await work()
        await asyncio.sleep(0)  # the loop runs between requests (and drops cancelled timers)
    return (time.perf_counter() - started) / n


async def main(n: int = 20000, rounds: int = 5) -> None:
    best = {"without": float("inf"), "with the deadline": float("inf")}
    for _ in range(rounds):
        best["without"] = min(best["without"], await _best(without, n))
        best["with the deadline"] = min(best["with the deadline"], await _best(with_deadline, n))
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1e6:.2f} us per streamed request (open + stream)")


if __name__ == "__main__":
    asyncio.run(main())
