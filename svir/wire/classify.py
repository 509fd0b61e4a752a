"""Turn an upstream failure (an HTTP error, an error inside a stream, a wrong content type) into one
classified `UpstreamError`, and an `UpstreamError` into the OpenAI-shaped error svir answers with.
"""

from __future__ import annotations

import datetime
import email.utils
import html.parser
import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.redact import redact, redact_error

__all__ = [
    "BODY_SCAN_LIMIT",
    "ClientError",
    "check_stream_response",
    "classify_http_error",
    "classify_stream_error",
    "error_body",
    "error_message",
    "parse_retry_after",
    "to_client_error",
]

# An error body worth reading fits in far less; a proxy's HTML page or a runaway body does not
# deserve more parsing than this.
BODY_SCAN_LIMIT = 64 * 1024

# Upper bounds on what an error carries along: enough for any real server message, small enough
# that a body full of garbage does not end up whole in a log line or a client answer.
_MESSAGE_LIMIT = 2000
_SNIPPET_LIMIT = 200

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "context_window_exceeded"})
_OVERFLOW_TYPES = frozenset({"exceed_context_size_error"})
_CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})
_TRANSIENT_TYPES = frozenset(
    {"server_error", "internal_server_error", "internalservererror", "service_unavailable"}
)
# Anthropic's error types that say the kind whatever the status, in an HTTP error or an
# `event: error` in the stream: `overloaded_error` (HTTP 529) is a busy server, worth a retry.
_ANTHROPIC_TYPE_KINDS = {
    "overloaded_error": ErrorKind.TRANSIENT,
    "api_error": ErrorKind.TRANSIENT,
    "rate_limit_error": ErrorKind.RATE_LIMITED,
    "authentication_error": ErrorKind.AUTH,
    "permission_error": ErrorKind.AUTH,
    "timeout_error": ErrorKind.TIMEOUT,
}
# Anthropic's status for an overloaded API.
_OVERLOADED = 529

# Phrases that say a context overflow outright, whatever else the message holds. The mlx-vlm ones
# are its two refusals under a context limit (§5).
_OVERFLOW_PHRASES = (
    "maximum context length",
    # Anthropic's: "prompt is too long: 208310 tokens > 200000 maximum".
    "prompt is too long",
    "exceeds the available context budget",
    "leaves no room for compacted context",
)
# Otherwise an overflow is a context noun next to a word of exceeding: "greater than the context
# length" (LM Studio), "exceeds the available context size" (llama.cpp).
_CONTEXT_NOUNS = ("context length", "context size", "context window", "context budget")
_EXCEED_WORDS = ("exceed", "greater than", "longer than", "too long", "too large", "overflow")

# mlx-vlm's failed compaction (§5): it only compacts a conversation that does not fit, and sending
# the same conversation fails the same way, so it is an overflow and not a gateway failure.
_COMPACTION_PHRASE = "compaction summary hit its output limit"

# Refusals of a content part the server will never take, whatever status it chose (§2.2).
_UNSUPPORTED_INPUT_PHRASES = (
    "image input is not supported",
    "only 'text' content type is supported",
    "is not a multimodal model",
    "does not support multimodal",
    # A server or model that cannot embed: llama-server without `--embeddings` (501), or with a
    # pooling of none (400); Ollama for a model without embeddings.
    "does not support embeddings",
    "is not oai compatible",
)

# Words of a 404 that means the thing asked for is not there (a model, a route), as opposed to
# mlx-lm's habit of answering any refusal with 404.
_NOT_FOUND_PHRASES = ("not found", "does not exist", "no such")

# A server's own parser failing on what the model wrote, reported as a server error (5xx, or an
# error chunk with code 500): llama.cpp's chat parser (§3.5), Ollama's tool-call parser.
_MODEL_OUTPUT_PHRASES = (
    "failed to parse input",
    "the model produced output that does not match",
    "error parsing tool call",
)

