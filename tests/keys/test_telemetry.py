"""GET /metrics (checked with prometheus_client's own parser) and OpenTelemetry spans (with the
SDK's in-memory exporter): a span per request and per upstream attempt, GenAI attribute names,
and nothing of OpenTelemetry loaded when tracing is off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from tests.keys.support import ADMIN_KEY, Harness
from tests.support.upstream import CHUNK_ID, PROMPT_TOKENS, ScriptedServer


def routed_config(upstream: str, store: str, extra: str = "") -> str:
    return f"""
[store]
url = "{store}"

[ledger]
flush_seconds = 0.05

[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "{upstream}"
discover = false
retry = {{ attempts = 2, backoff = 0.01, max_backoff = 0.02 }}
breaker = {{ failures = 2, cooldown = 60 }}

[[routes]]
name = "smart"
targets = [{{ model = "fake/echo-503" }}]
fallbacks = ["fake/tok-3"]
{extra}
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_exposition(
    harness_factory: type[Harness], upstream: ScriptedServer, tmp_path: Path
) -> None:
    h = await harness_factory(
        routed_config(upstream.base_url, f"sqlite:///{tmp_path / 'm.db'}")
    ).start()
    secret, _ = await h.new_key(rpm=4)
    assert (await h.chat(secret, "fake/tok-5-slow", max_tokens=50)).status_code == 200
    assert (await h.chat(secret, "smart", stream=False)).status_code == 200
    assert (await h.chat("sk-svir-wrong")).status_code == 401
    assert (await h.chat(secret, "smart", stream=False)).status_code == 200
    assert (await h.chat(secret)).status_code == 200
    assert (await h.chat(secret)).status_code == 429
    await h.flush()
    assert h.http is not None
    r = await h.http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = samples(r.text)
    chat = "/v1/chat/completions"
    assert value(found, "svir_http_requests_total", endpoint=chat, method="POST", status="200") == 4
    assert value(found, "svir_http_requests_total", endpoint=chat, method="POST", status="401") == 1
    assert value(found, "svir_errors_total", **{"class": "invalid_api_key"}) == 1
    assert value(found, "svir_errors_total", **{"class": "rpm_exceeded"}) == 1
    assert value(found, "svir_limit_rejections_total", limit="rpm") == 1
    assert (
        value(
            found,
            "svir_chat_requests_total",
            model="fake/tok-5-slow",
            provider="fake",
            outcome="ok",
        )
        == 1
    )
    assert (
        value(found, "svir_chat_requests_total", model="smart", provider="fake", outcome="ok") == 2
    )
    assert (
        value(
            found, "svir_tokens_total", model="fake/tok-5-slow", provider="fake", kind="completion"
        )
        == 5
    )
    assert (
        value(found, "svir_tokens_total", model="smart", provider="fake", kind="prompt")
        == 2 * PROMPT_TOKENS
    )
    assert value(found, "svir_time_to_first_token_seconds_count", provider="fake") == 4
    assert value(found, "svir_tokens_per_second_count", provider="fake") >= 1
    assert value(found, "svir_streams_in_flight", provider="fake") == 0
    # The route's target failed (503, retried once), then its fallback served: twice over, and
    # the second time the breaker (2 failures) opened on the target.
    assert value(found, "svir_upstream_attempts_total", provider="fake", outcome="transient") >= 2
    assert value(found, "svir_upstream_attempts_total", provider="fake", outcome="ok") == 4
    assert value(found, "svir_fallbacks_total") == 2
    assert value(found, "svir_retries_total") >= 1
    assert value(found, "svir_breaker_state", deployment="fake/echo-503") == 2
    assert value(found, "svir_upstream_latency_seconds_count", provider="fake") >= 6
    assert value(found, "svir_ledger_rows_written_total") == 5
    assert value(found, "svir_build_info", version=__import__("svir").__version__) == 1
    hist = value(found, "svir_http_request_duration_seconds_bucket", endpoint=chat, le="+Inf")
    assert hist == value(found, "svir_http_request_duration_seconds_count", endpoint=chat) == 6


async def test_metrics_may_need_the_admin_key(harness_factory: type[Harness]) -> None:
    h = await harness_factory(extra="[auth]\nmetrics_need_admin = true\n").start()
    assert h.http is not None
    assert (await h.http.get("/metrics")).status_code == 401
    r = await h.http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_metrics_take_the_admin_key_or_the_metrics_token_once_keys_exist(
    harness_factory: type[Harness],
) -> None:
    token = "metrics-token-0123456789"
    h = await harness_factory(environ={"SVIR_METRICS_TOKEN": token}).start()
    assert h.http is not None
    # No keys: open to whom svir serves then, this machine.
    assert (await h.http.get("/metrics")).status_code == 200
    elsewhere = h.client("192.0.2.7")
    r = await elsewhere.get("/metrics")
    assert r.status_code == 403 and r.json()["error"]["code"] == "loopback_only"
    await elsewhere.aclose()
    secret, _ = await h.new_key()
    for headers in ({}, bearer(secret), bearer("wrong-token-0123456789")):
        r = await h.http.get("/metrics", headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "x-request-id" in r.headers
        error = r.json()["error"]
        assert error["code"] == "invalid_metrics_token"
        assert error["type"] == "invalid_request_error" and "param" in error
        assert "SVIR_METRICS_TOKEN" in error["message"]
        assert "svir_build_info" not in r.text
    for good in (token, ADMIN_KEY):
        r = await h.http.get("/metrics", headers=bearer(good))
        assert r.status_code == 200 and "svir_build_info" in r.text


async def test_metrics_without_a_token_to_take_are_locked_once_keys_exist(
    harness_factory: type[Harness],
) -> None:
    from svir.keys.model import KeySpec

    h = await harness_factory(environ={"SVIR_ADMIN_KEY": ""}).start()
    assert h.http is not None and h.service.keys is not None
    await h.service.keys.create(KeySpec(name="k"))
    h.service.auth.forget()
    r = await h.http.get("/metrics", headers=bearer("anything-0123456789"))
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == "metrics_locked"
    assert "SVIR_METRICS_TOKEN" in error["message"] and "metrics_public" in error["message"]


async def test_metrics_public_opens_them_to_anyone(harness_factory: type[Harness]) -> None:
    h = await harness_factory(extra="[auth]\nmetrics_public = true\n").start()
    await h.new_key()
    elsewhere = h.client("192.0.2.7")
    r = await elsewhere.get("/metrics")
    await elsewhere.aclose()
    assert r.status_code == 200 and "svir_build_info" in r.text


def _spans(exporter: InMemorySpanExporter) -> list[Any]:
    return list(exporter.get_finished_spans())


async def test_spans_per_request_and_attempt(
    harness_factory: type[Harness], upstream: ScriptedServer, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    text = routed_config(
        upstream.base_url, f"sqlite:///{tmp_path / 't.db'}", "[telemetry]\notel = true\n"
    )
    h = await harness_factory(text, span_exporter=exporter).start()
    secret, key = await h.new_key()
    exporter.clear()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert h.http is not None
    r = await h.http.post(
        "/v1/chat/completions",
        json={
            "model": "fake/tok-3",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 20,
            "temperature": 0.5,
        },
        headers={
            "Authorization": f"Bearer {secret}",
            "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            "x-request-id": "trace-me-1",
        },
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-me-1"
    spans = _spans(exporter)
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    client = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert len(server) == 1 and len(client) == 1
    req, att = server[0], client[0]
    assert f"{req.context.trace_id:032x}" == trace_id
    assert att.parent is not None and att.parent.span_id == req.context.span_id
    assert req.name == "POST /v1/chat/completions"
    assert req.attributes["svir.request_id"] == "trace-me-1"
    assert req.attributes["http.response.status_code"] == 200
    assert req.attributes["gen_ai.request.model"] == "fake/tok-3"
    assert req.attributes["svir.key_id"] == key["id"]
    assert att.name == "chat tok-3"
    a = att.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "tok-3"
    assert a["gen_ai.request.max_tokens"] == 20
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.usage.input_tokens"] == PROMPT_TOKENS
    assert a["gen_ai.usage.output_tokens"] == 3
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert a["gen_ai.response.id"] == CHUNK_ID
    assert a["server.address"] == "127.0.0.1"
    assert a["server.port"] == urlsplit(upstream.base_url).port
    assert a["svir.request_id"] == "trace-me-1"
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert "error.type" not in a

    exporter.clear()
    assert (await h.chat(secret, "smart", stream=False)).status_code == 200
    spans = _spans(exporter)
    attempts = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert [s.attributes["gen_ai.request.model"] for s in attempts] == [
        "echo-503",
        "echo-503",
        "tok-3",
    ]
    assert [s.attributes.get("error.type") for s in attempts] == ["transient", "transient", None]
    roots = {s.context.span_id for s in spans if s.kind is SpanKind.SERVER}
    assert all(s.parent is not None and s.parent.span_id in roots for s in attempts)

    exporter.clear()
    assert (await h.chat("sk-svir-nope")).status_code == 401
    (req,) = _spans(exporter)
    assert req.attributes["error.type"] == "invalid_api_key"


@pytest.mark.external
def test_no_opentelemetry_when_off(tmp_path: Path) -> None:
    code = f"""
import sys
from svir.config.load import parse_config
from svir.edges.app import App
from svir.edges.keys_service import install
app = App(parse_config('[store]\\nurl = "sqlite:///{tmp_path / "x.db"}"'), {{}})
service = install(app)
assert service.tracing is None
assert not [m for m in sys.modules if m.startswith("opentelemetry")], "otel imported"
assert "svir.edges.tracing" not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("exporter", ["otlp", "console"])
def test_exporters_are_built(exporter: str) -> None:
    from svir.config.model import TelemetryConfig
    from svir.edges.tracing import Tracing

    tracing = Tracing(
        TelemetryConfig(otel=True, exporter=exporter, otlp_endpoint="http://127.0.0.1:9/v1/traces")
    )
    tracing.provider.shutdown()


async def test_verbose_health_is_the_operators_once_keys_exist(
    harness_factory: type[Harness],
) -> None:
    """`/healthz?verbose=1` names deployments, pids and managed models' log files: once keys
    exist it takes what /metrics takes; plain `/healthz` stays open for health checks."""
    token = "metrics-token-0123456789"
    h = await harness_factory(environ={"SVIR_METRICS_TOKEN": token}).start()
    assert h.http is not None
    assert (await h.http.get("/healthz?verbose=1")).status_code == 200  # no keys: this machine
    secret, _ = await h.new_key()
    for headers in ({}, bearer(secret)):
        r = await h.http.get("/healthz?verbose=1", headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_metrics_token"
        assert "GET /healthz?verbose=1" in r.json()["error"]["message"]
        assert "pid" not in r.json()
    plain = await h.http.get("/healthz")
    assert plain.status_code == 200 and plain.json()["status"] == "ok" and "pid" not in plain.json()
    for good in (token, ADMIN_KEY):
        r = await h.http.get("/healthz?verbose=1", headers=bearer(good))
        assert r.status_code == 200 and "pid" in r.json(), r.text
