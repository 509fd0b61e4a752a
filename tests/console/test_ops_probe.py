"""`POST /admin/probe`: `svir probe` run in svir's process on a configured provider (the scripted
upstream over loopback HTTP): its rows and plain table, the provider's key sent and never shown,
one probe at a time, the time bound, and the errors."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console.support import ADMIN, ADMIN_KEY, app, assert_error
from tests.support.mock_server import MockServerThread
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import ScriptedServer, ScriptedUpstream

LAB_KEY = "sk-lab-probe-secret-0123456789abcdef"
ENV = {"SVIR_ADMIN_KEY": ADMIN_KEY, "LAB_KEY": LAB_KEY}


def config(base_url: str) -> str:
    return f"""
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "{base_url}"
api_key_env = "LAB_KEY"
discover = false
"""


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    with MockServerThread(ScriptedUpstream(models=["tok-3"], fallback="tok-3")) as server:
        yield server


async def test_probe_runs_svir_probe_on_a_provider(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    async with app(tmp_path, config=config(scripted.base_url), environ=ENV) as svir:
        r = await svir.http.post(
            "/admin/probe", json={"provider": "lab", "only": ["tools"]}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        assert LAB_KEY not in r.text
        body = r.json()
        assert body["provider"] == "lab" and body["model"] == "tok-3"
        ids = [row["id"] for row in body["rows"]]
        assert ids == [
            "usage",
            "tool_choice.auto",
            "tool_choice.none",
            "tool_choice.required",
            "tool_choice.named",
            "tool_choice.invalid",
        ]
        usage = body["rows"][0]
        assert usage["verdict"] == "kept" and usage["evidence"]["usage"]["completion_tokens"] > 0
        # The scripted server answers text to every request: a required tool is not called.
        assert body["rows"][3]["verdict"] == "ignored"
        text = body["text"]
        assert text.startswith("svir probe · " + scripted.base_url)
        assert "behaviour" in text and "tool_choice required" in text and "ignored" in text
        assert "\x1b[" not in text  # plain: no terminal colours
        assert body["report"]["suggested_provider_settings"]["kind"] == "openai-compatible"
        # svir's probe sent the provider's key, as svir's requests do.
        chats = scripted.chat_requests
        assert len(chats) == 6
        assert all(c.headers["authorization"] == f"Bearer {LAB_KEY}" for c in chats)


async def test_probe_errors(tmp_path: Path) -> None:
    # A port nothing listens on: bound, never listening.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        async with app(tmp_path, config=config(base), environ=ENV) as svir:
            r = await svir.http.post("/admin/probe", json={"provider": "nope"}, headers=ADMIN)
            error = assert_error(r, 404, "not_found")
            assert error["param"] == "provider" and "lab" in error["message"]
            r = await svir.http.post("/admin/probe", json={"provider": "lab"}, headers=ADMIN)
            error = assert_error(r, 502, "probe_failed")
            assert "cannot connect" in error["message"]
            for bad, param in (
                ({}, "provider"),
                ({"provider": 1}, "provider"),
                ({"provider": "lab", "only": ["everything"]}, "only"),
                ({"provider": "lab", "only": []}, "only"),
                ({"provider": "lab", "timeout": 0}, "timeout"),
                ({"provider": "lab", "timeout": True}, "timeout"),
                ({"provider": "lab", "model": ""}, "model"),
                ({"provider": "lab", "extra": 1}, "extra"),
            ):
                r = await svir.http.post("/admin/probe", json=bad, headers=ADMIN)
                assert assert_error(r, 400, None)["param"] == param, bad
            r = await svir.http.post("/admin/probe", content=b"{not json", headers=ADMIN)
            assert_error(r, 400, "invalid_json")


class Gated:
    """The scripted upstream, whose model list waits for `open` (a probe held at its start)."""

    def __init__(self) -> None:
        self.script = ScriptedUpstream(models=["tok-3"], fallback="tok-3")
        self.open = threading.Event()

    async def __call__(self, request: MockRequest) -> MockResponse:
        if request.path.endswith("/models"):
            await asyncio.to_thread(self.open.wait, 60)
        answer: Any = self.script(request)
        return await answer if asyncio.iscoroutine(answer) else answer


async def test_one_probe_at_a_time_and_each_within_its_time(tmp_path: Path) -> None:
    gated = Gated()
    with MockServerThread(gated) as server:
        async with app(tmp_path, config=config(server.base_url), environ=ENV) as svir:
            first = asyncio.create_task(
                svir.http.post(
                    "/admin/probe", json={"provider": "lab", "timeout": 1}, headers=ADMIN
                )
            )
            await asyncio.to_thread(server.wait_requests, 1, 30)
            r = await svir.http.post("/admin/probe", json={"provider": "lab"}, headers=ADMIN)
            assert_error(r, 409, "probe_busy")
            # Past the first probe's second before its server answers: no check is started.
            await asyncio.sleep(1.2)
            gated.open.set()
            r = await first
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["rows"] == [] and server.chat_requests == []
            assert any(n.startswith("Out of time: usage") for n in body["report"]["notes"])
            assert "Out of time" in body["text"]
            # The next probe may run.
            r = await svir.http.post(
                "/admin/probe", json={"provider": "lab", "only": ["json"]}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            assert [row["id"] for row in r.json()["rows"]] == [
                "usage",
                "response_format.json_object",
                "response_format.json_schema",
            ]


async def test_probe_refuses_a_server_not_under_v1(tmp_path: Path) -> None:
    gemini = """
[[providers]]
name = "g"
kind = "gemini"
api_key_env = "LAB_KEY"
models = ["gemini-2.5-flash"]
"""
    async with app(tmp_path, config=gemini, environ=ENV) as svir:
        r = await svir.http.post("/admin/probe", json={"provider": "g"}, headers=ADMIN)
        error = assert_error(r, 400, "unsupported_value")
        assert error["param"] == "provider" and "gemini" in error["message"]
