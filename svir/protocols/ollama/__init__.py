"""Ollama's native API.

embed.py      its embedding requests and answers (pure)
request.py    its /api/chat and /api/generate requests as canonical requests (pure)
encode.py     the canonical events as its NDJSON lines and non-streamed answers (pure)
listings.py   its words for svir and its models: /api/version, /api/tags, /api/ps, /api/show
routes.py     its routes: /, /api/chat, /api/generate, /api/embed, /api/tags, /api/show, ...
"""

from svir.protocols.ollama.routes import install

__all__ = ["install"]
