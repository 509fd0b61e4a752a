"""The scripted upstream of svir's tests and benchmarks: one mock-upstream handler whose model
names are behaviours, used in process (`MockTransport(ScriptedUpstream())`) and over loopback
HTTP (`MockServerThread(ScriptedUpstream())`, or `python -m tests.support.upstream` for the
bench). The handler API and the HTTP server are tests/support/mock_transport.py and mock_server.py; this table is the
tests' own (it plays the conformance corpus and the reference error bodies in tests/), so it
lives here.

A chat request's model (or Azure deployment) picks what is answered:

- a corpus name (`tests/conformance/decoder/NAME.sse`, or a key of `streams=`): its exact bytes
  as an event stream, in the writes `split` and `pieces` make, `delay` / `piece_delay` apart.
- `status-<code>-<name>`: that status with `tests/support/bodies/<name>.json` (a 429 also
  carries `Retry-After: retry_after`). `not-a-stream`: 200 `application/json` `{"ok":true}`.
- `slow-drip`: "tick I " chunks `drip` seconds apart, forever (or `drip_count`, then a finish).
- `stall-first-byte`: no answer, ever. `stall-mid`: headers and one chunk, then nothing.
  `stall-401`: 401 headers with a Content-Length, and no body. (They hold until the client
  closes.)
- `ok`: "hello world". `slow`: `ok`, chunks `slow_delay` apart. `flaky-N`: 503 for the first N
  requests, then `ok`. `always-503`. `limited`: 429 with Retry-After once, then `ok`.
- `reset-early` / `reset-late`: the role chunk (and one text chunk), then the connection cut.
  `parse-fail-late` / `crash-late`: one text chunk, then llama.cpp's error chunk for a tool call
  its parser could not read / a 500 error chunk.
- `effort`: vLLM's 400 for `reasoning_effort: "high"`, else `ok`. `no-stream-options`: 422 when
  `stream_options` is sent, else `ok`. `overflow`: 400 context_length_exceeded. `filtered`:
  Azure's 400 content_filter. `missing`: vLLM's 404 for a model it does not have. `rejected`:
  llama.cpp's 400 for a bad field.
- `tok-N`: N chunks of one token each ("w0 ", "w1 ", ...), a finish and usage (PROMPT_TOKENS in,
  N out); `-nousage` without the usage, `-slow` `slow_delay` apart, `-split` the role, a pause,
  then all N in one write.
- `echo-401` / `echo-400` / `echo-503`: that status, quoting the request's credential back in
  the message; `echo-stream`: one chunk, then an error chunk quoting it; `echo-fields-400` /
  `echo-fields-stream`: the credential in the error's code, param, type (and innererror);
  `echo-bearer-400`: a message holding `Bearer <key>` and someone else's bearer token.
- `silent-<name>`: nothing at all until `wait("silence")` returns (by default after `silence`
  seconds: a long prompt being read), then `<name>`'s answer. `prefill-<name>`: mlx-lm's prompt
  progress comments (`PREFILL`, as `mlx-lm.sse` has them: `: keepalive 0/512` ...) after the
  head, each once `wait` returns (`"silence"` before the first, the previous comment's text,
  e.g. `"keepalive 0/512"`, before each next), then `<name>`'s answer after the last one's.
- `json`: a `chat.completion` (the same answer as a short stream when the request streams, as
  svir always does); `stream-N`: N chunks of an answer's words, a finish and usage; `drip-N`:
  the same, `drip` seconds apart (N = 20 by default). These are the bench's.

A text completion (a POST to a path ending in `/completions` other than `/chat/completions`, as
OpenAI-compatible servers serve `/v1/completions`) knows one behaviour, the bench's: `stream-N`
answers the same N words as `text_completion` chunks, a finish chunk, a usage chunk and `[DONE]`,
as vLLM streams them; any other name is 404.

A name it does not know gets `fallback`'s behaviour, or 404 `{"error":{"message":"model not
found"}}`. `GET .../models` lists `models`; `GET /health` and `/healthz` are 200. Counts per
model name are in `hits`; the requests themselves are in the transport's or server's records.
Options are attributes read on every request, so a test may change them between requests;
`wait`, given, replaces the silent behaviours' clock with the test's own condition.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import itertools
import json
import re
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any

from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.mock_server import MockServer, MockServerThread
from tests.support.mock_transport import MockRequest, MockResponse, sse

__all__ = [
    "BODIES_DIR",
    "CHUNK_ID",
    "CORPUS_DIR",
    "CRASH",
    "FOREIGN_TOKEN",
    "LLAMA_CPP_MODELS",
    "OK_TEXTS",
    "PARSE_FAILURE",
    "PREFILL",
    "PROMPT_TOKENS",
    "VLLM_MODELS",
    "ScriptedServer",
    "ScriptedUpstream",
    "chunk",
    "corpus_names",
    "plan_chunks",
    "split_events",
    "split_lines",
    "split_pieces",
    "status_model",
    "text_chunk",
    "token_stream",
]

CORPUS_DIR = Path(__file__).resolve().parents[1] / "conformance" / "decoder"
BODIES_DIR = Path(__file__).resolve().parent / "bodies"

CHUNK_ID = "chatcmpl-fake"
TEXT_CHUNK_ID = "cmpl-fake"
CREATED = 1700000000
PROMPT_TOKENS = 7  # tok-N's
BENCH_PROMPT_TOKENS = 12  # json's and stream-N's
BENCH_ANSWER = "Hello! This is a fake answer from the bench upstream, a few words long."
BENCH_ANSWER_TOKENS = 16
DRIP_DEFAULT = 20
# A bearer token svir never had (someone else's, in an upstream's words): redacted by its shape.
FOREIGN_TOKEN = "tok3n-0f-an0ther-server-9a8b"

# llama.cpp's error chunk when its chat parser cannot read the tool call the model wrote (§3.5).
PARSE_FAILURE = (
    b'data: {"error":{"code":500,"message":"Failed to parse input at pos 7: <tool_call>{\\"na",'
    b'"type":"server_error"}}\n\n'
)
CRASH = b'data: {"error":{"code":500,"message":"CUDA error: an illegal memory access","type":"server_error"}}\n\n'
DONE = b"data: [DONE]\n\n"
# mlx-lm's keep-alives while it reads the prompt, before its first chunk (tests/conformance/
# decoder/mlx-lm.sse; wire reference §3.1).
PREFILL = (b": keepalive 0/512\n\n", b": keepalive 256/512\n\n", b": keepalive 512/512\n\n")

NOT_FOUND_BODY = b'{"error":{"message":"model not found"}}'
JSON = {"Content-Type": "application/json"}
SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
BENCH_SSE = {**SSE, "x-request-id": "fake-upstream"}
BENCH_JSON = {**JSON, "x-request-id": "fake-upstream"}

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_STATUS_RE = re.compile(r"status-(\d{3})-([A-Za-z0-9][A-Za-z0-9._-]*)")
_TOK_RE = re.compile(r"tok-(\d+)((?:-nousage|-slow|-split)*)")
_BENCH_RE = re.compile(r"(stream|drip)(?:-(\d{1,6}))?")
_LINE_RE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_BLANK_LINES = (b"\n", b"\r", b"\r\n")
_WORDS = [" " + w for w in BENCH_ANSWER.rstrip(".").split(" ")]

Split = str | int | Sequence[int] | Callable[[bytes], Iterable[bytes]]

VLLM_MODELS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "qwen3.8",
            "object": "model",
            "created": 1790000000,
            "owned_by": "vllm",
            "root": "/models/Qwen3.8-27B-MLX-4bit",
            "parent": None,
            "max_model_len": 262144,
            "permission": [{"id": "modelperm-1", "allow_sampling": True}],
        },
        {
            "id": "bge-m3-embed",
            "object": "model",
            "created": 1790000000,
            "owned_by": "vllm",
            "root": "/models/bge-m3",
            "parent": None,
            "max_model_len": 8192,
            "permission": [{"id": "modelperm-2", "allow_sampling": True}],
        },
    ],
}

_LLAMA_PATH = "/models/muse-glimmer-30b-q4_k_m.gguf"
LLAMA_CPP_MODELS: dict[str, Any] = {
    "models": [
        {
            "name": _LLAMA_PATH,
            "model": _LLAMA_PATH,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion", "multimodal"],
            "parameters": "",
            "details": {"format": "gguf", "family": "", "families": [""]},
        }
    ],
    "object": "list",
    "data": [
        {
            "id": _LLAMA_PATH,
            "object": "model",
            "created": 1790000000,
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": 151936,
                "n_ctx_train": 262144,
                "n_ctx": 16384,
                "n_embd": 2048,
                "n_params": 30532122624,
                "size": 18556686336,
            },
            "architecture": {"input_modalities": ["text", "image"]},
        }
    ],
}

# llama.cpp's `GET /props` for the model above, as a real llama-server answers it (trimmed).
LLAMA_CPP_PROPS: dict[str, Any] = {
    "default_generation_settings": {"n_ctx": 16384, "params": {"n_predict": -1}},
    "total_slots": 1,
    "model_alias": _LLAMA_PATH,
    "model_path": _LLAMA_PATH,
    "model_ftype": "Q4_K - Medium",
    "modalities": {"vision": True, "video": False, "audio": False},
    "chat_template": "{%- for message in messages %}<think>{{ message.content }}{%- endfor %}",
    "chat_template_caps": {"supports_tools": True, "supports_tool_calls": True},
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "build_info": "b7000-recorded",
}


# Chunking


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their ends (LF, CRLF or CR); an unterminated tail is the last piece."""
    return _LINE_RE.findall(data)