# OpenAI's words for an overflow, which clients match on as well as the code: LiteLLM looks for
# "this model's maximum context length is", others for "maximum context length" or
# "context length". svir's overflow message starts with them, whatever the server said.
_OPENAI_OVERFLOW_START = "This model's maximum context length is"
# The context size where a server's words give it: llama.cpp's "context size (16384 tokens)",
# LM Studio's "context length of only 4096 tokens", OpenAI's and vLLM's "... is 8192 tokens".
_CONTEXT_TOKENS = re.compile(
    r"(?i)context (?:length|size|window)\s*(?:is\s+|of\s+)?(?:only\s+)?\(?([0-9]{1,9})\s*tokens"
)
# llama.cpp's "request (20056 tokens) exceeds the available context size".
_REQUEST_TOKENS = re.compile(r"(?i)\brequest \(([0-9]{1,9}) tokens\)")
# Anthropic's "prompt is too long: 208310 tokens > 200000 maximum".
_PROMPT_OVER = re.compile(r"(?i)\b([0-9]{1,9}) tokens > ([0-9]{1,9}) maximum")

_RETRY_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


class ClientError(msgspec.Struct, frozen=True):
    """An error as svir answers its own client: an HTTP status, headers, and the OpenAI fields."""

    status: int
    type: str
    code: str | None
    message: str
    param: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def error_message(obj: Any) -> str | None:
    """The human message of an error body of any known shape, or None if it carries none."""
    if isinstance(obj, str):
        return obj.strip() or None
    if isinstance(obj, list):
        # Some gateways wrap the error object in a one-element array; only that level is opened.
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return None
    error = obj.get("error")
    # LM Studio repeats the message at top level; the error object's copy is the one to trust.
    if isinstance(error, dict):
        found = _str_field(error, "message")
        if found is not None:
            return found
    elif isinstance(error, str) and error.strip():
        return error.strip()
    detail = obj.get("detail")
    if isinstance(detail, str) and detail.strip():
        return detail.strip()
    if isinstance(detail, list):
        for item in detail:
            if isinstance(item, dict):
                found = _str_field(item, "msg")
                if found is not None:
                    return found
    if isinstance(detail, dict):
        found = _str_field(detail, "message") or _str_field(detail, "msg")
        if found is not None:
            return found
    found = _str_field(obj, "message")
    if found is not None:
        return found
    errors = obj.get("errors")
    if isinstance(errors, list):
        for item in errors:
            if isinstance(item, dict):
                found = _str_field(item, "message")
                if found is not None:
                    return found
    return None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds, or an HTTP-date given `now`.

    A date already past means no wait (0.0). A date without `now`, a negative or non-finite
    number, and anything unreadable give None: the caller then has no hint, not a wrong one.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"Retry-After must be a str or None, not {type(value).__name__}")
    if now is not None and (isinstance(now, bool) or not isinstance(now, (int, float))):
        raise TypeError(f"now must be a unix time (float) or None, not {type(now).__name__}")
    text = value.strip()
    if not text:
        return None
    # float() alone would also take "inf", "nan", "1e9" and "1_0", none of which a server means.
    if _RETRY_SECONDS.fullmatch(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    if now is None or not math.isfinite(now):
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        # HTTP-dates are always GMT; a naive value must not be read in the local zone.
        when = when.replace(tzinfo=datetime.UTC)
    try:
        target = when.timestamp()
    except (OverflowError, ValueError, OSError):
        return None
    return max(0.0, target - now)


def classify_http_error(
    status: int,
    headers: Mapping[str, str],
    body: bytes | bytearray | memoryview,
    *,
    now: float | None = None,
) -> UpstreamError:
    """Classify a non-2xx answer of the model server from its status, headers and body (§5).

    `now` (unix time) lets an HTTP-date Retry-After count; without it only delta-seconds do.
    Raises only TypeError, for arguments of the wrong type.
    """
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"status must be an int, not {type(status).__name__}")
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a mapping, not {type(headers).__name__}")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    if now is not None and (isinstance(now, bool) or not isinstance(now, (int, float))):
        raise TypeError(f"now must be a unix time (float) or None, not {type(now).__name__}")

    head = bytes(body[:BODY_SCAN_LIMIT])
    parsed = _decode_json(head)
    fields = _Fields.read(parsed)
    message = fields.message or _snippet(head) or f"HTTP {status}"
    retry_after = _retry_after_header(headers, now)

    def make(kind: ErrorKind) -> UpstreamError:
        return redact_error(
            UpstreamError(
                kind,
                message,
                status=status,
                code=fields.code,
                type=fields.type,
                param=fields.param,
                retry_after=retry_after,
                details=fields.details,
            )
        )

    if status in (401, 403):
        return make(ErrorKind.AUTH)
    if status == 429:
        return make(ErrorKind.RATE_LIMITED)
    if status in (408, 504):
        return make(ErrorKind.TIMEOUT)
    # Past the statuses that speak for themselves, the body decides: servers give a request they
    # will never take a transient status (500, 502) or a not-found one (404) as often as a 400.
    kind = _kind_from_body(fields)
    if kind is not None:
        return make(kind)
    if status >= 500 and _says_model_output(fields):
        return make(ErrorKind.MODEL_OUTPUT)
    if status in (500, 502, 503, _OVERLOADED):
        return make(ErrorKind.TRANSIENT)
    if status in (400, 413, 422):
        return make(ErrorKind.REJECTED)
    if status == 404:
        if _says_model_not_found(fields):
            return make(ErrorKind.MODEL_NOT_FOUND)
        if fields.plain_error and not _says_not_found(fields):
            # mlx-lm answers every refusal before generation with 404 and its plain-string error
            # (§5); any other 404 is a route that is not there (a base URL that is wrong).
            return make(ErrorKind.REJECTED)
    return make(ErrorKind.OTHER)


