"""OpenAI's Chat Completions API, svir's canonical protocol.

    routes.py  its routes: /v1/chat/completions and /v1/models (OpenAI's list; Anthropic's when
               the request carries `anthropic-version`, as Anthropic's own package registers)

Its request is already the canonical chat request and its events the canonical stream, so its
translation is the wire core's (svir.wire.request, svir.wire.encoder).
"""

from svir.protocols.openai_chat.routes import install

__all__ = ["install"]
