"""Embedding calls pass the key gate as chat calls do: a key's models, its token rate and budgets
(the inputs' tokens count, the answer allowance does not), one ledger row each, /metrics, and an
attempt's span."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.keys.support import Harness
from tests.support.embedder import Embedder
from tests.support.inprocess import InProcess, serve
from tests.support.mock_server import MockServer
from tests.support.waiting import PATIENCE

ADMIN = "admin-embed-test-key-0123456789"
CONFIG = """
[ledger]
flush_seconds = 0.05

[limits]
default_completion_tokens = 1000

[[providers]]
name = "e"
kind = "openai-compatible"
base_url = "http://embed.test/v1"
discover = false
"""


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with serve(tmp_path, CONFIG, Embedder(), {"SVIR_ADMIN_KEY": ADMIN}) as s:
        yield s


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


async def new_key(svir: InProcess, **spec: Any) -> str:
    r = await svir.http.post("/admin/keys", json={"name": "indexer", **spec}, headers=admin())
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


async def embed(svir: InProcess, key: str, texts: list[str], model: str = "e/m") -> httpx.Response:
    return await svir.http.post(
        "/v1/embeddings",
        json={"model": model, "input": texts},
        headers={"Authorization": f"Bearer {key}"},
    )


async def tpm_used(svir: InProcess, key: str, want: int) -> int:
    """The key's tpm use once it reaches `want` (settlements run as tasks), or as it stands
    after PATIENCE."""
    deadline = time.monotonic() + PATIENCE
    while True:
        r = await svir.http.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})
        used = int(r.json()["limits"]["tpm"]["used"])
        if used == want or time.monotonic() > deadline:
            return used
        await asyncio.sleep(0.01)


async def test_inputs_count_against_tpm_and_the_allowance_does_not(svir: InProcess) -> None:
    # 1000 answer tokens would be reserved for a chat: an embedding reserves its inputs only.
    key = await new_key(svir, tpm=30)
    texts = ["one two three", "four five"]  # the fake counts 4 + 3 tokens
    assert (await embed(svir, key, texts)).status_code == 200
    assert await tpm_used(svir, key, 7) == 7
    assert (await embed(svir, key, texts * 3)).status_code == 200
    assert await tpm_used(svir, key, 28) == 28
    r = await embed(svir, key, texts)
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "tpm_exceeded"


async def test_a_budget_refuses_what_it_cannot_cover(svir: InProcess) -> None:
    key = await new_key(svir, tokens_per_day=5)
    before = len(svir.transport.requests)
    r = await embed(svir, key, ["a " * 40])
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "insufficient_quota"
    assert len(svir.transport.requests) == before


async def test_models_of_the_key(svir: InProcess) -> None:
    key = await new_key(svir, models=["e/allowed"])
    assert (await embed(svir, key, ["a"], "e/allowed")).status_code == 200
    r = await embed(svir, key, ["a"], "e/other")
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "model_not_allowed"


async def test_ledger_row_and_metrics(svir: InProcess) -> None:
    key = await new_key(svir)
    assert (await embed(svir, key, ["one two three"])).status_code == 200
    r = await svir.http.post(
        "/api/embed",
        json={"model": "e/m", "input": ["x y"]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + PATIENCE  # the ledger is written by a task of its own
    while True:
        r = await svir.http.get("/admin/usage?by=api,model", headers=admin())
        assert r.status_code == 200, r.text
        rows: list[dict[str, Any]] = r.json()["data"]
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    by_api = {row["api"]: row for row in rows}
    assert set(by_api) == {"embeddings", "ollama_embed"}
    assert by_api["embeddings"]["prompt_tokens"] == 4
    assert by_api["embeddings"]["completion_tokens"] == 0
    assert by_api["embeddings"]["counted"] == 0  # the upstream's count, not svir's estimate
    assert by_api["ollama_embed"]["prompt_tokens"] == 3
    text = (await svir.http.get("/metrics", headers=admin())).text
    assert 'svir_embedding_requests_total{model="e/m",provider="e",outcome="ok"} 2' in text
    assert 'svir_tokens_total{model="e/m",provider="e",kind="prompt"} 7' in text
    assert 'svir_chat_requests_total{model="e/m"' not in text
    assert 'svir_upstream_attempts_total{provider="e",outcome="ok"} 2' in text


async def test_an_attempt_span_says_embeddings(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    async with MockServer(Embedder()) as up:
        text = f"""
[store]
url = "sqlite:///{tmp_path / "t.db"}"
[telemetry]
otel = true
[[providers]]
name = "e"
kind = "openai-compatible"
base_url = "{up.base_url}"
discover = false
"""
        h = await Harness(text, span_exporter=exporter, fronts=("embeddings",)).start()
        try:
            assert h.http is not None
            r = await h.http.post("/v1/embeddings", json={"model": "e/m", "input": ["a b"]})
            assert r.status_code == 200, r.text
        finally:
            await h.stop()
    [attempt] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert attempt.name == "embeddings m"
    attrs = attempt.attributes or {}
    assert attrs["gen_ai.operation.name"] == "embeddings"
    assert attrs["gen_ai.request.model"] == "m"
    assert attrs["gen_ai.usage.input_tokens"] == 3
    assert "error.type" not in attrs
