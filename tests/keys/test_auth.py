"""Keys: issuing, authenticating, revoking, expiry, open mode on loopback only, svir's own 401
kept apart from the upstream's, and models a key may use."""

from __future__ import annotations

import hashlib
import time

import asyncpg  # noqa: F401  (PostgreSQL is part of the setup)
import pytest

from tests.keys.support import ADMIN_KEY, Harness
from tests.support.upstream import ScriptedServer


async def test_open_mode_serves_loopback_clients_only(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    r = await h.chat(None)
    assert r.status_code == 200, r.text
    async with h.client("192.168.7.9") as remote:
        r = await remote.post(
            "/v1/chat/completions",
            json={"model": "fake/tok-1", "messages": [{"role": "user", "content": "x"}]},
        )
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "loopback_only"
    # The health check answers anyone.
    async with h.client("192.168.7.9") as remote:
        assert (await remote.get("/healthz")).status_code == 200


async def test_open_mode_beyond_loopback_when_told(harness_factory: type[Harness]) -> None:
    h = await harness_factory(extra="[auth]\nallow_open_non_loopback = true\n").start()
    async with h.client("192.168.7.9") as remote:
        r = await remote.post(
            "/v1/chat/completions",
            json={"model": "fake/tok-1", "messages": [{"role": "user", "content": "x"}]},
        )
    assert r.status_code == 200


async def test_admin_api_needs_the_admin_key(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    assert h.http is not None
    r = await h.http.get("/admin/keys")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
    r = await h.http.get("/admin/keys", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = await h.admin("GET", "/admin/keys")
    assert r.status_code == 200 and r.json() == {"object": "list", "data": []}


async def test_admin_api_without_an_admin_key(harness_factory: type[Harness]) -> None:
    h = await harness_factory(environ={"SVIR_ADMIN_KEY": ""}).start()
    assert h.http is not None
    # No keys yet: this machine only (it may issue the first key)...
    async with h.client("192.168.7.9") as remote:
        r = await remote.get("/admin/keys")
    assert r.status_code == 403 and r.json()["error"]["code"] == "loopback_only"
    r = await h.http.post("/admin/keys", json={"name": "first"})
    assert r.status_code == 201, r.text
    # ... and once a key exists, the admin API is off.
    r = await h.http.get("/admin/keys")
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "admin_disabled"
    assert "SVIR_ADMIN_KEY" in r.json()["error"]["message"]


async def test_key_is_shown_once_and_stored_hashed(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    secret, body = await h.new_key(name="ci", rpm=10)
    assert secret.startswith("sk-svir-") and len(secret) >= 8 + 43
    assert body["id"].startswith("key_") and body["hint"].endswith(secret[-4:])
    listed = (await h.admin("GET", "/admin/keys")).json()["data"]
    assert [k["id"] for k in listed] == [body["id"]]
    assert secret not in str(listed)
    assert h.service.store is not None
    async with h.service.store.transaction(write=False) as tx:
        rows = await tx.fetch("SELECT * FROM api_keys")
    dumped = repr([dict(r) for r in rows])
    assert secret not in dumped
    assert hashlib.sha256(secret.encode()).hexdigest() in dumped


async def test_keys_are_required_once_one_exists(
    harness_factory: type[Harness], upstream: ScriptedServer
) -> None:
    h = await harness_factory().start()
    secret, _ = await h.new_key()
    r = await h.chat(None)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert r.headers["x-request-id"]
    r = await h.chat("sk-svir-not-a-real-key")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = await h.chat(secret)
    assert r.status_code == 200
    # Also the Ollama-free routes: the model list needs the key too; the health check does not.
    assert h.http is not None
    assert (await h.http.get("/v1/models")).status_code == 401
    assert (await h.http.get("/healthz")).status_code == 200


async def test_a_key_in_x_api_key_is_taken_on_every_route(
    harness_factory: type[Harness], upstream: ScriptedServer
) -> None:
    # Anthropic's clients send their key as `x-api-key`; the bearer token wins when both come.
    h = await harness_factory().start()
    secret, _ = await h.new_key()
    assert h.http is not None
    body = {"model": "fake/tok-3", "messages": [{"role": "user", "content": "hi"}]}
    r = await h.http.post("/v1/chat/completions", json=body, headers={"x-api-key": secret})
    assert r.status_code == 200, r.text
    assert (await h.http.get("/v1/models", headers={"x-api-key": secret})).status_code == 200
    r = await h.http.get("/v1/models", headers={"x-api-key": "sk-svir-not-a-real-key"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    both = {"x-api-key": secret, "authorization": "Bearer sk-svir-not-a-real-key"}
    assert (await h.http.get("/v1/models", headers=both)).status_code == 401


async def test_svir_401_is_not_the_upstream_401(
    harness_factory: type[Harness], upstream: ScriptedServer
) -> None:
    h = await harness_factory().start()
    secret, _ = await h.new_key()
    before = len(upstream.chat_requests)
    r = await h.chat("sk-svir-wrong", "fake/echo-401")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert len(upstream.chat_requests) == before, "svir's own refusal never reaches the upstream"
    r = await h.chat(secret, "fake/echo-401")
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["code"] == "upstream_auth_error" and err["type"] == "upstream_error"
    assert len(upstream.chat_requests) > before


async def test_revoked_key_stops_at_once_here(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    secret, body = await h.new_key()
    other, _ = await h.new_key(name="other")
    assert (await h.chat(secret)).status_code == 200
    r = await h.admin("DELETE", f"/admin/keys/{body['id']}")
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    r = await h.chat(secret)
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    assert (await h.chat(other)).status_code == 200
    listed = (await h.admin("GET", "/admin/keys")).json()["data"]
    assert body["id"] not in [k["id"] for k in listed]
    listed = (await h.admin("GET", "/admin/keys?all=1")).json()["data"]
    assert body["id"] in [k["id"] for k in listed]
    assert (await h.admin("DELETE", "/admin/keys/key_0000000000000000")).status_code == 404


async def test_revocation_reaches_another_replica_within_the_cache_time(
    harness_factory: type[Harness], tmp_path: object
) -> None:
    """Two Apps on one store: the second learns of a revocation within cache_seconds."""
    extra = "[auth]\ncache_seconds = 0.2\n"
    a = await harness_factory(extra=extra).start()
    b = await harness_factory(extra=extra).start()
    secret, body = await a.new_key()
    await a.new_key(name="stays")  # with no key left svir would run open (on loopback)
    assert (await b.chat(secret)).status_code == 200
    await a.admin("DELETE", f"/admin/keys/{body['id']}")
    time.sleep(0.25)
    assert (await b.chat(secret)).status_code == 401


async def test_revoking_every_key_runs_open_on_loopback_only(
    harness_factory: type[Harness],
) -> None:
    h = await harness_factory().start()
    _, body = await h.new_key()
    assert (await h.chat(None)).status_code == 401
    await h.admin("DELETE", f"/admin/keys/{body['id']}")
    assert (await h.chat(None)).status_code == 200
    async with h.client("10.1.2.3") as remote:
        r = await remote.get("/v1/models")
    assert r.status_code == 403


async def test_expired_key(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    secret, body = await h.new_key(expires="1h")
    assert body["expires_at"] == pytest.approx(time.time() + 3600, abs=5)
    assert (await h.chat(secret)).status_code == 200
    h.service.auth.wall = lambda: time.time() + 3601
    r = await h.chat(secret)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    # An expired key still counts as configured: svir does not fall open.
    assert (await h.chat(None)).status_code == 401


async def test_bad_key_specs_are_refused(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    for spec, word in (
        ({}, "name"),
        ({"name": "x", "rpm": 0}, "rpm"),
        ({"name": "x", "rpm": "5"}, "rpm"),
        ({"name": "x", "models": []}, "models"),
        ({"name": "x", "colour": "red"}, "colour"),
        ({"name": "x", "expires": "yesterday"}, "yesterday"),
        ({"name": "x", "expires_at": 1}, "future"),
        ({"name": "x", "cost_per_day": -1}, "cost_per_day"),
    ):
        r = await h.admin("POST", "/admin/keys", json=spec)
        assert r.status_code == 400, (spec, r.text)
        assert word in r.json()["error"]["message"], (spec, r.text)


async def test_models_a_key_may_use(
    harness_factory: type[Harness], upstream: ScriptedServer
) -> None:
    h = await harness_factory().start()
    secret, _ = await h.new_key(models=["fake/tok-3", "other/"])
    assert (await h.chat(secret, "fake/tok-3")).status_code == 200
    assert (await h.chat(secret, "other/tok-2")).status_code == 200
    before = len(upstream.chat_requests)
    r = await h.chat(secret, "fake/tok-2")
    assert r.status_code == 403
    err = r.json()["error"]
    assert err["code"] == "model_not_allowed" and err["param"] == "model"
    assert "fake/tok-2" in err["message"]
    assert len(upstream.chat_requests) == before


async def test_model_lists_show_a_key_only_its_models(harness_factory: type[Harness]) -> None:
    h = await harness_factory(extra='models = ["tok-1", "tok-2"]', fronts=("ollama",)).start()
    narrow, _ = await h.new_key(models=["other/tok-1"])
    wide, _ = await h.new_key(name="wide")
    assert h.http is not None

    async def listed(key: str) -> tuple[list[str], list[str]]:
        auth = {"Authorization": f"Bearer {key}"}
        openai_list = await h.http.get("/v1/models", headers=auth)
        ollama_list = await h.http.get("/api/tags", headers=auth)
        assert openai_list.status_code == ollama_list.status_code == 200
        return (
            [m["id"] for m in openai_list.json()["data"]],
            [m["name"] for m in ollama_list.json()["models"]],
        )

    assert await listed(wide) == (["other/tok-1", "other/tok-2"], ["other/tok-1", "other/tok-2"])
    assert await listed(narrow) == (["other/tok-1"], ["other/tok-1"])


async def test_admin_key_and_metrics_are_outside_key_auth(harness_factory: type[Harness]) -> None:
    h = await harness_factory().start()
    await h.new_key()
    assert h.http is not None
    # Not a svir key but the admin key (or the metrics token: test_telemetry.py).
    assert (await h.admin("GET", "/metrics")).status_code == 200
    r = await h.admin("GET", "/admin/keys")
    assert r.status_code == 200
    assert ADMIN_KEY not in r.text
