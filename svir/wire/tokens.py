"""A cheap estimate of a chat (or text-completion) request's prompt tokens, before a server
counts them: what the key gate reserves for a call, and what Anthropic's count_tokens answers
when no upstream tokenizes.
"""

from __future__ import annotations

import math
from typing import Any, Final

import msgspec

__all__ = ["IMAGE_TOKENS", "MESSAGE_TOKENS", "estimate_input_tokens", "estimate_prompt_tokens"]

# What an image costs in prompt tokens, for the estimate: about a 512×512 tile and change.
IMAGE_TOKENS: Final = 1000
# Per message, the tokens of its role and framing.
MESSAGE_TOKENS: Final = 4


def _text_tokens(text: str) -> int:
    # About four characters a token in English; about one a token in CJK and the like.
    if text.isascii():
        return len(text)
    return len(text.encode()) * 4 // 3


def estimate_prompt_tokens(request: dict[str, Any]) -> int:
    """A cheap estimate of the prompt's tokens (a chat's messages and tools, a completion's
    prompt and suffix), before the server counts them."""
    units = 0  # quarter tokens
    images = 0
    messages = request.get("messages") or ()
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            units += _text_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                text = part.get("text")
                if isinstance(text, str):
                    units += _text_tokens(text)
                elif part.get("type") in ("image_url", "input_image"):
                    images += 1
        for key in ("reasoning_content", "reasoning", "name"):
            value = message.get(key)
            if isinstance(value, str):
                units += _text_tokens(value)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    for key in ("name", "arguments"):
                        value = fn.get(key)
                        if isinstance(value, str):
                            units += _text_tokens(value)
    # A text completion (svir.wire.completions) has its prompt and suffix where messages go.
    for key in ("prompt", "suffix"):
        value = request.get(key)
        if isinstance(value, str):
            units += _text_tokens(value)
    # A text completion's prompt and the suffix it fills up to (svir.wire.completions).
    for key in ("prompt", "suffix"):
        value = request.get(key)
        if isinstance(value, str):
            units += _text_tokens(value)
    tools = request.get("tools")
    if tools:
        units += len(msgspec.json.encode(tools))
    return math.ceil(units / 4) + MESSAGE_TOKENS * len(messages) + 3 + IMAGE_TOKENS * images


def estimate_input_tokens(inputs: list[str] | list[list[int]]) -> int:
    """The tokens of an embedding request's inputs: a token array counts its length, a text as
    a prompt's text does, each input with one token of its own (the server's BOS)."""
    units = 0
    tokens = 0
    for item in inputs:
        if isinstance(item, str):
            units += _text_tokens(item)
        else:
            tokens += len(item)
    return math.ceil(units / 4) + tokens + len(inputs)
