"""Ollama's OpenAI-compatible endpoint, which carries reasoning as `reasoning` both ways."""

from __future__ import annotations

from svir.providers.base import ProviderKind

# No default base URL: Ollama's usual port, 11434, is also svir's, and a default pointing at
# svir itself would send every request round in a loop.
# Its `/v1/completions` takes `suffix` and fills in the middle with the model's template, or
# refuses a model without the `insert` capability ("does not support insert").
KIND = ProviderKind(name="ollama", reasoning_key="reasoning", fim=True)
