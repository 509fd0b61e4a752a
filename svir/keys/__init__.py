"""svir's own API keys, their limits and budgets, and the usage they run up (docs/keys.md).

`svir.keys.service.install(app)` puts it all on an App: authentication, the admin API,
GET /v1/usage, the limits around every chat call, the usage ledger, /metrics and tracing.
`caller_key(scope)` is the key of the request being served (None when svir runs without keys).
"""

from __future__ import annotations

from svir.keys.context import caller_key

__all__ = ["caller_key"]
