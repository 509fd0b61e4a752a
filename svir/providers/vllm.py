"""vLLM: its reasoning parser streams `reasoning` (§4), so reasoning goes back under that key.

Without a tool-call parser vLLM rejects any request with tools (§2.4); its message names flags,
not the problem, so svir says what the server lacks.
"""

from __future__ import annotations

from svir.providers.base import ProviderKind
from svir.wire.errors import ErrorKind, UpstreamError

_NO_PARSER = ("--enable-auto-tool-choice", "--tool-call-parser")


def explain_error(error: UpstreamError) -> UpstreamError:
    """Name the missing tool-call parser when vLLM rejects tools for want of one."""
    if error.kind is ErrorKind.REJECTED and any(flag in error.message for flag in _NO_PARSER):
        return UpstreamError(
            ErrorKind.UNSUPPORTED_INPUT,
            "This vLLM server cannot call tools: it runs without a tool-call parser "
            "(start it with --enable-auto-tool-choice --tool-call-parser <name>). "
            f"The server said: {error.message}",
            status=error.status,
            code=error.code,
            type=error.type,
            param="tools",
        )
    return error


KIND = ProviderKind(
    name="vllm", reasoning_key="reasoning", explain_error=explain_error, embeddings_base64=True
)