def classify_stream_error(payload: Any, *, event: str | None = None) -> UpstreamError:
    """Classify an error that arrived inside a 200 stream (§3.5): an `{"error": …}` chunk or the
    data of an SSE `event: error`, already decoded from JSON (or the raw text if it was not).

    A numeric code is read as the HTTP status it names (500 is transient, 400 rejected), unless
    the words say the server's parser failed on what the model wrote (MODEL_OUTPUT); without a
    code the message and type decide, and an error nothing identifies is OTHER. Whatever the kind,
    the policy does not retry once bytes reached the client; the kind still tells it and the client
    what failed.
    """
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raw = bytes(payload[:BODY_SCAN_LIMIT])
        decoded = _decode_json(raw)
        payload = decoded if decoded is not None else raw.decode("utf-8", "replace")
    if isinstance(payload, str) and len(payload) > BODY_SCAN_LIMIT:
        payload = payload[:BODY_SCAN_LIMIT]
    fields = _Fields.read(payload)
    if fields.message is not None:
        message = fields.message
    elif isinstance(payload, str):
        message = _snippet(payload.encode("utf-8", "replace")) or "error in the stream"
    else:
        message = "the server reported an error inside the stream"
    details = dict(fields.details)
    if isinstance(event, str) and event:
        details.setdefault("event", event[:64])

    kind = _kind_from_body(fields)
    if kind is None:
        numeric = _numeric_code(fields.code)
        if (numeric is None or numeric >= 500) and _says_model_output(fields):
            kind = ErrorKind.MODEL_OUTPUT
        elif numeric is not None and 100 <= numeric <= 599:
            kind = _kind_for_status(numeric)
        elif fields.type is not None and fields.type.lower() in _TRANSIENT_TYPES:
            kind = ErrorKind.TRANSIENT
        elif fields.type in _ANTHROPIC_TYPE_KINDS:
            kind = _ANTHROPIC_TYPE_KINDS[fields.type]
        elif fields.code == "rate_limit_exceeded":
            kind = ErrorKind.RATE_LIMITED
        else:
            kind = ErrorKind.OTHER
    return redact_error(
        UpstreamError(
            kind,
            message,
            code=fields.code,
            type=fields.type,
            param=fields.param,
            in_stream=True,
            details=details,
        )
    )


