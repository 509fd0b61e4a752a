"""Editors' autocomplete and edit-prediction requests, recorded from their public source
(tests/completions/clients/), replayed against svir in process: each reaches the upstream's
completion endpoint with the prompt (and suffix) intact, and the answer carries every field the
client reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.completions.test_completions_inprocess import CONFIG, ENV, upstream
from tests.support.inprocess import serve

CLIENTS = Path(__file__).parent / "clients"
FIXTURES = sorted(p.name for p in CLIENTS.glob("*.json"))


def read(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def answers(text: str, kind: str) -> list[Any]:
    if kind == "json":
        return [json.loads(text)]
    if kind == "ndjson":
        return [json.loads(line) for line in text.splitlines() if line]
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]", text
    return [json.loads(f) for f in frames[:-1] if json.loads(f).get("choices")]


def test_every_fixture_is_in_the_readme() -> None:
    readme = (CLIENTS / "README.md").read_text()
    assert FIXTURES and all(name in readme for name in FIXTURES)


@pytest.mark.parametrize("name", FIXTURES)
async def test_client_request_replays(tmp_path: Path, name: str) -> None:
    spec = json.loads((CLIENTS / name).read_text())
    async with serve(tmp_path, CONFIG, upstream, ENV) as svir:
        r = await svir.http.request(spec["method"], spec["path"], json=spec["body"])
        assert r.status_code == 200, r.text
        got = answers(r.text, spec["stream"])
        assert got
        for item in got:
            assert "error" not in item, item
            for path in spec["reads"]:
                read(item, path)  # present (a KeyError fails the test)
        text_key = "choices.0.text" if spec["path"] == "/v1/completions" else "response"
        assert "".join(read(item, text_key) for item in got)
        # Before it, what svir asks a llama.cpp server of its model once per cache period
        # (svir.policy.catalog: /props, its model list, whether /infill takes the model).
        *asked, sent = svir.transport.requests
        assert all(r.path in ("/props", "/v1/models", "/infill") for r in asked), asked
    assert sent.path == spec["upstream"]
    body = sent.json()
    given = spec["body"]
    if spec["upstream"] == "/infill":
        assert body["input_prefix"] == given["prompt"]
        assert body["input_suffix"] == given["suffix"]
    else:
        assert body["prompt"] == given["prompt"]  # FIM tokens written by the client, untouched
    options = given.get("options", given)
    stop = options.get("stop")
    assert body.get("stop") == stop
    limit = options.get("num_predict", options.get("max_tokens"))
    assert body["n_predict"] == limit
