"""llama.cpp's `llama-server`: reasoning as `reasoning_content` (§4); native text completions."""

from __future__ import annotations

from typing import Final

from svir.providers.base import ProviderKind

# Kinds whose server is llama.cpp's: beside its OpenAI API, its own endpoints at its root
# (`server_root`): `/props`, the `meta` of its model list, and its tokenizer (`/apply-template`,
# `/tokenize`).
LLAMACPP_KINDS: Final = frozenset({"llamacpp", "llamacpp-managed"})


def server_root(base_url: str) -> str:
    """Where a llama.cpp server's own endpoints are: its OpenAI API's base URL without `/v1`."""
    return base_url.rstrip("/").removesuffix("/v1")


# Text completions go to its native `/completion`, fill-in-the-middle to `/infill` (which wraps
# the prefix and suffix in the model's own FIM tokens): its `/v1/completions` drops a `suffix`
# without a word, which would answer a FIM request with a plain continuation.
# Embeddings: `/v1/embeddings` (the server started with `--embeddings` and a pooling other than
# none), base64 on request, `dimensions` ignored.
KIND = ProviderKind(
    name="llamacpp",
    reasoning_key="reasoning_content",
    completions="llama",
    fim=True,
    embedding_dimensions=False,
    embeddings_base64=True,
)
