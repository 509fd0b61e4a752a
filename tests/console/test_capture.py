"""Capture (`[capture]`): off, nothing is stored and nothing is wrapped; on, a request's four
panes are stored with the real bytes and no secret, bounded in size and age, read by any worker
on the store (SQLite and PostgreSQL), and a captured stream downloads as a conformance case the
corpus test takes."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import openai
import pytest

from svir.store.captures import CaptureRecord, CaptureStore
from svir.store.sqlite import SqliteStore
from tests.conformance.summary import decode, matches, summarize
from tests.conformance.test_decoder_corpus import CORPUS
from tests.console.observe_support import (
    ADMIN,
    BASE,
    CLIENT_TOKEN,
    UP_KEY,
    Svir,
    capture_config,
)
from tests.support.mock_transport import MockTransport
from tests.support.upstream import PROMPT_TOKENS, token_stream

SECRETS = (UP_KEY, CLIENT_TOKEN, ADMIN)


async def stored_rows(svir: Svir) -> list[dict[str, Any]]:
    """Every capture row as the store holds it, each column's value."""
    store = svir.console.service.store
    assert store is not None
    async with store.transaction(write=False) as tx:
        rows = await tx.fetch("SELECT * FROM captures ORDER BY pk")
    return [dict(row) for row in rows]  # type: ignore[call-overload]


def no_secret_in(text: str | bytes) -> None:
    for secret in SECRETS:
        needle = secret.encode() if isinstance(text, bytes) else secret
        assert needle not in text, f"a secret ({secret[:6]}...) was kept"