def check_stream_response(status: int, content_type: str | None) -> UpstreamError | None:
    """For a streamed request: a 2xx answer that is not `text/event-stream` is not a stream (§5).

    Non-2xx statuses are left to `classify_http_error`; None means the answer may be read as SSE.
    """
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"status must be an int, not {type(status).__name__}")
    if content_type is not None and not isinstance(content_type, str):
        raise TypeError(f"content_type must be a str or None, not {type(content_type).__name__}")
    if not 200 <= status <= 299:
        return None
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type == "text/event-stream":
        return None
    shown = _clean(content_type or "", 100) or "no Content-Type"
    return UpstreamError(
        ErrorKind.NOT_A_STREAM,
        f"expected a text/event-stream answer, got {shown} (HTTP {status})",
        status=status,
        details={"content_type": shown},
    )


def to_client_error(err: UpstreamError, *, before_first_byte: bool = True) -> ClientError:
    """How svir reports an upstream failure to its client, in OpenAI's error vocabulary.

    An upstream auth failure is a 502: the client's key was fine, svir's was not, and a 401 would
    send the client to fix the wrong credential. Once the first byte has gone out
    (`before_first_byte=False`) the status and headers can no longer be sent, so no headers are
    given; the status and fields still describe the error for an in-stream error chunk.
    """
    if not isinstance(err, UpstreamError):
        raise TypeError(f"err must be an UpstreamError, not {type(err).__name__}")
    # svir's own error ending a stream (a token budget running out, svir.keys) says itself.
    own = err.details.get("client_error")
    if isinstance(own, ClientError):
        return own if before_first_byte else msgspec.structs.replace(own, headers={})
    message = _client_message(err.message)
    headers: dict[str, str] = {}
    kind = err.kind
    if kind is ErrorKind.AUTH:
        status_text = f" (HTTP {err.status})" if err.status is not None else ""
        # The server's own words say why (a wrong key, a missing one, a model not allowed); a
        # credential they quote is redacted (`redact`), as the caller's key already was.
        ce = ClientError(
            502,
            "upstream_error",
            "upstream_auth_error",
            f"The model server refused svir's credentials{status_text}: {message}",
        )
    elif kind is ErrorKind.RATE_LIMITED:
        if err.retry_after is not None and math.isfinite(err.retry_after):
            # Retry-After is whole seconds; rounding down would invite a retry that comes too soon.
            headers["Retry-After"] = str(max(0, math.ceil(err.retry_after)))
        ce = ClientError(429, "rate_limit_error", "rate_limit_exceeded", message)
    elif kind is ErrorKind.CONTEXT_OVERFLOW:
        ce = ClientError(
            400,
            "invalid_request_error",
            "context_length_exceeded",
            _overflow_message(message, err.details),
            param="messages",
        )
    elif kind is ErrorKind.MODEL_NOT_FOUND:
        # OpenAI's answer for a model it does not have: the OpenAI SDK raises NotFoundError and
        # does not retry, LiteLLM maps it to its NotFoundError.
        ce = ClientError(404, "invalid_request_error", "model_not_found", message, "model")
    elif kind is ErrorKind.CONTENT_FILTER:
        ce = ClientError(400, "invalid_request_error", "content_filter", message, err.param)
    elif kind is ErrorKind.UNSUPPORTED_INPUT:
        # The part refused (a completion's `suffix`), else the messages that carried it.
        param = err.param if err.param in ("suffix", "model") else "messages"
        ce = ClientError(400, "invalid_request_error", "unsupported_input", message, param)
    elif kind is ErrorKind.REJECTED:
        status = err.status if err.status in (400, 413, 422) else 400
        code = err.code if isinstance(err.code, str) else None
        ce = ClientError(status, "invalid_request_error", code, message, err.param)
    elif kind is ErrorKind.TIMEOUT:
        ce = ClientError(504, "upstream_error", "upstream_timeout", message)
    else:
        ce = ClientError(502, "upstream_error", "upstream_error", message)
    if headers and before_first_byte:
        ce = msgspec.structs.replace(ce, headers=headers)
    return ce


def error_body(ce: ClientError) -> dict[str, Any]:
    """The JSON body of an OpenAI-style error answer (also the payload of an in-stream error)."""
    return {
        "error": {
            "message": ce.message,
            "type": ce.type,
            "param": ce.param,
            "code": ce.code,
        }
    }


