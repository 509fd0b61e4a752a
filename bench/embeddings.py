"""Embedding batches as code indexing sends them: time and svir's peak memory per batch size,
through svir against the fake upstream directly, side by side in one run.

Starts the fake embedder (`python -m tests.support.embedder`, 768 dimensions) and `svir serve`
(one worker) on free loopback ports. Two providers over the same fake: `floats` (kind
openai-compatible: svir asks for JSON floats) and `b64` (kind llamacpp: svir asks for base64 and
hands a base64 client the upstream's text untouched). For each batch size (inputs of about 400
characters, like chunks of source files), each encoding the client asks for (`float`, `base64`)
and each path (direct, via svir), `--runs` requests on one keep-alive connection, interleaved;
reported: the median time per request, svir's added time, and svir's peak RSS growth over its
idle RSS while serving that batch (the kernel's high-water mark, reset before each batch size).

    .venv/bin/python -m bench.embeddings [--sizes 16,128,512,2048] [--runs 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Child, describe, free_port, mib, post, reset_hwm, vm_hwm, wait_healthy

PATH = "/v1/embeddings"
SVIR_CONFIG = """
[server]
max_body_bytes = 67108864

[[providers]]
name = "floats"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{port}/v1"
discover = false

[[providers]]
name = "b64"
kind = "llamacpp"
base_url = "http://127.0.0.1:{port}"
discover = false
"""


def chunk(i: int) -> str:
    """About 400 characters of source, different for every input."""
    line = f"def handler_{i}(request, context):  # route {i}\n    return respond(request, {i})\n"
    return (line * 6)[:400]


def body(model: str, size: int, encoding: str) -> bytes:
    texts = [chunk(i) for i in range(size)]
    return json.dumps({"model": model, "input": texts, "encoding_format": encoding}).encode()


def check(data: bytes, size: int) -> None:
    answer = json.loads(data)
    assert len(answer["data"]) == size, answer.get("error")


def timed(conn: http.client.HTTPConnection, payload: bytes, size: int) -> float:
    started = time.perf_counter()
    status, data = post(conn, payload, path=PATH)
    seconds = time.perf_counter() - started
    assert status == 200, data[:300]
    check(data, size)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,128,512,2048")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="svir-bench-embed-") as name:
        tmp = Path(name)
        up_port, svir_port = free_port(), free_port()
        children: list[Child] = []
        try:
            up = Child(
                "fake embedder",
                [sys.executable, "-m", "tests.support.embedder", "--port", str(up_port)],
                tmp / "embedder.log",
            )
            children.append(up)
            wait_healthy(up, up_port, "/healthz")
            config = tmp / "svir.toml"
            config.write_text(SVIR_CONFIG.format(port=up_port))
            svir = Child(
                "svir",
                [sys.executable, "-m", "svir", "serve", "--config", str(config), "--port",
                 str(svir_port)],
                tmp / "svir.log",
            )  # fmt: skip
            children.append(svir)
            wait_healthy(svir, svir_port, "/healthz")
            report(sizes, args.runs, up_port, svir_port, svir)
        finally:
            for child in reversed(children):
                child.stop()
    return 0


def report(sizes: list[int], runs: int, up_port: int, svir_port: int, svir: Child) -> None:
    direct = http.client.HTTPConnection("127.0.0.1", up_port, timeout=300)
    via = http.client.HTTPConnection("127.0.0.1", svir_port, timeout=300)
    print(describe())
    print(f"{runs} runs a cell, median; inputs of 400 characters, 768 dimensions\n")
    print(
        "| inputs | client asks | svir asks upstream | direct | via svir | svir adds "
        "| svir peak RSS growth |"
    )
    print("|---:|---|---|---:|---:|---:|---:|")
    for size in sizes:
        for encoding in ("float", "base64"):
            for provider, upstream in (("floats", "floats"), ("b64", "base64")):
                d_body = body("m", size, encoding)
                s_body = body(f"{provider}/m", size, encoding)
                timed(via, s_body, size)  # warm: connections, caches
                idle = svir.rss()
                reset_hwm(svir.pid)
                d_times: list[float] = []
                s_times: list[float] = []
                for _ in range(runs):
                    d_times.append(timed(direct, d_body, size))
                    s_times.append(timed(via, s_body, size))
                peak = vm_hwm(svir.pid)
                d, s = statistics.median(d_times), statistics.median(s_times)
                growth = mib(max(0, (peak or 0) - idle)) if peak else "n/a"
                print(
                    f"| {size} | {encoding} | {upstream} | {d * 1000:.1f} ms | {s * 1000:.1f} ms "
                    f"| {(s - d) * 1000:+.1f} ms ({s / d:.2f}x) | {growth} |"
                )


if __name__ == "__main__":
    raise SystemExit(main())
