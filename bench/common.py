"""Shared pieces of the gateway benchmarks: child processes (CPU and RSS of a process tree),
`wrk` runs with a Lua POST body, answer checks, percentiles, the large-request peak RSS probe,
py-spy profiles and their summary. Used by `bench.gateway_throughput` and `bench.suite`.
"""

from __future__ import annotations

import base64
import collections
import contextlib
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
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.upstream import CHUNK_ID

ROOT = Path(__file__).resolve().parent.parent
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
OLLAMA_CHAT = "/api/chat"
COMPLETIONS = "/v1/completions"
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


def messages_body(model: str) -> bytes:
    """A streamed Anthropic Messages request, the same question as `request_body`'s."""
    req = {
        "model": model,
        "max_tokens": 256,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello in a few words."}],
    }
    return json.dumps(req, separators=(",", ":")).encode()


def check_messages_stream(data: bytes, chunks: int) -> str | None:
    """None if `data` is a whole Messages stream with `chunks` text deltas."""
    names = [line[7:] for line in data.split(b"\n") if line.startswith(b"event: ")]
    if not names or names[0] != b"message_start" or names[-1] != b"message_stop":
        return f"not a whole Messages stream: {data[-200:]!r}"
    if names.count(b"content_block_delta") != chunks:
        return f"{names.count(b'content_block_delta')} text deltas, expected {chunks}"
    return None


def ollama_body(model: str) -> bytes:
    """A streamed Ollama `/api/chat` request, the same question as `request_body`'s."""
    req = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hello in a few words."}],
    }
    return json.dumps(req, separators=(",", ":")).encode()


def check_ollama_stream(data: bytes, chunks: int) -> str | None:
    """None if `data` is a whole Ollama NDJSON stream of `chunks` tokens (svir's Ollama front end
    writes the pieces of one read as one line, so lines are not chunks)."""
    lines = [json.loads(line) for line in data.split(b"\n") if line.strip()]
    if not lines or lines[-1].get("done") is not True:
        return f"not a whole Ollama stream: {data[-200:]!r}"
    if not any(x.get("message", {}).get("content") for x in lines[:-1]):
        return "no content"
    if lines[-1].get("eval_count") != chunks:
        return f"eval_count {lines[-1].get('eval_count')}, expected {chunks}"
    return None


def responses_body(model: str) -> bytes:
    """A streamed Responses request, the same question as `request_body`'s, stateless as Codex
    sends it (`store: false`: nothing written per request)."""
    req = {
        "model": model,
        "stream": True,
        "store": False,
        "input": [{"role": "user", "content": "Say hello in a few words."}],
    }
    return json.dumps(req, separators=(",", ":")).encode()


def check_responses_stream(data: bytes, chunks: int) -> str | None:
    """None if `data` is a whole Responses stream with `chunks` text deltas."""
    names = [line[7:] for line in data.split(b"\n") if line.startswith(b"event: ")]
    if not names or names[0] != b"response.created" or names[-1] != b"response.completed":
        return f"not a whole Responses stream: {data[-200:]!r}"
    if names.count(b"response.output_text.delta") != chunks:
        return f"{names.count(b'response.output_text.delta')} text deltas, expected {chunks}"
    return None


