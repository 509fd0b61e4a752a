"""Upstream HTTP clients compared: the cost of one streamed upstream call, in one process.

Starts the scripted upstream (`tests.support.upstream`), then in this process (uvloop) runs
`--requests` POSTs of a 20-chunk stream at `--concurrency`, reading each body to its end, with
each client in turn (alternating over `--rounds`): aiohttp (as svir used it: one ClientSession,
a TCPConnector), httpx (AsyncClient, HTTP/1.1) and svir's minimal client (`svir.edges.h1`). The client process is
the bottleneck (the upstream answers from memory), so requests/s measures the client's cost.

    .venv/bin/python -m bench.upstream_clients [--requests 20000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import uvloop

from bench.common import request_body, start_fake_upstream
from svir.edges.h1 import H1Pool

HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}

Call = Callable[[], Awaitable[int]]


async def run(call: Call, n: int, concurrency: int) -> float:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            size = await call()
            if size < 1000:
                raise RuntimeError(f"short body: {size}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - t0)


async def main_async(port: int, args: argparse.Namespace) -> dict[str, list[float]]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = request_body("stream-20", True)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
    )
    hx = httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=None)
    pool = H1Pool()

    async def with_aiohttp() -> int:
        async with asyncio.timeout(300):
            resp = await session.post(
                url, data=body, headers=HEADERS,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )  # fmt: skip
        size = 0
        try:
            while data := await resp.content.readany():
                size += len(data)
        finally:
            resp.release()
        return size

    async def with_httpx() -> int:
        size = 0
        async with hx.stream("POST", url, content=body, headers=HEADERS) as resp:
            async for data in resp.aiter_raw():
                size += len(data)
        return size

    async def with_h1() -> int:
        async with asyncio.timeout(300):
            resp = await pool.request("POST", url, headers=HEADERS, body=body)
        size = 0
        try:
            while data := await resp.read():
                size += len(data)
        finally:
            resp.close()
        return size

    clients: dict[str, Call] = {"aiohttp": with_aiohttp, "httpx": with_httpx, "svir h1": with_h1}
    out: dict[str, list[float]] = {name: [] for name in clients}
    for call in clients.values():  # warm-up: connections, caches
        await run(call, 500, args.concurrency)
    for _ in range(args.rounds):
        for name, call in clients.items():
            rate = await run(call, args.requests, args.concurrency)
            out[name].append(rate)
            print(f"  {name:8} {rate:10,.0f} req/s", flush=True)
    await session.close()
    await hx.aclose()
    pool.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="svir-clients-"))
    upstream, port = start_fake_upstream(tmp / "upstream.log")
    try:
        out = uvloop.run(main_async(port, args))
    finally:
        upstream.stop()
    print()
    print(f"{args.requests} streamed POSTs (20 chunks) at concurrency {args.concurrency},"
          f" {args.rounds} rounds; req/s of the client process")  # fmt: skip
    print()
    print("| client | req/s min | req/s median | vs aiohttp |")
    print("|---|---|---|---|")
    base = statistics.median(out["aiohttp"])
    for name, rates in out.items():
        med = statistics.median(rates)
        print(f"| {name} | {min(rates):,.0f} | {med:,.0f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
