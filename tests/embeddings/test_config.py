"""The config of embeddings: a managed model's `embeddings` and `pooling` (and the llama-server
arguments they give), a provider's `embedding_models`, `ProviderConfig.embeds` (what /api/show's
`embedding` capability reads), and the mistakes named with file, field and fix."""

from __future__ import annotations

import pytest

from svir.config.load import parse_config
from svir.config.model import ManagedModel
from svir.edges.managed.launch import embedding_args
from svir.errors import ConfigError


def managed(models: str) -> str:
    return f"""
[[providers]]
name = "local"
kind = "llamacpp-managed"
[providers.managed.models]
{models}
"""


def test_managed_embedding_models() -> None:
    config = parse_config(
        managed(
            'embed = { path = "pypi:gemma3-270m", embeddings = true }\n'
            'cls = { path = "pypi:gemma3-270m", embeddings = true, pooling = "cls" }\n'
            'chat = "pypi:gemma3-270m"'
        )
    )
    provider = config.providers[0]
    assert provider.managed is not None
    embed, cls, chat = (provider.managed.model(m) for m in ("embed", "cls", "chat"))
    assert embed is not None and cls is not None and chat is not None
    # The PyPI Gemma is a chat model whose own pooling is none, which /v1/embeddings refuses.
    assert (embed.embeddings, embed.pooling) == (True, "mean")
    assert (cls.embeddings, cls.pooling) == (True, "cls")
    assert (chat.embeddings, chat.pooling) == (False, None)
    assert embedding_args(embed) == ["--embeddings", "--pooling", "mean"]
    assert embedding_args(chat) == []
    assert embedding_args(ManagedModel(path="/m.gguf", embeddings=True)) == ["--embeddings"]
    assert [provider.embeds(m) for m in ("embed", "cls", "chat", "nope")] == [
        True,
        True,
        False,
        False,
    ]


def test_embedding_models_of_a_provider_are_listed_and_embed() -> None:
    config = parse_config(
        """
[[providers]]
name = "o"
kind = "ollama"
base_url = "http://127.0.0.1:11435"
models = ["llama3.2"]
embedding_models = ["nomic-embed-text"]
"""
    )
    provider = config.providers[0]
    assert provider.models == ("llama3.2", "nomic-embed-text")
    assert provider.embeds("nomic-embed-text") and not provider.embeds("llama3.2")


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            managed('e = { path = "pypi:gemma3-270m", pooling = "mean" }'),
            "providers[0].managed.models.e.pooling",
            "set embeddings = true",
        ),
        (
            managed('e = { path = "pypi:gemma3-270m", embeddings = true, pooling = "avg" }'),
            "providers[0].managed.models.e.pooling",
            "none, mean, cls, last, rank",
        ),
        (
            managed('e = "pypi:gemma3-270m"').replace(
                'kind = "llamacpp-managed"', 'kind = "llamacpp-managed"\nembedding_models = ["e"]'
            ),
            "providers[0].embedding_models",
            "embeddings = true under [providers.managed.models.<id>]",
        ),
        (
            '[[providers]]\nname = "o"\nkind = "vllm"\nbase_url = "http://h"\n'
            'embedding_models = [" "]\n',
            "providers[0].embedding_models[0]",
            "must not be empty",
        ),
    ],
)
def test_mistakes_are_named(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="svir.toml")
    assert info.value.path == "svir.toml"
    assert info.value.field == field
    assert words in info.value.reason
