"""What the npm agent tests share (tests/anthropic/test_claude_code.py, tests/responses/test_codex.py,
tests/ollama/test_continue_cli.py): the agent's binary as `make` installs it, svir's config for
the real llama.cpp server answering one question with a grammar, and the environment that keeps
an agent on loopback."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from svir.edges.llama_server import ensure_gemma_model, find_llama_server
from svir.errors import LlamaServerError
from tests.support.svir_proc import free_port

ROOT = Path(__file__).resolve().parents[2]


def npm_binary(name: str) -> Path:
    """The agent's binary `name` as scripts/agents.sh installs the lock
    scripts/agents/package-lock.json: in `$CACHE/agents-<the first 16 hex digits of the lock's
    sha256>`."""
    digest = hashlib.sha256((ROOT / "scripts" / "agents" / "package-lock.json").read_bytes())
    cache = Path(os.environ.get("CACHE", Path.home() / ".cache" / "svir"))
    binary = cache / f"agents-{digest.hexdigest()[:16]}" / "node_modules" / ".bin" / name
    if not binary.exists():
        pytest.fail(
            f"{name} is not installed at {binary}: run `make test` (or `make agents`).",
            pytrace=False,
        )
    return binary


def gemma_answering(answer: str, routes: str) -> str:
    """svir's config for Gemma 3 270M managed by svir, whose every answer is `answer`, and
    `routes` (naming `local/gemma`).

    Gemma 3 270M does not stop by itself, and an agent fails a turn cut at its output limit: a
    grammar (the server's default for every request) makes the answer `answer`, and the turn
    ends. With tools, llama.cpp's own tool-call grammar replaces it, so the agent must go
    without its tools. One slot with the model's whole context (Gemma 3 270M's maximum) holds an
    agent's system prompt."""
    try:
        find_llama_server()
        gguf = ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(f"{exc}: run `make install`.", pytrace=False)
    grammar = f'root ::= "{answer}"'
    return (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
        '[providers.managed]\nchat_template = "builtin:gemma3-tools"\nparallel = 1\n'
        f"extra_args = ['--grammar', '{grammar}']\n"
        "[providers.managed.models]\n"
        f'gemma = {{ path = "{gguf}", ctx = 32768 }}\n\n' + routes
    )


def served(log: str, path: str) -> list[str]:
    """svir's access-log lines for `path`."""
    return [line for line in log.splitlines() if f'"path":"{path}"' in line]


def scripted_provider(base_url: str, *models: str) -> str:
    """svir's config for the scripted model server at `base_url` (provider `agent`)."""
    listed = ", ".join(f'"{m}"' for m in models)
    return (
        f'[[providers]]\nname = "agent"\nkind = "openai-compatible"\n'
        f'base_url = "{base_url}"\ndiscover = false\nmodels = [{listed}]\n\n'
    )


# The environment an agent runs in: a home of its own, and proxies pointed at a closed loopback
# port, so that what honours them sends nothing out. Node's own `fetch` does not:
# `LOOPBACK_GUARD`, preloaded with `NODE_OPTIONS=--require`, refuses any connection past
# loopback and writes its host to `$SVIR_BLOCKED_LOG`.
LOOPBACK_GUARD = Path(__file__).parent / "node" / "loopback-only.cjs"


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """PATH, HOME and the closed proxies, then `extra`."""
    closed = f"http://127.0.0.1:{free_port()}"
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }
