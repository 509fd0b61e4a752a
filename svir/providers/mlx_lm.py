"""mlx-lm's server: reasoning travels as `reasoning` (§4)."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(name="mlx-lm", reasoning_key="reasoning")
