"""`svir probe` as a child process against the real llama.cpp server, and against replay servers
that behave as the reference says LM Studio, mlx-lm and a strict server do (§2.4–§2.6, §5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from svir.client.probe.report import settings_toml
from svir.config.load import parse_config
from svir.edges.llama_server import LlamaServer
from tests.cli.conftest import run_svir
from tests.cli.scripted import (
    LMSTUDIO_STREAMS,
    MLX_LM_STREAMS,
    STRICT_STREAMS,
    ScriptedReplay,
    lmstudio,
    mlx_lm,
    strict,
)

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
# The whole probe of the real llama-server is one fixture: every check a generation, ~10 minutes
# on a loaded 2-core machine (600.0 s, pytest-timeout's default bound, was reached by the fixture
# alone with two suites side by side), so its bound against a hang is the wheel test's kind.
pytestmark = [pytest.mark.external, pytest.mark.timeout(1800)]


class Report:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.findings = {f["id"]: f for f in doc["findings"]}
        self.settings: dict[str, Any] = doc["suggested_provider_settings"]

    def verdict(self, finding_id: str) -> str:
        return str(self.findings[finding_id]["verdict"])

    def evidence(self, finding_id: str) -> dict[str, Any]:
        return dict(self.findings[finding_id]["evidence"])

    def verdicts(self) -> dict[str, str]:
        return {k: v["verdict"] for k, v in self.findings.items()}


def probe(base_url: str, *args: str, timeout: float = 900) -> Report:
    out = run_svir("probe", base_url, "--json", *args, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return Report(json.loads(out.stdout))


def loads_as_config(settings: dict[str, Any]) -> None:
    """The suggested settings are svir.toml as it is: the config loads them."""
    config = parse_config(settings_toml(settings))
    provider = config.providers[0]
    for key, value in settings.items():
        if key != "base_url":
            got = getattr(provider, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, key


# ---------------------------------------------------------------------------------------------
# llama.cpp, for real


@pytest.fixture(scope="module")
def llama_report(llama_server: LlamaServer) -> Report:
    return probe(llama_server.base_url)


def test_llama_cpp_usage(llama_report: Report) -> None:
    assert llama_report.verdict("usage") == "kept"
    usage = llama_report.evidence("usage")["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0


def test_llama_cpp_tool_choice(llama_report: Report) -> None:
    # llama.cpp holds `required` through its grammar: asked only to say hello, the model calls.
    required = llama_report.evidence("tool_choice.required")
    assert llama_report.verdict("tool_choice.required") == "kept"
    assert required["status"] == 200 and required["tool_calls"]
    # A value outside the protocol is a 400 with llama.cpp's own message (§2.4).
    invalid = llama_report.evidence("tool_choice.invalid")
    assert llama_report.verdict("tool_choice.invalid") == "rejected"
    assert invalid["status"] == 400
    assert invalid["error"]["message"] == "Invalid tool_choice: bogus"
    assert invalid["error"]["type"] == "invalid_request_error"
    # The rest depends on what the model writes; each is still judged from evidence.
    for which in ("auto", "none", "named"):
        assert llama_report.evidence(f"tool_choice.{which}")["status"] == 200


def test_llama_cpp_structured_output(llama_report: Report) -> None:
    assert llama_report.verdict("response_format.json_schema") == "kept"
    schema = llama_report.evidence("response_format.json_schema")
    assert schema["parsed"] is True and schema["matches_schema"] is True
    assert json.loads(schema["text"]) == {"locker": 7, "open": True}
    assert llama_report.settings["response_format"] == "pass"


def test_llama_cpp_image_without_projector(llama_report: Report) -> None:
    image = llama_report.evidence("image")
    assert llama_report.verdict("image") == "rejected"
    assert image["status"] == 500
    assert image["error"]["kind"] == "unsupported_input"
    assert "image input is not supported" in image["error"]["message"]
    assert llama_report.settings["images"] is False


def test_llama_cpp_overflow(llama_report: Report) -> None:
    overflow = llama_report.evidence("overflow")
    assert llama_report.verdict("overflow") == "rejected"
    assert overflow["status"] == 400
    assert overflow["error"]["kind"] == "context_overflow"
    assert overflow["error"]["type"] == "exceed_context_size_error"
    assert overflow["error"]["n_ctx"] == 4096
    assert overflow["error"]["n_prompt_tokens"] > 4096


def test_llama_cpp_reasoning_effort(llama_report: Report) -> None:
    # Gemma 3 270M does not reason: every effort is taken and nothing shows its effect.
    for effort in ("none", "low", "medium", "high", "xhigh"):
        assert llama_report.verdict(f"reasoning_effort.{effort}") == "accepted"
        assert llama_report.evidence(f"reasoning_effort.{effort}")["status"] == 200


def test_llama_cpp_settings(llama_report: Report, llama_server: LlamaServer) -> None:
    server = llama_report.doc["server"]
    assert server["owned_by"] == "llamacpp" and server["context_length"] == 4096
    assert llama_report.settings["kind"] == "llamacpp"
    assert llama_report.settings["base_url"] == llama_server.base_url + "/v1"
    assert set(llama_report.doc["why"]) >= {"kind", "images", "response_format"}
    loads_as_config(llama_report.settings)


def test_llama_cpp_table(llama_server: LlamaServer) -> None:
    out = run_svir("probe", llama_server.base_url, "--only", "image", timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("usage chunk" in line and "kept" in line for line in lines)
    assert any("image" in line and "rejected" in line and "500" in line for line in lines)
    assert "tool_choice" not in out.stdout  # --only
    assert "[[providers]]" in out.stdout and 'kind = "llamacpp"' in out.stdout
    assert "images = false" in out.stdout
    assert "response_format" not in out.stdout  # the JSON checks did not run


# ---------------------------------------------------------------------------------------------
# Servers that cannot run here, as the reference describes them


@pytest.fixture(scope="module")
def lmstudio_server() -> Iterator[ScriptedReplay]:
    models = {"object": "list", "data": [
        {"id": "qwen/qwen3.8-27b", "object": "model", "owned_by": "organization_owner"},
        {"id": "text-embedding-nomic-embed-text-v1.5", "object": "model",
         "owned_by": "organization_owner"},
    ]}  # fmt: skip
    with ScriptedReplay(lmstudio, streams=LMSTUDIO_STREAMS, models=models) as server:
        yield server


def test_lmstudio(lmstudio_server: ScriptedReplay) -> None:
    report = probe(lmstudio_server.root_url)
    assert report.doc["probe"]["model"] == "qwen/qwen3.8-27b"  # the first chat model
    assert report.verdicts() == {
        "usage": "kept",
        "tool_choice.auto": "kept",
        "tool_choice.none": "kept",
        "tool_choice.required": "ignored",
        "tool_choice.named": "rejected",
        "tool_choice.invalid": "ignored",
        "response_format.json_object": "rejected",
        "response_format.json_schema": "kept",
        "reasoning_effort.none": "kept",
        "reasoning_effort.low": "kept",
        "reasoning_effort.medium": "kept",
        "reasoning_effort.high": "kept",
        "reasoning_effort.xhigh": "kept",
        "image": "kept",
        "overflow": "rejected",
    }
    named = report.evidence("tool_choice.named")
    assert named["status"] == 400
    assert named["error"]["message"].startswith("Invalid tool_choice type: 'object'")
    # The schema held to the reasoning: the JSON came as reasoning, content empty (§2.6).
    assert report.evidence("response_format.json_schema")["answer_in"] == "reasoning"
    # The overflow arrives as an SSE error event with status 200 (§3.5, §5).
    overflow = report.evidence("overflow")
    assert overflow["status"] == 200
    assert overflow["error"]["in_stream"] is True
    assert overflow["error"]["kind"] == "context_overflow"
    assert report.settings["kind"] == "lmstudio"
    assert report.settings["images"] is True
    assert report.settings["response_format"] == "pass"
    assert any("required is not kept" in note for note in report.doc["notes"])
    loads_as_config(report.settings)
    # Every request of the probe named the model it picked.
    assert {r.body["model"] for r in lmstudio_server.chat_requests} == {"qwen/qwen3.8-27b"}


def test_mlx_lm(tmp_path: Any) -> None:
    with ScriptedReplay(mlx_lm, streams=MLX_LM_STREAMS, models=["mlx-community/Qwen3.8"]) as server:
        report = probe(server.base_url)
    verdicts = report.verdicts()
    # It reads no tool_choice (§2.4) and no response_format (§2.6).
    assert verdicts["tool_choice.auto"] == "kept"
    assert verdicts["tool_choice.none"] == "ignored"
    assert verdicts["tool_choice.required"] == "ignored"
    assert verdicts["tool_choice.named"] == "ignored"
    assert verdicts["tool_choice.invalid"] == "ignored"
    assert verdicts["response_format.json_object"] == "ignored"
    assert verdicts["response_format.json_schema"] == "ignored"
    # "none" did not stop the reasoning (§2.5).
    assert verdicts["reasoning_effort.none"] == "ignored"
    # It takes no image: 404 with its plain-string error (§2.2).
    assert verdicts["image"] == "rejected"
    assert report.evidence("image")["status"] == 404
    # No context limit (§5).
    assert verdicts["overflow"] == "ignored"
    assert report.settings["kind"] == "mlx-lm"
    assert report.settings["images"] is False
    assert report.settings["response_format"] == "validate"
    assert "ignored json_object and json_schema" in report.doc["why"]["response_format"]
    loads_as_config(report.settings)


def test_strict_server() -> None:
    with ScriptedReplay(strict, streams=STRICT_STREAMS, models=["strict-model"]) as server:
        report = probe(server.base_url, "--only", "reasoning")
        requests = server.chat_requests
    assert report.verdict("usage") == "rejected"
    assert report.evidence("usage")["status"] == 400
    # The probe goes on without the refused field.
    assert "stream_options" in requests[0].body
    assert all("stream_options" not in r.body for r in requests[1:])
    for effort in ("none", "low", "medium", "high", "xhigh"):
        assert report.verdict(f"reasoning_effort.{effort}") == "rejected"
        assert report.evidence(f"reasoning_effort.{effort}")["status"] == 422
    assert report.settings["drop_params"] == ["reasoning_effort"]
    assert "image" not in report.findings  # --only reasoning
    assert any("stream_options was refused" in n for n in report.doc["notes"])
    loads_as_config(report.settings)


def test_model_server_down() -> None:
    out = run_svir("probe", "http://127.0.0.1:9", "--model", "m")
    assert out.returncode == 1
    assert "nothing else can be probed" in out.stderr


def test_unknown_only() -> None:
    out = run_svir("probe", "http://127.0.0.1:9", "--only", "tools,colour")
    assert out.returncode == 2
    assert "unknown check 'colour'" in out.stderr
