"""Ollama's API end to end over emulated servers: the official `ollama` client drives a real svir
process, which drives the replay server playing the conformance corpus. The replay server records
what svir sent upstream, so the tests see both ends of the translation."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pydantic
import pytest

from tests.support.svir_proc import SvirProcess, free_port
from tests.support.upstream import CORPUS_DIR, ScriptedServer, ScriptedUpstream, status_model
from tests.support.waiting import PATIENCE

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"
HI = [{"role": "user", "content": "hi"}]


def spec(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CORPUS_DIR / f"{name}.json").read_text())
    return loaded


def run_chat(client: ollama.Client, model: str, *, stream: bool) -> None:
    """One chat, streamed to its end or not; for the errors it raises."""
    if stream:
        list(client.chat(model=model, messages=HI, stream=True))
    else:
        client.chat(model=model, messages=HI)


def tools_for(name: str) -> list[dict[str, Any]] | None:
    names = spec(name)["options"].get("tool_names")
    if not names:
        return None
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in names
    ]


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="event", pieces=3, drip=0.05)) as server:
        yield server


@pytest.fixture(scope="module")
def svir(replay: ScriptedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config = f"""
[server]
max_body_bytes = 200000

[[providers]]
name = "plain"
kind = "openai-compatible"
base_url = "{replay.base_url}"
think_tags = false
models = ["configured-model"]
[providers.retry]
attempts = 1  # the translation is under test here, not the retries

[[providers]]
name = "tags"
kind = "openai-compatible"
base_url = "{replay.base_url}"
think_tags = true
discover = false

[[providers]]
name = "relay"
kind = "openai-compatible"
base_url = "{replay.base_url}"
relay = true
discover = false

