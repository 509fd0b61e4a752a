"""Wire-core speed: svir's decode + normalize + re-encode against the OpenAI SDK's parse alone.

Both read the same bytes of an N-chunk stream (reasoning, answer, a tool call, usage) in 4 KiB
network-sized pieces, in one run, alternating, best and median of several rounds. Run:

    .venv/bin/python -m bench.decoder_roundtrip [--chunks 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable

import httpx
import msgspec
import openai

from svir.wire.decoder import StreamDecoder
from svir.wire.encoder import ChunkEncoder

PIECE = 4096


def make_stream(n: int, tools: bool = True) -> bytes:
    enc = msgspec.json.encode
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [
        b"data: "
        + enc(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": None},
                        "finish_reason": None,
                    }
                ],
            }
        )
        + b"\n\n"
    ]
    calls = n // 10 if tools else 1
    for i in range(n - calls - 3):
        key = "reasoning_content" if i < n // 4 else "content"
        delta = {key: f" word{i % 97}"}
        out.append(
            b"data: "
            + enc({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            + b"\n\n"
        )
    if not tools:
        out.append(
            b"data: "
            + enc(
                {
                    **head,
                    "choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": None}],
                }
            )
            + b"\n\n"
        )
        out.append(
            b"data: "
            + enc({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            + b"\n\n"
        )
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": ""},
    }
    out.append(
        b"data: "
        + enc(
            {
                **head,
                "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}],
            }
        )
        + b"\n\n"
    )
    for i in range(calls - 1):
        piece = {"index": 0, "function": {"arguments": f'"k{i}":{i},'}}
        out.append(
            b"data: "
            + enc(
                {
                    **head,
                    "choices": [
                        {"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}
                    ],
                }
            )
            + b"\n\n"
        )
    out.append(
        b"data: "
        + enc({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        + b"\n\n"
    )
    out.append(
        b"data: "
        + enc(
            {
                **head,
                "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10},
            }
        )
        + b"\n\n"
    )
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def pieces(raw: bytes) -> list[bytes]:
    return [raw[i : i + PIECE] for i in range(0, len(raw), PIECE)]


def svir_roundtrip(parts: list[bytes]) -> int:
    dec = StreamDecoder(tool_names=["lookup"])
    enc = ChunkEncoder(id="chatcmpl-svir", model="p/m", created=1, include_usage=True)
    written = 0
    for part in parts:
        for ev in dec.feed(part):
            written += len(enc.encode(ev))
    for ev in dec.close():
        written += len(enc.encode(ev))
    return written


def sdk_parse(raw: bytes) -> Callable[[], int]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=iter(pieces(raw)), headers={"content-type": "text/event-stream"}
        )

    client = openai.OpenAI(
        api_key="k",
        base_url="http://bench.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )

    def run() -> int:
        stream = client.chat.completions.create(model="m", messages=[], stream=True)  # type: ignore[call-overload]
        return sum(1 for _ in stream)

    return run


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def peak_memory(n: int) -> int:
    # Text only: a tool call's arguments must be kept whole, so they grow with the stream by nature.
    parts = pieces(make_stream(n, tools=False))
    tracemalloc.start()
    svir_roundtrip(parts)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    raw = make_stream(args.chunks)
    parts = pieces(raw)
    sdk = sdk_parse(raw)
    assert sdk() == args.chunks, "the SDK must see every chunk"
    svir_times, sdk_times = [], []
    for _ in range(args.rounds):
        svir_times.append(timed(lambda: svir_roundtrip(parts)))
        sdk_times.append(timed(sdk))
    n = args.chunks
    for name, times in (
        ("svir decode+normalize+encode", svir_times),
        ("OpenAI SDK parse", sdk_times),
    ):
        print(
            f"{name:32s} best {n / min(times):>11,.0f} chunks/s  median {n / statistics.median(times):>11,.0f} chunks/s"
        )
    print(
        f"ratio (best, median): {min(sdk_times) / min(svir_times):.1f}x, "
        f"{statistics.median(sdk_times) / statistics.median(svir_times):.1f}x"
    )
    small, large = peak_memory(n // 10), peak_memory(n * 10)
    print(
        f"svir peak traced memory: {small / 1024:.0f} KiB at {n // 10:,} chunks, "
        f"{large / 1024:.0f} KiB at {n * 10:,} chunks"
    )


if __name__ == "__main__":
    main()
