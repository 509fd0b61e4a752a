"""Anthropic's Messages API: svir speaks Anthropic to the server (`/v1/messages`, the key in
`x-api-key` with `anthropic-version`) and reads its event stream (docs/providers.md).
"""

from __future__ import annotations

import urllib.parse
from types import MappingProxyType

from svir.providers.anthropic_dialect import (
    ANTHROPIC_VERSION,
    AnthropicStreamDecoder,
    messages_body,
)
from svir.providers.base import ProviderKind, ProviderSettings
from svir.wire.errors import BaseURLError
from svir.wire.models import normalize_base_url

# Anthropic lists 20 models a page unless asked for more; 1000 is the most it gives at once.
_MODELS_PAGE = 1000


def normalize_base(url: str) -> str:
    """`https://api.anthropic.com` and `https://api.anthropic.com/v1` alike give the `/v1` base."""
    if urllib.parse.urlsplit(url.strip()).path.rstrip("/").endswith("/v1/messages"):
        raise BaseURLError("base URL names an endpoint (/v1/messages); give the part before it")
    return normalize_base_url(url)


def chat_url(base: str, model: str, provider: ProviderSettings) -> str:
    return f"{base.rstrip('/')}/messages"


def models_url(base: str, provider: ProviderSettings) -> str:
    return f"{base.rstrip('/')}/models?limit={_MODELS_PAGE}"


KIND = ProviderKind(
    name="anthropic",
    # Thinking comes as blocks of its own; a literal <think> in the text is text.
    think_tags=False,
    # Reasoning goes back only as signed thinking blocks (`thinking_blocks`), never as text.
    reasoning_key=None,
    auth_header="x-api-key",
    # No `anthropic-beta`: a beta flag changes what the API accepts and answers, so it is the
    # provider's `extra_headers` to add, knowingly.
    api_headers=MappingProxyType({"anthropic-version": ANTHROPIC_VERSION}),
    key_required=True,
    default_base_url="https://api.anthropic.com",
    normalize_base=normalize_base,
    chat_url=chat_url,
    models_url=models_url,
    build_body=messages_body,
    new_decoder=AnthropicStreamDecoder,
    completions=None,  # no text-completion endpoint
    # Anthropic has no embeddings API.
    embeddings=None,
)
