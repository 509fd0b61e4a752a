"""The scripted upstream (tests/support/upstream.py) served by `tests.support.mock_server.MockServer`,
exercised over real HTTP with plain httpx."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import httpx
import openai
import pytest

from svir.config.model import Timeouts
from svir.edges.upstream import UpstreamClient
from svir.transport import Transport
from svir.wire.errors import ErrorKind, UpstreamError
from tests.support.mock_server import MockServer, MockServerThread
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport
from tests.support.upstream import (
    BODIES_DIR,
    CORPUS_DIR,
    LLAMA_CPP_MODELS,
    OK_TEXTS,
    VLLM_MODELS,
    ScriptedUpstream,
    corpus_names,
    plan_chunks,
    split_events,
    split_lines,
    split_pieces,
    status_model,
    token_stream,
)
from tests.support.waiting import PATIENCE, eventually

BODY_NAMES = sorted(p.stem for p in BODIES_DIR.glob("*.json"))
NOT_FOUND = b'{"error":{"message":"model not found"}}'


def corpus(name: str) -> bytes:
    return (CORPUS_DIR / f"{name}.sse").read_bytes()


def chat(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        **extra,
    }


@pytest.fixture
async def server() -> AsyncIterator[MockServer[ScriptedUpstream]]:
    async with MockServer(ScriptedUpstream()) as srv:
        yield srv


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        yield c


async def read_raw(
    client: httpx.AsyncClient, url: str, body: object
) -> tuple[httpx.Response, bytes]:
    async with client.stream("POST", url, json=body) as resp:
        data = b"".join([chunk async for chunk in resp.aiter_raw()])
    return resp, data


# Chunking helpers


def test_split_events_keeps_each_line_end_style() -> None:
    lf = split_events(corpus("interleaved-tools"))
    assert len(lf) == 6
    assert all(e.endswith(b"\n\n") for e in lf)
    crlf = split_events(corpus("crlf-multiline"))
    assert crlf[0] == b": stream opened\r\n\r\n"
    assert crlf[1] == b"retry: 3000\r\n\r\n"
    cr = split_events(corpus("cr-only"))
    assert cr[0] == b": ping\r\r"
    assert all(e.endswith(b"\r\r") for e in cr)
    cut = split_events(corpus("truncated-mid-event"))
    assert not cut[-1].endswith(b"\n")


def test_split_lines_and_pieces() -> None:
    assert split_lines(b"a\r\nb\rc\n\nd") == [b"a\r\n", b"b\r", b"c\n", b"\n", b"d"]
    assert split_lines(b"") == []
    assert split_pieces(b"abcdefg", 3) == [b"abc", b"de", b"fg"]
    assert split_pieces(b"ab", 5) == [b"a", b"b"]
    assert split_pieces(b"", 3) == []
    # Pieces cut inside a UTF-8 character.
    assert split_pieces("é".encode(), 2) == [b"\xc3", b"\xa9"]


@pytest.mark.parametrize("name", corpus_names())
@pytest.mark.parametrize("split", ["event", "line", "whole", 1, 13, [5, 40, 41, 999999]])
def test_plan_chunks_preserves_every_file(name: str, split: object) -> None:
    data = corpus(name)
    assert b"".join(plan_chunks(data, split, pieces=3)) == data  # type: ignore[arg-type]


def test_plan_chunks_rejects_a_bad_split() -> None:
    with pytest.raises(ValueError, match="unknown split"):
        plan_chunks(b"data: x\n\n", "words")
    with pytest.raises(ValueError, match="at least 1"):
        plan_chunks(b"data: x\n\n", 0)
    with pytest.raises(ValueError, match="preserve"):
        plan_chunks(b"data: x\n\n", lambda d: [d, d])


def test_status_model() -> None:
    assert status_model("vllm-overflow-400") == "status-400-vllm-overflow-400"
    assert status_model("openai-429") == "status-429-openai-429"
    with pytest.raises(ValueError, match="status code"):
        status_model("no-code")


# Corpus streams


async def test_plays_every_corpus_stream_exactly(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    names = corpus_names()
    assert {"lmstudio-reasoning", "mlx-lm", "mlx-vlm", "vllm-named-tool", "azure"} <= set(names)
    for name in names:
        resp, data = await read_raw(client, f"{server.base_url}/chat/completions", chat(name))
        assert resp.status_code == 200, name
        assert resp.headers["content-type"] == "text/event-stream"
        assert data == corpus(name), name
    for rec in server.chat_requests:
        await server.wait_ended(rec, timeout=PATIENCE)
        assert rec.completed, rec.model
        assert rec.bytes_sent == len(corpus(rec.model or ""))
    assert server.disconnects == []
    assert not server.disconnected.is_set()


@pytest.mark.parametrize(
    ("split", "pieces"),
    [
        ("event", 1),
        ("event", 3),
        ("line", 1),
        ("whole", 1),
        (1, 1),
        (7, 2),
        ([3, 100, 101, 2000], 1),
        (lambda d: [d[:10], d[10:11], d[11:]], 4),
    ],
)
@pytest.mark.parametrize("name", ["utf8", "crlf-multiline", "cr-only", "truncated-mid-event"])
async def test_byte_splitting_preserves_the_file(
    client: httpx.AsyncClient, name: str, split: object, pieces: int
) -> None:
    data = corpus(name)
    async with MockServer(ScriptedUpstream(split=split, pieces=pieces)) as srv:  # type: ignore[arg-type]
        _, received = await read_raw(client, f"{srv.base_url}/chat/completions", chat(name))
        rec = await srv.wait_ended(srv.last, timeout=PATIENCE)
    assert received == data
    assert rec.writes == len(plan_chunks(data, split, pieces))  # type: ignore[arg-type]
    assert rec.bytes_sent == len(data)
    assert rec.completed


async def test_events_arrive_one_by_one_with_a_delay(client: httpx.AsyncClient) -> None:
    data = corpus("interleaved-tools")
    events = len(plan_chunks(data, "event"))
    async with MockServer(ScriptedUpstream(delay=0.05)) as srv:
        start = time.monotonic()
        _, received = await read_raw(
            client, f"{srv.base_url}/chat/completions", chat("interleaved-tools")
        )
        took = time.monotonic() - start
        rec = await srv.wait_ended(srv.last, timeout=PATIENCE)
    assert received == data
    # One write per event, the delay before each but the first. Only a lower bound on the time:
    # the server slept that long, and a slow machine takes longer still.
    assert events >= 4 and rec.writes == events
    assert took >= (events - 1) * 0.05


async def test_extra_streams_and_the_pieces_option(client: httpx.AsyncClient) -> None:
    stream = 'data: {"choices":[{"index":0,"delta":{"content":"é"}}]}\n\ndata: [DONE]\n\n'
    async with MockServer(ScriptedUpstream(streams={"custom": stream}, pieces=5)) as srv:
        _, data = await read_raw(client, f"{srv.base_url}/chat/completions", chat("custom"))
        assert data == stream.encode()
        assert srv.last.writes == 10


async def test_options_can_change_between_requests(client: httpx.AsyncClient) -> None:
    async with MockServer(ScriptedUpstream()) as srv:
        await read_raw(client, f"{srv.base_url}/chat/completions", chat("mlx-lm"))
        srv.handler.split = "whole"
        await read_raw(client, f"{srv.base_url}/chat/completions", chat("mlx-lm"))
        first, second = srv.chat_requests
        await srv.wait_ended(second, timeout=PATIENCE)
    assert first.writes == len(split_events(corpus("mlx-lm")))
    assert second.writes == 1


# Azure routes


async def test_azure_deployment_route(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    url = f"{server.root_url}/openai/deployments/azure-block/chat/completions"
    async with client.stream(
        "POST",
        url,
        params={"api-version": "2024-10-21"},
        headers={"api-key": "azure-key"},
        json={"messages": [], "stream": True},
    ) as resp:
        data = await resp.aread()
    assert resp.status_code == 200
    assert data == corpus("azure-block")
    rec = server.last
    assert rec.path == "/openai/deployments/azure-block/chat/completions"
    assert rec.model == "azure-block"
    assert rec.query == {"api-version": "2024-10-21"}
    assert rec.headers["API-Key"] == "azure-key"


async def test_azure_v1_route(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    url = f"{server.root_url}/openai/v1/chat/completions"
    _, data = await read_raw(client, url, chat("azure-async"))
    assert data == corpus("azure-async")
    assert server.last.path == "/openai/v1/chat/completions"


async def test_azure_unknown_deployment_is_404(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    url = f"{server.root_url}/openai/deployments/nope/chat/completions?api-version=x"
    resp = await client.post(url, json=chat("mlx-lm"))
    assert resp.status_code == 404
    assert resp.content == NOT_FOUND


# Unknown models


@pytest.mark.parametrize(
    "body",
    [
        chat("no-such-model"),
        chat("../README"),
        chat("status-400-no-such-body"),
        {"messages": []},
        {"model": 7},
    ],
)
async def test_unknown_model_is_404(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient, body: dict[str, object]
) -> None:
    resp = await client.post(f"{server.base_url}/chat/completions", json=body)
    assert resp.status_code == 404
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {"error": {"message": "model not found"}}


async def test_body_that_is_not_json_is_recorded_and_404(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    resp = await client.post(f"{server.base_url}/chat/completions", content=b"{nope")
    assert resp.status_code == 404
    assert server.last.raw == b"{nope"
    assert server.last.body is None


# Scripted HTTP errors


def test_bodies_hold_the_reference_quotes() -> None:
    def body(name: str) -> dict[str, object]:
        return json.loads((BODIES_DIR / f"{name}.json").read_bytes())

    required = {
        "mlx-lm-image-404",
        "llama-cpp-image-500",
        "llama-cpp-overflow-400",
        "vllm-overflow-400",
        "vllm-max-tokens-400",
        "mlx-vlm-422",
        "mlx-vlm-overflow-400",
        "azure-content-filter-400",
        "lmstudio-tool-choice-400",
        "lmstudio-json-object-400",
        "openai-429",
        "auth-401",
    }
    assert required <= set(BODY_NAMES)
    assert (BODIES_DIR / "mlx-lm-image-404.json").read_bytes() == (
        b'{"error": "Only \'text\' content type is supported."}'
    )
    assert body("llama-cpp-image-500")["error"]["code"] == 500  # type: ignore[index]
    overflow = body("llama-cpp-overflow-400")["error"]
    assert overflow["type"] == "exceed_context_size_error"  # type: ignore[index]
    assert (overflow["n_prompt_tokens"], overflow["n_ctx"]) == (20056, 16384)  # type: ignore[index]
    vllm = body("vllm-overflow-400")["error"]
    assert vllm["param"] == "input_tokens"  # type: ignore[index]
    assert "maximum context length" in vllm["message"]  # type: ignore[index]
    assert body("vllm-max-tokens-400")["error"]["param"] == "max_tokens"  # type: ignore[index]
    assert body("mlx-vlm-422")["detail"][0]["msg"] == "Input should be a valid list"  # type: ignore[index]
    assert isinstance(body("mlx-vlm-overflow-400")["detail"], str)
    azure = body("azure-content-filter-400")["error"]
    assert azure["code"] == "content_filter"  # type: ignore[index]
    assert azure["innererror"]["content_filter_result"]["jailbreak"] == {  # type: ignore[index]
        "detected": True,
        "filtered": True,
    }
    assert isinstance(body("lmstudio-tool-choice-400")["error"], str)
    assert isinstance(body("lmstudio-json-object-400")["error"], str)
    assert body("auth-401")["error"]["message"].startswith(  # type: ignore[index]
        "Incorrect API key provided: sk-"
    )


@pytest.mark.parametrize("name", BODY_NAMES)
async def test_status_models_return_the_body(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient, name: str
) -> None:
    model = status_model(name)
    status = int(model.split("-")[1])
    resp = await client.post(f"{server.base_url}/chat/completions", json=chat(model))
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert resp.content == (BODIES_DIR / f"{name}.json").read_bytes()
    if status == 429:
        assert resp.headers["retry-after"] == "2"
    else:
        assert "retry-after" not in resp.headers
    assert server.last.status == status
    assert server.last.completed


async def test_status_comes_from_the_model_name(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    resp = await client.post(
        f"{server.base_url}/chat/completions", json=chat("status-503-llama-cpp-image-500")
    )
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == 500


async def test_retry_after_can_be_left_out(client: httpx.AsyncClient) -> None:
    async with MockServer(ScriptedUpstream(retry_after=None)) as srv:
        resp = await client.post(
            f"{srv.base_url}/chat/completions", json=chat("status-429-openai-429")
        )
    assert resp.status_code == 429
    assert "retry-after" not in resp.headers


async def test_stall_401_sends_headers_and_never_the_body(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    body = (BODIES_DIR / "auth-401.json").read_bytes()
    timeout = httpx.Timeout(5.0, read=0.3)
    async with client.stream(
        "POST", f"{server.base_url}/chat/completions", json=chat("stall-401"), timeout=timeout
    ) as resp:
        assert resp.status_code == 401
        assert resp.headers["content-type"] == "application/json"
        assert resp.headers["content-length"] == str(len(body))
        with pytest.raises(httpx.ReadTimeout):
            await resp.aread()
    rec = await server.wait_disconnect(timeout=PATIENCE)
    assert rec.model == "stall-401"
    assert rec.status == 401
    assert rec.bytes_sent == 0


async def test_not_a_stream(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    resp = await client.post(f"{server.base_url}/chat/completions", json=chat("not-a-stream"))
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert resp.content == b'{"ok":true}'


# Disconnects and stalls


async def test_slow_drip_disconnect_is_observed_at_once(client: httpx.AsyncClient) -> None:
    # A drip an hour apart: the server notices the close before PATIENCE runs out only if it
    # watches the connection, not when its next write fails.
    async with MockServer(ScriptedUpstream(drip=3600.0)) as srv:
        async with client.stream(
            "POST", f"{srv.base_url}/chat/completions", json=chat("slow-drip")
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"] == "text/event-stream"
            first = await resp.aiter_raw().__anext__()
            assert b'"content":"tick 0 "' in first
        rec = await srv.wait_disconnect(timeout=PATIENCE)
        assert rec is srv.last
        assert rec.model == "slow-drip"
        assert rec.disconnected
        assert rec.ended.is_set()
        assert srv.disconnected.is_set()
        assert srv.disconnects == [rec]


async def test_slow_drip_counts_the_chunks_before_the_close(client: httpx.AsyncClient) -> None:
    async with MockServer(ScriptedUpstream(drip=0.01)) as srv:
        seen = b""
        async with client.stream(
            "POST", f"{srv.base_url}/chat/completions", json=chat("slow-drip")
        ) as resp:
            async for chunk in resp.aiter_raw():
                seen += chunk
                if seen.count(b"\n\n") >= 5:
                    break
        rec = await srv.wait_disconnect(timeout=PATIENCE)
    assert rec.writes >= 5
    assert b"[DONE]" not in seen


async def test_slow_drip_with_a_count_finishes(client: httpx.AsyncClient) -> None:
    async with MockServer(ScriptedUpstream(drip=0.01, drip_count=3)) as srv:
        _, data = await read_raw(client, f"{srv.base_url}/chat/completions", chat("slow-drip"))
        rec = await srv.wait_ended(srv.last, timeout=PATIENCE)
    events = split_events(data)
    assert len(events) == 5
    assert b'"finish_reason":"stop"' in events[3]
    assert events[4] == b"data: [DONE]\n\n"
    assert rec.completed
    assert srv.disconnects == []


async def test_closing_a_corpus_stream_early_is_a_disconnect(client: httpx.AsyncClient) -> None:
    async with MockServer(ScriptedUpstream(delay=0.2)) as srv:
        async with client.stream(
            "POST", f"{srv.base_url}/chat/completions", json=chat("mlx-lm")
        ) as resp:
            await resp.aiter_raw().__anext__()
        rec = await srv.wait_disconnect(timeout=PATIENCE)
    assert rec.model == "mlx-lm"
    assert 0 < rec.bytes_sent < len(corpus("mlx-lm"))


async def test_reading_to_the_end_is_not_a_disconnect(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    await read_raw(client, f"{server.base_url}/chat/completions", chat("llama-cpp"))
    await client.aclose()  # the connection closes after the whole stream
    rec = await server.wait_ended(server.last, timeout=PATIENCE)
    await eventually(lambda: not server._connections, "the server sees the connection close")
    assert rec.completed
    assert server.disconnects == []


async def test_stall_first_byte_sends_nothing(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await client.post(
            f"{server.base_url}/chat/completions",
            json=chat("stall-first-byte"),
            timeout=httpx.Timeout(PATIENCE, read=0.3),
        )
    rec = await server.wait_disconnect(timeout=PATIENCE)
    assert rec.model == "stall-first-byte"
    assert rec.status is None and rec.writes == 0
    assert rec.body == chat("stall-first-byte")


async def test_stall_mid_sends_one_chunk(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    async with client.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        json=chat("stall-mid"),
        timeout=httpx.Timeout(PATIENCE, read=0.3),
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        chunks = resp.aiter_raw()
        first = await chunks.__anext__()
        assert first.startswith(b"data: {")
        assert first.endswith(b"\n\n")
        assert json.loads(first[6:])["choices"][0]["delta"]["content"] == "Hello"
        with pytest.raises(httpx.ReadTimeout):
            await chunks.__anext__()
    rec = await server.wait_disconnect(timeout=PATIENCE)
    assert rec.model == "stall-mid"
    assert rec.writes == 1


async def test_stopping_the_server_ends_stalled_requests(client: httpx.AsyncClient) -> None:
    srv = MockServer(ScriptedUpstream())
    srv.stop_grace = 3600.0  # a stop that only waited for the stalled answer would hang
    async with asyncio.timeout(PATIENCE), srv:
        pending = asyncio.create_task(
            client.post(f"{srv.base_url}/chat/completions", json=chat("stall-first-byte"))
        )
        await srv.wait_requests(1, timeout=PATIENCE)
    with pytest.raises(httpx.HTTPError):
        await pending
    rec = srv.requests[0]
    assert rec.outcome == "shutdown"
    assert srv.disconnects == []


# Recorded requests


async def test_records_what_the_upstream_got(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    body = {
        "model": "mlx-vlm",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            }
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 256,
    }
    raw = json.dumps(body).encode()
    resp = await client.post(
        f"{server.base_url}/chat/completions",
        content=raw,
        headers={"Authorization": "Bearer sk-upstream", "Content-Type": "application/json"},
    )
    assert resp.status_code == 200
    rec = server.last
    assert rec.method == "POST"
    assert rec.path == "/v1/chat/completions"
    assert rec.raw == raw
    assert rec.body == body
    assert rec.model == "mlx-vlm"
    assert rec.headers["authorization"] == "Bearer sk-upstream"
    assert rec.headers["Content-Type"] == "application/json"
    assert rec.body["stream_options"] == {"include_usage": True}
    assert rec.body["max_tokens"] == 256
    assert rec.body["messages"][0]["content"][1]["image_url"]["url"] == image


async def test_every_request_is_recorded_in_order(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    await client.get(f"{server.base_url}/models")
    await client.post(f"{server.base_url}/chat/completions", json=chat("refusal"))
    await client.get(f"{server.root_url}/health")
    await client.get(f"{server.base_url}/nowhere")
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/health"),
        ("GET", "/v1/nowhere"),
    ]
    assert [r.model for r in server.chat_requests] == ["refusal"]
    assert server.requests[-1].status == 404
    server.clear()
    assert server.requests == []


# Listing and health


async def test_default_model_list_is_vllm_like(
    server: MockServer[ScriptedUpstream], client: httpx.AsyncClient
) -> None:
    resp = await client.get(f"{server.base_url}/models")
    assert resp.status_code == 200
    assert resp.json() == VLLM_MODELS
    ids = [m["id"] for m in resp.json()["data"]]
    assert len(ids) == 2
    assert any("embed" in i for i in ids)
    assert (await client.get(f"{server.root_url}/openai/v1/models")).json() == VLLM_MODELS


@pytest.mark.parametrize(
    ("models", "expect"),
    [
        ("llama.cpp", LLAMA_CPP_MODELS),
        ({"data": []}, {"data": []}),
        (["a", "b"], ["a", "b"]),
        ("corpus", corpus_names()),
    ],
)
async def test_model_list_options(
    client: httpx.AsyncClient, models: object, expect: object
) -> None:
    async with MockServer(ScriptedUpstream(models=models)) as srv:  # type: ignore[arg-type]
        doc = (await client.get(f"{srv.base_url}/models")).json()
    if isinstance(expect, list):
        assert [m["id"] for m in doc["data"]] == expect
    else:
        assert doc == expect
    if models == "llama.cpp":
        assert doc["models"][0]["model"] == doc["data"][0]["id"]


async def test_health(server: MockServer[ScriptedUpstream], client: httpx.AsyncClient) -> None:
    resp = await client.get(f"{server.root_url}/health")
    assert resp.status_code == 200


def test_base_url_shape() -> None:
    srv = MockServer(ScriptedUpstream(), port=1234)
    assert srv.base_url == "http://127.0.0.1:1234/v1"
    assert srv.root_url == "http://127.0.0.1:1234"
    assert Path(CORPUS_DIR).is_dir()


# The threaded server, for sync tests


def test_thread_server_plays_and_records() -> None:
    with MockServerThread(ScriptedUpstream(pieces=2)) as srv, httpx.Client(timeout=PATIENCE) as c:
        assert srv.base_url.startswith("http://127.0.0.1:")
        assert not srv.base_url.endswith(":0/v1")
        with c.stream(
            "POST",
            f"{srv.base_url}/chat/completions",
            json=chat("lmstudio-reasoning"),
            headers={"Authorization": "Bearer t"},
        ) as resp:
            data = b"".join(resp.iter_raw())
        assert data == corpus("lmstudio-reasoning")
        rec = srv.wait_ended(srv.last, timeout=PATIENCE)
        assert rec.completed
        assert rec.headers["Authorization"] == "Bearer t"
        resp = c.post(f"{srv.base_url}/chat/completions", json=chat(status_model("openai-429")))
        assert resp.status_code == 429
        assert resp.headers["Retry-After"] == "2"
        assert c.get(f"{srv.root_url}/health").status_code == 200


def test_thread_server_observes_a_disconnect() -> None:
    # A drip an hour apart: seen in time only if the server watches the connection.
    script = ScriptedUpstream(drip=3600.0)
    with MockServerThread(script) as srv, httpx.Client(timeout=PATIENCE) as c:
        with c.stream("POST", f"{srv.base_url}/chat/completions", json=chat("slow-drip")) as resp:
            next(resp.iter_raw())
        assert srv.disconnected.wait(PATIENCE)
        rec = srv.wait_disconnect(timeout=PATIENCE)
        assert rec.model == "slow-drip"
        assert rec.wait_ended(PATIENCE)
        assert srv.disconnects == [rec]


def test_thread_server_stops_with_a_stalled_request() -> None:
    with MockServerThread(ScriptedUpstream()) as srv, httpx.Client() as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post(
                f"{srv.base_url}/chat/completions",
                json=chat("stall-first-byte"),
                timeout=httpx.Timeout(PATIENCE, read=0.2),
            )
        srv.wait_disconnect(timeout=PATIENCE)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.root_url}/health", timeout=1.0)


def test_sync_openai_sdk_streams_through_the_thread_server() -> None:
    with MockServerThread(ScriptedUpstream()) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        stream = sdk.chat.completions.create(
            model="vllm-named-tool",
            messages=[{"role": "user", "content": "open the locker"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        names = [
            call.function.name
            for chunk in stream
            for choice in chunk.choices
            for call in choice.delta.tool_calls or []
            if call.function and call.function.name
        ]
        assert names
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(
                model=status_model("openai-429"), messages=[{"role": "user", "content": "hi"}]
            )
        assert srv.chat_requests[0].body["stream_options"] == {"include_usage": True}
        assert srv.chat_requests[0].headers["Authorization"] == "Bearer sk-test"


# The same script in process (MockTransport) and over HTTP (MockServer and svir's own client)

LOCAL = "http://upstream.test/v1"
TIMEOUTS = Timeouts()


@pytest.fixture(params=["in process", "over http"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Transport, str]]:
    """A transport to the scripted upstream, and the upstream's base URL."""
    script = ScriptedUpstream(retry_after="1")
    if request.param == "in process":
        yield MockTransport(script), LOCAL
        return
    client = UpstreamClient()
    async with MockServer(script) as srv:
        try:
            yield client, srv.base_url
        finally:
            await client.close()


