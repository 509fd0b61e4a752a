"""mlx-lm's server: reasoning travels as `reasoning` (§4)."""

from __future__ import annotations

from svir.providers.base import ProviderKind

# mlx-lm takes text parts only: an image is refused with 404 before generation (§2.2).
# mlx-lm's server has no embeddings endpoint.
KIND = ProviderKind(name="mlx-lm", reasoning_key="reasoning", images=False, embeddings=None)
