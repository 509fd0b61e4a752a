"""Tests for svir.providers: the kinds, their URLs and headers, request checking, and the body
each kind is sent.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.config.load import parse_config
from svir.config.model import ProviderConfig
from svir.errors import BadRequest
from svir.providers import (
    KINDS,
    ProviderKind,
    build_upstream_body,
    get_kind,
    split_model,
    validate_chat_request,
)
from svir.providers.azure import KIND as AZURE
from svir.wire.errors import BodyError

ALL_KINDS = [
    "openai-compatible",
    "openai",
    "azure",
    "anthropic",
    "openrouter",
    "gemini",
    "kimi",
    "ollama",
    "lmstudio",
    "llamacpp",
    "llamacpp-managed",
    "vllm",
    "mlx-lm",
    "mlx-vlm",
]
# The kinds that are sent OpenAI's chat body (anthropic is sent a Messages request).
OPENAI_KINDS = [n for n in ALL_KINDS if n != "anthropic"]


def provider(kind: str, **fields: Any) -> ProviderConfig:
    fields.setdefault("base_url", "http://h/v1")
    return ProviderConfig(name="p", kind=kind, **fields)


def build(client: dict[str, Any], kind: str, model_id: str = "m", **fields: Any) -> dict[str, Any]:
    return build_upstream_body(
        client, kind=get_kind(kind), provider=provider(kind, **fields), model_id=model_id
    )


def request(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "p/m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return body


# ---------------------------------------------------------------------------------------------
# The registry and what each kind is


def test_registry_holds_every_kind_under_its_name() -> None:
    assert sorted(KINDS) == sorted(ALL_KINDS)
    for name, kind in KINDS.items():
        assert isinstance(kind, ProviderKind)
        assert kind.name == name
        assert get_kind(name) is kind


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        KINDS["x"] = KINDS["vllm"]  # type: ignore[index]


def test_unknown_kind() -> None:
    with pytest.raises(KeyError, match="unknown kind 'nope'"):
        get_kind("nope")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("openai-compatible", (True, "max_tokens", "reasoning_content", "authorization", True)),
        ("openai", (False, "max_completion_tokens", None, "authorization", True)),
        ("azure", (False, "max_completion_tokens", None, "api-key", False)),
        ("openrouter", (False, "max_tokens", "reasoning", "authorization", True)),
        ("gemini", (False, "max_tokens", None, "authorization", True)),
        ("kimi", (False, "max_tokens", "reasoning_content", "authorization", True)),
        ("ollama", (True, "max_tokens", "reasoning", "authorization", True)),
        ("lmstudio", (True, "max_tokens", "reasoning_content", "authorization", True)),
        ("llamacpp", (True, "max_tokens", "reasoning_content", "authorization", True)),
        ("llamacpp-managed", (True, "max_tokens", "reasoning_content", "authorization", False)),
        ("vllm", (True, "max_tokens", "reasoning", "authorization", True)),
        ("mlx-lm", (True, "max_tokens", "reasoning", "authorization", True)),
        ("mlx-vlm", (True, "max_tokens", "reasoning_content", "authorization", True)),
    ],
)
def test_kind_table(name: str, expected: tuple[bool, str, str | None, str, bool]) -> None:
    # (think_tags, max_tokens_field, reasoning_key, auth_header, discover)
    kind = get_kind(name)
    assert (
        kind.think_tags,
        kind.max_tokens_field,
        kind.reasoning_key,
        kind.auth_header,
        kind.discover,
    ) == expected
    assert kind.default_drop == (frozenset({"temperature", "top_p"}) if name == "kimi" else set())


def test_provider_settings_override_the_kind() -> None:
    kimi = get_kind("kimi")
    assert kimi.drop_params_for(provider("kimi")) == {"temperature", "top_p"}
    assert kimi.drop_params_for(provider("kimi", drop_params=())) == frozenset()
    assert kimi.drop_params_for(provider("kimi", drop_params=("seed",))) == {"seed"}
    azure = get_kind("azure")
    assert azure.think_tags_for(provider("azure")) is False
    assert azure.think_tags_for(provider("azure", think_tags=True)) is True
    assert azure.discover_for(provider("azure")) is False
    assert azure.discover_for(provider("azure", discover=True)) is True


@pytest.mark.parametrize("name", ALL_KINDS)
def test_auth_headers(name: str) -> None:
    kind = get_kind(name)
    expected = {"api-key": "k"} if name == "azure" else {"Authorization": "Bearer k"}
    if name == "anthropic":
        expected = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    assert kind.auth_headers("k") == expected
    assert kind.auth_headers(None) == {}
    assert kind.auth_headers("") == {}


# ---------------------------------------------------------------------------------------------
# URLs


@pytest.mark.parametrize("name", [n for n in OPENAI_KINDS if n not in ("azure", "gemini")])
def test_openai_style_urls(name: str) -> None:
    kind = get_kind(name)
    p = provider(name, base_url="http://h:8080/v1")
    assert kind.chat_url(p.base_url, "org/m", p) == "http://h:8080/v1/chat/completions"
    assert kind.models_url(p.base_url, p) == "http://h:8080/v1/models"


def test_gemini_urls_have_no_v1() -> None:
    config = parse_config('[[providers]]\nname = "g"\nkind = "gemini"')
    p = config.providers[0]
    kind = get_kind("gemini")
    base = "https://generativelanguage.googleapis.com/v1beta/openai"
    assert kind.chat_url(p.base_url, "gemini-2.5-flash", p) == f"{base}/chat/completions"
    assert kind.models_url(p.base_url, p) == f"{base}/models"
    # Only the host given: the compatible path is filled in.
    assert kind.normalize_base("https://generativelanguage.googleapis.com/") == base


def azure(
    api_version: str | None, base_url: str = "https://res.openai.azure.com"
) -> ProviderConfig:
    return ProviderConfig(name="az", kind="azure", base_url=base_url, api_version=api_version)


def test_azure_dated_version_uses_the_deployment_url() -> None:
    p = azure("2024-10-21")
    assert AZURE.chat_url(p.base_url, "gpt-4o-prod", p) == (
        "https://res.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions"
        "?api-version=2024-10-21"
    )
    assert AZURE.models_url(p.base_url, p) == (
        "https://res.openai.azure.com/openai/models?api-version=2024-10-21"
    )


def test_azure_deployment_name_is_quoted() -> None:
    p = azure("2025-01-01-preview")
    url = AZURE.chat_url(p.base_url, "a b/c", p)
    assert "/openai/deployments/a%20b%2Fc/chat/completions?api-version=2025-01-01-preview" in url


@pytest.mark.parametrize("api_version", ["v1", None])
def test_azure_v1_api(api_version: str | None) -> None:
    p = azure(api_version)
    assert AZURE.chat_url(p.base_url, "gpt-4o-prod", p) == (
        "https://res.openai.azure.com/openai/v1/chat/completions"
    )
    assert AZURE.models_url(p.base_url, p) == "https://res.openai.azure.com/openai/v1/models"


@pytest.mark.parametrize(
    "base_url",
    [
        "https://res.openai.azure.com/",
        "https://res.openai.azure.com/openai/v1",
        "https://res.openai.azure.com/openai/",
    ],
)
def test_azure_urls_from_any_written_base(base_url: str) -> None:
    for version, expected in [
        ("v1", "https://res.openai.azure.com/openai/v1/chat/completions"),
        ("2024-10-21", "https://res.openai.azure.com/openai/deployments/d/chat/completions"),
    ]:
        p = azure(version, base_url)
        assert AZURE.chat_url(base_url, "d", p).startswith(expected)


def test_azure_from_config_file() -> None:
    config = parse_config(
        '[[providers]]\nname = "az"\nkind = "azure"\n'
        'base_url = "https://res.openai.azure.com/openai/v1/"\napi_version = "2024-10-21"'
    )
    p = config.providers[0]
    assert get_kind(p.kind).chat_url(p.base_url, "dep", p) == (
        "https://res.openai.azure.com/openai/deployments/dep/chat/completions"
        "?api-version=2024-10-21"
    )


# ---------------------------------------------------------------------------------------------
# split_model and validate_chat_request


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("lab/gemma", ("lab", "gemma")),
        ("lab/org/model", ("lab", "org/model")),
        ("lab//abs/path.gguf", ("lab", "/abs/path.gguf")),
    ],
)
def test_split_model(model: str, expected: tuple[str, str]) -> None:
    assert split_model(model) == expected


@pytest.mark.parametrize("model", ["gemma", "/gemma", "lab/", ""])
def test_split_model_needs_a_prefix_and_an_id(model: str) -> None:
    with pytest.raises(BadRequest) as info:
        split_model(model)
    assert info.value.param == "model"


def test_valid_request_comes_back_unchanged() -> None:
    body = request(stream=True, n=1, max_tokens=5, stream_options={"include_usage": False})
    before = copy.deepcopy(body)
    assert validate_chat_request(body) is body
    assert body == before


def test_nulls_count_as_absent() -> None:
    validate_chat_request(
        request(
            stream=None, n=None, max_tokens=None, stream_options=None, max_completion_tokens=None
        )
    )


@pytest.mark.parametrize(
    ("body", "param", "code", "words"),
    [
        ([], None, "invalid_type", "must be a JSON object"),
        ("hi", None, "invalid_type", "must be a JSON object"),
        ({"messages": [{}]}, "model", "missing_required_parameter", "model is required"),
        (request(model=""), "model", "missing_required_parameter", "model is required"),
        (request(model=3), "model", "invalid_type", "must be a string"),
        ({"model": "p/m"}, "messages", "missing_required_parameter", "messages is required"),
        (request(messages="hi"), "messages", "invalid_type", "must be an array"),
        (request(messages=[]), "messages", "invalid_value", "must not be empty"),
        (request(stream="true"), "stream", "invalid_type", "must be a boolean"),
        (request(stream=1), "stream", "invalid_type", "must be a boolean"),
        (request(n=2), "n", "unsupported_value", "only n=1 is supported"),
        (request(n=0), "n", "invalid_value", "at least 1"),
        (request(n=True), "n", "invalid_type", "integer"),
        (request(max_tokens=0), "max_tokens", "invalid_value", "at least 1"),
        (request(max_tokens=-5), "max_tokens", "invalid_value", "at least 1"),
        (request(max_tokens=1.5), "max_tokens", "invalid_type", "integer"),
        (request(max_tokens="9"), "max_tokens", "invalid_type", "integer"),
        (request(max_tokens=True), "max_tokens", "invalid_type", "integer"),
        (request(max_completion_tokens=0), "max_completion_tokens", "invalid_value", "at least"),
        (request(stream_options=True), "stream_options", "invalid_type", "must be an object"),
        (request(stream_options=[]), "stream_options", "invalid_type", "must be an object"),
    ],
)
def test_validate_errors(body: Any, param: str | None, code: str, words: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_chat_request(body)
    assert info.value.param == param
    assert info.value.code == code
    assert words in info.value.message
    assert str(info.value) == info.value.message


@pytest.mark.parametrize(
    ("field", "value", "param", "words"),
    [
        ("tools", 5, "tools", "tools must be an array, not a number"),
        ("tools", True, "tools", "tools must be an array, not a boolean"),
        ("tools", {"type": "function"}, "tools", "tools must be an array, not an object"),
        ("tools", [5], "tools[0]", "tools[0] must be an object, not a number"),
        ("tools", [{"type": "x", "function": {"name": "f"}}], "tools[0]", "must be 'function'"),
        ("tools", [{"function": "f"}], "tools[0].function", "must be an object, not a string"),
        ("tools", [{"function": {}}], "tools[0].function.name", "a non-empty string"),
        ("tools", [{"function": {"name": ""}}], "tools[0].function.name", "a non-empty string"),
        (
            "tools",
            [{"function": {"name": "f", "parameters": []}}],
            "tools[0].function.parameters",
            "tools[0].function.parameters must be an object, not an array",
        ),
        (
            "tools",
            [{"function": {"name": "f", "description": 1}}],
            "tools[0].function.description",
            "must be a string, not a number",
        ),
        ("tool_choice", 5, "tool_choice", "tool_choice must be a string or an object, not a"),
        ("tool_choice", [], "tool_choice", "must be a string or an object, not an array"),
        ("parallel_tool_calls", "yes", "parallel_tool_calls", "must be a boolean"),
        ("stop", 5, "stop", "stop must be a string or an array of strings, not a number"),
        ("stop", ["a", 1], "stop[1]", "stop[1] must be a string, not a number"),
        ("stream_options", {"include_usage": 1}, "stream_options.include_usage", "a boolean"),
        ("response_format", "json", "response_format", "must be an object, not a string"),
        ("response_format", {"type": 5}, "response_format.type", "not a number"),
        ("temperature", "hot", "temperature", "temperature must be a number, not a string"),
        ("temperature", True, "temperature", "must be a number, not a boolean"),
        ("top_p", [], "top_p", "must be a number"),
        ("frequency_penalty", {}, "frequency_penalty", "must be a number"),
        ("presence_penalty", "0", "presence_penalty", "must be a number"),
        ("seed", 1.5, "seed", "seed must be an integer, not a number"),
        ("logprobs", 1, "logprobs", "must be a boolean"),
        ("top_logprobs", "2", "top_logprobs", "must be an integer"),
        ("logit_bias", [], "logit_bias", "must be an object"),
        ("user", 5, "user", "user must be a string, not a number"),
        ("metadata", "x", "metadata", "metadata must be an object, not a string"),
        ("store", "no", "store", "must be a boolean"),
        ("reasoning_effort", 3, "reasoning_effort", "must be a string"),
        ("modalities", "text", "modalities", "must be an array"),
        ("functions", {}, "functions", "must be an array"),
        ("function_call", 1, "function_call", "must be a string or an object"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused(
    field: str, value: Any, param: str, words: str
) -> None:
    with pytest.raises(BadRequest) as info:
        validate_chat_request(request(**{field: value}))
    assert info.value.param == param
    assert words in info.value.message


def test_the_field_checks_take_what_openai_clients_send() -> None:
    body = request(
        tools=[{"type": "function", "function": {"name": "f", "description": "d",
                                                 "parameters": {"type": "object"}, "strict": True}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        parallel_tool_calls=False, stop=["\n"], temperature=0, top_p=1.0, seed=3, logprobs=True,
        top_logprobs=2, logit_bias={"50256": -100}, user="u", metadata={"k": "v"}, store=False,
        reasoning_effort="low", modalities=["text"], stream_options={"include_usage": True},
        top_k=40, thinking={"type": "disabled"},  # fields OpenAI does not define pass through
    )  # fmt: skip
    assert validate_chat_request(body) is body
    validate_chat_request(request(stop="END", tool_choice="auto", tools=[]))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "model", "messages", "stream", "n", "max_tokens", "max_completion_tokens",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls", "stop",
        "response_format", "temperature", "seed", "logit_bias", "metadata", "user",
        "reasoning_effort", "top_k",
    ]
)  # fmt: skip
TOOLS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["function", "x"]) | JSON,
            "function": st.fixed_dictionaries(
                {}, optional={"name": st.sampled_from(["f", ""]) | JSON, "parameters": JSON}
            )
            | JSON,
        },
    )
    | JSON,
    max_size=3,
)
VALUES = (
    JSON
    | st.sampled_from(["p/m", "m", "/", 1, 2, 0, -1, True])
    | TOOLS
    | st.just([{"role": "user", "content": "hi"}])
)
REQUESTS = st.dictionaries(FIELDS, VALUES)


@settings(max_examples=600)
@given(JSON | REQUESTS)
def test_fuzz_validate_raises_only_request_error(body: Any) -> None:
    """Any JSON is a request or a BadRequest, and a request is a body for every kind or the
    client's BodyError."""
    error: BadRequest | None = None
    try:
        validate_chat_request(body)
    except BadRequest as exc:
        error = exc
    if error is not None:
        assert error.message
        assert error.code
        return
    for name in ("llamacpp", "lmstudio", "openai", "kimi", "azure"):
        try:
            built = build(body, name, api_version="v1" if name == "azure" else None)
        except BodyError:
            continue
        assert msgspec.json.encode(built)


