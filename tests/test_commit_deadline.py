"""The commit deadline (issue 19): a streamed answer whose upstream has shown nothing by its
provider's `commit_deadline` (a long prompt being read, a model being loaded) gets the response's
head and keep-alives in each front end's own way, and from then on a failure is the stream's one
error, neither retried nor sent to a fallback; before the deadline a failure still falls back.

svir is served over loopback by uvicorn with svir's own HTTP protocol, as `svir serve` serves it,
in this process; each real client (the openai and anthropic SDKs, the ollama package, httpx for
threads) reads through a transport that sees the bytes as they arrive. The upstream answers only
once the client has seen the keep-alive it waits for: no test waits on a clock (the deadlines are
tiny, the upstreams wait on what the client saw).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import msgspec
import ollama
import openai
import pytest
import uvicorn

from svir.config.load import parse_config
from svir.edges.app import App
from svir.edges.h1_server import H1ServerProtocol
from svir.server import build_app, listen
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport, sse
from tests.support.upstream import PREFILL, ScriptedUpstream

# How long any one condition is waited for: far past anything that works.
PATIENCE = 60.0

CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 3
[providers.timeouts]
commit_deadline = 0.05

[[providers]]
name = "patient"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.retry]
attempts = 1
[providers.timeouts]
commit_deadline = 600

[[providers]]
name = "loading"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
[providers.timeouts]
commit_deadline = 0.05

# A failure after the commit has a fallback it must not use.
[[routes]]
name = "up/silent-always-503"
targets = [{ model = "up/silent-always-503" }]
fallbacks = ["patient/ok"]

# A failure well before its deadline falls back; the fallback's own deadline then applies.
[[routes]]
name = "patient/always-503"
targets = [{ model = "patient/always-503" }]
fallbacks = ["up/silent-ok"]

[[routes]]
name = "fails-then-ok"
targets = [{ model = "patient/always-503" }]
fallbacks = ["patient/ok"]
"""


class Seen:
    """The bytes of the last response one client read, as it reads them (`received`), and the
    waits on them (`saw`); `transport` is the client's, httpx's own (or httpx2's, the Anthropic
    SDK's copy of httpx) watched."""

    def __init__(self) -> None:
        self.received = bytearray()
        self._changed = asyncio.Event()

    async def saw(self, mark: bytes, count: int = 1) -> None:
        """Return once the response's bytes read so far hold `mark` (`count` times)."""
        async with asyncio.timeout(PATIENCE):
            while self.received.count(mark) < count:
                self._changed.clear()
                await self._changed.wait()

    def _got(self, data: bytes) -> None:
        self.received += data
        self._changed.set()

    def transport(self, lib: Any = httpx) -> Any:
        seen = self
        inner = lib.AsyncHTTPTransport()

        class Watched(lib.AsyncByteStream):  # type: ignore[misc]
            def __init__(self, stream: Any) -> None:
                self._stream = stream

            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for data in self._stream:
                    seen._got(data)
                    yield data

            async def aclose(self) -> None:
                await self._stream.aclose()

        class Transport(lib.AsyncBaseTransport):  # type: ignore[misc]
            async def handle_async_request(self, request: Any) -> Any:
                seen.received = bytearray()
                response = await inner.handle_async_request(request)
                return lib.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=Watched(response.stream),
                    extensions=response.extensions,
                )

            async def aclose(self) -> None:
                await inner.aclose()

        return Transport()


class Svir:
    """svir on a loopback port, its upstream scripted, and what its one client saw."""

    def __init__(self, url: str, app: App, upstream: MockTransport, seen: Seen) -> None:
        self.url = url
        self.app = app
        self.upstream = upstream
        self.seen = seen

    def models_asked(self) -> list[str]:
        return [r.json()["model"] for r in self.upstream.requests]

    def openai(self) -> openai.AsyncOpenAI:
        http = httpx.AsyncClient(transport=self.seen.transport(), timeout=PATIENCE)
        return openai.AsyncOpenAI(
            api_key="k", base_url=self.url + "/v1", max_retries=0, http_client=http
        )


