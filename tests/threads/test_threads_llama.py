"""Threads over the real llama.cpp server (Gemma 3 270M): several turns, a tool round trip, and a
thread that outgrows the model's context. The model is tiny and answers nonsense; these tests
check what svir keeps and sends, not what the model says."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from svir.edges.llama_server import LlamaServer
from tests.support.svir_proc import SvirProcess
from tests.threads.conftest import STORES, store_url
from tests.threads.support import Threads

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

# llama.cpp reuses a cached prompt prefix, which changes the greedy pick on this tiny model.
GEN = {"temperature": 0, "max_tokens": 16, "cache_prompt": False}
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


@pytest.fixture(scope="module", params=STORES)
def svir(
    request: pytest.FixtureRequest,
    llama_server: LlamaServer,
    llama_server_small_ctx: LlamaServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp(f"threads-llama-{request.param}")
    postgres = request.getfixturevalue("postgres") if request.param == "postgres" else None
    config = f"""
[store]
url = "{store_url(request.param, tmp, postgres)}"

[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{llama_server.base_url}"

[[providers]]
name = "tiny"
kind = "llamacpp"
base_url = "{llama_server_small_ctx.base_url}"
discover = false
"""
    with SvirProcess(config, tmp) as proc:
        yield proc


@pytest.fixture
def api(svir: SvirProcess) -> Threads:
    return Threads(svir.base_url, timeout=120)


def test_several_turns_carry_the_whole_conversation(api: Threads) -> None:
    tid = api.create(model="lab/gemma-3-270m", system="You are a helpful assistant.")["id"]
    api.say(tid, "My name is Ada. Say hello to me.")
    first = api.stream(tid, **GEN)
    assert first[-1]["type"] == "done", first[-1]
    answer = "".join(f["text"] for f in first if f["type"] == "delta")
    assert answer.strip() and first[-1]["appended"] == answer
    usage1 = next(f for f in first if f["type"] == "usage")

    api.say(tid, "What is my name?")
    second = api.continue_(tid, **GEN).json()
    assert second["type"] == "done", second
    thread = api.get(tid)
    roles = [m["role"] for m in thread["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert thread["messages"][1]["content"] == [{"type": "text", "text": answer}]
    assert thread["messages"][3]["id"] == second["message_id"]
    # The second prompt held the first exchange: it is longer by at least the first answer.
    usage2 = thread["messages"][3]["usage"]
    assert usage2["prompt_tokens"] >= usage1["prompt_tokens"] + usage1["completion_tokens"]

    api.say(tid, "Thanks.")
    third = api.stream(tid, **GEN)
    assert third[-1]["type"] == "done"
    assert (
        thread["messages"][3]["usage"]["prompt_tokens"]
        < api.get(tid)["messages"][5]["usage"]["prompt_tokens"]
    )


def test_tool_call_round_trip(api: Threads) -> None:
    tid = api.create(model="lab/gemma-3-270m")["id"]
    api.say(tid, "What is the weather in Paris?")
    frames = api.stream(tid, tools=[WEATHER_TOOL], temperature=0, max_tokens=64)
    calls = [f for f in frames if f["type"] == "tool_call"]
    assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "tool_calls", frames
    assert calls and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)
    for call in calls:
        r = api.post(
            tid,
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": {"city": "Paris", "sky": "clear", "celsius": 21},
            },
        )
        assert r.status_code == 200, r.text
    done = api.continue_(tid, tools=[WEATHER_TOOL], temperature=0, max_tokens=32).json()
    assert done["type"] == "done", done
    assert api.roles(tid) == ["user", "assistant"] + ["tool"] * len(calls) + ["assistant"]


def test_a_thread_that_outgrows_the_context_is_context_length_exceeded(api: Threads) -> None:
    tid = api.create(model="tiny/gemma")["id"]
    api.say(tid, "Say hi.")
    first = api.continue_(tid, temperature=0, max_tokens=8).json()
    assert first["type"] == "done", first
    api.say(tid, "hello " * 600)
    for stream in (False, True):
        r = api.continue_(tid, stream=stream, max_tokens=8)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["type"] == "error" and body["appended"] is None
        error = body["error"]
        assert error["code"] == "context_length_exceeded"
        sizes = error["sizes"]
        assert sizes["context_tokens"] == 256 and sizes["prompt_tokens"] > 256
        assert sizes["messages"] == 3
    assert api.roles(tid) == ["user", "assistant", "user"] and not api.get(tid)["busy"]
