"""Any server that speaks OpenAI-compatible chat and needs nothing special: the common defaults."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(name="openai-compatible")
