"""The side-by-side gateway benchmark: svir against its peers, on one fake upstream, in one run.

Targets (each started on a free loopback port, all pointing at the same scripted upstream,
`python -m tests.support.upstream`):

- `direct`: the fake upstream itself (the floor of every figure);
- `svir`: `svir serve`, one worker (and `svir x2` with `--svir-workers 2`);
- the reference relays (unless `--no-relays`): `relay asgi` (`bench.relay_asgi`: svir's server
  stack, uvicorn + httptools + uvloop and a pooled keep-alive upstream client, with no svir
  logic and no JSON), `relay raw` (`bench.relay_raw`: asyncio protocols and httptools, no
  ASGI, no tasks) and `relay json` (`bench.relay_json`: `relay asgi` that also decodes and
  encodes again the request's and the answer's JSON, every SSE event's: the floor of a gateway
  that reads what it relays), so that every run shows how far svir's CPU per request is from
  each floor;
- with `--peers` (installed on first use into bench/.peers/, never into .venv):
  `nginx` (`apt-get install -y nginx`; one worker process, `proxy_buffering off`, upstream
  keep-alive), `portkey` (`npm install @portkey-ai/gateway`, headers `x-portkey-provider: openai`
  and `x-portkey-custom-host`), `litellm` (`pip install 'litellm[proxy]'` into its own venv;
  `openai/<model>` with `api_base`; 1 and 2 workers). Bifrost is not measured: its npm package
  downloads its binary at run time, which this workplace cannot do.

Figures, per target:

1. idle RSS (the process and its children) after start-up and one checked answer of each kind;
2. throughput: `wrk -t1 -c32` for `--duration` s, non-streamed (`json`) and streamed (20 content
   chunks + finish + usage + `[DONE]`, `stream: true`, `include_usage`), the targets alternating
   inside each of `--runs` rounds; min / median; CPU of the target and of the upstream (% of one
   core) over the median run;
3. added latency, sequential: `--probe-requests` requests on one keep-alive connection, each
   target interleaved with the upstream directly; p50 / p99 minus direct's, non-streamed and a
   whole stream; and at c=16: `wrk -c16` p99 minus direct's (closed loop, so it includes queueing);
4. with `--messages`, svir targets only: the same 20-chunk stream asked through Anthropic's
   `/v1/messages` (checked whole: message_start ... message_stop, 20 text deltas), alternating with
   the chat stream inside each round; req/s and CPU µs per request of both, and their ratio; with
   `--responses`, the same through OpenAI's `/v1/responses` (`store: false`; checked whole:
   response.created ... response.completed, 20 text deltas); with `--ollama`, through Ollama's
   `/api/chat` (NDJSON, checked whole); with `--completions`, as a text completion through
   `/v1/completions` (the upstream's own `/v1/completions`, `text_completion` chunks; checked
   whole: 20 pieces of text, the finish, usage, `[DONE]`);
5. svir only: 5,000 concurrent open streams against a slow-drip upstream (asyncio client; RSS per
   stream = (RSS with the streams open - idle) / N; every stream must end whole), and the peak RSS
   of one request carrying a 50 MiB image.

Run (needs `wrk`: `apt-get install -y wrk`):

    .venv/bin/python -m bench.suite [--peers litellm,portkey,nginx] [--quick] [--messages]
        [--responses] [--out FILE]

`--quick` is one round of 5 s figures and 200 probe requests (min = median then: said in the
report). `--profile FILE` records svir under the streamed load with py-spy and summarizes it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    CHAT,
    COMPLETIONS,
    INSTALL_WRK,
    MESSAGES,
    OLLAMA_CHAT,
    RESPONSES,
    ROOT,
    STREAM_CHUNKS,
    Child,
    RssResult,
    WrkRun,
    check_completion,
    check_completions_stream,
    check_messages_stream,
    check_ollama_stream,
    check_responses_stream,
    check_stream,
    completions_body,
    describe,
    free_port,
    messages_body,
    mib,
    ollama_body,
    percentile,
    post,
    profile,
    request_body,
    responses_body,
    rss_probe,
    run_wrk,
    start_fake_upstream,
    summarize_profile,
    wait_healthy,
    write_lua,
)
from svir.config.model import ServerConfig

PEERS_DIR = ROOT / "bench" / ".peers"
PEERS = ("nginx", "portkey", "litellm")
STREAM_MODEL = f"stream-{STREAM_CHUNKS}"
# The other front ends' streams measured beside the chat stream: kind -> path.
BESIDE = {
    "messages": MESSAGES,
    "responses": RESPONSES,
    "ollama": OLLAMA_CHAT,
    "completions": COMPLETIONS,
}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


# ---------------------------------------------------------------------------------------------
# Peers: installed on first use, each in its own folder


def install_peer(name: str) -> None:
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    if name == "nginx":
        if shutil.which("nginx") is None:
            print("installing nginx (apt-get) ...", flush=True)
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
            subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, env=env)
    elif name == "portkey":
        folder = PEERS_DIR / "portkey"
        if not (folder / "node_modules/@portkey-ai/gateway/build/start-server.js").exists():
            print("installing @portkey-ai/gateway (npm) ...", flush=True)
            folder.mkdir(exist_ok=True)
            if not (folder / "package.json").exists():
                (folder / "package.json").write_text('{"name": "peers", "private": true}\n')
            subprocess.run(["npm", "install", "@portkey-ai/gateway"], check=True, cwd=folder)
    elif name == "litellm":
        venv = PEERS_DIR / "litellm"
        if not (venv / "bin" / "litellm").exists():
            print("installing litellm[proxy] into bench/.peers/litellm ...", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = str(venv / "bin" / "pip")
            subprocess.run([pip, "install", "-q", "litellm[proxy]"], check=True)
    else:
        raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")


def peer_version(name: str) -> str:
    try:
        if name == "nginx":
            out = subprocess.run(
                ["nginx", "-v"], capture_output=True, text=True, check=False
            ).stderr
            return out.strip().rpartition("/")[2]
        if name == "portkey":
            pkg = PEERS_DIR / "portkey/node_modules/@portkey-ai/gateway/package.json"
            return str(json.loads(pkg.read_text())["version"])
        if name == "litellm":
            py = PEERS_DIR / "litellm/bin/python"
            code = "import importlib.metadata as m; print(m.version('litellm'))"
            return subprocess.run(
                [str(py), "-c", code], capture_output=True, text=True, check=False
            ).stdout.strip()
    except (OSError, ValueError, KeyError):
        pass
    return "?"


# ---------------------------------------------------------------------------------------------
# Targets


@dataclass
class Target:
    name: str
    child: Child
    port: int
    models: dict[str, str]  # "json" / "stream" -> the model to ask for
    headers: dict[str, str] = field(default_factory=dict)
    idle_rss: int = 0
    version: str = ""
    # "messages" and "responses" too: the streamed /v1/messages and /v1/responses
    kinds: tuple[str, ...] = ("json", "stream")

    def body(self, kind: str) -> bytes:
        if kind == "messages":
            return messages_body(self.models["stream"])
        if kind == "responses":
            return responses_body(self.models["stream"])
        if kind == "ollama":
            return ollama_body(self.models["stream"])
        if kind == "completions":
            return completions_body(self.models["stream"])
        return request_body(self.models[kind], kind == "stream")

    def path(self, kind: str) -> str:
        return BESIDE.get(kind, CHAT)

    def headers_for(self, kind: str) -> dict[str, str]:
        return {**self.headers, **ANTHROPIC_HEADERS} if kind == "messages" else self.headers


SVIR_CONFIG = """\
[server]
max_body_bytes = {max_body}
max_connections = {max_connections}

