"""An Anthropic Messages request body as msgspec structs, and msgspec's type errors in the words
of svir's 400s: what the hand-written checks of each field said ("messages.0.content: must be a
string or an array of blocks, not a number").

`decode` converts the decoded body (a front end reads every body with `read_json`, which bounds its
nesting) to `MessagesBody`; a mistake is a `Refusal` naming the field in Anthropic's dotted form.
Content blocks, image and document sources, `tool_choice` and `thinking` are tagged unions on
their `type` (messages on their `role`); fields the structs do not name are ignored, as Anthropic's
clients send more than svir reads (`citations`, a tool's `defer_loading`, …); the translation
warns of the request's own unknown fields from the body itself. Tools stay objects here: one of
another `type` (a server tool) is dropped with a warning whatever its fields, so each custom tool
is converted alone (`decode_tool`). A client's JSON objects that svir passes on (a tool's schema, a
call's input, a cache mark) are `dict[str, Any]`, whose values msgspec does not walk.

A refused body is converted once more (`first_mistake`) with each object's keys in the order its
struct declares its fields, and a missing required field as null where it stands: msgspec meets
fields in the body's order and missing ones last, while svir has always named the first mistake
in the order its checks ran, which the declarations keep (`model`, `system`, `messages`, …; a
block's `tool_use_id` before its `content`). The translation (svir.protocols.anthropic.request)
puts a mistake of meaning before that first type mistake when it comes earlier.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final, Literal

import msgspec

from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, mistake, shown, value_at

__all__ = [
    "IMAGE_TYPES",
    "AssistantMessage",
    "Base64Image",
    "Base64Text",
    "ContentSource",
    "CustomTool",
    "DocumentBlock",
    "ImageBlock",
    "MessagesBody",
    "PlainText",
    "RedactedThinkingBlock",
    "Refusal",
    "ResultDocument",
    "ResultImage",
    "ResultText",
    "SystemMessage",
    "TextBlock",
    "TextSource",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UrlImage",
    "UserMessage",
    "block_before",
    "decode",
    "decode_tool",
    "first_mistake",
]

Mark = dict[str, Any] | None
IMAGE_TYPES: Final = ("image/gif", "image/jpeg", "image/png", "image/webp")
_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
_ImageType = Literal["image/gif", "image/jpeg", "image/png", "image/webp"]


class Refusal(BodyError):
    """A body the structs do not take: `param` names the field (None for the body itself)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class _Block(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    pass


# A block of a list that takes text blocks only: its `type` is a field, not a tag, so that a block
# without one is refused (msgspec takes a lone tagged struct's missing tag as its own).
class PlainText(msgspec.Struct, frozen=True, gc=False):
    type: Literal["text"]
    text: str


class SystemText(PlainText, frozen=True, gc=False):
    cache_control: Mark = None


class TextSource(_Block, frozen=True, gc=False, tag="text"):
    data: str


class ContentSource(_Block, frozen=True, gc=False, tag="content"):
    content: str | list[PlainText]


class Base64Text(_Block, frozen=True, gc=False, tag="base64"):
    media_type: Literal["text/plain"]
    data: str


class Base64Image(_Block, frozen=True, gc=False, tag="base64"):
    media_type: _ImageType
    data: str


class UrlImage(_Block, frozen=True, gc=False, tag="url"):
    url: str


# The blocks of a tool_result's content, which carry no cache mark of their own.
class ResultText(_Block, frozen=True, gc=False, tag="text"):
    text: str


class ResultImage(_Block, frozen=True, gc=False, tag="image"):
    source: Base64Image | UrlImage


class ResultDocument(_Block, frozen=True, gc=False, kw_only=True, tag="document"):
    title: str | None = None
    source: TextSource | ContentSource | Base64Text
    context: str | None = None


class TextBlock(ResultText, frozen=True, gc=False, tag="text"):
    cache_control: Mark = None


class ImageBlock(ResultImage, frozen=True, gc=False, tag="image"):
    cache_control: Mark = None


class DocumentBlock(ResultDocument, frozen=True, gc=False, kw_only=True, tag="document"):
    cache_control: Mark = None


class ToolResultBlock(_Block, frozen=True, gc=False, tag="tool_result"):
    tool_use_id: str
    content: str | list[ResultText | ResultImage | ResultDocument] | None = None
    is_error: bool | None = None
    cache_control: Mark = None


class ThinkingBlock(_Block, frozen=True, gc=False, tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block, frozen=True, gc=False, tag="redacted_thinking"):
    data: str


class ToolUseBlock(_Block, frozen=True, gc=False, tag="tool_use"):
    id: _NonEmpty
    name: _NonEmpty
    input: dict[str, Any] | None = None
    cache_control: Mark = None


class _Message(msgspec.Struct, frozen=True, gc=False, tag_field="role"):
    pass


class UserMessage(_Message, frozen=True, gc=False, tag="user"):
    content: str | list[TextBlock | ImageBlock | DocumentBlock | ToolResultBlock]


class AssistantMessage(_Message, frozen=True, gc=False, tag="assistant"):
    content: str | list[TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock]


class SystemMessage(_Message, frozen=True, gc=False, tag="system"):
    content: str | list[SystemText]


class _Choice(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    pass


class AutoChoice(_Choice, frozen=True, gc=False, tag="auto"):
    disable_parallel_tool_use: bool | None = None


class AnyChoice(_Choice, frozen=True, gc=False, tag="any"):
    disable_parallel_tool_use: bool | None = None


class NoChoice(_Choice, frozen=True, gc=False, tag="none"):
    disable_parallel_tool_use: bool | None = None


class ToolChoice(_Choice, frozen=True, gc=False, tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class _Thinking(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    pass


class EnabledThinking(_Thinking, frozen=True, gc=False, tag="enabled"):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1)]


class DisabledThinking(_Thinking, frozen=True, gc=False, tag="disabled"):
    pass


class AdaptiveThinking(_Thinking, frozen=True, gc=False, tag="adaptive"):
    pass


class BetweenToolsThinking(_Thinking, frozen=True, gc=False, tag="between_tools"):
    pass


class JsonSchemaFormat(msgspec.Struct, frozen=True, gc=False):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, frozen=True, gc=False):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonSchemaFormat | None = None


class Metadata(msgspec.Struct, frozen=True, gc=False):
    user_id: str | None = None


class CustomTool(msgspec.Struct, frozen=True, gc=False):
    name: _NonEmpty
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: Mark = None


class MessagesBody(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A Messages request's fields that svir reads, in the order they are translated (which names
    the first of several mistakes)."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    system: str | list[SystemText] | None = None
    messages: Annotated[
        list[UserMessage | AssistantMessage | SystemMessage], msgspec.Meta(min_length=1)
    ]
    stream: bool | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: int | float | None = None
    top_p: int | float | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: AutoChoice | AnyChoice | NoChoice | ToolChoice | None = None
    thinking: (
        EnabledThinking | DisabledThinking | AdaptiveThinking | BetweenToolsThinking | None
    ) = None
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None


# The type of each of the body's fields, for the first mistake in one.
_FIELD_TYPES: Final = {field.name: field.type for field in msgspec.structs.fields(MessagesBody)}


def decode(body: Any) -> MessagesBody:
    """The body as a MessagesBody; Refusal names its first mistake (`first_mistake`)."""
    try:
        return msgspec.convert(body, MessagesBody)
    except msgspec.ValidationError:
        raise first_mistake(body, []) from None


def decode_tool(body: dict[str, Any], k: int) -> CustomTool:
    """The body's `tools.k`, a custom tool, as a CustomTool; Refusal names its first mistake."""
    try:
        return msgspec.convert(body["tools"][k], CustomTool)
    except msgspec.ValidationError:
        raise first_mistake(body, ["tools", k]) from None


def first_mistake(body: Any, at: list[str | int]) -> Refusal:
    """The first mistake in the value at `at` in the body (the body itself, one of its fields, a
    tool), as svir has always named it: each object's fields in the order its struct declares them
    (the order they were checked in), a missing field where it stands. msgspec itself meets the
    fields in the body's order, and missing ones last."""
    kind = MessagesBody if not at else CustomTool if at[0] == "tools" else _FIELD_TYPES[str(at[0])]
    value = value_at(body, at)
    try:
        msgspec.convert(_ordered(value, _type_info(kind)), kind)
    except msgspec.ValidationError as exc:
        return _marks_last(body, at, _refusal(body, at, exc))
    return Refusal(_dotted(at) or None, "is not valid")  # not reached: the value was refused


def _marks_last(body: Any, at: list[str | int], mistake: Refusal) -> Refusal:
    """`mistake`, or when it is a system text block's cache mark, a mistake in the text of a later
    block of the same system text: the marks of a system text were checked after its texts."""
    keys: list[str | int] = [int(k) if k.isdigit() else k for k in (mistake.param or "").split(".")]
    texts_at = keys[:-2]
    system = texts_at == ["system"] or (
        len(texts_at) == 3 and value_at(body, [*texts_at[:2], "role"]) == "system"
    )
    if keys[-1] != "cache_control" or not system:
        return mistake
    unmarked = [
        {key: v for key, v in block.items() if key != "cache_control"}
        if isinstance(block, dict)
        else block
        for block in value_at(body, texts_at)
    ]
    earlier = first_mistake(_replaced(body, texts_at, unmarked), at)
    return earlier if (earlier.param or "").startswith(f"{_dotted(texts_at)}.") else mistake


def _replaced(value: Any, keys: list[str | int], new: Any) -> Any:
    """`value` with `new` at `keys`, the containers on the way copied."""
    if not keys:
        return new
    copied: Any = list(value) if isinstance(value, list) else dict(value)
    copied[keys[0]] = _replaced(value[keys[0]], keys[1:], new)
    return copied


def block_before(message: dict[str, Any], j: int, field: str) -> dict[str, Any] | None:
    """Block j of a message (the body's, typed up to that block) cut to its `type` and the fields
    its struct declares before `field`; None when the block is not of a tagged type."""
    block = message["content"][j]
    for info in _block_types(message.get("role")):
        if info.tag == block.get("type"):
            names = [f.encode_name for f in info.fields]
            if field not in names:
                return None
            kept = names[: names.index(field)]
            return {"type": info.tag, **{name: block[name] for name in kept if name in block}}
    return None


def _block_types(role: Any) -> tuple[msgspec.inspect.StructType, ...]:
    """The block structs a message of `role` takes."""
    message = {"user": UserMessage, "assistant": AssistantMessage}.get(role)
    if message is None:
        return ()
    info = _type_info(message)
    assert isinstance(info, msgspec.inspect.StructType)
    content = info.fields[0].type
    assert isinstance(content, msgspec.inspect.UnionType)
    blocks = next(t for t in content.types if isinstance(t, msgspec.inspect.ListType)).item_type
    assert isinstance(blocks, msgspec.inspect.UnionType)
    return tuple(t for t in blocks.types if isinstance(t, msgspec.inspect.StructType))


@functools.cache
def _type_info(kind: Any) -> msgspec.inspect.Type:
    return msgspec.inspect.type_info(kind)


def _ordered(value: Any, info: msgspec.inspect.Type) -> Any:
    """`value` with each object's keys in the order its struct declares the fields (a struct's
    tag first, a missing required field as null), other keys after them."""
    if isinstance(info, msgspec.inspect.UnionType):
        for option in info.types:
            if isinstance(value, list) and isinstance(option, msgspec.inspect.ListType):
                return _ordered(value, option)
            if isinstance(value, dict) and isinstance(option, msgspec.inspect.StructType):
                tag = option.tag_field
                if tag is None or value.get(tag) == option.tag:
                    return _ordered(value, option)
        return value
    if isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        return [_ordered(item, info.item_type) for item in value]
    if not (isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict)):
        return value
    ordered: dict[str, Any] = {}
    if info.tag_field is not None:
        ordered[info.tag_field] = value.get(info.tag_field)
    for field in info.fields:
        if field.encode_name in value:
            ordered[field.encode_name] = _ordered(value[field.encode_name], field.type)
        elif field.required:
            ordered[field.encode_name] = None
    ordered.update((key, item) for key, item in value.items() if key not in ordered)
    return ordered


