"""A text completion goes through the key gate as a chat does: its tokens count against the key's
budget (reserved from the prompt estimate and `max_tokens`, settled from the upstream's usage),
and it is a row of the ledger under its own front end, and a `text_completion` span."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.completions.test_completions_inprocess import upstream
from tests.keys.support import Harness
from tests.support.mock_server import MockServer


async def test_completion_tokens_are_counted_and_recorded(
    harness_factory: type[Harness],
) -> None:
    async with MockServer(upstream) as server:
        lab = server.base_url.removesuffix("/v1")
        extra = f'[[providers]]\nname = "lab"\nkind = "llamacpp"\nbase_url = "{lab}"\n'
        h = await harness_factory(extra=extra, fronts=("completions",)).start()
        secret, _ = await h.new_key(tokens_per_day=1000)
        auth = {"Authorization": f"Bearer {secret}"}
        body = {"model": "lab/qwen", "prompt": "The capital of France is", "max_tokens": 5}
        r = await h.http.post("/v1/completions", json=body, headers=auth)
        assert r.status_code == 200, r.text
        fim = {**body, "suffix": "\n", "stream": True}
        r = await h.http.post("/v1/completions", json=fim, headers=auth)
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
        view = await h.chat_usage(secret)
        # The upstream's counts (7 in, 2 out) each time, not the reservation.
        assert view["limits"]["tokens_per_day"]["used"] == 18
        rows = (await h.admin("GET", "/admin/usage?by=api")).json()["data"]
        assert [(row["api"], row["requests"]) for row in rows] == [("completions", 2)], rows
        # Without a key there is no completion (the gate asks for one as for chat).
        r = await h.http.post("/v1/completions", json=body)
        assert r.status_code == 401


async def test_a_completion_attempt_is_a_text_completion_span(
    harness_factory: type[Harness],
) -> None:
    exporter = InMemorySpanExporter()
    async with MockServer(upstream) as server:
        lab = server.base_url.removesuffix("/v1")
        extra = (
            f'[[providers]]\nname = "lab"\nkind = "llamacpp"\nbase_url = "{lab}"\n'
            "\n[telemetry]\notel = true\n"
        )
        h = await harness_factory(
            extra=extra, fronts=("completions",), span_exporter=exporter
        ).start()
        secret, _ = await h.new_key()
        body = {"model": "lab/qwen", "prompt": "p", "max_tokens": 5}
        auth = {"Authorization": f"Bearer {secret}"}
        assert (await h.http.post("/v1/completions", json=body, headers=auth)).status_code == 200
    [attempt] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert attempt.name == "text_completion qwen"
    assert attempt.attributes is not None
    assert attempt.attributes["gen_ai.operation.name"] == "text_completion"
    assert attempt.attributes["gen_ai.usage.output_tokens"] == 2
