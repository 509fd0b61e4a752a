"""Ollama's OpenAI-compatible endpoint, which carries reasoning as `reasoning` both ways, and its
own `/api/embed` for embeddings."""

from __future__ import annotations

from svir.providers.base import ProviderKind, ProviderSettings


def embed_url(base: str, model: str, provider: ProviderSettings) -> str:
    """Ollama's own `/api/embed` (which takes `truncate`, `keep_alive` and `options`), beside its
    OpenAI-compatible `/v1`."""
    return f"{base.rstrip('/').removesuffix('/v1')}/api/embed"


# No default base URL: Ollama's usual port, 11434, is also svir's, and a default pointing at
# svir itself would send every request round in a loop.
# Its `/v1/completions` takes `suffix` and fills in the middle with the model's template, or
# refuses a model without the `insert` capability ("does not support insert").
KIND = ProviderKind(
    name="ollama",
    reasoning_key="reasoning",
    fim=True,
    embeddings="ollama",
    embeddings_url=embed_url,
)