def text_completion_stream() -> list[bytes]:
    """An OpenAI-compatible server's streamed text completion of "hello world"."""

    def choice(text: str, finish: str | None) -> dict[str, Any]:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    return sse(
        {**head, "choices": [choice("hello", None)]},
        {**head, "choices": [choice(" world", None)]},
        {**head, "choices": [choice("", "stop")]},
        "[DONE]",
    )


# What each front end's early start begins with.
COMMENT = b": keepalive"


def as_comment(stage: str) -> tuple[bytes, int]:
    """What the client of an SSE front end sees of the upstream's comment `stage`: itself."""
    return b": " + stage.encode(), 1


@asynccontextmanager
async def served(
    tmp: Path,
    mark: bytes,
    setup: Callable[[App, Seen], None] | None = None,
    relayed: Callable[[str], tuple[bytes, int]] = as_comment,
    more_config: str = "",
) -> AsyncIterator[Svir]:
    """svir over `CONFIG`; its silent upstreams answer once the client has seen `mark`, and a
    `prefill-` one sends each next comment once the client has seen the last as the front end
    passes it on (`relayed`: the bytes, and how many of them by then)."""
    seen = Seen()

    async def wait(stage: str) -> None:
        if stage == "silence":
            await seen.saw(mark)
        else:
            await seen.saw(*relayed(stage))

    script = ScriptedUpstream(wait=wait)

    async def completion() -> MockResponse:
        # An OpenAI-compatible server's text completion, once the client has seen `mark`.
        await wait("silence")
        return MockResponse(
            body=text_completion_stream(), headers={"Content-Type": "text/event-stream"}
        )

    def upstream(request: MockRequest) -> MockResponse | Awaitable[MockResponse]:
        if request.path.endswith("/v1/completions"):
            return completion()
        return script(request)

    transport = MockTransport(upstream)
    text = CONFIG + more_config + f'\n[store]\nurl = "sqlite:///{tmp / "svir.db"}"\n'
    config = parse_config(text)
    app = build_app(config, {}, transport=transport)
    if setup is not None:
        setup(app, seen)
    sock = listen("127.0.0.1", 0)
    settings = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        access_log=False,
        http=functools.partial(H1ServerProtocol, limits=config.server),
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(settings)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(PATIENCE):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        yield Svir(f"http://127.0.0.1:{port}", app, transport, seen)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, PATIENCE)
        sock.close()


# --- Chat Completions -----------------------------------------------------------------------


