"""The Responses stream encoder, driven through the official OpenAI SDK's `responses.stream`
accumulator: what Codex and every SDK client assemble from svir's events."""

from __future__ import annotations

import re
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.protocols.responses.encode import ResponseStreamEncoder
from svir.protocols.responses.response import failure
from svir.wire.classify import ClientError
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    ContentFilter,
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    RefusalDelta,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from tests.responses.sdk import check_codex, check_grammar, encode, encoder, frames, stream

ROLE = Role("assistant", "up-1", "upstream-model", 0)
# Codex's pattern for the wait in a rate-limit failure (codex-rs/codex-api/src/sse/responses.rs).
CODEX_WAIT = re.compile(r"(?i)try again in\s*(\d+(?:\.\d+)?)\s*(s|ms|seconds?)")

TURN: list[Event] = [
    ROLE,
    ReasoningDelta("Look it ", "reasoning_content"),
    ReasoningDelta("up.", "reasoning_content"),
    TextDelta("Checking"),
    TextDelta(" now."),
    ToolCallStart(0, "call_1", "lookup"),
    ToolCallDelta(0, '{"q": '),
    ToolCallDelta(0, '"x"}'),
    Finish("tool_calls"),
    Usage(120, 30, 150, reasoning_tokens=12, cached_tokens=100),
    Done(),
]


def types(body: bytes) -> list[str]:
    return [e["type"] for e in frames(body)]


def test_a_turn_assembles_in_the_sdk_with_summaries() -> None:
    body = encode(TURN, encoder(summary="auto"))
    got = check_grammar(body)
    assert types(body) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert {e["summary_index"] for e in got if "reasoning_summary" in e["type"]} == {0}
    s = stream(body)
    final = s.final
    assert final.id == "resp_req1" and final.status == "completed" and final.model == "gpt-test"
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    rs, msg, fc = final.output
    assert rs.id.startswith("rs_") and [p.text for p in rs.summary] == ["Look it up."]
    assert msg.id.startswith("msg_") and msg.role == "assistant"
    assert final.output_text == "Checking now."
    assert (fc.id[:3], fc.call_id, fc.name, fc.arguments) == (
        "fc_",
        "call_1",
        "lookup",
        '{"q": "x"}',
    )
    u = final.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (120, 30, 150)
    assert u.input_tokens_details.cached_tokens == 100
    assert u.output_tokens_details.reasoning_tokens == 12
    assert [e.delta for e in s.of("response.output_text.delta")] == ["Checking", " now."]
    assert s.of("response.function_call_arguments.done")[0].arguments == '{"q": "x"}'


def test_reasoning_without_a_summary_is_reasoning_text() -> None:
    body = encode(TURN, encoder(summary=None))
    got = check_grammar(body)
    assert "response.reasoning_summary_part.added" not in types(body)
    deltas = [e for e in got if e["type"] == "response.reasoning_text.delta"]
    assert [(d["delta"], d["content_index"]) for d in deltas] == [("Look it ", 0), ("up.", 0)]
    rs = stream(body).final.output[0]
    assert rs.summary == [] and [c.text for c in rs.content] == ["Look it up."]
    assert [c.type for c in rs.content] == ["reasoning_text"]


def test_reasoning_is_sealed_only_when_asked() -> None:
    sealed = stream(encode(TURN, encoder(seal=lambda text: f"sealed<{text}>"))).final
    assert sealed.output[0].encrypted_content == "sealed<Look it up.>"
    plain = stream(encode(TURN)).final
    assert getattr(plain.output[0], "encrypted_content", None) is None


def test_a_namespaced_call_comes_back_in_namespace_form() -> None:
    enc = encoder(names={"mcp__files__read": ("mcp__files", "read")})
    body = encode(
        [ROLE, ToolCallStart(0, "call_9", "mcp__files__read"), ToolCallDelta(0, "{}"),
         Finish("tool_calls"), Done()],
        enc,
    )  # fmt: skip
    done = [e for e in check_grammar(body) if e["type"] == "response.output_item.done"]
    assert done[0]["item"]["namespace"] == "mcp__files" and done[0]["item"]["name"] == "read"
    assert enc.response["output"][0]["namespace"] == "mcp__files"
    fc = stream(body).final.output[0]
    assert (fc.name, fc.call_id) == ("read", "call_9")
    plain = encode([ROLE, ToolCallStart(0, "c", "exec_command"), Finish("tool_calls"), Done()])
    item = next(e for e in frames(plain) if e["type"] == "response.output_item.done")["item"]
    assert "namespace" not in item and item["arguments"] == ""


