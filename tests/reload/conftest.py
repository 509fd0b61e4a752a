"""The managed-provider fixtures (the real llama-server and Gemma 3 270M) for the reload tests
of managed models."""

from tests.managed.conftest import gguf, llama_binary

__all__ = ["gguf", "llama_binary"]
