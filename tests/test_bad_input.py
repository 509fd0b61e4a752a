"""Hostile and careless clients, on every front end in process (OpenAI chat, Ollama's API, threads,
the admin API; httpx's ASGI transport, the replay upstream): what used to be a bare 500 or a crash
is a 4xx in the front end's own shape, with the request id, and svir answers the next request.

Also: svir's own failures are a JSON 500 in the front end's shape, logged once with the request
id; a managed model that does not start names no file of the machine; an unknown model of a
provider with closed models is a 404 `model_not_found`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.config.load import parse_config
from svir.edges.app import App
from svir.edges.managed.install import install as install_managed
from svir.log import JSONFormatter
from svir.policy.resilience import Timing
from svir.protocols.embeddings import routes as embeddings
from svir.protocols.ollama import routes as ollama
from svir.protocols.openai_chat import routes as openai_chat
from svir.protocols.threads import routes as threads
from svir.providers.adapt import AnswerValidator
from svir.server import thread_service
from svir.threads.service import ThreadService
from svir.wire.events import Finish, StreamError, TextDelta
from tests.keys.support import ADMIN_KEY, Harness, config_text
from tests.support.embedder import Embedder
from tests.support.mock_transport import MockTransport
from tests.support.stub import down_upstream_app
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer, ScriptedUpstream

CASE = "fake/llama-cpp"  # the replay's recorded answer: "17 × 3 = 51."
HI = [{"role": "user", "content": "hi"}]
DEEP = 100_000


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="whole")) as server:
        yield server


@pytest.fixture
async def svir(replay: ScriptedServer, tmp_path: Path) -> AsyncIterator[Harness]:
    text = config_text(replay.base_url, f"sqlite:///{tmp_path / 'svir.db'}")
    harness = Harness(
        text, fronts=("ollama", "threads", "anthropic", "completions", "embeddings", "responses")
    )
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()


class Lines:
    """svir's log lines as JSON objects, formatted as `svir serve` writes them."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(JSONFormatter())

    def __enter__(self) -> Lines:
        logging.getLogger("svir").addHandler(self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("svir").removeHandler(self.handler)

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines() if line]

    def tracebacks(self) -> list[dict[str, Any]]:
        return [line for line in self.all() if "exc" in line]


async def still_answers(h: Harness) -> None:
    """A good request on each front end after the bad ones."""
    assert h.http is not None
    body = {"model": CASE, "messages": HI, "stream": False}
    r = await h.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert "51." in r.json()["choices"][0]["message"]["content"]
    r = await h.http.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    assert "51." in r.json()["message"]["content"]


async def new_thread(h: Harness) -> str:
    assert h.http is not None
    r = await h.http.post("/v1/threads", json={"model": CASE})
    assert r.status_code == 200, r.text
    thread: str = r.json()["id"]
    r = await h.http.post(f"/v1/threads/{thread}/messages", json={"content": "hi"})
    assert r.status_code == 200, r.text
    return thread


