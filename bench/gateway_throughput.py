"""Gateway throughput sanity: the fake upstream alone against the same upstream through svir.

Starts the scripted upstream (`tests.support.upstream`) and `svir serve` (one worker, default
log level, log to a file) on free loopback ports, checks that every scenario answers correctly, then:

1. Peak RSS: one chat request whose user message carries a base64 data-URL image of
   `--image-mib` MiB of random bytes goes through svir; svir's RSS is sampled every 10 ms (psutil)
   and its kernel high-water mark (VmHWM, reset first) is read too. Reported: peak minus idle RSS
   as a multiple of the request's size.
2. Throughput: `wrk` at `--connections` (32) for `--duration` seconds per figure, POST bodies from
   a Lua script, upstream directly against through svir, non-streamed (`json`) and streamed
   (`stream-20`, `stream: true`, `include_usage`), plus svir's relay mode for the stream.
   Scenarios alternate inside each of `--runs` rounds; min / median / max of the rounds.
   CPU of svir, the upstream and wrk during each run comes from their CPU times (no sampling).
3. Added latency: one keep-alive `http.client` connection to each, `--probe-requests` requests
   each, sequential and interleaved: p50 / p99 through svir minus direct, for a non-streamed
   request and for a whole stream.

With `--profile FILE`, one more streamed run is recorded with py-spy (`pip install py-spy`) in
raw (collapsed) form, and its top frames are summarized. Run:

    .venv/bin/python -m bench.gateway_throughput [--duration 10] [--runs 3]

Needs `wrk` (Debian/Ubuntu: `apt-get install -y wrk`; macOS: `brew install wrk`).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    INSTALL_WRK,
    STREAM_CHUNKS,
    Child,
    RssResult,
    WrkRun,
    check_completion,
    check_stream,
    describe,
    free_port,
    mib,
    percentile,
    post,
    profile,
    request_body,
    rss_probe,
    run_wrk,
    start_fake_upstream,
    summarize_profile,
    wait_healthy,
    write_lua,
)

SVIR_CONFIG = """\
[server]
max_body_bytes = {max_body}

[store]
url = "sqlite:///{tmp}/svir-store.db"

