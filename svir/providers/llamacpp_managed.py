"""llama.cpp's `llama-server`, run by svir itself for the GGUF files of `[providers.managed]`.

On the wire it is `llamacpp` (inline `<think>` split off, reasoning sent back as
`reasoning_content`); what differs is where it lives: svir starts the server on a free loopback
port when a model is asked for (`svir.edges.managed`), so there is no base URL to configure and
nothing to discover: the models are the configured ones.
"""

from __future__ import annotations

from svir.providers.base import ProviderKind

KIND = ProviderKind(
    name="llamacpp-managed",
    reasoning_key="reasoning_content",
    discover=False,
    closed_models=True,
    completions="llama",  # as `llamacpp`'s
    fim=True,
    embedding_dimensions=False,
    embeddings_base64=True,
)
