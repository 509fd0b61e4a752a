"""svir's threads API.

routes.py  its routes: /v1/threads and below (the threads themselves are svir.threads)
"""

from svir.protocols.threads.routes import install

__all__ = ["install"]