# -- msgspec's errors in svir's words

# msgspec's names of a JSON type, as a field's type is said.
_WHAT: Final = {
    "str": "a string",
    "object": "an object",
    "bool": "a boolean",
    "array": "an array",
    "int | float": "a number",
}
_BLOCKS: Final = "must be a string or an array of blocks"
_TEXT_BLOCKS: Final = "must be a string or an array of text blocks"
_TEXT_DOCUMENTS: Final = (
    "only text documents are supported (source type 'text', 'content', or base64 'text/plain')"
)
_SEALED: Final = ("thinking", "redacted_thinking", "tool_use")


def _refusal(body: Any, prefix: list[str | int], error: msgspec.ValidationError) -> Refusal:
    """The Refusal for msgspec's `error` about the value at `prefix` in the body."""
    found = mistake(error)
    keys = prefix + found.keys
    # Only a tagged union's tag can be missing: `_ordered` puts a null for every other field.
    what = "str" if found.missing else found.expected
    return Refusal(*_worded(body, keys, value_at(body, keys), what))


def _dotted(keys: list[str | int]) -> str:
    return ".".join(map(str, keys))


def _worded(
    body: Any, keys: list[str | int], value: Any, what: str | None
) -> tuple[str | None, str]:
    """(param, message) for the mistake at `keys`, whose value is `value`."""
    param = _dotted(keys)
    got = json_type(value)
    if not keys:
        return None, f"the request body must be an object, not {got}"
    n = len(keys)
    last = keys[-1]
    if n == 1:
        if last == "model":
            return param, f"must be a non-empty string, not {shown(value)}"
        if last == "messages" and isinstance(value, list):
            return param, "at least one message is required"
        if last == "system":
            return param, f"{_TEXT_BLOCKS}, not {got}"
    if last in ("max_tokens", "budget_tokens"):
        return param, f"must be a positive integer, not {shown(value)}"
    if last == "top_k":
        return param, f"must be an integer of at least 0, not {shown(value)}"
    if keys == ["tool_choice", "type"]:
        return param, f"must be 'auto', 'any', 'tool' or 'none', not {shown(value)}"
    if keys == ["thinking", "type"]:
        return param, f"must be 'enabled', 'disabled' or 'adaptive', not {shown(value)}"
    if keys == ["output_config", "effort"]:
        efforts = "low, medium, high, xhigh, max"
        return param, f"must be one of {efforts}, not {shown(value)}"
    if keys[:2] == ["output_config", "format"] and n <= 3 and last != "schema":
        return "output_config.format", "must be {type: 'json_schema', schema: {...}}"
    if keys[0] == "messages" and n >= 3:
        message = value_at(body, keys[:2])
        if last == "role" and n == 3 and value_at(message, ["content"]) is None:
            return _dotted([*keys[:2], "content"]), "is required"
        if last == "role":
            return param, f"must be 'user' or 'assistant', not {shown(value)}"
        if n == 3 and last == "content":
            if value is None:
                return param, "is required"
            role = value_at(message, ["role"])
            return param, f"{_TEXT_BLOCKS if role == 'system' else _BLOCKS}, not {got}"
        if n > 4:
            worded = _in_block(body, keys, value)
            if worded is not None:
                return worded
    if keys[0] == "system" and n == 3 and last == "type" and isinstance(value, str):
        return _dotted(keys[:2]), f"must be a text block, not {shown(value)}"
    if what == "str" and isinstance(value, str):  # a string below its least length
        return param, "must not be empty"
    said = _WHAT.get(what) if what else None
    if said is None:  # not one of svir's own types: msgspec's words
        return param, f"is not valid ({what or 'missing'}), not {got}"
    return param, f"must be {said}, not {got}"


