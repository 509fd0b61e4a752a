"""Error classification against the bodies servers were seen to send (§5, §3.5, §2.2)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.wire.classify import (
    BODY_SCAN_LIMIT,
    ClientError,
    check_stream_response,
    classify_http_error,
    classify_stream_error,
    error_body,
    error_message,
    parse_retry_after,
    to_client_error,
)
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.redact import redact_url

JSON = {"Content-Type": "application/json"}

LLAMA_IMAGE_500 = (
    b'{"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected,'
    b' you may need to provide the mmproj","type":"server_error"}}'
)
MLX_LM_TEXT_ONLY_404 = b'{"error": "Only \'text\' content type is supported."}'
MLX_VLM_422 = (
    b'{"detail":[{"type":"list_type","loc":["body","messages"],'
    b'"msg":"Input should be a valid list","input":"hi"}]}'
)
VLLM_OVERFLOW = (
    b'{"error":{"message":"This model\'s maximum context length is 262144 tokens. However, you'
    b' requested 0 output tokens and your prompt contains at least 262145 input tokens, ...",'
    b'"type":"BadRequestError","param":"input_tokens","code":400}}'
)
VLLM_MAX_TOKENS = (
    b'{"error":{"message":"max_tokens=300000 cannot be greater than '
    b'max_model_len=max_total_tokens=262144","type":"BadRequestError","param":"max_tokens",'
    b'"code":400}}'
)
LLAMA_OVERFLOW = (
    b'{"error":{"code":400,"message":"request (20056 tokens) exceeds the available context size'
    b' (16384 tokens), try increasing it","type":"exceed_context_size_error",'
    b'"n_prompt_tokens":20056,"n_ctx":16384}}'
)
AZURE_FILTER = (
    b'{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI\'s'
    b' content management policy. ...","type":null,"param":"prompt","code":"content_filter",'
    b'"status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":'
    b'{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"detected":true,"filtered":true}}'
    b"}}}"
)
LMSTUDIO_JSON_OBJECT_400 = b"{\"error\":\"'response_format.type' must be 'json_schema' or 'text'\"}"
LMSTUDIO_TOOL_CHOICE_400 = (
    b'{"error":"Invalid tool_choice type: \'object\'. Supported string values: none, auto,'
    b' required"}'
)
MLX_VLM_TOOL_CHOICE_400 = (
    b"{\"detail\":\"Invalid tool_choice. Expected 'none', 'auto', 'required', or a specific"
    b' function."}'
)
LLAMA_TOOL_CHOICE_400 = (
    b'{"error":{"code":400,"message":"Invalid tool_choice: bogus","type":"invalid_request_error"}}'
)
VLLM_AUTO_TOOL_400 = (
    b'{"error":{"message":"\\"auto\\" tool choice requires --enable-auto-tool-choice and'
    b' --tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}}'
)
MLX_VLM_PROTECTED = b'{"detail":"Protected conversation exceeds the available context budget."}'
MLX_VLM_RESERVATION = b'{"detail":"Output reservation leaves no room for compacted context."}'
MLX_VLM_COMPACTION_502 = (
    b'{"detail":"Compaction summary hit its output limit; original context preserved."}'
)
LLAMA_STREAM_ERROR = {
    "error": {
        "code": 500,
        "message": "The model produced output that does not match the expected peg-native format",
        "type": "server_error",
    }
}
CORPUS = Path(__file__).resolve().parent.parent / "conformance"
# Recorded from a real llama-server with a 256-token context (tests/conformance/llamacpp-live).
LLAMA_LIVE_OVERFLOW = (CORPUS / "llamacpp-live" / "overflow-400.json").read_bytes()
# LM Studio's recorded `event: error` (tests/conformance/decoder/lmstudio-error.sse), its data.
LMSTUDIO_ERROR_EVENT = json.loads(
    (CORPUS / "decoder" / "lmstudio-error.sse").read_text().split("data: ", 1)[1]
)
# LM Studio's other overflow, when the model was loaded with a small context.
LMSTUDIO_SMALL_CONTEXT = (
    "Trying to keep the first 5059 tokens when context the overflows. However, the model is loaded"
    " with context length of only 4096 tokens, which is not enough. Try to load the model with a"
    " larger context length, or provide a shorter input"
)
LMSTUDIO_OVERFLOW_TEXT = (
    "The number of tokens to keep from the initial prompt is greater than the context length..."
)
LMSTUDIO_OVERFLOW_EVENT = {
    "error": {"message": LMSTUDIO_OVERFLOW_TEXT},
    "message": LMSTUDIO_OVERFLOW_TEXT,
}


# error_message


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"error": {"message": "boom", "code": 400}}, "boom"),
        ({"error": "plain string"}, "plain string"),
        ({"detail": "a detail"}, "a detail"),
        ({"detail": [{"msg": "first"}, {"msg": "second"}]}, "first"),
        ({"detail": [{"loc": ["body"]}, {"msg": "second"}]}, "second"),
        ({"message": "top level"}, "top level"),
        ({"error": {"message": "inner"}, "message": "outer"}, "inner"),
        ({"error": {"message": ""}, "message": "outer"}, "outer"),
        ({"error": {"code": 500}}, None),
        ({"error": None, "detail": None}, None),
        ({"detail": []}, None),
        ({}, None),
        ([], None),
        (None, None),
        (42, None),
        ("  a bare string  ", "a bare string"),
        ({"error": {"message": 12}}, None),
        ({"errors": [{"message": "listed"}]}, "listed"),
    ],
)
def test_error_message_reads_every_shape(obj: Any, expected: str | None) -> None:
    assert error_message(obj) == expected


def test_error_message_of_seed_bodies() -> None:
    assert error_message(json.loads(MLX_VLM_422)) == "Input should be a valid list"
    assert (
        error_message(json.loads(MLX_LM_TEXT_ONLY_404)) == "Only 'text' content type is supported."
    )
    assert error_message(LMSTUDIO_OVERFLOW_EVENT) == LMSTUDIO_OVERFLOW_TEXT


# parse_retry_after


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-1", None),
        ("-0.5", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("inf", None),
        ("nan", None),
        ("1e3", None),
        ("1_000", None),
        ("9" * 400, None),
    ],
)
def test_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_retry_after_http_date_needs_now() -> None:
    date = "Tue, 22 Sep 2026 00:00:30 GMT"
    when = 1_790_035_230.0  # that date as unix time
    assert parse_retry_after(date, now=when - 30) == pytest.approx(30.0)
    assert parse_retry_after(date) is None


def test_retry_after_date_in_the_past_is_no_wait() -> None:
    assert parse_retry_after("Tue, 22 Sep 2026 00:00:30 GMT", now=1_790_035_230.0 + 100) == 0.0


@pytest.fixture
def far_timezone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone hours away from GMT, so that reading a date as local time shows."""
    monkeypatch.setenv("TZ", "Pacific/Honolulu")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_timezone")