class _Fields:
    """What an error body says, read defensively from whatever shape it has."""

    __slots__ = ("code", "details", "message", "param", "plain_error", "type")

    def __init__(self) -> None:
        self.message: str | None = None
        self.plain_error = False
        self.code: str | int | None = None
        self.type: str | None = None
        self.param: str | None = None
        self.details: dict[str, Any] = {}

    @classmethod
    def read(cls, obj: Any) -> _Fields:
        fields = cls()
        message = error_message(obj)
        if message is not None:
            fields.message = _clean(message, _MESSAGE_LIMIT) or None
        if isinstance(obj, list) and obj:
            obj = obj[0]
        if not isinstance(obj, dict):
            return fields
        error = obj.get("error")
        fields.plain_error = isinstance(error, str) and bool(error.strip())
        source = error if isinstance(error, dict) else obj
        fields.code = _code(source.get("code"))
        fields.type = _short_str(source.get("type"))
        fields.param = _short_str(source.get("param"))
        detail = source.get("detail")
        if fields.param is None and isinstance(detail, list) and detail:
            # A FastAPI validation error names the field in `loc`: ["body", "stream_options"].
            first = detail[0]
            loc = first.get("loc") if isinstance(first, dict) else None
            if isinstance(loc, list) and loc and loc[0] == "body" and len(loc) > 1:
                fields.param = _short_str(loc[1])
        for key in ("n_prompt_tokens", "n_ctx"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                fields.details[key] = value
        inner = source.get("innererror")
        if isinstance(inner, dict):
            verdict = inner.get("content_filter_result")
            if isinstance(verdict, dict):
                fields.details["content_filter_result"] = verdict
            inner_code = _short_str(inner.get("code"))
            if inner_code is not None:
                fields.details["innererror_code"] = inner_code
        return fields


def _kind_from_body(fields: _Fields) -> ErrorKind | None:
    """The kind a body names by itself, whatever the status, or None to let the status decide."""
    code = fields.code.lower() if isinstance(fields.code, str) else None
    text = (fields.message or "").lower()
    if code in _CONTENT_FILTER_CODES:
        return ErrorKind.CONTENT_FILTER
    if any(phrase in text for phrase in _UNSUPPORTED_INPUT_PHRASES):
        return ErrorKind.UNSUPPORTED_INPUT
    if code in _OVERFLOW_CODES:
        return ErrorKind.CONTEXT_OVERFLOW
    if fields.type is not None and fields.type.lower() in _OVERFLOW_TYPES:
        return ErrorKind.CONTEXT_OVERFLOW
    if _COMPACTION_PHRASE in text:
        return ErrorKind.CONTEXT_OVERFLOW
    # vLLM words a too-large max_tokens with "maximum context length" too, but that is a parameter
    # the client can fix, not a conversation that does not fit.
    if fields.param == "max_tokens":
        return None
    if any(phrase in text for phrase in _OVERFLOW_PHRASES):
        return ErrorKind.CONTEXT_OVERFLOW
    if any(noun in text for noun in _CONTEXT_NOUNS) and any(w in text for w in _EXCEED_WORDS):
        return ErrorKind.CONTEXT_OVERFLOW
    return None


def _kind_for_status(status: int) -> ErrorKind:
    if status in (401, 403):
        return ErrorKind.AUTH
    if status == 429:
        return ErrorKind.RATE_LIMITED
    if status in (408, 504):
        return ErrorKind.TIMEOUT
    if status in (500, 502, 503, _OVERLOADED):
        return ErrorKind.TRANSIENT
    if status in (400, 413, 422):
        return ErrorKind.REJECTED
    return ErrorKind.OTHER


def _says_not_found(fields: _Fields) -> bool:
    if isinstance(fields.code, str) and fields.code.lower() == "model_not_found":
        return True
    text = (fields.message or "").lower()
    return any(phrase in text for phrase in _NOT_FOUND_PHRASES)


def _says_model_not_found(fields: _Fields) -> bool:
    """A 404 that names the model as what is missing (OpenAI's code, vLLM's "The model `x` does
    not exist", Ollama's "model 'x' not found"), not a path the server does not serve."""
    if isinstance(fields.code, str) and fields.code.lower() == "model_not_found":
        return True
    text = (fields.message or "").lower()
    if fields.type == "not_found_error" and text.startswith("model:"):
        return True  # Anthropic's "model: claude-x"
    return (fields.param == "model" or "model" in text) and _says_not_found(fields)


def _says_model_output(fields: _Fields) -> bool:
    text = (fields.message or "").lower()
    return any(phrase in text for phrase in _MODEL_OUTPUT_PHRASES)


def _decode_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, ValueError, UnicodeDecodeError):
        return None


