"""Gateway throughput sanity: the fake upstream alone against the same upstream through svir.

Starts `bench.fake_upstream` and `svir serve` (one worker, default log level, log to a file) on
free loopback ports, checks that every scenario answers correctly, then:

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
import base64
import collections
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CHAT = "/v1/chat/completions"
STREAM_CHUNKS = 20
JSON_HEADERS = {"Content-Type": "application/json"}
INSTALL_WRK = (
    "wrk is not installed. Install it: `apt-get install -y wrk` (Debian/Ubuntu),"
    " `brew install wrk` (macOS), or build it from https://github.com/wg/wrk"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request_body(model: str, stream: bool) -> bytes:
    req: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello in a few words."}],
    }
    if stream:
        req["stream"] = True
        req["stream_options"] = {"include_usage": True}
    return json.dumps(req, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# Child processes


class Child:
    """A child process whose output goes to a log file."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.ps = psutil.Process(self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def tail(self, n: int = 20) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def wait_healthy(child: Child, port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited {child.proc.returncode}:\n{child.tail()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not become healthy:\n{child.tail()}")


SVIR_CONFIG = """\
[server]
max_body_bytes = {max_body}

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
    up_port, svir_port = free_port(), free_port()
    children: list[Child] = []
    try:
        upstream = Child(
            "fake upstream",
            [sys.executable, "-m", "bench.fake_upstream", "--port", str(up_port)],
            tmp / "upstream.log",
        )
        children.append(upstream)
        wait_healthy(upstream, up_port, "/healthz")
        config = tmp / "svir.toml"
        config.write_text(SVIR_CONFIG.format(upstream=up_port, max_body=max_body))
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


# ---------------------------------------------------------------------------------------------
# Correctness first: a fast wrong answer measures nothing


def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", CHAT, body=body, headers=JSON_HEADERS)
    resp = conn.getresponse()
    return resp.status, resp.read()


def check_completion(data: bytes) -> str | None:
    doc = json.loads(data)
    msg = doc["choices"][0]["message"]
    if not msg.get("content") or doc["choices"][0]["finish_reason"] != "stop":
        return f"bad completion: {data[:200]!r}"
    if not doc.get("usage"):
        return "completion without usage"
    return None


def check_stream(data: bytes, chunks: int, relayed: bool | None = None) -> str | None:
    """None if `data` is a whole stream of `chunks` contents; `relayed` also checks the chunk ids:
    the upstream's own when relayed, svir's when re-encoded."""
    events = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        return f"stream does not end with [DONE]: {data[-200:]!r}"
    docs = [json.loads(e) for e in events[:-1]]
    if relayed is not None and relayed != all(d["id"] == "chatcmpl-fake" for d in docs):
        return "relayed chunks expected" if relayed else "re-encoded chunks expected"
    content = [
        c["delta"]["content"]
        for d in docs
        for c in d.get("choices", [])
        if c.get("delta", {}).get("content")
    ]
    finish = [c["finish_reason"] for d in docs for c in d.get("choices", []) if c["finish_reason"]]
    usage = [d["usage"] for d in docs if d.get("usage")]
    if len(content) != chunks:
        return f"{len(content)} content chunks, expected {chunks}"
    if finish != ["stop"] or len(usage) != 1:
        return f"finish {finish}, {len(usage)} usage chunks"
    return None


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


# ---------------------------------------------------------------------------------------------
# wrk


@dataclass
class WrkRun:
    rps: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    errors: int
    cpu: dict[str, float] = field(default_factory=dict)  # % of one core, by process


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> WrkRun:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rps is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return WrkRun(
        rps=float(rps.group(1)),
        p50_ms=_ms(lat["50"]),
        p99_ms=_ms(lat["99"]),
        non2xx=int(non2xx.group(1)) if non2xx else 0,
        errors=sum(int(x) for x in sock.groups()) if sock else 0,
    )


def write_lua(path: Path, body: bytes) -> None:
    text = body.decode()
    assert "]==]" not in text
    path.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [==[{text}]==]\n"
    )


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_wrk(
    port: int,
    lua: Path,
    duration: float,
    *,
    connections: int,
    threads: int,
    watched: dict[str, Child] | None = None,
) -> WrkRun:
    watched = watched or {}
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s"]
    cmd += ["--latency", "-s", str(lua), f"http://127.0.0.1:{port}{CHAT}"]
    before = {name: c.cpu() for name, c in watched.items()}
    wrk_before = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    run = parse_wrk(done.stdout)
    run.cpu = {name: 100 * (c.cpu() - before[name]) / wall for name, c in watched.items()}
    run.cpu["wrk"] = 100 * (children_cpu() - wrk_before) / wall
    return run


# ---------------------------------------------------------------------------------------------
# Added latency, sequential


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


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


# ---------------------------------------------------------------------------------------------
# Peak RSS under one large request


def image_request(image_bytes: int) -> bytes:
    data = base64.b64encode(os.urandom(image_bytes))
    head = (
        b'{"model":"fake/json","messages":[{"role":"user","content":['
        b'{"type":"text","text":"What is in this picture?"},'
        b'{"type":"image_url","image_url":{"url":"data:image/png;base64,'
    )
    return head + data + b'"}}]}]}'


def vm_hwm(pid: int) -> int | None:
    """The kernel's peak RSS of `pid` in bytes (Linux), or None."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def reset_hwm(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class RssResult:
    request_bytes: int
    idle: int
    peak_sampled: int
    peak_hwm: int | None
    seconds: float
    samples: int


