"""A managed embedding model on a real `svir serve` over real `llama-server` processes, Gemma 3
270M as the embedder: its server starts with `--embeddings --pooling mean`, the OpenAI SDK (floats
and base64) and the `ollama` client get its vectors through svir, and it swaps with a chat model
with one process alive. A model not configured for embeddings is refused before anything starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.managed.conftest import children_servers
from tests.managed.test_managed_svir import (  # noqa: F401 (start_svir: the fixture)
    TIMEOUT,
    chat,
    config,
    managed_state,
    pid_of,
    start_svir,
)
from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

Start = Callable[[str | None], SvirProcess]


def models(embedder: Path, chat_model: Path) -> str:
    return (
        f'embed = {{ path = "{embedder}", embeddings = true, pooling = "mean", ctx = 512 }}\n'
        f'gemma-3-270m = {{ path = "{chat_model}", ctx = 512 }}'
    )


def sdk(svir: SvirProcess) -> openai.OpenAI:
    # The SDK's own Timeout: httpx's up to openai 2, httpx2's since 3 (which refuses httpx's).
    timeout = openai.Timeout(TIMEOUT.read, connect=TIMEOUT.connect)
    return openai.OpenAI(api_key="k", base_url=svir.base_url, max_retries=0, timeout=timeout)


def test_the_embedder_serves_vectors_and_swaps_with_a_chat_model(
    start_svir: Start,  # noqa: F811
    gguf: Path,
    tmp_path: Path,
) -> None:
    chat_gguf = tmp_path / "chat.gguf"
    chat_gguf.symlink_to(gguf.resolve())
    svir = start_svir(config(models(gguf, chat_gguf), "max_loaded = 1"))
    client = sdk(svir)
    texts = ["def add(a, b): return a + b", "The cat sat on the mat."]

    floats = client.embeddings.create(model="local/embed", input=texts, encoding_format="float")
    [server] = children_servers(pid_of(svir))
    args = server.cmdline()
    assert str(gguf) in args and "--embeddings" in args
    assert args[args.index("--pooling") + 1] == "mean"
    vectors = [d.embedding for d in floats.data]
    assert [len(v) for v in vectors] == [640, 640]  # Gemma 3 270M's width
    for v in vectors:  # llama-server normalizes (euclidean) by default
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-3)
    assert vectors[0] != vectors[1]
    assert floats.usage.prompt_tokens > 10
    assert floats.model == "local/embed"

    # The SDK's default: base64 from svir, decoded by the SDK into the same floats.
    default = client.embeddings.create(model="local/embed", input=texts[0])
    assert all(
        math.isclose(a, b, abs_tol=1e-6)
        for a, b in zip(default.data[0].embedding, vectors[0], strict=True)
    )

    # The chat model swaps in: one process, without --embeddings.
    chat(svir, "local/gemma-3-270m", max_tokens=4)
    [chat_server] = children_servers(pid_of(svir))
    assert str(chat_gguf) in chat_server.cmdline()
    assert "--embeddings" not in chat_server.cmdline()

    # And the embedder swaps back, for the ollama client.
    got = ollama.Client(host=svir.url, timeout=120).embed(model="local/embed", input=texts)
    [again] = children_servers(pid_of(svir))
    assert again.pid not in (server.pid, chat_server.pid) and "--embeddings" in again.cmdline()
    assert len(got.embeddings) == 2
    assert all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got.embeddings[1], vectors[1], strict=True)
    )
    assert got.prompt_eval_count == floats.usage.prompt_tokens
    state = managed_state(svir)["models"]
    assert (state["embed"]["loads"], state["gemma-3-270m"]["loads"]) == (2, 1)


def test_a_chat_model_is_not_asked_for_embeddings(
    start_svir: Start,  # noqa: F811
    gguf: Path,
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"'))
    r = httpx.post(
        svir.base_url + "/embeddings",
        json={"model": "local/gemma-3-270m", "input": "x"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "unsupported_input"
    assert "embeddings = true" in error["message"]
    assert children_servers(pid_of(svir)) == []  # refused before a server was started
