"""llama.cpp's `llama-server`: the common defaults; reasoning as `reasoning_content` (§4)."""

from __future__ import annotations

from svir.providers.base import ProviderKind

# Embeddings: `/v1/embeddings` (the server started with `--embeddings` and a pooling other than
# none), base64 on request, `dimensions` ignored.
KIND = ProviderKind(
    name="llamacpp",
    reasoning_key="reasoning_content",
    embedding_dimensions=False,
    embeddings_base64=True,
)