[store]
url = "sqlite:///{tmp}/svir-store.db"

[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{upstream}/v1"
discover = false

[[providers]]
name = "slow"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{slow}/v1"
discover = false
"""

NGINX_CONFIG = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream fake {{ server 127.0.0.1:{upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        client_max_body_size 200m;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""

# Node 20's fetch gives responses with immutable headers; Portkey 1.15 appends to them on the
# streamed path and answers 500 ("TypeError: immutable"). Re-wrapping each response with mutable
# headers (one object per request) makes it work.
PORTKEY_FETCH_SHIM = """\
const realFetch = globalThis.fetch;
globalThis.fetch = async (...args) => {
  const res = await realFetch(...args);
  const init = { status: res.status, statusText: res.statusText, headers: new Headers(res.headers) };
  return new Response(res.body, init);
};
"""

LITELLM_CONFIG = """\
model_list:
  - model_name: json
    litellm_params: {{model: openai/json, api_base: "http://127.0.0.1:{upstream}/v1", api_key: fake}}
  - model_name: {stream}
    litellm_params: {{model: openai/{stream}, api_base: "http://127.0.0.1:{upstream}/v1", api_key: fake}}
litellm_settings:
  set_verbose: false
  telemetry: false
"""


def start_svir(  # noqa: PLR0917
    tmp: Path,
    name: str,
    up_port: int,
    slow_port: int,
    max_body: int,
    workers: int,
    src: Path | None = None,
    server: str = "uvicorn",
    python: str | None = None,
    max_connections: int = 1000,
    keep_alive_timeout: float | None = None,
) -> Target:
    """`svir serve` as configured by SVIR_CONFIG; `max_connections` above the open streams the
    run holds (the default cap, 1,000, would refuse the rest); `keep_alive_timeout` instead of
    the default one (5 s), to hold idle connections longer."""
    port = free_port()
    config = tmp / "svir.toml"
    text = SVIR_CONFIG.format(
        upstream=up_port,
        slow=slow_port,
        max_body=max_body,
        tmp=tmp,
        max_connections=max_connections,
    )
    if keep_alive_timeout is not None:
        text = text.replace("[server]\n", f"[server]\nkeep_alive_timeout = {keep_alive_timeout}\n")
    config.write_text(text)
    py = python or sys.executable
    argv = [py, "-m", "svir", "serve", "--config", str(config), "--port", str(port)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    env = {"SVIR_CONFIG": str(config)}
    if server == "granian":
        # The app a `svir serve` worker builds, on granian.
        argv = [str(Path(py).with_name("granian")), "--interface", "asgi", "--loop", "uvloop"]
        argv += ["--workers", str(workers), "--log-level", "warning", "--factory"]
        argv += ["svir.server:worker_app", "--host", "127.0.0.1", "--port", str(port)]
    env["PYTHONPATH"] = str(src or ROOT)
    child = Child(name, argv, tmp / f"{name.replace(' ', '-')}.log", env=env, cwd=src)
    wait_healthy(child, port, "/healthz")
    return Target(name, child, port, {"json": "fake/json", "stream": f"fake/{STREAM_MODEL}"})


def svir_python(version: str) -> str:
    """An interpreter of `version` (e.g. 3.13) with svir's dependencies, in bench/.peers/: the
    svir under test still comes from the source tree (PYTHONPATH)."""
    venv = PEERS_DIR / f"svir-py{version}"
    py = venv / "bin" / "python"
    if not py.exists():
        # pyenv's versions before PATH: a pyenv shim on PATH may name a version it won't run.
        candidates = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))
        found = str(candidates[-1]) if candidates else shutil.which(f"python{version}")
        if found is None:
            raise SystemExit(f"no python{version} on PATH or under ~/.pyenv")
        print(f"creating bench/.peers/svir-py{version} from {found} ...", flush=True)
        subprocess.run([found, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True)
    return str(py)


RELAYS = {
    "relay asgi": "bench.relay_asgi",
    "relay raw": "bench.relay_raw",
    "relay json": "bench.relay_json",
}


def start_relay(
    tmp: Path, name: str, up_port: int, keep_alive_timeout: float | None = None
) -> Target:
    """One of the reference relays (`RELAYS`) in front of the fake upstream (the ASGI one with
    uvicorn's `timeout_keep_alive` of `keep_alive_timeout` if given)."""
    port = free_port()
    argv = [sys.executable, "-m", RELAYS[name], "--upstream", f"127.0.0.1:{up_port}"]
    argv += ["--port", str(port)]
    if keep_alive_timeout is not None:
        argv += ["--keep-alive-timeout", f"{keep_alive_timeout:g}"]
    child = Child(name, argv, tmp / f"{name.replace(' ', '-')}.log")
    wait_healthy(child, port, "/healthz")
    return Target(name, child, port, {"json": "json", "stream": STREAM_MODEL})


def start_peer(tmp: Path, name: str, up_port: int, workers: int = 1) -> Target:
    port = free_port()
    models = {"json": "json", "stream": STREAM_MODEL}
    if name == "nginx":
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONFIG.format(tmp=tmp, upstream=up_port, port=port))
        child = Child("nginx", ["nginx", "-p", str(tmp), "-c", str(conf)], tmp / "nginx.log")
        wait_healthy(child, port, "/healthz")
        return Target("nginx", child, port, models, version=peer_version("nginx"))
    if name == "portkey":
        folder = PEERS_DIR / "portkey"
        script = folder / "node_modules/@portkey-ai/gateway/build/start-server.js"
        shim = folder / "fetch-shim.mjs"
        shim.write_text(PORTKEY_FETCH_SHIM)
        child = Child(
            "portkey",
            ["node", "--import", str(shim), str(script), f"--port={port}", "--headless"],
            tmp / "portkey.log",
            env={"NODE_ENV": "production"},
            cwd=folder,
        )
        wait_healthy(child, port, "/*")
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": f"http://127.0.0.1:{up_port}/v1",
            "Authorization": "Bearer fake",
        }
        return Target("portkey", child, port, models, headers, version=peer_version("portkey"))
    if name == "litellm":
        conf = tmp / "litellm.yaml"
        conf.write_text(LITELLM_CONFIG.format(upstream=up_port, stream=STREAM_MODEL))
        label = f"litellm x{workers}"
        argv = [str(PEERS_DIR / "litellm/bin/litellm"), "--config", str(conf)]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", str(workers)]
        key = "sk-bench-" + os.urandom(32).hex()  # it refuses to start without a master key
        env = {
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
        }
        child = Child(label, argv, tmp / f"litellm-{workers}.log", env=env)
        wait_healthy(child, port, "/health/liveliness", timeout=180)
        auth = {"Authorization": f"Bearer {key}"}
        return Target(label, child, port, models, auth, version=peer_version("litellm"))
    raise ValueError(name)


