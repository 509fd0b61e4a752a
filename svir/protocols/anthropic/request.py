"""An Anthropic Messages request (`POST /v1/messages`, and `/v1/messages/count_tokens`) as svir's
canonical chat request, the OpenAI Chat Completions body every upstream kind is built from.

`translate_request` is the whole translation, pure; the front end's HTTP handler checks the
result as any chat request (`validate_chat_request`), turns `warnings` into a header, refuses
`image_urls` when the upstream takes no image URL, and keeps `user_id` for the ledger. Every
client mistake is a `MessagesRequestError` naming the field in Anthropic's dotted form
(`messages.2.content.0.tool_use_id`), for a 400 `invalid_request_error`; nothing else escapes
for any JSON value. What the translation does, field by field:

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

from svir.wire.errors import BodyError
from svir.wire.jsonbody import TypeChecks, json_type, shown
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
_IMAGE_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# Tool fields an upstream has no use for, or chokes on; the schema's own `$schema` likewise.
_SCHEMA_DROPPED: Final = ("$schema",)


def translate_request(body: Any) -> MessagesRequest:
    """The canonical chat request for an Anthropic Messages request body (see the module's
    docstring for the mapping). Raises MessagesRequestError, and nothing else, for any JSON."""
    if not isinstance(body, dict):
        raise MessagesRequestError(
            None, f"the request body must be an object, not {json_type(body)}"
        )
    t = _Translation()
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MessagesRequestError("model", f"must be a non-empty string, not {shown(model)}")
    chat: dict[str, Any] = {"model": model}
    messages = t.system(body.get("system"))
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise MessagesRequestError("messages", f"must be an array, not {json_type(raw)}")
    if not raw:
        raise MessagesRequestError("messages", "at least one message is required")
    t.messages(raw, messages)
    chat["messages"] = messages

    stream = body.get("stream")
    if stream is not None:
        chat["stream"] = _bool("stream", stream)
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        chat["max_tokens"] = _integer("max_tokens", max_tokens, 1)
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            chat[key] = _number(key, value)
    top_k = body.get("top_k")
    if top_k is not None:
        chat["top_k"] = _integer("top_k", top_k, 0)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise MessagesRequestError(
                "stop_sequences", f"must be an array, not {json_type(stops)}"
            )
        for i, s in enumerate(stops):
            _string(f"stop_sequences.{i}", s)
        if stops:
            chat["stop"] = stops

    tools = body.get("tools")
    if tools is not None:
        built = t.tools(tools)
        if built:
            chat["tools"] = built
    choice = body.get("tool_choice")
    if choice is not None:
        t.tool_choice(choice, chat)
    output_config = body.get("output_config")
    if output_config is not None and not isinstance(output_config, dict):
        raise MessagesRequestError(
            "output_config", f"must be an object, not {json_type(output_config)}"
        )
    thinking = body.get("thinking")
    effort = t.effort(thinking, output_config or {})
    if effort is not None:
        chat["reasoning_effort"] = effort
    if thinking is not None:
        # Anthropic's own setting, for an Anthropic upstream to send as it came; no other
        # upstream's body has it (build_upstream_body leaves it out).
        chat[THINKING_KEY] = thinking
    if output_config and output_config.get("effort") is not None:
        chat[EFFORT_KEY] = output_config["effort"]
    if output_config:
        t.output_format(output_config, chat)
    user_id = _user_id(body.get("metadata"))

    for key in body:
        if key not in _TRANSLATED and key not in _SILENT:
            t.warnings.append(f"{key} ignored: svir does not translate it")
    return MessagesRequest(chat, tuple(t.warnings), user_id, t.image_urls)


def count_tokens(body: Any) -> int:
    """An estimate of the input tokens of a Messages request (a count_tokens body): system,
    messages, tool results, thinking and tools, as svir's key gate estimates a prompt, over the
    translated request. Raises MessagesRequestError."""
    return estimate_prompt_tokens(translate_request(body).chat)


class _Translation:
    """The state of one translation: the warnings so far and the calls awaiting results."""

    __slots__ = ("image_urls", "pending", "warnings")

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.image_urls = False
        # The tool_use ids of the latest assistant message: a tool_result answers one of them.
        self.pending: set[str] = set()

    # -- system and messages

    def system(self, system: Any) -> list[dict[str, Any]]:
        if system is None:
            return []
        content = self.text_content("system", system)
        return [{"role": "system", "content": content}] if content else []

    def text_content(self, where: str, content: Any) -> str | list[dict[str, Any]]:
        """A system text: a string as it is; text blocks as text parts, each with its cache
        mark (an Anthropic upstream sends them back as the blocks they were; build_messages
        joins them into one string for every other upstream), none when all are empty."""
        if isinstance(content, str):
            return content
        self.text_only(where, content)
        parts = [
            _marked({"type": "text", "text": b["text"]}, b, f"{where}.{j}")
            for j, b in enumerate(content)
        ]
        return parts if any(p["text"] for p in parts) else []

    def text_only(self, where: str, content: Any) -> str:
        """A string, or an array of text blocks joined with newlines."""
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise MessagesRequestError(
                where, f"must be a string or an array of text blocks, not {json_type(content)}"
            )
        texts = []
        for j, block in enumerate(content):
            here = f"{where}.{j}"
            kind = _block_type(here, block)
            if kind != "text":
                raise MessagesRequestError(here, f"must be a text block, not {shown(kind)}")
            texts.append(_string(f"{here}.text", block.get("text")))
        return "\n".join(t for t in texts if t)

    def messages(self, raw: list[Any], out: list[dict[str, Any]]) -> None:
        for i, msg in enumerate(raw):
            where = f"messages.{i}"
            if not isinstance(msg, dict):
                raise MessagesRequestError(where, f"must be an object, not {json_type(msg)}")
            role = msg.get("role")
            content = msg.get("content")
            if content is None:
                raise MessagesRequestError(f"{where}.content", "is required")
            if role == "user":
                self.user(where, content, out)
                self.pending = set()
            elif role == "assistant":
                self.pending = set()
                out.append(self.assistant(where, content))
            elif role == "system":
                text = self.text_content(f"{where}.content", content)
                if out and out[-1]["role"] == "system" and all(m["role"] == "system" for m in out):
                    out[-1] = {"role": "system", "content": _joined(out[-1]["content"], text)}
                else:
                    out.append({"role": "system", "content": text})
            else:
                raise MessagesRequestError(
                    f"{where}.role", f"must be 'user' or 'assistant', not {shown(role)}"
                )

    def user(self, where: str, content: Any, out: list[dict[str, Any]]) -> None:
        if isinstance(content, str):
            out.append({"role": "user", "content": content})
            return
        if not isinstance(content, list):
            raise MessagesRequestError(
                f"{where}.content",
                f"must be a string or an array of blocks, not {json_type(content)}",
            )
        parts: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        answered: set[str] = set()
        for j, block in enumerate(content):
            here = f"{where}.content.{j}"
            kind = _block_type(here, block)
            if kind == "tool_result":
                results.append(self.tool_result(here, block, answered, parts))
            elif kind in ("thinking", "redacted_thinking", "tool_use"):
                raise MessagesRequestError(f"{here}.type", f"a user message takes no {kind} block")
            else:
                parts.append(_marked(self.part(here, kind, block), block, here))
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

    def part(self, here: str, kind: str, block: dict[str, Any]) -> dict[str, Any]:
        """A text, image or document block as a canonical content part."""
        if kind == "text":
            return {"type": "text", "text": _string(f"{here}.text", block.get("text"))}
        if kind == "image":
            return self.image(here, block.get("source"))
        if kind == "document":
            return {"type": "text", "text": self.document(here, block)}
        raise MessagesRequestError(f"{here}.type", f"unsupported content block type {shown(kind)}")

    def image(self, here: str, source: Any) -> dict[str, Any]:
        where = f"{here}.source"
        if not isinstance(source, dict):
            raise MessagesRequestError(where, f"must be an object, not {json_type(source)}")
        kind = source.get("type")
        if kind == "base64":
            media_type = _string(f"{where}.media_type", source.get("media_type"))
            if media_type not in _IMAGE_TYPES:
                raise MessagesRequestError(
                    f"{where}.media_type",
                    f"must be one of {', '.join(sorted(_IMAGE_TYPES))}, not {shown(media_type)}",
                )
            data = _string(f"{where}.data", source.get("data"))
            if not data:
                raise MessagesRequestError(f"{where}.data", "the image data is empty")
            # The data URL is checked (strict base64) where the upstream body is built.
            return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
        if kind == "url":
            url = _string(f"{where}.url", source.get("url"))
            if not url[:8].lower().startswith(("http://", "https://")):
                raise MessagesRequestError(f"{where}.url", "must be an http(s) URL")
            self.image_urls = True
            return {"type": "image_url", "image_url": {"url": url}}
        raise MessagesRequestError(f"{where}.type", f"must be 'base64' or 'url', not {shown(kind)}")

    def document(self, here: str, block: dict[str, Any]) -> str:
        """A document with a text source, as svir's file block."""
        title = block.get("title")
        name = "document" if title is None else _string(f"{here}.title", title)
        where = f"{here}.source"
        source = block.get("source")
        if not isinstance(source, dict):
            raise MessagesRequestError(where, f"must be an object, not {json_type(source)}")
        kind = source.get("type")
        if kind == "text":
            text = _string(f"{where}.data", source.get("data"))
        elif kind == "content":
            text = self.text_only(f"{where}.content", source.get("content"))
        elif kind == "base64" and source.get("media_type") == "text/plain":
            data = _string(f"{where}.data", source.get("data"))
            try:
                text = binascii.a2b_base64(data.encode("ascii"), strict_mode=True).decode(
                    "utf-8-sig"
                )
            except (binascii.Error, UnicodeError):
                raise MessagesRequestError(f"{where}.data", "is not base64 of UTF-8 text") from None
        else:
            raise MessagesRequestError(
                where,
                f"only text documents are supported (source type 'text', 'content', or base64 "
                f"'text/plain'), not {shown(kind)} {shown(source.get('media_type'))}",
            )
        context = block.get("context")
        if context is not None and _string(f"{here}.context", context):
            text = f"{context}\n{text}"
        return file_block(name, text)

    def tool_result(
        self, here: str, block: dict[str, Any], answered: set[str], images: list[dict[str, Any]]
    ) -> dict[str, Any]:
        call_id = _string(f"{here}.tool_use_id", block.get("tool_use_id"))
        if call_id not in self.pending:
            raise MessagesRequestError(
                f"{here}.tool_use_id",
                f"tool_result block {shown(call_id)} has no matching tool_use block in the "
                "previous message",
            )
        if call_id in answered:
            raise MessagesRequestError(
                f"{here}.tool_use_id", f"tool_use {shown(call_id)} is answered twice"
            )
        answered.add(call_id)
        content = block.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for k, inner in enumerate(content):
                where = f"{here}.content.{k}"
                parts.append(self.part(where, _block_type(where, inner), inner))
            text, media = split_text(parts)
            images.extend(media)
        else:
            raise MessagesRequestError(
                f"{here}.content",
                f"must be a string or an array of blocks, not {json_type(content)}",
            )
        result: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
        is_error = block.get("is_error")
        if is_error is not None and _bool(f"{here}.is_error", is_error):
            # The words for every upstream; the flag for an Anthropic one's tool_result.
            result["content"] = f"Error: {text}"
            result["is_error"] = True
        return _marked(result, block, here)

    def assistant(self, where: str, content: Any) -> dict[str, Any]:
        if isinstance(content, str):
            return {"role": "assistant", "content": content}
        if not isinstance(content, list):
            raise MessagesRequestError(
                f"{where}.content",
                f"must be a string or an array of blocks, not {json_type(content)}",
            )
        texts: list[dict[str, Any]] = []
        reasoning: list[str] = []
        mark: Any = None
        # The blocks an Anthropic upstream takes back as they were (svir.providers.anthropic_dialect
        # reads `thinking_blocks`; every other upstream's body leaves it out).
        sealed: list[dict[str, str]] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            here = f"{where}.content.{j}"
            kind = _block_type(here, block)
            if kind == "text":
                text = _string(f"{here}.text", block.get("text"))
                texts.append(_marked({"type": "text", "text": text}, block, here))
            elif kind == "thinking":
                reasoning.append(_string(f"{here}.thinking", block.get("thinking")))
                signature = block.get("signature")
                if signature is not None and _string(f"{here}.signature", signature):
                    sealed.append(
                        {"type": "thinking", "thinking": reasoning[-1], "signature": signature}
                    )
            elif kind == "redacted_thinking":
                data = _string(f"{here}.data", block.get("data"))
                sealed.append({"type": "redacted_thinking", "data": data})
            elif kind == "tool_use":
                calls.append(self.tool_use(here, block))
                # A call holds no mark of its own: the message's goes on its last block.
                mark = _mark(here, block) or mark
            else:
                raise MessagesRequestError(
                    f"{here}.type", f"an assistant message takes no {shown(kind)} block"
                )
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

    def tool_use(self, here: str, block: dict[str, Any]) -> dict[str, Any]:
        call_id = _string(f"{here}.id", block.get("id"))
        if not call_id:
            raise MessagesRequestError(f"{here}.id", "must not be empty")
        if call_id in self.pending:
            raise MessagesRequestError(f"{here}.id", f"tool_use id {shown(call_id)} is used twice")
        name = _string(f"{here}.name", block.get("name"))
        if not name:
            raise MessagesRequestError(f"{here}.name", "must not be empty")
        value = block.get("input")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise MessagesRequestError(
                f"{here}.input", f"must be an object, not {json_type(value)}"
            )
        try:
            arguments = msgspec.json.encode(value).decode()
        except (msgspec.EncodeError, UnicodeError, OverflowError, RecursionError) as exc:
            raise MessagesRequestError(
                f"{here}.input", f"cannot be written as JSON ({exc})"
            ) from None
        self.pending.add(call_id)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    # -- tools and settings

    def tools(self, tools: Any) -> list[dict[str, Any]]:
        if not isinstance(tools, list):
            raise MessagesRequestError("tools", f"must be an array, not {json_type(tools)}")
        out: list[dict[str, Any]] = []
        for k, tool in enumerate(tools):
            where = f"tools.{k}"
            if not isinstance(tool, dict):
                raise MessagesRequestError(where, f"must be an object, not {json_type(tool)}")
            kind = tool.get("type")
            name = tool.get("name")
            if kind not in (None, "custom"):
                label = name if isinstance(name, str) else where
                self.warnings.append(
                    f"tool {label} ({kind}) dropped: only custom tools are translated"
                )
                continue
            name = _string(f"{where}.name", name)
            if not name:
                raise MessagesRequestError(f"{where}.name", "must not be empty")
            schema = tool.get("input_schema")
            if not isinstance(schema, dict):
                raise MessagesRequestError(
                    f"{where}.input_schema", f"must be an object, not {json_type(schema)}"
                )
            if any(key in schema for key in _SCHEMA_DROPPED):
                schema = {key: v for key, v in schema.items() if key not in _SCHEMA_DROPPED}
            function: dict[str, Any] = {"name": name, "parameters": schema}
            description = tool.get("description")
            if description is not None:
                function["description"] = _string(f"{where}.description", description)
            out.append(_marked({"type": "function", "function": function}, tool, where))
        return out

    def tool_choice(self, choice: Any, chat: dict[str, Any]) -> None:
        if not isinstance(choice, dict):
            raise MessagesRequestError("tool_choice", f"must be an object, not {json_type(choice)}")
        kind = choice.get("type")
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "none":
            chat["tool_choice"] = "none"
        elif kind == "tool":
            name = _string("tool_choice.name", choice.get("name"))
            chat["tool_choice"] = {"type": "function", "function": {"name": name}}
        else:
            raise MessagesRequestError(
                "tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', not {shown(kind)}"
            )
        parallel = choice.get("disable_parallel_tool_use")
        if parallel is not None and _bool("tool_choice.disable_parallel_tool_use", parallel):
            chat["parallel_tool_calls"] = False

    def effort(self, thinking: Any, output_config: dict[str, Any]) -> str | None:
        kind = None
        budget: int | None = None
        if thinking is not None:
            if not isinstance(thinking, dict):
                raise MessagesRequestError(
                    "thinking", f"must be an object, not {json_type(thinking)}"
                )
            kind = thinking.get("type")
            if kind == "enabled":
                budget = _integer("thinking.budget_tokens", thinking.get("budget_tokens"), 1)
            elif kind not in ("disabled", "adaptive", "between_tools"):
                raise MessagesRequestError(
                    "thinking.type",
                    f"must be 'enabled', 'disabled' or 'adaptive', not {shown(kind)}",
                )
        effort = None
        value = output_config.get("effort")
        if value is not None:
            effort = _EFFORTS.get(value) if isinstance(value, str) else None
            if effort is None:
                raise MessagesRequestError(
                    "output_config.effort",
                    f"must be one of {', '.join(_EFFORTS)}, not {shown(value)}",
                )
        if kind == "disabled":
            return "none"
        if effort is not None:
            return effort
        if budget is not None:
            return "low" if budget < 4096 else "medium" if budget < 16384 else "high"
        return None

    def output_format(self, output_config: dict[str, Any], chat: dict[str, Any]) -> None:
        for key, value in output_config.items():
            if key == "format" and value is not None:
                where = "output_config.format"
                if not isinstance(value, dict) or value.get("type") != "json_schema":
                    raise MessagesRequestError(
                        where, "must be {type: 'json_schema', schema: {...}}"
                    )
                schema = value.get("schema")
                if not isinstance(schema, dict):
                    raise MessagesRequestError(
                        f"{where}.schema", f"must be an object, not {json_type(schema)}"
                    )
                chat["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": schema},
                }
            elif key != "effort":
                self.warnings.append(f"output_config.{key} ignored: svir does not translate it")


def _user_id(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise MessagesRequestError("metadata", f"must be an object, not {json_type(metadata)}")
    user_id = metadata.get("user_id")
    return None if user_id is None else _string("metadata.user_id", user_id)


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


def _marked(part: dict[str, Any], block: dict[str, Any], where: str) -> dict[str, Any]:
    """`part` with the cache mark of the block (at `where`) it was made of, when it has one."""
    mark = _mark(where, block)
    if mark is not None:
        part["cache_control"] = mark
    return part


def _mark(where: str, block: dict[str, Any]) -> dict[str, Any] | None:
    mark = block.get("cache_control")
    if mark is not None and not isinstance(mark, dict):
        raise MessagesRequestError(
            f"{where}.cache_control", f"must be an object, not {json_type(mark)}"
        )
    return mark


_checks = TypeChecks(MessagesRequestError)
_string = _checks.string
_bool = _checks.boolean
_number = _checks.number
_block_type = _checks.tagged
_integer = _checks.integer