def test_retry_after_date_without_zone_is_gmt() -> None:
    # "-0000" yields a naive datetime; reading it in the local zone would shift it by hours.
    assert parse_retry_after("Tue, 22 Sep 2026 00:00:30 -0000", now=1_790_035_200.0) == (
        pytest.approx(30.0)
    )


def test_retry_after_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        parse_retry_after(30)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_retry_after("30", now="now")  # type: ignore[arg-type]


# classify_http_error: status classes


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, ErrorKind.AUTH),
        (403, ErrorKind.AUTH),
        (429, ErrorKind.RATE_LIMITED),
        (408, ErrorKind.TIMEOUT),
        (504, ErrorKind.TIMEOUT),
        (500, ErrorKind.TRANSIENT),
        (502, ErrorKind.TRANSIENT),
        (503, ErrorKind.TRANSIENT),
        (400, ErrorKind.REJECTED),
        (413, ErrorKind.REJECTED),
        (422, ErrorKind.REJECTED),
        (404, ErrorKind.OTHER),
        (405, ErrorKind.OTHER),
        (418, ErrorKind.OTHER),
        (301, ErrorKind.OTHER),
    ],
)
def test_status_classes(status: int, kind: ErrorKind) -> None:
    err = classify_http_error(status, JSON, b'{"error":{"message":"nope"}}')
    assert err.kind is kind
    assert err.status == status
    assert err.message == "nope"
    assert not err.in_stream


def test_retryable_follows_kind() -> None:
    assert classify_http_error(503, {}, b"").retryable
    assert classify_http_error(429, {}, b"").retryable
    assert not classify_http_error(400, {}, b"").retryable
    assert not classify_http_error(401, {}, b"").retryable
    # A stream cut short is retried by the policy before the first byte; `retryable` says so too.
    assert UpstreamError(ErrorKind.INCOMPLETE, "cut", in_stream=True).retryable


def test_rate_limit_keeps_retry_after_case_insensitively() -> None:
    err = classify_http_error(429, {"RETRY-AFTER": "12"}, b"")
    assert err.kind is ErrorKind.RATE_LIMITED
    assert err.retry_after == 12.0
    assert classify_http_error(429, {"retry-after": "2.5"}, b"").retry_after == 2.5
    assert classify_http_error(429, {}, b"").retry_after is None
    assert classify_http_error(429, {"Retry-After": "later"}, b"").retry_after is None


def test_retry_after_ms_wins_and_date_uses_now() -> None:
    headers = {"retry-after-ms": "1500", "Retry-After": "9"}
    assert classify_http_error(429, headers, b"").retry_after == 1.5
    date = {"Retry-After": "Tue, 22 Sep 2026 00:00:30 GMT"}
    assert classify_http_error(429, date, b"", now=1_790_035_220.0).retry_after == (
        pytest.approx(10.0)
    )
    assert classify_http_error(429, date, b"").retry_after is None


# classify_http_error: the shapes of §5 and §2.2


def test_llama_cpp_image_500_is_unsupported_input() -> None:
    err = classify_http_error(500, JSON, LLAMA_IMAGE_500)
    assert err.kind is ErrorKind.UNSUPPORTED_INPUT
    assert not err.retryable
    assert err.message.startswith("image input is not supported")
    assert err.code == 500
    assert err.type == "server_error"


def test_mlx_lm_text_only_404_is_unsupported_input() -> None:
    err = classify_http_error(404, JSON, MLX_LM_TEXT_ONLY_404)
    assert err.kind is ErrorKind.UNSUPPORTED_INPUT
    assert not err.retryable
    assert err.message == "Only 'text' content type is supported."


def test_mlx_lm_other_404_is_rejected() -> None:
    err = classify_http_error(404, JSON, b'{"error": "Invalid tool_choice value"}')
    assert err.kind is ErrorKind.REJECTED


