"""OpenAI's Responses API.

request.py   a Responses request as the canonical chat request (pure): its top-level fields
checks.py    the translation's mistakes (ResponsesRequestError), type checks and warnings
tools.py     its tools as the chat functions offered, the flat names of namespace tools
items.py     its input items and its history's as the chat messages they make
content.py   a message's or a tool output's content parts as canonical content
encode.py    the canonical events as the Responses stream and its output items (pure)
response.py  the response object: its defaults, usage, failure, lifecycle events (pure)
frames.py    the bytes of its SSE events, made once (pure)
sealed.py    reasoning sealed into `encrypted_content` for a stateless client (AES-GCM)
routes.py    its routes: /v1/responses and the stored responses
"""

from svir.protocols.responses.routes import install

__all__ = ["install"]
