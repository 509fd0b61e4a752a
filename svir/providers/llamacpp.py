"""llama.cpp's `llama-server`: the common defaults; reasoning as `reasoning_content` (§4)."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(name="llamacpp", reasoning_key="reasoning_content")
