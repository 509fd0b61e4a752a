"""Text completion and fill-in-the-middle, sans-IO: the canonical completion request (what
OpenAI's legacy `/v1/completions` request is checked into, svir.protocols.completions.request)
out as the body of each upstream dialect (llama-server's native `/completion` and `/infill`,
OpenAI's `/v1/completions`), their streams decoded into the canonical events every chat call
speaks, and those events out as `text_completion` SSE chunks (`TextCompletionEncoder`) or one
object (`completion_object`). docs/completions.md says what each field does.

The canonical completion request is a dict like the chat one, with `prompt` (and `suffix` for
fill-in-the-middle) where a chat request has `messages`: `is_completion` tells them apart, so one
`ChatCall` under one policy carries both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar, Final, Literal

import msgspec

from svir.wire.answer import AnswerFold
from svir.wire.classify import classify_stream_error
from svir.wire.decoder import DONE_MARKER, ChatDecoder, ChunkObject, usage_event
from svir.wire.encoder import ChunkEncoder, usage_dict
from svir.wire.errors import ErrorKind, UpstreamError
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
from svir.wire.sse import SSEEvent

__all__ = [
    "CompletionDialect",
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
]

# Which completion API an upstream speaks: llama-server's native one (`/completion`, and
# `/infill` with the model's own FIM tokens), or OpenAI's `/v1/completions` (FIM by `suffix`).
CompletionDialect = Literal["llama", "openai"]


def is_completion(request: Mapping[str, Any]) -> bool:
    """Whether a canonical request is a text completion (a `prompt`) rather than a chat."""
    return "prompt" in request and "messages" not in request


def is_fim(request: Mapping[str, Any]) -> bool:
    """Whether a completion asks to fill in the middle: a non-empty `suffix`."""
    suffix = request.get("suffix")
    return isinstance(suffix, str) and suffix != ""


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
