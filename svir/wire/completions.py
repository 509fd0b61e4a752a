"""Text completion and fill-in-the-middle, sans-IO: OpenAI's legacy `/v1/completions` request in
(`parse_completion_request`) as the canonical completion request, that request out as the body of
each upstream dialect (llama-server's native `/completion` and `/infill`, OpenAI's
`/v1/completions`), their streams decoded into the canonical events every chat call speaks, and
those events out as `text_completion` SSE chunks (`TextCompletionEncoder`) or one object
(`completion_object`). docs/completions.md says what each field does.

The canonical completion request is a dict like the chat one, with `prompt` (and `suffix` for
fill-in-the-middle) where a chat request has `messages`: `is_completion` tells them apart, so one
`ChatCall` under one policy carries both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar, Final, Literal

import msgspec

from svir.wire.answer import AnswerFold
from svir.wire.classify import classify_stream_error
from svir.wire.decoder import DONE_MARKER, ChatDecoder, ChunkObject, usage_event
from svir.wire.encoder import ChunkEncoder, usage_dict
from svir.wire.errors import BodyError, ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    Keepalive,
    Role,
    StreamError,
    TextDelta,
    Usage,
)
from svir.wire.jsonbody import json_type, shown
from svir.wire.sse import SSEEvent

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "CompletionDialect",
    "CompletionRequestError",
    "LlamaCompletionDecoder",
    "OpenAICompletionDecoder",
    "TextCompletionEncoder",
    "completion_object",
    "explain_fim_error",
    "is_completion",
    "is_fim",
    "llama_body",
    "llama_url",
    "openai_body",
    "openai_completions_url",
    "parse_completion_request",
]

# Which completion API an upstream speaks: llama-server's native one (`/completion`, and
# `/infill` with the model's own FIM tokens), or OpenAI's `/v1/completions` (FIM by `suffix`).
CompletionDialect = Literal["llama", "openai"]

# OpenAI's (and vLLM's) default for a completion without `max_tokens`: a base model left
# unbounded writes until its context is full.
DEFAULT_MAX_TOKENS: Final = 16
_INT64: Final = 2**63

# Fields of the legacy request svir reads itself; anything else is the client's extra for the
# upstream (llama-server's `min_p`, vLLM's `repetition_penalty`), passed on as it is.
_READ: Final = frozenset(
    {
        "model",
        "prompt",
        "suffix",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "echo",
        "logprobs",
        "n",
        "best_of",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "user",
        "logit_bias",
    }
)


class CompletionRequestError(BodyError):
    """A completion request svir will not send: `param` names the field, `code` what is wrong."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def is_completion(request: Mapping[str, Any]) -> bool:
    """Whether a canonical request is a text completion (a `prompt`) rather than a chat."""
    return "prompt" in request and "messages" not in request


def is_fim(request: Mapping[str, Any]) -> bool:
    """Whether a completion asks to fill in the middle: a non-empty `suffix`."""
    suffix = request.get("suffix")
    return isinstance(suffix, str) and suffix != ""


# ---------------------------------------------------------------------------------------------
# The request


def _fail(param: str, message: str, code: str = "invalid_value") -> CompletionRequestError:
    return CompletionRequestError(param, f"{param}: {message}" if param else message, code)


