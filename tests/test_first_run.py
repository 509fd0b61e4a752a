"""What a new user sees of `svir serve` (issue 19, "a first run that explains itself"): the
start-up banner and the stop line (once, also with workers), a bad or busy port explained, an
empty config warned, a refused open host said before anything else, upstream failures that name
their provider and base URL, and model ids that are file paths. Real `svir serve` processes over
the scripted upstream, on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.svir_proc import SvirProcess, free_port
from tests.support.upstream import LLAMA_CPP_MODELS, ScriptedServer, ScriptedUpstream

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[1]
LLAMA_PATH = LLAMA_CPP_MODELS["data"][0]["id"]  # /models/muse-glimmer-30b-q4_k_m.gguf
UNSET_KEY = "SVIR_TEST_FIRST_RUN_UNSET_KEY"


def serve(
    tmp: Path, *args: str, config: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`svir serve ARGS` that is expected to stop by itself (a refusal)."""
    argv = [sys.executable, "-m", "svir", "serve", *args]
    if config is not None:
        path = tmp / "svir.toml"
        path.write_text(config)
        argv += ["--config", str(path)]
    env = {k: v for k, v in __import__("os").environ.items() if k != "SVIR_CONFIG"}
    env["XDG_DATA_HOME"] = str(tmp / "data")
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False
    )


