"""The gateway: the one entry point every front end (OpenAI, Ollama, threads) calls for a chat,
or for embeddings.

It resolves the model to a route, opens the upstream under the policy (retries, fallback, load
balancing), and hands back an opened `ChatCall` whose output the front end encodes its own way
(or an `EmbeddingCall` with its vectors). The front end's `CallContext` (svir.call) goes along and
comes back with the call's outcome; its `operation` says which call it is, and both go through
the one chain of interceptors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from svir.call import EMBEDDINGS, CallContext
from svir.chat import Call, ChatCall
from svir.config.model import Config
from svir.config_diff import ConfigDiff
from svir.embeddings import EmbeddingCall
from svir.policy.resilience import Resilience, Timing
from svir.policy.routing import Router, RoutingTable
from svir.transport import Transport

# Opens a call for a validated request (a chat, or embeddings: `CallContext.operation`): the
# policy, or the chain of interceptors around it.
OpenCall = Callable[[CallContext, dict[str, Any]], Awaitable[Call]]
OpenChat = OpenCall
# Wraps every call opened, whatever the front end and the operation (svir.keys: keys, limits,
# ledger, metrics): it gets the call's context and request and `proceed`, the rest of the chain,
# which it calls (or not), and gives back the call `proceed` opened.
Interceptor = Callable[[CallContext, dict[str, Any], OpenCall], Awaitable[Call]]


class Gateway:
    """Routing and policy around chat calls, shared by every front end."""

    def __init__(
        self,
        config: Config,
        environ: Mapping[str, str],
        client: Transport,
        *,
        timing: Timing | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.router = Router(config, environ, self.client)
        self.policy = Resilience(config, self.router, self.client, timing=timing)
        self._open: OpenCall = self.policy.open

    def add_interceptor(self, interceptor: Interceptor) -> None:
        """Wrap every later `open_chat` in `interceptor` (the last added runs first)."""
        inner = self._open

        def wrapped(ctx: CallContext, request: dict[str, Any]) -> Awaitable[Call]:
            return interceptor(ctx, request, inner)

        self._open = wrapped

    async def open_chat(self, ctx: CallContext, request: dict[str, Any]) -> ChatCall:
        """Open the upstream for a validated chat request; raise GatewayError when it cannot be.

        `ctx.outcome` learns who was tried, which provider and model served, and (once the call
        closes) what it measured.
        """
        # What the policy opens for a chat context is a ChatCall (typing.cast would cost a call).
        return await self._open(ctx, request)  # type: ignore[return-value]

    async def open_embeddings(self, ctx: CallContext, request: dict[str, Any]) -> EmbeddingCall:
        """Open an embedding call for a checked embedding request (svir.wire.embeddings) and read
        its answer, through the same chain as a chat; `ctx.operation` must be EMBEDDINGS."""
        assert ctx.operation == EMBEDDINGS, "an embedding call's context says EMBEDDINGS"
        return await self._open(ctx, request)  # type: ignore[return-value]

    async def embed(self, ctx: CallContext, request: dict[str, Any]) -> EmbeddingCall:
        """Open the embedding call (its answer read whole) and close it at once: the vectors stay
        on it, for the front end to answer with."""
        call = await self.open_embeddings(ctx, request)
        call.close()
        return call

    def reconfigure(self, config: Config, table: RoutingTable, diff: ConfigDiff) -> None:
        """Serve `config` (whose routing is `table`) from now on: the router's table swapped in
        one assignment (a call opened before keeps the table it started with), and the learned
        state `diff` says no longer holds dropped (the rest carries on). No await: no request
        sees half of it."""
        self.config = config
        self.router.reconfigure(table, forget=diff.providers_changed | diff.providers_removed)
        gone = diff.providers_removed
        self.policy.forget(
            diff.fresh_deployments(),
            quirks=diff.servers_changed | gone,
            budgets=diff.providers_changed | gone,
        )

    async def close(self) -> None:
        await self.client.close()