def _number(key: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(key, f"must be a number, not {json_type(value)}", "invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(key, "must be a finite number")
    if isinstance(value, int) and abs(value) >= _INT64:
        raise _fail(key, "is out of range")
    return value


def _integer(key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer() and abs(value) < _INT64:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, not {json_type(value)}", "invalid_type")
    if abs(value) >= _INT64:
        raise _fail(key, "is out of range")
    return value


def stop_list(key: str, value: Any) -> list[str]:
    """`stop`: a string or an array of strings; the empty ones dropped (they stop nothing)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _fail(key, f"must be a string or an array of strings, not {json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _fail(f"{key}[{i}]", f"must be a string, not {json_type(item)}", "invalid_type")
    return [s for s in value if s]


def _prompt(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return value[0]
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise _fail("prompt", "token arrays are not supported; send the prompt as text")
        if len(value) != 1:
            # The stream carries one choice; several prompts would be several answers.
            raise _fail("prompt", f"must be one prompt (n=1), not an array of {len(value)}")
        raise _fail("prompt[0]", f"must be a string, not {json_type(value[0])}", "invalid_type")
    if value is None:
        raise _fail("prompt", "is required", "missing_required_parameter")
    raise _fail("prompt", f"must be a string or an array of one string, not {json_type(value)}")


def _typed(body: dict[str, Any], key: str, kind: type, words: str) -> Any:
    """`body[key]` if it is of `kind` (None when absent or null); else the client's 400."""
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise _fail(key, f"must be {words}, not {json_type(value)}", "invalid_type")
    return value


def parse_completion_request(body: Any) -> dict[str, Any]:
    """The canonical completion request for an OpenAI `/v1/completions` body; raises
    CompletionRequestError (a 400) and nothing else, for any JSON value."""
    if not isinstance(body, dict):
        raise CompletionRequestError(
            None, f"the request body must be a JSON object, not {json_type(body)}"
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        if model is None or model == "":
            raise _fail("model", "is required", "missing_required_parameter")
        raise _fail("model", f"must be a string, not {json_type(model)}", "invalid_type")
    out: dict[str, Any] = {"model": model, "prompt": _prompt(body.get("prompt"))}
    suffix = _typed(body, "suffix", str, "a string")
    if suffix:
        out["suffix"] = suffix
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", f"must be a boolean, not {json_type(stream)}", "invalid_type")
    out["stream"] = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _fail("stream_options", f"must be an object, not {json_type(options)}")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _fail("stream_options.include_usage", f"must be a boolean, not {shown(usage)}")
        out["stream_options"] = {"include_usage": bool(usage)}
    limit = body.get("max_tokens")
    if limit is None:
        out["max_tokens"] = DEFAULT_MAX_TOKENS
    else:
        limit = _integer("max_tokens", limit)
        if limit < 1:
            raise _fail("max_tokens", f"must be at least 1, not {limit}")
        out["max_tokens"] = limit
    for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        value = body.get(key)
        if value is not None:
            out[key] = _number(key, value)
    seed = body.get("seed")
    if seed is not None:
        out["seed"] = _integer("seed", seed)
    stop = body.get("stop")
    if stop is not None:
        stops = stop_list("stop", stop)
        if stops:
            out["stop"] = stops
    echo = body.get("echo")
    if echo not in (None, False):
        # svir streams what the model writes; echoing the prompt back is the client's to do.
        raise _fail("echo", f"only false is supported, not {shown(echo)}", "unsupported_value")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, False):
        # No upstream dialect's log-probabilities reach the canonical events.
        raise _fail(
            "logprobs",
            "is not supported: svir does not pass log-probabilities through; leave it out",
            "unsupported_value",
        )
    for key in ("n", "best_of"):
        value = body.get(key)
        if value is not None and _integer(key, value) != 1:
            raise _fail(key, f"only {key}=1 is supported", "unsupported_value")
    user = _typed(body, "user", str, "a string")
    if user is not None:
        out["user"] = user
    bias = _typed(body, "logit_bias", dict, "an object")
    if bias:
        out["logit_bias"] = bias
    for key, value in body.items():
        if key not in _READ and value is not None:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Upstream bodies and URLs

# Canonical fields no upstream body carries as they are (the builders map them).
_NOT_COPIED: Final = frozenset(
    {"model", "prompt", "suffix", "stream", "stream_options", "max_tokens", "user", "num_ctx"}
)


def llama_url(base: str, fim: bool) -> str:
    """llama-server's native endpoint: `/infill` for fill-in-the-middle, else `/completion`.
    They live at the server's root, not under the `/v1` of its OpenAI-compatible API."""
    root = base.rstrip("/").removesuffix("/v1")
    return f"{root}/infill" if fim else f"{root}/completion"


def openai_completions_url(base: str) -> str:
    """`{base}/completions`."""
    return f"{base.rstrip('/')}/completions"


def llama_body(request: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The body of llama-server's `/completion` (or `/infill`, with a suffix). `/infill` puts the
    model's own FIM tokens around `input_prefix` and `input_suffix`; `/completion` takes the
    prompt as it is. `cache_prompt` lets the next keystroke's request reuse the evaluated
    prefix."""
    body: dict[str, Any] = {"model": model_id, "stream": True, "cache_prompt": True}
    if is_fim(request):
        body["input_prefix"] = request["prompt"]
        body["input_suffix"] = request["suffix"]
    else:
        body["prompt"] = request["prompt"]
    limit = request.get("max_tokens")
    if limit is not None:
        body["n_predict"] = limit
    for key, value in request.items():
        if key not in _NOT_COPIED and value is not None:
            body[key] = value
    return body


def openai_body(request: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The body of an OpenAI-compatible `/v1/completions`, streamed with usage."""
    body: dict[str, Any] = {
        "model": model_id,
        "prompt": request["prompt"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if is_fim(request):
        body["suffix"] = request["suffix"]
    for key in ("max_tokens", "user"):
        value = request.get(key)
        if value is not None:
            body[key] = value
    for key, value in request.items():
        if key not in _NOT_COPIED and value is not None:
            body[key] = value
    return body


# How servers word a refusal to fill in the middle: llama-server, vLLM, Ollama.
_NO_FIM_PHRASES: Final = ("infill is not supported", "suffix is not", "does not support insert")


def explain_fim_error(error: UpstreamError, model: str) -> UpstreamError:
    """A server's refusal to fill in the middle as a 400 that names the model: llama-server
    answers `/infill` for a model without FIM tokens with 501 ("Infill is not supported by this
    model"), vLLM's `/v1/completions` refuses any `suffix`."""
    text = error.message.lower()
    if any(phrase in text for phrase in _NO_FIM_PHRASES):
        return UpstreamError(
            ErrorKind.UNSUPPORTED_INPUT,
            f"The model {model!r} cannot fill in the middle (suffix): the server said: "
            f"{error.message.strip()}",
            status=error.status,
            code=error.code,
            type=error.type,
            param="suffix",
        )
    return error


# ---------------------------------------------------------------------------------------------
# Stream decoders


class _LlamaChunk(msgspec.Struct, gc=False):
    content: str | None = None
    stop: bool = False
    stop_type: str | None = None
    model: str | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    timings: dict[str, Any] | None = None
    error: Any = None


_llama_decoder = msgspec.json.Decoder(_LlamaChunk)
_any_decoder = msgspec.json.Decoder()

# llama-server's `stop_type` as an OpenAI finish reason.
_LLAMA_FINISH: Final[Mapping[str, str]] = {"limit": "length", "eos": "stop", "word": "stop"}


class _CompletionDecoder(ChatDecoder):
    """What both completion decoders share: the role before the first text, the end, the cut."""

    # Plain `data:` events split in one pass (SSEParser.feed_plain), each decoded as `_event`.
    _plain_ok = True

    def __init__(
        self,
        *,
        think_tags: bool = False,
        tool_names: Collection[str] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # A completion is text as the model wrote it: no think tags split off, no tools.
        super().__init__(clock=clock)
        self._role_sent = False

    @property
    def tool_calls(self) -> list[Any]:
        return []

    def _text(self, text: str, out: list[Event]) -> None:
        if not self._role_sent:
            self._role_sent = True
            out.append(Role("assistant", self.id, self.model, self.created))
        if text:
            out.append(TextDelta(text))
            self._visible += 1

    def _end(self, reason: str, out: list[Event]) -> None:
        if not self._role_sent:
            self._text("", out)
        self._finish(reason, out)

    def _cut(self, out: list[Event]) -> None:
        self._fail(
            UpstreamError(
                ErrorKind.INCOMPLETE, "the upstream stream ended before its end", in_stream=True
            ),
            out,
        )

    def _error_payload(self, ev: SSEEvent, out: list[Event]) -> bool:
        """An `event: error` or an `{"error": ...}` data frame ends the stream; True if it was."""
        if ev.event == "error":
            try:
                payload = _any_decoder.decode(ev.data)
            except msgspec.DecodeError:
                payload = ev.data.decode("utf-8", "replace")
            self._fail(classify_stream_error(payload, event="error"), out)
            return True
        return False


class LlamaCompletionDecoder(_CompletionDecoder):
    """llama-server's native stream (`/completion`, `/infill`): `data: {"content", "stop"}`
    frames, the last with `stop: true`, its counts and `stop_type`, and no `[DONE]`."""

    def _event(self, ev: SSEEvent, out: list[Event]) -> None:
        if self._error_payload(ev, out):
            return
        if ev.data == DONE_MARKER:
            self._protocol("[DONE] before the last chunk (stop: true)", out)
            return
        chunk = self._chunk(_llama_decoder, ev.data, out)
        if chunk is None:
            return
        if chunk.model and not self.model:
            self.model = chunk.model
        self._text(chunk.content or "", out)
        if chunk.stop:
            prompt = chunk.tokens_evaluated or 0
            completion = chunk.tokens_predicted or 0
            cached = (chunk.timings or {}).get("cache_n")
            self.usage = Usage(
                prompt,
                completion,
                prompt + completion,
                cached_tokens=cached if isinstance(cached, int) and cached >= 0 else None,
            )
            self._end(_LLAMA_FINISH.get(chunk.stop_type or "", "stop"), out)


_openai_decoder = msgspec.json.Decoder(ChunkObject)


class OpenAICompletionDecoder(_CompletionDecoder):
    """An OpenAI-compatible `/v1/completions` stream: `text_completion` chunks, usage in its own
    chunk, `[DONE]`."""

    def _event(self, ev: SSEEvent, out: list[Event]) -> None:
        if self._error_payload(ev, out):
            return
        if ev.data == DONE_MARKER:
            self._end(self.finish_reason or "stop", out)
            return
        chunk = self._chunk(_openai_decoder, ev.data, out)
        if chunk is None:
            return
        if chunk.id and not self.id:
            self.id = chunk.id
            self.model = chunk.model or ""
            self.created = int(chunk.created or 0)
        for choice in chunk.choices or ():
            if choice.index:
                continue  # n is 1
            if choice.text:
                self._text(choice.text, out)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        if chunk.usage is not None:
            self.usage = usage_event(chunk.usage)


# ---------------------------------------------------------------------------------------------
# Encoders

_enc = msgspec.json.encode


class TextCompletionEncoder(ChunkEncoder):
    """The canonical events as OpenAI's `text_completion` SSE chunks: one per piece of text, the
    finish in a chunk of its own, then usage (when asked for), `[DONE]` and the one error frame
    of a failure as a chat stream has them (svir.wire.encoder)."""

    __slots__ = ()
    OBJECT: ClassVar[bytes] = b"text_completion"

    def _choice(self, text: str, finish: str | None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        return self._head + b"[" + _enc(choice) + b"]}\n\n"

    def encode(self, event: Event) -> bytes:
        """The bytes for one event (possibly none)."""
        if self._ended:
            return b""
        # On the exact type: see svir.wire.events.
        if type(event) is TextDelta:
            return self._choice(event.text, None)
        if type(event) is Finish:
            return self._choice("", event.reason)
        if type(event) in _CHAT_FRAMED:
            return super().encode(event)
        return b""  # Role and the chat-only events have no place in a text completion


# The events a text completion stream frames as a chat stream does.
_CHAT_FRAMED: Final = frozenset({Usage, Done, Keepalive, StreamError})


def completion_object(answer: AnswerFold, *, id: str, model: str, created: int) -> dict[str, Any]:
    """The non-streamed `text_completion` object for a folded answer."""
    out: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": int(created),
        "model": model,
        "choices": [
            {
                "text": "".join(answer.text),
                "index": 0,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
    }
    if answer.usage is not None:
        out["usage"] = usage_dict(answer.usage)
    return out
