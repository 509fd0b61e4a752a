"""What is true of each model as svir serves it (`ModelFacts`): the context it really runs with,
what it can do, its size, for `/api/show`, `/api/tags`, `/api/ps` and `/v1/models`; and the one
check of a request's context against it (`check_context`) that `/api/chat` and `/api/generate`
share.

The facts come from the config (a provider's `images`, the managed model's `ctx`), from the
model list the router already caches (svir.policy.routing: vLLM's `max_model_len`, llama.cpp's
`meta`), and, for llama.cpp's servers, from `/props` (the context of a slot, images, tools). What
a server says is fetched once per `[server] models_cache_ttl` seconds (a failure is asked again
after a few seconds), never per request, and held for the known models and a bounded number of
others (svir.policy.bounded). A server svir runs itself (svir.edges.managed) is a `Runtime`: its
context is read live, and it is asked for a bigger one when a request's `num_ctx` needs it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from svir.chat import UpstreamTarget
from svir.errors import GatewayError, request_error
from svir.policy.bounded import BoundedMap
from svir.policy.routing import Router
from svir.providers.llamacpp import LLAMACPP_KINDS, server_root
from svir.transport import Network
from svir.wire.classify import to_client_error
from svir.wire.errors import ProtocolError, UpstreamError
from svir.wire.model_meta import ModelFacts, ServerProps, parse_props, quantization_level
from svir.wire.models import ModelInfo, parse_model_list
from svir.wire.tokens import estimate_prompt_tokens

__all__ = ["Catalog", "Loaded", "Runtime", "context_refusal"]

log = logging.getLogger("svir.catalog")

FETCH_TIMEOUT: Final = 5.0
FAILED_RETRY: Final = 5.0

# Name fragments of models that take images, and of models that reason: the last resort when
# no server says, as Ollama's own capabilities are read from the model file.
_VISION_HINT: Final = re.compile(
    r"(?:^|[-_/.:])(?:vl|vlm|vision|llava|pixtral|bakllava|moondream|minicpm-v|omni)(?:$|[-_/.:\d])",
    re.IGNORECASE,
)
_THINKING_HINT: Final = re.compile(
    r"(?:^|[-_/.:])(?:qwen3|r1|qwq|gpt-oss|magistral|think|thinking|reasoning|o[1345])"
    r"(?:$|[-_/.:\d])",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A model whose server runs now, for `/api/ps`."""

    model_id: str
    context_length: int
    # Wall-clock seconds when it is unloaded if unused (None: never).
    expires_at: float | None
    size: int


class Runtime(Protocol):
    """The servers svir runs itself for one provider (svir.edges.managed's Supervisor)."""

    def context_of(self, model_id: str) -> int | None:
        """The context the model's server runs with (or will start with)."""
        ...

    def server_url(self, model_id: str) -> str | None:
        """The base URL (no `/v1`) of its running server, or None."""
        ...

    def loaded(self) -> list[Loaded]: ...

    async def require_context(self, model_id: str, context: int) -> None:
        """Serve the model with at least `context` tokens from now on (restarting its server
        when it runs with less); raises UpstreamError when it cannot."""
        ...


# What a route is for the settings other front ends own: whether a model fills in the middle,
# whether it embeds.
RouteFact = Callable[[UpstreamTarget], bool]


def _fim(route: UpstreamTarget) -> bool:
    return route.fim


def _embeds(route: UpstreamTarget) -> bool:
    return route.provider.embeds(route.model_id)


