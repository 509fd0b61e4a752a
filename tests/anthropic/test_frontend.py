"""The Messages front end through the whole svir app (`build_app`, every front end and the keys
guard) in this process, driven by the official `anthropic` SDK over ASGI, with the upstream a
`tests.support.mock_transport.MockTransport` whose handler plays an OpenAI-compatible server: each model id is a
behaviour (see `Upstream`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from svir.config.load import parse_config
from svir.server import build_app
from tests.support.asgi import Lifespan
from tests.support.inprocess import InProcess
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport, sse
from tests.support.upstream import broken, token_stream

ADMIN_KEY = "admin-test-key-0123456789"
CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
models = ["ok"]
[providers.retry]
attempts = 1

[[providers]]
name = "blind"
kind = "openai-compatible"
base_url = "http://upstream.test/v1"
discover = false
images = false

[[routes]]
name = "claude-sonnet-4-5"
targets = [{ model = "up/ok" }]

[[routes]]
name = "claude-haiku-4-5"
targets = [{ model = "up/tools" }]
"""


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 5,
    "prompt_tokens_details": {"cached_tokens": 10},
}


class Upstream:
    """The scripted OpenAI-compatible server: every request kept, each model id a behaviour."""

    def __init__(self) -> None:
        self.requests: list[MockRequest] = []

    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if r.method == "POST"]

    def __call__(self, request: MockRequest) -> MockResponse:
        self.requests.append(request)
        model = request.json().get("model")
        if model == "ok":
            return MockResponse(body=token_stream("m", ["hello", " world"]))
        if model == "thinks":
            return MockResponse(
                body=sse(
                    chunk({"role": "assistant", "reasoning_content": "Let me "}),
                    chunk({"reasoning_content": "think."}),
                    chunk({"content": "Forty-two."}),
                    chunk({}, "stop"),
                    chunk({}, None, usage=USAGE) | {"choices": []},
                    "[DONE]",
                )
            )
        if model == "tools":
            call = {"index": 0, "id": "call_1", "type": "function"}
            return MockResponse(
                body=sse(
                    chunk({"role": "assistant", "content": "Checking."}),
                    chunk({"tool_calls": [call | {"function": {"name": "weather"}}]}),
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ':"Oslo"}'}}]}),
                    # The server's finish says stop after a tool call, as many do.
                    chunk({}, "stop"),
                    "[DONE]",
                )
            )
        if model == "overflow":
            message = (
                "This model's maximum context length is 8 tokens. However, your messages "
                "resulted in 20 tokens."
            )
            return MockResponse.json(
                {"error": {"message": message, "code": "context_length_exceeded"}}, 400
            )
        if model == "late-break":
            return MockResponse(body=broken(token_stream("m", ["partial"])[:2]))
        raise AssertionError(f"unscripted model {model!r}")


class Svir(InProcess):
    def __init__(self, tmp: Path, extra: str = "") -> None:
        self.upstream = Upstream()
        super().__init__(tmp, CONFIG + extra, self.upstream, {"SVIR_ADMIN_KEY": ADMIN_KEY})
        # The Anthropic SDK takes its own httpx (httpx2), not the harness's.
        self.http2 = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=self.app), base_url="http://svir", timeout=20
        )

    def anthropic(self, api_key: str = "unused", **kw: Any) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key=api_key, base_url="http://svir", max_retries=0, http_client=self.http2, **kw
        )

    async def new_key(self, **spec: Any) -> str:
        r = await self.http.post(
            "/admin/keys",
            json={"name": "t", **spec},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert r.status_code == 201, r.text
        key: str = r.json()["key"]
        return key

    async def stop(self) -> None:
        await self.http2.aclose()
        await super().stop()


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[Svir]:
    s = Svir(tmp_path)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


HI = [{"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {
        "name": "weather",
        "description": "The weather in a city.",
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"city": {"type": "string"}},
        },
    }
]


async def test_create_answers_a_message(svir: Svir) -> None:
    m = await svir.anthropic().messages.create(model="up/ok", max_tokens=64, messages=HI)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "hello world"  # type: ignore[union-attr]
    assert m.stop_reason == "end_turn" and m.role == "assistant" and m.model == "up/ok"


async def test_stream_assembles_thinking_text_and_usage(svir: Svir) -> None:
    async with svir.anthropic().messages.stream(model="up/thinks", max_tokens=64, messages=HI) as s:
        texts = [e.text async for e in s if e.type == "text"]
        m = await s.get_final_message()
    assert "".join(texts) == "Forty-two."
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Let me think."  # type: ignore[union-attr]
    assert m.usage.input_tokens == 20 and m.usage.cache_read_input_tokens == 10
    assert m.usage.output_tokens == 5