# ---------------------------------------------------------------------------------------------
# build_upstream_body


def test_common_rewriting() -> None:
    body = build(
        request(model="lab/org/m", stream=False, top_k=40, stop=["\n\n"], seed=3),
        "llamacpp",
        model_id="org/m",
    )
    assert body == {
        "model": "org/m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 40,
        "stop": ["\n\n"],
        "seed": 3,
    }


@pytest.mark.parametrize("name", OPENAI_KINDS)
def test_usage_is_always_requested(name: str) -> None:
    for options in (None, {"include_usage": False}, {}):
        client = request(stream=False)
        if options is not None:
            client["stream_options"] = options
        body = build(client, name)
        assert body["stream"] is True
        assert body["stream_options"]["include_usage"] is True


def test_other_stream_options_are_kept() -> None:
    client = request(stream_options={"include_usage": False, "include_obfuscation": False})
    body = build(client, "openai")
    assert body["stream_options"] == {"include_usage": True, "include_obfuscation": False}


def test_text_only_array_is_flattened() -> None:
    client = request(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            }
        ]
    )
    assert build(client, "lmstudio")["messages"] == [{"role": "user", "content": "one\ntwo"}]


def test_openai_maps_max_tokens() -> None:
    body = build(request(max_tokens=100), "openai")
    assert body["max_completion_tokens"] == 100
    assert "max_tokens" not in body