def split_events(data: bytes) -> list[bytes]:
    """SSE events, each with its lines and the blank line that ends it; a tail that is not
    ended by a blank line (a truncated stream) is the last piece."""
    events: list[bytes] = []
    current: list[bytes] = []
    for line in split_lines(data):
        current.append(line)
        if line in _BLANK_LINES:
            events.append(b"".join(current))
            current = []
    if current:
        events.append(b"".join(current))
    return events


def split_pieces(chunk: bytes, pieces: int) -> list[bytes]:
    """`chunk` in `pieces` nearly equal parts (fewer when it is shorter), cut anywhere, inside a
    UTF-8 character too."""
    if pieces <= 1 or len(chunk) <= 1:
        return [chunk] if chunk else []
    pieces = min(pieces, len(chunk))
    size, extra = divmod(len(chunk), pieces)
    out, start = [], 0
    for i in range(pieces):
        end = start + size + (1 if i < extra else 0)
        out.append(chunk[start:end])
        start = end
    return out


def plan_chunks(data: bytes, split: Split = "event", pieces: int = 1) -> list[bytes]:
    """The writes that carry `data`; they always join back to exactly `data`.

    `split` is "event" (one SSE event per write), "line", "whole" (one write), an int (writes of
    that many bytes), a sequence of byte offsets to cut at, or a callable returning the pieces.
    `pieces` then cuts each of those into that many writes.
    """
    chunks: list[bytes]
    if callable(split):
        chunks = [bytes(c) for c in split(data)]
    elif split == "event":
        chunks = split_events(data)
    elif split == "line":
        chunks = split_lines(data)
    elif split == "whole":
        chunks = [data]
    elif isinstance(split, int) and not isinstance(split, bool):
        if split < 1:
            raise ValueError("split size must be at least 1")
        chunks = [data[i : i + split] for i in range(0, len(data), split)]
    elif isinstance(split, Sequence) and not isinstance(split, str | bytes):
        cuts = sorted({0, len(data), *(min(max(int(c), 0), len(data)) for c in split)})
        chunks = [data[a:b] for a, b in itertools.pairwise(cuts)]
    else:
        raise ValueError(f"unknown split {split!r}")
    out = [piece for chunk in chunks for piece in split_pieces(chunk, pieces)]
    if b"".join(out) != data:
        raise ValueError("split does not preserve the stream's bytes")
    return out


