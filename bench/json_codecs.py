"""msgspec against orjson on svir's JSON work: decoding a streamed chunk and a request, encoding
a canonical chunk and an upstream body. Alternating rounds in one process; the best of each.

    .venv/bin/python -m bench.json_codecs
"""

from __future__ import annotations

import json
import timeit

import msgspec
import orjson

CHUNK = json.dumps(
    {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "stream-20",
        "choices": [{"index": 0, "delta": {"content": " Hello"}, "finish_reason": None}],
    },
    separators=(",", ":"),
).encode()
REQUEST = json.dumps(
    {
        "model": "fake/stream-20",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello in a few words. " * 20},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
    }
).encode()


def main() -> int:
    chunk, request = json.loads(CHUNK), json.loads(REQUEST)
    cases = {
        "decode chunk": (lambda: msgspec.json.decode(CHUNK), lambda: orjson.loads(CHUNK)),
        "decode request": (lambda: msgspec.json.decode(REQUEST), lambda: orjson.loads(REQUEST)),
        "encode chunk": (lambda: msgspec.json.encode(chunk), lambda: orjson.dumps(chunk)),
        "encode request": (lambda: msgspec.json.encode(request), lambda: orjson.dumps(request)),
    }
    print("| operation | msgspec ns | orjson ns | msgspec / orjson time |")
    print("|---|---|---|---|")
    n = 200_000
    for name, (ms, oj) in cases.items():
        best = {"msgspec": float("inf"), "orjson": float("inf")}
        for _ in range(5):
            best["msgspec"] = min(best["msgspec"], timeit.timeit(ms, number=n) / n * 1e9)
            best["orjson"] = min(best["orjson"], timeit.timeit(oj, number=n) / n * 1e9)
        ratio = best["msgspec"] / best["orjson"]
        print(f"| {name} | {best['msgspec']:.0f} | {best['orjson']:.0f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
