"""svir's own API keys (docs/keys.md): what a key is (`model.py`), its rate limits and token
budgets and the limiter that counts them (`limits.py`, with `limits_redis.py` across replicas).

Nothing here imports the chat core, so that a call can carry its key: the gate that holds a call
to its key's limits and the authentication of a request are policy (svir.policy.key_gate,
svir.policy.auth), the key store a store (svir.store.keys), and the admin API that puts it all
on an App an edge (`svir.edges.keys_service.install(app)`). The key of the request being served is
`svir.asgi.caller_key(scope)` (None when svir runs without keys).
"""

from __future__ import annotations
