"""A replay server: the model servers that cannot run here (LM Studio, mlx-lm, mlx-vlm, vLLM,
Azure OpenAI), emulated over real HTTP by playing the conformance corpus.

The request's `model` (or Azure deployment) picks what is played:

- a corpus name (`tests/conformance/decoder/NAME.sse`, or a key of `streams=`): 200
  `text/event-stream` with exactly the file's bytes, written in chunks (see `split`, `pieces`,
  `delay`, `piece_delay`). The `stream` field of the request is not consulted.
- `status-<code>-<name>`: that status with `tests/support/bodies/<name>.json` as the body
  (`application/json`); a 429 also carries `Retry-After` (`retry_after=`, default "2").
  `status_model("vllm-overflow-400")` builds the name from a body's trailing code.
- `not-a-stream`: 200 `application/json` `{"ok":true}`.
- `slow-drip`: one content chunk every `drip` seconds, forever (or `drip_count` chunks, then a
  `stop` finish and `[DONE]`), so a test can cancel mid-stream.
- `stall-first-byte`: the request is read, and no status line or header is ever sent.
- `stall-mid`: 200 `text/event-stream` headers and one chunk, then nothing.
- `stall-401`: 401 headers with a `Content-Length` for `bodies/auth-401.json`, and no body.

Anything else is 404 `{"error":{"message":"model not found"}}`. The stall modes hold the
connection until the client closes it or the server stops.

Every request (any route) is recorded in `server.requests` as a `RequestRecord`. A record's
`outcome` ends as "completed", "disconnected" (the client closed the connection before the server
had written the whole response), "shutdown" (the server stopped first) or "error". Disconnected
records are also appended to `server.disconnects`, and `server.disconnected` (a threading.Event)
is set.

Use `async with ReplayServer() as server:` in async tests, and
`with ReplayServerThread() as server:` (its own loop in a background thread) in sync ones.
Both expose `base_url` ("http://127.0.0.1:PORT/v1").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "BODIES_DIR",
    "CORPUS_DIR",
    "LLAMA_CPP_MODELS",
    "VLLM_MODELS",
    "ReplayServer",
    "ReplayServerThread",
    "RequestRecord",
    "corpus_names",
    "plan_chunks",
    "split_events",
    "split_lines",
    "split_pieces",
    "status_model",
]

CORPUS_DIR = Path(__file__).resolve().parents[1] / "conformance" / "decoder"
BODIES_DIR = Path(__file__).resolve().parent / "bodies"

NOT_A_STREAM = "not-a-stream"
SLOW_DRIP = "slow-drip"
STALL_FIRST_BYTE = "stall-first-byte"
STALL_MID = "stall-mid"
STALL_401 = "stall-401"

NOT_FOUND_BODY = b'{"error":{"message":"model not found"}}'
NOT_A_STREAM_BODY = b'{"ok":true}'

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_STATUS_RE = re.compile(r"status-(\d{3})-([A-Za-z0-9][A-Za-z0-9._-]*)")
_LINE_RE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_BLANK_LINES = (b"\n", b"\r", b"\r\n")

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


def _chunk_event(model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    chunk = {
        "id": f"chatcmpl-{model}",
        "object": "chat.completion.chunk",
        "created": 1790000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


# Records


@dataclass(eq=False)
class RequestRecord:
    """One request as the server received it, and what became of its response."""

    method: str
    path: str
    query: dict[str, str]
    headers: CIMultiDictProxy[str]
    raw: bytes
    body: Any  # the parsed JSON body, or None when it is empty or not JSON
    model: str | None = None  # the model or deployment that chose the reply
    status: int | None = None
    outcome: str = "pending"  # completed | disconnected | shutdown | error
    bytes_sent: int = 0  # body bytes handed to the transport
    writes: int = 0  # body writes
    sent_all: bool = False
    peer: tuple[str, int] | None = None  # the client's address: one per connection
    ended: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def disconnected(self) -> bool:
        """The client closed the connection before the whole response was written."""
        return self.outcome == "disconnected"

    @property
    def completed(self) -> bool:
        return self.outcome == "completed"

    def wait_ended(self, timeout: float = 5.0) -> bool:
        """Block until the handler has finished (sync tests)."""
        return self.ended.wait(timeout)


_RECORD: web.RequestKey[RequestRecord] = web.RequestKey("replay_record", RequestRecord)
_RESPONSE = web.RequestKey("replay_response", web.StreamResponse)


# Server


class _ReplayCore:
    """Configuration, routes and records shared by ReplayServer and ReplayServerThread.

    The options are plain attributes read on every request, so a test may change them between
    requests (`server.delay = 0.01`).
    """

    def __init__(
        self,
        *,
        split: Split = "event",
        pieces: int = 1,
        delay: float = 0.0,
        piece_delay: float = 0.0,
        drip: float = 0.05,
        drip_count: int | None = None,
        models: str | Sequence[str] | Mapping[str, Any] = "vllm",
        streams: Mapping[str, bytes | str] | None = None,
        corpus: Path | str = CORPUS_DIR,
        bodies: Path | str = BODIES_DIR,
        retry_after: str | None = "2",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.split = split
        self.pieces = pieces
        self.delay = delay
        self.piece_delay = piece_delay
        self.drip = drip
        self.drip_count = drip_count
        self.models = models
        self.streams: dict[str, bytes] = {
            k: v.encode() if isinstance(v, str) else bytes(v) for k, v in (streams or {}).items()
        }
        self.corpus = Path(corpus)
        self.bodies = Path(bodies)
        self.retry_after = retry_after
        self.host = host
        self.port: int = port
        self.requests: list[RequestRecord] = []
        self.disconnects: list[RequestRecord] = []
        self.disconnected = threading.Event()
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._tasks: dict[asyncio.Task[Any], RequestRecord] = {}

    # Addresses and records

    @property
    def root_url(self) -> str:
        """The server without `/v1` (also the `azure_endpoint` of an Azure client)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def chat_requests(self) -> list[RequestRecord]:
        """The recorded chat-completion requests, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def last(self) -> RequestRecord:
        """The last chat-completion request."""
        return self.chat_requests[-1]

    def clear(self) -> None:
        """Forget the recorded requests and disconnects."""
        self.requests.clear()
        self.disconnects.clear()
        self.disconnected.clear()

    # Lifecycle (runs on the server's loop)

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._record], client_max_size=512 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/openai/v1/chat/completions", self._chat)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/openai/v1/models", self._list_models)
        app.router.add_get("/health", self._health)
        return app

    async def _start(self) -> None:
        self._closing = False
        runner = web.AppRunner(
            self._app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def _stop(self) -> None:
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # Recording

    def _finish(self, rec: RequestRecord, outcome: str) -> None:
        if rec.outcome == "pending":
            if outcome == "disconnected" and rec.sent_all:
                outcome = "completed"
            rec.outcome = outcome
            if outcome == "disconnected":
                self.disconnects.append(rec)
                self.disconnected.set()
        rec.ended.set()

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        rec = RequestRecord(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=CIMultiDictProxy(CIMultiDict(request.headers)),
            raw=raw,
            body=body,
            peer=request.transport.get_extra_info("peername") if request.transport else None,
        )
        self.requests.append(rec)
        request[_RECORD] = rec
        task = asyncio.current_task()
        assert task is not None
        self._tasks[task] = rec
        try:
            resp: web.StreamResponse = await handler(request)
        except asyncio.CancelledError:
            self._finish(rec, "shutdown" if self._closing else "disconnected")
            raise
        except ConnectionError:
            self._finish(rec, "shutdown" if self._closing else "disconnected")
            return request.get(_RESPONSE) or web.Response(status=499)
        except web.HTTPException as exc:
            rec.status = exc.status
            self._finish(rec, "completed")
            raise
        except BaseException:
            self._finish(rec, "error")
            raise
        else:
            if rec.status is None:
                rec.status = resp.status
            self._finish(rec, "completed")
            return resp
        finally:
            self._tasks.pop(task, None)

    # Handlers

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    def _models_body(self) -> Any:
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

    async def _list_models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._models_body())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        rec: RequestRecord = request[_RECORD]
        name = request.match_info.get("deployment")
        if name is None and isinstance(rec.body, dict):
            name = rec.body.get("model")
        rec.model = name if isinstance(name, str) else None
        return await self._reply(request, rec, rec.model)

    async def _reply(
        self, request: web.Request, rec: RequestRecord, name: str | None
    ) -> web.StreamResponse:
        if name is None:
            return _json(404, NOT_FOUND_BODY)
        if name == NOT_A_STREAM:
            return _json(200, NOT_A_STREAM_BODY)
        if name == SLOW_DRIP:
            return await self._slow_drip(request, rec)
        if name == STALL_FIRST_BYTE:
            await _forever()
        if name == STALL_MID:
            resp = await self._open(request, rec, 200, {"Content-Type": "text/event-stream"})
            delta = {"role": "assistant", "content": "Hello"}
            await self._write(rec, resp, _chunk_event(STALL_MID, delta, None))
            await _forever()
        if name == STALL_401:
            body = (self.bodies / "auth-401.json").read_bytes()
            resp = web.StreamResponse(status=401, headers={"Content-Type": "application/json"})
            resp.content_length = len(body)
            request[_RESPONSE] = resp
            rec.status = 401
            await resp.prepare(request)
            await _forever()
        match = _STATUS_RE.fullmatch(name)
        if match is not None:
            path = self.bodies / f"{match[2]}.json"
            if not path.is_file():
                return _json(404, NOT_FOUND_BODY)
            status = int(match[1])
            headers = {}
            if status == 429 and self.retry_after is not None:
                headers["Retry-After"] = self.retry_after
            return _json(status, path.read_bytes(), headers)
        data = self._stream(name)
        if data is None:
            return _json(404, NOT_FOUND_BODY)
        return await self._play(request, rec, data)

    def _stream(self, name: str) -> bytes | None:
        if name in self.streams:
            return self.streams[name]
        if _NAME_RE.fullmatch(name) is None:
            return None
        path = self.corpus / f"{name}.sse"
        return path.read_bytes() if path.is_file() else None

    async def _open(
        self, request: web.Request, rec: RequestRecord, status: int, headers: dict[str, str]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Cache-Control": "no-cache", **headers})
        request[_RESPONSE] = resp
        rec.status = status
        await resp.prepare(request)
        return resp

    async def _write(self, rec: RequestRecord, resp: web.StreamResponse, data: bytes) -> None:
        await resp.write(data)
        rec.bytes_sent += len(data)
        rec.writes += 1

    async def _end(self, rec: RequestRecord, resp: web.StreamResponse) -> web.StreamResponse:
        rec.sent_all = True
        await resp.write_eof()
        return resp

    async def _play(
        self, request: web.Request, rec: RequestRecord, data: bytes
    ) -> web.StreamResponse:
        chunks = plan_chunks(data, self.split)
        resp = await self._open(request, rec, 200, {"Content-Type": "text/event-stream"})
        for i, chunk in enumerate(chunks):
            if i and self.delay > 0:
                await asyncio.sleep(self.delay)
            for j, piece in enumerate(split_pieces(chunk, self.pieces)):
                if j and self.piece_delay > 0:
                    await asyncio.sleep(self.piece_delay)
                await self._write(rec, resp, piece)
        return await self._end(rec, resp)

    async def _slow_drip(self, request: web.Request, rec: RequestRecord) -> web.StreamResponse:
        resp = await self._open(request, rec, 200, {"Content-Type": "text/event-stream"})
        i = 0
        while self.drip_count is None or i < self.drip_count:
            delta: dict[str, Any] = {"content": f"tick {i} "}
            if i == 0:
                delta = {"role": "assistant", **delta}
            await self._write(rec, resp, _chunk_event(SLOW_DRIP, delta, None))
            i += 1
            await asyncio.sleep(self.drip)
        await self._write(rec, resp, _chunk_event(SLOW_DRIP, {}, "stop"))
        await self._write(rec, resp, b"data: [DONE]\n\n")
        return await self._end(rec, resp)


def _json(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=body, headers={"Content-Type": "application/json", **(headers or {})}
    )


async def _forever() -> None:
    await asyncio.Event().wait()


class ReplayServer(_ReplayCore):
    """The replay server on the running event loop: `async with ReplayServer(...) as server:`.

    Options (all keyword, all attributes that may be changed later):
    split ("event" | "line" | "whole" | bytes per write | byte offsets | callable), pieces (writes
    per chunk), delay (seconds between chunks), piece_delay (seconds between pieces), drip and
    drip_count (slow-drip), models ("vllm" | "llama.cpp" | "corpus" | list of ids | whole body),
    streams (extra name -> bytes to play), corpus and bodies (directories), retry_after (for
    429s; None to leave it out), host, port (0: a free one).
    """

    async def __aenter__(self) -> ReplayServer:
        await self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    async def wait_disconnect(self, timeout: float = 5.0, count: int = 1) -> RequestRecord:
        """The `count`-th disconnected request, once there is one; TimeoutError otherwise."""
        await self._wait(lambda: len(self.disconnects) >= count, timeout)
        return self.disconnects[count - 1]

    async def wait_requests(self, count: int = 1, timeout: float = 5.0) -> list[RequestRecord]:
        """The recorded requests, once there are at least `count`."""
        await self._wait(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    async def wait_ended(self, record: RequestRecord, timeout: float = 5.0) -> RequestRecord:
        """`record`, once its handler has finished."""
        await self._wait(record.ended.is_set, timeout)
        return record

    @staticmethod
    async def _wait(ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() >= deadline:
                raise TimeoutError("replay server: condition not met in time")
            await asyncio.sleep(0.005)


class ReplayServerThread(_ReplayCore):
    """The replay server on its own event loop in a background thread, for sync tests:
    `with ReplayServerThread(...) as server:`. Options as for ReplayServer."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ReplayServerThread:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop,), daemon=True, name="replay-server"
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout=10)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._loop is not None
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        finally:
            self._shutdown_loop()

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _shutdown_loop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
        self._loop = None

    def wait_disconnect(self, timeout: float = 5.0, count: int = 1) -> RequestRecord:
        """The `count`-th disconnected request, once there is one; TimeoutError otherwise."""
        self._wait(lambda: len(self.disconnects) >= count, timeout)
        return self.disconnects[count - 1]

    def wait_requests(self, count: int = 1, timeout: float = 5.0) -> list[RequestRecord]:
        """The recorded requests, once there are at least `count`."""
        self._wait(lambda: len(self.requests) >= count, timeout)
        return list(self.requests)

    def wait_ended(self, record: RequestRecord, timeout: float = 5.0) -> RequestRecord:
        """`record`, once its handler has finished."""
        if not record.ended.wait(timeout):
            raise TimeoutError("replay server: request did not end in time")
        return record

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() >= deadline:
                raise TimeoutError("replay server: condition not met in time")
            time.sleep(0.005)
