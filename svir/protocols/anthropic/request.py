"""An Anthropic Messages request (`POST /v1/messages`, and `/v1/messages/count_tokens`) as svir's
canonical chat request, the OpenAI Chat Completions body every upstream kind is built from.

`translate_request` is the whole translation, pure; the front end's HTTP handler checks the
result as any chat request (`validate_chat_request`), turns `warnings` into a header, refuses
`image_urls` when the upstream takes no image URL, and keeps `user_id` for the ledger. The body is
first converted to the structs of svir.protocols.anthropic.body (which check every field's type),
then translated from them. Every client mistake is a `MessagesRequestError` naming the field in
Anthropic's dotted form (`messages.2.content.0.tool_use_id`), for a 400 `invalid_request_error`;
nothing else escapes for any JSON value. What the translation does, field by field:

- `system` (a string, or text blocks) is the first, system, message; a `role: "system"` message
  inside `messages`, which the protocol lacks but Claude Code sends, stays a system message where
  it stands (the canonical request takes one anywhere). Text blocks stay text parts, so that an
  Anthropic upstream gets the blocks back; every other upstream gets one string (build_messages).
- content blocks: `text`; `image` (base64 as a data URL; a URL as it is, flagged `image_urls`);
  `document` with a text source (`text`, `content`, or base64 `text/plain`) as svir's file block
  (`<file name="title">` in the text); `tool_use` as the assistant's tool calls (input as JSON
  text); `tool_result` as a tool message right after the calls (its text; `is_error` says
  "Error: " first, and `is_error: true` on the message; images in it go into a user message
  after the results, since a tool message takes text only); `thinking` as the assistant's
  `reasoning_content` (never as text); signed thinking blocks and `redacted_thinking` (its data
  is encrypted for Anthropic alone) also as `thinking_blocks`, which only an Anthropic upstream
  is sent (an empty signature, Claude Code's, is none: no block is kept for it).
- `cache_control` marks: on a system or content block, on its text or image part (an
  assistant's text blocks stay parts then); on a tool_result, on its tool message; on a
  tool_use, on its assistant message; on a tool, on the tool. svir.providers.anthropic_dialect reads
  them there; no other upstream's body has them. Citations and other hints are not translated.
- `tools` (custom tools): name, description, and `input_schema` as the function's parameters,
  with `$schema` taken off the schema's top (JSON Schema 2020-12's marker, which Gemini and some
  grammar compilers refuse; the schema means the same without it) and the tool's own
  `defer_loading`, `strict`, `input_examples` left out (svir has no tool search:
  every tool is offered at once). Tools of another `type` (Anthropic's server tools: web search,
  code execution, bash, the text editor, …) are dropped with a warning: no other server runs them.
- `tool_choice` auto / any / tool / none -> auto / required / {function name} / none;
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`.
- `stop_sequences` -> `stop`; `max_tokens`, `temperature`, `top_p`, `top_k` (which llama.cpp,
  vLLM and the other local servers take) as they are; `stream`.
- reasoning: `thinking: {type: disabled}` -> `reasoning_effort: "none"`; otherwise
  `output_config.effort` (low, medium, high, xhigh as they are, max as xhigh) when given; else
  `thinking: {type: enabled, budget_tokens}` by budget (below 4096 low, below 16384 medium, else
  high: Claude Code's "think" 4000, "think hard" 10000 and "ultrathink" 31999 fall one in each);
  `adaptive` alone leaves the upstream's default. The `thinking` object itself goes along under
  `THINKING_KEY`, and `output_config.effort` under `EFFORT_KEY`, which an Anthropic upstream is
  sent as they came and no other upstream sees.
- `metadata.user_id` (a string; Claude Code's is JSON text) is returned as `user_id`, not sent on.
- Any other field (`context_management`, `container`, `mcp_servers`, `service_tier`, …) is
  ignored with a warning.
- `output_config.format` (`{type: json_schema, schema}`, structured outputs) ->
  `response_format: {type: json_schema, json_schema: {name: "output", schema}}`.
"""

from __future__ import annotations

import binascii
from typing import Any, Final

import msgspec