async def play(
    transport: tuple[Transport, str], model: str, timeouts: Timeouts = TIMEOUTS
) -> bytes:
    """What a chat request for `model` streams back, read to its end."""
    client, base = transport
    body = json.dumps(chat(model)).encode()
    stream = await client.open_stream(
        f"{base}/chat/completions",
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-t"},
        body=body,
        timeouts=timeouts,
    )
    data = b""
    try:
        while piece := await stream.read():
            data += piece
    finally:
        stream.close()
    return data


async def refused(
    transport: tuple[Transport, str], model: str, timeouts: Timeouts = TIMEOUTS
) -> UpstreamError:
    with pytest.raises(UpstreamError) as info:
        await play(transport, model, timeouts)
    return info.value


async def test_a_stream_is_the_same_both_ways(transport: tuple[Transport, str]) -> None:
    assert await play(transport, "ok") == b"".join(token_stream("ok", OK_TEXTS))
    assert await play(transport, "mlx-lm") == corpus("mlx-lm")
    tokens = await play(transport, "tok-3")
    assert tokens.count(b'"content":"w') == 3 and tokens.endswith(b"data: [DONE]\n\n")


async def test_errors_are_classified_the_same_both_ways(transport: tuple[Transport, str]) -> None:
    assert (await refused(transport, "flaky-1")).kind is ErrorKind.TRANSIENT
    assert b"hello" in await play(transport, "flaky-1")  # the second request is served
    limited = await refused(transport, "limited")
    assert limited.kind is ErrorKind.RATE_LIMITED and limited.retry_after == 1.0
    overflow = await refused(transport, status_model("vllm-overflow-400"))
    assert overflow.kind is ErrorKind.CONTEXT_OVERFLOW
    assert (await refused(transport, "echo-401")).kind is ErrorKind.AUTH
    assert (await refused(transport, "not-a-stream")).kind is ErrorKind.NOT_A_STREAM