async def test_stream_assembles_a_tool_call_with_tool_use_stop(svir: Svir) -> None:
    client = svir.anthropic()
    async with client.messages.stream(
        model="up/tools", max_tokens=64, messages=HI, tools=TOOLS
    ) as s:
        m = await s.get_final_message()
    assert [b.type for b in m.content] == ["text", "tool_use"]
    call = m.content[1]
    assert call.name == "weather" and call.input == {"city": "Oslo"}  # type: ignore[union-attr]
    assert m.stop_reason == "tool_use"
    created = await client.messages.create(
        model="up/tools", max_tokens=64, messages=HI, tools=TOOLS
    )
    assert created.stop_reason == "tool_use"
    assert created.content[1].input == {"city": "Oslo"}  # type: ignore[union-attr]


async def test_the_upstream_gets_the_translated_request_and_no_client_headers(
    svir: Svir,
) -> None:
    client = svir.anthropic(default_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    history: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"}],
        },
    ]
    await client.messages.create(
        model="up/ok",
        max_tokens=64,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=history,
        tools=TOOLS,
    )
    (request,) = svir.upstream.requests
    assert not any(k.lower().startswith(("anthropic", "x-api-key")) for k in request.headers)
    body = request.json()
    assert body["model"] == "ok"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert body["messages"][0]["content"] == "Be brief."
    assistant = body["messages"][2]
    assert assistant["reasoning_content"] == "Use the tool."
    assert assistant["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
    }
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"}
    (tool,) = body["tools"]
    assert "$schema" not in tool["function"]["parameters"]


async def test_beta_query_is_the_same_route_and_warnings_go_in_a_header(svir: Svir) -> None:
    r = await svir.http.post(
        "/v1/messages?beta=true",
        json={"model": "up/ok", "max_tokens": 8, "messages": HI, "context_management": {}},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == "hello world"
    assert "context_management ignored" in r.headers["x-svir-warning"]


async def test_an_alias_maps_a_claude_model(svir: Svir) -> None:
    m = await svir.anthropic().messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HI)
    assert m.model == "claude-sonnet-4-5"
    assert svir.upstream.bodies()[0]["model"] == "ok"


async def test_an_unmapped_claude_model_is_a_404_saying_what_to_configure(svir: Svir) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await svir.anthropic().messages.create(model="claude-opus-4-1", max_tokens=8, messages=HI)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert '[[routes]] name = "claude-opus-4-1"' in body["error"]["message"]


async def test_an_overflow_is_a_bad_request_saying_prompt_is_too_long(svir: Svir) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await svir.anthropic().messages.create(model="up/overflow", max_tokens=8, messages=HI)
    assert "prompt is too long: 20 tokens > 8 maximum" in caught.value.message
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"


async def test_a_stream_broken_after_output_ends_in_one_error_event(svir: Svir) -> None:
    r = await svir.http.post(
        "/v1/messages",
        json={"model": "up/late-break", "max_tokens": 8, "messages": HI, "stream": True},
    )
    assert r.status_code == 200
    names = [line[7:] for line in r.text.split("\n") if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "error" and names.count("error") == 1
    with pytest.raises(anthropic.APIStatusError):
        async with svir.anthropic().messages.stream(
            model="up/late-break", max_tokens=8, messages=HI
        ) as s:
            await s.get_final_message()


async def test_bad_input_is_a_400_in_anthropics_shape(svir: Svir) -> None:
    r = await svir.http.post("/v1/messages", content=b"{not json")
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as caught:
        await svir.anthropic().messages.create(
            model="up/ok",
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}],
                }
            ],
        )
    assert "messages.0.content.0.tool_use_id" in caught.value.message
    assert svir.upstream.requests == []


async def test_an_image_url_to_an_upstream_without_images_is_refused(svir: Svir) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        await svir.anthropic().messages.create(
            model="blind/ok",
            max_tokens=8,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],
        )
    assert "does not take images" in caught.value.message
    assert svir.upstream.requests == []


