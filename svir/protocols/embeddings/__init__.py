"""OpenAI's embeddings API.

    routes.py  its route: /v1/embeddings

The request checks are in svir.wire.embeddings, which Ollama's /api/embed shares.
"""

from svir.protocols.embeddings.routes import install

__all__ = ["install"]
