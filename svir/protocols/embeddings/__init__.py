"""OpenAI's embeddings API.

    request.py  the request checked into the canonical embedding request, the answer (pure)
    routes.py   its route: /v1/embeddings

The canonical embedding request, the checks every protocol's request shares and the vectors are
svir.wire.embeddings; the call is svir.embeddings.
"""

from svir.protocols.embeddings.routes import install

__all__ = ["install"]
