"""OpenAI's legacy text completions, fill-in-the-middle included.

    request.py  the request checked into the canonical completion request (pure)
    routes.py   its route: /v1/completions

The canonical completion request, its upstream dialects and the `text_completion` encoder are in
svir.wire.completions, which the chat call also reads (Ollama's raw generate is a completion too).
"""

from svir.protocols.completions.routes import install

__all__ = ["install"]