[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{replay.base_url}"
discover = false

[[providers]]
name = "dead"
kind = "openai-compatible"
base_url = "{dead}"
models = ["still-listed"]
[providers.retry]
attempts = 1

[[routes]]
name = "smart"
targets = [{{model = "plain/qwen3.8"}}]
"""
    with SvirProcess(config, tmp_path_factory.mktemp("svir-ollama")) as proc:
        yield proc


@pytest.fixture
def client(svir: SvirProcess) -> ollama.Client:
    return ollama.Client(host=svir.url, timeout=20)


def provider_for(name: str) -> str:
    return "tags" if spec(name)["options"]["think_tags"] else "plain"


def complete_cases() -> list[str]:
    return sorted(p.stem for p in CORPUS_DIR.glob("*.sse") if spec(p.stem)["expect"]["complete"])


def expected_calls(name: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["name"], json.loads(c["arguments"]) if c["arguments"] else {})
        for c in spec(name)["expect"]["tool_calls"]
    ]


# Chat


@pytest.mark.parametrize("name", complete_cases())
def test_streamed_chat_matches_the_corpus(client: ollama.Client, name: str) -> None:
    want = spec(name)["expect"]
    parts = list(
        client.chat(
            model=f"{provider_for(name)}/{name}", messages=HI, tools=tools_for(name), stream=True
        )
    )
    assert all(p.done is False for p in parts[:-1]) and parts[-1].done is True
    assert "".join(p.message.content or "" for p in parts) == want["answer"] + (
        want["refusal"] or ""
    )
    assert "".join(p.message.thinking or "" for p in parts) == want["reasoning"]
    calls = [tc for p in parts for tc in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == expected_calls(name)
    last = parts[-1]
    reason = want["finish_reason"]
    assert last.done_reason == ("stop" if reason == "tool_calls" else reason)
    usage = want["usage"]
    if usage is not None:
        assert last.eval_count == usage["completion_tokens"]
        assert last.prompt_eval_count == usage["prompt_tokens"]
    assert last.total_duration and last.total_duration > 0
    assert last.eval_duration is not None and last.prompt_eval_duration is not None
    assert last.model == f"{provider_for(name)}/{name}"


@pytest.mark.parametrize("name", complete_cases())
def test_chat_not_streamed_matches_the_corpus(client: ollama.Client, name: str) -> None:
    want = spec(name)["expect"]
    r = client.chat(model=f"{provider_for(name)}/{name}", messages=HI, tools=tools_for(name))
    assert r.done is True
    assert r.message.role == "assistant"
    assert r.message.content == want["answer"] + (want["refusal"] or "")
    assert (r.message.thinking or "") == want["reasoning"]
    calls = [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls or []]
    assert calls == expected_calls(name)
    reason = want["finish_reason"]
    assert r.done_reason == ("stop" if reason == "tool_calls" else reason)
    if want["usage"] is not None:
        assert r.eval_count == want["usage"]["completion_tokens"]
    assert r.created_at and r.created_at.endswith("Z")


def test_the_wire_is_ndjson(svir: SvirProcess) -> None:
    body = {"model": "plain/llama-cpp", "messages": HI}
    r = httpx.post(svir.url + "/api/chat", json=body, headers={"x-request-id": "ollama-1"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    assert r.headers["x-request-id"] == "ollama-1"
    assert r.content.endswith(b"\n")
    lines = [json.loads(line) for line in r.content.splitlines()]
    assert len(lines) > 2 and lines[-1]["done"] is True
    assert set(lines[-1]) >= {
        "model", "created_at", "message", "done", "done_reason", "total_duration",
        "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration",
    }  # fmt: skip
    r = httpx.post(svir.url + "/api/chat", json={**body, "stream": False})
    assert r.headers["content-type"] == "application/json"
    assert r.json()["message"]["thinking"] == spec("llama-cpp")["expect"]["reasoning"]


def test_relay_providers_serve_ollama_too(client: ollama.Client) -> None:
    text = "".join(
        p.message.content or "" for p in client.chat(model="relay/utf8", messages=HI, stream=True)
    )
    assert text == spec("utf8")["expect"]["answer"]


async def test_async_client_streams(svir: SvirProcess) -> None:
    client = ollama.AsyncClient(host=svir.url, timeout=20)
    text = ""
    async for part in await client.chat(model="plain/mlx-lm", messages=HI, stream=True):
        text += part.message.content or ""
    assert text == spec("mlx-lm")["expect"]["answer"]


# What reaches the upstream


def test_latest_tag_is_dropped_and_the_name_echoed(
    client: ollama.Client, replay: ScriptedServer
) -> None:
    r = client.chat(model="plain/llama-cpp:latest", messages=HI)
    assert replay.last.body["model"] == "llama-cpp"
    assert r.model == "plain/llama-cpp:latest"


def test_options_reach_the_upstream(client: ollama.Client, replay: ScriptedServer) -> None:
    client.chat(
        model="plain/llama-cpp",
        messages=HI,
        options={
            "temperature": 0.3,
            "top_p": 0.8,
            "num_predict": 7,
            "stop": ["END"],
            "seed": 5,
            "top_k": 3,
            "num_ctx": 2048,
        },
    )
    body = replay.last.body
    assert body["temperature"] == 0.3 and body["top_p"] == 0.8
    assert body["max_tokens"] == 7 and body["stop"] == ["END"] and body["seed"] == 5
    assert "top_k" not in body and "num_ctx" not in body and "options" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("think", "effort"), [(True, "medium"), (False, "none"), ("low", "low"), ("high", "high")]
)
def test_think_reaches_the_upstream_as_reasoning_effort(
    client: ollama.Client, replay: ScriptedServer, think: Any, effort: str
) -> None:
    client.chat(model="plain/llama-cpp", messages=HI, think=think)
    assert replay.last.body["reasoning_effort"] == effort


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_format_json_and_schema(client: ollama.Client, replay: ScriptedServer) -> None:
    client.chat(model="plain/llama-cpp", messages=HI, format="json")
    assert replay.last.body["response_format"] == {"type": "json_object"}
    schema = Person.model_json_schema()
    client.chat(model="plain/llama-cpp", messages=HI, format=schema)
    assert replay.last.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Person", "schema": schema},
    }


def test_images_go_upstream_as_typed_data_urls(
    client: ollama.Client, replay: ScriptedServer, tmp_path: Path
) -> None:
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(JPEG)
    client.chat(
        model="plain/mlx-vlm",
        messages=[{"role": "user", "content": "What is this?", "images": [PNG, photo]}],
    )
    content = replay.last.body["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()}},
    ]  # fmt: skip


def open_locker(locker: int) -> str:
    """Open a locker.

    Args:
      locker: The locker's number

    Returns:
      str: What happened
    """
    return f"locker {locker} is open"


def test_tools_round_trip(client: ollama.Client, replay: ScriptedServer) -> None:
    messages: list[Any] = [{"role": "user", "content": "Open locker 12."}]
    # The client turns a Python function into a tool.
    r = client.chat(model="plain/mlx-lm-tools", messages=messages, tools=[open_locker])
    sent_tools = replay.last.body["tools"]
    assert sent_tools[0]["type"] == "function"
    assert sent_tools[0]["function"]["name"] == "open_locker"
    assert sent_tools[0]["function"]["parameters"]["properties"]["locker"]["type"] == "integer"
    calls = r.message.tool_calls or []
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("open_locker", {"locker": 12})
    ]
    assert r.message.thinking  # mlx-lm sends the reasoning as `reasoning`
    # The client sends the call back (without its id) and the result by tool name.
    messages.append(r.message)
    messages.append({"role": "tool", "content": open_locker(12), "tool_name": "open_locker"})
    client.chat(model="plain/mlx-lm", messages=messages, tools=[open_locker])
    sent = replay.last.body["messages"]
    assert sent[1]["role"] == "assistant"
    [call] = sent[1]["tool_calls"]
    assert call["function"] == {"name": "open_locker", "arguments": '{"locker":12}'}
    assert call["id"] and call["type"] == "function"
    assert sent[2] == {"role": "tool", "tool_call_id": call["id"], "content": "locker 12 is open"}


def test_assistant_thinking_is_sent_back(client: ollama.Client, replay: ScriptedServer) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "thinking": "greet back"},
        {"role": "user", "content": "again"},
    ]
    client.chat(model="lab/llama-cpp", messages=messages)
    assert replay.last.body["messages"][1] == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "greet back",  # the key llama.cpp uses (§4)
    }


# Errors


def test_unknown_model_is_404(client: ollama.Client) -> None:
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as info:
            run_chat(client, "nowhere/model", stream=stream)
        assert info.value.status_code == 404
        assert "nowhere/model" in info.value.error


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ("llama-cpp-overflow-400", 400, "context"),
        ("openai-429", 429, ""),
        ("auth-401", 502, "credentials"),
        ("llama-cpp-image-500", 400, "image input is not supported"),
    ],
)
def test_upstream_errors_are_ollama_errors(
    client: ollama.Client, svir: SvirProcess, body: str, status: int, fragment: str
) -> None:
    model = f"plain/{status_model(body)}"
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as info:
            run_chat(client, model, stream=stream)
        assert info.value.status_code == status
        assert isinstance(info.value.error, str) and fragment in info.value.error
    answer = httpx.post(svir.url + "/api/chat", json={"model": model, "messages": HI}, timeout=20)
    assert set(answer.json()) == {"error"}
    if status == 429:
        assert "retry-after" in answer.headers


def test_error_before_output_is_an_http_error(client: ollama.Client) -> None:
    # LM Studio reports an overflow inside a 200 stream; nothing was shown, so it is a 400.
    with pytest.raises(ollama.ResponseError) as info:
        list(client.chat(model="plain/lmstudio-error", messages=HI, stream=True))
    assert info.value.status_code == 400


def test_error_after_output_is_a_final_error_line(svir: SvirProcess, client: ollama.Client) -> None:
    body = {"model": "plain/llama-cpp-error", "messages": HI}
    r = httpx.post(svir.url + "/api/chat", json=body, timeout=20)
    assert r.status_code == 200
    lines = [json.loads(line) for line in r.content.splitlines()]
    assert set(lines[-1]) == {"error"} and "peg-native" in lines[-1]["error"]
    assert sum("error" in line for line in lines) == 1
    assert not any(line.get("done") for line in lines)
    # The client raises it while iterating, after the parts before it.
    parts: list[Any] = []
    with pytest.raises(ollama.ResponseError) as info:
        for part in client.chat(model="plain/llama-cpp-error", messages=HI, stream=True):
            parts.append(part)
    assert parts and "peg-native" in info.value.error
    # Not streamed, the same failure is an HTTP error.
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="plain/llama-cpp-error", messages=HI)
    assert info.value.status_code == 502


def test_truncated_stream_is_never_a_success(client: ollama.Client) -> None:
    for stream in (True, False):
        with pytest.raises(ollama.ResponseError):
            run_chat(client, "plain/truncated", stream=stream)


def test_bad_requests_are_400_in_ollamas_shape(svir: SvirProcess) -> None:
    cases: list[tuple[Any, str]] = [
        ({"model": "plain/x", "messages": [{"role": "user", "images": ["!!"]}]}, "base64"),
        ({"model": "plain/x", "messages": HI, "format": "yaml"}, "format"),
        ({"model": "plain/x", "messages": HI, "options": {"temperature": "hot"}}, "temperature"),
        ({"model": "plain/x", "messages": HI, "think": "lots"}, "think"),
        ({"messages": HI}, "model is required"),
        ([1, 2], "JSON object"),
    ]
    for body, fragment in cases:
        r = httpx.post(svir.url + "/api/chat", json=body)
        assert r.status_code == 400, body
        assert set(r.json()) == {"error"} and fragment in r.json()["error"]
    r = httpx.post(svir.url + "/api/chat", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = httpx.post(svir.url + "/api/chat", content=b"x" * 300_000)
    assert r.status_code == 413 and set(r.json()) == {"error"}


def test_client_disconnect_cancels_the_upstream(svir: SvirProcess, replay: ScriptedServer) -> None:
    replay.clear()
    body = {"model": "plain/slow-drip", "messages": HI}
    with httpx.stream("POST", svir.url + "/api/chat", json=body, timeout=PATIENCE) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            assert json.loads(line)["done"] is False
            seen += 1
            if seen >= 3:
                break
    # slow-drip drips forever: it ends only if svir cancels it.
    record = replay.wait_disconnect(timeout=PATIENCE)
    assert record.model == "slow-drip" and record.disconnected


# Loading, listing, version


def test_empty_messages_load_and_unload(client: ollama.Client, replay: ScriptedServer) -> None:
    before = len(replay.chat_requests)
    r = client.chat(model="plain/llama-cpp", messages=[])
    assert r.done is True and r.done_reason == "load"
    r = client.chat(model="plain/llama-cpp", messages=[], keep_alive=0)
    assert r.done_reason == "unload"
    assert len(replay.chat_requests) == before  # nothing went upstream
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="nowhere/x", messages=[])
    assert info.value.status_code == 404


def test_list_is_the_same_as_v1_models(client: ollama.Client, svir: SvirProcess) -> None:
    listed = client.list().models
    ids = [m["id"] for m in httpx.get(svir.base_url + "/models").json()["data"]]
    assert [m.model for m in listed] == ids
    assert "plain/configured-model" in ids and "plain/qwen3.8" in ids
    assert "dead/still-listed" in ids
    assert not any("embed" in i for i in ids)
    entry = listed[0]
    assert entry.size == 0 and entry.digest and entry.modified_at is not None
    assert entry.details is not None
    raw = httpx.get(svir.url + "/api/tags").json()["models"][0]
    assert raw["name"] == raw["model"]


def test_show(client: ollama.Client) -> None:
    shown = client.show("plain/qwen3.8:latest")
    assert shown.capabilities is not None
    assert {"completion", "tools", "thinking"} <= set(shown.capabilities)
    assert shown.modelinfo is not None and shown.modelinfo["general.basename"] == "qwen3.8"
    assert client.show("plain/anything").capabilities == ["completion", "tools"]
    with pytest.raises(ollama.ResponseError) as info:
        client.show("nowhere/model")
    assert info.value.status_code == 404


def test_show_and_load_a_route_alias(client: ollama.Client) -> None:
    # A configured route is a model name too; it is shown as its first deployment.
    shown = client.show("smart")
    assert shown.modelinfo is not None and shown.modelinfo["general.basename"] == "qwen3.8"
    assert client.chat(model="smart", messages=[]).done_reason == "load"


def test_ps_lists_the_models_served_lately(client: ollama.Client) -> None:
    client.chat(model="plain/usage-absent", messages=HI)
    running = client.ps().models
    names = [m.model for m in running]
    assert names[0] == "plain/usage-absent"
    assert running[0].expires_at is not None


def test_version_and_unknown_routes(svir: SvirProcess) -> None:
    r = httpx.get(svir.url + "/api/version")
    version = r.json()["version"]
    # Clients gate on the version: GitHub Copilot wants at least 0.6.4.
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)
    assert r.json()["svir_version"]
    r = httpx.post(svir.url + "/api/nothing", json={"model": "plain/x", "prompt": "hi"})
    assert r.status_code == 404 and "/api/nothing" in r.json()["error"]
    r = httpx.get(svir.url + "/api/chat")
    assert r.status_code == 405
