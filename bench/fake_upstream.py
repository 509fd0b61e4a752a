"""A fake OpenAI-compatible upstream, fast enough never to be the bottleneck of a gateway benchmark.

A raw asyncio Protocol on uvloop: HTTP/1.1 keep-alive, minimal parsing (end of headers, a
Content-Length body), every answer built once and then written with a single `write`. What it
answers is chosen by the request's JSON `model` (anything up to a `/` is ignored, so
`fake/stream-20` and `stream-20` are the same):

- `json`: a `chat.completion` body; when the request says `"stream": true` (svir always does, it
  reads every upstream as a stream), the same completion as a short stream instead.
- `stream-N`: N content chunks (the first also carries the role), a finish chunk, a usage chunk
  and `[DONE]`, as `text/event-stream`, chunked (or with Content-Length: `--framing length`).
- `drip` / `drip-N`: the same stream (N = 20 by default) with one chunk every 50 ms
  (`--drip-interval`).

Any other model is answered as `json`. A request body of any size is accepted: past 1 MiB it is
read and thrown away, keeping only its first 64 KiB and last 4 KiB to find `model` and `stream`.
`GET /v1/models` lists the modes; any other GET is a small 200. Run:

    .venv/bin/python -m bench.fake_upstream --port 8081 [--host 127.0.0.1] [--framing chunked]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import re
from typing import cast

import uvloop

MAX_HEAD = 64 * 1024  # request line and headers
KEEP_WHOLE = 1 << 20  # bodies up to this size are kept whole; larger ones are discarded
KEEP_HEAD = 64 * 1024  # of a discarded body: its first bytes...
KEEP_TAIL = 4 * 1024  # ...and its last, where `model` and `stream` are looked for
DRIP_INTERVAL = 0.05
DRIP_DEFAULT = 20
CREATED = 1700000000
drip_interval = DRIP_INTERVAL  # seconds between drip chunks (--drip-interval)

_MODEL = re.compile(rb'"model"\s*:\s*"([^"]*)"')
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_MODE = re.compile(r"(json|stream|drip)(?:-(\d{1,6}))?")
_ANSWER = "Hello! This is a fake answer from the bench upstream, a few words long."
ANSWER_TOKENS = 16
_WORDS = [" " + w for w in _ANSWER.rstrip(".").split(" ")]


def _enc(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _chunk(model: str, delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": 12,
        "completion_tokens": completion_tokens,
        "total_tokens": 12 + completion_tokens,
    }


def stream_events(model: str, contents: list[str], tokens: int | None = None) -> list[bytes]:
    """The SSE events of a stream carrying `contents`, one chunk each, then finish, usage, DONE.

    The usage counts `tokens` completion tokens, by default one per chunk.
    """
    events = []
    for i, text in enumerate(contents):
        delta: dict[str, object] = {"content": text}
        if i == 0:
            delta = {"role": "assistant", "content": text}
        events.append(_chunk(model, delta))
    events.append(_chunk(model, {}, "stop"))
    usage = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "choices": [],
        "usage": _usage(len(contents) if tokens is None else tokens),
    }
    events.append(usage)
    return [b"data: " + _enc(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def stream_contents(n: int) -> list[str]:
    return [_WORDS[i % len(_WORDS)] for i in range(n)]


def completion_body(model: str) -> bytes:
    return _enc(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(ANSWER_TOKENS),
        }
    )


def _head(status: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def json_response(body: bytes, status: str = "200 OK") -> bytes:
    return (
        _head(
            status,
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("x-request-id", "fake-upstream"),
            ],
        )
        + body
    )


def sse_head(chunked: bool, length: int | None = None) -> bytes:
    headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
    headers.append(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(length)))
    headers.append(("x-request-id", "fake-upstream"))
    return _head("200 OK", headers)


def chunk_frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def sse_response(events: list[bytes], chunked: bool) -> bytes:
    if chunked:
        return sse_head(True) + b"".join(chunk_frame(e) for e in events) + LAST_CHUNK
    body = b"".join(events)
    return sse_head(False, len(body)) + body


@functools.lru_cache(maxsize=256)
def answer(model: str, stream: bool, chunked: bool) -> tuple[str, bytes | list[bytes]]:
    """("whole", response bytes) for an answer written at once, ("drip", events) for a drip."""
    match = _MODE.fullmatch(model)
    mode, n = (match.group(1), match.group(2)) if match else ("json", None)
    if mode == "json":
        if not stream:
            return "whole", json_response(completion_body(model))
        return "whole", sse_response(stream_events(model, [_ANSWER], ANSWER_TOKENS), chunked)
    count = int(n) if n is not None else DRIP_DEFAULT
    events = stream_events(model, stream_contents(count))
    if mode == "drip":
        return "drip", events
    return "whole", sse_response(events, chunked)


def models_body() -> bytes:
    ids = ["json", "stream-20", "drip"]
    data = [{"id": i, "object": "model", "created": CREATED, "owned_by": "bench"} for i in ids]
    return _enc({"object": "list", "data": data})


class Upstream(asyncio.Protocol):
    """One client connection: requests one after another, each answered in full before the next."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        # The request being read: its head, and for a discarded body what is kept of it.
        self.method = b""
        self.path = b""
        self.close_after = False
        self.remaining = -1  # body bytes still to read; -1 while reading a head
        self.discarding = False
        self.kept_head = bytearray()
        self.kept_tail = b""
        self.busy = False  # a drip is being written: later requests wait in `buf`
        self.drip: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.drip is not None:
            self.drip.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            data = self._discard(data)
            if not data:
                return
        self.buf += data
        self._process()

    # -- parsing

    def _process(self) -> None:
        buf = self.buf
        while not self.busy and self.transport is not None:
            if self.remaining < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        self._fail("431 Request Header Fields Too Large")
                    return
                if not self._parse_head(bytes(buf[:end])):
                    return
                del buf[: end + 4]
                if self.remaining > KEEP_WHOLE:
                    self.discarding = True
                    self.kept_head = bytearray()
                    self.kept_tail = b""
                    rest = self._discard(bytes(buf))
                    buf.clear()
                    if not rest:
                        return
                    buf += rest
                    continue
            if self.remaining >= 0 and not self.discarding:
                if len(buf) < self.remaining:
                    return
                body = bytes(buf[: self.remaining])
                del buf[: self.remaining]
                self.remaining = -1
                self._respond(body)

    def _parse_head(self, head: bytes) -> bool:
        line, _, rest = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3:
            self._fail("400 Bad Request")
            return False
        self.method, self.path, version = parts
        lower = b"\r\n" + rest.lower()
        if b"\r\ntransfer-encoding:" in lower:
            self._fail("411 Length Required")  # chunked request bodies are not needed here
            return False
        length = 0
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            end = lower.find(b"\r\n", at + 2)
            value = lower[at + 17 : end if end >= 0 else len(lower)]
            try:
                length = int(value.strip())
            except ValueError:
                self._fail("400 Bad Request")
                return False
        if version == b"HTTP/1.0":
            self.close_after = b"\r\nconnection: keep-alive" not in lower
        else:
            self.close_after = b"\r\nconnection: close" in lower
        self.remaining = length
        return True

    def _discard(self, data: bytes) -> bytes:
        """Count a large body's bytes off without keeping them; return what follows it."""
        take = min(self.remaining, len(data))
        piece = data[:take] if take < len(data) else data
        if len(self.kept_head) < KEEP_HEAD:
            self.kept_head += piece[: KEEP_HEAD - len(self.kept_head)]
        self.kept_tail = (self.kept_tail + piece[-KEEP_TAIL:])[-KEEP_TAIL:]
        self.remaining -= take
        if self.remaining > 0:
            return b""
        self.discarding = False
        self.remaining = -1
        self._respond(bytes(self.kept_head) + b"\n" + self.kept_tail)
        self.kept_head = bytearray()
        self.kept_tail = b""
        return data[take:]

    # -- answering

    def _respond(self, body: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        if self.method == b"GET":
            payload = models_body() if self.path.endswith(b"/models") else b'{"status":"ok"}'
            transport.write(json_response(payload))
            self._after()
            return
        found = _MODEL.search(body)
        model = found.group(1).decode(errors="replace") if found else "json"
        model = model.rpartition("/")[2]
        stream = _STREAM_TRUE.search(body) is not None
        kind, data = answer(model, stream, self.chunked)
        if kind == "whole":
            assert isinstance(data, bytes)
            transport.write(data)
            self._after()
            return
        assert isinstance(data, list)
        if self.chunked:
            transport.write(sse_head(True))
            frames = [chunk_frame(e) for e in data] + [LAST_CHUNK]
        else:
            transport.write(sse_head(False, sum(len(e) for e in data)))
            frames = list(data)
        self.busy = True
        self._drip(frames, 0)

    def _drip(self, frames: list[bytes], i: int) -> None:
        self.drip = None
        if self.transport is None:
            return
        self.transport.write(frames[i])
        # The last chunk marker goes with the [DONE] event, not 50 ms after it.
        if i + 2 == len(frames) and frames[-1] is LAST_CHUNK:
            self.transport.write(LAST_CHUNK)
            i += 1
        if i + 1 < len(frames):
            loop = asyncio.get_running_loop()
            self.drip = loop.call_later(drip_interval, self._drip, frames, i + 1)
            return
        self.busy = False
        self._after()
        if self.buf:
            self._process()

    def _after(self) -> None:
        if self.close_after and self.transport is not None:
            self.transport.close()

    def _fail(self, status: str) -> None:
        if self.transport is not None:
            self.transport.write(json_response(b'{"error":"bad request"}', status))
            self.transport.close()


async def serve(host: str, port: int, chunked: bool, ready: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Upstream(chunked), host, port, backlog=2048, reuse_address=True
    )
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument(
        "--drip-interval", type=float, default=DRIP_INTERVAL, help="seconds between drip chunks"
    )
    parser.add_argument(
        "--framing",
        choices=["chunked", "length"],
        default="chunked",
        help="how an SSE answer is framed (default: chunked)",
    )
    args = parser.parse_args(argv)
    global drip_interval
    drip_interval = args.drip_interval
    print(f"fake upstream on http://{args.host}:{args.port}/v1 ({args.framing})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, args.framing == "chunked"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