def test_interleaved_calls_are_one_item_each() -> None:
    body = encode(
        [
            ROLE,
            ToolCallStart(1, "call_b", "second"),
            ToolCallDelta(1, '{"b":'),
            ToolCallStart(0, "call_a", "first"),
            ToolCallDelta(0, '{"a": 1}'),
            ToolCallDelta(1, " 2}"),
            TextDelta("after"),
            Finish("tool_calls"),
            Done(),
        ]
    )
    check_grammar(body)
    final = stream(body).final
    calls = [(i.call_id, i.name, i.arguments) for i in final.output if i.type == "function_call"]
    assert calls == [("call_b", "second", '{"b": 2}'), ("call_a", "first", '{"a": 1}')]
    assert final.output_text == "after"
    assert len({i.id for i in final.output}) == 3


def test_a_refusal_is_a_refusal_part() -> None:
    body = encode([ROLE, RefusalDelta("I can't "), RefusalDelta("help."), Finish("stop"), Done()])
    got = check_grammar(body)
    assert [e["delta"] for e in got if e["type"] == "response.refusal.delta"] == [
        "I can't ",
        "help.",
    ]
    (msg,) = stream(body).final.output
    assert [(c.type, c.refusal) for c in msg.content] == [("refusal", "I can't help.")]


def test_text_then_refusal_share_one_message() -> None:
    body = encode([ROLE, TextDelta("Well."), RefusalDelta("No."), TextDelta("Bye."), Done()])
    check_grammar(body)
    (msg,) = stream(body).final.output
    assert [c.type for c in msg.content] == ["output_text", "refusal", "output_text"]


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_cut_answer_is_incomplete(finish: str, reason: str) -> None:
    enc = encoder()
    body = encode([ROLE, TextDelta("Once upon"), Finish(finish), Usage(5, 2, 7), Done()], enc)
    got = check_grammar(body)
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": reason}
    assert got[-1]["response"]["output"][0]["status"] == "incomplete"
    s = stream(body)
    assert s.final is None  # the SDK completes only a completed response
    assert s.last.status == "incomplete" and s.last.incomplete_details.reason == reason
    assert s.last.output[0].content[0].text == "Once upon"
    assert enc.response == got[-1]["response"]


def _failed(events: list[Event]) -> dict[str, Any]:
    body = encode(events)
    got = check_grammar(body)
    assert got[-1]["type"] == "response.failed"
    response: dict[str, Any] = got[-1]["response"]
    return response


def test_a_context_overflow_fails_with_the_code_codex_compacts_on() -> None:
    err = UpstreamError(
        ErrorKind.CONTEXT_OVERFLOW,
        "request (9000 tokens) exceeds the available context size (8192 tokens)",
    )
    resp = _failed([ROLE, StreamError(err)])
    assert resp["error"]["code"] == "context_length_exceeded"
    assert "maximum context length" in resp["error"]["message"]
    assert resp["status"] == "failed" and resp["output"] == []


def test_a_rate_limit_says_the_wait_as_openai_words_it() -> None:
    err = UpstreamError(ErrorKind.RATE_LIMITED, "Slow down.", retry_after=7)
    resp = _failed([ROLE, TextDelta("par"), StreamError(err)])
    assert resp["error"]["code"] == "rate_limit_exceeded"
    assert resp["error"]["message"] == "Slow down. Please try again in 7s."
    m = CODEX_WAIT.search(resp["error"]["message"])
    assert m is not None and (m.group(1), m.group(2)) == ("7", "s")
    ce = ClientError(
        429, "rate_limit_error", "rate_limit_exceeded", "Busy.", headers={"Retry-After": "2.5"}
    )
    assert failure(ce)["message"] == "Busy. Please try again in 2.5s."
    already = ClientError(429, "rate_limit_error", "rate_limit_exceeded", "Please try again in 3s.")
    assert failure(already, retry_after=9)["message"] == "Please try again in 3s."
    assert failure(ClientError(429, "rate_limit_error", None, "x"), retry_after=0.2)["message"] == (
        "x Please try again in 200ms."
    )


@pytest.mark.parametrize(
    ("kind", "code"),
    [(ErrorKind.TRANSIENT, "server_error"), (ErrorKind.OTHER, "server_error"),
     (ErrorKind.INCOMPLETE, "server_error"), (ErrorKind.TIMEOUT, "server_error"),
     (ErrorKind.CONTENT_FILTER, "content_filter")],
)  # fmt: skip
def test_other_failures_have_a_code(kind: ErrorKind, code: str) -> None:
    resp = _failed([ROLE, TextDelta("x"), StreamError(UpstreamError(kind, "boom"))])
    assert resp["error"]["code"] == code
    assert resp["output"][0]["status"] == "incomplete"
    assert resp["output"][0]["content"][0]["text"] == "x"