def assert_openai_error(r: httpx.Response, status: int, rid: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == (rid or r.headers["x-request-id"])
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def assert_ollama_error(r: httpx.Response, status: int, rid: str | None = None) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == (rid or r.headers["x-request-id"])
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    return str(body["error"])


def assert_anthropic_error(
    r: httpx.Response, status: int, rid: str | None = None, type: str | None = None
) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == (rid or r.headers["x-request-id"])
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    if type is not None:
        assert body["error"]["type"] == type, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message


def message_of(r: httpx.Response, shape: str) -> str:
    body = r.json()
    return str(body["error"] if shape == "ollama" else body["error"]["message"])


# Every route that takes a JSON body, with the shape of its errors.
ROUTES = [
    ("/v1/chat/completions", "openai"),
    ("/v1/completions", "openai"),
    ("/api/chat", "ollama"),
    ("/api/generate", "ollama"),
    ("/api/show", "ollama"),
    ("/api/pull", "ollama"),
    ("/api/copy", "ollama"),
    ("/api/create", "ollama"),
    ("/api/push", "ollama"),
    ("/v1/messages", "anthropic"),
    ("/v1/messages/count_tokens", "anthropic"),
    ("/v1/threads", "openai"),
    ("/v1/threads/{thread}", "openai"),
    ("/v1/threads/{thread}/messages", "openai"),
    ("/v1/threads/{thread}/continue", "openai"),
    ("/v1/responses", "openai"),
    ("/admin/keys", "openai"),
    ("/v1/embeddings", "openai"),
    ("/api/embed", "ollama"),
    ("/api/embeddings", "ollama"),
]


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


DEEP_BODIES = {
    "arrays at the top": b"[" * DEEP + b"]" * DEEP,
    "objects at the top": nested(DEEP),
    "arrays in a field": b'{"model": "fake/llama-cpp", "messages": [], "stop": '
    + b"[" * DEEP
    + b"]" * DEEP
    + b"}",
    "a valid body with a 600-deep metadata": b'{"model": "fake/llama-cpp", "messages": '
    + msgspec.json.encode(HI)
    + b', "metadata": '
    + nested(600)
    + b"}",
}


@pytest.mark.parametrize("body", list(DEEP_BODIES), ids=list(DEEP_BODIES))
async def test_deep_json_is_a_400_on_every_front_end(svir: Harness, body: str) -> None:
    assert svir.http is not None
    thread = await new_thread(svir)
    with Lines() as lines:
        for n, (path, shape) in enumerate(ROUTES):
            rid = f"deep-{n}"
            headers = {"x-request-id": rid, "content-type": "application/json"}
            content = DEEP_BODIES[body]
            if path.startswith("/admin"):
                headers["authorization"] = f"Bearer {ADMIN_KEY}"
                content = b"[" * 20_000 + b"]" * 20_000  # the admin API takes 64 KiB
            r = await svir.http.post(path.format(thread=thread), content=content, headers=headers)
            if shape == "openai":
                error = assert_openai_error(r, 400, rid)
                assert error["code"] == "json_too_deep", (path, error)
            elif shape == "anthropic":
                assert_anthropic_error(r, 400, rid, "invalid_request_error")
            else:
                assert_ollama_error(r, 400, rid)
            assert "inside more than 100 arrays and objects" in message_of(r, shape), path
    assert lines.tracebacks() == []
    await still_answers(svir)


async def test_a_body_over_its_limit_is_the_same_413_on_every_front_end(svir: Harness) -> None:
    assert svir.http is not None
    thread = await new_thread(svir)
    for n, (path, shape) in enumerate(ROUTES):
        rid = f"big-{n}"
        headers = {"x-request-id": rid, "content-type": "application/json"}
        limit = svir.config.server.max_body_bytes
        if path.startswith("/admin"):
            headers["authorization"] = f"Bearer {ADMIN_KEY}"
            limit = 64 * 1024  # the admin API's own limit
        content = b'"' + b"x" * limit + b'"'
        r = await svir.http.post(path.format(thread=thread), content=content, headers=headers)
        words = f"The request body is larger than the limit of {limit} bytes"
        if shape == "openai":
            error = assert_openai_error(r, 413, rid)
            assert (error["code"], error["message"]) == ("request_too_large", words), path
        elif shape == "anthropic":
            assert assert_anthropic_error(r, 413, rid, "request_too_large") == words, path
        else:
            assert assert_ollama_error(r, 413, rid) == words, path
    await still_answers(svir)


async def test_what_no_route_takes_is_a_404_or_405_in_its_front_ends_shape(svir: Harness) -> None:
    assert svir.http is not None
    thread = await new_thread(svir)
    cases = [
        ("GET", "/v1/nothing", 404, "openai", None),
        ("DELETE", "/v1/models", 405, "openai", "GET"),
        ("GET", "/v1/chat/completions", 405, "openai", "POST"),
        ("GET", "/api/nothing", 404, "ollama", None),
        ("GET", "/api/generate", 405, "ollama", "POST"),
        ("GET", "/v1/completions", 405, "openai", "POST"),
        ("GET", "/api/chat", 405, "ollama", "POST"),
        ("GET", "/v1/messages", 405, "anthropic", "POST"),
        ("POST", "/v1/messages/batches", 404, "anthropic", None),
        ("PUT", f"/v1/threads/{thread}", 405, "openai", "DELETE, GET, POST"),
        ("GET", f"/v1/threads/{thread}/continue", 405, "openai", "POST"),
        ("GET", f"/v1/threads/{thread}/nothing", 404, "openai", None),
        ("GET", "/v1/responses", 405, "openai", "POST"),
        ("PUT", "/v1/responses/resp_1", 405, "openai", "DELETE, GET"),
        ("PUT", "/admin/keys", 405, "openai", "GET, POST"),
        ("GET", "/admin/nothing", 404, "openai", None),
    ]
    for method, path, status, shape, allow in cases:
        # Every path under /admin/ takes the admin key first, one no route has too.
        admin = {"authorization": f"Bearer {ADMIN_KEY}"} if path.startswith("/admin") else {}
        r = await svir.http.request(method, path, headers=admin)
        if shape == "openai":
            error = assert_openai_error(r, status)
            assert error["code"] == ("not_found" if status == 404 else "method_not_allowed")
        elif shape == "anthropic":
            kind = "not_found_error" if status == 404 else "invalid_request_error"
            assert path in assert_anthropic_error(r, status, type=kind)
        else:
            assert path in assert_ollama_error(r, status)
        assert r.headers.get("allow") == allow, (method, path)
    r = await svir.http.get("/admin/nothing")
    assert assert_openai_error(r, 401)["code"] == "invalid_admin_key"


@pytest.mark.parametrize(("tools", "kind"), [(5, "a number"), (True, "a boolean")])
async def test_a_wrong_tools_is_the_same_400_everywhere(
    svir: Harness, tools: Any, kind: str
) -> None:
    assert svir.http is not None
    words = f"tools must be an array, not {kind}"
    body = {"model": CASE, "messages": HI, "stream": False, "tools": tools}
    r = await svir.http.post("/v1/chat/completions", json=body)
    error = assert_openai_error(r, 400)
    assert (error["message"], error["param"], error["code"]) == (words, "tools", "invalid_type")
    r = await svir.http.post("/api/chat", json=body)
    assert assert_ollama_error(r, 400) == words
    thread = await new_thread(svir)
    for stream in (False, True):
        r = await svir.http.post(
            f"/v1/threads/{thread}/continue", json={"tools": tools, "stream": stream}
        )
        error = assert_openai_error(r, 400)
        assert (error["message"], error["param"], error["code"]) == (words, "tools", "invalid_type")
    await still_answers(svir)


WRONG_FIELDS = [
    ("tool_choice", 5, "tool_choice"),
    ("stream_options", [], "stream_options"),
    ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
    ("response_format", "json", "response_format"),
    ("stop", 5, "stop"),
    ("stop", [1], "stop[0]"),
    ("max_tokens", "9", "max_tokens"),
    ("messages", {"role": "user"}, "messages"),
    ("tools", [{"type": "function"}], "tools[0].function"),
    ("temperature", "warm", "temperature"),
    ("seed", 0.5, "seed"),
    ("parallel_tool_calls", 1, "parallel_tool_calls"),
]


@pytest.mark.parametrize(("field", "value", "param"), WRONG_FIELDS)
async def test_a_field_of_the_wrong_type_is_a_400(
    svir: Harness, field: str, value: Any, param: str
) -> None:
    assert svir.http is not None
    for stream in (False, True):
        body = {"model": CASE, "messages": HI, "stream": stream, field: value}
        r = await svir.http.post("/v1/chat/completions", json=body)
        error = assert_openai_error(r, 400)
        assert error["param"] == param and "must be" in error["message"], error
    await still_answers(svir)


def test_an_answer_too_deep_to_check_ends_the_stream_failed() -> None:
    """The model's answer is checked against the client's response_format: its words, which the
    client's prompt may shape, are decoded too."""
    validator = AnswerValidator({"type": "json_object"})
    events = validator([TextDelta("[" * DEEP + "]" * DEEP), Finish("stop")])
    assert isinstance(events[-1], StreamError)
    assert "nests too deeply" in events[-1].error.message


# svir's own failures


async def test_an_unexpected_failure_is_a_json_500_in_each_front_ends_shape(
    svir: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert svir.http is not None
    thread = await new_thread(svir)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom: svir's own bug")

    monkeypatch.setattr(svir.app.gateway, "open_chat", broken)
    monkeypatch.setattr(svir.app.gateway, "open_embeddings", broken)
    monkeypatch.setattr(svir.app, "models", broken)
    monkeypatch.setattr(ThreadService, "get", broken)
    body = {"model": CASE, "messages": HI, "stream": True}
    calls = [
        ("POST", "/v1/chat/completions", body, "openai"),
        ("POST", "/api/chat", body, "ollama"),
        ("POST", "/v1/completions", {"model": CASE, "prompt": "hi"}, "openai"),
        ("POST", "/api/generate", {"model": CASE, "prompt": "hi", "raw": True}, "ollama"),
        ("POST", "/v1/messages", {**body, "max_tokens": 8}, "anthropic"),
        ("POST", "/v1/responses", {"model": CASE, "input": "hi", "stream": True}, "openai"),
        ("GET", "/v1/models", None, "openai"),
        ("GET", "/api/tags", None, "ollama"),
        ("GET", f"/v1/threads/{thread}", None, "openai"),
        ("POST", "/v1/embeddings", {"model": CASE, "input": "x"}, "openai"),
        ("POST", "/api/embed", {"model": CASE, "input": "x"}, "ollama"),
    ]
    for n, (method, path, payload, shape) in enumerate(calls):
        rid = f"broken-{n}"
        with Lines() as lines:
            r = await svir.http.request(method, path, json=payload, headers={"x-request-id": rid})
        if shape == "openai":
            error = assert_openai_error(r, 500, rid)
            assert error == {
                "message": "svir failed on this request.",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        elif shape == "anthropic":
            words = assert_anthropic_error(r, 500, rid, "api_error")
            assert words == "svir failed on this request."
        else:
            assert assert_ollama_error(r, 500, rid) == "svir failed on this request."
        # Logged once, with the traceback and the request id; the client saw none of it.
        [logged] = lines.tracebacks()
        assert logged["request_id"] == rid and "boom: svir's own bug" in logged["exc"], logged
        assert "boom" not in r.text
    monkeypatch.undo()
    await still_answers(svir)


async def test_a_failing_guard_is_a_json_500_too(svir: Harness) -> None:
    assert svir.http is not None

    async def guard(scope: Any, fields: dict[str, Any]) -> None:
        if scope["path"] == "/api/version":
            raise KeyError("guard bug")

    svir.app.add_guard(guard)
    with Lines() as lines:
        r = await svir.http.get("/api/version", headers={"x-request-id": "guarded"})
    assert assert_ollama_error(r, 500, "guarded") == "svir failed on this request."
    assert [line["request_id"] for line in lines.tracebacks()] == ["guarded"]
    await still_answers(svir)


async def test_a_failure_after_the_response_started_is_logged_once_and_not_answered() -> None:
    app = App(parse_config(""), {})

    async def half(scope: Any, receive: Any, send: Any, rid: str, fields: Any) -> int:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise RuntimeError("broke mid-stream")

    app.routes.add("GET", "/half", half)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/half", "headers": [], "query_string": b""}
    with Lines() as lines:
        await app(scope, receive, send)  # returns: the server closes the unfinished response
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[-1]["more_body"] is True
    [logged] = lines.tracebacks()
    assert "broke mid-stream" in logged["exc"] and logged["request_id"]


# The whole OpenAI handler, fuzzed: any JSON body is a 4xx in OpenAI's shape (or the stub
# upstream's 502 for a request that is valid), never a crash.


@pytest.fixture(scope="module")
def stub_app() -> App:
    return down_upstream_app()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
FIELDS = [
    "messages", "stream", "stream_options", "tools", "tool_choice", "response_format", "stop",
    "max_tokens", "n", "temperature", "seed", "metadata", "logit_bias", "parallel_tool_calls",
    "user", "reasoning_effort", "top_k",
]  # fmt: skip


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `good`, now and then any JSON at all."""
    return st.integers(0, 5).flatmap(lambda i: json_values if i == 0 else good)


def bodies(key: str, good: st.SearchStrategy[Any], fields: list[str], odd: list[Any]) -> Any:
    """A request that would be valid (a model and `key`), with a few `fields` of any value (or
    one of the `odd` ones): a field that is wrong, alone."""
    return st.builds(
        lambda base, extra: {**base, **extra},
        st.fixed_dictionaries(
            {"model": mostly(st.sampled_from(["lab/m", "lab/", "nope/m"])), key: mostly(good)}
        ),
        st.dictionaries(st.sampled_from(fields), json_values | st.sampled_from(odd), max_size=3),
    )


chat_bodies = bodies(
    "messages", st.just(HI), FIELDS, [5, True, "x", [5], [{}], {}, [{"function": {"name": 1}}]]
)


# The whole app fuzzed: its requests take time, and the app fixture is the test's.
whole_app = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@whole_app
@given(body=chat_bodies | json_values)
async def test_chat_completions_answers_only_openai_errors(stub_app: App, body: Any) -> None:
    transport = httpx.ASGITransport(app=stub_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        r = await client.post("/v1/chat/completions", content=msgspec.json.encode(body))
    assert r.status_code in (400, 404, 502), (r.status_code, r.text)
    assert_openai_error(r, r.status_code)


EMBED_CONFIG = """
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "http://embed.test/v1"
discover = false
"""


@pytest.fixture
def embed_app() -> App:
    async def no_wait(seconds: float) -> None:
        pass

    app = App(
        parse_config(EMBED_CONFIG),
        {},
        transport=MockTransport(Embedder()),
        timing=Timing(sleep=no_wait),
    )
    embeddings.install(app)
    ollama.install(app)
    return app


embed_bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {
            "model": mostly(st.sampled_from(["lab/m", "lab/", "nope/m", "lab/down", "lab/short"])),
            "input": mostly(st.sampled_from(["a", ["a", "b"], [1, 2], [[1], [2]]])),
        }
    ),
    st.dictionaries(
        st.sampled_from(["encoding_format", "dimensions", "user", "prompt", "truncate", "options"]),
        json_values | st.sampled_from(["base64", "float", 4, True]),
        max_size=3,
    ),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=embed_bodies | json_values, route=st.sampled_from(ROUTES[-3:]))
async def test_embedding_routes_answer_only_their_errors(
    embed_app: App, body: Any, route: tuple[str, str]
) -> None:
    path, shape = route
    transport = httpx.ASGITransport(app=embed_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        r = await client.post(path, content=msgspec.json.encode(body))
    # 502 for the upstream that is down, 503 once its breaker opens.
    assert r.status_code in (200, 400, 404, 502, 503), (r.status_code, r.text)
    if r.status_code == 200:
        return
    if shape == "openai":
        assert_openai_error(r, r.status_code)
    else:
        assert_ollama_error(r, r.status_code)


# Managed models: what a client is told when one does not start, and which ones exist.

FAKE_SERVER = """#!/bin/sh
# Fails as llama-server does on a bad model file, naming the file.
echo "gguf_init_from_file: failed to read magic from '$2'"
echo "llama_model_load: error loading model: failed to load model from $2"
exit 1
"""
# An absolute path anywhere in a message (after a space, a quote, a parenthesis or '=').
_PATH = re.compile(r"(?:^|[\s'\"(=:])/[^\s'\"]+")


@contextlib.asynccontextmanager
async def running(app: App) -> AsyncIterator[App]:
    """`app` started and, at the end, shut down, as the server's lifespan does it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.ensure_future(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put)
    )
    await inbox.put({"type": "lifespan.startup"})
    started = await asyncio.wait_for(outbox.get(), 30)
    assert started["type"] == "lifespan.startup.complete", started
    try:
        yield app
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def managed_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[App, Path]]:
    server = tmp_path / "llama-server"
    server.write_text(FAKE_SERVER)
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SVIR_LLAMA_SERVER", str(server))
    model = tmp_path / "models" / "x.gguf"
    model.parent.mkdir()
    model.write_bytes(b"not a gguf file")
    (tmp_path / "models" / "y.gguf").write_bytes(b"not a gguf file")
    config = parse_config(
        '[[providers]]\nname = "m"\nkind = "llamacpp-managed"\n[providers.managed]\n'
        f'start_timeout = 30\n[providers.managed.models]\nx = "{model}"\n'
        f'y = "{tmp_path / "models" / "y.gguf"}"\n'
    )
    app = App(config, {})
    install_managed(app)
    openai_chat.install(app)
    ollama.install(app)
    async with running(app):
        yield app, tmp_path


async def call(app: App, path: str, body: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        return await client.post(path, json=body)


def assert_no_path(message: str, *paths: Path | str) -> None:
    for path in (*paths, tempfile.gettempdir()):
        assert str(path) not in message, message
    assert not _PATH.search(message), message


@pytest.mark.external
async def test_a_managed_model_that_does_not_start_names_no_file(
    managed_app: tuple[App, Path],
) -> None:
    app, tmp = managed_app
    with Lines() as lines:
        r = await call(app, "/v1/chat/completions", {"model": "m/x", "messages": HI})
        error = assert_openai_error(r, 502)
        assert "Cannot start m/x: llama-server exited with status 1" in error["message"]
        assert_no_path(error["message"], tmp)
        r = await call(app, "/api/chat", {"model": "m/x"})  # Ollama's "load the model"
        assert_no_path(assert_ollama_error(r, 502), tmp)
    # The operator's view keeps what the client is not told: the server's words and its log.
    logged = [line for line in lines.all() if line["msg"] == "llama-server did not start"]
    assert logged and all(
        str(tmp) in line["error"] and "(log: " in line["error"] for line in logged
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        health = (await client.get("/healthz?verbose=1")).json()
    assert str(tmp) in health["managed"]["m"]["models"]["x"]["last_error"]


async def test_a_managed_model_whose_file_is_gone_names_no_file(
    managed_app: tuple[App, Path],
) -> None:
    app, tmp = managed_app
    (tmp / "models" / "y.gguf").unlink()
    r = await call(app, "/v1/chat/completions", {"model": "m/y", "messages": HI})
    error = assert_openai_error(r, 502)
    assert error["message"].startswith("Cannot start m/y: ")
    assert_no_path(error["message"], tmp)


async def test_an_unknown_model_of_a_managed_provider_is_a_404(
    managed_app: tuple[App, Path],
) -> None:
    app, _ = managed_app
    r = await call(app, "/v1/chat/completions", {"model": "m/nope", "messages": HI})
    error = assert_openai_error(r, 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert error["message"] == "The model 'm/nope' does not exist: provider 'm' serves x, y"
    r = await call(app, "/api/chat", {"model": "m/nope", "messages": HI})
    assert assert_ollama_error(r, 404) == "model 'm/nope' not found"  # Ollama's words
    # Like an unknown provider.
    r = await call(app, "/v1/chat/completions", {"model": "q/nope", "messages": HI})
    assert assert_openai_error(r, 404)["code"] == "model_not_found"


async def test_an_unknown_model_of_a_managed_provider_is_a_404_for_threads(
    tmp_path: Path,
) -> None:
    config = parse_config(
        f'[store]\nurl = "sqlite:///{tmp_path / "t.db"}"\n'
        '[[providers]]\nname = "m"\nkind = "llamacpp-managed"\n[providers.managed]\n'
        # Any file will do for a model that is never started: no supervisor runs here.
        f'[providers.managed.models]\nx = "{Path(__file__)}"\n'
    )
    app = App(config, {})
    threads.install(app, thread_service(app))
    async with running(app):
        r = await call(app, "/v1/threads", {"model": "m/nope"})
        error = assert_openai_error(r, 404)
        assert error["code"] == "model_not_found"


# Through a real `svir serve` (uvicorn): what the issue saw was uvicorn's own text/plain 500.


@pytest.mark.external
def test_svir_serve_answers_bad_bodies_with_json_and_stays_up(
    replay: ScriptedServer, tmp_path: Path
) -> None:
    config = f"""
[[providers]]
name = "fake"
kind = "openai-compatible"
base_url = "{replay.base_url}"
discover = false
"""
    with SvirProcess(config, tmp_path) as proc:
        deep = b"[" * DEEP + b"]" * DEEP
        bad_tools = msgspec.json.encode({"model": CASE, "messages": HI, "tools": 5})
        for path in ("/v1/chat/completions", "/api/chat"):
            for body, words in ((deep, "nests too deeply"), (bad_tools, "tools must be an array")):
                r = httpx.post(proc.url + path, content=body, headers={"x-request-id": "srv-1"})
                assert r.status_code == 400, r.text
                assert r.headers["content-type"] == "application/json"
                assert r.headers["x-request-id"] == "srv-1"
                assert words in r.text
        good = {"model": CASE, "messages": HI, "stream": False}
        r = httpx.post(proc.url + "/v1/chat/completions", json=good, timeout=30)
        assert r.status_code == 200 and "51." in r.text
        log = proc.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log


COMPLETION_FIELDS = [
    "suffix", "max_tokens", "stream", "stop", "echo", "logprobs", "n", "best_of", "temperature",
    "seed", "stream_options", "user", "logit_bias", "raw", "system", "template", "images",
    "format", "options", "think", "keep_alive", "context",
]  # fmt: skip
completion_bodies = bodies(
    "prompt",
    st.sampled_from(["hi", "", ["hi"]]),
    COMPLETION_FIELDS,
    [5, True, "x", [5], {}, {"num_predict": "x"}, 0],
)


@whole_app
@given(body=completion_bodies | json_values)
async def test_completions_and_generate_answer_only_their_errors(stub_app: App, body: Any) -> None:
    content = msgspec.json.encode(body)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app)) as client:
        r = await client.post("http://svir/v1/completions", content=content)
        assert r.status_code in (400, 404, 502), (r.status_code, r.text)
        assert_openai_error(r, r.status_code)
        r = await client.post("http://svir/api/generate", content=content)
        # 200: Ollama's load form (an empty prompt) answers without an upstream.
        assert r.status_code in (200, 400, 404, 502), (r.status_code, r.text)
        if r.status_code != 200:
            assert_ollama_error(r, r.status_code)