def _in_block(body: Any, keys: list[str | int], value: Any) -> tuple[str, str] | None:
    """The words for a mistake inside a message's content block (or a block inside one), or None
    where the generic words are right."""
    # The deepest block holding the mistake: the last index of a `content` array.
    p = max(i for i in range(3, len(keys)) if isinstance(keys[i], int) and keys[i - 1] == "content")
    block = value_at(body, keys[: p + 1])
    rest = keys[p + 1 :]
    param = _dotted(keys)
    if rest == ["type"]:
        if not isinstance(value, str):
            return None
        role = value_at(body, [*keys[:2], "role"])
        if p == 3 and role == "assistant":
            return param, f"an assistant message takes no {shown(value)} block"
        if p == 3 and role == "user" and value in _SEALED:
            return param, f"a user message takes no {value} block"
        if (p == 3 and role == "system") or keys[p - 2] == "source":
            return _dotted(keys[: p + 1]), f"must be a text block, not {shown(value)}"
        return param, f"unsupported content block type {shown(value)}"
    if rest == ["content"]:
        return param, f"{_BLOCKS}, not {json_type(value)}"
    if not rest or rest[0] != "source" or len(rest) == 1:
        return None
    source = value_at(block, ["source"])
    source_type = value_at(source, ["type"])
    where = _dotted(keys[: p + 2])
    if value_at(block, ["type"]) == "image":
        if rest[1] == "type":
            return param, f"must be 'base64' or 'url', not {shown(value)}"
        if rest == ["source", "media_type"] and isinstance(value, str):
            return param, f"must be one of {', '.join(IMAGE_TYPES)}, not {shown(value)}"
        return None
    media_type = value_at(source, ["media_type"])
    text_plain = source_type == "base64" and media_type == "text/plain"
    if rest[1] in ("type", "media_type") or (source_type == "base64" and not text_plain):
        return where, f"{_TEXT_DOCUMENTS}, not {shown(source_type)} {shown(media_type)}"
    if rest == ["source", "content"]:
        return param, f"{_TEXT_BLOCKS}, not {json_type(value)}"
    return None