from svir.protocols.anthropic.body import (
    AnyChoice,
    AssistantMessage,
    AutoChoice,
    Base64Image,
    ContentSource,
    DisabledThinking,
    DocumentBlock,
    EnabledThinking,
    ImageBlock,
    MessagesBody,
    NoChoice,
    RedactedThinkingBlock,
    Refusal,
    ResultDocument,
    ResultImage,
    ResultText,
    SystemMessage,
    SystemText,
    TextBlock,
    TextSource,
    ThinkingBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    UrlImage,
    UserMessage,
    block_before,
    decode,
    decode_tool,
    first_mistake,
)
from svir.wire.errors import BodyError
from svir.wire.jsonbody import shown
from svir.wire.request import EFFORT_KEY, THINKING_KEY, file_block, split_text
from svir.wire.tokens import estimate_prompt_tokens

__all__ = ["MessagesRequest", "MessagesRequestError", "count_tokens", "translate_request"]


class MessagesRequestError(BodyError):
    """A client's Messages request that cannot be translated; `param` names the field."""

    def __init__(self, param: str | None, message: str) -> None:
        text = f"{param}: {message}" if param else message
        super().__init__(text)
        self.message = text
        self.param = param


class MessagesRequest(msgspec.Struct, frozen=True):
    """A translated request: the canonical chat request, what was ignored (one line each), the
    client's `metadata.user_id`, and whether an image is given by URL (not every upstream fetches
    one)."""

    chat: dict[str, Any]
    warnings: tuple[str, ...] = ()
    user_id: str | None = None
    image_urls: bool = False

    @property
    def stream(self) -> bool:
        return bool(self.chat.get("stream"))


# Fields translated below, and those known and deliberately not translated (no warning).
_TRANSLATED: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "metadata",
    }
)
# A cache mark on the whole request means nothing to an upstream that is not Anthropic.
_SILENT: Final = frozenset({"cache_control"})
_EFFORTS: Final = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "xhigh",
}
# The settings the canonical request takes as they are.
_AS_THEY_ARE: Final = ("stream", "max_tokens", "temperature", "top_p", "top_k")
_CHOICES: Final[dict[type[Any], str]] = {
    AutoChoice: "auto",
    AnyChoice: "required",
    NoChoice: "none",
}
# Tool fields an upstream has no use for, or chokes on; the schema's own `$schema` likewise.
_SCHEMA_DROPPED: Final = ("$schema",)

_TextBlocks = str | list[SystemText]
_Messages = list[UserMessage | AssistantMessage | SystemMessage]
_ResultPart = ResultText | ResultImage | ResultDocument


def translate_request(body: Any) -> MessagesRequest:
    """The canonical chat request for an Anthropic Messages request body (see the module's
    docstring for the mapping). Raises MessagesRequestError, and nothing else, for any JSON."""
    try:
        return _Translation().request(body, _decoded(body))
    except Refusal as exc:
        raise MessagesRequestError(exc.param, exc.message) from None


def count_tokens(body: Any) -> int:
    """An estimate of the input tokens of a Messages request (a count_tokens body): system,
    messages, tool results, thinking and tools, as svir's key gate estimates a prompt, over the
    translated request. Raises MessagesRequestError."""
    return estimate_prompt_tokens(translate_request(body).chat)


def _decoded(body: Any) -> MessagesBody:
    try:
        return decode(body)
    except Refusal as mistake:
        raise _named_first(body, mistake) from None


# The fields in the order they are translated.
_FIELD_ORDER: Final = (
    "model",
    "system",
    "messages",
    "stream",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "metadata",
)


def _named_first(body: Any, mistake: Refusal) -> Refusal:
    """Of a body's mistakes, the one the hand-written checks met first (and so svir names),
    given the first type mistake `decode` found: a mistake of meaning (a result answering no call,
    a call id used twice) in the messages, blocks or fields of a block before it, or a custom
    tool's mistake (each tool is converted alone) in the tools before it; output_config's own type
    before thinking's. Runs only for a refused body."""
    field = (mistake.param or "").split(".")[0]
    if field not in _FIELD_ORDER:
        return mistake
    output_config = body.get("output_config")
    if field == "thinking" and output_config is not None and not isinstance(output_config, dict):
        mistake, field = first_mistake(body, ["output_config"]), "output_config"
    after = _FIELD_ORDER.index(field)
    raw = body.get("messages")
    try:
        if after > _FIELD_ORDER.index("messages"):
            _Translation().messages(msgspec.convert(raw, _Messages), [])
        elif field == "messages" and isinstance(raw, list):
            for before in _before(raw, mistake.param):
                try:
                    typed = msgspec.convert(before, _Messages)
                except msgspec.ValidationError:  # a block cut before its mistake lacks a field
                    continue
                _Translation().messages(typed, [])
                break
        tools = body.get("tools")
        if after > _FIELD_ORDER.index("tools") and tools is not None:
            _Translation().tools(body)
        elif field == "tools" and isinstance(tools, list):
            _Translation().tools({"tools": tools[: _index(mistake.param)]})
    except Refusal as earlier:
        return earlier
    return mistake


