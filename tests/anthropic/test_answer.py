"""The answer not streamed (`messages.create`), svir's errors in Anthropic's shape as the SDK
raises them, and the vocabulary the two directions share."""

from __future__ import annotations

import anthropic
import msgspec
import pytest

from svir.protocols.anthropic.encode import (
    ERROR_STATUS,
    MessageAggregator,
    anthropic_error,
    error_type,
    stop_reason,
)
from svir.providers.anthropic_dialect import finish_reason, tool_input
from svir.wire.classify import (
    ClientError,
    classify_http_error,
    classify_stream_error,
    to_client_error,
)
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from tests.anthropic.sdk import REQUEST, client


def create(body: dict) -> anthropic.types.Message:
    return client(200, msgspec.json.encode(body), "application/json").messages.create(**REQUEST)


def test_a_message_from_the_fold_through_the_sdk() -> None:
    fold = MessageAggregator()
    for e in [
        TextDelta("I'll "),
        ReasoningDelta("think", "reasoning_content"),
        TextDelta("look."),
        ToolCallStart(1, "c2", "b"),
        ToolCallStart(0, "c1", "a"),
        ToolCallDelta(0, '{"x": [1, 2]}'),
        Finish("stop"),
        Usage(50, 10, 60, cached_tokens=20),
        Done(),
    ]:
        fold.add(e)
    m = create(fold.message(id="r9", model="claude-test"))
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert m.content[0].thinking == "think" and m.content[0].signature == ""
    assert m.content[1].text == "I'll look."
    assert [(b.id, b.input) for b in m.content[2:]] == [("c1", {"x": [1, 2]}), ("c2", {})]
    assert m.stop_reason == "tool_use" and m.id == "msg_r9"
    assert (m.usage.input_tokens, m.usage.output_tokens, m.usage.cache_read_input_tokens) == (
        30,
        10,
        20,
    )


def test_a_plain_message_and_a_refusal() -> None:
    fold = MessageAggregator()
    for e in [RefusalDelta("No."), Finish("length"), Done()]:
        fold.add(e)
    m = create(fold.message(id="msg_1", model="c", input_tokens=7))
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "No."
    assert m.stop_reason == "max_tokens" and m.usage.input_tokens == 7 and m.id == "msg_1"


def test_an_empty_answer_has_no_blocks() -> None:
    fold = MessageAggregator()
    fold.add(Done())
    m = create(fold.message(id="x", model="c"))
    assert m.content == [] and m.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [("", {}), ("  ", {}), ('{"a":1}', {"a": 1}), ("[1]", {}), ("{broken", {}), ("null", {})],
)
def test_tool_input(arguments: str, expected: dict) -> None:
    assert tool_input(arguments) == expected


# -- errors


def raised(ce: ClientError) -> anthropic.APIStatusError:
    status, body = anthropic_error(ce)
    with pytest.raises(anthropic.APIStatusError) as info:
        client(status, msgspec.json.encode(body), "application/json").messages.create(**REQUEST)
    return info.value


def test_an_overflow_is_a_bad_request_saying_prompt_is_too_long() -> None:
    err = UpstreamError(
        ErrorKind.CONTEXT_OVERFLOW,
        "request (20056 tokens) exceeds the available context size (16384 tokens)",
        status=400,
    )
    exc = raised(to_client_error(err))
    assert isinstance(exc, anthropic.BadRequestError)
    assert exc.body["type"] == "error"
    assert exc.body["error"]["type"] == "invalid_request_error"
    assert exc.body["error"]["message"].startswith(
        "prompt is too long: 20056 tokens > 16384 maximum"
    )


def test_an_overflow_without_numbers_still_says_it() -> None:
    ce = ClientError(400, "invalid_request_error", "context_length_exceeded", "too big")
    _, body = anthropic_error(ce)
    assert body["error"]["message"] == "prompt is too long. too big"


