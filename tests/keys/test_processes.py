"""Real `svir serve` processes: two replicas on one Redis and one PostgreSQL holding a budget
under concurrent load; upstream keys never shown; and `svir serve` refusing to listen beyond
loopback without keys."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from svir.wire.tokens import estimate_prompt_tokens
from tests.keys.conftest import Postgres
from tests.keys.support import ADMIN_KEY, config_text, frames
from tests.support.svir_proc import SvirProcess, free_port
from tests.support.upstream import ScriptedServer

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

UPSTREAM_KEY = "up-Zq81xK3mW9vT-secret"


def start(tmp: Path, name: str, text: str, env: dict[str, str] | None = None) -> SvirProcess:
    where = tmp / name
    where.mkdir()
    return SvirProcess(text, where, {"SVIR_ADMIN_KEY": ADMIN_KEY, **(env or {})}).start()


def new_key(svir: SvirProcess, **spec: Any) -> tuple[str, str]:
    r = httpx.post(
        svir.url + "/admin/keys",
        json={"name": "load", **spec},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    return r.json()["key"], r.json()["id"]


def stream_chat(url: str, key: str, model: str, **extra: Any) -> tuple[int, list[Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "go"}], "stream": True}
    body.update(extra)
    with httpx.Client(timeout=30) as client:
        r = client.post(
            url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    return r.status_code, frames(r.content) if r.status_code == 200 else [r.json()]


def settled_usage(url: str, key: str, sent: int) -> dict[str, Any]:
    """`/v1/usage` once every call sent so far has settled: the ledger has a row for each, and
    the shared counter equals the ledger's sum. (A reservation not yet settled holds at least what
    its call used, so equal sums mean none is left to settle.) Polled rather than slept for, so
    that a slow machine only takes longer."""
    deadline = time.monotonic() + 60
    while True:
        view: dict[str, Any] = httpx.get(
            url + "/v1/usage", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).json()
        totals = view["totals"]
        if (
            totals["requests"] == sent
            and totals["total_tokens"] == view["limits"]["tokens_per_day"]["used"]
        ):
            return view
        assert time.monotonic() < deadline, (sent, view)
        time.sleep(0.05)


@pytest.mark.parametrize("n_requests", [48])
def test_two_replicas_on_one_redis_hold_one_budget(
    tmp_path: Path, upstream: ScriptedServer, postgres: Postgres, redis_prefix: str, n_requests: int
) -> None:
    store = postgres.url()
    text = config_text(upstream.base_url, store, backend="redis", redis_prefix=redis_prefix)
    a = start(tmp_path, "a", text)
    b = start(tmp_path, "b", text)
    try:
        budget = 700
        key, key_id = new_key(a, tokens_per_day=budget)
        time.sleep(0.1)
        urls = [a.url, b.url]
        # Each answer is 20 tokens and the prompt 7 (the upstream's usage); each call reserves
        # the prompt's estimate + 64 (default_completion_tokens) before it starts, and is admitted
        # while the budget holds more than the estimate (its floor).
        floor = estimate_prompt_tokens({"messages": [{"role": "user", "content": "go"}]}) + 1
        # A burst of 16 at a time, half on each replica: 48 answers would need 48 x 27 tokens,
        # so some are refused or cut, and the replicas race for the last of the budget.
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            results = list(
                pool.map(
                    lambda i: stream_chat(urls[i % 2], key, "fake/tok-20-slow"), range(n_requests)
                )
            )
        assert [f for code, f in results if code == 200 and f[-1] == "[DONE]"], results
        assert [f for code, f in results if code == 429 or f[-1] != "[DONE]"], results
        # Then one call at a time, each sent once everything before it has settled, until the
        # budget is used up: what settled calls gave back is admitted again, on either replica.
        view = settled_usage(b.url, key, len(results))
        while budget - view["limits"]["tokens_per_day"]["used"] >= floor:
            assert len(results) < n_requests + budget, view
            code, f = stream_chat(urls[len(results) % 2], key, "fake/tok-20")
            results.append((code, f))
            assert code == 200, f  # more than a call's floor left, and nothing else in flight
            view = settled_usage(b.url, key, len(results))
        # Used up: the next call is refused, on either replica.
        for url in urls:
            code, f = stream_chat(url, key, "fake/tok-3", max_tokens=5)
            results.append((code, f))
            assert code == 429, f
        view = settled_usage(b.url, key, len(results))
        used = view["limits"]["tokens_per_day"]["used"]
        # The two replicas together never let more through than the budget, and used it all but
        # less than one call's floor.
        assert budget - floor < used <= budget

        done = [f for code, f in results if code == 200 and f[-1] == "[DONE]"]
        cut = [f for code, f in results if code == 200 and f[-1] != "[DONE]"]
        refused = [f for code, f in results if code == 429]
        assert len(done) + len(cut) + len(refused) == len(results), results
        for f in cut:
            errors = [x for x in f if isinstance(x, dict) and "error" in x]
            assert len(errors) == 1 and f[-1] is errors[0]
            assert errors[0]["error"]["code"] == "tokens_per_day_exceeded"
        for f in refused:
            assert f[0]["error"]["code"] == "tokens_per_day_exceeded"
        # Both replicas wrote to one ledger, and it agrees with the shared counter (settled_usage
        # waited for that): a row for every call, the finished ones without error.
        totals = view["totals"]
        assert totals["requests"] == len(results)
        assert totals["total_tokens"] == used
        assert totals["requests"] - totals["errors"] == len(done)
        by_replica = httpx.get(
            a.url + "/admin/usage?by=key,status",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        ).json()["data"]
        assert {r["key"] for r in by_replica} == {key_id}
    finally:
        a.stop()
        b.stop()
    for proc in (a, b):
        assert "Traceback" not in proc.log(), proc.log()


def test_upstream_keys_never_shown(tmp_path: Path, upstream: ScriptedServer) -> None:
    store = f"sqlite:///{tmp_path / 's.db'}"
    text = config_text(upstream.base_url, store, api_key_env="UPSTREAM_KEY")
    text += '\n[[routes]]\nname = "down"\ntargets = [{ model = "fake/echo-503" }]\n'
    svir = start(tmp_path, "s", text, {"UPSTREAM_KEY": UPSTREAM_KEY})
    seen: list[str] = []
    try:
        key, _ = new_key(svir)
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=svir.url, headers=auth, timeout=30) as client:
            models = ("401", "400", "503", "stream", "fields-400", "fields-stream")
            messages = [{"role": "user", "content": "x"}]
            for model in (f"fake/echo-{m}" for m in models):
                for stream in (True, False):
                    body = {"model": model, "messages": messages, "stream": stream}
                    for path in ("/v1/chat/completions", "/api/chat"):
                        r = client.post(path, json=body)
                        seen.append(f"{r.status_code} {dict(r.headers)} {r.text}")
                    thread = client.post("/v1/threads", json={"model": model}).json()["id"]
                    client.post(f"/v1/threads/{thread}/messages", json={"content": "x"})
                    r = client.post(f"/v1/threads/{thread}/continue", json={"stream": stream})
                    seen.append(f"{r.status_code} {dict(r.headers)} {r.text}")
            seen.append(client.get("/v1/usage").text)
            r = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            assert r.status_code == 200
            seen.append(r.text)
            seen.append(client.get("/healthz?verbose=1").text)
            seen.append(client.get("/v1/models").text)
    finally:
        svir.stop()
    # The upstream did get the key: the test is about svir not repeating it.
    assert any(
        r.headers.get("Authorization") == f"Bearer {UPSTREAM_KEY}" for r in upstream.requests
    )
    assert any("502" in s and "upstream_auth_error" in s for s in seen)
    assert any("[redacted]" in s for s in seen), seen
    everything = "\n".join(seen)
    assert UPSTREAM_KEY not in everything
    log = svir.log()
    assert "upstream attempt failed" in log
    assert UPSTREAM_KEY not in log
    assert ADMIN_KEY not in log
    assert key not in log and key not in everything


def _serve(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "svir", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=tmp,
    )


def test_serve_refuses_a_public_address_without_keys(tmp_path: Path) -> None:
    config = tmp_path / "svir.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path / "k.db"}"\n')
    port = free_port()
    proc = _serve(tmp_path, "--config", str(config), "--host", "0.0.0.0", "--port", str(port))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"refusing to listen on 0.0.0.0" in out and b"svir keys create" in out

    # Told explicitly: it listens.
    proc = _serve(
        tmp_path, "--config", str(config), "--host", "0.0.0.0", "--port", str(port), "--allow-open"
    )
    try:
        assert _healthy(port)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)

    # With a key issued: it listens, and wants the key.
    created = subprocess.run(
        [
            sys.executable,
            "-m",
            "svir",
            "keys",
            "create",
            "--name",
            "ops",
            "--json",
            "--config",
            str(config),
        ],
        capture_output=True,
        check=True,
    )
    secret = json.loads(created.stdout)["key"]
    proc = _serve(tmp_path, "--config", str(config), "--host", "0.0.0.0", "--port", str(port))
    try:
        assert _healthy(port)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert r.status_code == 401
        r = httpx.get(
            f"http://127.0.0.1:{port}/v1/models",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=5,
        )
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


def _healthy(port: int) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False
