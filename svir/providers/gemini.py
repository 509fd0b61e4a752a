"""Google Gemini through its OpenAI-compatible surface, which lives under `/v1beta/openai`."""

from __future__ import annotations

import urllib.parse

from svir.providers.base import ProviderKind, base_as_given

_OPENAI_PATH = "/v1beta/openai"


def normalize_base(url: str) -> str:
    """The base as written, or the OpenAI-compatible path when only the host is given.

    Appending `/v1` as for other servers would give `/v1beta/openai/v1`, which does not exist.
    """
    base = base_as_given(url)
    if not urllib.parse.urlsplit(base).path:
        base += _OPENAI_PATH
    return base


KIND = ProviderKind(
    name="gemini",
    # Gemini marks its thoughts with <thought>, and only on request; a literal <think> is text.
    think_tags=False,
    # The compatibility layer takes no reasoning on assistant messages.
    reasoning_key=None,
    key_required=True,
    default_base_url="https://generativelanguage.googleapis.com" + _OPENAI_PATH,
    normalize_base=normalize_base,
    completions=None,  # no text-completion endpoint
)
