"""The stream decoder: any server's chat-completion SSE bytes in, normalized events out (§3–§4).

It knows no server by name. Every dialect in the reference is handled by what the chunks carry:
reasoning under either key or both (one text), inline think tags when the caller turns them on,
tool calls in pieces, errors inside a 200 stream, usage in its own chunk, Azure's content-filter
verdicts. The finish is held until `[DONE]`, because a verdict after the model's `stop` can still
turn the answer into a content-filter block (§3.7); usage is held with it so that the canonical
order (finish, usage, done) never depends on the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar

import msgspec

from svir.wire.classify import classify_stream_error
from svir.wire.errors import (
    ErrorKind,
    SSEError,
    ToolCallError,
    UpstreamError,
)
from svir.wire.events import (
    SILENT,
    ContentFilter,
    Done,
    Event,
    FilterScope,
    Finish,
    Keepalive,
    ReasoningCarrier,
    ReasoningDelta,
    RefusalDelta,
    Role,
    StreamError,
    TextDelta,
    Usage,
)
from svir.wire.speed import TokenRate
from svir.wire.sse import (
    DEFAULT_MAX_EVENT,
    DEFAULT_MAX_LINE,
    SSEComment,
    SSEEvent,
    SSEParser,
    encode_data,
)
from svir.wire.think import ThinkSplitter
from svir.wire.toolcalls import ToolCall, ToolCallAssembler, ToolCallPiece

DONE_MARKER = b"[DONE]"
# Events that put nothing visible on the wire (a relayed chunk of only these and usage is usage).
C = TypeVar("C")  # a decoder's chunk type


class _Delta(msgspec.Struct, gc=False):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallPiece] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int | None = 0
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    content_filter_results: dict[str, Any] | None = None
    content_filter_offsets: dict[str, Any] | None = None


class _TokenDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    completion_tokens_details: _TokenDetails | None = None
    prompt_tokens_details: _TokenDetails | None = None


class _ChunkBody(msgspec.Struct, gc=False):
    """A chunk without the stream's id, model and creation time, which the decoder takes from
    the first chunk that has them: the chunks after it are decoded as this, and the three
    skipped instead of made into objects every time."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None
    prompt_filter_results: list[dict[str, Any]] | None = None
    prompt_annotations: list[dict[str, Any]] | None = None


class _Chunk(_ChunkBody, gc=False):
    id: str | None = None
    model: str | None = None
    created: int | float | None = None


# A chunk as OpenAI's APIs stream it, for the other decoder of them: a text completion's
# (svir.wire.completions), whose choices carry `text` where a chat's carry a `delta`.
ChunkObject = _Chunk

_chunk_decoder = msgspec.json.Decoder(_Chunk)
_body_decoder = msgspec.json.Decoder(_ChunkBody)
_any_decoder = msgspec.json.Decoder()
_text_decoder = msgspec.json.Decoder(str)
# What `StreamDecoder._learn` puts in a chunk's text to prove where the text is; a chunk whose
# text is this one is not learnt from (the proof would prove nothing).
_PROBE_TEXT = "\u0000svir probe"
_PROBE = msgspec.json.encode(_PROBE_TEXT)
_CONTENT_KEY = b'"content":'
# Chunks a stream's shape is learnt from, at most: a stream whose chunks differ by more than
# their text (a field that changes every chunk) is tried twice, then left to the general path.
_LEARNS = 2


def verdict(
    results: Any, scope: FilterScope, offsets: dict[str, Any] | None = None
) -> ContentFilter | None:
    """A content-filter verdict, or None when no category detected or filtered anything."""
    if not isinstance(results, dict):
        return None
    categories: list[str] = []
    filtered = False
    for name, result in results.items():
        entries = result if isinstance(result, list) else [result]
        hit = False
        for entry in entries:
            if isinstance(entry, dict):
                if entry.get("filtered") is True:
                    filtered = hit = True
                elif entry.get("detected") is True:
                    hit = True
        if hit:
            categories.append(str(name))
    if not categories:
        return None
    return ContentFilter(scope, filtered, tuple(sorted(categories)), results, offsets)


def usage_event(u: _Usage) -> Usage:
    """Normalize a usage object, keeping the reasoning and cached token details."""
    prompt = u.prompt_tokens or 0
    completion = u.completion_tokens or 0
    return Usage(
        prompt,
        completion,
        u.total_tokens if u.total_tokens is not None else prompt + completion,
        u.completion_tokens_details.reasoning_tokens if u.completion_tokens_details else None,
        u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None,
    )


