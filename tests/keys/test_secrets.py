"""Secrets never leave svir: an upstream error repeating the key it was sent, in any of its fields,
reaches no client (every front end, streamed or not), no metric, no span, no ledger row and no log
line; metric labels come from svir's closed sets only; svir's own hints survive redaction."""

from __future__ import annotations

import ast
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import svir
from svir.edges.metrics import ERROR_CLASSES, METHODS, OTHER, OUTCOMES, OWN_ERRORS
from svir.log import JSONFormatter
from svir.wire.classify import classify_http_error
from tests.keys.support import Harness, config_text
from tests.support.upstream import FOREIGN_TOKEN, ScriptedServer

KEY_ENV = "SVIR_TEST_SECRETS_UPSTREAM_KEY"
MESSAGES = [{"role": "user", "content": "hi"}]


class Lines(logging.Handler):
    """svir's log lines as svir writes them (its JSON formatter, secrets replaced)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JSONFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def log_lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("svir")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def shown(r: httpx.Response) -> str:
    return f"{r.status_code} {dict(r.headers)} {r.text}"


async def every_front_end(h: Harness, model: str) -> list[httpx.Response]:
    """The model asked for on /v1/chat/completions, /api/chat and a thread's continue, each
    streamed and not."""
    assert h.http is not None
    out: list[httpx.Response] = []
    for stream in (True, False):
        out.append(await h.chat(None, model, stream=stream))
        body = {"model": model, "messages": MESSAGES, "stream": stream}
        out.append(await h.http.post("/api/chat", json=body))
        r = await h.http.post("/v1/threads", json={"model": model})
        assert r.status_code == 200, r.text
        thread = r.json()["id"]
        r = await h.http.post(f"/v1/threads/{thread}/messages", json={"content": "hi"})
        assert r.status_code == 200, r.text
        out.append(await h.http.post(f"/v1/threads/{thread}/continue", json={"stream": stream}))
    return out


def labels(text: str) -> dict[str, set[str]]:
    """Every value each label name takes in a metrics text."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                out.setdefault(name, set()).add(value)
    return out


async def test_an_upstream_key_in_any_error_field_goes_nowhere(
    harness_factory: type[Harness],
    upstream: ScriptedServer,
    tmp_path: Path,
    log_lines: Lines,
) -> None:
    key = f"upkey-{uuid.uuid4().hex}"  # not shaped like any credential the patterns know
    store = tmp_path / "s.db"
    text = config_text(
        upstream.base_url,
        f"sqlite:///{store}",
        api_key_env=KEY_ENV,
        extra="[telemetry]\notel = true\n",
    )
    exporter = InMemorySpanExporter()
    h = await harness_factory(
        text, environ={KEY_ENV: key}, fronts=("ollama", "threads"), span_exporter=exporter
    ).start()
    before = len(upstream.chat_requests)
    refused = await every_front_end(h, "fake/echo-fields-400")
    cut = await every_front_end(h, "fake/echo-fields-stream")
    quoted = await every_front_end(h, "fake/echo-400")
    await h.flush()
    assert h.http is not None
    metrics = (await h.http.get("/metrics")).text
    # The upstream was sent the key each time: what is proven is that svir does not repeat it.
    sent = [r.headers.get("Authorization") for r in upstream.chat_requests[before:]]
    assert len(sent) == 18 and set(sent) == {f"Bearer {key}"}
    # The refusal still reaches every client as the 400 it was, its fields scrubbed.
    assert [r.status_code for r in refused] == [400] * 6
    for r in (refused[0], refused[3]):  # /v1/chat/completions, streamed and not
        error = r.json()["error"]
        assert error["code"] == error["param"] == "[redacted]"
    assert [r.status_code for r in cut] == [200, 200, 200, 502, 502, 502]
    assert "partial" in cut[0].text
    for r in [*refused, *cut, *quoted]:
        assert key not in shown(r)
    assert key not in metrics
    spans = [s.name + json.dumps(dict(s.attributes or {})) for s in exporter.get_finished_spans()]
    assert spans and not [s for s in spans if key in s]
    assert log_lines.lines and not [line for line in log_lines.lines if key in line]
    for path in tmp_path.glob("s.db*"):  # the ledger (and the threads) in the store
        assert key.encode() not in path.read_bytes()
    found = labels(metrics)
    assert found["class"] <= ERROR_CLASSES, found["class"] - ERROR_CLASSES
    assert found["outcome"] <= OUTCOMES, found["outcome"] - OUTCOMES