async def test_a_body_over_the_limit_and_an_unknown_path_answer_in_anthropics_shape(
    tmp_path: Path,
) -> None:
    s = Svir(tmp_path, "\n[server]\nmax_body_bytes = 1024\n")
    await s.start()
    try:
        r = await s.http.post("/v1/messages", content=b"x" * 2048)
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        r = await s.http.post("/v1/messages/batches", json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    finally:
        await s.stop()


async def test_count_tokens_estimates_and_says_so(svir: Svir) -> None:
    client = svir.anthropic()
    small = await client.messages.with_raw_response.count_tokens(model="up/ok", messages=HI)
    assert small.headers["x-svir-token-count"] == "estimate"
    counted = (await small.parse()).input_tokens
    big = await client.messages.count_tokens(
        model="up/ok", messages=HI, tools=TOOLS, system="You are a careful assistant. " * 20
    )
    assert 0 < counted < big.input_tokens
    assert svir.upstream.requests == []  # an OpenAI-compatible server cannot count


async def test_models_list_in_anthropics_shape_with_anthropic_version(svir: Svir) -> None:
    page = await svir.anthropic().models.list()
    ids = [m.id for m in page.data]
    assert "up/ok" in ids
    assert all(m.type == "model" for m in page.data)
    r = await svir.http.get("/v1/models")  # no anthropic-version: OpenAI's shape
    assert r.json()["object"] == "list" and r.json()["data"][0]["object"] == "model"
    raw = await svir.http.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    listed = raw.json()
    assert listed["has_more"] is False
    assert listed["first_id"] == listed["data"][0]["id"]
    assert listed["last_id"] == listed["data"][-1]["id"]


async def test_the_root_answers_200(svir: Svir) -> None:
    assert (await svir.http.head("/")).status_code == 200
    assert (await svir.http.get("/")).status_code == 200


async def test_svir_keys_by_x_api_key_and_their_errors(svir: Svir) -> None:
    key = await svir.new_key(rpm=1)
    m = await svir.anthropic(api_key=key).messages.create(model="up/ok", max_tokens=8, messages=HI)
    assert m.content[0].text == "hello world"  # type: ignore[union-attr]
    with pytest.raises(anthropic.RateLimitError) as limited:
        await svir.anthropic(api_key=key).messages.create(model="up/ok", max_tokens=8, messages=HI)
    body = limited.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error"
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await svir.anthropic(api_key="sk-wrong").messages.create(
            model="up/ok", max_tokens=8, messages=HI
        )
    body = refused.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "authentication_error"
    # Bearer works too (ANTHROPIC_AUTH_TOKEN in Claude Code).
    bearer = await svir.new_key()
    client = anthropic.AsyncAnthropic(
        auth_token=bearer, base_url="http://svir", max_retries=0, http_client=svir.http2
    )
    assert (await client.messages.create(model="up/ok", max_tokens=8, messages=HI)).content


LLAMA = """
[[providers]]
name = "llama"
kind = "llamacpp"
base_url = "http://llama.test"
discover = false
"""


async def test_count_tokens_is_exact_where_llama_cpp_tokenizes(tmp_path: Path) -> None:
    posted: list[tuple[str, dict[str, Any]]] = []
    sent_headers: list[dict[str, str]] = []

    def llama(request: MockRequest) -> MockResponse:
        body = request.json()
        posted.append((request.url, body))
        sent_headers.append({k.lower(): v for k, v in request.headers.items()})
        if request.url.endswith("/apply-template"):
            return MockResponse.json({"prompt": "<start>" + body["messages"][-1]["content"]})
        if request.url.endswith("/tokenize"):
            if "broken" in body["content"]:
                return MockResponse.json({"error": {"message": "no"}}, 500)
            return MockResponse.json({"tokens": list(range(len(body["content"])))})
        raise AssertionError(request.url)

    # Asked as a chat call asks: the provider's key and extra headers, svir's request id.
    own = 'api_key_env = "LLAMA_KEY"\nextra_headers = { "X-Team" = "blue" }\n'
    text = LLAMA + own + f'\n[store]\nurl = "sqlite:///{tmp_path / "svir.db"}"\n'
    app = build_app(
        parse_config(text), {"LLAMA_KEY": "llama-key-5"}, transport=MockTransport(llama)
    )
    lifespan = Lifespan(app)
    await lifespan.start()
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://svir")
    try:
        client = anthropic.AsyncAnthropic(
            api_key="x", base_url="http://svir", max_retries=0, http_client=http
        )
        raw = await client.messages.with_raw_response.count_tokens(
            model="llama/gemma", system="Be brief.", messages=HI, tools=TOOLS
        )
        assert raw.headers["x-svir-token-count"] == "exact"
        assert (await raw.parse()).input_tokens == len("<start>hi")
        (template_url, template), (tokenize_url, tokenize) = posted
        assert template_url == "http://llama.test/apply-template"
        assert tokenize_url == "http://llama.test/tokenize"
        assert template["messages"][0] == {"role": "system", "content": "Be brief."}
        assert template["tools"][0]["function"]["name"] == "weather"
        assert tokenize == {"content": "<start>hi", "add_special": True}
        for headers in sent_headers:
            assert headers["authorization"] == "Bearer llama-key-5"
            assert headers["x-team"] == "blue"
            assert headers["x-request-id"] == raw.headers["x-request-id"]
        # A tokenizer that fails leaves svir's estimate, said so.
        raw = await client.messages.with_raw_response.count_tokens(
            model="llama/gemma", messages=[{"role": "user", "content": "broken"}]
        )
        assert raw.headers["x-svir-token-count"] == "estimate"
        assert (await raw.parse()).input_tokens > 0
    finally:
        await http.aclose()
        await lifespan.stop()