def corpus_names(corpus: Path = CORPUS_DIR) -> list[str]:
    """The names of the corpus streams, as models to request."""
    return sorted(p.stem for p in corpus.glob("*.sse"))


def status_model(body_name: str) -> str:
    """The model that returns a body with the status its name ends in:
    "vllm-overflow-400" -> "status-400-vllm-overflow-400"."""
    match = re.search(r"-(\d{3})$", body_name)
    if match is None:
        raise ValueError(f"{body_name!r} does not end in a status code")
    return f"status-{match[1]}-{body_name}"


# Streams


def chunk(model: str, delta: Mapping[str, Any], finish: str | None = None) -> bytes:
    """A `chat.completion.chunk` frame with one choice."""
    return sse(
        {
            "id": CHUNK_ID,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )[0]


def usage_chunk(model: str, prompt: int, completion: int) -> bytes:
    return sse(
        {
            "id": CHUNK_ID,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )[0]


def token_stream(
    model: str,
    texts: Sequence[str],
    *,
    usage: tuple[int, int] | None = None,
    role_alone: bool = True,
) -> list[bytes]:
    """The frames of a streamed answer: the role (alone, or with the first text), a chunk per
    text, a `stop` finish, the usage (prompt, completion tokens) if given, `[DONE]`."""
    out = [chunk(model, {"role": "assistant"})] if role_alone else []
    for i, text in enumerate(texts):
        delta = {"role": "assistant", "content": text} if i == 0 and not role_alone else None
        out.append(chunk(model, delta or {"content": text}))
    out.append(chunk(model, {}, "stop"))
    if usage is not None:
        out.append(usage_chunk(model, *usage))
    out.append(DONE)
    return out


async def paced(frames: Iterable[bytes], interval: float) -> AsyncIterator[bytes]:
    """`frames`, `interval` seconds apart."""
    for i, frame in enumerate(frames):
        if i and interval > 0:
            await asyncio.sleep(interval)
        yield frame


async def broken(frames: Iterable[bytes]) -> AsyncIterator[bytes]:
    """`frames`, then the connection cut (in process: the upstream client's error for it)."""
    for frame in frames:
        yield frame
    raise UpstreamError(ErrorKind.INCOMPLETE, "upstream connection broke", in_stream=True)


async def stalled(frames: Iterable[bytes] = ()) -> AsyncIterator[bytes]:
    """`frames`, then nothing, until the client goes."""
    for frame in frames:
        yield frame
    await asyncio.Event().wait()


async def _after_pause(first: bytes, pause: float, rest: list[bytes]) -> AsyncIterator[bytes]:
    yield first
    await asyncio.sleep(pause)
    for frame in rest:
        yield frame


async def _stall() -> MockResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def error(status: int, body: Any, headers: Mapping[str, str] | None = None) -> MockResponse:
    return MockResponse.json(body, status, headers)


def _bench_completion(model: str) -> bytes:
    return json.dumps(
        {
            "id": CHUNK_ID,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": BENCH_ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": BENCH_PROMPT_TOKENS,
                "completion_tokens": BENCH_ANSWER_TOKENS,
                "total_tokens": BENCH_PROMPT_TOKENS + BENCH_ANSWER_TOKENS,
            },
        },
        separators=(",", ":"),
    ).encode()


def _bench_stream(model: str, count: int | None) -> tuple[bytes, ...]:
    """`json`'s stream (count None), or `stream-N`'s frames."""
    if count is None:
        texts, tokens = [BENCH_ANSWER], BENCH_ANSWER_TOKENS
    else:
        texts, tokens = [_WORDS[i % len(_WORDS)] for i in range(count)], count
    usage = (BENCH_PROMPT_TOKENS, tokens)
    return tuple(token_stream(model, texts, usage=usage, role_alone=False))


@functools.lru_cache(maxsize=64)
def _bench_answer(name: str) -> MockResponse | None:
    """`stream-N`'s answer, or `drip-N`'s frames (its headers say which); None for another name."""
    match = _BENCH_RE.fullmatch(name)
    if match is None:
        return None
    frames = _bench_stream(name, int(match[2]) if match[2] is not None else DRIP_DEFAULT)
    return MockResponse(body=frames, headers=BENCH_SSE if match[1] == "stream" else SSE)


def text_chunk(
    model: str, text: str, finish: str | None = None, usage: dict[str, int] | None = None
) -> bytes:
    """A `text_completion` stream frame as vLLM's `/v1/completions` sends it: one choice, or with
    `usage` the usage chunk (no choices)."""
    chunk: dict[str, Any] = {
        "id": TEXT_CHUNK_ID,
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["choices"] = []
        chunk["usage"] = usage
    return sse(chunk)[0]


@functools.lru_cache(maxsize=64)
def _bench_text_answer(name: str) -> MockResponse | None:
    """`stream-N` on a completions path: `stream-N`'s words as `text_completion` chunks, a finish
    chunk, usage in a chunk of its own (no choices) and `[DONE]`; None for another name."""
    match = _BENCH_RE.fullmatch(name)
    if match is None or match[1] != "stream":
        return None
    count = int(match[2]) if match[2] is not None else DRIP_DEFAULT
    frames = [text_chunk(name, _WORDS[i % len(_WORDS)]) for i in range(count)]
    frames.append(text_chunk(name, "", "stop"))
    usage = {
        "prompt_tokens": BENCH_PROMPT_TOKENS,
        "completion_tokens": count,
        "total_tokens": BENCH_PROMPT_TOKENS + count,
    }
    frames.append(text_chunk(name, "", usage=usage))
    frames.append(DONE)
    return MockResponse(body=tuple(frames), headers=BENCH_SSE)


BENCH_COMPLETION = MockResponse(body=_bench_completion("json"), headers=BENCH_JSON)
BENCH_JSON_STREAM = MockResponse(body=_bench_stream("json", None), headers=BENCH_SSE)
NOT_FOUND = MockResponse(404, NOT_FOUND_BODY, JSON)
OK_TEXTS = ("hello", " world")


class ScriptedUpstream:
    """The handler (see the module's docstring for the behaviours and options)."""

    def __init__(
        self,
        *,
        split: Split = "event",
        pieces: int = 1,
        delay: float = 0.0,
        piece_delay: float = 0.0,
        drip: float = 0.05,
        drip_count: int | None = None,
        slow_delay: float = 0.05,
        retry_after: str | None = "2",
        models: str | Sequence[str] | Mapping[str, Any] = "vllm",
        streams: Mapping[str, bytes | str] | None = None,
        fallback: str | None = None,
        corpus: Path | str = CORPUS_DIR,
        bodies: Path | str = BODIES_DIR,
        silence: float = 0.05,
        wait: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.split = split
        self.pieces = pieces
        self.delay = delay
        self.piece_delay = piece_delay
        self.drip = drip
        self.drip_count = drip_count
        self.slow_delay = slow_delay
        self.retry_after = retry_after
        self.models = models
        self.streams: dict[str, bytes] = {
            k: v.encode() if isinstance(v, str) else bytes(v) for k, v in (streams or {}).items()
        }
        self.fallback = fallback
        self.corpus = Path(corpus)
        self.bodies = Path(bodies)
        self.silence = silence
        self.wait = wait or self._silence
        self.hits: collections.Counter[str] = collections.Counter()

    def __call__(self, request: MockRequest) -> MockResponse | Awaitable[MockResponse]:
        path = request.path
        if request.method == "GET":
            if path.endswith("/models"):
                return MockResponse.json(self.model_list())
            if path in ("/health", "/healthz"):
                return MockResponse.json({"status": "ok"})
            if path == "/props" and self.model_list() is LLAMA_CPP_MODELS:
                return MockResponse.json(LLAMA_CPP_PROPS)
            return NOT_FOUND
        if request.method != "POST":
            return NOT_FOUND
        if not path.endswith("/chat/completions"):
            return self.text_completion(request) if path.endswith("/completions") else NOT_FOUND
        name = request.model
        if name is None:
            return NOT_FOUND
        self.hits[name] += 1
        answer = self.chat(request, name, self.hits[name])
        if answer is None and self.fallback is not None:
            answer = self.chat(request, self.fallback, self.hits[name])
        return NOT_FOUND if answer is None else answer

    def chat(
        self, request: MockRequest, name: str, n: int
    ) -> MockResponse | Awaitable[MockResponse] | None:
        """What `name` answers to its `n`-th request; None for a name with no behaviour."""
        # The bench's first: they must cost the least (answers built once, no per-request JSON).
        if name == "json":
            return BENCH_JSON_STREAM if request.json().get("stream") is True else BENCH_COMPLETION
        bench = _bench_answer(name)
        if bench is not None:
            if bench.headers is BENCH_SSE:
                return bench
            return MockResponse(body=paced(bench.body, self.drip), headers=BENCH_SSE)  # type: ignore[arg-type]
        # A server that reads a long prompt (or loads a model) first.
        if name.startswith("silent-"):
            return self._silent(request, name[7:], n)
        if name.startswith("prefill-"):
            return self._prefilled(request, name[8:], n)
        # The faults of the policy tests.
        ok = MockResponse(body=token_stream(name, OK_TEXTS), headers=SSE)
        if name == "ok":
            return ok
        if name == "slow":
            return MockResponse(body=paced(token_stream(name, OK_TEXTS), self.slow_delay))
        if name.startswith("flaky-") and name[6:].isdigit():
            overloaded = error(503, {"error": {"message": "overloaded"}})
            return overloaded if n <= int(name[6:]) else ok
        if name == "always-503":
            return error(503, {"error": {"message": "down"}})
        if name == "limited":
            if n > 1:
                return ok
            retry = {"Retry-After": self.retry_after} if self.retry_after is not None else None
            return error(429, {"error": {"message": "slow down"}}, retry)
        if name == "reset-early":
            return MockResponse(body=broken(token_stream(name, [])[:1]), headers=SSE)
        if name == "reset-late":
            return MockResponse(body=broken(token_stream(name, ["partial"])[:2]), headers=SSE)
        if name == "parse-fail-late":
            return MockResponse(body=[*token_stream(name, ["partial"])[:2], PARSE_FAILURE])
        if name == "crash-late":
            return MockResponse(body=[*token_stream(name, ["partial"])[:2], CRASH])
        if name == "effort":
            if request.json().get("reasoning_effort") != "high":
                return ok
            message = "Unexpected reasoning effort high. Supported types are xhigh (default), medium, and low."
            return error(
                400, {"error": {"message": message, "type": "BadRequestError", "code": 400}}
            )
        if name == "no-stream-options":
            if "stream_options" not in request.json():
                return ok
            loc = ["body", "stream_options"]
            detail = [
                {"type": "extra_forbidden", "loc": loc, "msg": "Extra inputs are not permitted"}
            ]
            return error(422, {"detail": detail})
        if name == "overflow":
            message = "This model's maximum context length is 8 tokens"
            return error(400, {"error": {"message": message, "code": "context_length_exceeded"}})
        if name == "missing":
            return error(
                404,
                {
                    "object": "error",
                    "message": "The model `missing` does not exist.",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                },
            )
        if name == "rejected":
            message = "Invalid tool_choice: bogus"
            return error(
                400, {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
            )
        if name == "filtered":
            inner = {"content_filter_result": {"hate": {"filtered": True, "severity": "high"}}}
            return error(
                400,
                {"error": {"message": "filtered", "code": "content_filter", "innererror": inner}},
            )
        # The keys tests' token streams and credential echoes.
        tok = _TOK_RE.fullmatch(name)
        if tok is not None:
            return self._tokens(name, int(tok[1]), tok[2].split("-")[1:], sum(self.hits.values()))
        if name.startswith("echo-"):
            return self._echo(request, name)
        # The model servers that cannot run here: the corpus, reference errors, stalls.
        if name == "not-a-stream":
            return MockResponse(200, b'{"ok":true}', JSON)
        if name == "slow-drip":
            return MockResponse(body=paced(self._ticks(name), self.drip), headers=SSE)
        if name == "stall-first-byte":
            return _stall()
        if name == "stall-mid":
            hello = chunk(name, {"role": "assistant", "content": "Hello"})
            return MockResponse(body=stalled([hello]), headers=SSE)
        if name == "stall-401":
            body = (self.bodies / "auth-401.json").read_bytes()
            headers = {**JSON, "Content-Length": str(len(body))}
            return MockResponse(401, stalled(), headers)
        status = _STATUS_RE.fullmatch(name)
        if status is not None:
            path = self.bodies / f"{status[2]}.json"
            if not path.is_file():
                return None
            code = int(status[1])
            headers = JSON
            if code == 429 and self.retry_after is not None:
                headers = {**JSON, "Retry-After": self.retry_after}
            return MockResponse(code, path.read_bytes(), headers)
        data = self._stream(name)
        if data is None:
            return None
        return MockResponse(body=self._play(data), headers=SSE)

    def text_completion(self, request: MockRequest) -> MockResponse:
        """The answer on a text-completion path: the bench's `stream-N` (see the module doc)."""
        name = request.model
        if name is None:
            return NOT_FOUND
        self.hits[name] += 1
        return _bench_text_answer(name) or NOT_FOUND

    async def _silence(self, _stage: str) -> None:
        await asyncio.sleep(self.silence)

    async def _answer(self, request: MockRequest, name: str, n: int) -> MockResponse:
        answer = self.chat(request, name, n)
        if answer is None:
            return NOT_FOUND
        return answer if isinstance(answer, MockResponse) else await answer

    async def _silent(self, request: MockRequest, rest: str, n: int) -> MockResponse:
        await self.wait("silence")
        return await self._answer(request, rest, n)

    async def _prefilled(self, request: MockRequest, rest: str, n: int) -> MockResponse:
        head = await self._answer(request, rest, n)
        if head.status != 200:
            return head

        async def body() -> AsyncIterator[bytes]:
            # The head at once, as mlx-lm sends it; each comment once the last was taken in.
            stage = "silence"
            for comment in PREFILL:
                await self.wait(stage)
                yield comment
                stage = comment[2:].strip().decode()
            await self.wait(stage)
            answer = head.body
            if isinstance(answer, bytes):
                yield answer
            elif isinstance(answer, AsyncIterable):
                async for piece in answer:
                    yield piece
            else:
                for piece in answer:
                    yield piece

        return MockResponse(body=body(), headers=SSE)

    def _tokens(self, name: str, n: int, variants: list[str], served: int) -> MockResponse:
        texts = [f"w{i} " for i in range(n)]
        usage = None if "nousage" in variants else (PROMPT_TOKENS, n)
        frames = token_stream(name, texts, usage=usage)
        headers = {**SSE, "x-request-id": f"up-{served}"}
        if "split" in variants:
            # The role alone first, a pause, then the whole answer in one write.
            whole = [b"".join(frames[1 : n + 1]), *frames[n + 1 :]]
            return MockResponse(
                body=_after_pause(frames[0], self.slow_delay, whole), headers=headers
            )
        if "slow" in variants:
            return MockResponse(body=paced(frames, self.slow_delay), headers=headers)
        return MockResponse(body=frames, headers=headers)

    def _echo(self, request: MockRequest, name: str) -> MockResponse | None:
        credential = (request.headers.get("Authorization") or "").removeprefix("Bearer ")
        if name == "echo-fields-400":
            inner = {
                "code": credential,
                "content_filter_result": {"hate": {"filtered": True, "note": [credential]}},
            }
            fields = {"code": credential, "param": credential, "type": credential}
            message = "the request was refused"
            return error(400, {"error": {"message": message, **fields, "innererror": inner}})
        if name == "echo-bearer-400":
            message = (
                "send it as 'Authorization: Bearer <key>'; this one came with"
                f" 'Authorization: Bearer {FOREIGN_TOKEN}'"
            )
            return error(400, {"error": {"message": message}})
        if name in ("echo-401", "echo-400", "echo-503"):
            message = f"credential {credential} refused by the fake server"
            return error(int(name[-3:]), {"error": {"message": message}})
        if name == "echo-stream":
            message = f"generation died; credential was {credential}"
            failure = {"error": {"message": message, "type": "server_error"}}
        elif name == "echo-fields-stream":
            fields = {"code": credential, "param": credential, "type": credential}
            failure = {"error": {"message": "generation died", **fields}}
        else:
            return None
        frames = [*token_stream(name, ["partial"])[:2], *sse(failure)]
        return MockResponse(body=frames, headers=SSE)

    def _ticks(self, name: str) -> Iterable[bytes]:
        """slow-drip's frames: ticks, forever or `drip_count` of them, then the end."""
        count = self.drip_count
        for i in itertools.count() if count is None else range(count):
            text = f"tick {i} "
            yield chunk(
                name, {"role": "assistant", "content": text} if i == 0 else {"content": text}
            )
        yield chunk(name, {}, "stop")
        yield DONE

    def _stream(self, name: str) -> bytes | None:
        if name in self.streams:
            return self.streams[name]
        if _NAME_RE.fullmatch(name) is None:
            return None
        path = self.corpus / f"{name}.sse"
        return path.read_bytes() if path.is_file() else None

    async def _play(self, data: bytes) -> AsyncIterator[bytes]:
        for i, part in enumerate(plan_chunks(data, self.split)):
            if i and self.delay > 0:
                await asyncio.sleep(self.delay)
            for j, piece in enumerate(split_pieces(part, self.pieces)):
                if j and self.piece_delay > 0:
                    await asyncio.sleep(self.piece_delay)
                yield piece

    def model_list(self) -> Any:
        models = self.models
        if isinstance(models, Mapping):
            return models
        if models == "vllm":
            return VLLM_MODELS
        if models in ("llama.cpp", "llama-cpp", "llamacpp"):
            return LLAMA_CPP_MODELS
        ids = corpus_names(self.corpus) + sorted(self.streams) if models == "corpus" else models
        if isinstance(ids, str):
            raise ValueError(f"unknown models style {ids!r}")
        return {
            "object": "list",
            "data": [
                {"id": i, "object": "model", "created": 1790000000, "owned_by": "replay"}
                for i in ids
            ],
        }


# The script over loopback HTTP on a thread of its own: what the fixtures yield.
ScriptedServer = MockServerThread[ScriptedUpstream]


def main(argv: list[str] | None = None) -> int:
    """The bench's upstream: the script over HTTP on uvloop, keeping no records."""
    import uvloop

    parser = argparse.ArgumentParser(description="svir's scripted upstream over HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--drip-interval", type=float, default=0.05, help="seconds between drips")
    parser.add_argument(
        "--framing",
        choices=["chunked", "length"],
        default="chunked",
        help="how a stream written at once is framed (default: chunked)",
    )
    args = parser.parse_args(argv)
    script = ScriptedUpstream(
        drip=args.drip_interval, models=["json", "stream-20", "drip"], fallback="json"
    )
    server = MockServer(
        script, host=args.host, port=args.port, framing=args.framing, record=False, memo=True
    )
    print(f"scripted upstream on {server.base_url} ({args.framing})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(server.serve_forever())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