def test_a_failure_leaves_a_cut_call_undone_and_the_sdk_sees_it_failed() -> None:
    enc = encoder()
    body = encode(
        [ROLE, TextDelta("Running."), ToolCallStart(0, "call_1", "exec_command"),
         ToolCallDelta(0, '{"cmd": "rm -'), StreamError(UpstreamError(ErrorKind.INCOMPLETE, "cut"))],
        enc,
    )  # fmt: skip
    got = check_grammar(body)
    done = [e["item"]["type"] for e in got if e["type"] == "response.output_item.done"]
    assert done == ["message"]  # the call whose arguments were cut is never done: nobody runs it
    s = stream(body)
    assert s.final is None and s.last.status == "failed" and s.last.error.code == "server_error"
    assert [i.type for i in s.last.output] == ["message", "function_call"]
    assert s.last.output[1].status == "incomplete"
    assert enc.ended and enc.encode(TextDelta("late")) == b"" and enc.close() == b""


def test_a_stream_that_just_ends_fails() -> None:
    enc = encoder()
    body = enc.start() + enc.encode(ROLE) + enc.encode(TextDelta("Hal")) + enc.close()
    got = check_grammar(body)
    assert got[-1]["response"]["error"]["code"] == "server_error"
    assert enc.response["status"] == "failed"


def test_an_error_before_anything_still_starts_the_stream() -> None:
    enc = encoder()
    body = enc.error(ClientError(500, "server_error", None, "down"))
    assert types(body) == ["response.created", "response.in_progress", "response.failed"]
    assert enc.error(ClientError(500, "server_error", None, "again")) == b""


def test_keepalives_are_in_progress_events_the_sdk_takes() -> None:
    enc = encoder()
    body = (
        enc.keepalive()  # the first one starts the stream
        + enc.encode(Keepalive("ping"))
        + enc.encode(TextDelta("Hi"))
        + enc.keepalive()
        + enc.encode(TextDelta("!"))
        + enc.encode(Done())
    )
    check_grammar(body)
    assert types(body).count("response.in_progress") == 3
    assert stream(body).final.output_text == "Hi!"
    assert enc.keepalive() == b""


def test_repeated_or_empty_call_ids_are_made_unique() -> None:
    body = encode(
        [ROLE, ToolCallStart(0, "call_0", "f"), ToolCallStart(1, "call_0", "g"),
         ToolCallStart(2, "", "h"), Finish("tool_calls"), Done()]
    )  # fmt: skip
    ids = [i.call_id for i in stream(body).final.output]
    assert ids[0] == "call_0" and len(set(ids)) == 3 and all(ids)


def test_a_call_id_the_conversation_holds_is_not_reused() -> None:
    # A server numbering its calls per answer says `call_0` on every turn; the client's next
    # request would hold that call_id twice (a 400), so the encoder takes it as used.
    enc = ResponseStreamEncoder(
        id="resp_req1", model="gpt-test", created_at=1700000000, echo={}, summary=None,
        names={}, seal=None, taken_call_ids={"call_0"},
    )  # fmt: skip
    body = encode([ROLE, ToolCallStart(0, "call_0", "f"), Finish("tool_calls"), Done()], enc)
    (call,) = stream(body).final.output
    assert call.call_id and call.call_id != "call_0"


def test_the_response_object_is_the_streamed_one() -> None:
    enc = encoder(echo={"instructions": "Be brief.", "tools": [], "metadata": {"k": "v"},
                        "store": False, "id": "ignored", "status": "ignored"})  # fmt: skip
    body = encode(TURN, enc)
    completed = frames(body)[-1]["response"]
    assert enc.response == completed
    assert enc.output_items == completed["output"]
    assert completed["instructions"] == "Be brief." and completed["metadata"] == {"k": "v"}
    assert completed["store"] is False and completed["id"] == "resp_req1"
    # The SDK's final response is the same object.
    assert stream(body).final.model_dump(exclude_none=True)["output"] == [
        {k: v for k, v in item.items() if v is not None} for item in completed["output"]
    ]