def test_azure_maps_max_tokens() -> None:
    body = build(request(max_tokens=100), "azure", api_version="v1")
    assert body["max_completion_tokens"] == 100
    assert "max_tokens" not in body


def test_llamacpp_keeps_max_tokens() -> None:
    body = build(request(max_tokens=100), "llamacpp")
    assert body["max_tokens"] == 100
    assert "max_completion_tokens" not in body


def test_llamacpp_takes_max_completion_tokens_as_max_tokens() -> None:
    body = build(request(max_completion_tokens=70), "llamacpp")
    assert body["max_tokens"] == 70
    assert "max_completion_tokens" not in body


@pytest.mark.parametrize("name", ["openai", "vllm"])
def test_max_completion_tokens_wins_over_max_tokens(name: str) -> None:
    body = build(request(max_tokens=100, max_completion_tokens=50), name)
    assert body[get_kind(name).max_tokens_field] == 50
    assert "max_tokens" not in body or body["max_tokens"] == 50


def test_kimi_drops_sampling_and_disables_thinking() -> None:
    body = build(request(temperature=0.7, top_p=0.9, top_k=5), "kimi")
    assert "temperature" not in body
    assert "top_p" not in body
    assert body["top_k"] == 5
    assert body["thinking"] == {"type": "disabled"}