@pytest.mark.parametrize(
    "body",
    [
        # mlx-lm's plain-string error
        b'{"error": "Model not found: qwen"}',
        # OpenAI's
        b'{"error":{"message":"The model `x` does not exist or you do not have access to it.",'
        b'"type":"invalid_request_error","param":null,"code":"model_not_found"}}',
        # vLLM's
        b'{"object":"error","message":"The model `qwen` does not exist.","type":"NotFoundError",'
        b'"param":null,"code":404}',
        # Ollama's OpenAI endpoint
        b'{"error":{"message":"model \\"qwen\\" not found, try pulling it first",'
        b'"type":"api_error","param":null,"code":null}}',
        # Ollama's own
        b'{"error":"model \'qwen\' not found"}',
    ],
)
def test_404_for_a_missing_model_is_model_not_found(body: bytes) -> None:
    err = classify_http_error(404, JSON, body)
    assert err.kind is ErrorKind.MODEL_NOT_FOUND
    assert not err.retryable
    ce = to_client_error(err)
    assert (ce.status, ce.type, ce.code, ce.param) == (
        404,
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert ce.message == err.message


@pytest.mark.parametrize(
    "body",
    [b'{"detail":"Not Found"}', b"<html><body>404 Not Found</body></html>", b""],
)
def test_404_for_a_missing_path_is_other(body: bytes) -> None:
    # A path the server does not serve is a wrong base URL, svir's to fix: not the client's 404.
    err = classify_http_error(404, {}, body)
    assert err.kind is ErrorKind.OTHER
    assert to_client_error(err).status == 502


def test_mlx_vlm_422_detail_list() -> None:
    err = classify_http_error(422, JSON, MLX_VLM_422)
    assert err.kind is ErrorKind.REJECTED
    assert err.message == "Input should be a valid list"
    assert err.type is None  # the validation entry's "type" is not an error type


def test_vllm_overflow() -> None:
    err = classify_http_error(400, JSON, VLLM_OVERFLOW)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    assert err.param == "input_tokens"
    assert err.code == 400
    assert err.type == "BadRequestError"
    assert "262145" in err.message


def test_vllm_max_tokens_is_a_rejected_parameter() -> None:
    err = classify_http_error(400, JSON, VLLM_MAX_TOKENS)
    assert err.kind is ErrorKind.REJECTED
    assert err.param == "max_tokens"


def test_max_tokens_param_wins_over_context_words() -> None:
    body = {
        "error": {
            "message": "'max_tokens' is too large: 300000. This model's maximum context length"
            " is 262144 tokens and your request has 10 input tokens.",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
    err = classify_http_error(400, JSON, json.dumps(body).encode())
    assert err.kind is ErrorKind.REJECTED


def test_llama_cpp_exceed_context_size_keeps_sizes() -> None:
    err = classify_http_error(400, JSON, LLAMA_OVERFLOW)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    assert err.details["n_prompt_tokens"] == 20056
    assert err.details["n_ctx"] == 16384
    assert err.type == "exceed_context_size_error"


@pytest.mark.parametrize("status", [400, 413, 422])
@pytest.mark.parametrize("code", ["context_length_exceeded", "context_window_exceeded"])
def test_openai_schema_overflow_codes(status: int, code: str) -> None:
    body = json.dumps({"error": {"message": "too long", "code": code, "param": "messages"}})
    err = classify_http_error(status, JSON, body.encode())
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    assert err.code == code


@pytest.mark.parametrize("body", [MLX_VLM_PROTECTED, MLX_VLM_RESERVATION])
def test_mlx_vlm_overflow_details(body: bytes) -> None:
    err = classify_http_error(400, JSON, body)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 8192 tokens",
        "prompt exceeds the context length of the model",
        "Input is longer than the context window",
        "the request exceeds the available context size",
    ],
)
def test_overflow_by_message_alone(message: str) -> None:
    body = json.dumps({"error": {"message": message}}).encode()
    assert classify_http_error(400, JSON, body).kind is ErrorKind.CONTEXT_OVERFLOW


def test_mentioning_context_without_exceeding_is_not_overflow() -> None:
    body = b'{"error":{"message":"context length must be a positive integer"}}'
    assert classify_http_error(400, JSON, body).kind is ErrorKind.REJECTED


def test_mlx_vlm_compaction_502_is_not_retried() -> None:
    err = classify_http_error(502, JSON, MLX_VLM_COMPACTION_502)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    assert not err.retryable


def test_azure_content_filter_keeps_verdict() -> None:
    err = classify_http_error(400, JSON, AZURE_FILTER)
    assert err.kind is ErrorKind.CONTENT_FILTER
    assert not err.retryable
    assert err.param == "prompt"
    assert err.code == "content_filter"
    assert err.type is None
    verdict = err.details["content_filter_result"]
    assert verdict["jailbreak"] == {"detected": True, "filtered": True}
    assert err.details["innererror_code"] == "ResponsibleAIPolicyViolation"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (LMSTUDIO_JSON_OBJECT_400, "'response_format.type' must be 'json_schema' or 'text'"),
        (
            LMSTUDIO_TOOL_CHOICE_400,
            "Invalid tool_choice type: 'object'. Supported string values: none, auto, required",
        ),
        (
            MLX_VLM_TOOL_CHOICE_400,
            "Invalid tool_choice. Expected 'none', 'auto', 'required', or a specific function.",
        ),
        (LLAMA_TOOL_CHOICE_400, "Invalid tool_choice: bogus"),
        (
            VLLM_AUTO_TOOL_400,
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be'
            " set",
        ),
        (
            b'{"error":{"message":"Unexpected reasoning effort high. Supported types are xhigh'
            b' (default), medium, and low.","type":"BadRequestError","param":null,"code":400}}',
            "Unexpected reasoning effort high. Supported types are xhigh (default), medium, and"
            " low.",
        ),
    ],
)
def test_rejections_keep_the_servers_message(body: bytes, message: str) -> None:
    err = classify_http_error(400, JSON, body)
    assert err.kind is ErrorKind.REJECTED
    assert err.message == message


