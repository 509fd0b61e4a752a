"""vLLM: its reasoning parser streams `reasoning` (§4), so reasoning goes back under that key."""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(name="vllm", reasoning_key="reasoning")
