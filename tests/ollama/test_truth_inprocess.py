"""What svir's Ollama API and `/v1/models` say of a model is what its server says, driven by the
official `ollama` client and the OpenAI SDK through the whole app in process: a scripted llama.cpp
server (its recorded `/props` and model list) and a scripted vLLM. Also: that metadata is fetched
once per cache period, a prompt over the known context is refused before it is sent, and
`options.num_ctx` asks a server svir runs for a bigger context."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from svir.policy.catalog import Loaded
from tests.support.inprocess import InProcess, serve
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import ScriptedUpstream

LLAMA = "lab/muse-glimmer-30b-q4_k_m"  # listed by its file name (the router cleans a path)
# A model the scripted server answers (three tokens); a llama.cpp server serves whatever it
# loaded under any name, and says so in /props.
TOK = "lab/tok-3"
CONFIG = """
[server]
models_cache_ttl = 60

[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://llama.test/v1"

[[providers]]
name = "vl"
kind = "vllm"
base_url = "http://vllm.test/v1"

[[providers]]
name = "pics"
kind = "vllm"
base_url = "http://vllm.test/v1"
images = false
"""


class Upstreams:
    """The scripted llama.cpp server and vLLM, by host."""

    def __init__(self) -> None:
        self.llama = ScriptedUpstream(models="llamacpp")
        self.vllm = ScriptedUpstream(models="vllm")
        self.seen: list[str] = []

    def __call__(self, request: MockRequest) -> Any:
        self.seen.append(f"{request.method} {request.url}")
        return (self.llama if "llama.test" in request.url else self.vllm)(request)


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with serve(tmp_path, CONFIG, Upstreams()) as app:
        yield app


def client(svir: InProcess) -> ollama.AsyncClient:
    """The official client over the in-process app."""
    return ollama.AsyncClient(host="http://svir", transport=httpx.ASGITransport(app=svir.app))


def upstreams(svir: InProcess) -> Upstreams:
    handler = svir.transport.handler
    assert isinstance(handler, Upstreams)
    return handler


async def test_root_answers_ollama_and_anthropic_probes(svir: InProcess) -> None:
    r = await svir.http.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert r.headers["content-type"].startswith("text/plain")
    head = await svir.http.head("/")
    assert head.status_code == 200 and head.content == b""


async def test_show_tags_and_version_are_the_servers_truth(svir: InProcess) -> None:
    c = client(svir)
    version = (await c._request_raw("GET", "/api/version")).json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)
    listed = {m.model: m for m in (await c.list()).models}
    assert set(listed) == {LLAMA, "vl/qwen3.8", "pics/qwen3.8"}  # not the embedding model
    llama = listed[LLAMA]
    assert llama.size == 18556686336  # meta.size
    assert llama.details is not None
    assert llama.details.parameter_size == "30.5B" and llama.details.quantization_level == "Q4_K_M"
    assert llama.details.format == "gguf" and llama.details.family == "muse"

    shown = await c.show(LLAMA)
    assert shown.modelinfo is not None
    arch = shown.modelinfo["general.architecture"]
    assert shown.modelinfo[f"{arch}.context_length"] == 16384  # /props' n_ctx, not n_ctx_train
    assert shown.modelinfo["general.parameter_count"] == 30532122624
    assert shown.parameters == "num_ctx 16384"
    # /props says tools, images and a template that thinks.
    assert shown.capabilities == ["completion", "tools", "vision", "thinking"]
    assert shown.template is not None and "tools" in shown.template.lower()
    assert ".Suffix" not in shown.template  # no fill-in-the-middle is known

    vllm = await c.show("vl/qwen3.8:latest")
    assert vllm.modelinfo is not None and vllm.modelinfo["qwen3.context_length"] == 262144
    assert vllm.capabilities == ["completion", "tools", "thinking"]
    assert vllm.details is not None and vllm.details.format == ""
    # A provider configured without images has no vision, whatever the name says.
    shown = await c.show("pics/qwen3.8")
    assert shown.capabilities is not None and "vision" not in shown.capabilities


async def test_v1_models_carries_what_svir_knows(svir: InProcess) -> None:
    page = await svir.client.models.list()
    by_id = {m.id: m.model_extra or {} for m in page.data}
    assert by_id[LLAMA]["context_length"] == 16384
    assert by_id[LLAMA]["capabilities"] == ["completion", "tools", "vision", "thinking"]
    assert by_id["vl/qwen3.8"]["context_length"] == 262144


async def test_metadata_is_fetched_once_per_cache_period(svir: InProcess) -> None:
    c = client(svir)
    seen = upstreams(svir).seen
    for _ in range(3):
        await c.show(LLAMA)
    await c.list()
    assert seen.count("GET http://llama.test/props") == 1
    svir.now += 61
    await c.show(LLAMA)
    assert seen.count("GET http://llama.test/props") == 2


async def test_a_server_without_props_is_shown_from_config(tmp_path: Path) -> None:
    def handler(request: MockRequest) -> MockResponse:
        return MockResponse.json({"error": "no"}, status=404)

    config = CONFIG.replace('[[providers]]\nname = "vl"', '[[providers]]\nname = "vl0"')
    config += '\n[[providers]]\nname = "gone"\nkind = "llamacpp"\nbase_url = "http://gone.test/v1"\nmodels = ["m"]\n'
    async with serve(tmp_path, config, handler) as svir:
        shown = await client(svir).show("gone/m")
        assert shown.capabilities == ["completion", "tools"]
        assert shown.modelinfo is not None
        assert not [k for k in shown.modelinfo if "context_length" in k]


async def test_a_prompt_over_the_context_is_refused_before_it_is_sent(svir: InProcess) -> None:
    c = client(svir)
    long = "word " * 70_000  # about 87 500 tokens by svir's estimate, over 16384
    with pytest.raises(ollama.ResponseError) as info:
        await c.chat(model=LLAMA, messages=[{"role": "user", "content": long}])
    assert info.value.status_code == 400
    assert "16384" in info.value.error and "tokens" in info.value.error
    assert not [s for s in upstreams(svir).seen if s.endswith("/chat/completions")]
    # The same request fits vLLM's 262144.
    answer = await c.chat(model="vl/tok-3", messages=[{"role": "user", "content": "hi"}])
    assert answer.done


class FakeRuntime:
    """A provider svir runs itself, as the catalog sees one (svir.edges.managed's Supervisor)."""

    def __init__(self) -> None:
        self.ctx = 4096
        self.asked: list[int] = []

    def context_of(self, model_id: str) -> int | None:
        return self.ctx

    running = True

    def server_url(self, model_id: str) -> str | None:
        return "http://llama.test" if self.running else None

    def loaded(self) -> list[Loaded]:
        return [Loaded("tok-3", self.ctx, None, 77)]

    async def require_context(self, model_id: str, context: int) -> None:
        self.asked.append(context)
        self.ctx = max(self.ctx, context)


async def test_num_ctx_raises_a_managed_models_context(svir: InProcess) -> None:
    runtime = FakeRuntime()
    svir.app.catalog.set_runtime("lab", runtime)
    c = client(svir)
    shown = await c.show(TOK)
    assert shown.modelinfo is not None
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 4096
    hi = [{"role": "user", "content": "hi"}]
    await c.chat(model=TOK, messages=hi, options={"num_ctx": 2048})
    assert runtime.asked == []  # it runs with more already
    await c.chat(model=TOK, messages=hi, options={"num_ctx": 8192})
    assert runtime.asked == [8192]
    running = (await c.ps()).models
    assert [(m.model, m.size, m.size_vram) for m in running] == [(TOK, 77, 0)]
    raw = (await svir.http.get("/api/ps")).json()["models"][0]
    assert raw["context_length"] == 8192 and raw["expires_at"].startswith("2318")
    # Past the context it was trained for (meta.n_ctx_train 262144): a clear 400, nothing sent.
    with pytest.raises(ollama.ResponseError) as info:
        await c.chat(model=TOK, messages=hi, options={"num_ctx": 300_000})
    assert info.value.status_code == 400 and "262144" in info.value.error
    assert runtime.asked == [8192]
    with pytest.raises(ollama.ResponseError) as info:
        await c.chat(model=TOK, messages=hi, options={"num_ctx": "big"})
    assert info.value.status_code == 400 and "num_ctx" in info.value.error
    # Stopped, it is shown as its server last said (the same file), at the context it starts with.
    runtime.running = False
    shown = await c.show(TOK)
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.parameter_count"] == 30532122624
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 8192


async def test_model_files(svir: InProcess) -> None:
    c = client(svir)
    statuses = [p.status async for p in await c.pull("vl/qwen3.8", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert (await c.pull("vl/qwen3.8")).status == "success"
    with pytest.raises(ollama.ResponseError) as info:
        await c.pull("nowhere/model")
    assert info.value.status_code == 404 and "does not manage model files" in info.value.error
    for call in (
        c.delete("vl/qwen3.8"),
        c.copy("vl/qwen3.8", "mine"),
        c.create("mine", from_="vl/qwen3.8"),
        c.push("vl/qwen3.8"),
    ):
        with pytest.raises(ollama.ResponseError) as info:
            await call
        assert info.value.status_code == 400
        assert "svir does not manage model files" in info.value.error


async def test_insert_is_said_only_where_the_servers_infill_works(tmp_path: Path) -> None:
    """svir's fill-in-the-middle setting says a llama.cpp route may take a suffix; the server's
    `/infill` says whether its model can (llama.cpp refuses a model without FIM tokens)."""
    takes = {"llama.test": True}

    def handler(request: MockRequest) -> Any:
        if request.path == "/infill":
            host = request.url.split("/")[2]
            if takes.get(host):
                return MockResponse.json({"content": ""})
            return MockResponse.json({"error": {"code": 501, "message": "no FIM"}}, status=501)
        return Upstreams()(request)

    config = (
        CONFIG
        + '\n[[providers]]\nname = "nofim"\nkind = "llamacpp"\nbase_url = "http://nofim.test/v1"\n'
    )
    async with serve(tmp_path, config, handler) as svir:
        svir.app.catalog.insert = lambda route: route.kind.name == "llamacpp"
        c = client(svir)
        shown = await c.show(TOK)
        assert shown.capabilities is not None and "insert" in shown.capabilities
        assert shown.template is not None and ".Suffix" in shown.template
        shown = await c.show("nofim/tok-3")
        assert shown.capabilities is not None and "insert" not in shown.capabilities
        assert shown.template is not None and ".Suffix" not in shown.template
        # vLLM is not a llama.cpp server: the setting alone decides, and it says no here.
        shown = await c.show("vl/qwen3.8")
        assert shown.capabilities is not None and "insert" not in shown.capabilities
        infills = [r for r in svir.transport.requests if r.url.endswith("/infill")]
        assert len(infills) == 2
        await c.show(TOK)  # cached with the rest of what the server said
        assert len([r for r in svir.transport.requests if r.url.endswith("/infill")]) == 2
