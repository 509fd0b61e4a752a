"""`POST /v1/completions` through the whole app in process, driven by the OpenAI SDK: each kind's
completion endpoint and body (llama-server's `/completion` and `/infill`, OpenAI-compatible
`/v1/completions`), the stream and the object back, FIM refused where no upstream fills in the
middle, and the policy (retries, fallback, key limits) around a completion as around a chat.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.inprocess import serve
from tests.support.mock_transport import MockRequest, MockResponse, sse

CONFIG = """
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://lab.test"
discover = false

[[providers]]
name = "vl"
kind = "vllm"
base_url = "http://vl.test/v1"
discover = false

[[providers]]
name = "oc"
kind = "openai-compatible"
base_url = "http://oc.test/v1"
discover = false

[[providers]]
name = "ocfim"
kind = "openai-compatible"
base_url = "http://ocfim.test/v1"
discover = false
fim = true

[[providers]]
name = "claude"
kind = "anthropic"
api_key_env = "ANTHROPIC_KEY"
discover = false

[[routes]]
name = "coder"
targets = [{ model = "vl/broken" }]
fallbacks = ["lab/qwen-coder"]
"""

ENV = {"ANTHROPIC_KEY": "sk-ant"}


def llama_stream(*pieces: str, stop_type: str = "limit") -> list[bytes]:
    """llama-server's native stream, as the real server writes it (see the module of the wire
    core): a frame per token, the last with `stop: true` and the counts."""
    frames: list[Any] = [{"index": 0, "content": p, "stop": False} for p in pieces]
    frames.append(
        {
            "index": 0,
            "content": "",
            "stop": True,
            "model": "/models/qwen.gguf",
            "tokens_predicted": len(pieces),
            "tokens_evaluated": 7,
            "stop_type": stop_type,
            "timings": {"cache_n": 2, "prompt_n": 5},
        }
    )
    return sse(*frames)


def openai_stream(*pieces: str, finish: str = "stop") -> list[bytes]:
    head = {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "m"}
    frames: list[Any] = [
        {**head, "choices": [{"index": 0, "text": p, "finish_reason": None}]} for p in pieces
    ]
    frames.append({**head, "choices": [{"index": 0, "text": "", "finish_reason": finish}]})
    frames.append({**head, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    return [*sse(*frames), b"data: [DONE]\n\n"]


NO_INFILL = {
    "error": {
        "code": 501,
        "message": "Infill is not supported by this model: prefix token is missing. "
        "suffix token is missing. middle token is missing. ",
        "type": "not_supported_error",
    }
}


def upstream(request: MockRequest) -> MockResponse:
    path = request.path
    model = request.model or ""
    if path.endswith("/infill"):
        if model == "gemma":
            return MockResponse.json(NO_INFILL, 501)
        return MockResponse(body=llama_stream("return ", "a + b"))
    if path.endswith("/completion"):
        return MockResponse(body=llama_stream(" Paris", ".", stop_type="eos"))
    if path.endswith("/v1/completions"):
        if model == "broken":
            return MockResponse.json({"error": {"message": "down"}}, 503)
        if "suffix" in request.json() and request.url.startswith("http://vl.test"):
            msg = {"error": {"message": "suffix is not currently supported", "code": 400}}
            return MockResponse.json(msg, 400)
        return MockResponse(body=openai_stream("Hel", "lo"))
    return MockResponse.json({"error": {"message": "no route"}}, 404)


@pytest.fixture
async def svir(tmp_path: Path) -> Any:
    async with serve(tmp_path, CONFIG, upstream, ENV) as app:
        yield app


async def test_llama_completion_goes_to_native_completion(svir: Any) -> None:
    done = await svir.client.completions.create(
        model="lab/qwen-coder", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert done.object == "text_completion"
    assert done.choices[0].text == " Paris."
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (
        7,
        2,
    )
    assert done.model == "lab/qwen-coder"
    sent = svir.transport.requests[-1]
    assert sent.url == "http://lab.test/completion"
    body = sent.json()
    assert body["prompt"] == "The capital of France is"
    assert body["n_predict"] == 5 and body["temperature"] == 0 and body["stream"] is True
    assert "max_tokens" not in body and "suffix" not in body


async def test_llama_fim_goes_to_infill_streamed(svir: Any) -> None:
    stream = await svir.client.completions.create(
        model="lab/qwen-coder",
        prompt="def add(a, b):\n    ",
        suffix="\n\nprint(add(1, 2))",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "return a + b"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
    assert all(c.object == "text_completion" for c in chunks)
    sent = svir.transport.requests[-1]
    assert sent.url == "http://lab.test/infill"
    body = sent.json()
    assert body["input_prefix"] == "def add(a, b):\n    "
    assert body["input_suffix"] == "\n\nprint(add(1, 2))"
    assert "prompt" not in body


async def test_model_without_fim_tokens_is_a_400_naming_it(svir: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await svir.client.completions.create(model="lab/gemma", prompt="a", suffix="b")
    err = caught.value.body
    assert isinstance(err, dict)
    assert err["code"] == "unsupported_input" and err["param"] == "suffix"
    assert "'lab/gemma' cannot fill in the middle" in err["message"]
    assert "Infill is not supported by this model" in err["message"]


async def test_suffix_to_a_server_not_known_to_fill_in_is_refused_before_sending(
    svir: Any,
) -> None:
    before = len(svir.transport.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        await svir.client.completions.create(model="oc/m", prompt="a", suffix="b")
    assert "'oc/m' cannot fill in the middle" in str(caught.value)
    assert "fim = true" in str(caught.value)
    assert len(svir.transport.requests) == before  # nothing sent: no silently wrong prompt


async def test_fim_setting_sends_the_suffix_to_v1_completions(svir: Any) -> None:
    done = await svir.client.completions.create(model="ocfim/m", prompt="a", suffix="b")
    assert done.choices[0].text == "Hello"
    sent = svir.transport.requests[-1]
    assert sent.url == "http://ocfim.test/v1/completions"
    body = sent.json()
    assert (body["prompt"], body["suffix"], body["max_tokens"]) == ("a", "b", 16)
    assert body["stream_options"] == {"include_usage": True}


async def test_empty_suffix_is_a_plain_completion(svir: Any) -> None:
    done = await svir.client.completions.create(model="oc/m", prompt="a", suffix="")
    assert done.choices[0].text == "Hello"
    assert "suffix" not in svir.transport.requests[-1].json()


async def test_vllm_suffix_refusal_is_explained(svir: Any) -> None:
    # vLLM refuses any suffix; with `fim` left to the kind svir does not send one at all.
    with pytest.raises(openai.BadRequestError) as caught:
        await svir.client.completions.create(model="vl/m", prompt="a", suffix="b")
    assert "'vl/m' cannot fill in the middle" in str(caught.value)


async def test_kind_without_completions_is_a_400(svir: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await svir.client.completions.create(model="claude/claude-haiku", prompt="a")
    assert "does not take text completions" in str(caught.value)
    assert svir.transport.requests == []


async def test_route_falls_back_to_the_next_model(svir: Any) -> None:
    done = await svir.client.completions.create(model="coder", prompt="x", max_tokens=3)
    assert done.choices[0].text == " Paris."
    urls = [r.url for r in svir.transport.requests]
    assert urls[0] == "http://vl.test/v1/completions"
    assert urls[-1] == "http://lab.test/completion"


async def test_streamed_failure_before_text_is_an_http_error(svir: Any) -> None:
    r = await svir.http.post(
        "/v1/completions", json={"model": "vl/broken", "prompt": "x", "stream": True}
    )
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_error"


async def test_midstream_error_is_one_error_frame(tmp_path: Path) -> None:
    def broken(request: MockRequest) -> MockResponse:
        frames = sse({"content": "par", "stop": False}, {"error": {"code": 500, "message": "boom"}})
        return MockResponse(body=frames)

    async with serve(tmp_path, CONFIG, broken, ENV) as app:
        r = await app.http.post(
            "/v1/completions", json={"model": "lab/x", "prompt": "p", "stream": True}
        )
    assert r.status_code == 200
    frames = [f for f in r.text.split("\n\n") if f]
    assert frames[0].startswith("data: {") and '"text":"par"' in frames[0]
    assert frames[-1].startswith('data: {"error":') and "boom" in frames[-1]
    assert "[DONE]" not in r.text


async def test_stream_cut_before_stop_is_not_a_success(tmp_path: Path) -> None:
    def cut(request: MockRequest) -> MockResponse:
        return MockResponse(body=sse({"content": "par", "stop": False}))

    async with serve(tmp_path, CONFIG, cut, ENV) as app:
        r = await app.http.post("/v1/completions", json={"model": "lab/x", "prompt": "p"})
    assert r.status_code == 502
    assert "ended before its end" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "lab/x"}, "prompt"),
        ({"model": "lab/x", "prompt": [1, 2, 3]}, "prompt"),
        ({"model": "lab/x", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "lab/x", "prompt": "a", "echo": True}, "echo"),
        ({"model": "lab/x", "prompt": "a", "logprobs": 2}, "logprobs"),
        ({"model": "lab/x", "prompt": "a", "n": 2}, "n"),
        ({"model": "lab/x", "prompt": "a", "best_of": 3}, "best_of"),
        ({"model": "lab/x", "prompt": "a", "max_tokens": 0}, "max_tokens"),
        ({"model": "lab/x", "prompt": "a", "suffix": 3}, "suffix"),
        ({"model": "lab/x", "prompt": "a", "stop": [1]}, "stop[0]"),
        ({"model": "lab/x", "prompt": "a", "temperature": "hot"}, "temperature"),
        ({"prompt": "a"}, "model"),
    ],
)
async def test_bad_requests_are_400_naming_the_field(
    svir: Any, body: dict[str, Any], param: str
) -> None:
    r = await svir.http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert svir.transport.requests == []


async def test_logprobs_refusal_reads_clearly_to_the_sdk(svir: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="log-probabilities"):
        await svir.client.completions.create(model="lab/x", prompt="a", logprobs=1)


async def test_unknown_provider_is_404(svir: Any) -> None:
    r = await svir.http.post("/v1/completions", json={"model": "nope/x", "prompt": "a"})
    assert r.status_code == 404


async def test_object_carries_what_strict_clients_read(svir: Any) -> None:
    # The raw answer carries what strict clients read: id, created, choices[0].logprobs.
    r = await svir.http.post("/v1/completions", json={"model": "lab/m", "prompt": "p"})
    obj = r.json()
    assert obj["id"].startswith("cmpl-")
    assert obj["choices"] == [
        {"text": " Paris.", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    assert obj["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert r.headers["x-svir-served-model"] == "lab/m"
