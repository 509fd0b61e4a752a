"""What svir says of itself and its models in Ollama's words: pure, with no I/O.

`GET /api/version` (`OLLAMA_API_VERSION`), the entries of `GET /api/tags` and `GET /api/ps`,
`POST /api/show` (what is true of a model as svir serves it, from svir.policy.catalog's
`ModelFacts`), and the model-file routes svir has no files for (`pull_lines`, `not_managed`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from svir.wire.model_meta import ModelFacts, parameter_size

__all__ = [
    "MODIFIED_AT",
    "OLLAMA_API_VERSION",
    "details",
    "not_managed",
    "parameters_text",
    "ps_entry",
    "pull_lines",
    "show_response",
    "tags_entry",
    "template_text",
]

# The Ollama API version svir answers `GET /api/version` with. Clients gate on it: GitHub
# Copilot's Ollama provider refuses a server older than 0.6.4. svir speaks the API as Ollama
# 0.12 does (`think` levels, `thinking`, `tool_name`, tool-call ids).
OLLAMA_API_VERSION: Final = "0.12.0"

# svir does not know when an upstream's model was made; Ollama's listings need a time.
MODIFIED_AT: Final = "2023-11-14T22:13:20Z"  # the `created` of /v1/models, 1700000000


# What svir answers for a model, from what is true of it (svir.policy.catalog's ModelFacts).


def _digest(name: str) -> str:
    # Ollama's digest is the sha256 of the model's manifest; the name's is stable and unique.
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def details(facts: ModelFacts) -> dict[str, Any]:
    """`details`, with every field a string (and `families` a list) as strict clients parse it:
    Zed drops the whole list when one is missing, Roo needs `family` and `parameter_size`."""
    family = facts.architecture
    return {
        "parent_model": "",
        "format": facts.format,
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(facts.parameters, facts.own_id),
        "quantization_level": facts.quantization,
    }


def tags_entry(facts: ModelFacts) -> dict[str, Any]:
    """One model of `GET /api/tags`."""
    return {
        "name": facts.name,
        "model": facts.name,
        "modified_at": MODIFIED_AT,
        "size": facts.size or 0,
        "digest": _digest(facts.name),
        "details": details(facts),
    }


def ps_entry(facts: ModelFacts, expires_at: str, size: int | None = None) -> dict[str, Any]:
    """One model of `GET /api/ps`: svir's servers run on the CPU (`size_vram` 0) unless one
    says otherwise."""
    entry = tags_entry(facts)
    del entry["modified_at"]
    entry["size"] = size if size is not None else entry["size"]
    entry["expires_at"] = expires_at
    entry["size_vram"] = 0
    entry["context_length"] = facts.context_length or 0
    return entry


def template_text(facts: ModelFacts) -> str:
    """A `template` in Ollama's Go-template words that says what svir passes on: clients decide
    by its words (Continue: fill-in-the-middle when it has `.Suffix`; LiteLLM: tools when it has
    "tools"), so each appears exactly when it is true. The upstream applies its own template."""
    lines = ["{{- /* svir passes these on; the model's server applies its own template */ -}}"]
    if facts.embedding:
        return "{{ .Prompt }}"
    if facts.tools:
        lines.append("{{- if .Tools }}{{ range .Tools }}{{ . }}{{ end }}{{ end }}")
    lines.append("{{- range .Messages }}{{ .Role }}: {{ .Content }}{{ end }}")
    if facts.insert:
        lines.append("{{- if .Suffix }}{{ .Prompt }}{{ .Suffix }}{{ else }}{{ .Prompt }}{{ end }}")
    else:
        lines.append("{{ .Prompt }}")
    return "\n".join(lines)


def parameters_text(facts: ModelFacts) -> str:
    """`parameters`: Ollama's lines of `name value`, each matching Continue's pattern (it reads
    `num_ctx` there, and stops reading at a line that does not match)."""
    if facts.context_length is None:
        return ""
    return f"num_ctx {facts.context_length}"


def show_response(facts: ModelFacts, provider: str) -> dict[str, Any]:
    """`POST /api/show` for one model: only true things. `<arch>.context_length` is the context
    it runs with (Copilot, Roo and LiteLLM read the first key with `context_length` in it, so
    there is just one); the context it was trained for is svir's own key."""
    arch = facts.architecture
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.basename": facts.basename,
    }
    if facts.parameters is not None:
        info["general.parameter_count"] = facts.parameters
    if facts.context_length is not None:
        info[f"{arch}.context_length"] = facts.context_length
    if facts.context_train is not None:
        info["general.svir.n_ctx_train"] = facts.context_train
    info["general.svir.provider"] = provider
    info["general.svir.kind"] = facts.kind
    return {
        "modelfile": "",
        "parameters": parameters_text(facts),
        "template": template_text(facts),
        "details": details(facts),
        "model_info": info,
        "capabilities": facts.capabilities,
        "modified_at": MODIFIED_AT,
    }


# ---------------------------------------------------------------------------------------------
# Model files: svir serves models, it does not keep them


def pull_lines(name: str) -> list[dict[str, Any]]:
    """`POST /api/pull` of a model svir serves: it is there already, so the status lines an
    Ollama pull ends with, and `success`."""
    digest = "sha256:" + _digest(name)
    return [
        {"status": "pulling manifest"},
        {"status": f"pulling {digest[7:19]}", "digest": digest, "total": 0, "completed": 0},
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]


def not_managed(action: str) -> str:
    """The error for `/api/<action>` of a model file."""
    return (
        f"svir does not manage model files: /api/{action} is not supported; configure the "
        "model in svir's config ([[providers]]) instead"
    )
