"""Fixtures for the command-line tests: real svir processes over the replay server and over the
real llama.cpp server, and a way to run `svir` itself as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from svir.edges.llama_server import LlamaServer
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream

ROOT = Path(__file__).resolve().parents[2]


def svir_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SVIR_BASE_URL", "SVIR_API_KEY")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def run_svir(
    *args: str, input: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`svir ARGS` as a child process, stdin and stdout pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "svir", *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or svir_env(),
        cwd=ROOT,
        check=False,
    )


def store_config(tmp: Path) -> str:
    return f'[store]\nurl = "sqlite:///{tmp / "threads.db"}"\n'


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    """The replay server, listing vLLM's models (one chat model, one embedding model); any corpus
    stream is played for the model of its name. A small delay between events gives an honest
    tokens/s window (§3.6)."""
    with ScriptedServer(ScriptedUpstream(models="vllm", delay=0.02)) as server:
        yield server


@pytest.fixture(scope="module")
def svir_replay(
    replay: ScriptedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp("svir-cli-replay")
    config = (
        store_config(tmp)
        + f"""
[[providers]]
name = "rp"
kind = "openai-compatible"
base_url = "{replay.base_url}"
"""
    )
    with SvirProcess(config, tmp) as proc:
        yield proc


@pytest.fixture(scope="module")
def svir_llama(
    llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp("svir-cli-llama")
    config = (
        store_config(tmp)
        + f"""
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{llama_server.base_url}"
"""
    )
    with SvirProcess(config, tmp) as proc:
        yield proc
