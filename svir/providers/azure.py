"""Azure OpenAI: a resource endpoint instead of a `/v1` base, deployments in the URL on dated API
versions, and the key in an `api-key` header.
"""

from __future__ import annotations

import urllib.parse

from svir.providers.base import ProviderKind, ProviderSettings, base_as_given

# The API version that needs no `api-version` query and takes the deployment as `model`.
V1_API = "v1"


def normalize_base(url: str) -> str:
    """The resource endpoint (`https://<resource>.openai.azure.com`), whatever was written.

    People paste the resource URL, or the `/openai/v1` URL the portal shows for the v1 API; both
    name the same resource, and the API version alone decides the path below it.
    """
    base = base_as_given(url)
    for suffix in ("/openai/v1", "/openai", "/v1"):
        if base.endswith(suffix):
            return base.removesuffix(suffix)
    return base


def _uses_v1(provider: ProviderSettings) -> bool:
    return provider.api_version is None or provider.api_version == V1_API


def _deployment_url(base: str, model: str, provider: ProviderSettings, endpoint: str) -> str:
    root = normalize_base(base)
    if _uses_v1(provider):
        return f"{root}/openai/v1/{endpoint}"
    deployment = urllib.parse.quote(model, safe="")
    version = urllib.parse.quote(provider.api_version or "", safe="")
    return f"{root}/openai/deployments/{deployment}/{endpoint}?api-version={version}"


def chat_url(base: str, model: str, provider: ProviderSettings) -> str:
    """The v1 chat URL, or the deployment's URL with `api-version` on a dated version."""
    return _deployment_url(base, model, provider, "chat/completions")


def embeddings_url(base: str, model: str, provider: ProviderSettings) -> str:
    """The v1 embeddings URL, or the deployment's, as for chat."""
    return _deployment_url(base, model, provider, "embeddings")


def models_url(base: str, provider: ProviderSettings) -> str:
    """The resource's model list; it lists models the resource offers, not its deployments."""
    root = normalize_base(base)
    if _uses_v1(provider):
        return f"{root}/openai/v1/models"
    version = urllib.parse.quote(provider.api_version or "", safe="")
    return f"{root}/openai/models?api-version={version}"


KIND = ProviderKind(
    name="azure",
    think_tags=False,
    max_tokens_field="max_completion_tokens",
    auth_header="api-key",
    reasoning_key=None,
    # Requests name deployments, which the model list does not show, so listing finds nothing
    # that can be asked for; deployments go in `models`.
    discover=False,
    key_required=True,
    normalize_base=normalize_base,
    chat_url=chat_url,
    embeddings_url=embeddings_url,
    embeddings_base64=True,
    models_url=models_url,
    # Its completions live at deployment URLs of their own, which svir does not build yet.
    completions=None,
)
