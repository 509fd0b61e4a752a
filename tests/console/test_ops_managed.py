"""Load, see, read the log of, probe and unload a managed model from the console's endpoints,
against the real `llama-server` serving Gemma 3 270M (one test: a start takes seconds)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from svir.edges.managed.supervisor import Supervisor
from tests.console.support import ADMIN, ADMIN_KEY, app, assert_error
from tests.managed.conftest import servers_with

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external


def _gone(pid: int, timeout: float = 30.0) -> bool:
    """Whether process `pid` has ended (or is a zombie), waiting up to `timeout` seconds."""
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


async def test_load_log_unload_a_managed_model(
    tmp_path: Path, gguf: Path, llama_binary: str
) -> None:
    config = f"""
[[providers]]
name = "local"
kind = "llamacpp-managed"
[providers.managed]
chat_template = "builtin:gemma3-tools"
ctx = 512
threads = 1
idle_unload = 0
[providers.managed.models]
"gemma" = "{gguf}"
"""
    # llama_binary: the fixture fails the test when llama-server is missing (svir finds it too).
    async with app(tmp_path, config=config, environ={"SVIR_ADMIN_KEY": ADMIN_KEY}) as svir:
        r = await svir.http.get("/admin/models", headers=ADMIN)
        [entry] = r.json()["data"]
        assert entry["id"] == "local/gemma" and entry["source"] == "configured"
        assert entry["managed"]["state"] == "stopped" and entry["managed"]["pid"] is None
        assert entry["context_length"] == 512
        # Before any start there is no log to read.
        r = await svir.http.get("/admin/models/log?model=local/gemma", headers=ADMIN)
        assert r.json() == {"model": "local/gemma", "lines": []}

        r = await svir.http.post("/admin/models/load", json={"model": "local/gemma"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        loaded = r.json()["managed"]
        [proc] = servers_with(gguf)
        assert loaded["state"] == "ready" and loaded["pid"] == proc.pid
        assert loaded["in_flight"] == 0 and loaded["last_used"] > 0 and loaded["loads"] == 1
        assert isinstance(loaded["port"], int) and loaded["port"] > 0
        # Its memory, as the kernel counts it (the model file is mapped: megabytes at least).
        assert loaded["rss_bytes"] > 1_000_000
        assert abs(loaded["rss_bytes"] - proc.memory_info().rss) < loaded["rss_bytes"] // 2

        r = await svir.http.get("/admin/models/log?model=local/gemma&lines=5", headers=ADMIN)
        assert r.status_code == 200, r.text
        log = r.json()
        assert log["model"] == "local/gemma" and 0 < len(log["lines"]) <= 5
        assert loaded["log_file"] not in r.text and str(tmp_path) not in r.text
        whole = (await svir.http.get("/admin/models/log?model=local/gemma", headers=ADMIN)).json()
        assert whole["lines"][-len(log["lines"]) :] == log["lines"]
        assert any("llama" in line or "server" in line for line in whole["lines"])

        # The probe of a managed provider runs on the model's own server, and gives it back.
        r = await svir.http.post(
            "/admin/probe", json={"provider": "local", "only": ["json"]}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        probed = r.json()
        assert probed["model"] == "gemma" and probed["rows"][0]["id"] == "usage"
        assert [row["id"] for row in probed["rows"][1:]] == [
            "response_format.json_object",
            "response_format.json_schema",
        ]
        assert probed["text"].startswith(f"svir probe · http://127.0.0.1:{loaded['port']}/v1")
        r = await svir.http.get("/admin/models", headers=ADMIN)
        assert r.json()["data"][0]["managed"]["in_flight"] == 0
        assert servers_with(gguf) == [proc]

        # Held by a request in flight, it is not stopped under it.
        sup = svir.app.catalog.runtimes["local"]
        assert isinstance(sup, Supervisor)
        await sup.ensure("gemma")
        r = await svir.http.post(
            "/admin/models/unload", json={"model": "local/gemma"}, headers=ADMIN
        )
        assert_error(r, 409, "model_busy")
        assert servers_with(gguf) == [proc]
        sup.release("gemma")

        r = await svir.http.post(
            "/admin/models/unload", json={"model": "local/gemma"}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        assert r.json()["managed"]["state"] == "stopped" and r.json()["managed"]["pid"] is None
        assert _gone(proc.pid)
        # Again: already stopped, said so.
        r = await svir.http.post(
            "/admin/models/unload", json={"model": "local/gemma"}, headers=ADMIN
        )
        assert r.status_code == 200 and r.json()["managed"]["state"] == "stopped"
        started = time.time()
        r = await svir.http.get("/admin/models", headers=ADMIN)
        assert r.json()["data"][0]["managed"]["last_used"] <= started
    assert servers_with(gguf) == []