def test_llama_cpp_fields_are_kept() -> None:
    err = classify_http_error(400, JSON, LLAMA_TOOL_CHOICE_400)
    assert (err.code, err.type, err.param) == (400, "invalid_request_error", None)


# classify_http_error: bodies that are not what they should be


def test_empty_body_falls_back_to_status() -> None:
    err = classify_http_error(503, {}, b"")
    assert err.message == "HTTP 503"
    assert err.kind is ErrorKind.TRANSIENT


def test_html_body_gives_its_title() -> None:
    page = (
        b"<html><head><title>502 Bad Gateway</title><style>body{}</style></head>"
        b"<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>"
    )
    err = classify_http_error(502, {"content-type": "text/html"}, page)
    assert err.message == "502 Bad Gateway"
    assert err.kind is ErrorKind.TRANSIENT


def test_html_without_title_gives_text_not_script() -> None:
    page = b"<html><body><script>var secret = 1;</script><p>Service   down</p></body></html>"
    assert classify_http_error(503, {}, page).message == "Service down"


def test_plain_text_body_is_a_short_snippet() -> None:
    err = classify_http_error(500, {}, b"Internal Server Error\n\n" + b"x" * 5000)
    assert err.message.startswith("Internal Server Error x")
    assert len(err.message) <= 200


def test_non_utf8_body_does_not_raise() -> None:
    err = classify_http_error(500, {}, b"\xff\xfe\x00bad")
    assert err.kind is ErrorKind.TRANSIENT
    assert "bad" in err.message


def test_only_the_first_64_kib_is_read() -> None:
    # A message past the scan limit is not seen; the error falls back to the body's start.
    body = b" " * BODY_SCAN_LIMIT + b'{"error":{"message":"hidden"}}'
    err = classify_http_error(400, {}, body)
    assert "hidden" not in err.message
    assert err.message == "HTTP 400"


def test_huge_json_body_is_cut_not_parsed_whole() -> None:
    body = b'{"error":{"message":"' + b"a" * (BODY_SCAN_LIMIT * 4) + b'"}}'
    err = classify_http_error(400, {}, body)
    assert err.kind is ErrorKind.REJECTED
    assert len(err.message) <= 200


def test_json_of_another_shape() -> None:
    err = classify_http_error(500, {}, b"[1, 2, 3]")
    assert err.message == "[1, 2, 3]"
    err = classify_http_error(400, {}, b'{"error": {"code": true, "type": 5, "param": []}}')
    assert (err.code, err.type, err.param) == (None, None, None)


def test_bytearray_and_memoryview_bodies() -> None:
    assert classify_http_error(400, {}, bytearray(LLAMA_OVERFLOW)).kind is (
        ErrorKind.CONTEXT_OVERFLOW
    )
    assert classify_http_error(400, {}, memoryview(AZURE_FILTER)).kind is ErrorKind.CONTENT_FILTER


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        ("400", {}, b""),
        (True, {}, b""),
        (400.0, {}, b""),
        (400, [("a", "b")], b""),
        (400, {}, "text"),
        (400, {}, None),
    ],
)
def test_wrong_argument_types_raise_type_error(status: Any, headers: Any, body: Any) -> None:
    with pytest.raises(TypeError):
        classify_http_error(status, headers, body)


def test_odd_header_values_are_ignored() -> None:
    err = classify_http_error(429, {"Retry-After": 5, 3: "x"}, b"")  # type: ignore[dict-item]
    assert err.retry_after is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["error", "message", "detail", "code", "type", "param", "msg", "x"])
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(status=st.integers(), body=st.binary(max_size=2000))
def test_fuzz_bytes_never_raise(status: int, body: bytes) -> None:
    err = classify_http_error(status, {"retry-after": "1"}, body)
    assert isinstance(err, UpstreamError)
    assert err.message
    assert err.status == status


@settings(max_examples=300)
@given(
    status=st.integers(min_value=100, max_value=599),
    doc=json_values,
    headers=st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=4),
)
def test_fuzz_json_never_raise(status: int, doc: Any, headers: dict[str, str]) -> None:
    err = classify_http_error(status, headers, json.dumps(doc).encode())
    assert isinstance(err.kind, ErrorKind)
    assert err.message
    ce = to_client_error(err)
    assert 400 <= ce.status <= 599
    assert ce.status != 401


@settings(max_examples=200)
@given(payload=json_values, event=st.none() | st.text(max_size=10))
def test_fuzz_stream_errors_never_raise(payload: Any, event: str | None) -> None:
    err = classify_stream_error(payload, event=event)
    assert err.in_stream
    assert err.message


# classify_stream_error


def test_llama_cpp_parser_failing_on_the_models_output_is_model_output() -> None:
    # Code 500 and type server_error, but the words say the model wrote what the parser could not
    # read: the server is healthy (no breaker), and the request was not at fault.
    err = classify_stream_error(LLAMA_STREAM_ERROR)
    assert err.kind is ErrorKind.MODEL_OUTPUT
    assert not err.retryable
    assert err.in_stream
    assert err.code == 500
    assert err.type == "server_error"
    assert err.message.startswith("The model produced output")
    ce = to_client_error(err, before_first_byte=False)
    assert (ce.status, ce.code) == (502, "upstream_error")


