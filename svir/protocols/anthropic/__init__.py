"""Anthropic's Messages API.

    body.py     its request body as msgspec structs, their type errors in svir's words (pure)
    request.py  an Anthropic request as the canonical chat request, and count_tokens (pure)
    encode.py   the canonical events as Anthropic's SSE stream or message, its errors (pure)
    routes.py   its routes: /v1/messages, /v1/messages/count_tokens, and its model list

svir speaking Anthropic to an upstream is a provider's dialect: svir.providers.anthropic_dialect.
"""

from svir.protocols.anthropic.routes import install

__all__ = ["install"]
