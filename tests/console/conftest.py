"""Fixtures of the console tests: the real `llama-server` and Gemma 3 270M of the managed tests
(tests/managed/conftest.py: required, never skipped)."""

from __future__ import annotations

from tests.managed.conftest import gguf, llama_binary

__all__ = ["gguf", "llama_binary"]
