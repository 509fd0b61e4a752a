"""The official OpenAI SDK as the test client of svir's Responses wire core: svir's bytes are the
answer of an in-memory transport (no server, no socket), and what the SDK's `responses.stream`
accumulator makes of them is what a real client gets. Also a checker of the stream's grammar."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai

from svir.protocols.responses.encode import ResponseStreamEncoder
from svir.wire.events import Event

REQUEST: dict[str, Any] = {"model": "gpt-test", "input": "hi"}


def client(body: bytes) -> openai.OpenAI:
    """A client whose every request is answered with `body` as an SSE stream, not retried."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return openai.OpenAI(
        api_key="x",
        base_url="http://svir.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )


def encoder(
    *,
    summary: str | None = None,
    names: Mapping[str, tuple[str, str]] | None = None,
    seal: Callable[[str], str] | None = None,
    echo: Mapping[str, Any] | None = None,
) -> ResponseStreamEncoder:
    return ResponseStreamEncoder(
        id="resp_req1",
        model="gpt-test",
        created_at=1700000000,
        echo=echo or {},
        summary=summary,
        names=names or {},
        seal=seal,
    )


def encode(events: Iterable[Event], enc: ResponseStreamEncoder | None = None) -> bytes:
    enc = enc or encoder()
    return enc.start() + b"".join(enc.encode(e) for e in events) + enc.close()


@dataclass
class Streamed:
    """What `responses.stream` made of a body: the final response (None when the stream did not
    complete), the last lifecycle event's response, and the events the helper gave."""

    final: Any
    last: Any
    events: list[Any] = field(default_factory=list)

    def of(self, type: str) -> list[Any]:
        return [e for e in self.events if e.type == type]


def stream(body: bytes) -> Streamed:
    events: list[Any] = []
    with client(body).responses.stream(**REQUEST) as s:
        for event in s:
            events.append(event)
        final = (
            s.get_final_response() if any(e.type == "response.completed" for e in events) else None
        )
    ends = [
        e
        for e in events
        if e.type in ("response.completed", "response.incomplete", "response.failed")
    ]
    return Streamed(final, ends[-1].response if ends else None, events)


def frames(body: bytes) -> list[dict[str, Any]]:
    """The stream's events; each frame must be exactly `event:` then `data:` naming its type."""
    out = []
    assert body.endswith(b"\n\n")
    for raw in body.decode().split("\n\n")[:-1]:
        head, data = raw.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), raw
        payload = json.loads(data[6:])
        assert payload["type"] == head[7:], raw
        out.append(payload)
    return out


_ENDS = ("response.completed", "response.incomplete", "response.failed")


def check_grammar(body: bytes) -> list[dict[str, Any]]:
    """Assert that the stream is a well-formed Responses event sequence, and return its events:
    created then in_progress first, sequence numbers 0, 1, 2, … , items one at a time numbered
    from 0 (added, its own events naming it, done with the same id), every added item done
    unless the stream failed, no empty text part, and exactly one end, last."""
    got = frames(body)
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [e["type"] for e in got[:2]] == ["response.created", "response.in_progress"]
    assert [e["type"] for e in got].count("response.created") == 1
    open_item: dict[str, Any] | None = None
    index = -1
    for e in got[2:-1]:
        t = e["type"]
        assert t not in _ENDS and t != "response.created", t
        if t == "response.in_progress":
            continue
        if t == "response.output_item.added":
            assert open_item is None, "an item opened inside another"
            index += 1
            assert e["output_index"] == index
            open_item = e["item"]
            assert open_item["id"].startswith(
                {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[open_item["type"]]
            )
            continue
        assert open_item is not None and e["output_index"] == index, e
        if t == "response.output_item.done":
            assert e["item"]["id"] == open_item["id"] and e["item"]["type"] == open_item["type"]
            assert e["item"]["status"] in ("completed", "incomplete")
            open_item = None
            continue
        assert e["item_id"] == open_item["id"], e
        if t in ("response.output_text.delta", "response.refusal.delta"):
            assert e["delta"] != ""
    last = got[-1]
    assert last["type"] in _ENDS, last["type"]
    if last["type"] != "response.failed":
        assert open_item is None, "the stream ended with an item open"
    assert last["response"]["status"] == last["type"].split(".")[1]
    return got


def check_codex(events: list[dict[str, Any]]) -> None:
    """Assert that Codex's parser takes every item and the end (codex-rs `protocol/src/models.rs`
    `ResponseItem`, `codex-api/src/sse/responses.rs`): an item it cannot read it skips without a
    word, so each must have the fields its type requires there; `response.completed` needs the
    response's `id` and, if present, usage with its four counts."""
    for e in events:
        if e["type"] in ("response.output_item.added", "response.output_item.done"):
            item = e["item"]
            if item["type"] == "message":
                assert isinstance(item["role"], str) and isinstance(item["content"], list)
                for part in item["content"]:
                    # Codex's ContentItem has output_text (a refusal part it would not read).
                    assert part["type"] in ("output_text", "refusal")
                    assert isinstance(part.get("text", part.get("refusal")), str)
            elif item["type"] == "reasoning":
                assert isinstance(item["summary"], list)  # required, no default
                for p in item["summary"]:
                    assert p["type"] == "summary_text" and isinstance(p["text"], str)
                for c in item.get("content") or []:
                    assert c["type"] == "reasoning_text" and isinstance(c["text"], str)
                assert isinstance(item.get("encrypted_content"), str | None)
            else:
                assert item["type"] == "function_call"
                assert isinstance(item["name"], str) and item["name"]
                assert isinstance(item["arguments"], str)  # a string of JSON, never an object
                assert isinstance(item["call_id"], str) and item["call_id"]
                assert isinstance(item.get("namespace", ""), str)
        elif e["type"] == "response.completed":
            assert isinstance(e["response"]["id"], str)
            usage = e["response"]["usage"]
            if usage is not None:
                for key in ("input_tokens", "output_tokens", "total_tokens"):
                    assert isinstance(usage[key], int)
                assert isinstance(usage["input_tokens_details"]["cached_tokens"], int)
                assert isinstance(usage["output_tokens_details"]["reasoning_tokens"], int)
        elif e["type"] == "response.failed":
            error = e["response"]["error"]
            assert isinstance(error["code"], str) and isinstance(error["message"], str)
        elif e["type"] in (
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_part.added",
        ):
            assert isinstance(e["summary_index"], int)
        elif e["type"] == "response.reasoning_text.delta":
            assert isinstance(e["content_index"], int)
