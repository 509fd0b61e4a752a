"""The gateway: the one entry point every front end (OpenAI, Ollama, threads) calls for a chat.

It resolves the model to a route, opens the upstream under the policy (retries, fallback, load
balancing), and hands back an opened `ChatCall` whose output the front end encodes its own way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from svir.chat import ChatCall
from svir.config import Config
from svir.policy.resilience import Resilience
from svir.policy.routing import Router
from svir.transport import Transport
from svir.wire.blobs import Blobs


class OpenChat(Protocol):
    def __call__(
        self,
        request: dict[str, Any],
        *,
        request_id: str,
        fields: dict[str, Any] | None,
        blobs: Blobs | None,
    ) -> Awaitable[ChatCall]: ...


# Wraps every open_chat, whatever the front end (svir.keys: keys, limits, ledger, metrics): it
# gets the call's arguments and `proceed`, the rest of the chain, which it calls (or not).
Interceptor = Callable[
    [dict[str, Any], str, dict[str, Any] | None, Blobs | None, OpenChat], Awaitable[ChatCall]
]


class Gateway:
    """Routing and policy around chat calls, shared by every front end."""

    def __init__(self, config: Config, environ: Mapping[str, str], client: Transport) -> None:
        self.config = config
        self.client = client
        self.router = Router(config, environ, self.client)
        self.policy = Resilience(config, self.router, self.client)
        self._open: OpenChat | None = None

    def add_interceptor(self, interceptor: Interceptor) -> None:
        """Wrap every later `open_chat` in `interceptor` (the last added runs first)."""
        inner: OpenChat = self._open or self._policy_open

        def wrapped(
            request: dict[str, Any],
            *,
            request_id: str,
            fields: dict[str, Any] | None,
            blobs: Blobs | None,
        ) -> Awaitable[ChatCall]:
            return interceptor(request, request_id, fields, blobs, inner)

        self._open = wrapped

    async def open_chat(
        self,
        request: dict[str, Any],
        *,
        request_id: str,
        fields: dict[str, Any] | None = None,
        blobs: Blobs | None = None,
    ) -> ChatCall:
        """Open the upstream for a validated chat request; raise GatewayError when it cannot be.

        `fields` (the request's log fields) learns which provider and model served.
        """
        if self._open is None:
            return await self.policy.open(
                request, request_id=request_id, fields=fields, blobs=blobs
            )
        return await self._open(request, request_id=request_id, fields=fields, blobs=blobs)

    def _policy_open(
        self,
        request: dict[str, Any],
        *,
        request_id: str,
        fields: dict[str, Any] | None,
        blobs: Blobs | None,
    ) -> Awaitable[ChatCall]:
        return self.policy.open(request, request_id=request_id, fields=fields, blobs=blobs)

    async def close(self) -> None:
        await self.client.close()
