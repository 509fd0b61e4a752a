"""A scripted embeddings upstream (a `tests.support.mock_transport` handler): OpenAI-compatible `/v1/embeddings`
(floats or base64, as asked) and Ollama's `/api/embed`, each vector a pure function of its input,
so that a test can say which vector belongs to which input. As in tests/support/upstream.py, the
model name is a behaviour: `down` answers 503, `flaky-N` answers 503 to its first N requests,
`no-usage` leaves the usage out, `short` answers one vector too few."""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import struct
from typing import Any

from tests.support.mock_server import MockServer
from tests.support.mock_transport import MockRequest, MockResponse

__all__ = ["DIMS", "Embedder", "vector_of"]

DIMS = 8


def vector_of(item: str | list[int], dims: int = DIMS) -> list[float]:
    """The vector the fake answers for one input: float32-exact values from its hash."""
    data = item.encode() if isinstance(item, str) else json.dumps(item).encode()
    digest = hashlib.sha256(data).digest()
    # Multiples of 1/256: exact in float32, so base64 and floats agree bit for bit.
    return [(digest[i % 32] - 128) / 256 for i in range(dims)]


def tokens_of(item: str | list[int]) -> int:
    return len(item) if isinstance(item, list) else len(item.split()) + 1


class Embedder:
    """The handler; `requests` counts the requests each model got."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self.requests: dict[str, int] = {}

    def __call__(self, request: MockRequest) -> MockResponse:
        if request.method == "GET":
            return MockResponse.json({"status": "ok"})  # /healthz, for the benchmark
        body: dict[str, Any] = request.json()
        model = str(body.get("model"))
        seen = self.requests[model] = self.requests.get(model, 0) + 1
        behaviour = model.rpartition("/")[2]
        if behaviour == "down" or (
            behaviour.startswith("flaky-") and seen <= int(behaviour.removeprefix("flaky-"))
        ):
            return MockResponse.json({"error": {"message": "overloaded"}}, status=503)
        inputs = body["input"]
        inputs = [inputs] if isinstance(inputs, str) else inputs
        vectors = [vector_of(item, self.dims) for item in inputs]
        if behaviour == "short":
            vectors = vectors[:-1]
        tokens = sum(tokens_of(item) for item in inputs)
        if request.path.endswith("/api/embed"):
            answer: dict[str, Any] = {
                "model": model,
                "embeddings": vectors,
                "total_duration": 1000,
                "load_duration": 10,
                "prompt_eval_count": tokens,
            }
            return MockResponse.json(answer)
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": _base64(v) if as_base64 else v,
            }
            for i, v in enumerate(vectors)
        ]
        answer = {"object": "list", "data": data, "model": model}
        if behaviour != "no-usage":
            answer["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return MockResponse.json(answer)


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def main(argv: list[str] | None = None) -> int:
    """The embeddings benchmark's upstream: the fake over HTTP on uvloop, keeping no records."""
    import uvloop

    parser = argparse.ArgumentParser(description="a fake embeddings upstream over HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--dims", type=int, default=768)
    args = parser.parse_args(argv)
    server = MockServer(Embedder(args.dims), host=args.host, port=args.port, record=False)
    print(f"fake embedder on {server.base_url} ({args.dims} dimensions)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(server.serve_forever())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