def test_kimi_keeps_a_thinking_setting_the_client_sent() -> None:
    body = build(request(thinking={"type": "enabled"}), "kimi")
    assert body["thinking"] == {"type": "enabled"}


def test_provider_drop_params_replace_the_kind_default() -> None:
    body = build(request(temperature=0.7, top_p=0.9, seed=1), "kimi", drop_params=("seed",))
    assert body["temperature"] == 0.7
    assert body["top_p"] == 0.9
    assert "seed" not in body


def test_other_kinds_keep_sampling() -> None:
    body = build(request(temperature=0.7, top_p=0.9), "vllm")
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)


@pytest.mark.parametrize("listed", ["max_tokens", "max_completion_tokens"])
def test_dropping_either_limit_name_drops_the_limit(listed: str) -> None:
    body = build(request(max_tokens=9), "openai", drop_params=(listed,))
    assert "max_tokens" not in body
    assert "max_completion_tokens" not in body


@pytest.mark.parametrize("tools", [None, []])
def test_tool_settings_without_tools_are_removed(tools: list[Any] | None) -> None:
    client = request(tool_choice="auto", parallel_tool_calls=False)
    if tools is not None:
        client["tools"] = tools
    body = build(client, "azure", api_version="v1")
    assert "tool_choice" not in body
    assert "parallel_tool_calls" not in body
    assert "tools" not in body


