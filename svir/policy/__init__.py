"""Policy composed around a chat call, before the client has seen a byte: resolution and balancing
(`routing.py`), retries, fallback and breakers (`resilience.py`), rate limits and token budgets
(`limits.py`, with `limits_redis.py` across replicas), and the bounded per-model state they keep
(`bounded.py`). A new rule goes in the module of its kind, or in an interceptor added with
`svir.gateway.Gateway.add_interceptor`; its tests drive the whole app in process over the tests'
`MockTransport` (tests/support/mock_transport.py) with the clock injected
(tests/test_policy_inprocess.py).
"""
