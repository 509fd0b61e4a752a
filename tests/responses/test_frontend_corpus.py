"""Every upstream behaviour of the conformance corpus reaches a Responses client through the whole
app: each recorded stream (tests/conformance/decoder/*.sse) is the mock upstream's answer to
`POST /v1/responses`, and svir's stream is well formed (as the SDK and Codex read it), ends as the
corpus expects (completed, incomplete for a cut answer, failed with the code a client acts on for
an in-stream error or a truncation; a failure before any output is an HTTP error), carries the
answer, reasoning and calls, and is stored as it ended."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.anthropic.test_frontend_corpus import CASES, CORPUS, play, provider
from tests.responses.sdk import check_codex, check_grammar, stream
from tests.responses.test_corpus import CODES, INCOMPLETE, _parts, _reasoning
from tests.support.inprocess import InProcess, serve


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with serve(tmp_path, provider("tags", True) + provider("plain", False), play) as app:
        yield app


@pytest.mark.parametrize("name", CASES)
async def test_corpus_stream_through_svir(svir: InProcess, name: str) -> None:
    spec = json.loads((CORPUS / f"{name}.json").read_text())
    expect, options = spec["expect"], spec["options"]
    body: dict[str, Any] = {
        "model": ("tags/" if options["think_tags"] else "plain/") + name,
        "input": "hi",
        "stream": True,
        "reasoning": {"summary": "auto"},
    }
    if options["tool_names"]:
        body["tools"] = [
            {"type": "function", "name": tool, "parameters": {"type": "object"}}
            for tool in options["tool_names"]
        ]
    r = await svir.http.post("/v1/responses", json=body)
    if r.status_code != 200:  # failed before any output: an HTTP error in OpenAI's shape
        assert expect["error"] is not None, r.text
        assert r.json()["error"]["message"]
        return
    frames = check_grammar(r.content)
    check_codex(frames)
    got = stream(r.content)
    end = frames[-1]["response"]
    error = expect["error"]
    if error is not None:
        assert end["status"] == "failed" and end["error"]["code"] == CODES[error["kind"]]
        assert expect["answer"].startswith(_parts(got.last, "output_text"))
    else:
        response = got.final if got.final is not None else got.last
        if expect["finish_reason"] in INCOMPLETE:
            assert response.status == "incomplete"
        else:
            assert response.status == "completed"
        assert _parts(response, "output_text") == expect["answer"]
        assert _reasoning(response) == expect["reasoning"]
        calls = sorted((c["name"], c["arguments"]) for c in expect["tool_calls"])
        got_calls = [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
        assert sorted(got_calls) == calls
    stored = await svir.http.get(f"/v1/responses/{end['id']}")
    assert stored.status_code == 200 and stored.json() == end  # stored as it ended


async def test_the_corpus_is_played(svir: InProcess) -> None:
    assert len(CASES) >= 30
    r = await svir.http.post(
        "/v1/responses", json={"model": "plain/llama-cpp", "input": "hi", "stream": False}
    )
    assert isinstance(r, httpx.Response) and r.status_code == 200
    assert r.json()["output"]
