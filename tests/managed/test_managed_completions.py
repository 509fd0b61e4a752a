"""Text completion and fill-in-the-middle on the real managed llama-server with Gemma 3 270M,
through a real `svir serve`, driven by the OpenAI SDK and the `ollama` client.

Gemma 3 has no fill-in-the-middle tokens: llama-server's `/infill` answers 501 "Infill is not
supported by this model: prefix token is missing. suffix token is missing. middle token is
missing." svir's honest answer to a suffix is then a 400 that names the model and says so, not
a plain continuation of the prefix. A prompt without a suffix completes (Gemma 3 270M is a base
model that never stops by itself: every request is bounded).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.managed.conftest import _require, children_servers
from tests.managed.test_managed_svir import config
from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

TIMEOUT = httpx.Timeout(120.0, connect=5.0)
MODEL = "local/gemma-3-270m"


@pytest.fixture(scope="module")
def svir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp("managed-completions")
    link = tmp / "gemma-completions.gguf"
    link.symlink_to(_require()[1])
    env = {"XDG_DATA_HOME": str(tmp / "data")}
    with SvirProcess(config(f'gemma-3-270m = "{link}"'), tmp, env=env) as proc:
        yield proc


@pytest.fixture
def sdk(svir: SvirProcess) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=svir.base_url, max_retries=0, timeout=120)


@pytest.fixture
def client(svir: SvirProcess) -> ollama.Client:
    return ollama.Client(host=svir.url, timeout=120)


def test_a_prompt_completes(sdk: openai.OpenAI) -> None:
    done = sdk.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert done.object == "text_completion" and done.model == MODEL
    assert done.choices[0].text.strip()
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 4
    assert done.usage.prompt_tokens > 0
    # The same prompt streamed gives the same text at temperature 0.
    stream = sdk.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_a_suffix_is_a_400_saying_gemma_has_no_fim_tokens(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(
            model=MODEL, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))", max_tokens=8
        )
    err = caught.value.body
    assert isinstance(err, dict)
    assert err["param"] == "suffix" and err["code"] == "unsupported_input"
    assert f"{MODEL!r} cannot fill in the middle" in err["message"]
    assert "Infill is not supported by this model" in err["message"]


def test_ollama_generate_raw_and_with_suffix(client: ollama.Client) -> None:
    answer = client.generate(
        model=MODEL, prompt="1, 2, 3,", raw=True, options={"num_predict": 4, "temperature": 0}
    )
    assert answer.response and answer.done_reason == "length" and answer.eval_count == 4
    templated = client.generate(model=MODEL, prompt="hi", options={"num_predict": 4})
    assert templated.done and templated.eval_count == 4
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model=MODEL, prompt="a = ", suffix="\n", options={"num_predict": 4})
    assert caught.value.status_code == 400
    assert "cannot fill in the middle" in caught.value.error


def test_zed_edit_prediction_form_completes(svir: SvirProcess) -> None:
    # Zed's Ollama edit prediction (crates/edit_prediction/src/ollama.rs): the model's own FIM
    # tokens written into a raw prompt, not streamed. Gemma reads them as text, and completes.
    body = {
        "model": MODEL,
        "prompt": "<fim_prefix>def add(a, b):\n    <fim_suffix>\n<fim_middle>",
        "raw": True,
        "stream": False,
        "options": {"num_predict": 8, "temperature": 0.2, "stop": ["<fim_prefix>", "<MID>"]},
    }
    r = httpx.post(svir.url + "/api/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert isinstance(r.json()["response"], str) and r.json()["done"] is True


def test_keep_alive_zero_unloads_and_an_empty_prompt_loads(
    svir: SvirProcess, client: ollama.Client
) -> None:
    assert svir.proc is not None
    client.generate(model=MODEL, prompt="x", raw=True, options={"num_predict": 1})
    assert len(children_servers(svir.proc.pid)) == 1
    unloaded = client.generate(model=MODEL, keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert children_servers(svir.proc.pid) == []
    loaded = client.generate(model=MODEL)
    assert loaded.done_reason == "load"
    [server] = children_servers(svir.proc.pid)
    assert Path(server.cmdline()[server.cmdline().index("--model") + 1]).name.startswith("gemma")
