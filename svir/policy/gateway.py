"""The gateway: the one entry point every front end (OpenAI, Ollama, threads) calls for a chat,
or for embeddings, or for a prompt's tokens as its model's server counts them.

It resolves the model to a route, opens the upstream under the policy (retries, fallback, load
balancing), and hands back an opened `ChatCall` whose output the front end encodes its own way
(or an `EmbeddingCall` with its vectors). The front end's `CallContext` (svir.call) goes along and
comes back with the call's outcome; its `operation` says which call it is, and both go through
the one chain of interceptors. What watches the calls (svir.observers) is told from one place,
the gateway's `observers`: the policy tells them of each attempt, the key gate of each call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from svir.call import EMBEDDINGS, CallContext
from svir.chat import Call, ChatCall, UpstreamTarget, upstream_headers
from svir.config.model import Config
from svir.config_diff import ConfigDiff
from svir.embeddings import EmbeddingCall
from svir.errors import BadRequest, GatewayError
from svir.observers import Observers
from svir.policy.resilience import Resilience, Timing
from svir.policy.routing import Router, RoutingTable
from svir.providers import build_upstream_body
from svir.providers.llamacpp import LLAMACPP_KINDS, server_root
from svir.transport import Transport
from svir.wire.errors import BodyError, UpstreamError

# Opens a call for a validated request (a chat, or embeddings: `CallContext.operation`): the
# policy, or the chain of interceptors around it.
OpenCall = Callable[[CallContext, dict[str, Any]], Awaitable[Call]]
OpenChat = OpenCall
# Wraps every call opened, whatever the front end and the operation (svir.edges.keys_service:
# keys, limits, ledger, metrics): it gets the call's context and request and `proceed`, the rest
# of the chain, which it calls (or not), and gives back the call `proceed` opened.
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
        # What watches requests and calls: empty until the app's builder composes it.
        self.observers = Observers()
        self.policy = Resilience(
            config, self.router, self.client, timing=timing, observers=self.observers
        )
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

    async def count_tokens(self, chat: dict[str, Any], request_id: str) -> int | None:
        """The prompt of the checked chat request `chat` in tokens, as its model's llama.cpp
        server counts them (its chat template applied, then tokenized); None where svir cannot
        ask: another kind of server, a model no route has, a server that fails to answer.

        Asked as the chat call asks its upstream: the route the policy would try first, through
        the policy's transport, the route's network (proxy, TLS) and the same headers (svir's
        request id, the provider's extra headers, its key). Not a call: no interceptor sees it,
        and nothing is charged to a key or written to the ledger."""
        try:
            # A model without a configured route is resolved by route_for, once, as the policy
            # does it (the UpstreamTarget found is kept in `resolved`).
            resolved: dict[str, UpstreamTarget] = {}
            targets = self.policy.route_for(chat["model"], resolved).targets
            if not targets:
                return None
            model = targets[0].model
            route = resolved.get(model) or self.router.resolve(model)
        except (GatewayError, BadRequest):
            return None
        if route.kind.name not in LLAMACPP_KINDS:
            return None
        held = False
        try:
            base = route.base_url
            if route.ensure is not None:
                base = await route.ensure(route.model_id)
                # Held until both answers are in, as a chat call holds it: a swap may not stop
                # the server between the template and the tokens.
                held = route.release is not None
            root = server_root(base)
            headers = upstream_headers(route, request_id, "application/json")
            # What the chat call would send this server, so the template sees the same prompt.
            sent = build_upstream_body(
                chat, kind=route.kind, provider=route.provider, model_id=route.model_id
            )
            template = {"messages": sent["messages"]}
            if sent.get("tools"):
                template["tools"] = sent["tools"]
            timeout = route.timeouts.first_byte
            fetch = self.policy.client.get_json_bytes
            answer = await fetch(
                f"{root}/apply-template",
                headers=headers,
                timeout=timeout,
                body=msgspec.json.encode(template),
                network=route.network,
            )
            prompt = msgspec.json.decode(answer)["prompt"]
            answer = await fetch(
                f"{root}/tokenize",
                headers=headers,
                timeout=timeout,
                body=msgspec.json.encode({"content": prompt, "add_special": True}),
                network=route.network,
            )
            tokens = msgspec.json.decode(answer)["tokens"]
        except (UpstreamError, BodyError, msgspec.DecodeError, KeyError, TypeError):
            return None
        finally:
            if held and route.release is not None:
                route.release(route.model_id)
        return len(tokens) if isinstance(tokens, list) else None

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
