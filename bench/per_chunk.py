"""CPU per streamed chunk in the wire core, against the floor of decoding and re-encoding each
chunk's JSON with msgspec: svir's normalizing path (decode + normalize + encode) and relay mode
(`relay = true`: the upstream's frames forwarded, every event still decoded for the accounting);
normalizing also with `<think>` tags split out of the text, as a local server's route does.

One process, one stream of `--chunks` content chunks (then finish, usage, `[DONE]`) in 4 KiB
network-sized reads, the paths alternating inside each of `--rounds` rounds; best and median.
`--piece 0` reads one event at a time instead, as a server that writes each token as it makes it
is read: each read's own cost, which 4 KiB reads share among ~20 chunks, is then a chunk's.

    .venv/bin/python -m bench.per_chunk [--chunks 1000] [--rounds 7] [--piece 0]

Run it with another tree first on PYTHONPATH to compare trees (a tree whose decoder has no
`feed_frames` is measured with the relay path it had: its own SSE parser and `feed_item`).

`--callgrind` gives instructions a chunk instead, which the machine's load does not move: each
path runs under valgrind's callgrind `--repeat` times and once with none, and the difference is
divided by the chunks (needs valgrind).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import msgspec

from svir.wire.decoder import StreamDecoder
from svir.wire.encoder import ChunkEncoder
from svir.wire.events import ContentFilter, Keepalive, Role, StreamError
from svir.wire.sse import SSEEvent, SSEParser, encode_data

PIECE = 4096
_SILENT = (Role, Keepalive, ContentFilter)


def make_stream(n: int) -> bytes:
    enc = msgspec.json.encode
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + enc({**head, "choices": [choice]}) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": f" word{i % 97}"}) for i in range(n)]
    out.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": n + 12}
    out.append(b"data: " + enc({**head, "choices": [], "usage": usage}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def pieces(raw: bytes, size: int = PIECE) -> list[bytes]:
    """The stream as reads of `size` bytes; 0: a read per event (a server that writes each chunk
    as it is made, and a client that keeps up)."""
    if size == 0:
        return [event + b"\n\n" for event in raw.split(b"\n\n") if event]
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def floor(parts: list[bytes]) -> int:
    """Each event's JSON decoded and encoded again by msgspec, nothing else (framing by split)."""
    decode, encode = msgspec.json.decode, msgspec.json.encode
    raw = b"".join(parts)
    n = 0
    for event in raw.split(b"\n\n"):
        data = event[6:]
        if data and data != b"[DONE]":
            n += len(encode(decode(data)))
    return n


def normalize(parts: list[bytes], *, think_tags: bool = False) -> int:
    decoder = StreamDecoder(think_tags=think_tags, clock=time.perf_counter)
    encoder = ChunkEncoder(id="chatcmpl-x", model="m", created=1, include_usage=True)
    encode = encoder.encode
    n = 0
    for part in parts:
        n += len(b"".join([encode(ev) for ev in decoder.feed(part)]))
    return n


def relay(parts: list[bytes]) -> int:
    decoder = StreamDecoder(clock=time.perf_counter)
    n = 0
    feed_frames = getattr(decoder, "feed_frames", None)
    if feed_frames is not None:
        for part in parts:
            frames, _ = feed_frames(part, True)
            n += len(b"".join(frames))
        return n
    # The relay path before `feed_frames` (svir.chat's `_relay_feed`, include_usage on).
    parser = SSEParser()
    for part in parts:
        frames: list[bytes] = []
        for item in parser.feed(part):
            got = decoder.feed_item(item)
            if type(item) is not SSEEvent or (got and isinstance(got[-1], StreamError)):
                continue
            frames.append(encode_data(item.data))
        n += len(b"".join(frames))
    return n


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


PATHS: dict[str, Callable[[list[bytes]], int]] = {
    "floor (msgspec decode + encode)": floor,
    "normalize": normalize,
    # What a local server's route runs (think_tags is on by default for llama.cpp, LM Studio,
    # vLLM, mlx, Ollama and openai-compatible servers).
    "normalize, think tags split": functools.partial(normalize, think_tags=True),
    "relay": relay,
}


def instructions(path: str, chunks: int, repeat: int, piece: int) -> int:
    """User-space instructions of a process that runs `path` `repeat` times (callgrind)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        argv += [sys.executable, "-m", "bench.per_chunk", "--run", path]
        argv += ["--chunks", str(chunks), "--repeat", str(repeat), "--piece", str(piece)]
        subprocess.run(argv, check=True, capture_output=True)
        text = open(out, errors="replace").read()  # noqa: SIM115
    found = re.search(r"^(?:totals|summary):\s+(\d+)", text, re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--callgrind", action="store_true", help="instructions a chunk instead")
    ap.add_argument("--repeat", type=int, default=20, help="runs of each path under callgrind")
    ap.add_argument("--piece", type=int, default=PIECE, help="bytes a read; 0: a read per event")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one path, --repeat times (callgrind's)
    args = ap.parse_args()
    parts = pieces(make_stream(args.chunks), args.piece)
    reads = f"{len(parts)} reads of " + (f"{args.piece} bytes" if args.piece else "one event")
    n = args.chunks + 3
    if args.run is not None:
        for _ in range(args.repeat):
            PATHS[args.run](parts)
        return
    if args.callgrind:
        counts = {
            name: (
                instructions(name, args.chunks, args.repeat, args.piece)
                - instructions(name, args.chunks, 0, args.piece)
            )
            / (args.repeat * n)
            for name in PATHS
        }
        base = counts["floor (msgspec decode + encode)"]
        print(f"{args.chunks} chunks in {reads}, callgrind:")
        print("| path | instructions a chunk | vs the floor |")
        print("|---|---|---|")
        for name, count in counts.items():
            print(f"| {name} | {count:,.0f} | {count / base:.2f}x |")
        return
    paths = PATHS
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            times[name].append(timed(lambda fn=fn: fn(parts)) / n * 1e6)
    base = min(times["floor (msgspec decode + encode)"])
    print(f"{args.chunks} chunks in {reads}, {args.rounds} rounds:")
    print("| path | µs a chunk, best / median | best vs the floor |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.3f} / {statistics.median(ts):.3f} | {min(ts) / base:.2f}x |")


if __name__ == "__main__":
    main()