class ChatDecoder:
    """What every chat stream decoder shares, whatever protocol its events speak: SSE framing
    of bytes split anywhere, comments as keep-alives, the generation rate read once per feed,
    and one end (`Done`, or a `StreamError` after which nothing more is decoded). A subclass
    decodes one event (`_event`) and says what a stream cut before its end gives (`_cut`).
    Never raises on bad input: a stream that breaks the protocol ends with a `StreamError` of
    kind `protocol`.

    `StreamDecoder` reads OpenAI's chunks; `anthropic_upstream.AnthropicStreamDecoder` reads
    Anthropic's Messages events. A chat call holds either; the kind says which (`new_decoder`).
    """

    # Whether `feed` takes `SSEParser.feed_plain`'s fast path: for decoders whose `_data` is
    # cheaper than `_event` (a protocol of named events would never take it).
    _plain_ok = False

    def __init__(
        self,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        max_event: int = DEFAULT_MAX_EVENT,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._sse = SSEParser(max_line=max_line, max_event=max_event)
        self._clock = clock
        self.rate = TokenRate()
        self.id = ""
        self.model = ""
        self.created = 0
        self.reasoning_carrier: ReasoningCarrier | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.error: UpstreamError | None = None
        self.complete = False
        self._ended = False
        self._visible = 0  # chunks that showed something in the current feed

    @property
    def tokens_per_second(self) -> float | None:
        """Generation speed (§3.6), when a clock was given and the window allows it."""
        return self.rate.tokens_per_second

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls assembled so far."""
        raise NotImplementedError

    def feed(self, data: bytes) -> list[Event]:
        """Decode more response bytes."""
        if self._ended:
            return []
        out: list[Event] = []
        plain = self._sse.feed_plain(data) if self._plain_ok else None
        if plain is not None:
            for payload in plain:
                self._data(payload, out)
                if self._ended:
                    break
        else:
            try:
                items = self._sse.feed(data)
            except SSEError as exc:
                self._fail(UpstreamError(ErrorKind.PROTOCOL, str(exc), in_stream=True), out)
                return out
            for item in items:
                if self._ended:
                    break
                if isinstance(item, SSEEvent):
                    self._event(item, out)
                else:
                    out.append(Keepalive(item.text))
        if self._visible:
            self._tick()
        return out

    def feed_frames(self, data: bytes, usage_frames: bool) -> tuple[list[bytes], list[Event]]:
        """Decode more response bytes as `feed` does, and give each event's own data frame too
        (relay mode: the upstream's `data:` lines, re-framed as they came). Not framed: comments,
        an event that ended the stream with an error (the caller sends its own frame for it),
        and, unless `usage_frames`, a chunk that only carried usage."""
        if self._ended:
            return [], []
        out: list[Event] = []
        frames: list[bytes] = []
        plain = self._sse.feed_plain(data) if self._plain_ok else None
        if plain is not None:
            for payload in plain:
                usage, finish, before = self.usage, self.finish_reason, len(out)
                self._data(payload, out)
                if self.usage is usage or self._frame_usage(usage_frames, finish, out, before):
                    if self.error is None:
                        frames.append(b"data: " + payload + b"\n\n")
                if self._ended:
                    break
            if self._visible:
                self._tick()
            return frames, out
        try:
            items = self._sse.feed(data)
        except SSEError as exc:
            self._fail(UpstreamError(ErrorKind.PROTOCOL, str(exc), in_stream=True), out)
            return [], out
        for item in items:
            if self._ended:
                break
            if type(item) is not SSEEvent:
                out.append(Keepalive(item.text))  # type: ignore[union-attr]
                continue
            usage, finish, before = self.usage, self.finish_reason, len(out)
            self._event(item, out)
            if self.error is not None:
                continue  # an error is replaced by the caller's own frame
            if self.usage is not usage and not self._frame_usage(usage_frames, finish, out, before):
                continue  # only usage, which the client did not ask for
            payload = item.data
            frames.append(
                b"data: " + payload + b"\n\n" if payload.find(b"\n") < 0 else encode_data(payload)
            )
        if self._visible:
            self._tick()
        return frames, out

    def _frame_usage(
        self, usage_frames: bool, finish: str | None, out: list[Event], before: int
    ) -> bool:
        """Whether an event that brought usage is relayed: always when the client asked for
        usage, else only when it brought something else too (a finish, something visible)."""
        return (
            usage_frames
            or self.finish_reason != finish
            or not all(type(ev) in SILENT for ev in out[before:])
        )

    def feed_item(self, item: SSEEvent | SSEComment) -> list[Event]:
        """Decode one already-framed SSE item (for callers that also need the raw frames)."""
        if self._ended:
            return []
        out: list[Event] = []
        if isinstance(item, SSEEvent):
            self._event(item, out)
        else:
            out.append(Keepalive(item.text))
        if self._visible:
            self._tick()
        return out

    def _tick(self) -> None:
        # What one feed brought arrived at one time: the clock is read once per feed, not per
        # chunk (the time spent decoding a read is not the server's generation time).
        clock = self._clock
        if clock is not None:
            rate = self.rate  # TokenRate.tick in place: a call fewer on every read
            now = clock()
            if rate.first is None:
                rate.first = now
            rate.last = now
            rate.count += self._visible
        self._visible = 0

    def close(self) -> list[Event]:
        """The connection ended: without the protocol's end the answer is incomplete, never a
        success."""
        if self._ended:
            return []
        self._sse.close()
        out: list[Event] = []
        self._cut(out)
        return out

    def fail(self, error: UpstreamError) -> list[Event]:
        """End the stream with an error the caller saw (a timeout, a lost connection)."""
        if self._ended:
            return []
        out: list[Event] = []
        self._fail(error, out)
        return out

    def _fail(self, error: UpstreamError, out: list[Event]) -> None:
        self.error = error
        self._ended = True
        out.append(StreamError(error))

    def _chunk(self, decoder: msgspec.json.Decoder[C], data: bytes, out: list[Event]) -> C | None:
        """One data frame decoded as `decoder`'s chunk type (which has an `error` field); None
        when the frame ended the stream: an error object (in the chunk's shape or not), or
        something that is no chunk at all."""
        try:
            chunk = decoder.decode(data)
        except msgspec.ValidationError as exc:
            # The JSON may still be an error object of an unusual shape.
            try:
                payload = _any_decoder.decode(data)
            except msgspec.DecodeError:
                payload = None
            if isinstance(payload, dict) and payload.get("error") is not None:
                self._fail(classify_stream_error(payload), out)
            else:
                self._protocol(f"malformed chunk: {exc}", out)
            return None
        except msgspec.DecodeError as exc:
            self._protocol(f"chunk is not JSON: {exc}", out)
            return None
        error = getattr(chunk, "error", None)
        if error is not None:
            self._fail(classify_stream_error({"error": error}), out)
            return None
        return chunk

    def _finish(self, reason: str, out: list[Event]) -> None:
        """End the answer complete: its finish, the usage held until now, `Done`."""
        self.finish_reason = reason
        out.append(Finish(reason))
        if self.usage is not None:
            out.append(self.usage)
        out.append(Done())
        self.complete = True
        self._ended = True

    def _protocol(self, message: str, out: list[Event]) -> None:
        self._fail(UpstreamError(ErrorKind.PROTOCOL, message, in_stream=True), out)

    def _event(self, ev: SSEEvent, out: list[Event]) -> None:
        raise NotImplementedError

    def _data(self, data: bytes, out: list[Event]) -> None:
        """Decode one event of no name and one data line (`feed_plain`'s); a subclass that sets
        `_plain_ok` decodes it as `_event` would."""
        self._event(SSEEvent(data), out)

    def _cut(self, out: list[Event]) -> None:
        raise NotImplementedError


class StreamDecoder(ChatDecoder):
    """Feed the upstream's response bytes; get normalized events. Never raises on bad input:
    a stream that breaks the protocol ends with a `StreamError` of kind `protocol`."""

    def __init__(
        self,
        *,
        think_tags: bool = False,
        tool_names: Collection[str] | None = None,
        max_line: int = DEFAULT_MAX_LINE,
        max_event: int = DEFAULT_MAX_EVENT,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(max_line=max_line, max_event=max_event, clock=clock)
        self._think = ThinkSplitter() if think_tags else None
        self._tools = ToolCallAssembler(tool_names)
        self._role_sent = False
        self._blocked = False
        # The bytes of a content chunk before and after its text, and where the text starts:
        # a chunk made of the same bytes around another text is that chunk with that text
        # (`_learn` proved it), so its text is all there is to decode.
        self._around: tuple[bytes, bytes, int, int] | None = None
        self._learns = 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls assembled so far."""
        return self._tools.calls()

    def _cut(self, out: list[Event]) -> None:
        self._flush_think(out)
        self._fail(
            UpstreamError(
                ErrorKind.INCOMPLETE, "the upstream stream ended before [DONE]", in_stream=True
            ),
            out,
        )

    _plain_ok = True

    def _event(self, ev: SSEEvent, out: list[Event]) -> None:
        if ev.event == "error":
            data = ev.data
            try:
                payload = _any_decoder.decode(data)
            except msgspec.DecodeError:
                payload = data.decode("utf-8", "replace")
            self._fail(classify_stream_error(payload, event="error"), out)
            return
        self._data(ev.data, out)

    def _data(self, data: bytes, out: list[Event]) -> None:
        around = self._around
        if around is not None:
            head, tail, start, tail_len = around
            # Slices compared, not `startswith`: its arguments are parsed as a tuple each call.
            if data[:start] == head and data[-tail_len:] == tail:
                # (Head and tail overlapping leave no text, which is no JSON string.)
                try:
                    text = _text_decoder.decode(data[start:-tail_len])
                except msgspec.DecodeError:
                    text = ""
                think = self._think
                # The conditions of the content fast path below that depend on the text.
                if text and (think is None or (think.plain and "<" not in text)):
                    out.append(TextDelta(text))
                    self._visible += 1
                    return
        chunk: _ChunkBody | None
        try:
            chunk = (_body_decoder if self.id else _chunk_decoder).decode(data)
        except msgspec.DecodeError:
            chunk = None  # `[DONE]`, or what `_chunk` reports
        if chunk is None or chunk.error is not None:
            if data == DONE_MARKER:
                self._done(out)
                return
            chunk = self._chunk(_chunk_decoder, data, out)
            if chunk is None:
                return
        choices = chunk.choices
        if (
            choices is not None
            and len(choices) == 1
            and chunk.usage is None
            and self._role_sent
            and self.id
            and not chunk.prompt_filter_results
            and not chunk.prompt_annotations
        ):
            # The chunk almost every stream is made of: one choice of content, nothing else,
            # and (with think tags split) answer text with no marker in it or pending.
            choice = choices[0]
            delta = choice.delta
            think = self._think
            if (
                delta is not None
                and (content := delta.content)
                and not choice.index
                and delta.reasoning_content is None
                and delta.reasoning is None
                and delta.refusal is None
                and delta.tool_calls is None
                and not choice.content_filter_results
                and (think is None or (think.plain and "<" not in content))
            ):
                if self._learns < _LEARNS and choice.finish_reason is None:
                    self._learn(data, chunk, content)
                out.append(TextDelta(content))
                self._visible += 1
                if choice.finish_reason and self.finish_reason != "content_filter":
                    self.finish_reason = choice.finish_reason
                return
        self._take(chunk, out)

    def _learn(self, data: bytes, chunk: _ChunkBody, content: str) -> None:
        """Keep the bytes around `data`'s text (`_around`) if they make every chunk with another
        text the same chunk but for the text: `chunk` (`data` decoded, taken by the content
        fast path, with no finish) decoded again with another text in that place must be
        `chunk` with the other text in its delta and nothing else changed. Then any JSON string
        between those bytes is a chunk the content fast path takes, with that string as text."""
        self._learns += 1
        key = data.find(_CONTENT_KEY)
        start = key + len(_CONTENT_KEY)
        if key < 0 or content == _PROBE_TEXT or data[start : start + 1] != b'"':
            return
        end = start
        while True:  # the text's closing quote: the first one after which the text decodes
            end = data.find(b'"', end + 1)
            if end < 0:
                return
            try:
                text = _text_decoder.decode(data[start : end + 1])
            except msgspec.DecodeError:
                continue
            break
        head, tail = data[:start], data[end + 1 :]
        if text != content or not tail:
            return
        try:
            probe = _body_decoder.decode(head + _PROBE + tail)
        except msgspec.DecodeError:
            return
        choices = probe.choices
        if not choices or len(choices) != 1 or choices[0].delta is None:
            return
        delta = choices[0].delta
        if delta.content != _PROBE_TEXT:
            return  # the place is not the delta's text
        delta.content = content
        if probe == chunk:
            self._around = (head, tail, start, len(tail))

    def _take(self, chunk: _ChunkBody, out: list[Event]) -> None:
        """One chunk's events and state, whatever it carries."""
        if chunk.prompt_filter_results or chunk.prompt_annotations:
            for entry in chunk.prompt_filter_results or chunk.prompt_annotations or ():
                v = verdict(entry.get("content_filter_results"), "prompt")
                if v is not None:
                    self._blocked = self._blocked or v.filtered
                    out.append(v)
        if not self.id and type(chunk) is _Chunk and chunk.id:
            self.id = chunk.id
            self.model = chunk.model or ""
            self.created = int(chunk.created or 0)
        if chunk.choices:
            for choice in chunk.choices:
                if choice.index:
                    continue  # n is 1: only choice 0 is part of this protocol
                self._choice(choice, out)
        if chunk.usage is not None:
            self.usage = usage_event(chunk.usage)

    def _choice(self, choice: _Choice, out: list[Event]) -> None:
        if choice.content_filter_results:
            v = verdict(choice.content_filter_results, "completion", choice.content_filter_offsets)
            if v is not None:
                self._blocked = self._blocked or v.filtered
                out.append(v)
        delta = choice.delta
        if delta is not None:
            visible = False
            rc = delta.reasoning_content
            r = delta.reasoning
            if rc or r:
                if not self._role_sent:
                    self._role(out)
                if rc and r and rc != r:
                    # Two different texts: keep both rather than lose one.
                    out.append(ReasoningDelta(rc, "reasoning_content"))
                    out.append(ReasoningDelta(r, "reasoning"))
                elif rc:
                    # With both keys and one text (mlx-vlm's alias), it is one text, not two (D43).
                    out.append(ReasoningDelta(rc, "reasoning_content"))
                else:
                    out.append(ReasoningDelta(r or "", "reasoning"))
                if self.reasoning_carrier is None:
                    self.reasoning_carrier = "reasoning_content" if rc else "reasoning"
                visible = True
            content = delta.content
            if content:
                if not self._role_sent:
                    self._role(out)
                if self._think is None:
                    out.append(TextDelta(content))
                    visible = True
                else:
                    for is_reasoning, text in self._think.feed(content):
                        visible = True
                        if is_reasoning:
                            out.append(ReasoningDelta(text, "think"))
                            if self.reasoning_carrier is None:
                                self.reasoning_carrier = "think"
                        else:
                            out.append(TextDelta(text))
            if delta.refusal:
                if not self._role_sent:
                    self._role(out)
                out.append(RefusalDelta(delta.refusal))
                visible = True
            if delta.tool_calls:
                if not self._role_sent:
                    self._role(out)
                pieces = self._tools.feed(delta.tool_calls)
                if pieces:
                    out.extend(pieces)
                visible = True
            if delta.role and not self._role_sent:
                self._role(out)
            if visible:
                self._visible += 1
        if choice.finish_reason and self.finish_reason != "content_filter":
            self.finish_reason = choice.finish_reason

    def _role(self, out: list[Event]) -> None:
        self._role_sent = True
        out.append(Role("assistant", self.id, self.model, self.created))

    def _flush_think(self, out: list[Event]) -> None:
        if self._think is not None:
            for is_reasoning, text in self._think.flush():
                out.append(ReasoningDelta(text, "think") if is_reasoning else TextDelta(text))

    def _done(self, out: list[Event]) -> None:
        self._flush_think(out)
        if not self._role_sent:
            self._role(out)
        reason = self.finish_reason
        if self._blocked:
            reason = "content_filter"
        elif reason is None:
            # [DONE] with no finish: the server ended the answer without naming why.
            reason = "tool_calls" if self._tools else "stop"
        self.finish_reason = reason
        out.extend(self._tools.finish())
        if self._tools:
            try:
                self._tools.validate()
            except ToolCallError as exc:
                self._protocol(str(exc), out)
                return
        self._finish(reason, out)


class DecoderFactory(Protocol):
    """Makes a call's decoder from the options of the route (a kind's `new_decoder`)."""

    def __call__(
        self,
        *,
        think_tags: bool = ...,
        tool_names: Collection[str] | None = ...,
        clock: Callable[[], float] | None = ...,
    ) -> ChatDecoder: ...