def _retry_after_header(headers: Mapping[str, str], now: float | None) -> float | None:
    # Header names are case-insensitive; the mapping handed in may not be.
    found: dict[str, str] = {}
    try:
        items = list(headers.items())
    except Exception:  # a broken mapping must not turn an upstream error into svir's own
        return None
    for key, value in items:
        if isinstance(key, str) and isinstance(value, str):
            found.setdefault(key.strip().lower(), value)
    # OpenAI's retry-after-ms is the finer hint when both are present.
    millis = found.get("retry-after-ms")
    if millis is not None:
        parsed = parse_retry_after(millis)
        if parsed is not None:
            return parsed / 1000.0
    return parse_retry_after(found.get("retry-after"), now=now)


def _snippet(raw: bytes) -> str | None:
    """A short readable text of a body that carried no message: an HTML page's title or text."""
    text = raw.decode("utf-8", "replace")
    if text.lstrip().startswith("<"):
        text = _html_text(text)
    return _clean(text, _SNIPPET_LIMIT) or None


class _TextOfHTML(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.text: list[str] = []
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self.text.append(data)


def _html_text(markup: str) -> str:
    parser = _TextOfHTML()
    try:
        parser.feed(markup)
        parser.close()
    except Exception:  # the stdlib parser is lenient, but a hostile page must not escape as a crash
        return markup
    title = " ".join(parser.title).strip()
    return title or " ".join(parser.text)


def _clean(text: str, limit: int) -> str:
    """Whitespace collapsed, control characters dropped, cut to `limit` characters."""
    printable = "".join(ch if ch.isprintable() else " " for ch in text[: limit * 4])
    collapsed = " ".join(printable.split())
    if len(collapsed) > limit:
        return collapsed[: limit - 1] + "…"
    return collapsed


def _client_message(message: str) -> str:
    return _clean(redact(message), _MESSAGE_LIMIT) or "The model server failed."


def _overflow_message(message: str, details: Mapping[str, Any]) -> str:
    """An overflow told in OpenAI's words first (the context size when the server gave it, in
    its body or its words), then the server's own words; unchanged if it already starts so."""
    if message.startswith(_OPENAI_OVERFLOW_START):
        return message
    ctx = _int_detail(details, "n_ctx")
    prompt = _int_detail(details, "n_prompt_tokens")
    over = _PROMPT_OVER.search(message) if ctx is None or prompt is None else None
    if ctx is None:
        found = _CONTEXT_TOKENS.search(message)
        ctx = int(found.group(1)) if found else int(over.group(2)) if over else None
    if prompt is None:
        found = _REQUEST_TOKENS.search(message)
        prompt = int(found.group(1)) if found else int(over.group(1)) if over else None
    if ctx is None:
        head = f"{_OPENAI_OVERFLOW_START} exceeded by this request."
    elif prompt is None:
        head = f"{_OPENAI_OVERFLOW_START} {ctx} tokens. However, this request does not fit in it."
    else:
        head = (
            f"{_OPENAI_OVERFLOW_START} {ctx} tokens. However, your messages resulted in "
            f"{prompt} tokens."
        )
    return _clean(f"{head} The model server said: {message}", _MESSAGE_LIMIT)


def _int_detail(details: Mapping[str, Any], key: str) -> int | None:
    value = details.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _str_field(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _short_str(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value[:200]
    return None


def _code(value: Any) -> str | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value:
        return value[:200]
    return None


def _numeric_code(code: str | int | None) -> int | None:
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.isascii() and code.isdigit() and len(code) <= 3:
        return int(code)
    return None
