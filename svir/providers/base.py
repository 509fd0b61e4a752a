"""What a kind of upstream server is, as data: `ProviderKind` holds every way one kind differs from
plain OpenAI-compatible chat, and the defaults each hook falls back on.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from svir.wire.completions import CompletionDialect
from svir.wire.decoder import DecoderFactory, StreamDecoder
from svir.wire.errors import UpstreamError
from svir.wire.models import normalize_base_url
from svir.wire.request import ReasoningKey

__all__ = [
    "AuthHeader",
    "BodyBuilder",
    "MaxTokensField",
    "ProviderKind",
    "ProviderSettings",
    "base_as_given",
    "openai_chat_url",
    "openai_embeddings_url",
    "openai_models_url",
    "unchanged_body",
]

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]
# Which embeddings API a server has: OpenAI's `/embeddings`, or Ollama's `/api/embed`.
EmbeddingsAPI = Literal["openai", "ollama"]
AuthHeader = Literal["authorization", "api-key", "x-api-key"]
# A kind's own request body, from a checked chat request and the model id upstream.
BodyBuilder = Callable[[Mapping[str, Any], str], dict[str, Any]]


class ProviderSettings(Protocol):
    """What a kind reads of one configured provider: svir.config.model.ProviderConfig is one. A
    protocol, so that the kinds need not import the config that names them."""

    @property
    def discover(self) -> bool | None: ...
    @property
    def drop_params(self) -> tuple[str, ...] | None: ...
    @property
    def think_tags(self) -> bool | None: ...
    @property
    def images(self) -> bool | None: ...
    @property
    def api_version(self) -> str | None: ...
    @property
    def completions(self) -> bool | None: ...
    @property
    def fim(self) -> bool | None: ...


def unchanged_error(error: UpstreamError) -> UpstreamError:
    """The default error hook: the classification stands as it is."""
    return error


def unchanged_body(body: dict[str, Any]) -> dict[str, Any]:
    """The default `adapt_body`: the body needs nothing beyond the common rewriting."""
    return body


def openai_chat_url(base: str, model: str, provider: ProviderSettings) -> str:
    """`{base}/chat/completions`; the model travels in the body, not the URL."""
    return f"{base.rstrip('/')}/chat/completions"


def openai_embeddings_url(base: str, model: str, provider: ProviderSettings) -> str:
    """`{base}/embeddings`; the model travels in the body."""
    return f"{base.rstrip('/')}/embeddings"


def openai_models_url(base: str, provider: ProviderSettings) -> str:
    """`{base}/models`."""
    return f"{base.rstrip('/')}/models"


def base_as_given(url: str) -> str:
    """A base URL checked like any other (§1), with its path kept as written: no `/v1` added.

    For hosted APIs whose OpenAI-compatible surface does not live under `/v1` (Gemini's is under
    `/v1beta/openai`), appending `/v1` would point at nothing.
    """
    normalized = normalize_base_url(url)
    written = urllib.parse.urlsplit(url.strip()).path.rstrip("/")
    if not written.endswith("/v1"):
        normalized = normalized.removesuffix("/v1")
    return normalized


@dataclass(frozen=True)
class ProviderKind:
    """How one kind of server differs from plain OpenAI-compatible chat.

    The hooks are plain functions stored as fields, so a kind module states only what it changes.
    `base` arguments are the provider's base URL as the config stores it, already passed through
    `normalize_base`.
    """

    name: str
    # Whether inline `<think>…</think>` in `content` is split off as reasoning by default (§4).
    # Hosted APIs send reasoning in a field or not at all, so a literal "<think>" in their answer
    # is text the user should see.
    think_tags: bool = True
    max_tokens_field: MaxTokensField = "max_tokens"
    default_drop: frozenset[str] = frozenset()
    auth_header: AuthHeader = "authorization"
    # The key under which assistant reasoning is sent back (§2.2, §4); None drops it.
    reasoning_key: ReasoningKey | None = "reasoning_content"
    discover: bool = True
    # The configured models are all the server has (a server svir runs itself): any other id is
    # refused as not found without asking it.
    closed_models: bool = False
    # Hosted APIs refuse every call without a key; local servers usually run without one (§1).
    key_required: bool = False
    # Used when the provider gives no base_url; only public endpoints have one.
    default_base_url: str | None = None
    # Whether the server takes image parts (§2.2); a provider's `images` setting overrides it.
    images: bool = True
    # LM Studio holds reasoning to a response_format schema, so the JSON answer arrives as
    # reasoning (§2.6): with a schema asked for, that reasoning is the answer.
    json_in_reasoning: bool = False
    # Turns a server's cryptic rejection into one that says what the server lacks.
    explain_error: Callable[[UpstreamError], UpstreamError] = field(default=unchanged_error)
    normalize_base: Callable[[str], str] = field(default=normalize_base_url)
    adapt_body: Callable[[dict[str, Any]], dict[str, Any]] = field(default=unchanged_body)
    chat_url: Callable[[str, str, ProviderSettings], str] = field(default=openai_chat_url)
    models_url: Callable[[str, ProviderSettings], str] = field(default=openai_models_url)
    # Sent with the key on every request (Anthropic's `anthropic-version`).
    api_headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # For a server that does not speak OpenAI's chat API: the body it takes instead of
    # `build_upstream_body`'s (the kind's drop_params and adapt_body still apply), and the
    # decoder of the stream it answers with.
    build_body: BodyBuilder | None = None
    new_decoder: DecoderFactory = field(default=StreamDecoder)
    # The text-completion API the server has (svir.wire.completions, docs/completions.md):
    # llama-server's native `/completion` and `/infill`, OpenAI's `/v1/completions`, or none.
    completions: CompletionDialect | None = "openai"
    # Whether it fills in the middle (a `suffix`) by default: llama-server's `/infill` does with
    # the model's FIM tokens; most OpenAI-compatible servers ignore or refuse a suffix.
    fim: bool = False
    # Embeddings (svir.embeddings): the API the server has for them (None: it has none, and an
    # embedding request is refused before it is sent), where it lives, whether the server honours
    # `dimensions` (llama-server ignores it and answers full-size vectors, so svir refuses it
    # rather than answer vectors of a size nobody asked for), and whether it answers base64
    # vectors when asked (a fifth of the bytes of JSON floats, passed through to base64 clients).
    embeddings: EmbeddingsAPI | None = "openai"
    embeddings_url: Callable[[str, str, ProviderSettings], str] = field(
        default=openai_embeddings_url
    )
    embedding_dimensions: bool = True
    embeddings_base64: bool = False

    @property
    def speaks_openai(self) -> bool:
        """Whether the server takes and streams OpenAI's chat API (so its frames can be relayed)."""
        return self.build_body is None

    def auth_headers(self, key: str | None) -> dict[str, str]:
        """The headers that carry `key` to this kind of server; none without a key."""
        if not key:
            return {}
        if self.auth_header == "api-key":
            headers = {"api-key": key}
        elif self.auth_header == "x-api-key":
            headers = {"x-api-key": key}
        else:
            headers = {"Authorization": f"Bearer {key}"}
        if self.api_headers:
            headers.update(self.api_headers)
        return headers

    def drop_params_for(self, provider: ProviderSettings) -> frozenset[str]:
        """The request fields removed before sending: the provider's list, else the kind's."""
        if provider.drop_params is None:
            return self.default_drop
        return frozenset(provider.drop_params)

    def think_tags_for(self, provider: ProviderSettings) -> bool:
        """Whether inline `<think>` is split off for this provider."""
        return self.think_tags if provider.think_tags is None else provider.think_tags

    def images_for(self, provider: ProviderSettings) -> bool:
        """Whether image parts may be sent to this provider."""
        return self.images if provider.images is None else provider.images

    def completions_for(self, provider: ProviderSettings) -> CompletionDialect | None:
        """The completion API the provider is sent text completions by; None when it takes none
        (the kind has none, or the provider says `completions = false`)."""
        return None if provider.completions is False else self.completions

    def fim_for(self, provider: ProviderSettings) -> bool:
        """Whether a completion with a suffix (fill-in-the-middle) may be sent to the provider:
        its `fim` setting, else the kind's; never without a completion API."""
        if self.completions_for(provider) is None:
            return False
        return self.fim if provider.fim is None else provider.fim

    def discover_for(self, provider: ProviderSettings) -> bool:
        """Whether the provider's `/models` is asked for its models."""
        return self.discover if provider.discover is None else provider.discover
