"""`/admin/models` over the scripted upstream in process: every provider and model, configured and
discovered, with the context and capabilities the catalog knows, breaker state and requests in
flight; the routes; and load, unload and log refusing what svir does not run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.console.support import ADMIN, ADMIN_KEY, app, assert_error, upstream
from tests.support.mock_transport import MockRequest, MockResponse

ENV = {"SVIR_ADMIN_KEY": ADMIN_KEY, "LAB_KEY": "sk-lab-secret-0123456789abcdef"}


async def test_models_lists_providers_models_routes_and_breakers(tmp_path: Path) -> None:
    async with app(tmp_path, environ=ENV) as svir:
        # One failure opens the breaker of down/always-503 (failures = 1).
        with pytest.raises(openai.APIStatusError):
            await svir.client.chat.completions.create(
                model="down/always-503", messages=[{"role": "user", "content": "hi"}]
            )
        r = await svir.http.get("/admin/models", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert ENV["LAB_KEY"] not in r.text
        body = r.json()
        assert body["providers"] == [
            {
                "name": "lab",
                "kind": "openai-compatible",
                "base_url": "http://lab.test/v1",
                "api_key_env": "LAB_KEY",
                "key_set": True,
                "models": 2,
            },
            {
                "name": "down",
                "kind": "openai-compatible",
                "base_url": "http://down.test/v1",
                "api_key_env": None,
                "key_set": False,
                "models": 1,
            },
        ]
        data = {m["id"]: m for m in body["data"]}
        assert list(data) == ["lab/tok-3", "lab/found-later", "down/always-503", "smart"]
        tok = data["lab/tok-3"]
        assert (tok["provider"], tok["model"], tok["kind"], tok["source"]) == (
            "lab",
            "tok-3",
            "openai-compatible",
            "configured",
        )
        assert tok["context_length"] == 8192
        assert tok["capabilities"][0] == "completion" and "tools" in tok["capabilities"]
        assert tok["managed"] is None and tok["in_flight"] == 0
        # The request above went to down/always-503 only: no state for tok-3 yet.
        assert tok["breaker"] is None
        found = data["lab/found-later"]
        assert found["source"] == "discovered" and found["context_length"] == 4096
        down = data["down/always-503"]
        assert down["breaker"]["state"] == "open" and down["breaker"]["failures"] == 1
        assert down["breaker"]["cooldown_left"] > 0
        assert down["context_length"] is None
        smart = data["smart"]
        assert smart["source"] == "route" and smart["provider"] is None
        assert smart["route"] == {
            "targets": [{"model": "lab/tok-3", "weight": 1.0}],
            "strategy": "weighted",
            "fallbacks": ["down/always-503"],
            "context_fallback": None,
        }
        # A request ends: its deployment's state is kept, closed, nothing in flight.
        await svir.client.chat.completions.create(
            model="lab/tok-3", messages=[{"role": "user", "content": "hi"}]
        )
        r = await svir.http.get("/admin/models", headers=ADMIN)
        tok = next(m for m in r.json()["data"] if m["id"] == "lab/tok-3")
        assert tok["breaker"] == {"state": "closed", "failures": 0, "cooldown_left": 0.0}


async def test_load_unload_and_log_refuse_models_svir_does_not_run(tmp_path: Path) -> None:
    async with app(tmp_path, environ=ENV) as svir:
        for path in ("/admin/models/load", "/admin/models/unload"):
            r = await svir.http.post(path, json={"model": "lab/tok-3"}, headers=ADMIN)
            error = assert_error(r, 400, "model_not_managed")
            assert error["param"] == "model" and "llamacpp-managed" in error["message"]
            r = await svir.http.post(path, json={"model": "nowhere/x"}, headers=ADMIN)
            assert_error(r, 404, "model_not_found")
            r = await svir.http.post(path, json={"model": 7}, headers=ADMIN)
            assert assert_error(r, 400, None)["param"] == "model"
        r = await svir.http.get("/admin/models/log?model=lab/tok-3", headers=ADMIN)
        assert_error(r, 400, "model_not_managed")
        r = await svir.http.get("/admin/models/log?model=nowhere/x", headers=ADMIN)
        assert_error(r, 404, "model_not_found")
        r = await svir.http.get("/admin/models/log", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        for lines in ("0", "x", "2001"):
            r = await svir.http.get(
                f"/admin/models/log?model=lab/tok-3&lines={lines}", headers=ADMIN
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "lines"


class Held:
    """The scripted upstream, whose chat requests wait for `go` (a request held in flight)."""

    def __init__(self) -> None:
        self.script = upstream()
        self.go = asyncio.Event()
        self.arrived = asyncio.Event()

    async def __call__(self, request: MockRequest) -> MockResponse:
        if request.method == "POST":
            self.arrived.set()
            await self.go.wait()
        answer: Any = self.script(request)
        return await answer if asyncio.iscoroutine(answer) else answer


async def test_models_count_requests_in_flight_and_a_breaker_half_open(tmp_path: Path) -> None:
    held = Held()
    async with app(tmp_path, environ=ENV, handler=held) as svir:
        call = asyncio.create_task(
            svir.client.chat.completions.create(
                model="smart", messages=[{"role": "user", "content": "hi"}]
            )
        )
        await asyncio.wait_for(held.arrived.wait(), 30)
        r = await svir.http.get("/admin/models", headers=ADMIN)
        data = {m["id"]: m for m in r.json()["data"]}
        assert data["lab/tok-3"]["in_flight"] == 1 and data["smart"]["in_flight"] == 1
        assert data["lab/found-later"]["in_flight"] == 0
        held.go.set()
        assert (await call).choices[0].message.content == "w0 w1 w2 "
        r = await svir.http.get("/admin/models", headers=ADMIN)
        assert {m["id"]: m["in_flight"] for m in r.json()["data"]}["lab/tok-3"] == 0

        with pytest.raises(openai.APIStatusError):
            await svir.client.chat.completions.create(
                model="down/always-503", messages=[{"role": "user", "content": "hi"}]
            )
        svir.now += 31  # the policy's clock, past the 30 s cooldown: one probe may go
        r = await svir.http.get("/admin/models", headers=ADMIN)
        down = next(m for m in r.json()["data"] if m["id"] == "down/always-503")
        assert down["breaker"] == {"state": "half_open", "failures": 1, "cooldown_left": 0.0}
