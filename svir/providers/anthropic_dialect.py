"""svir speaking Anthropic's Messages API to an upstream: the canonical chat request rewritten as
a Messages request, and the Messages stream decoded into canonical events (docs/providers.md,
`anthropic`).

The canonical request is OpenAI's chat request plus three keys that only this direction reads,
so that a conversation that came in as Anthropic (svir.protocols.anthropic.request writes them) or
from a client that keeps them (LiteLLM's names; svir's non-streamed answer carries
`thinking_blocks`) loses nothing a later turn needs; `build_messages` drops them for every other
upstream:

- `thinking_blocks` on an assistant message: its reasoning blocks in order, each
  `{"type": "thinking", "thinking", "signature"}` or `{"type": "redacted_thinking", "data"}`.
  They are sent as they are; a thinking block without a signature is left out (Anthropic refuses
  a block it did not sign), and plain `reasoning_content` is never sent (it has no signature).
- `cache_control` on a content part, a message or a tool: the mark goes on the block made of it
  (a message's mark on its last block).
- `is_error` on a tool message: the tool result's `is_error`.

Also read when present: `top_k`, and Anthropic's own thinking object, sent as it is: under
`THINKING_KEY` (an Anthropic client's, which no other kind is sent) or `thinking` (LiteLLM's
name, which OpenAI-compatible kinds such as Kimi also read); otherwise `reasoning_effort` sets
it. An Anthropic client's `output_config.effort`, under `EFFORT_KEY`, goes back as it came.
`build_upstream_body` leaves both keys and tools' `cache_control` out for every other kind.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import msgspec

from svir.wire.classify import classify_stream_error
from svir.wire.decoder import ChatDecoder
from svir.wire.errors import BodyError, ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningCarrier,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    Role,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from svir.wire.jsonbody import json_type, shown
from svir.wire.media import split_data_url
from svir.wire.request import EFFORT_KEY, THINKING_KEY, build_messages
from svir.wire.sse import DEFAULT_MAX_EVENT, DEFAULT_MAX_LINE, SSEEvent
from svir.wire.toolcalls import ToolCall

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "FINISH_REASONS",
    "THINKING_BUDGETS",
    "AnthropicStreamDecoder",
    "finish_reason",
    "json_object",
    "messages_body",
    "tool_input",
]

# The API version every request names (`anthropic-version`); the stream format below is its.
ANTHROPIC_VERSION: Final = "2023-06-01"

# Anthropic requires `max_tokens`. Without one from the client this is sent: what every Claude
# model can give (the oldest ones stop at 4096), plus the thinking budget when thinking is on.
DEFAULT_MAX_TOKENS: Final = 4096

# `reasoning_effort` as a thinking budget. 1024 is the least Anthropic takes; "minimal" and
# "none" turn thinking off.
THINKING_BUDGETS: Final[Mapping[str, int]] = {"low": 1024, "medium": 4096, "high": 16384}
_MIN_BUDGET: Final = 1024


_TEXT_PARTS: Final = frozenset({"text", "input_text"})
# Sampling settings Anthropic refuses while thinking is on (temperature and top_k at all, top_p
# below 0.95): clients send them by habit, and they are dropped rather than fail the request.
_NOT_WITH_THINKING: Final = ("temperature", "top_p", "top_k")
_CARRIER: Final[ReasoningCarrier] = "reasoning_content"


# ---------------------------------------------------------------------------------------------
# The request


# The other way, for an Anthropic upstream: each stop_reason Anthropic documents, as a finish.
# `pause_turn` (a server tool's long turn paused) ended the answer for now: a stop.
# `model_context_window_exceeded` is the output cut by the context: a length.
FINISH_REASONS: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}


def finish_reason(reason: str | None) -> str | None:
    """The canonical finish for an Anthropic stop_reason (None stays None; an unknown one is a
    stop, the turn having ended)."""
    if reason is None:
        return None
    return FINISH_REASONS.get(reason, "stop")


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as a tool_use block's `input` object. Empty arguments (a tool
    without parameters, or a server that sent none) are `{}`; arguments that are not a JSON
    object (a model's broken output) are `{}` too, since `input` can hold nothing else, and the
    tool then refuses the call in words the model can act on."""
    found = json_object(arguments)
    return {} if found is None else found