class Catalog:
    """The facts of each model, fetched from its server and cached (see the module doc)."""

    def __init__(
        self,
        router: Router,
        *,
        clock: Callable[[], float] = time.monotonic,
        insert: RouteFact = _fim,
        embedding: RouteFact = _embeds,
    ) -> None:
        self.router = router
        self._clock = clock
        # What the completions and embeddings settings say of a route: whether it fills in the
        # middle (`UpstreamTarget.fim`: `fim` of the provider or managed model, else the kind's) and
        # whether it embeds (`ProviderConfig.embeds`: a managed model's `embeddings = true`, or
        # one of the provider's `embedding_models`).
        self.insert = insert
        self.embedding = embedding
        self.runtimes: dict[str, Runtime] = {}
        # By model name: until when, from which server, what it said.
        self._server: BoundedMap[str, _ServerSays] = router.bounded()

    @property
    def ttl(self) -> float:
        return self.router.ttl

    def set_runtime(self, provider: str, runtime: Runtime | None) -> None:
        """Read the models of `provider` from servers svir runs itself (None: no more)."""
        if runtime is None:
            self.runtimes.pop(provider, None)
        else:
            self.runtimes[provider] = runtime

    def forget(self, fresh: Iterable[str]) -> None:
        """After a reload: drop what the servers of the models `fresh` names said (a model name,
        or a `<provider>/` prefix), since another server or model file serves them now."""
        names = set(fresh)
        prefixes = tuple(n for n in names if n.endswith("/"))
        for name, _ in self._server.items():
            if name in names or (prefixes and name.startswith(prefixes)):
                del self._server[name]

    async def facts(self, name: str, route: UpstreamTarget) -> ModelFacts:
        """What is true of `name` (served by `route`) now."""
        kind = route.kind.name
        model_id = route.model_id
        runtime = self.runtimes.get(route.provider.name)
        props, info, infill = ServerProps(), None, None
        insert = self.insert(route)
        if runtime is not None:
            url = runtime.server_url(model_id)
            if url is not None:
                props, info, infill = await self._from_server(name, url, route, insert)
            elif (known := self._server.get(name)) is not None:
                # Stopped: what its server said when it last ran (the same model file).
                props, info, infill = known.props, known.info, known.infill
        elif kind in LLAMACPP_KINDS:
            base = server_root(route.base_url)
            props, info, infill = await self._from_server(name, base, route, insert)
        else:
            info = await self.router.listed_info(route.provider.name, model_id)
        context = props.context_length or (info.context_length if info else None)
        if runtime is not None:
            context = runtime.context_of(model_id) or context
        vision = route.kind.images_for(route.provider) and _vision(props, info, model_id)
        thinking = props.thinking if props.thinking is not None else _hint(_THINKING_HINT, model_id)
        return ModelFacts(
            name=name,
            model_id=model_id,
            kind=kind,
            context_length=context,
            context_train=info.context_train if info else None,
            parameters=info.parameters if info else None,
            size=info.size if info else None,
            quantization=_quantization(props, info, info.id if info else model_id),
            format="gguf" if kind in LLAMACPP_KINDS else "",
            tools=props.tools if props.tools is not None else True,
            vision=vision,
            thinking=thinking,
            # A llama.cpp server fills in the middle only with the model's FIM tokens: it is
            # asked (once per cache period) when svir's setting says the route may.
            insert=insert and infill is not False,
            embedding=self.embedding(route),
            # A model svir runs is named by its config; a llama.cpp server's by its file.
            served=info.id if info is not None and runtime is None else "",
        )

    async def check_context(
        self, name: str, route: UpstreamTarget, request: dict[str, Any], num_ctx: int | None
    ) -> None:
        """Refuse, before anything is sent, a request its model cannot take whole.

        `num_ctx` (Ollama's option) asks for a context: a server svir runs is restarted with it
        when it runs with less (never past the context the model was trained for); any other
        server's context is its own, and the request is checked against that. A prompt over the
        context the model runs with is a 400 `context_length_exceeded` with both sizes.
        """
        runtime = self.runtimes.get(route.provider.name)
        facts = await self.facts(name, route)
        context = facts.context_length
        if runtime is not None and num_ctx is not None and num_ctx > (context or 0):
            train = facts.context_train
            if train is not None and num_ctx > train:
                raise context_refusal(
                    f"options.num_ctx is {num_ctx}, and {name} was trained for a context of "
                    f"{train} tokens: ask for {train} or less"
                )
            try:
                await runtime.require_context(route.model_id, num_ctx)
            except UpstreamError as exc:
                raise GatewayError(to_client_error(exc), exc) from None
            context = runtime.context_of(route.model_id)
        if context is None:
            return
        estimate = estimate_prompt_tokens(request)
        if estimate > context:
            raise context_refusal(
                f"the prompt is about {estimate} tokens (svir's estimate) and {name} runs with "
                f"a context of {context} tokens: shorten it"
                + (", or ask for a bigger options.num_ctx" if runtime is not None else "")
            )

    async def _from_server(
        self, key: str, base: str, route: UpstreamTarget, insert: bool
    ) -> tuple[ServerProps, ModelInfo | None, bool | None]:
        """`/props` and `/v1/models` of the llama.cpp server at `base` (and with `insert`,
        whether its `/infill` works: None when not asked), cached under `key` (a restarted
        server on another port is asked again)."""
        now = self._clock()
        cached = self._server.get(key)
        if (
            cached is not None
            and now < cached.until
            and cached.base == base
            and (cached.infill is not None or not insert)
        ):
            return cached.props, cached.info, cached.infill
        headers = route.kind.auth_headers(route.api_key) if route.api_key else {}
        props, info, expires = ServerProps(), None, now + self.ttl
        try:
            props = parse_props(
                await self.router.client.get_json_bytes(
                    base + "/props", headers=headers, timeout=FETCH_TIMEOUT, network=route.network
                )
            )
            listed = parse_model_list(
                await self.router.client.get_json_bytes(
                    base + "/v1/models",
                    headers=headers,
                    timeout=FETCH_TIMEOUT,
                    network=route.network,
                )
            )
            info = next((i for i in listed if i.id == route.model_id), None) or (
                listed[0] if len(listed) == 1 else None  # llama-server names its one model by path
            )
        except (UpstreamError, ProtocolError) as exc:
            log.info(
                "model metadata not available",
                extra={"fields": {"model": key, "error": str(exc)}},
            )
            expires = now + min(FAILED_RETRY, self.ttl)
        infill = await self._infill(base, headers, route.network) if insert else None
        self._server[key] = _ServerSays(expires, base, props, info, infill)
        return props, info, infill

    async def _infill(self, base: str, headers: dict[str, str], network: Network | None) -> bool:
        """Whether llama.cpp's `/infill` takes a request for the loaded model: it refuses (501)
        a model without fill-in-the-middle tokens. The request generates nothing."""
        body = b'{"input_prefix": "", "input_suffix": "", "n_predict": 0}'
        try:
            await self.router.client.get_json_bytes(
                base + "/infill",
                headers={**headers, "content-type": "application/json"},
                timeout=FETCH_TIMEOUT,
                body=body,
                network=network,
            )
        except UpstreamError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class _ServerSays:
    """What a llama.cpp server said, until when, at which base URL."""

    until: float
    base: str
    props: ServerProps
    info: ModelInfo | None
    infill: bool | None


def context_refusal(message: str) -> GatewayError:
    """The 400 for a request its model's context cannot hold."""
    return request_error(message, code="context_length_exceeded", param="messages")


def _hint(pattern: re.Pattern[str], model_id: str) -> bool:
    return pattern.search(model_id) is not None


def _vision(props: ServerProps, info: ModelInfo | None, model_id: str) -> bool:
    if props.vision is not None:
        return props.vision
    if info is not None and info.input_modalities is not None:
        return "image" in info.input_modalities
    return _hint(_VISION_HINT, model_id)


def _quantization(props: ServerProps, info: ModelInfo | None, model_id: str) -> str:
    return quantization_level(props.ftype or (info.ftype if info else None), model_id)
