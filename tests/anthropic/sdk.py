"""The official Anthropic SDK as the test client of svir's Messages wire core: svir's bytes are
the answer of an in-memory transport (no server, no socket), and what the SDK assembles from
them is what a real client gets. Also a checker of the stream's grammar."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2

from svir.protocols.anthropic.encode import MessageStreamEncoder, stop_reason
from svir.providers.anthropic_dialect import tool_input
from svir.wire.events import Event

REQUEST: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}


def client(
    status: int, body: bytes, content_type: str = "text/event-stream"
) -> anthropic.Anthropic:
    """A client whose every request is answered with `status` and `body`, and not retried."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    return anthropic.Anthropic(
        api_key="x",
        base_url="http://svir.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
    )


def encode(events: Iterable[Event], *, input_tokens: int = 0) -> bytes:
    enc = MessageStreamEncoder(id="req1", model="claude-test", input_tokens=input_tokens)
    return b"".join(enc.encode(e) for e in events)


@dataclass
class Streamed:
    """What `messages.stream` made of a body: the final message, or the error it raised with
    the snapshot assembled until then."""

    message: Any
    error: Exception | None
    texts: list[str]


def stream(body: bytes) -> Streamed:
    texts: list[str] = []
    with client(200, body).messages.stream(**REQUEST) as s:
        try:
            for event in s:
                if event.type == "text":
                    texts.append(event.text)
            return Streamed(s.get_final_message(), None, texts)
        except anthropic.APIStatusError as exc:
            # Before message_start there is no snapshot at all.
            snapshot = s._MessageStream__final_message_snapshot  # type: ignore[attr-defined]
            return Streamed(snapshot, exc, texts)


def blocks(message: Any, kind: str) -> list[Any]:
    return [b for b in message.content if b.type == kind] if message is not None else []


def text_of(message: Any) -> str:
    return "".join(b.text for b in blocks(message, "text"))


def thinking_of(message: Any) -> str:
    return "".join(b.thinking for b in blocks(message, "thinking"))


def frames(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The stream as (event name, data) pairs; each frame must be exactly `event:` then `data:`."""
    out = []
    assert body.endswith(b"\n\n") or not body
    for raw in body.decode().split("\n\n")[:-1]:
        head, data = raw.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), raw
        name, payload = head[7:], json.loads(data[6:])
        assert payload["type"] == name, raw
        out.append((name, payload))
    return out


# Each block type and the deltas it takes: a thinking block's signature_delta is its last one;
# a redacted_thinking block comes whole in its start and takes none (Anthropic's streaming
# reference, and the SDK's accumulator, which knows no delta for it).
_DELTAS_FOR: dict[str, tuple[str, ...]] = {
    "text": ("text_delta",),
    "thinking": ("thinking_delta", "signature_delta"),
    "tool_use": ("input_json_delta",),
    "redacted_thinking": (),
}
_DELTA_FIELD = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}


def check_grammar(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Assert that the stream is a well-formed Anthropic event sequence, and return its frames:
    one message_start first (unless it is only an error), blocks numbered from 0 opened one at a
    time, each delta of its block's type and not empty, no empty text or thinking block, a delta
    in every tool_use block, a thinking block's signature its last delta, a redacted_thinking
    block whole (its data at its start, no delta), and at the end message_delta (no block open)
    then message_stop, or one error; nothing after. The stop_reason is tool_use exactly when a
    tool_use block went out."""
    got = frames(body)
    names = [n for n, _ in got]
    assert names.count("message_start") <= 1
    if names == ["error"]:
        return got
    assert names[0] == "message_start", names[:3]
    open_kind: str | None = None
    index = -1
    deltas = 0
    signed = False
    tool_use = False
    ended = False
    for name, data in got[1:]:
        assert not ended, f"{name} after the end"
        if name == "content_block_start":
            assert open_kind is None, "a block opened inside another"
            index += 1
            assert data["index"] == index
            block = data["content_block"]
            open_kind = block["type"]
            assert open_kind in _DELTAS_FOR, open_kind
            if open_kind == "tool_use":
                assert block["input"] == {}
                tool_use = True
            elif open_kind == "thinking":
                assert block["thinking"] == "" and block["signature"] == ""
            elif open_kind == "redacted_thinking":
                assert isinstance(block["data"], str) and block["data"]
            deltas = 0
            signed = False
        elif name == "content_block_delta":
            assert open_kind is not None and data["index"] == index
            kind = data["delta"]["type"]
            assert kind in _DELTAS_FOR[open_kind], (open_kind, data)
            assert not signed, "a delta after the thinking block's signature"
            if kind in _DELTA_FIELD:
                assert data["delta"][_DELTA_FIELD[kind]] != ""
            signed = kind == "signature_delta"
            deltas += 1
        elif name == "content_block_stop":
            assert open_kind is not None and data["index"] == index
            if open_kind != "redacted_thinking":
                assert deltas >= 1, f"an empty {open_kind} block"
            open_kind = None
        elif name == "message_delta":
            assert open_kind is None, "message_delta with a block open"
            assert (data["delta"]["stop_reason"] == "tool_use") == tool_use
            usage = data["usage"]
            assert usage["input_tokens"] >= 0 and usage["output_tokens"] >= 0
        elif name == "message_stop":
            assert names[-2] == "message_delta"
            ended = True
        elif name == "error":
            ended = True
        else:
            assert name == "ping", name
    assert ended, "the stream did not end"
    return got


def check_as_expected(expect: dict[str, Any], message: Any, error: Exception | None) -> None:
    """Assert that what the SDK assembled (`message`, or the snapshot until `error`) is what a
    conformance corpus case expects (its `expect`): text, reasoning, tool calls, stop reason and
    usage; or, for a stream that fails, an APIStatusError raised with what came before it."""
    calls = [(c["id"], c["name"], tool_input(c["arguments"])) for c in expect["tool_calls"]]
    assembled = [(b.id, b.name, b.input) for b in blocks(message, "tool_use")]
    if expect["error"] is None:
        assert error is None, error
        assert text_of(message) == expect["answer"] + (expect["refusal"] or "")
        assert thinking_of(message) == expect["reasoning"]
        # Blocks come in the order the calls started (a stream cannot go back), which is not
        # always the calls' index order (interleaved-tools starts index 1 first).
        assert sorted(assembled, key=str) == sorted(calls, key=str)
        assert message.stop_reason == stop_reason(expect["finish_reason"], tool_use=bool(calls))
        usage = expect["usage"]
        if usage is not None:
            cached = usage["cached_tokens"] or 0
            assert message.usage.input_tokens == usage["prompt_tokens"] - cached
            assert message.usage.output_tokens == usage["completion_tokens"]
            assert message.usage.cache_read_input_tokens == usage["cached_tokens"]
    else:
        # A failed stream raises, with what streamed before the failure assembled.
        assert isinstance(error, anthropic.APIStatusError)
        assert expect["answer"].startswith(text_of(message))
        assert expect["reasoning"].startswith(thinking_of(message))
