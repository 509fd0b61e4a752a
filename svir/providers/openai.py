"""OpenAI's own API: `max_completion_tokens`, no reasoning sent back, no inline `<think>`."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(
    name="openai",
    think_tags=False,
    # Reasoning models refuse `max_tokens`; every model takes `max_completion_tokens`.
    max_tokens_field="max_completion_tokens",
    # The API returns no reasoning text, so there is none to send back and no key that takes it.
    reasoning_key=None,
    key_required=True,
    default_base_url="https://api.openai.com/v1",
    # Its legacy `/v1/completions` (gpt-3.5-turbo-instruct) takes `suffix`.
    fim=True,
    embeddings_base64=True,
)
