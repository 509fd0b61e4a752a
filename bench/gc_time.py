"""Time in CPython's garbage collector per request, under load: `svir serve` with `gc.callbacks`
timing every collection (the collector's own work: no sampling), loaded by `wrk -c16` with
non-streamed requests and then 20-chunk streams, once per young-generation threshold given.

    .venv/bin/python -m bench.gc_time [--duration 5] [--thresholds 700,10000]

For each threshold (svir.server's YOUNG_GC_THRESHOLD replaced in the child) and kind: the
requests answered (wrk's rate times the duration), the collections of each generation and the
milliseconds they took, and the collector's µs per request; svir's CPU µs per request beside it
(bench.common.run_wrk's, load-sensitive). A run with a failed request stops the bench.
Needs `wrk`.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The child reports its collector's figures on SIGUSR2 (and zeroes them on SIGUSR1) as a line
# starting with this word in its log.
REPORT = "GC-REPORT"


def serve(argv: list[str]) -> int:
    """`svir serve argv` with every collection timed; `SVIR_BENCH_YOUNG_GC` replaces the
    threshold svir sets once started."""
    import json

    stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            entry = stats[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started[0]

    def zero(signum: int, frame: Any) -> None:
        for entry in stats.values():
            entry[0], entry[1] = 0, 0.0

    def report(signum: int, frame: Any) -> None:
        figures = {g: [n, round(t * 1000, 3)] for g, (n, t) in stats.items()}
        print(REPORT, json.dumps(figures), file=sys.stderr, flush=True)

    gc.callbacks.append(timed)
    signal.signal(signal.SIGUSR1, zero)
    signal.signal(signal.SIGUSR2, report)
    import svir.server

    young = os.environ.get("SVIR_BENCH_YOUNG_GC")
    if young:
        svir.server.YOUNG_GC_THRESHOLD = int(young)
    from svir.cli import main as svir_main

    return svir_main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument(
        "--thresholds", default="700,10000", help="comma-separated; repeat them to alternate"
    )
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve(args.serve)
    import json

    from bench.common import (
        ROOT,
        Child,
        describe,
        free_port,
        request_body,
        run_wrk,
        start_fake_upstream,
        wait_healthy,
        write_lua,
    )
    from bench.suite import SVIR_CONFIG

    tmp = Path(tempfile.mkdtemp(prefix="svir-gc-time-"))
    upstream, up_port = start_fake_upstream(tmp / "upstream.log")
    rows = []
    try:
        for i, threshold in enumerate(args.thresholds.split(",")):
            port = free_port()
            name = f"{i}-{threshold}"  # a threshold may be given more than once (alternating)
            config = tmp / f"svir-{name}.toml"
            store = tmp / f"store-{name}"
            store.mkdir()
            config.write_text(
                SVIR_CONFIG.format(
                    upstream=up_port,
                    slow=up_port,
                    max_body=1 << 20,
                    tmp=store,
                    max_connections=1000,
                )
            )
            log = tmp / f"svir-{name}.log"
            reported = 0
            argv_ = [sys.executable, "-m", "bench.gc_time", "--serve", "serve"]
            argv_ += ["--config", str(config), "--port", str(port)]
            env = {"PYTHONPATH": str(ROOT), "SVIR_BENCH_YOUNG_GC": threshold}
            child = Child(f"svir gc {threshold}", argv_, log, env=env, cwd=ROOT)
            try:
                wait_healthy(child, port, "/healthz", timeout=60)
                for kind, model, stream in (("json", "fake/json", False),
                                            ("stream", "fake/stream-20", True)):  # fmt: skip
                    lua = tmp / f"{kind}.lua"
                    write_lua(lua, request_body(model, stream))
                    os.kill(child.pid, signal.SIGUSR1)
                    run = run_wrk(
                        port, lua, args.duration, connections=16, threads=1, watched={"svir": child}
                    )
                    if run.non2xx or run.errors:
                        raise RuntimeError(f"svir failed requests under wrk: {run}")
                    done = run.rps * args.duration
                    cpu = 1e-2 * run.cpu["svir"] / run.rps  # CPU seconds a request
                    os.kill(child.pid, signal.SIGUSR2)
                    deadline = time.monotonic() + 30
                    while True:
                        reports = [ln for ln in log.read_text().splitlines() if REPORT in ln]
                        if len(reports) == reported + 1:
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"svir gave no collector report: {child.tail()}")
                        time.sleep(0.1)
                    reported += 1
                    figures = json.loads(reports[-1].split(REPORT, 1)[1])
                    rows.append((threshold, kind, done, figures, cpu))
            finally:
                child.stop()
    finally:
        upstream.stop()
    print(f"\n{describe()}\n")
    print(f"Garbage collector under wrk -c16, {args.duration} s a kind:\n")
    print(
        "| young threshold | kind | requests | collections gen 0 / 1 / 2 | ms in them "
        "| collector µs per request | svir CPU µs per request |"
    )
    print("|---|---|---|---|---|---|---|")
    for threshold, kind, done, figures, cpu in rows:
        counts = " / ".join(str(figures[g][0]) for g in ("0", "1", "2"))
        ms = sum(figures[g][1] for g in ("0", "1", "2"))
        print(
            f"| {threshold} | {kind} | {done:,.0f} | {counts} | {ms:.1f} | {ms * 1000 / done:.1f} "
            f"| {cpu * 1e6:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