def rss_probe(svir: Child, port: int, image_bytes: int) -> RssResult:
    body = image_request(image_bytes)
    ps = svir.ps
    idle_samples = []
    for _ in range(30):
        idle_samples.append(ps.memory_info().rss)
        time.sleep(0.01)
    idle = int(statistics.median(idle_samples))
    hwm_reset = reset_hwm(svir.pid)
    peak = idle
    count = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, count
        while not stop.is_set():
            rss = ps.memory_info().rss
            peak = max(peak, rss)
            count += 1
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    start = time.perf_counter()
    try:
        status, data = post(conn, body)
    finally:
        elapsed = time.perf_counter() - start
        time.sleep(0.05)
        stop.set()
        sampler.join()
        conn.close()
    if status != 200:
        raise RuntimeError(f"large request: HTTP {status}: {data[:300]!r}")
    problem = check_completion(data)
    if problem:
        raise RuntimeError(f"large request: {problem}")
    return RssResult(
        request_bytes=len(body),
        idle=idle,
        peak_sampled=peak,
        peak_hwm=vm_hwm(svir.pid) if hwm_reset else None,
        seconds=elapsed,
        samples=count,
    )


# ---------------------------------------------------------------------------------------------
# py-spy


def profile(
    svir: Child,
    port: int,
    lua: Path,
    duration: float,
    *,
    connections: int,
    threads: int,
    out: Path,
    native: bool,
) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    cmd = [spy, "record", "-p", str(svir.pid), "-d", f"{duration:g}", "-r", "200"]
    cmd += ["-o", str(out), "--format", "raw"] + (["--native"] if native else [])
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as spy_proc:
        time.sleep(0.5)  # let py-spy attach before the load starts
        run_wrk(port, lua, duration, connections=connections, threads=threads)
        _, err = spy_proc.communicate(timeout=duration + 30)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')}")


# Inclusive buckets: a sample counts for the first bucket whose pattern is in its stack, looked
# for from the leaf upward, so a sample is attributed to the most specific layer it was in.
BUCKETS: list[tuple[str, Callable[[str], bool]]] = [
    ("logging (access log)", lambda f: "logging/" in f or "svir/log.py" in f),
    ("svir wire: decoder", lambda f: "svir/wire/decoder.py" in f),
    ("svir wire: encoder", lambda f: "svir/wire/encoder.py" in f),
    ("svir wire: SSE parse", lambda f: "svir/wire/sse.py" in f),
    (
        "svir request body (providers, wire/request)",
        lambda f: "svir/providers/" in f or "svir/wire/request.py" in f,
    ),
    ("aiohttp client", lambda f: "aiohttp/" in f),
    ("uvicorn / httptools", lambda f: "uvicorn/" in f or "httptools" in f),
    ("svir chat core (chat.py)", lambda f: "svir/chat.py" in f),
    (
        "svir app (edges/app.py, asgi.py)",
        lambda f: "svir/edges/app.py" in f or "svir/edges/asgi.py" in f,
    ),
    ("asyncio / uvloop", lambda f: "asyncio/" in f or "uvloop" in f),
]


def summarize_profile(path: Path, top: int = 15, explain: int = 3) -> str:
    """Shares of samples by layer and by leaf frame; the first `explain` leaves split by layer."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    total = sum(c for _, c in stacks)
    if not total:
        return "no samples"
    leaf: collections.Counter[str] = collections.Counter()
    bucket: collections.Counter[str] = collections.Counter()
    leaf_bucket: collections.Counter[tuple[str, str]] = collections.Counter()
    for frames, count in stacks:
        name = "other"
        for frame in reversed(frames):
            hit = next((b for b, match in BUCKETS if match(frame)), None)
            if hit is not None:
                name = hit
                break
        leaf[frames[-1]] += count
        bucket[name] += count
        leaf_bucket[(frames[-1], name)] += count

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    lines = [f"{total} samples. By layer (the innermost layer named on the stack):"]
    lines += [f"  {pct(c)}  {name}" for name, c in bucket.most_common()]
    lines.append(f"Top {top} leaf frames (self time):")
    for i, (frame, c) in enumerate(leaf.most_common(top)):
        lines.append(f"  {pct(c)}  {frame}")
        if i < explain:
            split = sorted(
                ((n, b) for (f, b), n in leaf_bucket.items() if f == frame), reverse=True
            )
            lines.append("           from: " + ", ".join(f"{b} {pct(n).strip()}" for n, b in split))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Report


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


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


def describe() -> str:
    """What was measured: svir's commit (and whether the tree had changes), Python, cores."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
            )
        except OSError:
            return ""
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    rev = f"{head or 'unknown'}{' + uncommitted changes' if dirty else ''}"
    py = ".".join(map(str, sys.version_info[:3]))
    return f"svir {rev}, Python {py}, {os.cpu_count()} CPUs"


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
