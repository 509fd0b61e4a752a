"""CPU time per usage-ledger row as `Ledger.flush` writes batches of rows to a store, for this svir
tree and each `--compare-src` tree side by side (each tree in its own child process, the trees
alternating round after round; the median of the rounds is shown).

A flush's fixed cost (the transaction, the thread hops) is paid once per batch, and a batch is
what the server recorded in the second since the last flush: a few rows on a quiet server,
thousands on a busy one, so the figure is given per row at several batch sizes. CPU time is the
process's, all threads included (`resource.getrusage`: user, system and both), so it counts the
store's thread and the kernel's work on the commit's fsync, not the wall-clock wait for the disk.
The rows are made before the clock starts; `record` and `flush` are timed.

    .venv/bin/python -m bench.ledger_rows [--compare-src DIR ...] [--sizes 10,50,500,2000]
        [--rounds 5] [--rows 4000] [--url postgresql://...] [--callgrind]

CPU time on these shared machines moves with their load, a flush's thread hand-offs most of all;
`--callgrind` counts instructions per row instead (each child under valgrind, twice: flushing all
its batches, and only the first half of the same ones; the difference over the rows of the second
half), a figure the load does not move but that leaves out the kernel's work (the fsync, waking
the store's thread).

Without `--url` each child writes a new SQLite store in a temporary directory (svir's default:
WAL, synchronous=FULL); with it, every child writes to that store (its `usage_ledger` table
grows) and the PostgreSQL server process behind the pool's connection is measured too ("server":
its CPU per row from /proc, in clock ticks, so give it `--rows 20000` or more). Request ids are as
svir makes them (a per-process prefix and a counter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _process_cpu(pid: int) -> float:
    """Another process's CPU time (user + system, seconds; in clock ticks, 10 ms on Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _child(
    url: str | None, sizes: list[int], rows_per_size: int, half: bool
) -> dict[str, Any]:
    from svir.call import CallRecord
    from svir.chat import unique_id
    from svir.ledger import Ledger
    from svir.store import open_store
    from svir.store.base import SqlStore

    def record() -> CallRecord:
        return CallRecord(
            ts=time.time(),
            request_id=unique_id(),
            key_id="key_aaaaaaaaaaaaaaaa",
            api="openai",
            model="fake/json",
            served_model="fake/json",
            provider="fake",
            status="ok",
            prompt_tokens=10,
            completion_tokens=20,
            reasoning_tokens=None,
            cached_tokens=None,
            usage_source="reported",
            cost_micros=30,
            latency_ms=1.5,
            ttft_ms=1.0,
            tokens_per_second=100.0,
            upstream_request_id=None,
            upstream_id="chatcmpl-" + unique_id(),
            client_user=None,
        )

    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(url or f"sqlite:///{tmp}/ledger.db")
        assert isinstance(store, SqlStore)
        ledger = Ledger(store, flush_seconds=3600)
        out: dict[str, Any] = {"svir": str(Path(sys.modules["svir"].__file__ or "").resolve())}
        try:
            for size in sizes:
                flushes = max(10, rows_per_size // size)
                batches = [[record() for _ in range(size)] for _ in range(flushes + 1)]
                for row in batches.pop():  # warm-up
                    ledger.record(row)
                await ledger.flush()
                backend = await _backend(store)
                server0 = _process_cpu(backend) if backend else 0.0
                if half:  # the rows are made all the same, for `--callgrind`'s difference
                    del batches[len(batches) // 2 :]
                    flushes = len(batches)
                written = 0
                user0, sys0 = _cpu()
                for batch in batches:
                    for row in batch:
                        ledger.record(row)
                    written += await ledger.flush()
                user1, sys1 = _cpu()
                assert written == size * flushes
                out[str(size)] = {
                    "user": (user1 - user0) / written * 1e6,
                    "sys": (sys1 - sys0) / written * 1e6,
                }
                if backend:
                    if await _backend(store) != backend:
                        raise SystemExit("the pool changed connections: no server figure")
                    out[str(size)]["server"] = (_process_cpu(backend) - server0) / written * 1e6
        finally:
            await store.close()
    return out


async def _backend(store: Any) -> int | None:
    """The PostgreSQL server process behind the pool's (one, idle) connection."""
    if store.dialect != "postgresql":
        return None
    async with store.transaction(write=False) as tx:
        return int(await tx.fetchval("SELECT pg_backend_pid()"))


def _run_tree(
    src: Path, args: argparse.Namespace, sizes: str, *, callgrind: bool = False, half: bool = False
) -> tuple[dict[str, Any], int]:
    """The child's figures, and the instructions it ran under callgrind (else 0)."""
    # Run as a script, not with -m: the script's own directory, not the working directory, comes
    # first on sys.path, so PYTHONPATH decides which tree's svir is imported.
    command = [sys.executable, __file__, "--child", "--sizes", sizes, "--rows", str(args.rows)]
    if args.url:
        command += ["--url", args.url]
    if half:
        command.append("--half")
    if callgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(command, cwd=src, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{src}: {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    if not Path(result.pop("svir")).is_relative_to(src.resolve()):
        raise SystemExit(f"{src}: the child imported another tree's svir")
    found = re.search(r"Collected : (\d+)", done.stderr) if callgrind else None
    if callgrind and not found:
        raise SystemExit(f"{src}: no callgrind total in: {done.stderr[-2000:]}")
    return result, int(found.group(1)) if found else 0


def _instructions(
    trees: list[tuple[str, Path]], args: argparse.Namespace, sizes: list[int]
) -> None:
    """Instructions per row under callgrind: a child that flushes every batch less one that makes
    the same rows and flushes only the first half of them, over the rows of the second half."""
    print("Instructions per ledger row (callgrind, all threads; the kernel's work not counted)")
    for name, src in trees:
        print(f"  {name}: {src}")
    print("rows/flush " + "".join(f"{name:>14}" for name, _ in trees))
    for size in sizes:
        cells = []
        for _, src in trees:
            _, whole = _run_tree(src, args, str(size), callgrind=True)
            _, part = _run_tree(src, args, str(size), callgrind=True, half=True)
            flushes = max(10, args.rows // size)
            rows = (flushes - flushes // 2) * size
            cells.append(f"{(whole - part) / rows:14,.0f}")
        print(f"{size:>10} " + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare-src", type=Path, action="append", default=[])
    parser.add_argument("--sizes", default="10,50,500,2000", help="rows per flush, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=4000, help="rows written per size (at least)")
    parser.add_argument("--url", help="a store URL to write to instead of a new SQLite file")
    parser.add_argument(
        "--callgrind", action="store_true", help="count instructions instead (needs valgrind)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--half", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(asyncio.run(_child(args.url, sizes, args.rows, args.half))))
        return
    trees = [("this", ROOT), *((f"other{i + 1}", p) for i, p in enumerate(args.compare_src))]
    if args.callgrind:
        _instructions(trees, args, sizes)
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    for _ in range(args.rounds):
        for name, src in trees:
            runs[name].append(_run_tree(src, args, args.sizes)[0])
    print(f"CPU us per ledger row, median of {args.rounds} rounds (user + sys = total)")
    for name, src in trees:
        print(f"  {name}: {src}")
    header = "rows/flush " + "".join(f"{name:>40}" for name, _ in trees)
    print(header)
    for size in sizes:
        cells = []
        for name, _ in trees:
            user = statistics.median(r[str(size)]["user"] for r in runs[name])
            system = statistics.median(r[str(size)]["sys"] for r in runs[name])
            total = statistics.median(
                r[str(size)]["user"] + r[str(size)]["sys"] for r in runs[name]
            )
            cell = f"{user:6.1f} + {system:5.1f} = {total:6.1f}"
            if "server" in runs[name][0][str(size)]:
                server = statistics.median(r[str(size)]["server"] for r in runs[name])
                cell += f" (server {server:5.1f})"
            cells.append(cell)
        print(f"{size:>10} " + "".join(f"{c:>40}" for c in cells))


if __name__ == "__main__":
    main()
