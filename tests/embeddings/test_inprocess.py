"""Embeddings through the whole app (`build_app`, every front end) in this process, over a
scripted embeddings upstream (tests/support/embedder.py), driven by the real clients: the OpenAI
SDK (floats, and base64, its default), the `ollama` client (`embed`, `embeddings`), LangChain's
`OpenAIEmbeddings` and `OllamaEmbeddings`. Also: routing, retries and fallbacks through the one
policy loop, what each upstream kind is sent, and the refusals svir makes before sending."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
import tiktoken
from langchain_ollama import OllamaEmbeddings
from langchain_openai import OpenAIEmbeddings

from tests.support.embedder import Embedder, vector_of
from tests.support.inprocess import InProcess, serve

CONFIG = """
[[providers]]
name = "e"
kind = "openai-compatible"
base_url = "http://embed.test/v1"
discover = false
[providers.retry]
attempts = 3
backoff = 0.01

[[providers]]
name = "l"
kind = "llamacpp"
base_url = "http://llama.test"
discover = false

[[providers]]
name = "o"
kind = "ollama"
base_url = "http://ollama.test"
discover = false
embedding_models = ["nomic-embed-text"]

[[providers]]
name = "a"
kind = "anthropic"
api_key_env = "ANTHROPIC_TEST_KEY"
discover = false

[[routes]]
name = "code-embed"
targets = [{ model = "e/down" }]
fallbacks = ["e/ok"]

