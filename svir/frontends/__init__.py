"""The front ends: one module per client protocol svir speaks, all over the same gateway.

A front end has two jobs: turn its protocol's request into the canonical chat request (the
OpenAI-shaped dict the gateway takes, checked by svir.providers), and turn the canonical events
of the chat call (svir.wire.events) into its protocol's bytes when streamed, or into its answer
when not (through the one fold of events into an answer, svir.wire.answer). Each module has the
same shape: a docstring naming the protocol and its routes, and `install(app)`, which adds its
routes to the app's route table (`app.routes.add(method, template, handler, error_shape)`) and
any start-up and shut-down hooks. A handler reads its body with `svir.frontends.http`, makes its
chat call's context there (`new_call_context(scope, rid, "<protocol>")`, svir.call) and passes it
to `gateway.open_chat(ctx, request)`, raises what goes wrong, and leaves every error answer to the
app's one error mapper (svir.edges.app), which answers in the shape the route registered.

    openai_chat.py        OpenAI Chat Completions: /v1/chat/completions, /v1/models
    completions.py        OpenAI's legacy text completions: /v1/completions (FIM by suffix)
    embeddings.py         OpenAI embeddings: /v1/embeddings (an embedding call, svir.embeddings,
                          opened by `gateway.open_embeddings`; Ollama's in ollama.py)
    ollama.py             Ollama's native API: /api/chat, /api/generate, /api/embed, /api/tags,
                          /api/show, /api/ps, ...
    ollama_translate.py   its translation both ways, pure (no IO), tested on its own
    anthropic.py          Anthropic Messages: /v1/messages, /v1/messages/count_tokens, HEAD /
                          (its pure translation is in the wire core: svir.wire.anthropic*)
    threads.py            svir's threads API, /v1/threads (the threads themselves: svir.threads)
    responses.py          OpenAI's Responses API: /v1/responses, stored responses (their SQL:
                          svir.store.responses; the translation: svir.wire.responses*)
    http.py               the plumbing they share: body with its limit, JSON, SSE/NDJSON, the
                          owner of what a request stores, a stream's early start, ...
    routes.py             the one router (path templates, 404 and 405) and `Host`, the app's face

A new client protocol (embeddings) is
one new module here, `svir/frontends/<protocol>.py` (with a pure `<protocol>_translate.py`
beside it when its translation is big enough to test on its own), plus one line in
`svir.edges.server.build_app` that installs it. Its tests go in `tests/<protocol>/` (or
`tests/test_<protocol>.py` for a small one): the translation tested as pure functions, the
handlers in process over `svir.testing.MockTransport` (see tests/test_policy_inprocess.py), and
its error shape added to tests/test_bad_input.py's routes.

Layer: front ends import the core (svir.chat, svir.gateway, svir.policy, svir.providers), the
errors and the wire core; the app and the composition root (svir.edges) import front ends, never
the other way (tests/test_layers.py).
"""
