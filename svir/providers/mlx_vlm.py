"""mlx-vlm's server: it sends reasoning under both keys (§4); `reasoning_content` is its own."""

from __future__ import annotations

from svir.providers.base import ProviderKind

# `reasoning` is only mlx-vlm's alias for `reasoning_content`, so one key is enough going back.
# Its server has no text-completion endpoint and no embeddings endpoint.
KIND = ProviderKind(
    name="mlx-vlm", reasoning_key="reasoning_content", completions=None, embeddings=None
)