TOOL = {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}
OTHER_TOOL = {"type": "function", "function": {"name": "other", "parameters": {}}}


def test_tool_settings_with_tools_are_kept() -> None:
    body = build(request(tools=[TOOL], tool_choice="required", parallel_tool_calls=False), "vllm")
    assert body["tools"] == [TOOL]
    assert body["tool_choice"] == "required"
    assert body["parallel_tool_calls"] is False


def test_n_of_one_is_removed() -> None:
    assert "n" not in build(request(n=1), "openai")


def test_nulls_are_left_out() -> None:
    body = build(request(temperature=None, stop=None, max_tokens=None), "vllm")
    assert "temperature" not in body
    assert "stop" not in body
    assert "max_tokens" not in body


@pytest.mark.parametrize(
    ("name", "key"),
    [("llamacpp", "reasoning_content"), ("vllm", "reasoning"), ("mlx-lm", "reasoning")],
)
def test_reasoning_goes_back_under_the_kinds_key(name: str, key: str) -> None:
    client = request(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "reasoning_content": "thought"},
            {"role": "user", "content": "c"},
        ]
    )
    assistant = build(client, name)["messages"][1]
    assert assistant == {"role": "assistant", "content": "b", key: "thought"}


@pytest.mark.parametrize("name", ["openai", "azure", "gemini"])
def test_reasoning_is_dropped_where_no_key_takes_it(name: str) -> None:
    client = request(
        messages=[
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "reasoning": "thought"},
        ]
    )
    assert build(client, name, api_version="v1" if name == "azure" else None)["messages"][1] == {
        "role": "assistant",
        "content": "b",
    }


