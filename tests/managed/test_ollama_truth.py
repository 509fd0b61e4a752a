"""What svir's Ollama API says of the model it runs itself is what the real llama-server running
Gemma 3 270M says (its own `/props` is the judge), read with the official `ollama` client: the
context it runs with, before and after a request's `options.num_ctx` restarts it with a bigger
one, its size and parameters, and what it cannot do."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import httpx
import ollama
import pytest

from tests.managed.test_managed_svir import config, managed_state, start_svir
from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

__all__ = ["start_svir"]  # the fixture, used here

MODEL = "local/gemma-3-270m"
HI = [{"role": "user", "content": "hi"}]
SHORT = {"num_predict": 4, "temperature": 0}


def server_props(svir: SvirProcess) -> dict[str, object]:
    """The running llama-server's own `/props`, asked directly."""
    port = managed_state(svir)["models"]["gemma-3-270m"]["port"]
    assert port is not None
    props: dict[str, object] = httpx.get(f"http://127.0.0.1:{port}/props", timeout=10).json()
    return props


def slot_ctx(svir: SvirProcess) -> object:
    settings = server_props(svir)["default_generation_settings"]
    assert isinstance(settings, dict)
    return settings["n_ctx"]


def test_show_ps_and_num_ctx_are_the_servers_truth(
    start_svir: Callable[[str | None], SvirProcess], gguf: Path
) -> None:
    svir = start_svir(config(f'gemma-3-270m = "{gguf}"', "parallel = 1"))
    client = ollama.Client(host=svir.url, timeout=120)
    # Not loaded yet: from the config, the context it will start with (4096 by default).
    shown = client.show(MODEL)
    assert shown.modelinfo is not None
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 4096
    assert shown.parameters == "num_ctx 4096"
    assert client.ps().models == []

    client.chat(model=MODEL, messages=HI, options=SHORT)
    assert slot_ctx(svir) == 4096
    shown = client.show(MODEL)
    assert shown.modelinfo is not None
    arch = shown.modelinfo["general.architecture"]
    assert arch == "gemma3"
    assert shown.modelinfo[f"{arch}.context_length"] == 4096
    meta = httpx.get(svir.url + "/v1/models", timeout=10).json()["data"]
    assert [m["context_length"] for m in meta if m["id"] == MODEL] == [4096]
    # From the running server's model list and /props.
    assert shown.modelinfo["general.parameter_count"] == 268098176
    assert shown.modelinfo["general.svir.n_ctx_train"] == 32768
    assert shown.details is not None and shown.details.quantization_level == "Q4_K_M"
    assert shown.details.parameter_size == "268.10M" and shown.details.format == "gguf"
    # The builtin template takes tools; the model has no image projector and no FIM tokens.
    assert shown.capabilities == ["completion", "tools"]
    assert shown.template is not None and ".Suffix" not in shown.template

    (running,) = client.ps().models
    assert running.model == MODEL and running.size == gguf.resolve().stat().st_size
    assert running.size_vram == 0 and running.expires_at is not None
    assert running.expires_at > datetime.datetime.now(datetime.UTC)
    raw = httpx.get(svir.url + "/api/ps", timeout=10).json()["models"][0]
    assert raw["context_length"] == 4096

    # A bigger num_ctx restarts the server with it, as the server itself then says.
    answer = client.chat(model=MODEL, messages=HI, options={**SHORT, "num_ctx": 8192})
    assert answer.done
    assert slot_ctx(svir) == 8192
    raw = httpx.get(svir.url + "/api/ps", timeout=10).json()["models"][0]
    assert raw["context_length"] == 8192
    shown = client.show(MODEL)
    assert shown.modelinfo is not None and shown.modelinfo["gemma3.context_length"] == 8192
    assert managed_state(svir)["models"]["gemma-3-270m"]["loads"] == 2
    # A smaller one is served by the bigger context it runs with: no restart, no truncation.
    client.chat(model=MODEL, messages=HI, options={**SHORT, "num_ctx": 2048})
    assert managed_state(svir)["models"]["gemma-3-270m"]["loads"] == 2
    # Past what the model was trained for: a clear 400, and the server is left as it is.
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL, messages=HI, options={**SHORT, "num_ctx": 65536})
    assert info.value.status_code == 400 and "32768" in info.value.error
    assert slot_ctx(svir) == 8192
