"""`svir models` as a child process, against svir over the replay server, against svir over the
real llama.cpp server, and against llama.cpp directly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pexpect
import pytest

from svir.edges.llama_server import LlamaServer
from tests.cli.conftest import ROOT, run_svir, svir_env
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external


def test_chat_models_only_unless_all(replay: ScriptedServer) -> None:
    # vLLM lists a chat model and an embedding model (§6).
    shown = run_svir("models", "--base-url", replay.root_url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["qwen3.8"]
    assert "1 model(s) that are not chat models hidden" in shown.stderr

    every = run_svir("models", "--base-url", replay.base_url + "/", "--all")
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == ["qwen3.8", "bge-m3-embed"]
    assert every.stderr == ""


def test_through_svir(svir_replay: SvirProcess) -> None:
    # svir lists its providers' chat models under the provider's name.
    out = run_svir("models", "--base-url", svir_replay.url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["rp/qwen3.8"]


def test_json(replay: ScriptedServer, svir_replay: SvirProcess) -> None:
    out = run_svir("models", "--base-url", replay.base_url, "--all", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["id"], r["chat"], r["owned_by"], r["context_length"]) for r in rows] == [
        ("qwen3.8", True, "vllm", 262144),
        ("bge-m3-embed", False, "vllm", 8192),
    ]
    out = run_svir("models", "--base-url", svir_replay.url, "--json")
    assert [(r["id"], r["owned_by"]) for r in json.loads(out.stdout)] == [("rp/qwen3.8", "rp")]


def test_base_url_from_environment(svir_replay: SvirProcess) -> None:
    out = run_svir("models", env=svir_env(SVIR_BASE_URL=svir_replay.url))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["rp/qwen3.8"]


def test_table_on_a_terminal(replay: ScriptedServer) -> None:
    child = pexpect.spawn(
        sys.executable, ["-m", "svir", "models", "--base-url", replay.base_url, "--all"],
        cwd=str(ROOT), env=svir_env(TERM="xterm", COLUMNS="120"), encoding="utf-8",
        dimensions=(30, 120), timeout=30,
    )  # fmt: skip
    child.expect(pexpect.EOF)
    screen = child.before
    assert "MODEL" in screen and "CONTEXT" in screen
    assert "qwen3.8" in screen and "bge-m3-embed" in screen
    assert "262,144" in screen  # vLLM's max_model_len
    assert "other" in screen  # the KIND column of --all
    child.close()
    assert child.exitstatus == 0


def test_llama_cpp_directly_and_through_svir(
    llama_server: LlamaServer, svir_llama: SvirProcess
) -> None:
    direct = run_svir("models", "--base-url", llama_server.base_url, "--json")
    assert direct.returncode == 0, direct.stderr
    [model] = json.loads(direct.stdout)
    # llama.cpp lists its one model under its path, with the context it runs (§6).
    assert model["id"].endswith(".gguf")
    assert model["context_length"] == 4096
    assert model["owned_by"] == "llamacpp"
    assert model["input_modalities"] == ["text"]

    through = run_svir("models", "--base-url", svir_llama.url)
    assert through.returncode == 0, through.stderr
    # svir lists it by the file's stem (issue 19); the path still routes (tests/test_first_run.py).
    assert through.stdout.splitlines() == [f"lab/{Path(model['id']).stem}"]


def test_server_down() -> None:
    out = run_svir("models", "--base-url", "http://127.0.0.1:9")
    assert out.returncode == 1
    assert "cannot connect" in out.stderr


def test_bad_base_url() -> None:
    out = run_svir("models", "--base-url", "http://user:pw@127.0.0.1:9")
    assert out.returncode == 2
    assert "credentials" in out.stderr and "pw" not in out.stderr
