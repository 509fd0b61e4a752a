"""OpenAI's legacy text completions, fill-in-the-middle included.

    routes.py  its route: /v1/completions

Its request parse and the upstream dialects are in svir.wire.completions, which the chat call
also reads.
"""

from svir.protocols.completions.routes import install

__all__ = ["install"]
