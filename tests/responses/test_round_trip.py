"""A Codex turn both ways through the wire core: its request translated (h16's request side), the
model's answer encoded as the Responses stream, and the output items sent back on the next turn
as a stateless client does; the namespace call and the sealed reasoning come back as the
upstream needs them."""

from __future__ import annotations

import functools
import itertools
from typing import Any

from svir.protocols.responses.encode import ResponseStreamEncoder
from svir.protocols.responses.request import translate_request
from svir.protocols.responses.sealed import seal_reasoning, unseal_reasoning
from svir.wire.events import (
    Done,
    Finish,
    ReasoningDelta,
    Role,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from tests.responses.sdk import check_codex, check_grammar, frames, stream
from tests.responses.test_request import NAMESPACE, user

KEY = bytes(range(32))


def body(*items: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "lab/m",
        "input": list(items),
        "tools": [NAMESPACE],
        "stream": True,
        "store": False,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "parallel_tool_calls": True,
    }


def test_a_codex_turn_round_trips() -> None:
    nonces = (i.to_bytes(12, "big") for i in itertools.count(1))

    def seal(text: str) -> str:
        return seal_reasoning(KEY, text, nonce=next(nonces))

    first = translate_request(body(user("read a")))
    assert first.include_encrypted and first.summary == "auto"
    (flat,) = [f for f, spaced in first.names.items() if spaced == ("mcp__files__", "read")]
    enc = ResponseStreamEncoder(
        id="resp_t1",
        model="lab/m",
        created_at=1,
        echo=first.echo,
        summary=first.summary,
        names=first.names,
        seal=seal if first.include_encrypted else None,
    )
    events = [
        Role("assistant", "up", "m", 0),
        ReasoningDelta("I should read a.", "reasoning_content"),
        TextDelta("Reading."),
        ToolCallStart(0, "call_1", flat),
        ToolCallDelta(0, '{"path": "a"}'),
        Finish("tool_calls"),
        Done(),
    ]
    raw = enc.start() + b"".join(enc.encode(e) for e in events)
    got = check_grammar(raw)
    check_codex(got)
    assert got[-1]["response"]["reasoning"]["summary"] == "auto"
    assert got[-1]["response"]["store"] is False
    final = stream(raw).final
    rs, _, fc = enc.output_items
    assert rs["encrypted_content"].startswith("svir1.")
    assert (fc["namespace"], fc["name"]) == ("mcp__files__", "read")
    assert final.output[2].call_id == "call_1"
    # The next turn: Codex sends the items back (its reasoning item with the token), and the
    # tool's output.
    back = [{k: v for k, v in item.items() if k != "status"} for item in enc.output_items]
    second = translate_request(
        body(
            user("read a"),
            *back,
            {"type": "function_call_output", "call_id": "call_1", "output": "contents of a"},
        ),
        unseal=functools.partial(unseal_reasoning, KEY),
    )
    assistant = [m for m in second.chat["messages"] if m["role"] == "assistant"]
    assert len(assistant) == 1
    (turn,) = assistant
    assert turn["reasoning_content"] == "I should read a."  # restored from the sealed token
    assert turn["content"] == "Reading."
    (tool_call,) = turn["tool_calls"]
    assert tool_call["function"]["name"] == flat  # the namespace call as the upstream named it
    assert tool_call["id"] == "call_1"
    assert frames(raw)[-1]["type"] == "response.completed"