def test_rate_limit_and_auth_errors_are_the_sdk_classes() -> None:
    rate = to_client_error(UpstreamError(ErrorKind.RATE_LIMITED, "slow", retry_after=3))
    exc = raised(rate)
    assert isinstance(exc, anthropic.RateLimitError)
    assert exc.body["error"] == {"type": "rate_limit_error", "message": "slow"}
    # svir's own 401 (a virtual key refused) is the client's credential.
    auth = ClientError(401, "invalid_request_error", "invalid_api_key", "bad key")
    exc = raised(auth)
    assert isinstance(exc, anthropic.AuthenticationError)
    assert exc.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "invalid_value", "invalid_request_error"),
        (422, None, "invalid_request_error"),
        (401, None, "authentication_error"),
        (403, "model_not_allowed", "permission_error"),
        (404, "model_not_found", "not_found_error"),
        (413, "request_too_large", "request_too_large"),
        (429, "rate_limit_exceeded", "rate_limit_error"),
        (500, "internal_error", "api_error"),
        (502, "upstream_auth_error", "api_error"),
        (503, "upstream_unavailable", "overloaded_error"),
        (504, "upstream_timeout", "api_error"),
        (529, None, "overloaded_error"),
    ],
)
def test_error_type_by_status(status: int, code: str | None, expected: str) -> None:
    assert error_type(status, code) == expected
    ce = ClientError(status, "x", code, "m")
    assert anthropic_error(ce) == (
        status,
        {"type": "error", "error": {"type": expected, "message": "m"}},
    )


def test_overloaded_is_the_sdk_class_for_529() -> None:
    exc = raised(ClientError(529, "x", None, "busy"))
    assert isinstance(exc, anthropic.OverloadedError)


# -- the shared vocabulary


def test_stop_and_finish_reasons_round_trip() -> None:
    for finish in ("stop", "length", "content_filter"):
        assert finish_reason(stop_reason(finish, tool_use=False)) == finish
    assert finish_reason(stop_reason("tool_calls", tool_use=True)) == "tool_calls"
    assert stop_reason("tool_calls", tool_use=False) == "end_turn"
    assert finish_reason(None) is None
    assert finish_reason("stop_sequence") == "stop"
    assert finish_reason("something_new") == "stop"


def _http_kind(status: int, type: str | None, message: str = "x") -> ErrorKind:
    body = (
        b""
        if type is None
        else msgspec.json.encode({"type": "error", "error": {"type": type, "message": message}})
    )
    return classify_http_error(status, {}, body).kind


def test_anthropic_error_types_are_classified_by_the_one_classifier() -> None:
    # svir has one classification of upstream errors (svir.wire.classify); Anthropic's error
    # types and statuses (ERROR_STATUS) go through it, in an HTTP answer and in the stream.
    assert _http_kind(529, "overloaded_error") is ErrorKind.TRANSIENT
    assert _http_kind(429, "rate_limit_error") is ErrorKind.RATE_LIMITED
    assert _http_kind(401, "authentication_error") is ErrorKind.AUTH
    assert _http_kind(403, "permission_error") is ErrorKind.AUTH
    assert _http_kind(404, "not_found_error", "model: claude-x") is ErrorKind.MODEL_NOT_FOUND
    assert _http_kind(400, "invalid_request_error") is ErrorKind.REJECTED
    assert _http_kind(529, None) is ErrorKind.TRANSIENT
    assert _http_kind(504, "new_error") is ErrorKind.TIMEOUT
    assert _http_kind(418, None) is ErrorKind.OTHER
    for type, kind in [
        ("overloaded_error", ErrorKind.TRANSIENT),
        ("api_error", ErrorKind.TRANSIENT),
        ("rate_limit_error", ErrorKind.RATE_LIMITED),
        ("authentication_error", ErrorKind.AUTH),
        ("timeout_error", ErrorKind.TIMEOUT),
        ("something_new", ErrorKind.OTHER),
    ]:
        payload = {"type": "error", "error": {"type": type, "message": "x"}}
        assert classify_stream_error(payload, event="error").kind is kind, type


def test_error_types_of_statuses() -> None:
    for name, status in ERROR_STATUS.items():
        assert error_type(status) == name or name in ("billing_error", "timeout_error")