def json_object(arguments: str) -> dict[str, Any] | None:
    if not arguments.strip():
        return None
    try:
        value = msgspec.json.decode(arguments)
    except (msgspec.DecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def messages_body(client: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The Messages request for a chat request that passed `validate_chat_request`.

    Raises BodyError, naming the message and field, for a message that cannot be sent; the
    messages are checked by `build_messages` first, so a mistake has the same words as for any
    other upstream. Nothing of `client` is changed.
    """
    originals = client["messages"]
    built = build_messages(originals, reasoning_key=None)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, (msg, original) in enumerate(zip(built, originals, strict=True)):
        role = msg["role"]
        if role in ("system", "developer"):
            blocks = _mark_last(_text_blocks(msg["content"], original), original)
            if not turns:
                system.extend(blocks)
            else:
                # The protocol has one system prompt, before the conversation; a later system
                # message (Claude Code's environment notes) still reaches the model, as user text.
                _add(turns, "user", blocks)
        elif role == "user":
            _add(turns, "user", _user_blocks(msg["content"], original))
        elif role == "assistant":
            _add(turns, "assistant", _assistant_blocks(f"messages[{i}]", msg, original))
        else:
            _add(turns, "user", [_tool_result(msg, original)])

    if not turns:
        raise BodyError("messages holds no user or assistant message; Anthropic needs one")
    body: dict[str, Any] = {"model": model_id, "messages": turns, "stream": True}
    if system:
        body["system"] = system
    thinking = _thinking(client)
    limit = client.get("max_completion_tokens")
    if limit is None:
        limit = client.get("max_tokens")
    budget = thinking.get("budget_tokens") if thinking is not None else None
    if limit is None:
        limit = DEFAULT_MAX_TOKENS + (budget if isinstance(budget, int) else 0)
    elif thinking is not None and isinstance(budget, int) and budget >= limit:
        # Anthropic wants the budget below max_tokens; the client's cap stands, and a budget
        # below the least Anthropic takes means no thinking.
        budget = limit - 1
        thinking = {**thinking, "budget_tokens": budget} if budget >= _MIN_BUDGET else None
    body["max_tokens"] = limit
    if thinking:
        body["thinking"] = thinking
    effort = client.get(EFFORT_KEY)
    if isinstance(effort, str):
        body["output_config"] = {"effort": effort}
    if not thinking or thinking.get("type") == "disabled":
        for key in _NOT_WITH_THINKING:
            value = client.get(key)
            if value is not None:
                body[key] = value
    stop = client.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = client.get("tools")
    if tools:
        body["tools"] = [_tool(t) for t in tools]
        choice = _tool_choice(client.get("tool_choice"), client.get("parallel_tool_calls"))
        if choice is not None:
            body["tool_choice"] = choice
    user = _user_id(client)
    if user is not None:
        body["metadata"] = {"user_id": user}
    return body


def _add(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append blocks as a turn of `role`, merged into the last turn when it has the same role:
    Anthropic wants the roles to alternate, and all the results of one round of tool calls in one
    user message, ahead of any text in it."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        content = turns[-1]["content"]
        for block in blocks:
            if block["type"] == "tool_result":
                at = next((k for k, b in enumerate(content) if b["type"] != "tool_result"), None)
                content.insert(len(content) if at is None else at, block)
            else:
                content.append(block)
        return
    turns.append({"role": role, "content": list(blocks)})


def _text_blocks(text: str, original: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A text-only message's blocks: one per text part when it came in parts (each keeps its
    mark), else one of its text; none for empty text, which Anthropic refuses. The message's own
    mark is the caller's to place (`_mark_last`)."""
    parts = original.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(parts, list) and all(p.get("type") in _TEXT_PARTS for p in parts):
        for part in parts:
            if part["text"]:
                blocks.append(_marked({"type": "text", "text": part["text"]}, part))
    elif text:
        # Parts folded into one text (text files with it): their last mark goes on it.
        blocks = _folded_mark([{"type": "text", "text": text}], parts)
    return blocks


def _user_blocks(content: str | list[dict[str, Any]], original: Mapping[str, Any]) -> list[Any]:
    if isinstance(content, str):
        return _mark_last(_text_blocks(content, original), original)
    # Content with images: its text joined in one part, then the images (build_messages).
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part["type"] == "text":
            blocks.append({"type": "text", "text": part["text"]})
        else:
            blocks.append(_image(part["image_url"]["url"]))
    return _mark_last(_folded_mark(blocks, original.get("content")), original)


def _folded_mark(blocks: list[dict[str, Any]], parts: Any) -> list[dict[str, Any]]:
    """`blocks` made of `parts` folded together (their text joined): the last cache mark among
    the parts goes on the last block, which caches all that the mark did and more."""
    if blocks and isinstance(parts, list):
        for part in reversed(parts):
            if isinstance(part, dict) and isinstance(part.get("cache_control"), dict):
                blocks[-1] = _marked(blocks[-1], part)
                break
    return blocks


def _image(url: Any) -> dict[str, Any]:
    if not isinstance(url, str):
        raise BodyError("an image on disk cannot be sent to an Anthropic upstream")
    if url[:5].lower() != "data:":
        return {"type": "image", "source": {"type": "url", "url": url}}
    # build_messages checked the data URL; only its header is split off (an image is megabytes).
    comma = url.find(",", 0, 512)
    media_type = split_data_url("image_url.url", url[: comma + 1]).media_type
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": url[comma + 1 :]},
    }


def _assistant_blocks(
    where: str, msg: Mapping[str, Any], original: Mapping[str, Any]
) -> list[dict[str, Any]]:
    blocks = _thinking_blocks(f"{where}.thinking_blocks", original.get("thinking_blocks"))
    blocks.extend(_text_blocks(msg["content"], original))
    for call in msg.get("tool_calls") or ():
        fn = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": tool_input(fn["arguments"]),
            }
        )
    return _mark_last(blocks, original)