def _index(param: str | None) -> int:
    """The index in `param` (`tools.k…`), 0 when it names the whole field."""
    keys = (param or "").split(".")
    return int(keys[1]) if len(keys) > 1 and keys[1].isdigit() else 0


def _before(messages: list[Any], param: str | None) -> list[list[Any]]:
    """The messages, the blocks of a message, and the fields of a block, before the place `param`
    names (`messages.i.content.j.field…`); without the cut block too, which may lack a field."""
    keys = (param or "").split(".")
    if len(keys) < 2 or not keys[1].isdigit():
        return []
    i = int(keys[1])
    if len(keys) < 4 or keys[2] != "content" or not keys[3].isdigit():
        return [messages[:i]]
    j = int(keys[3])
    blocks = messages[i]["content"][:j]
    whole = [*messages[:i], {**messages[i], "content": blocks}]
    cut = block_before(messages[i], j, keys[4]) if len(keys) > 4 else None
    if cut is None:
        return [whole]
    return [[*messages[:i], {**messages[i], "content": [*blocks, cut]}], whole]


class _Translation:
    """The state of one translation: the warnings so far and the calls awaiting results."""

    __slots__ = ("image_urls", "pending", "warnings")

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.image_urls = False
        # The tool_use ids of the latest assistant message: a tool_result answers one of them.
        self.pending: set[str] = set()

    def request(self, body: dict[str, Any], request: MessagesBody) -> MessagesRequest:
        chat: dict[str, Any] = {"model": request.model}
        messages = self.system(request.system)
        self.messages(request.messages, messages)
        chat["messages"] = messages
        for key in _AS_THEY_ARE:
            value = getattr(request, key)
            if value is not None:
                chat[key] = value
        if request.stop_sequences:
            chat["stop"] = request.stop_sequences
        if request.tools is not None:
            built = self.tools(body)
            if built:
                chat["tools"] = built
        choice = request.tool_choice
        if choice is not None:
            if isinstance(choice, ToolChoice):
                chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            else:
                chat["tool_choice"] = _CHOICES[type(choice)]
            if choice.disable_parallel_tool_use:
                chat["parallel_tool_calls"] = False
        output_config = request.output_config
        effort = output_config.effort if output_config is not None else None
        thinking = request.thinking
        if isinstance(thinking, DisabledThinking):
            chat["reasoning_effort"] = "none"
        elif effort is not None:
            chat["reasoning_effort"] = _EFFORTS[effort]
        elif isinstance(thinking, EnabledThinking):
            budget = thinking.budget_tokens
            chat["reasoning_effort"] = (
                "low" if budget < 4096 else "medium" if budget < 16384 else "high"
            )
        if thinking is not None:
            # Anthropic's own setting, for an Anthropic upstream to send as it came; no other
            # upstream's body has it (build_upstream_body leaves it out).
            chat[THINKING_KEY] = body["thinking"]
        if effort is not None:
            chat[EFFORT_KEY] = effort
        if output_config is not None and output_config.format is not None:
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": output_config.format.schema},
            }
        if output_config is not None:
            for key, value in body["output_config"].items():
                if key != "effort" and (key != "format" or value is None):
                    self.warnings.append(f"output_config.{key} ignored: svir does not translate it")
        user_id = request.metadata.user_id if request.metadata is not None else None

        for key in body:
            if key not in _TRANSLATED and key not in _SILENT:
                self.warnings.append(f"{key} ignored: svir does not translate it")
        return MessagesRequest(chat, tuple(self.warnings), user_id, self.image_urls)

    # -- system and messages

    def system(self, system: _TextBlocks | None) -> list[dict[str, Any]]:
        if system is None:
            return []
        content = _text_content(system)
        return [{"role": "system", "content": content}] if content else []

    def messages(self, messages: _Messages, out: list[dict[str, Any]]) -> None:
        for i, msg in enumerate(messages):
            if isinstance(msg, UserMessage):
                self.user(i, msg.content, out)
                self.pending = set()
            elif isinstance(msg, AssistantMessage):
                self.pending = set()
                out.append(self.assistant(i, msg.content))
            else:
                text = _text_content(msg.content)
                if out and out[-1]["role"] == "system" and all(m["role"] == "system" for m in out):
                    out[-1] = {"role": "system", "content": _joined(out[-1]["content"], text)}
                else:
                    out.append({"role": "system", "content": text})

    def user(
        self,
        i: int,
        content: str | list[TextBlock | ImageBlock | DocumentBlock | ToolResultBlock],
        out: list[dict[str, Any]],
    ) -> None:
        if isinstance(content, str):
            out.append({"role": "user", "content": content})
            return
        parts: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        answered: set[str] = set()
        for j, block in enumerate(content):
            here = f"messages.{i}.content.{j}"
            if isinstance(block, ToolResultBlock):
                results.append(self.tool_result(here, block, answered, parts))
            else:
                parts.append(_marked(self.part(here, block), block.cache_control))
        # OpenAI servers want a call's results right after the calls, before any other message:
        # before a system note that came between the calls and the results, too.
        at = len(out)
        while at and out[at - 1]["role"] == "system":
            at -= 1
        if not (at and out[at - 1]["role"] == "assistant"):
            at = len(out)
        out[at:at] = results
        if parts or not results:
            out.append({"role": "user", "content": parts})

    def part(self, here: str, block: _ResultPart) -> dict[str, Any]:
        """A text, image or document block as a canonical content part."""
        if isinstance(block, ResultText):
            return {"type": "text", "text": block.text}
        if isinstance(block, ResultImage):
            return self.image(f"{here}.source", block.source)
        return {"type": "text", "text": _document(here, block)}

    def image(self, where: str, source: Base64Image | UrlImage) -> dict[str, Any]:
        if isinstance(source, Base64Image):
            if not source.data:
                raise Refusal(f"{where}.data", "the image data is empty")
            # The data URL is checked (strict base64) where the upstream body is built.
            url = f"data:{source.media_type};base64,{source.data}"
            return {"type": "image_url", "image_url": {"url": url}}
        url = source.url
        if not url[:8].lower().startswith(("http://", "https://")):
            raise Refusal(f"{where}.url", "must be an http(s) URL")
        self.image_urls = True
        return {"type": "image_url", "image_url": {"url": url}}

    def tool_result(
        self,
        here: str,
        block: ToolResultBlock,
        answered: set[str],
        images: list[dict[str, Any]],
    ) -> dict[str, Any]:
        call_id = block.tool_use_id
        if call_id not in self.pending:
            raise Refusal(
                f"{here}.tool_use_id",
                f"tool_result block {shown(call_id)} has no matching tool_use block in the "
                "previous message",
            )
        if call_id in answered:
            raise Refusal(f"{here}.tool_use_id", f"tool_use {shown(call_id)} is answered twice")
        answered.add(call_id)
        content = block.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = [self.part(f"{here}.content.{k}", inner) for k, inner in enumerate(content)]
            text, media = split_text(parts)
            images.extend(media)
        result: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
        if block.is_error:
            # The words for every upstream; the flag for an Anthropic one's tool_result.
            result["content"] = f"Error: {text}"
            result["is_error"] = True
        return _marked(result, block.cache_control)

    def assistant(
        self,
        i: int,
        content: str | list[TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock],
    ) -> dict[str, Any]:
        if isinstance(content, str):
            return {"role": "assistant", "content": content}
        texts: list[dict[str, Any]] = []
        reasoning: list[str] = []
        mark: Any = None
        # The blocks an Anthropic upstream takes back as they were (svir.providers.anthropic_dialect
        # reads `thinking_blocks`; every other upstream's body leaves it out).
        sealed: list[dict[str, str]] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            if isinstance(block, TextBlock):
                texts.append(_marked({"type": "text", "text": block.text}, block.cache_control))
            elif isinstance(block, ThinkingBlock):
                reasoning.append(block.thinking)
                if block.signature:
                    sealed.append(
                        {
                            "type": "thinking",
                            "thinking": block.thinking,
                            "signature": block.signature,
                        }
                    )
            elif isinstance(block, RedactedThinkingBlock):
                sealed.append({"type": "redacted_thinking", "data": block.data})
            else:
                calls.append(self.tool_use(f"messages.{i}.content.{j}", block))
                # A call holds no mark of its own: the message's goes on its last block.
                mark = block.cache_control or mark
        out: dict[str, Any] = {"role": "assistant"}
        if any("cache_control" in t for t in texts):
            out["content"] = texts
        else:
            out["content"] = "\n".join(t["text"] for t in texts if t["text"])
        if mark is not None:
            out["cache_control"] = mark
        thinking = "\n".join(r for r in reasoning if r)
        if thinking:
            out["reasoning_content"] = thinking
        if sealed:
            out["thinking_blocks"] = sealed
        if calls:
            out["tool_calls"] = calls
        return out

    def tool_use(self, here: str, block: ToolUseBlock) -> dict[str, Any]:
        call_id = block.id
        if call_id in self.pending:
            raise Refusal(f"{here}.id", f"tool_use id {shown(call_id)} is used twice")
        value = {} if block.input is None else block.input
        try:
            arguments = msgspec.json.encode(value).decode()
        except (msgspec.EncodeError, UnicodeError, OverflowError, RecursionError) as exc:
            raise Refusal(f"{here}.input", f"cannot be written as JSON ({exc})") from None
        self.pending.add(call_id)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": block.name, "arguments": arguments},
        }

    # -- tools

    def tools(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The body's custom tools (its `tools`, a list of objects) as functions."""
        out: list[dict[str, Any]] = []
        for k, raw in enumerate(body["tools"]):
            kind = raw.get("type")
            if kind not in (None, "custom"):
                name = raw.get("name")
                label = name if isinstance(name, str) else f"tools.{k}"
                self.warnings.append(
                    f"tool {label} ({kind}) dropped: only custom tools are translated"
                )
                continue
            tool = decode_tool(body, k)
            schema = tool.input_schema
            if any(key in schema for key in _SCHEMA_DROPPED):
                schema = {key: v for key, v in schema.items() if key not in _SCHEMA_DROPPED}
            function: dict[str, Any] = {"name": tool.name, "parameters": schema}
            if tool.description is not None:
                function["description"] = tool.description
            out.append(_marked({"type": "function", "function": function}, tool.cache_control))
        return out


def _text_content(content: _TextBlocks) -> str | list[dict[str, Any]]:
    """A system text: a string as it is; text blocks as text parts, each with its cache mark (an
    Anthropic upstream sends them back as the blocks they were; build_messages joins them into one
    string for every other upstream), none when all are empty."""
    if isinstance(content, str):
        return content
    parts = [_marked({"type": "text", "text": b.text}, b.cache_control) for b in content]
    return parts if any(p["text"] for p in parts) else []


def _document(here: str, block: ResultDocument) -> str:
    """A document with a text source, as svir's file block."""
    name = "document" if block.title is None else block.title
    source = block.source
    if isinstance(source, TextSource):
        text = source.data
    elif isinstance(source, ContentSource):
        content = source.content
        text = content if isinstance(content, str) else "\n".join(b.text for b in content if b.text)
    else:
        try:
            text = binascii.a2b_base64(source.data.encode("ascii"), strict_mode=True).decode(
                "utf-8-sig"
            )
        except (binascii.Error, UnicodeError):
            raise Refusal(f"{here}.source.data", "is not base64 of UTF-8 text") from None
    if block.context:
        text = f"{block.context}\n{text}"
    return file_block(name, text)


def _joined(
    a: str | list[dict[str, Any]], b: str | list[dict[str, Any]]
) -> str | list[dict[str, Any]]:
    if isinstance(a, str) and isinstance(b, str):
        return f"{a}\n{b}" if a and b else a or b
    return [*_parts(a), *_parts(b)]


def _parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def _marked(part: dict[str, Any], mark: dict[str, Any] | None) -> dict[str, Any]:
    """`part` with the cache mark of the block it was made of, when it has one."""
    if mark is not None:
        part["cache_control"] = mark
    return part
