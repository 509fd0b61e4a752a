"""The HTTP server's own cost per request: the same fixed answer served by each server stack, no
upstream and no svir logic, under callgrind, so that the distance between them is the server's.

- `raw`: an asyncio.Protocol on uvloop with httptools' request parser, answering in its callback
  (no task, no ASGI): the floor of a Python HTTP server.
- `uvicorn`: a three-line ASGI app (read the body, send the head, send the body) on uvicorn with
  httptools and uvloop, as `svir serve` configures it, but uvicorn's own protocol.
- `uvicorn, no proxy headers`: the same with `proxy_headers=False` (svir keeps them: its
  loopback-only rule reads the client's address, which a local reverse proxy forwards).
- `svir protocol`: the same app on svir's own HTTP/1.1 protocol (svir.edges.h1_server), with the
  default `[server]` limits, as `svir serve` runs it.

    .venv/bin/python -m bench.server_floor [--requests 200]

Each answers `--requests` sequential non-streamed POSTs of the bench's chat body on one keep-alive
connection, after a checked warm-up (bench.instructions.count_requests). Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httptools
import uvloop

ANSWER = json.dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "floor",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
HEAD = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
RAW_ANSWER = b"HTTP/1.1 200 OK\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in HEAD)
RAW_ANSWER += b"\r\n" + ANSWER
SERVERS = {
    "raw": "raw",
    "uvicorn": "uvicorn",
    "uvicorn, no proxy headers": "uvicorn-noproxy",
    "svir protocol": "svir",
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": ANSWER})


class Raw(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(RAW_ANSWER)


def serve(mode: str, port: int) -> None:
    if mode == "raw":
        uvloop.install()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(loop.create_server(Raw, "127.0.0.1", port))
        loop.run_forever()
        return
    import uvicorn

    http: Any = "httptools"
    if mode == "svir":
        from svir.config.model import ServerConfig
        from svir.edges.h1_server import H1ServerProtocol

        http = functools.partial(H1ServerProtocol, limits=ServerConfig())
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=http,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=mode != "uvicorn-noproxy",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--serve", choices=sorted(SERVERS.values()), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    from bench.common import ROOT, describe, free_port, request_body
    from bench.instructions import count_requests

    tmp = Path(tempfile.mkdtemp(prefix="svir-server-floor-"))
    results: dict[str, float] = {}
    for label, mode in SERVERS.items():
        print(f"{label} under callgrind ...", flush=True)
        port = free_port()
        argv_ = [sys.executable, "-m", "bench.server_floor", "--serve", mode, "--port", str(port)]
        counted = count_requests(
            mode,
            argv_,
            port,
            src=ROOT,
            tmp=tmp,
            bodies={"json": request_body("floor", False)},
            headers={},
            requests=args.requests,
        )
        results[label] = counted["json"]
    print(f"\n{describe()}\n")
    print(f"Instructions per request, a fixed answer (callgrind, {args.requests} sequential):\n")
    print("| server | instructions | vs raw | vs uvicorn |")
    print("|---|---|---|---|")
    for label, n in results.items():
        raw, uv = results["raw"], results["uvicorn"]
        print(f"| {label} | {n:,.0f} | {n / raw:.1f}x | {n / uv:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
