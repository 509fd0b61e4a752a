"""The client protocols svir speaks: one package each, all over the same gateway.

A protocol has two jobs: turn its request into the canonical chat request (the OpenAI-shaped
dict the gateway takes, checked by svir.providers), and turn the canonical events of the chat call
(svir.wire.events) into its bytes when streamed, or into its answer when not (through the one
fold of events into an answer, svir.wire.answer). Each package holds both, pure (no IO, tested
as functions), beside its HTTP part, `routes.py`, which holds every route of the protocol and
`install(app)`: it adds them to the app's route table (`app.routes.add(method, template, handler,
error_shape)`) with any start-up and shut-down hooks. A handler reads its body with
svir.protocols.http, makes its call's context there (`new_call_context(scope, rid, "<protocol>")`,
svir.call), passes it to `gateway.open_chat(ctx, request)`, raises what goes wrong, and leaves
every error answer to the app's one error mapper (svir.edges.app), which answers in the shape the
route registered.

    openai_chat/   OpenAI Chat Completions: /v1/chat/completions, /v1/models
    completions/   OpenAI's legacy text completions: /v1/completions (FIM by suffix)
    embeddings/    OpenAI embeddings: /v1/embeddings (an embedding call, svir.embeddings)
    ollama/        Ollama's native API: /, /api/chat, /api/generate, /api/embed, /api/tags, ...
    anthropic/     Anthropic Messages: /v1/messages, /v1/messages/count_tokens, its model list
    responses/     OpenAI's Responses API: /v1/responses and the stored responses
    threads/       svir's threads API, /v1/threads (the threads themselves: svir.threads)
    http.py        the plumbing they share: body with its limit, JSON, SSE/NDJSON, the owner of
                   what a request stores, a stream's early start, ...
    router.py      the one route table (path templates, header variants, 404 and 405) and
                   `Host`, the app's face

A new client protocol is a new folder beside these, `svir/protocols/<protocol>/` with its
`__init__.py` exporting `install`, plus the line in `svir.server.build_app` that installs
it. Its tests go in `tests/<protocol>/`: the translation tested as pure functions, the handlers
in process over the tests' `MockTransport` (tests/support/mock_transport.py; see
tests/test_policy_inprocess.py), and its error shape added to tests/test_bad_input.py's routes.

Layer: a protocol imports the core (svir.chat, svir.policy, svir.providers), the errors, the wire
core and the shared plumbing here, never another protocol; the app (svir.edges.app) and the
composition root (svir.server) import protocols, never the other way (tests/test_layers.py).
"""