async def test_a_silent_upstream_gets_the_head_and_comments_then_the_answer(tmp_path: Path) -> None:
    async with served(tmp_path, COMMENT) as svir:
        client = svir.openai()
        stream = await client.chat.completions.create(
            model="up/silent-ok", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "hello world"
        received = bytes(svir.seen.received)
        assert received.startswith(COMMENT)  # the upstream answered only once this was seen
        assert received.endswith(b"data: [DONE]\n\n")
        assert svir.models_asked() == ["silent-ok"]


async def test_the_upstreams_own_progress_comments_reach_the_client(tmp_path: Path) -> None:
    # mlx-lm's `: keepalive <read>/<total>` while it reads the prompt (wire reference §3.1): each
    # next comment is sent only once the client has the last, so all three must arrive, in order,
    # before the answer.
    async with served(tmp_path, COMMENT) as svir:
        client = svir.openai()
        stream = await client.chat.completions.create(
            model="up/prefill-ok", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "hello world"
        received = bytes(svir.seen.received)
        at = [received.index(b": keepalive %d/512\n\n" % n) for n in (0, 256, 512)]
        assert at == sorted(at) and at[-1] < received.index(b"data:")


async def test_a_failure_after_the_commit_is_one_error_frame_and_not_retried(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, COMMENT) as svir:
        client = svir.openai()
        stream = await client.chat.completions.create(
            model="up/silent-always-503",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
        assert "down" in caught.value.message
        received = bytes(svir.seen.received)
        assert received.startswith(COMMENT)
        assert received.count(b"data: ") == 1 and b"[DONE]" not in received
        frame = msgspec.json.decode(received[received.index(b"data: ") + 6 :])
        assert frame["error"]["type"] == "upstream_error"
        # Three attempts and a fallback configured: one request, the stream's.
        assert svir.models_asked() == ["silent-always-503"]


async def test_a_failure_before_the_deadline_still_falls_back(tmp_path: Path) -> None:
    async with served(tmp_path, COMMENT) as svir:
        response = await svir.openai().chat.completions.with_raw_response.create(
            model="fails-then-ok", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        # Not started early: the head came with the answer, and carries who served it.
        assert response.headers["x-svir-served-model"] == "patient/ok"
        stream = response.parse()
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "hello world"
        assert bytes(svir.seen.received).startswith(b"data: ")
        assert svir.models_asked() == ["always-503", "ok"]


async def test_the_deadline_is_the_provider_of_the_attempt_under_way(tmp_path: Path) -> None:
    # `patient` (600 s) fails at once and falls back to `up` (0.05 s), which is silent: the
    # stream starts by the fallback's deadline, not the first provider's.
    async with served(tmp_path, COMMENT) as svir:
        stream = await svir.openai().chat.completions.create(
            model="patient/always-503",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "hello world"
        assert bytes(svir.seen.received).startswith(COMMENT)
        assert svir.models_asked() == ["always-503", "silent-ok"]


async def test_an_answer_not_streamed_is_held_past_the_deadline(tmp_path: Path) -> None:
    # The request not streamed reaches the upstream first; a streamed one to the same provider
    # comes after it and has started: the first is past its deadline too, and still gets no
    # early start (one JSON body, its head with it), and its failure is still retried and falls
    # back.
    async with served(tmp_path, COMMENT) as svir:
        client = svir.openai()
        hi = [{"role": "user", "content": "hi"}]
        held = asyncio.ensure_future(
            client.chat.completions.with_raw_response.create(
                model="up/silent-always-503", messages=hi
            )
        )
        async with asyncio.timeout(PATIENCE):
            while not svir.upstream.requests:
                await asyncio.sleep(0.01)
        streamed = await client.chat.completions.create(
            model="up/silent-ok", messages=hi, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
        assert text == "hello world"
        response = await held
        assert response.headers["x-svir-served-model"] == "patient/ok"
        assert response.parse().choices[0].message.content == "hello world"
        # Retried (three attempts) and fallen back on, all past the deadline.
        asked = svir.models_asked()
        assert asked[:2] == ["silent-always-503", "silent-ok"] and asked[-1] == "ok"
        assert sorted(asked[2:-1]) == ["silent-always-503"] * 2


# --- Text completions -----------------------------------------------------------------------


async def test_a_text_completion_stream_starts_with_comments_too(tmp_path: Path) -> None:
    async with served(tmp_path, COMMENT) as svir:
        stream = await svir.openai().completions.create(
            model="up/silent-ok", prompt="Say hi", stream=True
        )
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        assert text == "hello world"
        assert bytes(svir.seen.received).startswith(COMMENT)


# --- Anthropic Messages ---------------------------------------------------------------------


def anthropic_client(svir: Svir) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=svir.seen.transport(httpx2), timeout=PATIENCE)
    return anthropic.AsyncAnthropic(api_key="k", base_url=svir.url, max_retries=0, http_client=http)


async def test_anthropic_gets_message_start_and_pings_then_the_answer(tmp_path: Path) -> None:
    # The upstream's own keep-alives are pings too: the answer waits for the client to have the
    # ping its progress comment became.
    def as_ping(stage: str) -> tuple[bytes, int]:
        return b"event: ping", [c[2:].strip().decode() for c in PREFILL].index(stage) + 1

    async with served(tmp_path, b"event: message_start", relayed=as_ping) as svir:
        client = anthropic_client(svir)
        text = []
        async with client.messages.stream(
            model="up/prefill-ok",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
        ) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text.append(event.delta.text)
        assert "".join(text) == "hello world"
        received = bytes(svir.seen.received)
        assert received.startswith(b"event: message_start")
        head = received[: received.index(b"event: content_block_start")]
        assert head.count(b"event: ping") >= len(PREFILL)


async def test_anthropic_failure_after_the_start_is_one_error_event(tmp_path: Path) -> None:
    async with served(tmp_path, b"event: message_start") as svir:
        client = anthropic_client(svir)
        with pytest.raises(anthropic.APIStatusError):
            async with client.messages.stream(
                model="up/silent-always-503",
                max_tokens=8,
                messages=[{"role": "user", "content": "hi"}],
            ) as stream:
                async for _ in stream:
                    pass
        received = bytes(svir.seen.received)
        assert received.startswith(b"event: message_start")
        assert received.count(b"event: error") == 1
        assert svir.models_asked() == ["silent-always-503"]


# --- Responses ------------------------------------------------------------------------------


async def test_responses_start_in_progress_then_the_answer(tmp_path: Path) -> None:
    async with served(tmp_path, b"response.in_progress") as svir:
        stream = await svir.openai().responses.create(model="up/silent-ok", input="hi", stream=True)
        types, text = [], []
        async for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        assert "".join(text) == "hello world"
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] == "response.completed"


async def test_responses_failure_after_the_start_is_response_failed(tmp_path: Path) -> None:
    async with served(tmp_path, b"response.in_progress") as svir:
        stream = await svir.openai().responses.create(
            model="up/silent-always-503", input="hi", stream=True
        )
        types = [event.type async for event in stream]
        assert types[0] == "response.created"
        assert types[-1] == "response.failed" and types.count("response.failed") == 1
        assert svir.models_asked() == ["silent-always-503"]


# --- Ollama ---------------------------------------------------------------------------------


def ollama_client(svir: Svir) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=svir.url, transport=svir.seen.transport(), timeout=PATIENCE)


HI = [{"role": "user", "content": "hi"}]


async def test_ollama_gets_its_head_and_spaces_then_the_lines(tmp_path: Path) -> None:
    # NDJSON has no comment: spaces before the first line's object, which the official client
    # parses as the JSON they are.
    async with served(tmp_path, b" ") as svir:
        parts = await ollama_client(svir).chat(model="up/silent-ok", messages=HI, stream=True)
        text = [part.message.content async for part in parts]
        assert "".join(t or "" for t in text) == "hello world"
        received = bytes(svir.seen.received)
        assert received.startswith(b" ") and received.lstrip(b" ").startswith(b'{"model"')
        assert svir.models_asked() == ["silent-ok"]


async def test_ollama_failure_after_the_start_is_one_error_line(tmp_path: Path) -> None:
    async with served(tmp_path, b" ") as svir:
        parts = await ollama_client(svir).chat(
            model="up/silent-always-503", messages=HI, stream=True
        )
        with pytest.raises(ollama.ResponseError) as caught:
            async for _ in parts:
                pass
        assert "down" in str(caught.value)
        lines = bytes(svir.seen.received).split(b"\n")
        assert [msgspec.json.decode(line) for line in lines if line.strip()] == [
            {"error": caught.value.error}
        ]
        assert svir.models_asked() == ["silent-always-503"]


async def test_a_model_that_loads_slowly_gets_the_head_and_keep_alives(tmp_path: Path) -> None:
    # A server svir runs itself is started inside the attempt (the route's `ensure`, as
    # svir.edges.managed plugs it): here the load ends once the client has seen the stream's
    # first keep-alive, so the head and keep-alives went out while the model was loading.
    loads: list[str] = []
    released: list[str] = []

    def slow_loads(app: App, seen: Seen) -> None:
        async def ensure(model_id: str) -> str:
            loads.append(model_id)
            await seen.saw(b" ")
            return "http://upstream.test/v1"

        app.router.set_ensure("loading", ensure, released.append)

    async with served(tmp_path, b" ", slow_loads) as svir:
        parts = await ollama_client(svir).chat(model="loading/ok", messages=HI, stream=True)
        text = [part.message.content async for part in parts]
        assert "".join(t or "" for t in text) == "hello world"
        assert bytes(svir.seen.received).startswith(b" ")
        assert loads == ["ok"] and released == ["ok"]
    # The same through the OpenAI SDK: the head and a comment during the load.
    async with served(tmp_path, COMMENT, slow_loads) as svir:
        stream = await svir.openai().chat.completions.create(
            model="loading/ok", messages=HI, stream=True
        )
        text = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(text) == "hello world"
        assert bytes(svir.seen.received).startswith(COMMENT)


FAKE_LLAMA_SERVER = """#!{python}
# llama-server loading its model until the file next to it named <model>.ready exists: /health
# answers 503 "Loading model" until then, as llama-server does, and 200 after.
import http.server, pathlib, sys

port = int(sys.argv[sys.argv.index("--port") + 1])
ready = pathlib.Path(sys.argv[sys.argv.index("--model") + 1] + ".ready")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        loaded = ready.exists()
        body = b'{{"status":"ok"}}' if loaded else b'{{"error":{{"code":503,"message":"Loading model"}}}}'
        self.send_response(200 if loaded else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.external
async def test_a_managed_model_loading_slowly_gets_the_head_and_keep_alives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # svir starts the model's server inside the attempt and waits until it is healthy; this one
    # loads until the client has seen the stream's first keep-alive (the chat itself then goes
    # to the scripted upstream: the managed model is named `ok`).
    server = tmp_path / "llama-server"
    server.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    server.chmod(0o755)
    monkeypatch.setenv("SVIR_LLAMA_SERVER", str(server))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not read by the fake server")
    managed = f"""
[[providers]]
name = "local"
kind = "llamacpp-managed"
[providers.timeouts]
commit_deadline = 0.05
[providers.managed]
start_timeout = {PATIENCE}
[providers.managed.models]
ok = "{model}"
"""
    async with served(tmp_path, COMMENT, more_config=managed) as svir:

        async def load_once_kept_alive() -> None:
            await svir.seen.saw(COMMENT)
            (tmp_path / "model.gguf.ready").touch()

        loaded = asyncio.ensure_future(load_once_kept_alive())
        stream = await svir.openai().chat.completions.create(
            model="local/ok", messages=HI, stream=True
        )
        text = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await loaded
        assert "".join(text) == "hello world"
        assert bytes(svir.seen.received).startswith(COMMENT)


# --- Threads --------------------------------------------------------------------------------


async def test_a_thread_continue_starts_with_comments_then_its_frames(tmp_path: Path) -> None:
    async with served(tmp_path, COMMENT) as svir:
        async with httpx.AsyncClient(base_url=svir.url + "/v1", timeout=PATIENCE) as plain:
            made = await plain.post("/threads", json={"model": "up/silent-ok"})
            thread = made.json()["id"]
            added = await plain.post(f"/threads/{thread}/messages", json={"content": "hi"})
            assert added.status_code == 200, added.text
        async with httpx.AsyncClient(
            base_url=svir.url + "/v1", transport=svir.seen.transport(), timeout=PATIENCE
        ) as client:
            path = f"/threads/{thread}/continue"
            async with client.stream("POST", path, json={"stream": True}) as response:
                assert response.status_code == 200
                body = b"".join([data async for data in response.aiter_bytes()])
        assert body.startswith(COMMENT)
        frames = [
            msgspec.json.decode(line[6:]) for line in body.split(b"\n") if line[:6] == b"data: "
        ]
        assert "".join(f["text"] for f in frames if f["type"] == "delta") == "hello world"
        assert frames[-1]["type"] == "done"