@pytest.mark.parametrize(
    "body",
    [
        # llama.cpp's chat parser on a tool call the model wrote
        b'{"error":{"code":500,"message":"Failed to parse input at pos 41: <tool_call>{\\"name\\":'
        b' \\"open_locker\\", \\"arguments\\": {\\"n\\": 12","type":"server_error"}}',
        # Ollama's tool-call parser
        b'{"error":{"message":"error parsing tool call: raw=\'{\\"name\\": \\"f\\"\','
        b' err=unexpected end of JSON input","type":"api_error","param":null,"code":null}}',
    ],
)
def test_a_parser_failing_on_the_models_output_is_model_output(body: bytes) -> None:
    assert classify_http_error(500, JSON, body).kind is ErrorKind.MODEL_OUTPUT
    assert classify_stream_error(body).kind is ErrorKind.MODEL_OUTPUT


def test_a_request_the_server_could_not_parse_stays_rejected() -> None:
    body = b'{"error":{"code":400,"message":"Failed to parse input: invalid JSON"}}'
    assert classify_http_error(400, JSON, body).kind is ErrorKind.REJECTED
    assert classify_stream_error(body).kind is ErrorKind.REJECTED


def test_lm_studio_error_event_overflow() -> None:
    err = classify_stream_error(LMSTUDIO_OVERFLOW_EVENT, event="error")
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    assert err.in_stream
    assert err.message == LMSTUDIO_OVERFLOW_TEXT
    assert err.details["event"] == "error"


def test_lm_studio_error_event_of_another_failure_is_other() -> None:
    err = classify_stream_error({"error": {"message": "x"}, "message": "x"}, event="error")
    assert err.kind is ErrorKind.OTHER


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        ({"error": "something died"}, ErrorKind.OTHER),
        ({"error": {"message": "m", "code": "500"}}, ErrorKind.TRANSIENT),
        ({"error": {"message": "m", "code": 400, "type": "BadRequestError"}}, ErrorKind.REJECTED),
        ({"error": {"message": "m", "type": "InternalServerError"}}, ErrorKind.TRANSIENT),
        ({"error": {"message": "m", "code": 429}}, ErrorKind.RATE_LIMITED),
        ({"error": {"message": "m", "code": "rate_limit_exceeded"}}, ErrorKind.RATE_LIMITED),
        (
            {"error": {"message": "m", "code": "context_length_exceeded"}},
            ErrorKind.CONTEXT_OVERFLOW,
        ),
        ({"error": {"message": "m", "code": "content_filter"}}, ErrorKind.CONTENT_FILTER),
        ({"error": {"message": "m", "code": 999}}, ErrorKind.OTHER),
    ],
)
def test_stream_error_kinds(payload: Any, kind: ErrorKind) -> None:
    assert classify_stream_error(payload).kind is kind


def test_stream_error_from_raw_text_and_bytes() -> None:
    assert classify_stream_error("not json at all").message == "not json at all"
    err = classify_stream_error(json.dumps(LLAMA_STREAM_ERROR).encode())
    assert err.kind is ErrorKind.MODEL_OUTPUT
    assert classify_stream_error(None).message


# check_stream_response


@pytest.mark.parametrize(
    "content_type",
    ["text/event-stream", "text/event-stream; charset=utf-8", "Text/Event-Stream ;charset=UTF-8"],
)
def test_event_stream_passes(content_type: str) -> None:
    assert check_stream_response(200, content_type) is None


@pytest.mark.parametrize("content_type", ["application/json", "text/html", "", None, "text/plain"])
def test_other_2xx_is_not_a_stream(content_type: str | None) -> None:
    err = check_stream_response(200, content_type)
    assert err is not None
    assert err.kind is ErrorKind.NOT_A_STREAM
    assert err.status == 200
    assert not err.retryable


def test_non_2xx_is_left_to_classification() -> None:
    assert check_stream_response(400, "application/json") is None
    assert check_stream_response(500, None) is None
    assert check_stream_response(204, "text/plain") is not None


# to_client_error and error_body


def test_auth_never_maps_to_401_and_hides_the_servers_words() -> None:
    err = classify_http_error(
        401, JSON, b'{"error":{"message":"Incorrect API key provided: sk-live-abcdef123456"}}'
    )
    ce = to_client_error(err)
    assert ce.status == 502
    assert (ce.type, ce.code) == ("upstream_error", "upstream_auth_error")
    assert "sk-live" not in ce.message
    assert to_client_error(classify_http_error(403, {}, b"")).status == 502


def test_rate_limit_carries_retry_after_rounded_up() -> None:
    ce = to_client_error(classify_http_error(429, {"Retry-After": "1.2"}, b""))
    assert ce.status == 429
    assert ce.code == "rate_limit_exceeded"
    assert ce.headers == {"Retry-After": "2"}
    assert to_client_error(classify_http_error(429, {}, b"")).headers == {}


def test_no_headers_once_the_stream_started() -> None:
    err = classify_http_error(429, {"Retry-After": "3"}, b"")
    ce = to_client_error(err, before_first_byte=False)
    assert ce.headers == {}
    assert ce.status == 429


def test_overflow_maps_to_context_length_exceeded_with_sizes() -> None:
    ce = to_client_error(classify_http_error(400, JSON, LLAMA_OVERFLOW))
    assert (ce.status, ce.type, ce.code, ce.param) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    assert ce.message.startswith(
        "This model's maximum context length is 16384 tokens. However, your messages resulted in"
        " 20056 tokens. The model server said: request (20056 tokens)"
    )
    bare = UpstreamError(
        ErrorKind.CONTEXT_OVERFLOW, "too long", details={"n_prompt_tokens": 9000, "n_ctx": 4096}
    )
    assert to_client_error(bare).message == (
        "This model's maximum context length is 4096 tokens. However, your messages resulted in"
        " 9000 tokens. The model server said: too long"
    )


