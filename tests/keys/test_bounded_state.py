"""State that must not grow with what clients invent: hundreds of invented model ids under one
provider (asked with a key limited to that provider) leave `/healthz?verbose=1`, `/metrics` and
Ollama's `/api/ps` within `[server] max_unlisted_models` plus the configured models, while the
configured models' state (an open breaker, a call in flight) stays; and no metric carries an
empty `model` or `provider` label, also for calls refused before they were routed."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from svir.call import INTERNAL, CallContext
from tests.keys.support import Harness
from tests.keys.test_telemetry import samples, value
from tests.support.upstream import ScriptedServer

CAP = 20
# The configured models the test uses: the route's target, its fallback, the held call's.
CONFIGURED = {"fake/echo-503", "fake/tok-3", "fake/tok-4-slow"}


def bounded_config(upstream: str, store: str, cap: int = CAP) -> str:
    return f"""
[server]
max_unlisted_models = {cap}

[store]
url = "{store}"

[ledger]
flush_seconds = 0.05

[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "{upstream}"
discover = false
models = ["tok-3", "tok-4-slow"]
retry = {{ attempts = 1 }}
breaker = {{ failures = 2, cooldown = 600 }}

[[routes]]
name = "smart"
targets = [{{ model = "fake/echo-503" }}]
fallbacks = ["fake/tok-3"]
"""


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return set(samples(text))


def without_breakers(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {s for s in series(text) if not s[0].startswith("svir_breaker_")}


def label_values(text: str, metric: str, label: str) -> set[str]:
    return {dict(labels)[label] for name, labels in series(text) if name == metric}


async def test_invented_models_leave_state_and_metrics_bounded(
    harness_factory: type[Harness], upstream: ScriptedServer, tmp_path: Path
) -> None:
    h = await harness_factory(
        bounded_config(upstream.base_url, f"sqlite:///{tmp_path / 'b.db'}")
    ).start()
    assert h.http is not None
    secret, _ = await h.new_key(models=["fake/"])
    wide, _ = await h.new_key(name="wide")
    # The route's target fails twice (a 503, no retry): its breaker opens, the fallback serves.
    for _ in range(2):
        assert (await h.chat(wide, "smart", stream=False)).status_code == 200
    # A call in flight on a configured model, held open through the flood.
    held = await h.app.gateway.open_chat(
        CallContext("held-1", INTERNAL),
        {
            "model": "fake/tok-4-slow",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
    )

    async def invent(start: int, stop: int) -> None:
        for i in range(start, stop):
            r = await h.chat(secret, f"fake/invented-{i}", stream=False)
            assert r.status_code == 200, r.text

    await invent(0, 30)
    await h.flush()
    await h.admin("GET", "/metrics")  # so that both scrapes below count a scrape before them
    early = (await h.admin("GET", "/metrics")).text
    await invent(30, 300)
    await h.flush()
    late = (await h.admin("GET", "/metrics")).text

    deployments = (await h.admin("GET", "/healthz?verbose=1")).json()["deployments"]
    invented = {m for m in deployments if m.startswith("fake/invented-")}
    assert set(deployments) - invented == CONFIGURED
    assert len(invented) == CAP
    # The most recent ones are kept: the least recently used went first.
    assert invented == {f"fake/invented-{i}" for i in range(300 - CAP, 300)}
    assert deployments["fake/echo-503"]["state"] == "open"
    assert deployments["fake/tok-4-slow"]["in_flight"] == 1

    # Past the bound, new model ids add no series: the scrape after 300 has as many as the one
    # after 30 (the same, but for which invented deployments the breaker gauges name), and about
    # its size (the counts' digits differ).
    assert len(series(late)) == len(series(early))
    assert without_breakers(late) == without_breakers(early)
    assert len(late) <= len(early) + 1024
    models = label_values(late, "svir_chat_requests_total", "model")
    assert models - {m for m in models if m.startswith("fake/invented-")} == {
        "smart",
        "other",
    }
    assert len(models) == CAP + 2
    found = samples(late)
    assert (
        value(found, "svir_chat_requests_total", model="other", provider="fake", outcome="ok")
        == 300 - CAP
    )
    assert value(found, "svir_breaker_state", deployment="fake/echo-503") == 2
    assert len(label_values(late, "svir_breaker_state", "deployment")) == CAP + len(CONFIGURED)

    held.close()
    deployments = (await h.admin("GET", "/healthz?verbose=1")).json()["deployments"]
    assert deployments["fake/tok-4-slow"]["in_flight"] == 0


async def test_ollama_ps_stays_bounded(
    harness_factory: type[Harness], upstream: ScriptedServer, tmp_path: Path
) -> None:
    h = await harness_factory(
        bounded_config(upstream.base_url, f"sqlite:///{tmp_path / 'o.db'}", cap=5),
        fronts=("ollama",),
    ).start()
    assert h.http is not None
    secret, _ = await h.new_key(models=["fake/"])
    auth = {"Authorization": f"Bearer {secret}"}
    for model in ["fake/tok-3"] + [f"fake/invented-{i}" for i in range(40)]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
        r = await h.http.post("/api/chat", json=body, headers=auth)
        assert r.status_code == 200, r.text
    r = await h.http.get("/api/ps", headers=auth)
    assert r.status_code == 200
    names = {m["name"] for m in r.json()["models"]}
    assert "fake/tok-3" in names
    assert names - {"fake/tok-3"} == {f"fake/invented-{i}" for i in range(35, 40)}


async def test_no_metric_has_an_empty_model_or_provider(
    harness_factory: type[Harness], tmp_path: Path
) -> None:
    h = await harness_factory().start()
    assert h.http is not None
    narrow, _ = await h.new_key(models=["fake/"])
    wide, _ = await h.new_key(name="wide")
    limited, _ = await h.new_key(name="limited", rpm=1)
    assert (await h.chat(wide, "nope/model")).status_code == 404  # unknown provider
    assert (await h.chat(narrow, "other/tok-3")).status_code == 403  # not the key's
    assert (await h.chat("sk-svir-wrong")).status_code == 401
    assert (await h.chat(limited)).status_code == 200
    assert (await h.chat(limited)).status_code == 429  # the key's rpm, before routing
    assert (await h.chat(wide, "fake/echo-400", stream=False)).status_code == 400  # upstream's
    bad = await h.http.post(
        "/v1/chat/completions",
        content=b'{"model": "fake/tok-3", "messages": ',
        headers={"Authorization": f"Bearer {wide}", "Content-Type": "application/json"},
    )
    assert bad.status_code == 400
    no_messages = await h.http.post(
        "/v1/chat/completions",
        json={"model": "fake/tok-3"},
        headers={"Authorization": f"Bearer {wide}"},
    )
    assert no_messages.status_code == 400
    await h.flush()
    text = (await h.admin("GET", "/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for name, label in s.labels.items():
                assert label, f"{s.name} has an empty {name} label: {s.labels}"
    found = samples(text)
    chat = "svir_chat_requests_total"
    assert value(found, chat, model="other", provider="none", outcome="model_not_found") == 1
    assert value(found, chat, model="other", provider="none", outcome="model_not_allowed") == 1
    assert value(found, chat, model="other", provider="none", outcome="rpm_exceeded") == 1
    failed = [
        dict(labels)
        for name, labels in found
        if name == chat and dict(labels)["model"] == "fake/echo-400"
    ]
    assert [f["provider"] for f in failed] == ["fake"]
    # An unroutable model never got a deployment either.
    deployments = (await h.admin("GET", "/healthz?verbose=1")).json()["deployments"]
    assert "nope/model" not in deployments
