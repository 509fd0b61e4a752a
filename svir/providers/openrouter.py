"""OpenRouter: a hosted router that streams reasoning under `reasoning`."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(
    name="openrouter",
    # OpenRouter separates reasoning into its `reasoning` field for the models it routes.
    think_tags=False,
    reasoning_key="reasoning",
    key_required=True,
    default_base_url="https://openrouter.ai/api/v1",
)