# An overflow in OpenAI's words: LiteLLM maps an error to ContextWindowExceededError only when its
# text holds "this model's maximum context length is" (or a server's own phrase, such as
# llama.cpp's "exceeds the available context size"); other tools match "maximum context length"
# (CrewAI) or "context length" (Cline) next to the code.


def _overflow_from_stream(payload: Any) -> ClientError:
    return to_client_error(classify_stream_error(payload, event="error"), before_first_byte=False)


def test_llama_cpp_overflow_recorded_live_in_openais_words() -> None:
    ce = to_client_error(classify_http_error(400, JSON, LLAMA_LIVE_OVERFLOW))
    assert ce.code == "context_length_exceeded"
    assert ce.message == (
        "This model's maximum context length is 256 tokens. However, your messages resulted in 610"
        " tokens. The model server said: request (610 tokens) exceeds the available context size"
        " (256 tokens), try increasing it"
    )


def test_llama_cpp_overflow_sizes_read_from_its_words_alone() -> None:
    # In a stream, or through a proxy that kept only the message, the body's numbers are gone.
    words = "request (20056 tokens) exceeds the available context size (16384 tokens), try increasing it"
    ce = _overflow_from_stream({"error": {"message": words, "type": "exceed_context_size_error"}})
    assert ce.message.startswith(
        "This model's maximum context length is 16384 tokens. However, your messages resulted in"
        " 20056 tokens."
    )


def test_lm_studio_overflow_recorded_in_openais_words() -> None:
    # LM Studio names no size: OpenAI's words without one, then LM Studio's own.
    ce = _overflow_from_stream(LMSTUDIO_ERROR_EVENT)
    assert (ce.status, ce.code) == (400, "context_length_exceeded")
    assert ce.message == (
        "This model's maximum context length is exceeded by this request. The model server said:"
        " The number of tokens to keep from the initial prompt is greater than the context length."
    )


def test_lm_studio_small_context_gives_its_size() -> None:
    ce = _overflow_from_stream({"error": {"message": LMSTUDIO_SMALL_CONTEXT}})
    assert ce.code == "context_length_exceeded"
    assert ce.message.startswith(
        "This model's maximum context length is 4096 tokens. However, this request does not fit"
        " in it. The model server said: Trying to keep the first 5059 tokens"
    )


def test_vllm_overflow_already_in_openais_words_is_kept() -> None:
    ce = to_client_error(classify_http_error(400, JSON, VLLM_OVERFLOW))
    assert ce.message == json.loads(VLLM_OVERFLOW)["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        LLAMA_OVERFLOW,
        LLAMA_LIVE_OVERFLOW,
        VLLM_OVERFLOW,
        MLX_VLM_PROTECTED,
        MLX_VLM_RESERVATION,
        MLX_VLM_COMPACTION_502,
        b'{"error":{"message":"too big","code":"context_length_exceeded"}}',
        json.dumps({"error": {"message": LMSTUDIO_OVERFLOW_TEXT}}).encode(),
        json.dumps({"error": {"message": LMSTUDIO_SMALL_CONTEXT}}).encode(),
    ],
)
def test_every_servers_overflow_carries_the_phrases_clients_match(body: bytes) -> None:
    status = 502 if body is MLX_VLM_COMPACTION_502 else 400
    err = classify_http_error(status, JSON, body)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    ce = to_client_error(err)
    assert ce.code == "context_length_exceeded"
    assert ce.message.startswith("This model's maximum context length is")  # LiteLLM
    assert "maximum context length" in ce.message  # CrewAI and the like
    assert "context length" in ce.message  # Cline
    assert err.message in ce.message  # and the server's own words


@given(
    message=st.text(max_size=3000),
    n_ctx=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**12), st.booleans()),
    n_prompt=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**12)),
    in_stream=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_every_overflow_message_starts_in_openais_words(
    message: str, n_ctx: Any, n_prompt: Any, in_stream: bool
) -> None:
    details = {k: v for k, v in (("n_ctx", n_ctx), ("n_prompt_tokens", n_prompt)) if v is not None}
    err = UpstreamError(ErrorKind.CONTEXT_OVERFLOW, message, in_stream=in_stream, details=details)
    ce = to_client_error(err, before_first_byte=not in_stream)
    assert ce.message.startswith("This model's maximum context length is")
    assert "maximum context length" in ce.message
    assert len(ce.message) <= 2000


def test_content_filter_maps_to_400() -> None:
    ce = to_client_error(classify_http_error(400, JSON, AZURE_FILTER))
    assert (ce.status, ce.code, ce.param) == (400, "content_filter", "prompt")


def test_unsupported_input_keeps_the_servers_message() -> None:
    ce = to_client_error(classify_http_error(404, JSON, MLX_LM_TEXT_ONLY_404))
    assert (ce.status, ce.code) == (400, "unsupported_input")
    assert ce.message == "Only 'text' content type is supported."


@pytest.mark.parametrize(("status", "expected"), [(400, 400), (413, 413), (422, 422), (404, 400)])
def test_rejected_keeps_a_4xx_status(status: int, expected: int) -> None:
    err = classify_http_error(status, JSON, b'{"error": "bad field"}')
    assert err.kind is ErrorKind.REJECTED
    ce = to_client_error(err)
    assert ce.status == expected
    assert ce.type == "invalid_request_error"
    assert ce.message == "bad field"