def json_lines(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def stop(svir: SvirProcess) -> str:
    """Stop svir as Ctrl-C does and return its whole log."""
    assert svir.proc is not None
    svir.proc.send_signal(signal.SIGINT)
    svir.proc.wait(60)
    svir.stop()
    return svir.log()


@pytest.fixture(scope="module")
def llama() -> Iterator[ScriptedServer]:
    """A scripted llama.cpp server: it lists its model by its GGUF path, as llama-server does."""
    with ScriptedServer(ScriptedUpstream(models="llama.cpp", fallback="ok")) as server:
        yield server


def config_for(llama: ScriptedServer, dead_port: int) -> str:
    return f"""
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{llama.base_url}"

[[providers]]
name = "keyed"
kind = "openai-compatible"
base_url = "{llama.base_url}"
api_key_env = "{UNSET_KEY}"
models = ["m"]
discover = false

[[providers]]
name = "dead"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{dead_port}/v1"
models = ["m"]
[providers.retry]
attempts = 1
"""


@pytest.fixture(scope="module")
def svir(llama: ScriptedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp("first-run")
    proc = SvirProcess(config_for(llama, free_port()), tmp, env={UNSET_KEY: ""})
    with proc:
        yield proc


def banner_of(log: str) -> dict[str, Any]:
    [line] = [d for d in json_lines(log) if "version" in d]
    return line


def test_the_banner_says_where_what_and_how(svir: SvirProcess) -> None:
    line = banner_of(svir.log())
    assert line["url"] == svir.url
    assert line["urls"]["openai"] == svir.base_url
    assert line["config"] == str(svir.config_path)
    assert line["providers"] == [
        "lab (llamacpp, 0 models configured, more from its server's /models)",
        "keyed (openai-compatible, 1 model)",
        "dead (openai-compatible, 1 model configured, more from its server's /models)",
    ]
    # The store follows the config file: its own file under the data dir, not the shared one.
    assert line["store"].startswith(str(svir.env["XDG_DATA_HOME"]) + "/svir/configs/svir-")
    assert line["keys"].startswith("off: no keys issued")
    # The ISO-8601 time of the JSON lines.
    assert line["ts"][:2] == "20" and line["ts"][10] == "T" and line["ts"].endswith("Z")


def test_a_dead_upstream_is_named_with_its_url(svir: SvirProcess) -> None:
    r = httpx.post(svir.base_url + "/chat/completions", timeout=30,
                   json={"model": "dead/m", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "provider 'dead' at http://127.0.0.1:" in message
    assert "cannot connect" in message


def test_a_refused_key_says_the_variable_is_unset_and_quotes_the_server(
    svir: SvirProcess,
) -> None:
    r = httpx.post(svir.base_url + "/chat/completions", timeout=30,
                   json={"model": "keyed/status-401-auth-401",
                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_auth_error"
    message = error["message"]
    assert "Incorrect API key provided: [redacted]." in message  # the server's own words
    assert "sk-" not in message  # ... without the (masked) key it quoted
    assert f"its api_key_env is {UNSET_KEY}, which is not set" in message
    assert "provider 'keyed' at http://127.0.0.1:" in message


def test_model_ids_that_are_paths_get_their_stem_and_the_path_still_routes(
    svir: SvirProcess, llama: ScriptedServer
) -> None:
    models = httpx.get(svir.base_url + "/models", timeout=30).json()["data"]
    ids = [m["id"] for m in models]
    assert "lab/muse-glimmer-30b-q4_k_m" in ids
    assert f"lab/{LLAMA_PATH}" not in ids
    for asked in ("lab/muse-glimmer-30b-q4_k_m", f"lab/{LLAMA_PATH}"):
        r = httpx.post(svir.base_url + "/chat/completions", timeout=30,
                       json={"model": asked, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert r.status_code == 200, r.text
        # The server gets the id it listed.
        assert llama.last.body["model"] == LLAMA_PATH


def test_models_logs_a_provider_it_could_not_reach(svir: SvirProcess) -> None:
    ids = [m["id"] for m in httpx.get(svir.base_url + "/models", timeout=30).json()["data"]]
    assert "dead/m" in ids  # its configured model stays listed
    lines = [d for d in json_lines(svir.log()) if "could not list" in d["msg"]]
    assert {d["provider"] for d in lines} == {"dead"}
    line = lines[0]
    assert line["level"] == "warning"
    assert "could not list its models at http://127.0.0.1:" in line["msg"]
    assert line["url"].endswith("/v1/models")


def test_the_stop_line(llama: ScriptedServer, tmp_path: Path) -> None:
    proc = SvirProcess(config_for(llama, free_port()), tmp_path, args=["--log-format", "text"])
    proc.start(timeout=60)
    log = stop(proc)
    # The text banner, for a person at a terminal.
    assert f"listening on {proc.url}\n" in log
    assert f"  config       {proc.config_path}\n" in log
    assert "  providers    3: lab (llamacpp" in log
    assert "  keys         off: no keys issued" in log
    assert f"svir stopped listening on {proc.url}" in log.splitlines()[-1]


def test_with_workers_the_banner_and_stop_line_come_once(
    llama: ScriptedServer, tmp_path: Path
) -> None:
    proc = SvirProcess(config_for(llama, free_port()), tmp_path, args=["--workers", "2"])
    proc.start(timeout=120)
    log = stop(proc)
    lines = json_lines(log)
    assert [d["workers"] for d in lines if "version" in d] == [2]
    assert len([d for d in lines if d["msg"].startswith("svir stopped")]) == 1
    # Both workers started (each opens the store), and the parent said it once.
    assert len([d for d in lines if d["msg"] == "thread store open"]) == 2


def test_a_port_out_of_range_is_refused(tmp_path: Path) -> None:
    done = serve(tmp_path, "--port", "99999", config="")
    assert done.returncode == 2
    assert "99999 is not a port: a port is between 0" in done.stderr


def test_a_port_in_use_is_named_with_how_to_pick_another(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = serve(tmp_path, "--port", str(port), "--log-format", "text",
                     config='[[providers]]\nname = "x"\nkind = "llamacpp"\nbase_url = "http://127.0.0.1:9"\n')  # fmt: skip
    assert done.returncode == 1
    assert f"port {port} is already in use on 127.0.0.1" in done.stderr
    assert "the default, 11434, is also Ollama's port" in done.stderr
    assert "`svir serve --port 11435`" in done.stderr
    assert 'make serve ARGS="--port 11435"' in done.stderr
    assert "listening on" not in done.stderr


def test_an_empty_config_warns(tmp_path: Path) -> None:
    with socket.socket() as busy:  # stops it right after the warning
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = serve(tmp_path, "--port", str(busy.getsockname()[1]), config="# nothing yet\n")
    assert done.returncode == 1
    assert "names no providers: every model request will be answered 404" in done.stderr


def test_an_open_host_refused_says_nothing_of_what_it_would_serve(tmp_path: Path) -> None:
    done = serve(tmp_path, "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0" in done.stderr
    assert "serving" not in done.stderr
    assert "listening on" not in done.stderr


# `svir serve` sent a SIGTERM as it starts (as a service manager that stops svir while it
# starts): once its app is built (one process), or as its workers' supervisor is about to be made
# (`--workers`; once made, the supervisor takes the signal). It must stop svir, not be lost
# before uvicorn takes it.
TERMINATED_WHILE_STARTING = """
import signal, sys
from svir import cli
from svir import server

built, supervisor_class = server.build_app, server._supervisor_class

def build_then_terminated(*args, **kwargs):
    app = built(*args, **kwargs)
    signal.raise_signal(signal.SIGTERM)
    return app

def terminated_then_supervisor():
    signal.raise_signal(signal.SIGTERM)
    return supervisor_class()

server.build_app, server._supervisor_class = build_then_terminated, terminated_then_supervisor
sys.exit(cli.main(["serve", *sys.argv[1:]]))
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sigterm_while_svir_starts_stops_it_without_serving(tmp_path: Path, workers: str) -> None:
    config = tmp_path / "svir.toml"
    config.write_text("")
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED_WHILE_STARTING, "--port", "0", "--config", str(config),
         "--log-format", "json", "--workers", workers],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
    )  # fmt: skip
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    lines = json_lines(done.stdout + done.stderr)
    messages = [line["msg"] for line in lines]
    assert messages[-1].startswith("svir stopped listening on"), messages
    # It never served: the app's start-up (which opens the stores) did not run.
    assert "thread store open" not in messages
    assert not any(line["level"] == "error" for line in lines), messages