[[routes]]
name = "any-embed"
targets = [{ model = "a/claude" }, { model = "l/bge" }]
fallbacks = ["e/ok"]
"""


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with serve(tmp_path, CONFIG, Embedder(), {"ANTHROPIC_TEST_KEY": "sk-test"}) as s:
        yield s


def ollama_client(svir: InProcess) -> ollama.AsyncClient:
    return ollama.AsyncClient(host="http://svir", transport=httpx.ASGITransport(app=svir.app))


def floats32(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


async def test_openai_sdk_floats(svir: InProcess) -> None:
    got = await svir.client.embeddings.create(
        model="e/m", input=["def f(): pass", "class A: ..."], encoding_format="float"
    )
    assert [d.embedding for d in got.data] == [
        vector_of("def f(): pass"),
        vector_of("class A: ..."),
    ]
    assert [d.index for d in got.data] == [0, 1]
    assert got.model == "e/m"
    assert got.usage.prompt_tokens == got.usage.total_tokens == 4 + 4  # the upstream count
    sent = svir.bodies()[-1]
    assert sent == {
        "model": "m",
        "input": ["def f(): pass", "class A: ..."],
        "encoding_format": "float",
    }
    assert svir.transport.requests[-1].url == "http://embed.test/v1/embeddings"


async def test_openai_sdk_default_is_base64_and_decodes(svir: InProcess) -> None:
    seen: list[bytes] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request.content)

    svir.http.event_hooks["request"].append(record)
    got = await svir.client.embeddings.create(model="e/m", input="one text")
    assert b'"encoding_format":"base64"' in seen[-1]  # what the SDK asks by default
    assert got.data[0].embedding == vector_of("one text")


async def test_base64_is_little_endian_float32(svir: InProcess) -> None:
    r = await svir.http.post(
        "/v1/embeddings", json={"model": "e/m", "input": ["x"], "encoding_format": "base64"}
    )
    assert r.status_code == 200, r.text
    item = r.json()["data"][0]
    assert item["object"] == "embedding"
    assert floats32(item["embedding"]) == vector_of("x")


async def test_token_arrays_go_through(svir: InProcess) -> None:
    got = await svir.client.embeddings.create(
        model="e/m", input=[[1, 2, 3], [4]], encoding_format="float"
    )
    assert svir.bodies()[-1]["input"] == [[1, 2, 3], [4]]
    assert [d.embedding for d in got.data] == [vector_of([1, 2, 3]), vector_of([4])]
    assert got.usage.prompt_tokens == 4


async def test_llamacpp_gets_base64_which_a_base64_client_gets_as_it_came(
    svir: InProcess,
) -> None:
    r = await svir.http.post(
        "/v1/embeddings", json={"model": "l/bge", "input": ["a", "b"], "encoding_format": "base64"}
    )
    assert r.status_code == 200, r.text
    assert svir.bodies()[-1]["encoding_format"] == "base64"
    assert svir.transport.requests[-1].url == "http://llama.test/v1/embeddings"
    assert [floats32(d["embedding"]) for d in r.json()["data"]] == [vector_of("a"), vector_of("b")]
    floats = await svir.client.embeddings.create(model="l/bge", input="a", encoding_format="float")
    assert floats.data[0].embedding == vector_of("a")


async def test_dimensions_passed_where_honoured_refused_where_not(svir: InProcess) -> None:
    await svir.client.embeddings.create(model="e/m", input="a", dimensions=4)
    assert svir.bodies()[-1]["dimensions"] == 4
    before = len(svir.transport.requests)
    with pytest.raises(openai.BadRequestError) as info:
        await svir.client.embeddings.create(model="l/bge", input="a", dimensions=4)
    assert info.value.code == "unsupported_parameter"
    assert "dimensions" in info.value.message and "'l'" in info.value.message
    assert len(svir.transport.requests) == before  # refused before anything was sent


async def test_a_provider_without_embeddings_is_refused(svir: InProcess) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await svir.client.embeddings.create(model="a/claude", input="a")
    assert info.value.code == "unsupported_input"
    assert "no embeddings API" in info.value.message
    assert svir.transport.requests == []


async def test_unknown_provider_is_a_404(svir: InProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        await svir.client.embeddings.create(model="nope/m", input="a")


async def test_retries_then_serves(svir: InProcess) -> None:
    got = await svir.client.embeddings.create(model="e/flaky-2", input="a", encoding_format="float")
    assert got.data[0].embedding == vector_of("a")
    assert len(svir.transport.requests) == 3
    assert len(svir.slept) == 2  # two backoffs, on the injected clock


async def test_route_falls_back(svir: InProcess) -> None:
    r = await svir.http.post("/v1/embeddings", json={"model": "code-embed", "input": "a"})
    assert r.status_code == 200, r.text
    assert r.headers["x-svir-served-model"] == "e/ok"
    assert [q.model for q in svir.transport.requests] == ["down", "down", "down", "ok"]


async def test_a_deployment_that_cannot_take_it_goes_on_to_the_next(svir: InProcess) -> None:
    # Anthropic has no embeddings, llama.cpp no dimensions: whichever is picked, the fallback
    # serves, and nothing was sent anywhere else.
    r = await svir.http.post(
        "/v1/embeddings", json={"model": "any-embed", "input": "a", "dimensions": 4}
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-svir-served-model"] == "e/ok"
    assert [q.url for q in svir.transport.requests] == ["http://embed.test/v1/embeddings"]


async def test_every_upstream_failing_is_the_error(svir: InProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await svir.client.embeddings.create(model="e/down", input="a")
    assert info.value.status_code == 502  # as for chat: the upstream failed, not svir


async def test_an_answer_missing_a_vector_is_a_protocol_error(svir: InProcess) -> None:
    r = await svir.http.post("/v1/embeddings", json={"model": "e/short", "input": ["a", "b"]})
    assert r.status_code == 502
    assert "1 vectors for 2 inputs" in r.json()["error"]["message"]


async def test_usage_estimated_when_the_upstream_gives_none(svir: InProcess) -> None:
    got = await svir.client.embeddings.create(model="e/no-usage", input="abcdefgh")
    assert got.usage.prompt_tokens == 3  # 8 characters are 2 tokens, and one of its own


# Ollama


async def test_ollama_client_embed(svir: InProcess) -> None:
    client = ollama_client(svir)
    got = await client.embed(model="e/m:latest", input=["a", "b"])
    assert got.embeddings == [vector_of("a"), vector_of("b")]
    assert got.model == "e/m:latest"
    assert got.prompt_eval_count == 4
    assert got.total_duration is not None and got.total_duration > 0
    assert svir.bodies()[-1]["model"] == "m"


async def test_ollama_client_embeddings_legacy(svir: InProcess) -> None:
    got = await ollama_client(svir).embeddings(model="e/m", prompt="hello")
    assert list(got.embedding) == vector_of("hello")


async def test_ollama_upstream_gets_its_own_api_embed(svir: InProcess) -> None:
    got = await ollama_client(svir).embed(
        model="o/nomic-embed-text", input="a", truncate=False, keep_alive="5m"
    )
    assert got.embeddings == [vector_of("a")]
    assert svir.transport.requests[-1].url == "http://ollama.test/api/embed"
    assert svir.bodies()[-1] == {
        "model": "nomic-embed-text",
        "input": ["a"],
        "truncate": False,
        "keep_alive": "5m",
    }
    r = await svir.http.post("/v1/embeddings", json={"model": "o/nomic-embed-text", "input": [[1]]})
    assert r.status_code == 400
    assert "token arrays" in r.json()["error"]["message"]


async def test_ollama_errors_in_ollama_shape(svir: InProcess) -> None:
    r = await svir.http.post("/api/embed", json={"model": "e/m"})
    assert r.status_code == 400 and r.json() == {"error": "input is required"}
    r = await svir.http.post("/api/embeddings", json={"model": "e/m", "prompt": 3})
    assert r.status_code == 400 and "prompt must be a string" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as info:
        await ollama_client(svir).embed(model="e/down", input="a")
    assert info.value.status_code == 502  # as for chat: the upstream failed, not svir


# LangChain


async def test_langchain_openai_embeddings_plain_text(svir: InProcess) -> None:
    lc = OpenAIEmbeddings(
        model="e/m",
        api_key="k",  # type: ignore[arg-type]
        base_url="http://svir/v1",
        http_async_client=svir.http,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    got = await lc.aembed_documents(["a", "b", "c"])
    assert got == [vector_of("a"), vector_of("b"), vector_of("c")]
    assert svir.bodies()[-1]["input"] == ["a", "b", "c"]


async def test_langchain_openai_embeddings_default_sends_token_arrays(
    svir: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default LangChain tokenizes with tiktoken, which downloads its encodings from the
    internet (refused here): a byte-level encoding built in place stands in for cl100k_base, and
    what LangChain then sends (token arrays) goes through to the upstream as sent."""
    ranks = {bytes([i]): i for i in range(256)}
    local = tiktoken.Encoding(name="bytes", pat_str=r".+", mergeable_ranks=ranks, special_tokens={})
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: local)
    lc = OpenAIEmbeddings(
        model="e/m",
        api_key="k",  # type: ignore[arg-type]
        base_url="http://svir/v1",
        http_async_client=svir.http,
        max_retries=0,
    )
    got = await lc.aembed_documents(["hi"])
    sent = svir.bodies()[-1]
    assert sent["input"] == [[104, 105]]
    assert len(got[0]) == len(vector_of([104, 105]))


async def test_langchain_ollama_embeddings(svir: InProcess) -> None:
    lc = OllamaEmbeddings(
        model="e/m",
        base_url="http://svir",
        async_client_kwargs={"transport": httpx.ASGITransport(app=svir.app)},
    )
    assert await lc.aembed_documents(["a", "b"]) == [vector_of("a"), vector_of("b")]
    assert await lc.aembed_query("q") == vector_of("q")
