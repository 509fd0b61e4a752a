"""OpenAI's Responses API.

request.py  a Responses request as the canonical chat request (pure)
encode.py   the canonical events as the Responses stream and response object (pure)
sealed.py   reasoning sealed into `encrypted_content` for a stateless client (AES-GCM)
routes.py   its routes: /v1/responses and the stored responses
"""

from svir.protocols.responses.routes import install

__all__ = ["install"]