def check_target(t: Target) -> list[str]:
    problems = []
    for kind in t.kinds:
        conn = http.client.HTTPConnection("127.0.0.1", t.port, timeout=30)
        try:
            status, data = post(conn, t.body(kind), t.headers_for(kind), t.path(kind))
        finally:
            conn.close()
        if status != 200:
            problems.append(f"{t.name} {kind}: HTTP {status}: {data[:300]!r}")
            continue
        if kind == "messages":
            problem = check_messages_stream(data, STREAM_CHUNKS)
        elif kind == "responses":
            problem = check_responses_stream(data, STREAM_CHUNKS)
        elif kind == "ollama":
            problem = check_ollama_stream(data, STREAM_CHUNKS)
        elif kind == "completions":
            problem = check_completions_stream(data, STREAM_CHUNKS)
        elif kind == "stream":
            problem = check_stream(data, STREAM_CHUNKS)
        else:
            problem = check_completion(data)
        if problem:
            problems.append(f"{t.name} {kind}: {problem}")
    return problems


def settle_rss(child: Child, seconds: float = 1.0) -> int:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(child.rss())
        time.sleep(0.05)
    return int(statistics.median(samples))


# ---------------------------------------------------------------------------------------------
# Sequential added latency


def latency_probe(
    targets: list[Target], direct: Target, n: int, budget: float
) -> dict[str, dict[str, list[float]]]:
    """times[kind][target] in ms; each target interleaved with direct, `budget` s at most each."""
    times: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    clock = time.perf_counter
    for t in targets:
        conns = {
            x.name: http.client.HTTPConnection("127.0.0.1", x.port, timeout=30) for x in (direct, t)
        }
        deadline = clock() + budget
        for i in range(n + 10):  # the first 10 warm up
            if i >= 30 and clock() > deadline:
                break
            for kind in ("json", "stream"):
                for x in (direct, t):
                    t0 = clock()
                    status, _ = post(conns[x.name], x.body(kind), x.headers)
                    elapsed = (clock() - t0) * 1000
                    if status != 200:
                        raise RuntimeError(f"latency probe: {kind} via {x.name}: HTTP {status}")
                    if i >= 10:
                        key = f"{x.name}@{t.name}" if x is direct else x.name
                        times[kind][key].append(elapsed)
        for c in conns.values():
            c.close()
    return times


# ---------------------------------------------------------------------------------------------
# Many open streams


@dataclass
class StreamsResult:
    n: int
    opened_s: float
    idle: int
    held: int
    errors: collections.Counter[str]
    whole: int
    upstream_rss: int = 0

    @property
    def per_stream(self) -> float:
        return (self.held - self.idle) / self.n


