"""A Responses request's items, and its history's, as the chat messages they make
(`Conversation`), each given back as an item object with an id.

- `message` items (the `type` may be left out) of role user, assistant, system and developer
  (both a system message; those before any other message join the first), their content read
  by svir.protocols.responses.content.
- The assistant side of a turn (its `reasoning`, `message` and `function_call` items, in any
  order, up to the next user, system or developer message or function_call_output) is ONE
  assistant message: its text, its `tool_calls` (call_id as the call's id, `arguments` as
  written), its reasoning as `reasoning_content`. A `function_call_output` is the tool message
  right after the assistant message holding its call (a user message that came between moves
  after it); its `input_text` parts are the text, `input_file` parts file blocks, and
  `input_image` parts a user message after the results (a tool message takes text only).
- `reasoning` items: the text is what `unseal(encrypted_content)` gives back, else the `content`
  (reasoning_text) parts, else the `summary` parts. A token that does not verify is ignored with
  a warning, never trusted.
- `item_reference` items are the item of that id in the history or earlier in the input.
- Items the tools svir does not serve leave in a history are dropped with a warning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from svir.protocols.responses.checks import ResponsesRequestError, Warnings, check
from svir.protocols.responses.content import (
    InputParts,
    assistant_content,
    part_list,
    system_content,
)
from svir.protocols.responses.tools import ToolTable
from svir.wire.jsonbody import json_type, shown
from svir.wire.request import split_text

__all__ = ["ID_PREFIXES", "Conversation", "fresh_id"]

# Items those tools leave in a conversation: dropped with a warning, as the tools are.
_HOSTED_ITEMS: Final = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "code_interpreter_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_summary",
        "compaction_trigger",
        "program",
        "program_output",
    }
)
ID_PREFIXES: Final = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "additional_tools": "at",
}


def fresh_id(new_id: Callable[[str], str] | None, kind: str, where: str, item: Any) -> str:
    """The id of an input item sent without one: `new_id`'s, else derived from the item and its
    place (`where`)."""
    prefix = ID_PREFIXES.get(kind, "item")
    if new_id is not None:
        return new_id(prefix)
    try:
        raw = msgspec.json.encode(item)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
        raw = repr(item).encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(where.encode() + b"\0" + raw).hexdigest()[:24]
    return f"{prefix}_{digest}"


class _Turn:
    """The assistant side of one turn, folded into one assistant message."""

    __slots__ = ("calls", "message", "reasoning", "texts")

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []


class Conversation:
    """The state of one walk of the items: the messages so far, the open assistant turn, the
    calls awaiting results, and the items by id (for `item_reference`)."""

    def __init__(
        self,
        messages: list[dict[str, Any]],
        tools: ToolTable,
        warnings: Warnings,
        unseal: Callable[[str], str | None] | None,
        new_id: Callable[[str], str] | None,
    ) -> None:
        self.messages = messages
        self.tools = tools
        self.warnings = warnings
        self.unseal = unseal
        self.new_id = new_id
        self.parts = InputParts()
        self.turn: _Turn | None = None
        # call_id -> the assistant message holding the call; answered ones are removed.
        self.calls: dict[str, dict[str, Any]] = {}
        self.call_at: dict[str, str] = {}
        self.answered: set[str] = set()
        # Messages made of a tool result's images (a tool message takes text only).
        self.image_messages: set[int] = set()
        self.by_id: dict[str, dict[str, Any]] = {}

    def walk(self, history: Sequence[Any], items: list[Any]) -> list[dict[str, Any]]:
        """The messages of the history's items then the input's; the input as item objects."""
        for k, item in enumerate(history):
            self.item(f"previous_response_id: item {k}", item, stored=True)
        input_items = [self.item(f"input[{k}]", item) for k, item in enumerate(items)]
        self.close_turn()
        self.unanswered()
        # A loop, not `any` over a generator: no generator made per request.
        for m in self.messages:
            if m["role"] != "system":
                break
        else:
            raise ResponsesRequestError("input", "must hold at least one message or item")
        return input_items

    def item(self, where: str, item: Any, *, stored: bool = False) -> dict[str, Any]:
        """Translate one item into the messages; return it as an item object with an id."""
        if not isinstance(item, dict):
            raise ResponsesRequestError(where, f"must be an object, not {json_type(item)}")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # an easy input message: {role, content}
        if not isinstance(kind, str):
            raise ResponsesRequestError(f"{where}.type", f"must be a string, not {json_type(kind)}")
        if kind == "item_reference":
            ref = check.string(f"{where}.id", item.get("id"))
            found = self.by_id.get(ref)
            if found is None:
                raise ResponsesRequestError(
                    f"{where}.id", f"no item {shown(ref)} in the history or earlier in the input"
                )
            return self.item(where, found, stored=True)
        given = item.get("id")
        if given is not None:
            check.string(f"{where}.id", given)
        if kind == "message":
            out = self.message(where, item)
        elif kind == "function_call":
            out = self.function_call(where, item)
        elif kind == "function_call_output":
            out = self.function_call_output(where, item)
        elif kind == "reasoning":
            out = self.reasoning_item(where, item)
        elif kind == "additional_tools":
            out = dict(item)  # its tools were read before any item
        elif kind in _HOSTED_ITEMS:
            self.warnings.once(f"{kind} items dropped: svir serves function tools only")
            out = dict(item)
        else:
            raise ResponsesRequestError(f"{where}.type", f"unknown item type {shown(kind)}")
        if given is None and not stored:
            out["id"] = fresh_id(self.new_id, kind, where, item)
        elif given is not None:
            out["id"] = given
        if isinstance(out.get("id"), str):
            self.by_id[out["id"]] = out
        return out

    def open_turn(self) -> _Turn:
        if self.turn is None:
            message: dict[str, Any] = {"role": "assistant", "content": ""}
            self.messages.append(message)
            self.turn = _Turn(message)
        return self.turn

    def close_turn(self) -> None:
        turn = self.turn
        if turn is None:
            return
        self.turn = None
        message = turn.message
        message["content"] = "\n".join(t for t in turn.texts if t)
        if turn.calls:
            message["tool_calls"] = turn.calls
        reasoning = "\n".join(r for r in turn.reasoning if r)
        if reasoning:
            message["reasoning_content"] = reasoning

    def message(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        role = item.get("role")
        content = item.get("content")
        if content is None:
            raise ResponsesRequestError(f"{where}.content", "is required")
        out: dict[str, Any] = {"type": "message", "role": role}
        status = item.get("status")
        if status is not None:
            out["status"] = check.string(f"{where}.status", status)
        if role == "assistant":
            texts, parts = assistant_content(f"{where}.content", content)
            self.open_turn().texts.extend(texts)
            out["content"] = parts
            phase = item.get("phase")
            if phase is not None:
                out["phase"] = check.string(f"{where}.phase", phase)
            return out
        if role in ("system", "developer"):
            text, parts = system_content(f"{where}.content", content)
            self.close_turn()
            if self.messages and all(m["role"] == "system" for m in self.messages):
                first = self.messages[-1]
                first["content"] = "\n".join(t for t in (first["content"], text) if t)
            else:
                self.messages.append({"role": "system", "content": text})
            out["content"] = parts
            return out
        if role == "user":
            chat_content, parts = self.parts.user_content(f"{where}.content", content)
            self.close_turn()
            self.messages.append({"role": "user", "content": chat_content})
            out["content"] = parts
            return out
        raise ResponsesRequestError(
            f"{where}.role",
            f"must be 'user', 'assistant', 'system' or 'developer', not {shown(role)}",
        )

    def function_call(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        call_id = check.string(f"{where}.call_id", item.get("call_id"))
        if not call_id:
            raise ResponsesRequestError(f"{where}.call_id", "must not be empty")
        if call_id in self.calls or call_id in self.answered:
            raise ResponsesRequestError(f"{where}.call_id", f"call {shown(call_id)} is used twice")
        name = check.string(f"{where}.name", item.get("name"))
        if not name:
            raise ResponsesRequestError(f"{where}.name", "must not be empty")
        arguments = item.get("arguments")
        arguments = "{}" if arguments is None else check.string(f"{where}.arguments", arguments)
        ns = item.get("namespace")
        flat = name
        if ns is not None:
            ns = check.string(f"{where}.namespace", ns)
            flat = self.tools.call_name(ns, name)
        turn = self.open_turn()
        turn.calls.append(
            {"id": call_id, "type": "function", "function": {"name": flat, "arguments": arguments}}
        )
        self.calls[call_id] = turn.message
        self.call_at[call_id] = where
        return dict(item)

    def function_call_output(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        call_id = check.string(f"{where}.call_id", item.get("call_id"))
        if call_id in self.answered:
            raise ResponsesRequestError(
                f"{where}.call_id", f"call {shown(call_id)} is answered twice"
            )
        assistant = self.calls.pop(call_id, None)
        if assistant is None:
            raise ResponsesRequestError(
                f"{where}.call_id",
                f"no function_call with call_id {shown(call_id)} in the input or the history",
            )
        self.answered.add(call_id)
        output = item.get("output")
        images: list[dict[str, Any]] = []
        if isinstance(output, str):
            text = output
        elif isinstance(output, list):
            parts = [self.parts.input_part(f"{where}.output[{j}]", p) for j, p in enumerate(output)]
            text, images = split_text(parts)
        else:
            raise ResponsesRequestError(
                f"{where}.output", f"must be a string or an array of parts, not {json_type(output)}"
            )
        self.close_turn()
        self.place_result({"role": "tool", "tool_call_id": call_id, "content": text}, assistant)
        if images:
            self.place_images(images, assistant)
        return dict(item)

    def unanswered(self) -> None:
        """A call without its output is a mistake, as OpenAI says ("No tool output found"):
        no chat server takes an assistant's tool calls without a result for each."""
        for call_id in self.calls:
            where = self.call_at[call_id]
            if where.startswith("input["):
                where = f"{where}.call_id"
                what = f"function_call {shown(call_id)}"
            else:
                where = "input"
                what = f"the previous response's function_call {shown(call_id)}"
            raise ResponsesRequestError(where, f"{what} has no function_call_output in input")

    def _after_results(self, assistant: dict[str, Any]) -> int:
        """The index after the assistant message and the tool results right after it."""
        out = self.messages
        at = len(out) - 1
        while out[at] is not assistant:
            at -= 1
        at += 1
        while at < len(out) and out[at]["role"] == "tool":
            at += 1
        return at

    def place_result(self, result: dict[str, Any], assistant: dict[str, Any]) -> None:
        # Chat servers want a call's results right after the calls, before any other message.
        self.messages.insert(self._after_results(assistant), result)

    def place_images(self, images: list[dict[str, Any]], assistant: dict[str, Any]) -> None:
        at = self._after_results(assistant)
        out = self.messages
        if at < len(out) and id(out[at]) in self.image_messages:
            out[at]["content"].extend(images)
            return
        message = {"role": "user", "content": images}
        self.image_messages.add(id(message))
        out.insert(at, message)

    def reasoning_item(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        text = ""
        sealed = item.get("encrypted_content")
        if sealed is not None:
            token = check.string(f"{where}.encrypted_content", sealed)
            restored = self.unseal(token) if self.unseal is not None and token else None
            if restored is None:
                self.warnings.once(
                    "reasoning encrypted_content ignored: not a token svir sealed, or changed"
                )
            else:
                text = restored
        texts = {}
        for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
            parts = item.get(key)
            if parts is None:
                texts[key] = ""
                continue
            parts = part_list(f"{where}.{key}", parts)
            found = []
            for j, part in enumerate(parts):
                here = f"{where}.{key}[{j}]"
                kind = check.tagged(here, part)
                if kind not in (part_type, "text"):
                    raise ResponsesRequestError(
                        f"{here}.type", f"must be {shown(part_type)}, not {shown(kind)}"
                    )
                found.append(check.string(f"{here}.text", part.get("text")))
            texts[key] = "\n".join(t for t in found if t)
        text = text or texts["content"] or texts["summary"]
        if text:
            self.open_turn().reasoning.append(text)
        return dict(item)
