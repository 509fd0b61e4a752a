"""Moonshot's Kimi API: no sampling parameters, and thinking switched off unless asked for."""

from __future__ import annotations

from typing import Any

from svir.providers.base import ProviderKind


def adapt_body(body: dict[str, Any]) -> dict[str, Any]:
    """Turn thinking off, unless the client asked for a thinking setting itself.

    Clients written for plain chat (Copilot and the like) show nothing of the reasoning and only
    wait longer for it; a client that sends `thinking` knows what it wants.
    """
    body.setdefault("thinking", {"type": "disabled"})
    return body


KIND = ProviderKind(
    name="kimi",
    think_tags=False,
    # Kimi K2.5 and later refuse any temperature but their own, and clients send one by habit.
    default_drop=frozenset({"temperature", "top_p"}),
    reasoning_key="reasoning_content",
    key_required=True,
    default_base_url="https://api.moonshot.ai/v1",
    adapt_body=adapt_body,
    completions=None,  # no text-completion endpoint
)