def test_rejected_keeps_a_string_code_and_param() -> None:
    body = b'{"error":{"message":"bad","code":"invalid_value","param":"temperature"}}'
    ce = to_client_error(classify_http_error(400, JSON, body))
    assert (ce.code, ce.param) == ("invalid_value", "temperature")
    ce = to_client_error(classify_http_error(400, JSON, LLAMA_TOOL_CHOICE_400))
    assert ce.code is None  # a numeric code only repeats the status


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        (ErrorKind.TIMEOUT, 504, "upstream_timeout"),
        (ErrorKind.TRANSIENT, 502, "upstream_error"),
        (ErrorKind.OTHER, 502, "upstream_error"),
        (ErrorKind.PROTOCOL, 502, "upstream_error"),
        (ErrorKind.INCOMPLETE, 502, "upstream_error"),
        (ErrorKind.NOT_A_STREAM, 502, "upstream_error"),
        (ErrorKind.MODEL_OUTPUT, 502, "upstream_error"),
    ],
)
def test_gateway_failures(kind: ErrorKind, status: int, code: str) -> None:
    ce = to_client_error(UpstreamError(kind, "it broke", status=500))
    assert (ce.status, ce.type, ce.code) == (status, "upstream_error", code)
    assert "it broke" in ce.message


def test_credentials_in_messages_are_redacted() -> None:
    err = UpstreamError(ErrorKind.TRANSIENT, "sent Authorization: Bearer abc.def-123 upstream")
    assert "abc.def-123" not in to_client_error(err).message


def test_error_body_shape() -> None:
    ce = ClientError(400, "invalid_request_error", "content_filter", "blocked", "prompt")
    assert error_body(ce) == {
        "error": {
            "message": "blocked",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "content_filter",
        }
    }
    assert msgspec.json.decode(msgspec.json.encode(error_body(ce))) == error_body(ce)


def test_to_client_error_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        to_client_error(ValueError("x"))  # type: ignore[arg-type]


def test_deeply_nested_json_does_not_raise() -> None:
    for depth in (900, 5000):
        body = b"[" * depth + b"]" * depth
        assert classify_http_error(500, {}, body).kind is ErrorKind.TRANSIENT
        assert classify_stream_error(body).in_stream


def test_credentials_are_redacted_at_classification() -> None:
    body = b'{"error":{"message":"Incorrect API key provided: sk-proj-abcdefghijkl."}}'
    assert "abcdefghijkl" not in classify_http_error(401, JSON, body).message
    payload = {"error": "upstream said: Bearer tok3n-value is invalid"}
    assert "tok3n-value" not in classify_stream_error(payload).message


def test_now_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        classify_http_error(429, {"Retry-After": "5"}, b"", now="now")  # type: ignore[arg-type]


def test_fastapi_validation_error_names_the_field_as_param() -> None:
    body = b'{"detail":[{"type":"extra_forbidden","loc":["body","stream_options"],"msg":"Extra inputs are not permitted"}]}'
    err = classify_http_error(422, {}, body)
    assert err.param == "stream_options"
    assert err.message == "Extra inputs are not permitted"


def test_every_string_of_an_error_is_redacted() -> None:
    from svir.wire.redact import redact_error

    key = "upkey-7d2f0c"
    own = ClientError(429, "rate_limit_error", "rpm_exceeded", "svir's own")
    err = UpstreamError(
        ErrorKind.REJECTED,
        f"refused {key}",
        status=400,
        code=key,
        type=f"type:{key}",
        param=key,
        retry_after=2.0,
        details={"nested": [{"deeper": (key, 1)}], key: True, "client_error": own, "n_ctx": 9},
    )
    clean = redact_error(err, (key,))
    assert key not in repr(
        (clean.message, clean.code, clean.type, clean.param, msgspec.json.encode(clean.details))
    )
    assert (clean.kind, clean.status, clean.retry_after) == (err.kind, 400, 2.0)
    assert clean.code == clean.param == "[redacted]" and clean.type == "type:[redacted]"
    assert clean.details["client_error"] is own and clean.details["n_ctx"] == 9
    assert clean.details["nested"] == [{"deeper": ("[redacted]", 1)}]
    # Nothing to take out: the very same error.
    assert redact_error(clean, (key,)) is clean
    numeric = UpstreamError(ErrorKind.TRANSIENT, "it broke", code=500)
    assert redact_error(numeric, (key,)) is numeric


def test_details_are_read_for_secrets_only_so_deep_and_so_far() -> None:
    from svir.wire.redact import redact_error

    deep: dict[str, Any] = {"v": "s3cret-token"}
    for _ in range(5000):
        deep = {"d": deep}
    wide = {f"k{i}": "s3cret-token" for i in range(10_000)}
    err = UpstreamError(ErrorKind.OTHER, "x", details={"deep": deep, "wide": wide})
    clean = redact_error(err, ("s3cret-token",))
    shown = msgspec.json.encode(clean.details).decode()
    # What was past the bounds is left out rather than passed on unread.
    assert "s3cret" not in shown and len(shown) < 10_000