def test_bad_message_raises_body_error() -> None:
    with pytest.raises(BodyError, match=r"messages\[0\]\.role"):
        build(request(messages=[{"role": "wizard", "content": "x"}]), "vllm")


def test_client_request_is_not_touched() -> None:
    client = request(
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "look"}},
        response_format={"type": "json_object"},
        stream_options={"include_usage": False},
        temperature=0.5,
        top_p=0.5,
        max_tokens=10,
        n=1,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    before = copy.deepcopy(client)
    for name in ALL_KINDS:
        body = build(client, name, api_version="v1" if name == "azure" else None)
        # Changing the fields of what was built must not reach back into the client's objects.
        body.setdefault("stream_options", {})["x"] = 1
        body["messages"][0]["content"] = "changed"
        body.pop("tools", None)
        assert client == before


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_client_values_are_shared_not_copied() -> None:
    """A copy of the client's JSON would walk it for every attempt, and a recursive one fails on
    deep input (`copy.deepcopy` needs several frames a level)."""
    deep = nested(5000)
    client = request(metadata=deep, stream_options={"include_usage": False})
    for name in OPENAI_KINDS:
        body = build(client, name, api_version="v1" if name == "azure" else None)
        assert body["metadata"] is deep
        assert body["stream_options"] == {"include_usage": True}
    assert client["stream_options"] == {"include_usage": False}


def test_lmstudio_named_tool_choice_becomes_required_over_that_tool() -> None:
    client = request(
        tools=[TOOL, OTHER_TOOL], tool_choice={"type": "function", "function": {"name": "other"}}
    )
    body = build(client, "lmstudio")
    assert body["tool_choice"] == "required"
    assert body["tools"] == [OTHER_TOOL]


def test_lmstudio_leaves_an_unknown_tool_name_alone() -> None:
    choice = {"type": "function", "function": {"name": "missing"}}
    body = build(request(tools=[TOOL], tool_choice=choice), "lmstudio")
    assert body["tool_choice"] == choice
    assert body["tools"] == [TOOL]


def test_lmstudio_json_object_becomes_a_schema() -> None:
    body = build(request(response_format={"type": "json_object"}), "lmstudio")
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "json_object", "schema": {"type": "object"}},
    }
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    assert build(request(response_format=schema), "lmstudio")["response_format"] == schema


def test_other_kinds_keep_named_tool_choice_and_json_object() -> None:
    choice = {"type": "function", "function": {"name": "look"}}
    body = build(
        request(tools=[TOOL], tool_choice=choice, response_format={"type": "json_object"}), "vllm"
    )
    assert body["tool_choice"] == choice
    assert body["response_format"] == {"type": "json_object"}


def test_a_model_without_prefix_is_left_to_the_router() -> None:
    # "smart" may be a route name; whether it exists is the router's to say, with a 404.
    body = request(model="smart")
    assert validate_chat_request(body) is body


@pytest.mark.parametrize(
    ("rf", "param"),
    [
        ("json", "response_format"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a" * 65}},
            "response_format.json_schema.name",
        ),
        ({"type": "json_schema", "json_schema": {"name": "é"}}, "response_format.json_schema.name"),
        (
            {"type": "json_schema", "json_schema": {"name": "ok", "schema": []}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_response_format_is_checked(rf: Any, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_chat_request(request(response_format=rf))
    assert info.value.param == param


def test_valid_schema_names_pass() -> None:
    for name in ("a", "A-b_9", "x" * 64):
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": {"type": "object"}}}
        validate_chat_request(request(response_format=rf))