async def test_capture_off_stores_nothing_and_wraps_nothing(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        rid = await svir.chat("up/tok-3")
        await svir.settled()
        assert svir.console.capturer is None
        assert (await svir.admin("/admin/console/session")).json()["capture"] is False
        assert type(svir.app.gateway.policy.client) is MockTransport
        assert await stored_rows(svir) == []
        body = (await svir.admin(f"/admin/requests/{rid}")).json()
        assert body["capture"] is None
        assert body["rows"][0]["status"] == "ok"
        answer = await svir.admin(f"/admin/requests/{rid}/conformance")
        assert answer.status_code == 404


async def test_capture_keeps_the_four_panes_with_the_real_bytes_and_no_secret(
    tmp_path: Path,
) -> None:
    async with Svir(tmp_path, capture_config()) as svir:
        # Nothing swapped in place: each captured call taps the transport (Capture.tap).
        assert type(svir.app.gateway.policy.client) is MockTransport
        assert (await svir.admin("/admin/console/session")).json()["capture"] is True
        # The client's own token in its body too: a credential is redacted wherever it is.
        rid = await svir.chat("up/tok-5", content=f"my token is {CLIENT_TOKEN}")
        await svir.settled()
        answer = await svir.admin(f"/admin/requests/{rid}")
        assert answer.status_code == 200
        capture = answer.json()["capture"]
        assert capture["truncated"] is False
        assert capture["provider"] == "up" and capture["server"] == "openai-compatible"
        # The client's request.
        client = capture["client_request"]
        headers = {k.lower(): v for k, v in client["headers"]}
        assert headers["authorization"] == "[redacted]"
        sent = json.loads(client["body"])
        assert sent["model"] == "up/tok-5"
        assert sent["messages"][0]["content"] == "my token is [redacted]"
        # What svir sent upstream.
        upstream = capture["upstream_request"]
        assert upstream["url"] == f"{BASE}/chat/completions"
        up_headers = {k.lower(): v for k, v in upstream["headers"]}
        assert up_headers["authorization"] == "[redacted]"
        assert up_headers["x-request-id"] == rid
        body = json.loads(upstream["body"])
        assert body["model"] == "tok-5" and body["stream"] is True
        assert body["messages"][0]["content"] == "my token is [redacted]"
        # The upstream's raw stream: exactly what it sent.
        expected = b"".join(
            token_stream("tok-5", [f"w{i} " for i in range(5)], usage=(PROMPT_TOKENS, 5))
        )
        assert capture["upstream_stream"] == expected.decode()
        assert capture["upstream_status"] == 200
        # What svir sent the client: its canonical stream, to the end.
        assert capture["client_status"] == 200
        stream = capture["client_stream"]
        assert '"content":"w0 "' in stream and stream.endswith("data: [DONE]\n\n")
        no_secret_in(answer.text)
        for row in await stored_rows(svir):
            for value in row.values():
                if isinstance(value, str | bytes):
                    no_secret_in(value)


async def test_a_secret_the_upstream_echoes_is_redacted_in_every_pane(tmp_path: Path) -> None:
    async with Svir(tmp_path, capture_config()) as svir:
        # The fake server quotes the key it was sent in its stream's error.
        with pytest.raises(Exception, match="credential was"):
            await svir.chat("up/echo-stream")
        await svir.settled()
        [row] = await stored_rows(svir)
        assert b"credential was [redacted]" in bytes(row["upstream_stream"])
        for value in row.values():
            if isinstance(value, str | bytes):
                no_secret_in(value)
        answer = await svir.admin(f"/admin/requests/{row['request_id']}")
        no_secret_in(answer.text)


async def test_a_capture_is_bounded_and_says_it_was_cut(tmp_path: Path) -> None:
    async with Svir(tmp_path, capture_config(max_body_bytes=1024)) as svir:
        rid = await svir.chat("up/tok-300")
        await svir.settled()
        [row] = await stored_rows(svir)
        assert row["truncated"] == 1
        assert len(bytes(row["upstream_stream"])) == 1024
        assert len(bytes(row["client_stream"])) == 1024
        assert bytes(row["upstream_stream"]).startswith(b'data: {"id":"chatcmpl-fake"')
        capture = (await svir.admin(f"/admin/requests/{rid}")).json()["capture"]
        assert capture["truncated"] is True
        # A short one is whole.
        small = await svir.chat("up/tok-1")
        await svir.settled()
        capture = (await svir.admin(f"/admin/requests/{small}")).json()["capture"]
        assert capture["truncated"] is False


async def test_captures_are_pruned_by_age_and_by_count(tmp_path: Path) -> None:
    async with Svir(tmp_path, capture_config(max_age=60, max_rows=2)) as svir:
        now = [1_000_000.0]
        svir.console.clock = lambda: now[0]
        old = await svir.chat("up/tok-1")
        await svir.settled()
        assert (await svir.admin(f"/admin/requests/{old}")).json()["capture"] is not None
        now[0] += 61  # older than max_age: no longer shown, and deleted by the next write
        assert (await svir.admin(f"/admin/requests/{old}")).json()["capture"] is None
        fresh = [await svir.chat("up/tok-1") for _ in range(3)]
        await svir.settled()
        rows = await stored_rows(svir)
        assert [r["request_id"] for r in rows] == fresh[1:]  # max_rows = 2: the newest two


async def test_the_capture_store_prunes_by_its_clock(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    await store.open()
    try:
        now = [100.0]
        captures = CaptureStore(store, max_rows=10, max_age=30, clock=lambda: now[0])

        def record(rid: str) -> CaptureRecord:
            return CaptureRecord(
                request_id=rid, created_at=now[0], api="openai", provider="p", model="m",
                server="openai", options={}, client_headers=[], client_body=b"{}",
                upstream_url=None, upstream_headers=[], upstream_body=b"", upstream_status=None,
                upstream_stream=b"data: x\n\n", client_status=200, client_stream=b"",
                truncated=False,
            )  # fmt: skip

        first = record("a")
        await captures.put(first)
        now[0] = 120.0
        await captures.put(record("b"))
        assert await captures.get("a") == first
        now[0] = 131.0  # a is 31 s old, b 11 s
        assert await captures.get("a") is None
        assert await captures.prune() == 1
        assert await captures.count() == 1
        assert (await captures.get("b")) is not None
    finally:
        await store.close()


async def test_a_capture_written_by_one_worker_is_read_by_another(tmp_path: Path) -> None:
    async with (
        Svir(tmp_path, capture_config()) as one,
        Svir(tmp_path, capture_config()) as two,
    ):
        rid = await one.chat("up/tok-4")
        await one.settled()
        answer = (await two.admin(f"/admin/requests/{rid}")).json()
        assert answer["live"] is None  # the other worker served it
        assert answer["rows"][0]["completion_tokens"] == 4
        assert "w3 " in answer["capture"]["upstream_stream"]


async def test_a_capture_is_shared_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    async with (
        Svir(tmp_path / "1", capture_config(), store=pg_url) as one,
        Svir(tmp_path / "2", capture_config(), store=pg_url) as two,
    ):
        rid = await one.chat("up/tok-4", content=CLIENT_TOKEN)
        await one.settled()
        answer = await two.admin(f"/admin/requests/{rid}")
        body = answer.json()
        assert body["live"] is None
        assert "w3 " in body["capture"]["upstream_stream"]
        no_secret_in(answer.text)
        history = (await two.admin("/admin/requests", model="up/tok-4")).json()["data"]
        assert [r["request_id"] for r in history] == [rid]
        zipped = await two.admin(f"/admin/requests/{rid}/conformance")
        assert zipped.status_code == 200


def unpack(data: bytes, into: Path) -> list[Path]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(into)
        return [into / name for name in archive.namelist()]


@pytest.mark.parametrize("case", ["llama-cpp", "mlx-lm", "azure-async-flagged", "truncated"])
async def test_a_captured_stream_downloads_as_a_conformance_case(tmp_path: Path, case: str) -> None:
    async with Svir(tmp_path, capture_config()) as svir:
        try:
            rid = await svir.chat(f"up/{case}")
        except openai.APIError:  # a cut stream ends the SDK's iteration with an error
            rid = (await svir.admin("/admin/requests")).json()["data"][0]["request_id"]
        await svir.settled()
        answer = await svir.admin(f"/admin/requests/{rid}/conformance")
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/zip"
        assert "attachment" in answer.headers["content-disposition"]
        corpus = tmp_path / "corpus"
        files = sorted(unpack(answer.content, corpus))
        name = f"capture-{rid}"
        assert files == [corpus / "decoder" / f"{name}.json", corpus / "decoder" / f"{name}.sse"]
        raw = files[1].read_bytes()
        spec = json.loads(files[0].read_text())
        # The case is the recorded stream, byte for byte...
        assert raw == (CORPUS / f"{case}.sse").read_bytes()
        # ...the corpus test's decoder reproduces what it expects, whole and byte by byte...
        for chunks in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
            got = summarize(decode(chunks, spec["options"], spec["server"]))
            assert matches(got, spec["expect"]) == []
        # ...and it expects what the corpus's own hand-written file does.
        written = json.loads((CORPUS / f"{case}.json").read_text())
        assert matches(spec["expect"], written["expect"]) == []
        assert set(spec) == {"server", "proves", "options", "expect"}


async def test_no_conformance_case_without_an_upstream_stream(tmp_path: Path) -> None:
    async with Svir(tmp_path, capture_config()) as svir:
        with pytest.raises(openai.InternalServerError):
            await svir.chat("alt/always-503")
        await svir.settled()
        rid = (await svir.admin("/admin/requests")).json()["data"][0]["request_id"]
        capture = (await svir.admin(f"/admin/requests/{rid}")).json()["capture"]
        assert capture["upstream_status"] == 503 and capture["upstream_stream"] == ""
        answer = await svir.admin(f"/admin/requests/{rid}/conformance")
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "invalid_request"
