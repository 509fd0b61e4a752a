"""The request sequences of real Ollama clients, taken from their public source (one file each in
tests/ollama/clients/: which endpoints, in which order, which fields they read and how they parse
them), replayed against svir in process. Each field a client reads must be there, typed as the
client parses it, and true of the model as svir serves it: the scripted llama.cpp server's
`/props` and model list (tests/support/upstream.py) are the truth here.

A read is `[path, type]`: a path is a list of keys, where `*` is every element of a list,
`{arch}` the model's `general.architecture` and `~context_length` the first key that contains
`context_length` (how Roo and LiteLLM find it). A truth check compares a field with what the
upstream says of the model.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from svir.chat import UpstreamTarget
from tests.support.inprocess import InProcess, serve
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import LLAMA_CPP_MODELS, LLAMA_CPP_PROPS, ScriptedUpstream

CLIENTS = Path(__file__).parent / "clients"
MODEL = "lab/tok-3"  # the scripted llama.cpp server answers it, with usage
CONFIG = """
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://llama.test/v1"
models = ["tok-3"]
"""
# What the upstream says of its model: the truth the clients' reads are held to.
TRUTH: dict[str, Any] = {
    "context_length": LLAMA_CPP_PROPS["default_generation_settings"]["n_ctx"],
    "tools": LLAMA_CPP_PROPS["chat_template_caps"]["supports_tools"],
    "vision": LLAMA_CPP_PROPS["modalities"]["vision"],
    "thinking": "<think>" in LLAMA_CPP_PROPS["chat_template"],
    "insert": False,
}
assert LLAMA_CPP_MODELS["data"][0]["meta"]["n_ctx"] == TRUTH["context_length"]


def fixtures() -> list[str]:
    return sorted(p.stem for p in CLIENTS.glob("*.json"))


@pytest.fixture(params=[False, True], ids=["no-fim", "fim"])
async def svir(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[InProcess]:
    """The app over the scripted llama.cpp server; in the `fim` world, svir's fill-in-the-middle
    setting says the route takes a suffix and the server's `/infill` takes the model, and the
    clients must see it (otherwise the server refuses, as for a model without FIM tokens)."""
    scripted = ScriptedUpstream(models="llamacpp")
    fim = bool(request.param)

    def handler(req: MockRequest) -> Any:
        if req.path == "/infill":  # llama.cpp refuses a model without FIM tokens with a 501
            if fim:
                return MockResponse.json({"content": ""})
            return MockResponse.json({"error": {"code": 501, "message": "no FIM"}}, status=501)
        return scripted(req)

    async with serve(tmp_path, CONFIG, handler) as app:
        if fim:
            app.app.catalog.insert = lambda route: isinstance(route, UpstreamTarget)
        app.truth = {**TRUTH, "insert": request.param}  # type: ignore[attr-defined]
        # Served once, so /api/ps lists it (Open WebUI reads it).
        r = await app.http.post("/api/chat", json={"model": MODEL, "messages": [], "stream": False})
        assert r.status_code == 200
        await app.http.post(
            "/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        yield app


@pytest.mark.parametrize("name", fixtures())
async def test_client_sequence(svir: InProcess, name: str) -> None:
    spec = json.loads((CLIENTS / f"{name}.json").read_text())
    assert spec["source"] and spec["steps"]
    truth: dict[str, Any] = svir.truth  # type: ignore[attr-defined]
    for step in spec["steps"]:
        method, path, *body = step["request"]
        payload = substitute(body[0], truth) if body else None
        r = await svir.http.request(method, path, json=payload)
        where = f"{name}: {method} {path}"
        assert r.status_code == 200, f"{where}: {r.status_code} {r.text}"
        if "lines" in step or "last" in step:
            lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
            assert lines, where
            for line in lines:
                check_reads(line, step.get("lines", []), where)
            check_reads(lines[-1], step.get("last", []), where + " (last line)")
            continue
        doc = r.json()
        check_reads(doc, step.get("reads", []), where)
        for check in step.get("truth", []):
            check_truth(doc, check, truth, where)


def substitute(value: Any, truth: dict[str, Any]) -> Any:
    if value == "$model":
        return MODEL
    if isinstance(value, str) and value.startswith("$"):
        return truth[value[1:]]
    if isinstance(value, dict):
        return {k: substitute(v, truth) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, truth) for v in value]
    return value


_MISSING = object()


def values(doc: Any, path: list[str]) -> Iterator[Any]:
    """Every value at `path` (`*` fans out over a list); `_MISSING` where a key is absent."""
    if not path:
        yield doc
        return
    key, rest = path[0], path[1:]
    if key == "*":
        assert isinstance(doc, list), f"expected a list, got {doc!r}"
        for item in doc:
            yield from values(item, rest)
        return
    if not isinstance(doc, dict):
        yield _MISSING
        return
    if key.startswith("{arch}"):
        arch = doc.get("general.architecture")
        key = f"{arch}{key[len('{arch}') :]}"
    elif key.startswith("~"):
        key = next((k for k in doc if key[1:] in k), key)
    yield from values(doc.get(key, _MISSING), rest) if key in doc else iter([_MISSING])


def check_reads(doc: Any, reads: list[list[Any]], where: str) -> None:
    for path, kind in reads:
        for value in values(doc, path):
            assert typed(value, kind), f"{where}: {'.'.join(path)} = {value!r} is not {kind}"


def typed(value: Any, kind: str) -> bool:
    if kind == "absent":
        return value is _MISSING
    if kind.endswith("?"):
        return value is _MISSING or value is None or typed(value, kind[:-1])
    if value is _MISSING:
        return False
    if kind == "str":
        return isinstance(value, str)
    if kind in ("int", "uint"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return ok and (kind == "int" or value >= 0)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "true":
        return value is True
    if kind == "object":
        return isinstance(value, dict)
    if kind == "list+":
        return isinstance(value, list) and len(value) > 0
    if kind in ("list[str]", "list[str]|null"):
        if value is None:
            return kind.endswith("|null")
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "iso8601":
        try:
            datetime.datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return False
        return True
    if kind.startswith("version>="):
        want = tuple(int(p) for p in kind.removeprefix("version>=").split("."))
        got = tuple(int(p) for p in re.sub(r"^v|-.*", "", value).split("."))
        return got >= want
    if kind.startswith("lines:"):
        pattern = re.compile(kind.removeprefix("lines:"))
        return isinstance(value, str) and all(pattern.match(line) for line in value.split("\n"))
    raise AssertionError(f"unknown type word {kind!r}")


def check_truth(doc: Any, check: list[Any], truth: dict[str, Any], where: str) -> None:
    op, path, *args = check
    (value,) = list(values(doc, path))
    shown = f"{where}: {'.'.join(path)} = {value!r}"
    if op == "equals":
        assert value == truth[args[0]], f"{shown}, the upstream says {truth[args[0]]!r}"
    elif op == "has":
        word, fact = args
        assert (word in value) is truth[fact], f"{shown}: {word!r} must be there iff {fact}"
    elif op in ("contains", "contains_lower"):
        text, fact = args
        found = text in (value.lower() if op == "contains_lower" else value)
        assert found is truth[fact], f"{shown}: {text!r} must be in it iff {fact}"
    elif op == "parameter":
        name, fact = args
        params = dict(line.split(None, 1) for line in value.split("\n") if line)
        assert int(params[name]) == truth[fact], f"{shown}: {name} must be {truth[fact]}"
    else:
        raise AssertionError(f"unknown truth check {op!r}")


def test_every_client_is_recorded() -> None:
    assert fixtures() == ["aider", "continue", "copilot", "open-webui", "roo", "zed"]
