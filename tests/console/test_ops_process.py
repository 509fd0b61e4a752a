"""The console's session and config as `svir serve` answers them: the config file it serves and
how many workers it runs (one, and two: each worker knows the count)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

CONFIG = """
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "{base_url}"
discover = false
models = ["tok-3"]
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_session_and_config_of_a_served_svir(tmp_path: Path, workers: int) -> None:
    with ScriptedServer(ScriptedUpstream()) as upstream:
        text = CONFIG.format(base_url=upstream.base_url)
        with SvirProcess(text, tmp_path, args=["--workers", str(workers)]) as svir:
            # No admin key, no keys: this machine may look.
            for _ in range(4):
                with httpx.Client() as http:  # a new connection: any worker may take it
                    r = http.get(svir.url + "/admin/console/session", timeout=10)
                assert r.status_code == 200, r.text
                session = r.json()
                assert session["workers"] == workers and session["auth"] == "loopback"
                # With workers, the parent only supervises: a worker answers.
                assert svir.proc is not None
                assert (session["pid"] == svir.proc.pid) == (workers == 1)
            r = httpx.get(svir.url + "/admin/config", timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["source"] == str(svir.config_path)
            assert r.json()["config"]["providers"][0]["base_url"] == upstream.base_url


def test_an_open_live_feed_ends_when_svir_stops(tmp_path: Path) -> None:
    """A page's live feed lasts as long as the page: when svir stops, the feed is ended by svir
    (its last chunk sent) before the server waits for open responses, not cut by the server's
    graceful timeout."""
    with ScriptedServer(ScriptedUpstream()) as upstream:
        svir = SvirProcess(CONFIG.format(base_url=upstream.base_url), tmp_path).start()
        try:
            with (
                httpx.Client(timeout=60) as http,
                http.stream("GET", svir.url + "/admin/events") as feed,
            ):
                assert feed.status_code == 200
                chunks = feed.iter_bytes()
                received = next(chunks)
                assert received.startswith(b": connected")
                assert svir.proc is not None
                svir.proc.send_signal(signal.SIGTERM)
                # Read to the end: an incomplete chunked body (a cut connection) raises here.
                for chunk in chunks:
                    received += chunk
            assert svir.proc.wait(60) is not None
        finally:
            svir.stop()
        assert "timeout graceful shutdown exceeded" not in svir.log()