def test_output_items_show_the_open_item_as_it_stands() -> None:
    enc = encoder()
    enc.start()
    enc.encode(TextDelta("So far"))
    (item,) = enc.output_items
    assert item["status"] == "in_progress" and item["content"][0]["text"] == "So far"
    assert enc.response["status"] == "in_progress"


def test_a_long_answer_numbers_every_delta_past_the_made_tails() -> None:
    # The delta's tail (its sequence number) is made once for the first numbers, and written
    # per piece past them: both must number and end their events the same way.
    texts = [f"w{i} " for i in range(1_100)]
    body = encode([ROLE, *(TextDelta(t) for t in texts), Finish("stop"), Done()])
    got = check_grammar(body)
    deltas = [e for e in got if e["type"] == "response.output_text.delta"]
    assert [e["delta"] for e in deltas] == texts
    assert [e["sequence_number"] for e in deltas] == list(range(4, 4 + len(texts)))
    assert deltas[-1] == {"type": "response.output_text.delta", "item_id": deltas[0]["item_id"],
                          "output_index": 0, "content_index": 0, "delta": texts[-1],
                          "logprobs": [], "sequence_number": 1_103}  # fmt: skip
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == "".join(texts)


def test_nothing_empty_is_written() -> None:
    enc = encoder()
    enc.start()
    for e in (TextDelta(""), ReasoningDelta("", "think"), RefusalDelta(""), ROLE,
              ContentFilter("completion", False, (), {}), ReasoningSignature("sig"),
              RedactedReasoning("opaque")):  # fmt: skip
        assert enc.encode(e) == b""
    assert enc.output_items == []


# -- the fuzz

_events = st.one_of(
    st.builds(TextDelta, st.text(max_size=5)),
    st.builds(ReasoningDelta, st.text(max_size=5), st.sampled_from(["reasoning_content", "think"])),
    st.builds(RefusalDelta, st.text(max_size=5)),
    st.builds(
        ToolCallStart,
        st.integers(0, 3),
        st.sampled_from(["c1", "c2", "c3"]),
        st.sampled_from(["f", "ns__g"]),
    ),
    st.builds(ToolCallDelta, st.integers(0, 3), st.text(max_size=5)),
    st.builds(Finish, st.sampled_from(["stop", "length", "tool_calls", "content_filter"])),
    st.builds(Usage, st.integers(0, 9), st.integers(0, 9), st.integers(0, 18)),
    st.builds(Keepalive, st.just("")),
    st.just(ROLE),
    st.builds(ReasoningSignature, st.text(max_size=3)),
    st.builds(RedactedReasoning, st.text(min_size=1, max_size=3)),
)
_ends = st.sampled_from(
    [Done(), StreamError(UpstreamError(ErrorKind.RATE_LIMITED, "x", retry_after=3)), None]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_events, max_size=25), _ends, st.sampled_from([None, "auto"]), st.booleans())
def test_fuzz_the_stream_is_always_well_formed(
    events: list[Event], end: Event | None, summary: str | None, sealed: bool
) -> None:
    enc = encoder(
        summary=summary, names={"ns__g": ("ns", "g")}, seal=(lambda t: t[::-1]) if sealed else None
    )
    body = encode([*events, *([end] if end is not None else [])], enc)
    got = check_grammar(body)
    check_codex(got)
    assert enc.ended and got[-1]["response"] == enc.response
    assert enc.response["output"] == enc.output_items
    # The SDK's accumulator takes every such stream, and completes exactly the completed ones.
    s = stream(body)
    assert (s.final is not None) == (got[-1]["type"] == "response.completed")
    if s.final is not None:
        assert s.final.output_text == "".join(
            c["text"] for i in enc.output_items if i["type"] == "message"
            for c in i["content"] if c["type"] == "output_text"
        )  # fmt: skip


async def test_the_async_client_reads_each_event_as_its_own_type() -> None:
    """`responses.create(stream=True)` on the async client: every event is parsed into the SDK's
    class for its type (none falls back to an unknown one), in order."""
    body = encode(TURN, encoder(summary="auto"))

    async def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.AsyncOpenAI(
        api_key="x",
        base_url="http://svir.test/v1",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer)),
    )
    got = [
        event async for event in await client.responses.create(model="m", input="hi", stream=True)
    ]
    assert [e.type for e in got] == types(body)
    assert [e.sequence_number for e in got] == list(range(len(got)))
    for e in got:
        cls = type(e).__name__
        assert cls.startswith("Response") and cls.endswith("Event"), cls
    assert type(got[-1]).__name__ == "ResponseCompletedEvent"
    assert got[-1].response.output[2].arguments == '{"q": "x"}'
