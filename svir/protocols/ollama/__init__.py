"""Ollama's native API.

embed.py      its embedding requests and answers (pure)
translate.py  its requests as canonical requests, the events as its NDJSON and answers (pure)
routes.py     its routes: /, /api/chat, /api/generate, /api/embed, /api/tags, /api/show, ...
"""

from svir.protocols.ollama.routes import install

__all__ = ["install"]