def completions_body(model: str) -> bytes:
    """A streamed OpenAI `/v1/completions` request with usage, the chat stream's prompt as text."""
    req = {
        "model": model,
        "prompt": "Say hello in a few words.",
        "max_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(req, separators=(",", ":")).encode()


def check_completions_stream(data: bytes, chunks: int) -> str | None:
    """None if `data` is a whole `text_completion` stream: `chunks` pieces of text, one finish
    (`stop`), one usage chunk counting `chunks` completion tokens, and `[DONE]` last."""
    events = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        return f"stream does not end with [DONE]: {data[-200:]!r}"
    docs = [json.loads(e) for e in events[:-1]]
    if any(d.get("object") != "text_completion" for d in docs):
        return f"not text_completion chunks: {data[:200]!r}"
    choices = [c for d in docs for c in d.get("choices", [])]
    texts = [c["text"] for c in choices if c.get("text")]
    finish = [c["finish_reason"] for c in choices if c.get("finish_reason")]
    usage = [d["usage"] for d in docs if d.get("usage")]
    if len(texts) != chunks:
        return f"{len(texts)} text chunks, expected {chunks}"
    if finish != ["stop"] or len(usage) != 1:
        return f"finish {finish}, {len(usage)} usage chunks"
    if usage[0].get("completion_tokens") != chunks:
        return f"usage {usage[0]}, expected {chunks} completion tokens"
    return None


# ---------------------------------------------------------------------------------------------
# Child processes


class Child:
    """A child process whose output goes to a log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd or ROOT,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
        )
        self.ps = psutil.Process(self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        """CPU seconds of the process and its live children (workers)."""
        total = 0.0
        for ps in self.tree():
            try:
                t = ps.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.Error:
            return [self.ps]

    def rss(self) -> int:
        """Resident bytes of the process and its children (workers)."""
        total = 0
        for ps in self.tree():
            with contextlib.suppress(psutil.Error):
                total += ps.memory_info().rss
        return total

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the child's process group (its workers too), SIGKILL after 10 s."""
        if self.alive():
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group
        self._log.close()

    def tail(self, n: int = 20) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def wait_healthy(child: Child, port: int, path: str, timeout: float = 30.0) -> None:
    """Until GET `path` answers 200 (any answer under 500 for a `path` ending in `*`)."""
    anything = path.endswith("*")
    path = path.rstrip("*")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited {child.proc.returncode}:\n{child.tail()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            status = conn.getresponse().status
            if status == 200 or (anything and status < 500):
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not become healthy:\n{child.tail()}")


def start_fake_upstream(log: Path, *args: str, name: str = "fake upstream") -> tuple[Child, int]:
    """The scripted upstream (`python -m tests.support.upstream`) on a free loopback port (`args` passed on) once it answers, and its
    port; stopped again if it never does."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.upstream", "--port", str(port), *args]
    child = Child(name, argv, log)
    try:
        wait_healthy(child, port, "/healthz")
    except BaseException:
        child.stop()
        raise
    return child, port


# ---------------------------------------------------------------------------------------------
# Correctness first: a fast wrong answer measures nothing


def post(
    conn: http.client.HTTPConnection,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    path: str = CHAT,
) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={**JSON_HEADERS, **(headers or {})})
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
    if relayed is not None and relayed != all(d["id"] == CHUNK_ID for d in docs):
        return "relayed chunks expected" if relayed else "re-encoded chunks expected"
    content = [
        c["delta"]["content"]
        for d in docs
        for c in d.get("choices", [])
        if c.get("delta", {}).get("content")
    ]
    finish = [
        c["finish_reason"] for d in docs for c in d.get("choices", []) if c.get("finish_reason")
    ]
    usage = [d["usage"] for d in docs if d.get("usage")]
    if len(content) != chunks:
        return f"{len(content)} content chunks, expected {chunks}"
    if finish != ["stop"] or len(usage) != 1:
        return f"finish {finish}, {len(usage)} usage chunks"
    return None


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


def write_lua(path: Path, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    text = body.decode()
    assert "]==]" not in text
    extra = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items())
    path.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        + extra
        + f"wrk.body = [==[{text}]==]\n"
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
    path: str = CHAT,
) -> WrkRun:
    watched = watched or {}
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--timeout", "10s"]
    cmd += ["--latency", "-s", str(lua), f"http://127.0.0.1:{port}{path}"]
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
    (
        "svir upstream client (edges/h1.py, upstream.py)",
        lambda f: "svir/edges/h1.py" in f or "svir/edges/upstream.py" in f,
    ),
    (
        "HTTP server (edges/h1_server*.py, uvicorn, httptools)",
        lambda f: "svir/edges/h1_server" in f or "uvicorn/" in f or "httptools" in f,
    ),
    ("svir chat core (chat.py)", lambda f: "svir/chat.py" in f),
    (
        "svir app and front ends (edges/app.py, frontends/)",
        lambda f: "svir/edges/app.py" in f or "svir/protocols/" in f,
    ),
    ("asyncio / uvloop", lambda f: "asyncio/" in f or "uvloop" in f),
]


# Leaf frames of threads that only wait (py-spy counts their polling as active).
IDLE_FRAMES = ("_connection_worker_thread (aiosqlite", "_worker (concurrent/futures/thread.py")


def summarize_profile(path: Path, top: int = 15, explain: int = 3) -> str:
    """Shares of samples by layer and by leaf frame; the first `explain` leaves split by layer."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            if any(idle in frames[-1] for idle in IDLE_FRAMES):
                continue  # a helper thread waiting on its queue: not CPU time
            stacks.append((frames, int(count)))
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