def test_classification_redacts_credentials_in_every_field() -> None:
    token = "Bearer abcdefgh12345678"
    body = json.dumps(
        {"error": {"message": "no", "code": token, "param": token, "type": f"sk-{'x' * 20}"}}
    ).encode()
    err = classify_http_error(400, JSON, body)
    assert "abcdefgh12345678" not in f"{err.code} {err.param}" and "xxxxxxxx" not in str(err.type)
    err = classify_stream_error({"error": {"message": "no", "code": token}})
    assert "abcdefgh12345678" not in str(err.code)


@pytest.mark.parametrize(
    "text",
    [
        "Missing API key: send it as 'Authorization: Bearer <key>' (a key svir issued).",
        "Clients send it as: Authorization: Bearer <secret>",
        "send a Bearer token",
        "Authorization: Bearer [redacted]",
        "the Bearer authentication scheme",
    ],
)
def test_placeholders_and_words_are_not_credentials(text: str) -> None:
    from svir.wire.redact import redact

    assert redact(text) == text


@pytest.mark.parametrize(
    "token",
    ["abc.def-123", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln", "QWxhZGRpbjpPcGVuU2VzYW1lQUJD=="],
)
def test_bearer_credentials_are_redacted(token: str) -> None:
    from svir.wire.redact import redact

    assert (
        redact(f"got 'Authorization: Bearer {token}'") == "got 'Authorization: Bearer [redacted]'"
    )


def test_svirs_own_401_keeps_its_hint_when_its_client_reads_it() -> None:
    # What `svir models` and `svir chat` read of svir's answer to a request without a key.
    hint = "Missing API key: send it as 'Authorization: Bearer <key>' (a key svir issued)."
    body = msgspec.json.encode({"error": {"message": hint, "type": "invalid_request_error"}})
    assert classify_http_error(401, JSON, body).message == hint


# ---------------------------------------------------------------------------------------------
# Anthropic's errors (the upstream kind `anthropic`): `{"type":"error","error":{"type","message"}}`


def anthropic_error(type_: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


def test_anthropic_529_overloaded_is_transient_and_retried() -> None:
    err = classify_http_error(529, JSON, anthropic_error("overloaded_error", "Overloaded"))
    assert (err.kind, err.type, err.message) == (
        ErrorKind.TRANSIENT,
        "overloaded_error",
        "Overloaded",
    )
    assert err.retryable


def test_anthropic_429_keeps_retry_after() -> None:
    body = anthropic_error("rate_limit_error", "Number of request tokens has exceeded your limit")
    err = classify_http_error(429, {**JSON, "retry-after": "7"}, body)
    assert (err.kind, err.retry_after) == (ErrorKind.RATE_LIMITED, 7.0)
    assert to_client_error(err).headers == {"Retry-After": "7"}


@pytest.mark.parametrize(
    ("status", "type_"), [(401, "authentication_error"), (403, "permission_error")]
)
def test_anthropic_auth_errors(status: int, type_: str) -> None:
    err = classify_http_error(status, JSON, anthropic_error(type_, "invalid x-api-key"))
    assert err.kind is ErrorKind.AUTH
    assert to_client_error(err).status == 502


def test_anthropic_prompt_too_long_is_an_overflow_in_openais_words() -> None:
    body = anthropic_error(
        "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
    )
    err = classify_http_error(400, JSON, body)
    assert err.kind is ErrorKind.CONTEXT_OVERFLOW
    ce = to_client_error(err)
    assert (ce.status, ce.code) == (400, "context_length_exceeded")
    assert ce.message.startswith(
        "This model's maximum context length is 200000 tokens. However, your messages resulted in"
        " 208310 tokens."
    )


def test_anthropic_unknown_model_is_model_not_found_and_a_wrong_path_is_not() -> None:
    missing = classify_http_error(404, JSON, anthropic_error("not_found_error", "model: claude-x"))
    assert missing.kind is ErrorKind.MODEL_NOT_FOUND
    path = classify_http_error(404, JSON, anthropic_error("not_found_error", "Not Found"))
    assert path.kind is ErrorKind.OTHER


def test_anthropic_other_invalid_request_is_rejected() -> None:
    body = anthropic_error("invalid_request_error", "max_tokens: Field required")
    assert classify_http_error(400, JSON, body).kind is ErrorKind.REJECTED


@pytest.mark.parametrize(
    ("type_", "kind"),
    [
        ("overloaded_error", ErrorKind.TRANSIENT),
        ("api_error", ErrorKind.TRANSIENT),
        ("rate_limit_error", ErrorKind.RATE_LIMITED),
        ("authentication_error", ErrorKind.AUTH),
        ("timeout_error", ErrorKind.TIMEOUT),
        # Not one of Anthropic's kinds that speak for themselves: as any unknown error.
        ("invalid_request_error", ErrorKind.OTHER),
    ],
)
def test_anthropic_error_event_kinds(type_: str, kind: ErrorKind) -> None:
    payload = {"type": "error", "error": {"type": type_, "message": "m"}}
    err = classify_stream_error(payload, event="error")
    assert (err.kind, err.type, err.message, err.in_stream) == (kind, type_, "m", True)


def test_a_url_password_is_masked_and_nothing_else() -> None:
    assert (
        redact_url("redis://user:hunter2@127.0.0.1:6379/0") == "redis://user:***@127.0.0.1:6379/0"
    )
    assert (
        redact_url("postgresql://u:p%40ss@db/test?sslmode=require", "[redacted]")
        == "postgresql://u:[redacted]@db/test?sslmode=require"
    )
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("user@example.com has no scheme") == "user@example.com has no scheme"
    # Not a URL that parses (an unclosed IPv6 bracket): nothing of it is shown.
    assert redact_url("redis://u:secret@[::1/0") == "***"