async def test_breaks_and_stalls_are_the_same_both_ways(transport: tuple[Transport, str]) -> None:
    cut = await refused(transport, "reset-late")
    assert cut.kind is ErrorKind.INCOMPLETE and cut.in_stream
    quick = Timeouts(first_byte=0.2, idle=0.2)
    assert (await refused(transport, "stall-first-byte", quick)).kind is ErrorKind.TIMEOUT
    stalled = await refused(transport, "stall-mid", quick)
    assert stalled.kind is ErrorKind.TIMEOUT and stalled.in_stream


async def test_a_handler_that_raises_is_recorded_as_an_error(client: httpx.AsyncClient) -> None:
    def handler(request: MockRequest) -> MockResponse:
        raise RuntimeError("the script is wrong")

    async with MockServer(handler) as srv:
        resp = await client.post(f"{srv.base_url}/chat/completions", json=chat("x"))
        assert resp.status_code == 500
        rec = await srv.wait_ended(srv.last, timeout=PATIENCE)
    assert rec.outcome == "error" and isinstance(rec.error, RuntimeError)


async def test_keep_alive_and_framing(client: httpx.AsyncClient) -> None:
    script = ScriptedUpstream()
    async with MockServer(script, framing="length") as srv:
        for _ in range(3):
            resp = await client.post(f"{srv.base_url}/chat/completions", json=chat("ok"))
            assert resp.content == b"".join(token_stream("ok", OK_TEXTS))
            assert "transfer-encoding" not in resp.headers
        assert len({r.peer for r in srv.requests}) == 1  # one connection, kept alive
        assert [r.writes for r in srv.requests] == [len(token_stream("ok", OK_TEXTS))] * 3
    async with MockServer(script) as srv:
        resp = await client.post(f"{srv.base_url}/chat/completions", json=chat("ok"))
        assert resp.headers["transfer-encoding"] == "chunked"
        assert resp.content == b"".join(token_stream("ok", OK_TEXTS))


async def test_a_memo_answers_a_repeated_request_without_the_handler(
    client: httpx.AsyncClient,
) -> None:
    script = ScriptedUpstream()
    calls: list[MockRequest] = []

    def handler(request: MockRequest) -> MockResponse | Awaitable[MockResponse]:
        calls.append(request)
        return script(request)

    async with MockServer(handler, record=False, memo=True) as srv:
        url = f"{srv.base_url}/chat/completions"
        first = [await client.post(url, json=chat("stream-3")) for _ in range(3)]
        other = await client.post(url, json=chat("json"))
        drips = [await client.post(url, json=chat("drip-2")) for _ in range(2)]
    assert [r.content for r in first] == [first[0].content] * 3
    assert first[0].content.count(b'"content"') == 3 and b'"model":"json"' in other.content
    assert drips[0].content == drips[1].content
    # One call per distinct whole answer; a streamed answer (drip) is asked for each time.
    assert [r.model for r in calls] == ["stream-3", "json", "drip-2", "drip-2"]
    assert srv.requests == []
