"""Policy composed around a chat call, before the client has seen a byte: resolution and balancing
(`routing.py`), retries, fallback and breakers (`resilience.py`), composed into the one gateway a
call is opened through (`gateway.py`); a key's authentication (`auth.py`) and the gate that holds
a call to its key's limits and budgets (`key_gate.py`, the limits themselves in svir.keys); the
catalog of the models served (`catalog.py`), and the bounded per-model state they keep
(`bounded.py`). A new rule goes in the module of its kind, or in an interceptor added with
`svir.policy.gateway.Gateway.add_interceptor`; its tests drive the whole app in process over
the tests' `MockTransport` (tests/support/mock_transport.py) with the clock injected
(tests/test_policy_inprocess.py).
"""
