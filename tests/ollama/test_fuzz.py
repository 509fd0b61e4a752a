"""Fuzzing the Ollama translation: any JSON is a request or a clean 400, never a crash.

Two layers: the pure translation through the gateway's own checks and body builder, and the
whole `/api/chat` handler in process, whose only answers to arbitrary bodies are Ollama errors
with a 4xx status (or the stub upstream's 502 for a request that is valid).
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.config.model import ProviderConfig
from svir.edges.app import App
from svir.errors import BadRequest, OllamaError
from svir.protocols.ollama.request import to_openai_request
from svir.providers import build_upstream_body, get_kind, validate_chat_request
from svir.wire.errors import BodyError
from tests.support.stub import down_upstream_app

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 24).decode()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the well-formed value, now and then any JSON at all."""
    return st.integers(0, 11).flatmap(lambda i: json_values if i == 0 else strategy)


images = st.lists(
    maybe(
        st.sampled_from(
            [PNG, "data:image/png;base64," + PNG, "", "not base64", base64.b64encode(b"x").decode()]
        )
    ),
    max_size=3,
)
arguments = maybe(
    st.dictionaries(st.text(max_size=5), scalars, max_size=3) | st.sampled_from(['{"a":1}', "{"])
)
tool_calls = st.lists(
    maybe(
        st.fixed_dictionaries(
            {"function": maybe(st.fixed_dictionaries({"name": maybe(st.sampled_from(["f", "g", ""]))},
                                                    optional={"arguments": arguments}))},
            optional={"id": maybe(st.sampled_from(["a", "b"]))},
        )
    ),
    max_size=3,
)  # fmt: skip
messages = st.lists(
    maybe(
        st.fixed_dictionaries(
            {"role": maybe(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))},
            optional={
                "content": maybe(st.text(max_size=10)),
                "images": maybe(images),
                "thinking": maybe(st.text(max_size=5)),
                "tool_calls": maybe(tool_calls),
                "tool_name": maybe(st.sampled_from(["f", "g"])),
                "tool_call_id": maybe(st.sampled_from(["a", "b"])),
            },
        )
    ),
    max_size=5,
)
tools = st.lists(
    maybe(
        st.fixed_dictionaries(
            {"function": maybe(st.fixed_dictionaries(
                {"name": maybe(st.sampled_from(["f", "g"]))},
                optional={"parameters": maybe(st.just({"type": "object"})),
                          "description": maybe(st.text(max_size=5))},
            ))},
            optional={"type": maybe(st.just("function"))},
        )
    ),
    max_size=3,
)  # fmt: skip
options = st.fixed_dictionaries(
    {},
    optional={
        "temperature": maybe(st.floats(0, 2)),
        "top_p": maybe(st.floats(0, 1)),
        "num_predict": maybe(st.integers(-2, 4096)),
        "seed": maybe(st.integers(0, 2**31)),
        "stop": maybe(st.lists(st.text(max_size=3), max_size=2)),
        "num_ctx": json_values,
        "top_k": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {"model": maybe(st.sampled_from(["lab/m", "lab/m:latest", "lab/m", "nope/m", "plain", ""]))},
    optional={
        "messages": maybe(messages),
        "tools": maybe(tools),
        "format": maybe(st.sampled_from(["json", "", {"type": "object", "title": "T x"}])),
        "options": maybe(options),
        "think": maybe(st.sampled_from([True, False, "low", "high", "max"])),
        "stream": maybe(st.booleans()),
        "keep_alive": json_values,
    },
)
anything = st.integers(0, 4).flatmap(lambda i: json_values if i == 0 else bodies)

PROVIDER = ProviderConfig(name="lab", kind="llamacpp", base_url="http://127.0.0.1:9/v1")


def as_received(value: Any) -> Any:
    """The value as the handler sees it: through JSON and msgspec's decoder."""
    return msgspec.json.decode(msgspec.json.encode(value))


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(anything)
def test_translation_is_a_request_or_a_clean_400(body: Any) -> None:
    body = as_received(body)
    error: OllamaError | None = None
    try:
        request = to_openai_request(body)
    except OllamaError as exc:
        error = exc
    if error is not None:
        assert error.status == 400 and error.message
        return
    assert isinstance(request["messages"], list)
    if not request["messages"]:
        return  # answered as a model load, without an upstream
    try:
        validate_chat_request(request)
    except BadRequest:
        return
    for kind in ("llamacpp", "lmstudio", "openai", "kimi"):
        try:
            upstream = build_upstream_body(
                request, kind=get_kind(kind), provider=PROVIDER, model_id="m"
            )
        except BodyError:
            continue
        msgspec.json.encode(upstream)


# The whole handler, in process.


@pytest.fixture(scope="module")
def app() -> App:
    return down_upstream_app()  # Ollama's API installed


async def post(app: App, body: bytes) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        return await client.post("/api/chat", content=body)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)  # fmt: skip
@given(body=anything)
async def test_handler_answers_only_ollama_errors(app: App, body: Any) -> None:
    r = await post(app, msgspec.json.encode(body))
    payload = r.json()
    if r.status_code == 200:
        # An empty message list is Ollama's "load the model".
        assert payload["done"] is True and payload["done_reason"] in ("load", "unload")
        return
    assert r.status_code in (400, 404, 502), (r.status_code, payload)
    assert set(payload) == {"error"} and isinstance(payload["error"], str) and payload["error"]


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[1,", b"\xff\xfe", b'{"model": 1e999}', b"null", b'"x"']
)
async def test_handler_answers_bad_json_with_400(app: App, raw: bytes) -> None:
    r = await post(app, raw)
    assert r.status_code == 400
    assert set(r.json()) == {"error"}


async def test_handler_refuses_a_body_over_the_limit(app: App) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        limit = app.config.server.max_body_bytes
        r = await client.post("/api/chat", content=b" " * (limit + 1))
    assert r.status_code == 413 and "larger than the limit" in r.json()["error"]


# The listing and model-file routes, and options.num_ctx.

MODEL_ROUTES = [("POST", "/api/show"), ("POST", "/api/pull"), ("DELETE", "/api/delete")]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)  # fmt: skip
@given(body=anything, which=st.sampled_from(MODEL_ROUTES))
async def test_model_routes_answer_only_ollama_errors(
    app: App, body: Any, which: tuple[str, str]
) -> None:
    method, path = which
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        r = await client.request(method, path, content=msgspec.json.encode(body))
    if r.status_code == 200:
        assert path != "/api/delete"
        return
    assert r.status_code in (400, 404), (r.status_code, r.text)
    payload = r.json()
    assert set(payload) == {"error"} and isinstance(payload["error"], str) and payload["error"]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)  # fmt: skip
@given(value=anything)
async def test_num_ctx_of_any_value_is_served_or_a_clean_400(app: App, value: Any) -> None:
    body = {"model": "lab/m", "messages": [{"role": "user", "content": "hi"}]}
    r = await post(app, msgspec.json.encode({**body, "options": {"num_ctx": value}}))
    # The upstream is down: a num_ctx that passes is a 502 from it, never a 500.
    assert r.status_code in (400, 502), (r.status_code, r.text)
    if r.status_code == 400:
        assert "num_ctx" in r.json()["error"]
