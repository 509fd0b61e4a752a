"""The gateway: the one entry point every front end (OpenAI, Ollama, threads) calls for a chat.

It resolves the model to a route, opens the upstream under the policy (retries, fallback, load
balancing), and hands back an opened `ChatCall` whose output the front end encodes its own way.
The front end's `CallContext` (svir.call) goes along and comes back with the call's outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from svir.call import CallContext
from svir.chat import ChatCall
from svir.config import Config
from svir.policy.resilience import Resilience, Timing
from svir.policy.routing import Router
from svir.transport import Transport

# Opens a chat call for a validated request: the policy, or the chain of interceptors around it.
OpenChat = Callable[[CallContext, dict[str, Any]], Awaitable[ChatCall]]
# Wraps every open_chat, whatever the front end (svir.keys: keys, limits, ledger, metrics): it
# gets the call's context and request and `proceed`, the rest of the chain, which it calls (or
# not).
Interceptor = Callable[[CallContext, dict[str, Any], OpenChat], Awaitable[ChatCall]]


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
        self._open: OpenChat = self.policy.open

    def add_interceptor(self, interceptor: Interceptor) -> None:
        """Wrap every later `open_chat` in `interceptor` (the last added runs first)."""
        inner = self._open

        def wrapped(ctx: CallContext, request: dict[str, Any]) -> Awaitable[ChatCall]:
            return interceptor(ctx, request, inner)

        self._open = wrapped

    async def open_chat(self, ctx: CallContext, request: dict[str, Any]) -> ChatCall:
        """Open the upstream for a validated chat request; raise GatewayError when it cannot be.

        `ctx.outcome` learns who was tried, which provider and model served, and (once the call
        closes) what it measured.
        """
        return await self._open(ctx, request)

    async def close(self) -> None:
        await self.client.close()