async def _one_stream(  # noqa: PLR0917
    port: int, body: bytes, opened: asyncio.Event, started: list[int], n: int, chunks: int
) -> str | None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        started.append(1)
        if len(started) == n:
            opened.set()
        return f"connect: {type(exc).__name__}"
    try:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer.write(head + body)
        first = await reader.readuntil(b"data: ")
        started.append(1)
        if len(started) == n:
            opened.set()
        if not first.startswith(b"HTTP/1.1 200"):
            return "status " + first[:12].decode(errors="replace")
        rest = await reader.read()  # Connection: close: to the end
        # Chunked framing: each piece svir sends holds whole events, so the data lines are intact.
        lines = [ln for ln in (b"data: " + rest).splitlines() if ln.startswith(b"data: ")]
        return check_stream(b"\n".join(lines), chunks)
    except (OSError, asyncio.IncompleteReadError) as exc:
        started.append(1)
        if len(started) == n:
            opened.set()
        return type(exc).__name__
    finally:
        writer.close()


async def open_streams(svir: Child, port: int, n: int, chunks: int, batch: int) -> StreamsResult:
    body = request_body(f"slow/drip-{chunks}", True)
    idle = settle_rss(svir, 0.5)
    opened = asyncio.Event()
    started: list[int] = []
    t0 = time.perf_counter()
    tasks = []
    for i in range(0, n, batch):
        for _ in range(min(batch, n - i)):
            tasks.append(asyncio.ensure_future(_one_stream(port, body, opened, started, n, chunks)))
        await asyncio.sleep(0.05)
    await opened.wait()
    opened_s = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    held = max(svir.rss() for _ in range(5))
    results = await asyncio.gather(*tasks)
    errors = collections.Counter(r for r in results if r is not None)
    return StreamsResult(n, opened_s, idle, held, errors, sum(r is None for r in results))


# ---------------------------------------------------------------------------------------------
# Many idle keep-alive connections


@dataclass
class IdleResult:
    """N keep-alive connections, each having had one answer, held idle; RSS of the server."""

    n: int
    held: int  # connections that got their answer whole and were held
    opened_s: float
    idle: int  # RSS before they were opened
    with_held: int  # RSS while they are held
    after: int  # RSS once the client closed them
    errors: collections.Counter[str]
    closed_by_server: int  # of the held ones, closed by the server when measured
    probe_ms: float
    probe_problem: str | None

    @property
    def per_connection(self) -> float:
        return (self.with_held - self.idle) / max(1, self.held)


