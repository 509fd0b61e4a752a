"""Request and answer adaptations per server kind (§2.4–§2.6), end to end through svir against
the replay server's emulated LM Studio, mlx-lm and vLLM (emulated from recorded-style streams)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream, status_model

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "locker",
        "schema": {
            "type": "object",
            "properties": {"locker": {"type": "integer"}, "open": {"type": "boolean"}},
            "required": ["locker", "open"],
        },
    },
}
PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream()) as server:
        yield server


@pytest.fixture(scope="module")
def svir(replay: ScriptedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    def provider(name: str, kind: str, extra: str = "") -> str:
        return f'[[providers]]\nname = "{name}"\nkind = "{kind}"\nbase_url = "{replay.base_url}"\ndiscover = false\n{extra}\n'

    config = (
        provider("studio", "lmstudio")
        + provider("mlx", "mlx-lm", 'response_format = "validate"')
        + provider("mlxpass", "mlx-lm")
        + provider("vllm", "vllm")
        + provider("vision", "mlx-vlm")
        + '[[routes]]\nname = "mlxpass/mlx-lm"\nfallbacks = ["vision/mlx-vlm"]\n'
    )
    with SvirProcess(config, tmp_path_factory.mktemp("svir-adapt")) as proc:
        yield proc


@pytest.fixture
def client(svir: SvirProcess) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=svir.base_url, max_retries=0)


def user(text: str = "open locker 12") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_lmstudio_json_held_in_reasoning_is_recovered_as_the_answer(client: openai.OpenAI) -> None:
    for stream in (True, False):
        r = client.chat.completions.create(
            model="studio/lmstudio-json-in-reasoning",
            messages=user(),
            response_format=SCHEMA,
            stream=stream,
        )  # type: ignore[call-overload]
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            text = r.choices[0].message.content
        assert json.loads(text) == {"locker": 12, "open": True}


def test_lmstudio_reasoning_stays_reasoning_without_a_schema(client: openai.OpenAI) -> None:
    message = (
        client.chat.completions.create(model="studio/lmstudio-json-in-reasoning", messages=user())
        .choices[0]
        .message
    )
    assert message.content == ""
    assert (message.model_extra or {}).get("reasoning_content") == '{"locker": 12, "open": true}'


def test_lmstudio_named_tool_choice_and_json_object_are_rewritten(
    client: openai.OpenAI, replay: ScriptedServer
) -> None:
    tools = [
        {"type": "function", "function": {"name": "open_locker", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {"name": "close_locker", "parameters": {"type": "object"}},
        },
    ]
    replay.clear()
    client.chat.completions.create(
        model="studio/lmstudio-reasoning",
        messages=user(),
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "close_locker"}},
        response_format={"type": "json_object"},
    )
    body = replay.last.body
    assert body["tool_choice"] == "required"
    assert [t["function"]["name"] for t in body["tools"]] == ["close_locker"]
    assert body["response_format"]["type"] == "json_schema"


def test_tool_choice_without_tools_is_removed(
    client: openai.OpenAI, replay: ScriptedServer
) -> None:
    replay.clear()
    client.chat.completions.create(model="vllm/llama-cpp", messages=user(), tool_choice="auto")
    assert "tool_choice" not in replay.last.body


def test_ignored_response_format_is_validated_when_configured(
    client: openai.OpenAI, svir: SvirProcess
) -> None:
    # mlx-lm reads no response_format and answers in prose (§2.6): with "validate" that is an error.
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="mlx/mlx-lm", messages=user(), response_format=SCHEMA)
    assert info.value.status_code == 502
    assert "ignored response_format" in info.value.message
    with pytest.raises(openai.APIError, match="ignored response_format"):
        list(
            client.chat.completions.create(
                model="mlx/mlx-lm", messages=user(), response_format=SCHEMA, stream=True
            )
        )
    # Passed through, the prose is the answer, as the server gave it.
    text = (
        client.chat.completions.create(
            model="mlxpass/mlx-lm", messages=user(), response_format=SCHEMA
        )
        .choices[0]
        .message.content
    )
    assert text


def test_length_finish_is_never_a_valid_json_answer(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError, match="cut off"):
        client.chat.completions.create(
            model="mlx/length", messages=user(), response_format={"type": "json_object"}
        )


def test_images_to_a_text_only_server_are_refused_before_sending(
    client: openai.OpenAI, replay: ScriptedServer, svir: SvirProcess
) -> None:
    replay.clear()
    content = [
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="mlx/mlx-lm", messages=[{"role": "user", "content": content}]
        )  # type: ignore[list-item]
    assert info.value.code == "unsupported_input"
    assert replay.chat_requests == []
    # With a fallback that sees images, the fallback serves.
    completion = client.chat.completions.create(
        model="mlxpass/mlx-lm", messages=[{"role": "user", "content": content}]
    )  # type: ignore[list-item]
    assert completion.model == "vision/mlx-vlm"
    assert replay.last.body["messages"][0]["content"][1]["image_url"]["url"] == PNG


def test_vllm_without_a_tool_parser_says_what_it_lacks(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=f"vllm/{status_model('vllm-auto-tool-choice-400')}", messages=user()
        )
    assert "tool-call parser" in info.value.message
    assert "--enable-auto-tool-choice" in info.value.message


def test_unsupported_input_from_the_server_is_a_400_never_retried(
    client: openai.OpenAI, replay: ScriptedServer
) -> None:
    replay.clear()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=f"vision/{status_model('llama-cpp-image-500')}", messages=user()
        )
    assert len(replay.chat_requests) == 1