[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{upstream}/v1"
discover = false

[[providers]]
name = "relay"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{upstream}/v1"
discover = false
relay = true
"""


@contextmanager
def processes(tmp: Path, max_body: int) -> Iterator[tuple[Child, int, Child, int]]:
    svir_port = free_port()
    children: list[Child] = []
    try:
        upstream, up_port = start_fake_upstream(tmp / "upstream.log")
        children.append(upstream)
        config = tmp / "svir.toml"
        config.write_text(SVIR_CONFIG.format(upstream=up_port, max_body=max_body, tmp=tmp))
        svir = Child(
            "svir",
            [
                sys.executable,
                "-m",
                "svir",
                "serve",
                "--config",
                str(config),
                "--port",
                str(svir_port),
            ],
            tmp / "svir.log",
        )
        children.append(svir)
        wait_healthy(svir, svir_port, "/healthz")
        yield upstream, up_port, svir, svir_port
    finally:
        for child in reversed(children):
            child.stop()


@dataclass(frozen=True)
class Scenario:
    name: str
    via: str  # "direct" or "svir"
    body: bytes
    stream: bool


def scenarios() -> list[Scenario]:
    s = f"stream-{STREAM_CHUNKS}"
    return [
        Scenario("json", "direct", request_body("json", False), False),
        Scenario("json", "svir", request_body("fake/json", False), False),
        Scenario("stream", "direct", request_body(s, True), True),
        Scenario("stream", "svir", request_body(f"fake/{s}", True), True),
        Scenario("stream", "svir relay", request_body(f"relay/{s}", True), True),
    ]


def sanity(ports: dict[str, int]) -> list[str]:
    problems = []
    for sc in scenarios():
        conn = http.client.HTTPConnection("127.0.0.1", ports[sc.via], timeout=10)
        status, data = post(conn, sc.body)
        conn.close()
        if status != 200:
            problem: str | None = f"HTTP {status}: {data[:200]!r}"
        elif sc.stream:
            relayed = None if sc.via == "direct" else sc.via == "svir relay"
            problem = check_stream(data, STREAM_CHUNKS, relayed)
        else:
            problem = check_completion(data)
        if problem:
            problems.append(f"{sc.name} via {sc.via}: {problem}")
    return problems


def latency_probe(ports: dict[str, int], n: int) -> dict[str, dict[str, list[float]]]:
    """Per case ("json", "stream"), per route ("direct", "svir"): request times in ms."""
    cases = [sc for sc in scenarios() if sc.via in ("direct", "svir")]
    conns = {
        via: http.client.HTTPConnection("127.0.0.1", p, timeout=10) for via, p in ports.items()
    }
    times: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    clock = time.perf_counter
    for i in range(n + 20):  # the first 20 warm up
        for sc in cases:
            conn = conns[sc.via]
            t0 = clock()
            status, _ = post(conn, sc.body)
            elapsed = (clock() - t0) * 1000
            if status != 200:
                raise RuntimeError(f"latency probe: {sc.name} via {sc.via}: HTTP {status}")
            if i >= 20:
                times[sc.name][sc.via].append(elapsed)
    for conn in conns.values():
        conn.close()
    return times


def table(results: dict[tuple[str, str], list[WrkRun]], args: argparse.Namespace) -> list[str]:
    out = [
        f"wrk -t{args.threads} -c{args.connections} -d{args.duration:g}s, {args.runs} runs;"
        " req/s min / median / max; p50 and p99 latency and CPU (% of one core) of the median run",
        "",
        "| scenario | via | req/s min | req/s median | req/s max | p50 ms | p99 ms"
        " | svir CPU | upstream CPU | wrk CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, via), runs in results.items():
        rates = [r.rps for r in runs]
        mid = sorted(runs, key=lambda r: r.rps)[len(runs) // 2]
        svir_cpu = "-" if via == "direct" else f"{mid.cpu['svir']:.0f}%"
        out.append(
            f"| {name} | {via} | {min(rates):,.0f} | {statistics.median(rates):,.0f}"
            f" | {max(rates):,.0f} | {mid.p50_ms:.2f} | {mid.p99_ms:.2f} | {svir_cpu}"
            f" | {mid.cpu['upstream']:.0f}% | {mid.cpu['wrk']:.0f}% |"
        )
    out.append("")
    med = {k: statistics.median(r.rps for r in v) for k, v in results.items()}
    for name, via in results:
        if via != "direct":
            ratio = med[(name, via)] / med[(name, "direct")]
            out.append(
                f"- {name} via {via}: {ratio:.1%} of the upstream's own rate"
                f" (the upstream alone is {1 / ratio:.0f}x faster)"
            )
    return out


def latency_table(times: dict[str, dict[str, list[float]]]) -> list[str]:
    out = [
        "| request | direct p50 | svir p50 | added p50 | direct p99 | svir p99 | added p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by in times.items():
        d50, s50 = percentile(by["direct"], 0.5), percentile(by["svir"], 0.5)
        d99, s99 = percentile(by["direct"], 0.99), percentile(by["svir"], 0.99)
        label = "non-streamed" if name == "json" else f"whole stream ({STREAM_CHUNKS} chunks)"
        out.append(
            f"| {label} | {d50:.3f} ms | {s50:.3f} ms | **{s50 - d50:.3f} ms** | {d99:.3f} ms"
            f" | {s99:.3f} ms | **{s99 - d99:.3f} ms** |"
        )
    return out


def rss_lines(r: RssResult) -> list[str]:
    out = [
        f"- request: {mib(r.request_bytes)} ({r.request_bytes:,} bytes), through svir in"
        f" {r.seconds:.2f} s; svir idle RSS {mib(r.idle)}",
        f"- peak RSS, sampled every 10 ms ({r.samples} samples): {mib(r.peak_sampled)},"
        f" +{mib(r.peak_sampled - r.idle)} = **{(r.peak_sampled - r.idle) / r.request_bytes:.2f}x"
        " the request**",
    ]
    if r.peak_hwm is not None:
        out.append(
            f"- peak RSS, kernel high-water mark (VmHWM): {mib(r.peak_hwm)},"
            f" +{mib(r.peak_hwm - r.idle)} = **{(r.peak_hwm - r.idle) / r.request_bytes:.2f}x"
            " the request**"
        )
    return out


def svir_log_outcomes(path: Path) -> tuple[int, int]:
    """(failed, cut) requests in svir's access log: failed did not end in a clean 200 (a stream
    can fail after its 200), cut were in flight when wrk closed its connections (499).
    """
    failed = cut = 0
    with path.open("rb") as f:
        for line in f:
            if b'"svir.access"' not in line:
                continue
            if b'"status":499' in line:
                cut += 1
            elif b'"status":200' not in line or b'"error_kind"' in line:
                failed += 1
    return failed, cut


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk figure")
    parser.add_argument("--runs", type=int, default=3, help="wrk figures per scenario")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--probe-requests", type=int, default=500)
    parser.add_argument("--image-mib", type=float, default=50.0, help="random image bytes, MiB")
    parser.add_argument("--profile", type=Path, help="also record py-spy raw stacks here")
    parser.add_argument("--native", action="store_true", help="py-spy --native")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)

    if shutil.which("wrk") is None:
        print(INSTALL_WRK, file=sys.stderr)
        return 2

    what = describe()  # before the run: the code svir loads at its start
    tmp = Path(tempfile.mkdtemp(prefix="svir-bench-"))
    image_bytes = int(args.image_mib * 2**20)
    max_body = max(64 << 20, 2 * image_bytes)
    failed = False
    with processes(tmp, max_body) as (upstream, up_port, svir, svir_port):
        ports = {"direct": up_port, "svir": svir_port, "svir relay": svir_port}
        problems = sanity(ports)
        if problems:
            print("sanity check failed:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        print(
            f"svir pid {svir.pid} on :{svir_port}, fake upstream pid {upstream.pid} on :{up_port}"
        )

        print(f"peak RSS: one request with a {args.image_mib:g} MiB image ...", flush=True)
        rss = rss_probe(svir, svir_port, image_bytes)

        luas = {}
        for sc in scenarios():
            lua = tmp / f"{sc.name}-{sc.via.replace(' ', '-')}.lua"
            write_lua(lua, sc.body)
            luas[(sc.name, sc.via)] = lua
        watched = {"svir": svir, "upstream": upstream}
        print("warm-up ...", flush=True)
        for sc in scenarios():
            lua = luas[(sc.name, sc.via)]
            run_wrk(ports[sc.via], lua, 2, connections=args.connections, threads=args.threads)
        results: dict[tuple[str, str], list[WrkRun]] = {(sc.name, sc.via): [] for sc in scenarios()}
        for i in range(args.runs):
            for sc in scenarios():
                key = (sc.name, sc.via)
                run = run_wrk(
                    ports[sc.via],
                    luas[key],
                    args.duration,
                    connections=args.connections,
                    threads=args.threads,
                    watched=watched,
                )
                results[key].append(run)
                print(
                    f"  run {i + 1}/{args.runs} {sc.name:6} {sc.via:10} {run.rps:10,.0f} req/s",
                    flush=True,
                )
                if run.non2xx or run.errors:
                    print(f"    {run.non2xx} non-2xx, {run.errors} socket errors", flush=True)
                    failed = failed or run.non2xx > 0

        print(f"added latency: {args.probe_requests} sequential requests each ...", flush=True)
        times = latency_probe({"direct": up_port, "svir": svir_port}, args.probe_requests)

        if args.profile:
            print(f"py-spy: one more streamed run, {args.duration:g} s ...", flush=True)
            profile(
                svir,
                svir_port,
                luas[("stream", "svir")],
                args.duration,
                connections=args.connections,
                threads=args.threads,
                out=args.profile,
                native=args.native,
            )

    bad, cut = svir_log_outcomes(svir.log_path)
    print()
    print(what)
    print()
    print("\n".join(table(results, args)))
    print()
    print("Added latency, one keep-alive connection, sequential:")
    print()
    print("\n".join(latency_table(times)))
    print()
    print(f"Peak RSS of svir while one request with a {args.image_mib:g} MiB image goes through:")
    print()
    print("\n".join(rss_lines(rss)))
    print()
    print(
        f"svir access log: {bad} failed request(s); {cut} cut off (499) when wrk closed its"
        " connections at the end of a run"
    )
    if args.profile:
        print()
        print(summarize_profile(args.profile))
    if args.keep:
        print(f"\nlogs and config kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
