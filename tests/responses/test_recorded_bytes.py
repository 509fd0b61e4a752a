"""The Responses path writes, byte for byte, what it wrote when `recorded/digests.json` was made:
for each of a few thousand generated cases (a request body, translated; the encoder it makes; a
run of events, keep-alives and looks at the response object, and an end), a digest of the
translation, every byte of the stream and each response object taken. The cases come from a
seeded generator, so the recording holds only their digests; a change of the encoder or of the
translation that moves one byte fails here, naming the case.

What this catches is change, not wrongness: the digests are of svir's own output, written by
running this file (`python -m tests.responses.test_recorded_bytes`) from a tree taken to be right,
so a bug present when they were written is recorded as right. The judges of right are elsewhere
and independent of svir: the official SDK's stream accumulator over svir's bytes
(tests/responses/test_stream.py, test_sdk.py), the recorded servers of the conformance corpus
(test_corpus.py), and real clients (the Agents SDK in test_agents.py, Codex in test_codex.py).
When a change moves bytes on purpose, check it there first, then write the digests anew."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import msgspec

from svir.protocols.responses.checks import ResponsesRequestError
from svir.protocols.responses.encode import ResponseStreamEncoder
from svir.protocols.responses.request import translate_request
from svir.wire import events as ev
from svir.wire.classify import ClientError
from svir.wire.errors import ErrorKind, UpstreamError

RECORDING = Path(__file__).parent / "recorded" / "digests.json"
CASES = 3000

TEXTS = ["", "a", "Hi", " there", "é\n", '"q"', "\\", "\u2028", "😀", "long " * 30, "<b>&"]
TOOLS = [
    {"type": "function", "name": "f", "parameters": {"type": "object"}},
    {"type": "function", "name": "g", "description": "G", "strict": True},
    {"type": "namespace", "name": "ns", "description": "N",
     "tools": [{"type": "function", "name": "g"}, {"type": "function", "name": "h"}]},
    {"type": "web_search"},
]  # fmt: skip
INPUTS: list[Any] = [
    "Say hello in a few words.",
    [{"role": "user", "content": "Say hello in a few words."}],
    [{"type": "message", "role": "developer", "content": "Be brief."},
     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    [{"role": "user", "content": "go"},
     {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
     {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "call_0", "output": "ok"},
     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "x", "id": "msg_given"}, {"type": "item_reference", "id": "msg_given"}],
]  # fmt: skip
# Bodies the translation refuses, now and then, so that its errors are recorded too.
BAD: list[tuple[str, Any]] = [
    ("input", [{"type": "function_call_output", "call_id": "nobody", "output": "ok"}]),
    ("input", []), ("input", 5), ("model", ""), ("instructions", 3), ("tools", "x"),
    ("tool_choice", "bad"), ("metadata", {"k": 1}), ("reasoning", {"effort": "bogus"}),
]  # fmt: skip
FIELDS: dict[str, list[Any]] = {
    "instructions": [None, "", "Be brief."],
    "tools": [None, [], TOOLS[:1], TOOLS, TOOLS],
    "tool_choice": [None, "auto", "required"],
    "temperature": [None, 0, 0.5, 1],
    "top_p": [None, 0.9],
    "max_output_tokens": [None, 100],
    "metadata": [None, {}, {"k": "v"}],
    "parallel_tool_calls": [None, False, True],
    "text": [None, {"format": {"type": "text"}}, {"verbosity": "low"},
             {"format": {"type": "json_object"}}],
    "reasoning": [None, {"effort": "low"}, {"summary": "auto"}, {"generate_summary": "concise"}],
    "truncation": [None, "auto"],
    "user": [None, "u1"],
    "safety_identifier": [None, "s1"],
    "prompt_cache_key": [None, "k1"],
    "store": [None, False, True],
    "stream": [None, True, False],
    "service_tier": [None, "flex"],
    "background": [None, False],
    "top_logprobs": [None, 2],
    "max_tool_calls": [None, 3],
    "include": [None, ["reasoning.encrypted_content"], []],
    "previous_response_id": [None, "resp_prev"],
    "whatever": [None, 1],
}  # fmt: skip


def body(rng: random.Random) -> Any:
    if rng.random() < 0.01:
        return rng.choice([None, [], "x"])
    out: dict[str, Any] = {"model": rng.choice(["m", "fake/stream-20"])}
    if rng.random() < 0.99:
        out["input"] = rng.choice(INPUTS)
    fields = list(FIELDS)
    rng.shuffle(fields)
    for key in fields[: rng.randint(0, 8)]:
        value = rng.choice(FIELDS[key])
        if value is not None or rng.random() < 0.3:
            out[key] = value
    if out.get("tool_choice") == "required" and out.get("tools") == TOOLS:
        out["tool_choice"] = {"type": "function", "name": "f"}
    if rng.random() < 0.05:
        key, value = rng.choice(BAD)
        out[key] = value
    return out


def event(rng: random.Random) -> ev.Event:
    pick = rng.randint(0, 16)
    if pick < 5:
        return ev.TextDelta(rng.choice(TEXTS))
    if pick < 7:
        return ev.ReasoningDelta(rng.choice(TEXTS), rng.choice(["reasoning_content", "think"]))
    if pick == 7:
        return ev.RefusalDelta(rng.choice(TEXTS))
    if pick == 8:
        return ev.ToolCallStart(
            rng.randint(0, 2), rng.choice(["", "call_0", "c1"]), rng.choice(["f", "ns__g"])
        )
    if pick < 11:
        return ev.ToolCallDelta(rng.randint(0, 2), rng.choice(["", "{", '"a": 1', "}"]))
    if pick == 11:
        return ev.Finish(rng.choice(["stop", "length", "tool_calls", "content_filter"]))
    if pick == 12:
        return ev.Usage(rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 18),
                     *rng.choice([(), (3,), (None, 2)]))  # fmt: skip
    return rng.choice([
        ev.Role("assistant", "up-1", "m", 0), ev.Keepalive(""), ev.ReasoningSignature("sig"),
        ev.RedactedReasoning("opaque"), ev.ContentFilter("completion", False, (), {}),
    ])  # fmt: skip


def run(case: int) -> bytes:
    """Everything the case wrote, as one byte string."""
    rng = random.Random(case)
    raw = body(rng)
    made = iter(range(10_000))
    try:
        t = translate_request(
            raw,
            history=[],
            unseal=lambda token: "unsealed" if token == "ok" else None,
            new_id=lambda prefix: f"{prefix}_{next(made)}",
        )
    except ResponsesRequestError as exc:
        return f"error {exc.param} {exc.message}".encode()
    echo = t.echo
    echo["previous_response_id"] = t.previous_response_id  # as main's front end set it
    # The echo's order is the translation's own (its effect is in the stream's bytes).
    out = [msgspec.json.encode(msgspec.structs.replace(t, echo=dict(sorted(echo.items()))))]
    if rng.random() < 0.1:  # an echo of another order, and one with fields the encoder owns
        echo = dict(reversed(echo.items())) if rng.random() < 0.5 else {**echo, "status": "x"}
    enc = ResponseStreamEncoder(
        id=rng.choice(["resp_abc", "plain"]),
        model=rng.choice(["m", "fake/stream-20", "é"]),
        created_at=rng.choice([1700000000, 1700000000.7]),
        echo=echo,
        summary=t.summary,
        names={"ns__g": ("ns", "g")},
        seal=(lambda text: text[::-1]) if t.include_encrypted else None,
        taken_call_ids=rng.choice([(), ("c1",)]),
    )
    if rng.random() < 0.25:  # the common answer: text, a finish, usage, the end
        out.append(enc.start())
        for text in [TEXTS[1 + rng.randint(0, 9)] for _ in range(rng.randint(1, 25))]:
            out.append(enc.encode(ev.TextDelta(text)))
        out.append(enc.encode(ev.Finish(rng.choice(["stop", "stop", "length"]))))
        out.append(enc.encode(ev.Usage(20, 20, 40)) + enc.encode(ev.Done()))
    for _ in range(rng.randint(0, 30)):
        look = rng.random()
        if look < 0.04:
            out.append(msgspec.json.encode(enc.response))
        elif look < 0.08:
            out.append(msgspec.json.encode(enc.output_items))
        elif look < 0.12:
            out.append(enc.keepalive())
        elif look < 0.14:
            out.append(enc.start())
        else:
            out.append(enc.encode(event(rng)))
    end = rng.random()
    if end < 0.7:
        out.append(enc.encode(ev.Done()))
    elif end < 0.8:
        error = UpstreamError(
            ErrorKind.RATE_LIMITED, "slow down", retry_after=rng.choice([None, 7])
        )
        out.append(enc.encode(ev.StreamError(error)))
    elif end < 0.9:
        ce = ClientError(
            400, "invalid_request_error", rng.choice([None, "context_length_exceeded"]), "no"
        )
        out.append(enc.error(ce, retry_after=rng.choice([None, 0.5])))
    out.append(enc.close())
    out.append(enc.encode(ev.Done()) + enc.keepalive())
    out.append(msgspec.json.encode(enc.response))
    out.append(msgspec.json.encode(enc.output_items))
    return b"\n--\n".join(out)


def digests() -> list[str]:
    return [hashlib.sha256(run(case)).hexdigest()[:16] for case in range(CASES)]


def test_every_case_writes_the_recorded_bytes() -> None:
    recorded = json.loads(RECORDING.read_text())
    assert len(recorded) == CASES
    moved = [case for case, digest in enumerate(digests()) if digest != recorded[case]]
    assert not moved, f"{len(moved)} cases moved, first {moved[:10]}: {run(moved[0])[:3000]!r}"


def test_the_cases_reach_every_end_and_the_common_answer() -> None:
    # The recording is only worth its cases: they must cover the ends and the bench's answer.
    ran = [run(case) for case in range(0, CASES, 7)]
    for end in (b"response.completed", b"response.incomplete", b"response.failed",
                b"response.function_call_arguments.done", b"response.reasoning_summary_text.done",
                b"response.reasoning_text.done", b"response.refusal.done", b'"encrypted_content":"'):  # fmt: skip
        assert any(end in r for r in ran), end
    assert sum(r.startswith(b"error ") for r in ran) < len(ran) // 3


if __name__ == "__main__":  # writes the recording: only from a tree whose bytes are right
    RECORDING.parent.mkdir(exist_ok=True)
    RECORDING.write_text(json.dumps(digests(), indent=0) + "\n")
