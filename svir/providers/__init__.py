"""The kinds of upstream server svir knows, each in its own module, and the request rewriting
that applies them.

A new kind is a module here whose `ProviderKind` says, as data, how that server differs (URLs,
auth headers, what it rejects or needs, and its body builder and stream decoder when it does not
speak Chat Completions), added to `KINDS` below; its name is then a valid `kind` in the config.
Its tests: tests/test_providers.py, tests/test_adaptation.py, and its recorded streams in
tests/conformance/.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from svir.providers import (
    anthropic,
    azure,
    gemini,
    kimi,
    llamacpp,
    llamacpp_managed,
    lmstudio,
    mlx_lm,
    mlx_vlm,
    ollama,
    openai,
    openai_compatible,
    openrouter,
    vllm,
)
from svir.providers.base import ProviderKind
from svir.providers.request import (
    build_upstream_body,
    check_chat_fields,
    check_tools,
    split_model,
    validate_chat_request,
    validate_chat_settings,
)

__all__ = [
    "KINDS",
    "ProviderKind",
    "build_upstream_body",
    "check_chat_fields",
    "check_tools",
    "get_kind",
    "split_model",
    "validate_chat_request",
    "validate_chat_settings",
]

KINDS: Mapping[str, ProviderKind] = MappingProxyType(
    {
        module.KIND.name: module.KIND
        for module in (
            openai_compatible,
            openai,
            azure,
            anthropic,
            openrouter,
            gemini,
            kimi,
            ollama,
            lmstudio,
            llamacpp,
            llamacpp_managed,
            vllm,
            mlx_lm,
            mlx_vlm,
        )
    }
)


def get_kind(name: str) -> ProviderKind:
    """The kind called `name`; KeyError naming the known kinds when there is none."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown kind {name!r} (known: {', '.join(sorted(KINDS))})") from None
