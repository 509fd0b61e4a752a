"""What starting one llama-server takes: its arguments for a model (`server_args`), the file its
log goes to, and the words of its failures.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from svir.config.model import (
    BUILTIN_GEMMA_TEMPLATE,
    ManagedModel,
)
from svir.edges.llama_server import (
    gemma_tools_template,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "BIND_ATTEMPTS",
    "BIND_FAILED",
    "NOT_RUN",
    "embedding_args",
    "file_name",
    "file_size",
    "last_lines",
    "server_args",
    "template_path",
]

# Starts tried when the port chosen was taken before llama-server could bind it.
BIND_ATTEMPTS = 3
BIND_FAILED = "couldn't bind HTTP server socket"


def server_args(spec: ManagedModel) -> list[str]:
    """llama-server's arguments for `spec` beyond the model, its context, threads and chat
    template: its parallel slots, embedding, and the config's own extra_args."""
    extra: list[str] = []
    if spec.parallel is not None:
        extra += ["--parallel", str(spec.parallel)]
    extra += embedding_args(spec)
    extra += list(spec.extra_args or ())
    return extra


def embedding_args(spec: ManagedModel) -> list[str]:
    """llama-server's arguments for an embedding model: `--embeddings`, and its pooling when one
    is set (this build serves chat too with `--embeddings`; /v1/embeddings refuses pooling
    "none", a chat model's own)."""
    if not spec.embeddings:
        return []
    args = ["--embeddings"]
    if spec.pooling is not None:
        args += ["--pooling", spec.pooling]
    return args


def template_path(template: str | None) -> Path | None:
    """The chat template file a config's `chat_template` names (svir's own for the builtin)."""
    if template is None:
        return None
    if template == BUILTIN_GEMMA_TEMPLATE:
        return gemma_tools_template()
    return Path(template)


# Why a model did not start when svir could not even run its server (a missing model file or
# chat template, a binary that is not there): the reason itself names files.
NOT_RUN = "llama-server could not be run for it"


def file_name(model_id: str) -> str:
    """`model_id` as a file name (its log's)."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in model_id) or "model"


def file_size(path: Path) -> int:
    """The size of the file at `path`, 0 if it cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_lines(text: str, count: int = 3) -> str:
    """The last `count` lines of a log that say something, on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "(empty log)"