IdleConn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response: its status and body (by Content-Length, or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if b"content-length" in fields:
        return status, await reader.readexactly(int(fields[b"content-length"]))
    if fields.get(b"transfer-encoding", b"").lower() != b"chunked":
        raise ValueError(f"neither Content-Length nor chunked: {head!r}")
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await reader.readexactly(size + 2)  # and the CRLF that ends it
        if size == 0:
            return status, b"".join(parts)
        parts.append(data[:-2])


async def _idle_one(port: int, request: bytes, gate: asyncio.Semaphore) -> IdleConn | str:
    """A connection to `port` with `request` answered on it (checked), left open; or what went
    wrong."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect: {type(exc).__name__}"
    try:
        async with gate:
            writer.write(request)
            status, body = await _read_response(reader)
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        writer.close()
        return type(exc).__name__
    problem = check_completion(body) if status == 200 else f"status {status}"
    if problem:
        writer.close()
        return problem
    return reader, writer


def idle_request(model: str) -> bytes:
    """A keep-alive POST of a non-streamed chat request for `model`."""
    body = request_body(model, False)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _open_idle(
    port: int, request: bytes, n: int, batch: int, errors: collections.Counter[str]
) -> list[IdleConn]:
    """`n` connections opened `batch` at a time, each with one answer (64 requests at a time)."""
    gate = asyncio.Semaphore(64)
    held: list[IdleConn] = []
    for i in range(0, n, batch):
        got = await asyncio.gather(
            *(_idle_one(port, request, gate) for _ in range(min(batch, n - i)))
        )
        for r in got:
            if isinstance(r, str):
                errors[r] += 1
            else:
                held.append(r)
    return held


async def _close_all(conns: list[IdleConn]) -> None:
    for _, writer in conns:
        writer.close()
    await asyncio.sleep(0.5)


def _closed_by_server(conns: list[IdleConn]) -> int:
    """How many of `conns` the server has closed (their reader saw the end)."""
    return sum(reader.at_eof() or writer.is_closing() for reader, writer in conns)


async def hold_idle(child: Child, port: int, model: str, n: int, batch: int = 250) -> IdleResult:
    """`n` keep-alive connections to the server on `port`, one non-streamed chat request answered
    on each, then held idle: the server's RSS before, while they are held and once they are
    closed, and one new request answered (and timed) while they are held. A first batch, closed
    again before the idle RSS is read, grows the server's upstream pool to what the run needs."""
    request = idle_request(model)
    warm: collections.Counter[str] = collections.Counter()
    await _close_all(await _open_idle(port, request, batch, batch, warm))
    idle = settle_rss(child, 1.0)
    errors: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    conns = await _open_idle(port, request, n, batch, errors)
    opened_s = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    with_held = settle_rss(child, 1.0)
    # A new client while they are held: served, and how soon.
    gate = asyncio.Semaphore(1)
    t0 = time.perf_counter()
    probe = await _idle_one(port, request, gate)
    probe_ms = (time.perf_counter() - t0) * 1000
    probe_problem = probe if isinstance(probe, str) else None
    if not isinstance(probe, str):
        conns.append(probe)
    await asyncio.sleep(0.2)
    closed = _closed_by_server(conns)
    await _close_all(conns)
    after = settle_rss(child, 1.0)
    held = len(conns) - (0 if probe_problem else 1)
    return IdleResult(
        n, held, opened_s, idle, with_held, after, errors, closed, probe_ms, probe_problem
    )


@dataclass
class ExpiryResult:
    """Rounds of N keep-alive connections left idle past the server's keep-alive timeout."""

    n: int
    timeout: float
    idle: int
    held: list[int] = field(default_factory=list)  # answered, per round
    closed_by_server: list[int] = field(default_factory=list)  # per round
    after: list[int] = field(default_factory=list)  # RSS after each round
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


async def expire_idle(  # noqa: PLR0917
    child: Child, port: int, model: str, n: int, timeout: float, rounds: int = 2, batch: int = 250
) -> ExpiryResult:
    """`rounds` times: `n` connections as `hold_idle` opens them, left alone until `timeout`
    (+ 2 s) after the last was answered; how many the server closed itself, and its RSS then (a
    second round that ends where the first did: the memory is reused, not grown)."""
    request = idle_request(model)
    result = ExpiryResult(n, timeout, settle_rss(child, 1.0))
    for _ in range(rounds):
        conns = await _open_idle(port, request, n, batch, result.errors)
        await asyncio.sleep(timeout + 2.0)
        result.held.append(len(conns))
        result.closed_by_server.append(_closed_by_server(conns))
        result.after.append(settle_rss(child, 1.0))
        await _close_all(conns)
    return result


def raise_nofile(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------------------------
# Report


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def cpu_us_per_request(runs: list[WrkRun], key: str) -> float:
    """CPU µs of `key` per request, the median over runs: robust to other tenants taking the
    cores, which moves req/s more than it moves the CPU one request costs."""
    return statistics.median(1e4 * r.cpu.get(key, 0) / r.rps for r in runs if r.rps)


def report(  # noqa: PLR0917
    targets: list[Target],
    direct: Target,
    wrk32: dict[tuple[str, str], list[WrkRun]],
    wrk16: dict[tuple[str, str], list[WrkRun]],
    lat: dict[str, dict[str, list[float]]],
    args: argparse.Namespace,
) -> list[str]:
    def med(runs: list[WrkRun]) -> WrkRun:
        return sorted(runs, key=lambda r: r.rps)[len(runs) // 2]

    runs_note = f"{args.runs} run{'s' if args.runs > 1 else ''}"
    if args.quick:
        runs_note += " (--quick: min = median, a single figure)"
    out = [
        f"wrk -t1 -c32 -d{args.duration:g}s, {runs_note}; req/s min / median; CPU (% of one core)"
        " of the target and of the fake upstream over the median run; CPU µs per request of the"
        " target (of the upstream for direct), median over runs; idle RSS includes workers.",
        "",
        "| target | non-stream req/s (min / med) | stream req/s (min / med) | target CPU json / stream"
        " | target CPU µs per request json / stream | upstream CPU json / stream | idle RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in [direct, *targets]:
        cells = []
        cpus = []
        per = []
        ups = []
        for kind in ("json", "stream"):
            runs = wrk32[(t.name, kind)]
            rates = [r.rps for r in runs]
            cells.append(f"{fmt_rate(min(rates))} / {fmt_rate(statistics.median(rates))}")
            m = med(runs)
            cpus.append(f"{m.cpu.get('target', 0):.0f}%" if t is not direct else "-")
            us = cpu_us_per_request(runs, "upstream" if t is direct else "target")
            per.append(f"{us:,.0f}")
            ups.append(f"{m.cpu.get('upstream', 0):.0f}%")
        name = f"{t.name} {t.version}".strip()
        out.append(
            f"| {name} | {cells[0]} | {cells[1]} | {' / '.join(cpus)} | {' / '.join(per)}"
            f" | {' / '.join(ups)} | {mib(t.idle_rss)} |"
        )
    out += [
        "",
        "Added latency (target minus the upstream directly, ms). Sequential: one keep-alive"
        " connection each, interleaved with direct. c=16: wrk -c16 closed loop, p99 minus direct's"
        " p99 (includes queueing at saturation).",
        "",
        "| target | seq non-stream p50 / p99 | seq whole stream p50 / p99 | n"
        " | c=16 non-stream p99 | c=16 stream p99 |",
        "|---|---|---|---|---|---|",
    ]
    for t in targets:
        cells = []
        n = 0
        for kind in ("json", "stream"):
            mine = lat[kind][t.name]
            base = lat[kind][f"{direct.name}@{t.name}"]
            n = len(mine)
            d50 = percentile(mine, 0.5) - percentile(base, 0.5)
            d99 = percentile(mine, 0.99) - percentile(base, 0.99)
            cells.append(f"+{d50:.2f} / +{d99:.2f}")
        c16 = []
        for kind in ("json", "stream"):
            mine16 = statistics.median(r.p99_ms for r in wrk16[(t.name, kind)])
            base16 = statistics.median(r.p99_ms for r in wrk16[(direct.name, kind)])
            c16.append(f"+{mine16 - base16:.2f}")
        out.append(f"| {t.name} | {cells[0]} | {cells[1]} | {n} | {c16[0]} | {c16[1]} |")
    rate = {
        (t.name, kind): statistics.median(r.rps for r in wrk32[(t.name, kind)])
        for t in [direct, *targets]
        for kind in ("json", "stream")
    }
    out += ["", "Ratios (medians):"]
    names = [t.name for t in targets]
    svirs = [n for n in names if n.startswith("svir")]
    for s in svirs:
        for peer in names:
            if peer.startswith("svir"):
                continue
            out.append(
                f"- {s} / {peer}: non-stream {rate[(s, 'json')] / rate[(peer, 'json')]:.2f}x,"
                f" stream {rate[(s, 'stream')] / rate[(peer, 'stream')]:.2f}x"
            )
        out.append(
            f"- {s} / direct: non-stream {rate[(s, 'json')] / rate[('direct', 'json')]:.1%},"
            f" stream {rate[(s, 'stream')] / rate[('direct', 'stream')]:.1%}"
        )
    return out


def relay_lines(targets: list[Target], wrk32: dict[tuple[str, str], list[WrkRun]]) -> list[str]:
    """Each svir target's CPU per request against the reference relays' (issue 20's distance)."""
    relays = [t for t in targets if t.name in RELAYS]
    svirs = [t for t in targets if t.name.startswith("svir")]
    if not relays or not svirs:
        return []

    def us(t: Target, kind: str) -> float:
        return cpu_us_per_request(wrk32[(t.name, kind)], "target")

    heads = " | ".join(f"/ {r.name} json / stream" for r in relays)
    out = [
        "",
        "Distance to the reference relays (target CPU µs per request at c=32, medians over runs;"
        " `relay asgi` is svir's server stack with no svir logic, `relay raw` asyncio protocols,"
        " `relay json` relay asgi decoding and encoding the JSON it relays):",
        "",
        f"| target | CPU µs json / stream | {heads} |",
        "|---|---|" + "---|" * len(relays),
    ]
    for t in [*relays, *svirs]:
        cells = [f"{us(t, 'json'):,.0f} / {us(t, 'stream'):,.0f}"]
        for r in relays:
            cells.append(
                f"{us(t, 'json') / us(r, 'json'):.2f}x / {us(t, 'stream') / us(r, 'stream'):.2f}x"
            )
        out.append(f"| {t.name} | {' | '.join(cells)} |")
    return out


def beside_lines(
    targets: list[Target], wrk32: dict[tuple[str, str], list[WrkRun]], kind: str
) -> list[str]:
    """The streamed `kind` ("messages", "responses") beside the chat stream, for the targets that
    measured it."""
    out = [
        "",
        f"Streamed `{BESIDE[kind]}` beside the `{CHAT}` stream ({STREAM_CHUNKS} chunks each, the"
        " same fake upstream, wrk -t1 -c32, alternating inside each round; medians over runs):",
        "",
        f"| target | chat stream req/s | {kind} stream req/s | {kind} / chat req/s"
        f" | target CPU µs per request chat / {kind} | {kind} / chat CPU |",
        "|---|---|---|---|---|---|",
    ]
    for t in targets:
        if kind not in t.kinds:
            continue
        chat, msgs = wrk32[(t.name, "stream")], wrk32[(t.name, kind)]
        rate_c = statistics.median(r.rps for r in chat)
        rate_m = statistics.median(r.rps for r in msgs)
        us_c, us_m = cpu_us_per_request(chat, "target"), cpu_us_per_request(msgs, "target")
        out.append(
            f"| {t.name} | {fmt_rate(rate_c)} | {fmt_rate(rate_m)} | {rate_m / rate_c:.1%}"
            f" | {us_c:,.0f} / {us_m:,.0f} | {us_m / us_c:.2f}x |"
        )
    return out


def streams_lines(r: StreamsResult) -> list[str]:
    ok = not r.errors and r.whole == r.n
    errs = ", ".join(f"{k}: {v}" for k, v in r.errors.most_common(5)) or "none"
    return [
        f"- {r.n:,} streams opened in {r.opened_s:.1f} s; all {'ended whole' if ok else 'NOT whole'}"
        f" ({r.whole:,} whole; errors: {errs})",
        f"- svir RSS idle {mib(r.idle)}, with the streams open {mib(r.held)}:"
        f" **{r.per_stream / 1024:.1f} KiB per stream** (target < 30 KB)",
    ]


def idle_lines(name: str, r: IdleResult, timeout: float) -> list[str]:
    errs = ", ".join(f"{k}: {v}" for k, v in r.errors.most_common(5)) or "none"
    probe = r.probe_problem or f"answered in {r.probe_ms:.1f} ms"
    return [
        f"- {name} (keep_alive_timeout {timeout:g} s): {r.held:,} of {r.n:,} connections held"
        f" after one answer each, opened in {r.opened_s:.1f} s (errors: {errs});"
        f" {r.closed_by_server:,} closed by the server while held",
        f"- RSS idle {mib(r.idle)}, with them held {mib(r.with_held)}:"
        f" **{r.per_connection / 1024:.1f} KiB per idle connection**; once closed by the client"
        f" {mib(r.after)}",
        f"- a new request while they were held: {probe}",
    ]


def expiry_lines(name: str, r: ExpiryResult) -> list[str]:
    errs = ", ".join(f"{k}: {v}" for k, v in r.errors.most_common(5)) or "none"
    rounds = "; ".join(
        f"round {i + 1}: **{closed:,} of {held:,} closed by {name}**, RSS {mib(rss)}"
        for i, (held, closed, rss) in enumerate(
            zip(r.held, r.closed_by_server, r.after, strict=True)
        )
    )
    return [
        f"- {name} as configured (keep_alive_timeout {r.timeout:g} s), {len(r.held)} rounds of"
        f" {r.n:,} connections answered once each (errors: {errs}) then left idle, counted"
        f" {r.timeout + 2:g} s after the last answer: RSS {mib(r.idle)} before; {rounds}",
    ]


def rss_lines(r: RssResult) -> list[str]:
    peak = max(r.peak_sampled, r.peak_hwm or 0)
    return [
        f"- request {mib(r.request_bytes)}, relayed in {r.seconds:.2f} s; svir idle {mib(r.idle)},"
        f" peak {mib(peak)} (VmHWM {mib(r.peak_hwm or 0)}, sampled {mib(r.peak_sampled)}):"
        f" **+{(peak - r.idle) / r.request_bytes:.2f}x the request** (target < 2x)",
    ]


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", default="", help="comma-separated: nginx,portkey,litellm")
    parser.add_argument("--quick", action="store_true", help="1 run of 5 s, 200 probe requests")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probe-requests", type=int, default=500)
    parser.add_argument("--probe-budget", type=float, default=30.0, help="s per target at most")
    parser.add_argument("--svir-workers", type=int, default=1, help="also svir with N workers")
    parser.add_argument("--litellm-workers", default="1,2")
    parser.add_argument("--streams", type=int, default=5000, help="0: skip the open streams")
    parser.add_argument("--image-mib", type=float, default=50.0, help="0: skip the large image")
    parser.add_argument(
        "--idle-connections",
        type=int,
        default=0,
        help="N keep-alive connections held idle after one answer each (svir, relay asgi)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="keep_alive_timeout (s) of the svir and relay holding the idle connections",
    )
    parser.add_argument(
        "--idle-rounds",
        type=int,
        default=2,
        help="rounds of the idle connections left to svir's keep-alive timeout (RSS after each)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy raw stacks of svir, streamed load")
    parser.add_argument(
        "--svir-src", type=Path, help="run svir from this source tree (default: this one)"
    )
    parser.add_argument(
        "--compare-src",
        type=Path,
        help="also run svir from this source tree, as `svir (other)`: before/after in one run",
    )
    parser.add_argument("--granian", action="store_true", help="also svir's app on granian")
    parser.add_argument(
        "--messages",
        action="store_true",
        help="svir targets: also the streamed /v1/messages beside the chat stream",
    )
    parser.add_argument(
        "--ollama",
        action="store_true",
        help="svir targets: also the streamed /api/chat (NDJSON) beside the chat stream",
    )
    parser.add_argument(
        "--completions",
        action="store_true",
        help="svir targets: also the streamed /v1/completions beside the chat stream",
    )
    parser.add_argument(
        "--responses",
        action="store_true",
        help="svir targets: also the streamed /v1/responses beside the chat stream",
    )
    parser.add_argument(
        "--svir-python",
        default="",
        help="comma-separated Python versions (e.g. 3.12,3.13): also svir on each interpreter",
    )
    parser.add_argument("--native", action="store_true", help="py-spy --native")
    parser.add_argument(
        "--no-relays", action="store_true", help="leave out the reference relays (bench.relay_*)"
    )
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.duration = 1, min(args.duration, 5.0)
        args.probe_requests = min(args.probe_requests, 200)
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in PEERS:
            parser.error(f"unknown peer {p!r} (known: {', '.join(PEERS)}; Bifrost cannot run here)")
    if args.runs and shutil.which("wrk") is None:
        print(INSTALL_WRK, file=sys.stderr)
        return 2
    if args.profile and not args.runs:
        parser.error("--profile needs --runs of 1 or more")
    for p in peers:
        install_peer(p)
    # Inherited by every child started below; the idle connections' ends are in two processes.
    nofile = raise_nofile(max(4 * args.streams, args.idle_connections) + 4096)

    what = describe()
    tmp = Path(tempfile.mkdtemp(prefix="svir-suite-"))
    image_bytes = int(args.image_mib * 2**20)
    max_connections = max(1000, args.streams, args.idle_connections) + 1000
    max_body = max(64 << 20, 2 * image_bytes)
    children: list[Child] = []
    out: list[str] = []
    failed = False
    try:
        upstream, up_port = start_fake_upstream(tmp / "upstream.log", name="direct")
        children.append(upstream)
        direct = Target("direct", upstream, up_port, {"json": "json", "stream": STREAM_MODEL})
        slow, slow_port = start_fake_upstream(
            tmp / "slow.log", "--drip-interval", "2", name="slow upstream"
        )
        children.append(slow)

        targets: list[Target] = []
        starters: list[Callable[[], Target]] = [
            lambda: start_svir(
                tmp, "svir", up_port, slow_port, max_body, 1, args.svir_src,
                max_connections=max_connections,
            )
        ]  # fmt: skip
        if args.compare_src:
            starters.append(
                lambda: start_svir(
                    tmp, "svir (other)", up_port, slow_port, max_body, 1, args.compare_src
                )
            )
        if args.granian:
            starters.append(
                lambda: start_svir(
                    tmp, "svir granian", up_port, slow_port, max_body, 1, args.svir_src, "granian"
                )
            )
        if args.svir_workers > 1:
            w = args.svir_workers
            starters.append(
                lambda: start_svir(
                    tmp, f"svir x{w}", up_port, slow_port, max_body, w, args.svir_src
                )
            )
        for version in (v for v in args.svir_python.split(",") if v):
            py = svir_python(version)
            starters.append(
                lambda py=py, v=version: start_svir(
                    tmp, f"svir py{v}", up_port, slow_port, max_body, 1, args.svir_src, python=py
                )
            )
        if not args.no_relays:
            for relay in RELAYS:
                starters.append(lambda relay=relay: start_relay(tmp, relay, up_port))
        for p in peers:
            if p == "litellm":
                for w in (int(x) for x in args.litellm_workers.split(",")):
                    starters.append(lambda w=w: start_peer(tmp, "litellm", up_port, w))
            else:
                starters.append(lambda p=p: start_peer(tmp, p, up_port))
        for start in starters:
            t = start()
            if t.name.startswith("svir"):
                extra = [k for k in BESIDE if getattr(args, k)]
                t.kinds = ("json", "stream", *extra)
            children.append(t.child)
            targets.append(t)
            print(f"{t.name} {t.version} on :{t.port} (pid {t.child.pid})", flush=True)
        problems = [p for t in [direct, *targets] for p in check_target(t)]
        if problems:
            print("answers are wrong:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        time.sleep(1.0)
        for t in [direct, *targets]:
            t.idle_rss = settle_rss(t.child)

        luas: dict[tuple[str, str], Path] = {}
        if args.runs:  # 0: the memory figures alone
            for t in [direct, *targets]:
                for kind in t.kinds:
                    lua = tmp / f"{t.name.replace(' ', '-')}-{kind}.lua"
                    write_lua(lua, t.body(kind), t.headers_for(kind))
                    luas[(t.name, kind)] = lua
            print("warm-up ...", flush=True)
            for t in [direct, *targets]:
                for kind in t.kinds:
                    run_wrk(
                        t.port,
                        luas[(t.name, kind)],
                        2,
                        connections=32,
                        threads=1,
                        path=t.path(kind),
                    )
            wrk32: dict[tuple[str, str], list[WrkRun]] = collections.defaultdict(list)
            wrk16: dict[tuple[str, str], list[WrkRun]] = collections.defaultdict(list)
            for i in range(args.runs):
                for t in [direct, *targets]:
                    watched = {"upstream": upstream} if t is direct else {"target": t.child}
                    if t is not direct:
                        watched["upstream"] = upstream
                    for kind in t.kinds:
                        # The other front ends' streams are compared at c=32 only (their c=16 p99 is
                        # not reported).
                        levels = ((32, wrk32),) if kind in BESIDE else ((32, wrk32), (16, wrk16))
                        for conns, store in levels:
                            dur = args.duration if conns == 32 else max(3.0, args.duration / 2)
                            run = run_wrk(
                                t.port, luas[(t.name, kind)], dur, connections=conns,
                                threads=1, watched=watched, path=t.path(kind),
                            )  # fmt: skip
                            store[(t.name, kind)].append(run)
                            bad = f"  {run.non2xx} non-2xx, {run.errors} socket errors"
                            print(
                                f"  run {i + 1}/{args.runs} c={conns} {t.name:12} {kind:8}"
                                f" {run.rps:10,.1f} req/s p99 {run.p99_ms:8.2f} ms"
                                + (bad if run.non2xx or run.errors else ""),
                                flush=True,
                            )
                            if run.non2xx:
                                failed = True
            print(
                f"added latency: up to {args.probe_requests} sequential requests each ...",
                flush=True,
            )
            lat = latency_probe(targets, direct, args.probe_requests, args.probe_budget)
            out += report(targets, direct, wrk32, wrk16, lat, args)
            out += relay_lines(targets, wrk32)
            for kind in BESIDE:
                if getattr(args, kind):
                    out += beside_lines(targets, wrk32, kind)

        svir = targets[0]
        if args.streams:
            print(
                f"{args.streams} open streams through svir (RLIMIT_NOFILE {nofile}) ...", flush=True
            )
            sr = uvloop_run(open_streams(svir.child, svir.port, args.streams, 20, 250))
            out += [
                "",
                f"{args.streams:,} concurrent streams through svir (slow drip, 1 chunk / 2 s):",
                "",
            ]
            out += streams_lines(sr)
            failed = failed or bool(sr.errors) or sr.whole != sr.n
        if image_bytes:
            print(f"peak RSS: one request with a {args.image_mib:g} MiB image ...", flush=True)
            rss = rss_probe(svir.child, svir.port, image_bytes)
            out += ["", f"Peak RSS of svir, one request with a {args.image_mib:g} MiB image:", ""]
            out += rss_lines(rss)
        if args.idle_connections:
            n = args.idle_connections
            out += [
                "",
                f"{n:,} idle keep-alive connections (each after one non-streamed chat answer):",
                "",
            ]
            held_for = args.idle_timeout
            print(
                f"{n} idle connections, svir with keep_alive_timeout {held_for:g} s"
                f" (RLIMIT_NOFILE {nofile}) ...",
                flush=True,
            )
            tmp_idle = tmp / "idle"
            tmp_idle.mkdir()
            held = start_svir(
                tmp_idle, "svir idle", up_port, slow_port, max_body, 1, args.svir_src,
                max_connections=max_connections, keep_alive_timeout=held_for,
            )  # fmt: skip
            children.append(held.child)
            ir = uvloop_run(hold_idle(held.child, held.port, held.models["json"], n))
            held.child.stop()
            out += idle_lines("svir", ir, held_for)
            failed = failed or bool(ir.errors) or ir.probe_problem is not None
            failed = failed or ir.closed_by_server > 0
            if not args.no_relays:
                print(f"{n} idle connections, relay asgi ...", flush=True)
                relay = start_relay(tmp_idle, "relay asgi", up_port, held_for)
                children.append(relay.child)
                rr = uvloop_run(hold_idle(relay.child, relay.port, relay.models["json"], n))
                relay.child.stop()
                out += idle_lines("relay asgi", rr, held_for)
                if rr.per_connection:
                    out.append(
                        f"- svir / relay asgi, memory per idle connection:"
                        f" {ir.per_connection / rr.per_connection:.2f}x"
                    )
            timeout = ServerConfig().keep_alive_timeout
            print(f"{n} idle connections left to svir's keep-alive timeout ...", flush=True)
            er = uvloop_run(
                expire_idle(
                    svir.child, svir.port, svir.models["json"], n, timeout, args.idle_rounds
                )
            )
            out += expiry_lines("svir", er)
            failed = failed or er.closed_by_server != er.held or bool(er.errors)
        if args.profile:
            print("py-spy: svir under the streamed load ...", flush=True)
            profile(
                svir.child, svir.port, luas[("svir", "stream")], args.duration,
                connections=32, threads=1, out=args.profile, native=args.native,
            )  # fmt: skip
            out += ["", "```", summarize_profile(args.profile), "```"]
    finally:
        for child in reversed(children):
            child.stop()
    text = "\n".join([what, "", *out])
    print()
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.keep:
        print(f"\nlogs and configs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def uvloop_run(coro: object) -> StreamsResult:
    try:
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