def _thinking_blocks(where: str, value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BodyError(f"{where} must be an array, not {json_type(value)}")
    blocks: list[dict[str, Any]] = []
    for k, block in enumerate(value):
        here = f"{where}[{k}]"
        if not isinstance(block, dict):
            raise BodyError(f"{here} must be an object, not {json_type(block)}")
        kind = block.get("type")
        if kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            if not isinstance(text, str):
                raise BodyError(f"{here}.thinking must be a string, not {json_type(text)}")
            if signature is not None and not isinstance(signature, str):
                raise BodyError(f"{here}.signature must be a string, not {json_type(signature)}")
            if signature:
                blocks.append({"type": "thinking", "thinking": text, "signature": signature})
        elif kind == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str) or not data:
                raise BodyError(f"{here}.data must be a non-empty string")
            blocks.append({"type": "redacted_thinking", "data": data})
        else:
            raise BodyError(
                f"{here}.type must be 'thinking' or 'redacted_thinking', not {shown(kind)}"
            )
    return blocks


def _tool_result(msg: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": msg["tool_call_id"]}
    if msg["content"]:
        block["content"] = msg["content"]
    if original.get("is_error") is True:
        block["is_error"] = True
    return _marked(block, original)


def _marked(block: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    mark = source.get("cache_control")
    if isinstance(mark, dict):
        block["cache_control"] = mark
    return block


def _mark_last(blocks: list[dict[str, Any]], original: Mapping[str, Any]) -> list[dict[str, Any]]:
    if blocks and isinstance(original.get("cache_control"), dict):
        blocks[-1] = _marked(dict(blocks[-1]), original)
    return blocks


def _thinking(client: Mapping[str, Any]) -> dict[str, Any] | None:
    given = client.get(THINKING_KEY)
    if not isinstance(given, dict):
        given = client.get("thinking")
    if isinstance(given, dict):
        return given
    effort = client.get("reasoning_effort")
    if effort in ("none", "minimal"):
        return {"type": "disabled"}
    budget = THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None
    return {"type": "enabled", "budget_tokens": budget} if budget is not None else None


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    out: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["input_schema"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return _marked(out, tool)


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any] | None = None
    if choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    elif choice == "none":
        out = {"type": "none"}
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise BodyError("tool_choice.function.name must be a non-empty string")
        out = {"type": "tool", "name": name}
    elif choice is not None:
        raise BodyError(f"tool_choice {shown(choice)} is not one of auto, required, none")
    if parallel is False and (out is None or out["type"] != "none"):
        out = {**(out or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out


def _user_id(client: Mapping[str, Any]) -> str | None:
    metadata = client.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        user_id: str = metadata["user_id"]
        return user_id
    user = client.get("user")
    return user if isinstance(user, str) and user else None


# ---------------------------------------------------------------------------------------------
# The stream


class _Delta(msgspec.Struct, gc=False):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None
    stop_sequence: str | None = None


class _Block(msgspec.Struct, gc=False):
    type: str = ""
    id: str | None = None
    name: str | None = None
    input: Any = None
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class _OutputDetails(msgspec.Struct, gc=False):
    thinking_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: _OutputDetails | None = None


class _Message(msgspec.Struct, gc=False):
    id: str = ""
    model: str = ""
    usage: _Usage | None = None


class _Event(msgspec.Struct, gc=False):
    type: str = ""
    index: int | None = None
    message: _Message | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: Any = None


_event_decoder = msgspec.json.Decoder(_Event)
_any_decoder = msgspec.json.Decoder()
_TOOL = "tool"


class _ToolBlock:
    __slots__ = ("args", "id", "index", "name", "start_input")

    def __init__(self, index: int, id: str, name: str, start_input: Any) -> None:
        self.index = index
        self.id = id
        self.name = name
        self.args: list[str] = []
        self.start_input = start_input


class AnthropicStreamDecoder(ChatDecoder):
    """Feed an Anthropic Messages stream's bytes; get canonical events. A stream without
    `message_stop` is incomplete, one that breaks the protocol a `protocol` error.

    Thinking is reasoning under the `reasoning_content` carrier: it comes in a field of its own,
    never inline, and that is the key svir's answers and threads keep it under. A thinking
    block's signature follows its text as `ReasoningSignature`, a redacted block is
    `RedactedReasoning`. Usage counts as OpenAI's does: `prompt_tokens` is every input token
    (fresh, read from the cache and written to it), `cached_tokens` those read from the cache.
    """

    def __init__(
        self,
        *,
        think_tags: bool = False,
        tool_names: Collection[str] | None = None,
        max_line: int = DEFAULT_MAX_LINE,
        max_event: int = DEFAULT_MAX_EVENT,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # think_tags and tool_names are the canonical decoder's options: Anthropic sends
        # thinking apart and tool names whole, so neither changes anything here.
        super().__init__(max_line=max_line, max_event=max_event, clock=clock)
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self._usage = _Usage()
        self._blocks: dict[int, str | _ToolBlock] = {}
        self._tools: list[_ToolBlock] = []
        self._role_sent = False

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(t.index, t.id, t.name, "".join(t.args)) for t in self._tools]

    def _cut(self, out: list[Event]) -> None:
        self._fail(
            UpstreamError(
                ErrorKind.INCOMPLETE,
                "the upstream stream ended before message_stop",
                in_stream=True,
            ),
            out,
        )

    def _event(self, item: SSEEvent, out: list[Event]) -> None:
        try:
            ev = _event_decoder.decode(item.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            if item.event == "error":
                self._error(item.data, out)
            else:
                self._protocol(f"malformed event: {exc}", out)
            return
        kind = ev.type
        if kind == "content_block_delta":
            self._delta(ev, out)
        elif kind == "content_block_start":
            self._start(ev, out)
        elif kind == "content_block_stop":
            self._stop(ev, out)
        elif kind == "ping":
            out.append(Keepalive("ping"))
        elif kind == "message_start":
            self._message_start(ev, out)
        elif kind == "message_delta":
            if ev.delta is not None and ev.delta.stop_reason is not None:
                self.stop_reason = ev.delta.stop_reason
                self.stop_sequence = ev.delta.stop_sequence
            if ev.usage is not None:
                self._add_usage(ev.usage)
        elif kind == "message_stop":
            self._done(out)
        elif kind == "error" or item.event == "error":
            self._error(item.data, out)
        # Any other event type is one Anthropic added since: its versioning policy says to
        # ignore it.

    def _message_start(self, ev: _Event, out: list[Event]) -> None:
        message = ev.message
        if message is not None:
            if not self.id:
                self.id = message.id
                self.model = message.model
            if message.usage is not None:
                self._add_usage(message.usage)
        self._role(out)

    def _role(self, out: list[Event]) -> None:
        if not self._role_sent:
            self._role_sent = True
            out.append(Role("assistant", self.id, self.model, self.created))

    def _start(self, ev: _Event, out: list[Event]) -> None:
        block = ev.content_block
        if block is None or ev.index is None:
            self._protocol("content_block_start without a block or its index", out)
            return
        self._role(out)
        kind = block.type
        if kind == "tool_use":
            if not block.id or not block.name:
                self._protocol(f"tool_use block {ev.index} without an id or a name", out)
                return
            tool = _ToolBlock(len(self._tools), block.id, block.name, block.input)
            self._tools.append(tool)
            self._blocks[ev.index] = tool
            out.append(ToolCallStart(tool.index, tool.id, tool.name))
            self._visible += 1
            return
        self._blocks[ev.index] = kind
        if kind == "text" and block.text:
            out.append(TextDelta(block.text))
            self._visible += 1
        elif kind == "thinking" and block.thinking:
            self._reasoning(block.thinking, out)
        elif kind == "redacted_thinking" and block.data:
            out.append(RedactedReasoning(block.data))

    def _delta(self, ev: _Event, out: list[Event]) -> None:
        delta = ev.delta
        if delta is None:
            return
        kind = delta.type
        if kind == "text_delta":
            if delta.text:
                out.append(TextDelta(delta.text))
                self._visible += 1
        elif kind == "thinking_delta":
            if delta.thinking:
                self._reasoning(delta.thinking, out)
        elif kind == "input_json_delta":
            tool = self._blocks.get(ev.index) if ev.index is not None else None
            if tool is None:
                self._protocol(f"input_json_delta for block {ev.index}, which never started", out)
                return
            # A server tool's input (web search) is the server's business, not a tool call.
            if isinstance(tool, _ToolBlock) and delta.partial_json:
                tool.args.append(delta.partial_json)
                out.append(ToolCallDelta(tool.index, delta.partial_json))
                self._visible += 1
        elif kind == "signature_delta":
            if delta.signature:
                out.append(ReasoningSignature(delta.signature))
        # citations_delta and newer kinds add nothing the canonical answer holds.

    def _reasoning(self, text: str, out: list[Event]) -> None:
        out.append(ReasoningDelta(text, _CARRIER))
        self.reasoning_carrier = _CARRIER
        self._visible += 1

    def _stop(self, ev: _Event, out: list[Event]) -> None:
        tool = self._blocks.get(ev.index) if ev.index is not None else None
        if isinstance(tool, _ToolBlock) and not tool.args:
            # No input came in pieces (a tool without parameters sends one empty piece): the
            # input is the start's, `{}` as Anthropic sends it, never an empty string.
            given = tool.start_input
            text = msgspec.json.encode(given).decode() if isinstance(given, dict) else "{}"
            tool.args.append(text)
            out.append(ToolCallDelta(tool.index, text))

    def _add_usage(self, u: _Usage) -> None:
        # Anthropic's counts are cumulative: a later value replaces the earlier one.
        have = self._usage
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens_details",
        ):
            value = getattr(u, name)
            if value is not None:
                setattr(have, name, value)

    def _usage_event(self) -> Usage | None:
        u = self._usage
        if u.input_tokens is None and u.output_tokens is None:
            return None
        prompt = (
            (u.input_tokens or 0)
            + (u.cache_read_input_tokens or 0)
            + (u.cache_creation_input_tokens or 0)
        )
        completion = u.output_tokens or 0
        details = u.output_tokens_details
        return Usage(
            prompt,
            completion,
            prompt + completion,
            details.thinking_tokens if details is not None else None,
            u.cache_read_input_tokens,
        )

    def _done(self, out: list[Event]) -> None:
        self._role(out)
        reason = finish_reason(self.stop_reason)
        if reason is None:
            reason = "tool_calls" if self._tools else "stop"
        self.finish_reason = reason
        out.append(Finish(reason))
        self.usage = self._usage_event()
        if self.usage is not None:
            out.append(self.usage)
        out.append(Done())
        self.complete = True
        self._ended = True

    def _error(self, data: bytes, out: list[Event]) -> None:
        try:
            payload: Any = _any_decoder.decode(data)
        except msgspec.DecodeError:
            payload = data.decode("utf-8", "replace")
        self._fail(classify_stream_error(payload, event="error"), out)
