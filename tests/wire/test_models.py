"""Model listing, the chat-model name rule, and base URL normalization (§6, §1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.wire.errors import BaseURLError, ProtocolError
from svir.wire.models import (
    ModelInfo,
    endpoint_url,
    is_chat_model,
    normalize_base_url,
    parse_model_list,
)
from tests.support.upstream import LLAMA_CPP_MODELS

VLLM_MODELS = json.dumps(
    {
        "object": "list",
        "data": [
            {
                "id": "qwen3.8",
                "object": "model",
                "created": 1790000000,
                "owned_by": "vllm",
                "root": "/models/Qwen3.8-27B-MLX-4bit",
                "parent": None,
                "max_model_len": 262144,
                "permission": [{"id": "modelperm-1", "allow_sampling": True}],
            }
        ],
    }
).encode()

# llama.cpp's list: the same recorded shape the replay server serves.
LLAMA_MODELS = json.dumps(LLAMA_CPP_MODELS).encode()
LLAMA_PATH = LLAMA_CPP_MODELS["data"][0]["id"]

MLX_MODELS = json.dumps(
    {
        "object": "list",
        "data": [
            {"id": "mlx-community/Qwen3.8-27B-4bit", "object": "model", "created": 1790000000},
            {"id": "unsloth/Qwen-Image-2.1", "object": "model", "created": 1790000000},
            {"id": "/Users/me/models/Qwen3.8-27B-MLX-4bit", "object": "model", "created": 1},
        ],
    }
).encode()


# parse_model_list


def test_vllm_list() -> None:
    assert parse_model_list(VLLM_MODELS) == [
        ModelInfo(id="qwen3.8", owned_by="vllm", context_length=262144)
    ]


def test_anthropic_list_names_its_models_by_display_name() -> None:
    # GET /v1/models as Anthropic answers it (its SDK's ModelInfo and page shape).
    body = json.dumps(
        {
            "data": [
                {
                    "type": "model",
                    "id": "claude-sonnet-4-5-20250929",
                    "display_name": "Claude Sonnet 4.5",
                    "created_at": "2025-09-29T00:00:00Z",
                },
                {"type": "model", "id": "claude-haiku-4-5", "display_name": ""},
            ],
            "has_more": False,
            "first_id": "claude-sonnet-4-5-20250929",
            "last_id": "claude-haiku-4-5",
        }
    ).encode()
    assert parse_model_list(body) == [
        ModelInfo(id="claude-sonnet-4-5-20250929", name="Claude Sonnet 4.5"),
        ModelInfo(id="claude-haiku-4-5"),
    ]


def test_llama_cpp_list_is_one_model_with_its_context_and_modalities() -> None:
    models = parse_model_list(LLAMA_MODELS)
    assert models == [
        ModelInfo(
            id=LLAMA_PATH,
            owned_by="llamacpp",
            context_length=16384,  # the running context, not n_ctx_train
            input_modalities=("text", "image"),
            context_train=262144,
            parameters=30532122624,
            size=18556686336,
        )
    ]


def test_llama_cpp_modalities_from_the_models_array() -> None:
    doc = json.loads(LLAMA_MODELS)
    doc["models"][0]["architecture"] = doc["data"][0].pop("architecture")
    (model,) = parse_model_list(json.dumps(doc).encode())
    assert model.input_modalities == ("text", "image")


def test_mlx_list_keeps_every_entry_in_order() -> None:
    ids = [m.id for m in parse_model_list(MLX_MODELS)]
    assert ids == [
        "mlx-community/Qwen3.8-27B-4bit",
        "unsloth/Qwen-Image-2.1",
        "/Users/me/models/Qwen3.8-27B-MLX-4bit",
    ]


def test_models_array_alone_and_extra_entries() -> None:
    body = json.dumps(
        {
            "data": [{"id": "a"}],
            "models": [
                {"name": "a", "model": "a"},
                {"name": "Pretty B", "model": "b"},
                {"name": "c"},
                {"name": None, "model": None},
                "junk",
            ],
        }
    ).encode()
    assert parse_model_list(body) == [
        ModelInfo(id="a"),
        ModelInfo(id="b", name="Pretty B"),
        ModelInfo(id="c"),
    ]
    assert parse_model_list(b'{"models":[{"model":"x"}]}') == [ModelInfo(id="x")]


def test_tolerates_nulls_extra_keys_and_bad_entries() -> None:
    body = json.dumps(
        {
            "object": "list",
            "extra": {"anything": [1, 2]},
            "data": [
                {"id": "good", "name": None, "owned_by": None, "max_model_len": None},
                {"id": None},
                {"id": ""},
                {"id": "   "},
                {"id": 7},
                {"name": "no id"},
                None,
                "string",
                ["list"],
                {"id": "good", "name": "a duplicate"},
                {
                    "id": "named",
                    "name": "Named Model",
                    "max_model_len": True,
                    "meta": {"n_ctx": -5},
                    "architecture": {"input_modalities": ["text", 3, None, ""]},
                },
                {"id": "ctx", "context_length": 8192, "architecture": {"input_modalities": []}},
            ],
        }
    ).encode()
    assert parse_model_list(body) == [
        ModelInfo(id="good"),
        ModelInfo(id="named", name="Named Model", input_modalities=("text",)),
        ModelInfo(id="ctx", context_length=8192),
    ]


def test_empty_list() -> None:
    assert parse_model_list(b'{"object":"list","data":[]}') == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "not valid JSON"),
        (b"<html>502</html>", "not valid JSON"),
        (b'{"data": [', "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'"models"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b"{}", "no `data` array"),
        (b'{"data": null}', "no `data` array"),
        (b'{"data": {"id": "x"}}', "no `data` array"),
    ],
)
def test_wrong_bodies_raise_protocol_error(body: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        parse_model_list(body)


def test_wrong_argument_type() -> None:
    with pytest.raises(TypeError):
        parse_model_list('{"data": []}')  # type: ignore[arg-type]


def test_model_info_is_frozen() -> None:
    info = ModelInfo(id="x")
    with pytest.raises(AttributeError):
        info.id = "y"  # type: ignore[misc]


@settings(max_examples=300)
@given(body=st.binary(max_size=500))
def test_fuzz_bytes_raise_only_protocol_error(body: bytes) -> None:
    try:
        models = parse_model_list(body)
    except ProtocolError:
        return
    assert all(isinstance(m, ModelInfo) and m.id.strip() for m in models)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "data",
                    "models",
                    "id",
                    "name",
                    "model",
                    "meta",
                    "n_ctx",
                    "max_model_len",
                    "architecture",
                    "input_modalities",
                    "owned_by",
                ]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300)
@given(doc=json_values)
def test_fuzz_json_raise_only_protocol_error(doc: Any) -> None:
    try:
        models = parse_model_list(json.dumps(doc).encode())
    except ProtocolError:
        return
    ids = [m.id for m in models]
    assert len(ids) == len(set(ids))


# is_chat_model


@pytest.mark.parametrize(
    "model_id",
    [
        "gpt-4o",
        "Qwen3-8B",
        "gemma-3-270m",
        "llava",
        "qwen2.5-vl",
        "/models/qwen3.gguf",
        "mlx-community/Qwen3.8-27B-4bit",
        "/Users/me/models/Qwen3.8-27B-MLX-4bit",
        "speechless-code-mistral-7b",  # a chat family whose name contains "speech"
        "task-master-7b",  # contains "as" + "k", not the token "asr"
        "clipper-7b",
        "influx-llm",
        "/srv/image-models/qwen3.gguf",  # a directory on the way says nothing
        "C:\\models\\qwen3-8b.gguf",
        "Llama-3.2-11B-Vision-Instruct",
        "watts-chat-7b",
        "",
    ],
)
def test_chat_models(model_id: str) -> None:
    assert is_chat_model(model_id)


@pytest.mark.parametrize(
    "model_id",
    [
        "text-embedding-3-small",
        "nomic-embed-text-v1.5",
        "embeddinggemma-300m",
        "bge-m3",
        "BAAI/bge-reranker-v2-m3",
        "jina-reranker-v2",
        "openai/clip-vit-large-patch14",
        "whisper-large-v3",
        "distil-whisper-large-v3",
        "kokoro-tts",
        "tts-1",
        "OuteTTS-0.3-1B",
        "XTTS-v2",
        "Qwen3-ASR-1.7B",
        "microsoft/SpeechT5",
        "Qwen2-Audio-7B-Instruct",
        "gpt-image-1",
        "unsloth/Qwen-Image-2.1",
        "FLUX.1-dev",
        "black-forest-labs/FLUX.1-schnell",
        "sdxl-turbo",
        "stable-diffusion-xl",
        "StableDiffusion3",
        "/models/bge-m3.gguf",
    ],
)
def test_non_chat_models(model_id: str) -> None:
    assert not is_chat_model(model_id)


def test_name_is_checked_too() -> None:
    assert not is_chat_model("model-1", "Text Embedding Large")
    assert is_chat_model("model-1", "Qwen3 8B")
    assert is_chat_model("model-1", None)


def test_is_chat_model_types() -> None:
    with pytest.raises(TypeError):
        is_chat_model(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        is_chat_model("x", 3)  # type: ignore[arg-type]


@given(st.text(max_size=60), st.none() | st.text(max_size=30))
def test_is_chat_model_never_raises_on_text(model_id: str, name: str | None) -> None:
    assert isinstance(is_chat_model(model_id, name), bool)


# normalize_base_url and endpoint_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://localhost:8080", "http://localhost:8080/v1"),
        ("http://localhost:8080/", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1/", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1///", "http://localhost:8080/v1"),
        ("  https://api.example.com/v1  ", "https://api.example.com/v1"),
        ("HTTPS://API.Example.com", "https://api.example.com/v1"),
        ("https://res.openai.azure.com/openai/v1/", "https://res.openai.azure.com/openai/v1"),
        ("http://proxy.local/llm", "http://proxy.local/llm/v1"),
        ("http://127.0.0.1:1234", "http://127.0.0.1:1234/v1"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("http://host:/v1", "http://host/v1"),
    ],
)
def test_normalize_base_url(url: str, expected: str) -> None:
    assert normalize_base_url(url) == expected
    assert normalize_base_url(expected) == expected


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("localhost:8080", "http:// or https://"),
        ("127.0.0.1:8080/v1", "http:// or https://"),
        ("ftp://host/v1", "http or https"),
        ("http://user:hunter2@host/v1", "credentials"),
        ("http://token@host", "credentials"),
        ("http://host/v1?api-key=hunter2", "query"),
        ("http://host/v1?", "query"),
        ("http://host/v1#frag", "fragment"),
        ("http:///v1", "no host"),
        ("http://:8080/v1", "no host"),
        ("http://host:99999/v1", "cannot be parsed"),
        ("http://host:port/v1", "cannot be parsed"),
        ("http://[::1/v1", "cannot be parsed"),
        ("http://host:0/v1", "port 0"),
        ("http://ho st/v1", "whitespace"),
        ("http://ho\tst/v1", "whitespace"),
        ("http://host/v1/chat/completions", "endpoint"),
        ("http://host/v1/models/", "endpoint"),
    ],
)
def test_bad_base_urls(url: str, words: str) -> None:
    with pytest.raises(BaseURLError, match=words):
        normalize_base_url(url)


def test_password_never_in_the_message() -> None:
    for url in ("http://user:hunter2@host/v1", "http://host/v1?key=hunter2", "http://h#hunter2"):
        with pytest.raises(BaseURLError) as info:
            normalize_base_url(url)
        assert "hunter2" not in str(info.value)


def test_normalize_type_error() -> None:
    with pytest.raises(TypeError):
        normalize_base_url(None)  # type: ignore[arg-type]


@settings(max_examples=500)
@given(
    st.text(max_size=80) | st.from_regex(r"https?://[^/]{0,20}(/[^/]{0,10}){0,3}", fullmatch=True)
)
def test_fuzz_normalize_raises_only_base_url_error(url: str) -> None:
    try:
        base = normalize_base_url(url)
    except BaseURLError:
        return
    assert base.startswith(("http://", "https://"))
    assert base.endswith("/v1")
    assert normalize_base_url(base) == base


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        ("http://localhost:8080", "chat/completions", "http://localhost:8080/v1/chat/completions"),
        ("http://localhost:8080/v1/", "models", "http://localhost:8080/v1/models"),
        ("http://localhost:8080/v1", "/models", "http://localhost:8080/v1/models"),
    ],
)
def test_endpoint_url(base: str, path: str, expected: str) -> None:
    assert endpoint_url(base, path) == expected


def test_endpoint_url_never_doubles_v1() -> None:
    assert "/v1/v1" not in endpoint_url("http://h/v1/", "models")


def test_endpoint_url_validates() -> None:
    with pytest.raises(BaseURLError):
        endpoint_url("http://u:p@h", "models")
    with pytest.raises(ValueError, match="empty"):
        endpoint_url("http://h", "/")
