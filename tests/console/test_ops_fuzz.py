"""The console's POST routes take any body without failing: whatever JSON (or not JSON) comes,
the answer is OpenAI's error shape with a client's status, never a 500."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.console.support import ADMIN, ADMIN_KEY, app
from tests.support.inprocess import InProcess

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
# Bodies near the real ones: the right fields with any values, names that exist and not.
names = st.sampled_from(["lab", "lab/tok-3", "local", "nope/x", "", "lab/", "/", "a" * 300])
fields = st.sampled_from(["model", "provider", "only", "timeout", "extra"])
near_bodies = st.dictionaries(fields, names | json_values, max_size=4)
raw_bodies = st.binary(max_size=64)

CONFIG = """
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "{base}"
models = ["tok-3"]
discover = false
"""

fuzz = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[InProcess]:
    # The provider's server is a port nothing listens on: a probe that gets through fails fast.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        async with app(
            tmp_path, config=CONFIG.format(base=base), environ={"SVIR_ADMIN_KEY": ADMIN_KEY}
        ) as svir:
            yield svir


async def _answered(http: httpx.AsyncClient, path: str, content: bytes) -> None:
    r = await http.post(path, content=content, headers=ADMIN)
    assert r.status_code in (400, 404, 409, 413, 502), (path, r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]


@fuzz
@given(body=near_bodies | json_values, path=st.sampled_from(["load", "unload", "probe"]))
async def test_post_bodies_never_fail_svir(started: InProcess, body: Any, path: str) -> None:
    route = "/admin/probe" if path == "probe" else f"/admin/models/{path}"
    await _answered(started.http, route, msgspec.json.encode(body))


@fuzz
@given(raw=raw_bodies, path=st.sampled_from(["load", "unload", "probe"]))
async def test_post_bytes_never_fail_svir(started: InProcess, raw: bytes, path: str) -> None:
    route = "/admin/probe" if path == "probe" else f"/admin/models/{path}"
    await _answered(started.http, route, raw)


@fuzz
@given(model=st.text(max_size=20), lines=st.text(max_size=6))
async def test_log_queries_never_fail_svir(started: InProcess, model: str, lines: str) -> None:
    r = await started.http.get(
        "/admin/models/log", params={"model": model, "lines": lines}, headers=ADMIN
    )
    assert r.status_code in (400, 404), r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