async def test_metric_labels_take_no_invented_values(
    harness_factory: type[Harness], upstream: ScriptedServer, tmp_path: Path
) -> None:
    h = await harness_factory().start()
    assert h.http is not None
    for method in ("BREW", "X-" + uuid.uuid4().hex[:8].upper()):
        r = await h.http.request(method, "/v1/models")
        assert r.status_code == 405
    await h.http.post("/v1/chat/completions", content=b"{")
    found = labels((await h.http.get("/metrics")).text)
    assert found["method"] <= METHODS | {OTHER}, found["method"]
    assert OTHER in found["method"]
    assert all(c in ERROR_CLASSES or re.fullmatch(r"http_\d{3}", c) for c in found["class"])


def _codes_in(path: Path) -> Iterator[str]:
    """Every error code written out in a module of svir's: `code=` arguments and defaults, the
    code of a ClientError or BadRequest built in place, `"code": ...` in a dict, and what is put
    in a request's `error` log field."""
    tree = ast.parse(path.read_text())

    def literal(node: ast.AST | None) -> Iterator[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.IfExp):
            yield from literal(node.body)
            yield from literal(node.orelse)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            for kw in node.keywords:
                if kw.arg == "code":
                    yield from literal(kw.value)
            if name in ("ClientError", "BadRequest", "_bad") and len(node.args) >= 3:
                yield from literal(node.args[2])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = [
                *zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True),
                *zip(a.kwonlyargs, a.kw_defaults, strict=True),
            ]
            for arg, default in pairs:
                if arg.arg == "code":
                    yield from literal(default)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "code":
                    yield from literal(v)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                    if target.slice.value == "error":
                        yield from literal(node.value)


def test_every_error_code_svir_answers_with_is_a_metric_class() -> None:
    root = Path(svir.__file__).parent
    codes = {code for path in root.rglob("*.py") for code in _codes_in(path)}
    assert len(codes) > 30  # the scan finds what it is meant to
    assert codes <= OWN_ERRORS, (
        f"add to svir.edges.metrics.OWN_ERRORS: {sorted(codes - OWN_ERRORS)}"
    )
    types = {"invalid_request_error", "rate_limit_error", "insufficient_quota", "server_error"}
    assert OWN_ERRORS - types <= codes, f"no longer in svir: {sorted(OWN_ERRORS - types - codes)}"


async def test_svirs_own_hints_survive_redaction(
    harness_factory: type[Harness], upstream: ScriptedServer
) -> None:
    h = await harness_factory().start()
    await h.new_key()
    r = await h.chat(None)
    assert r.status_code == 401
    hint = "send it as 'Authorization: Bearer <key>'"
    assert hint in r.json()["error"]["message"]
    # What svir's own client (`svir models`, `svir chat`) reads of that answer.
    assert hint in classify_http_error(r.status_code, dict(r.headers), r.content).message
    # An upstream's words pass the same redaction: the placeholder stays, a real token goes.
    secret, _ = await h.new_key(name="user")
    for stream in (True, False):
        r = await h.chat(secret, "fake/echo-bearer-400", stream=stream)
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "'Authorization: Bearer <key>'" in message
        assert "'Authorization: Bearer [redacted]'" in message
        assert FOREIGN_TOKEN not in r.text
