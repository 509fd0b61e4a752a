"""The tools of a Responses request as the chat functions svir offers upstream, and the names
the answer's calls map back to (`ToolTable`).

`function` tools are chat functions (`strict` kept); a `namespace` tool's functions are offered
as one flat function each (`flat_tool_name`: `<namespace>__<name>`, made unique and at most 64
characters), which `names` maps back to (namespace, name) for the output, and which a history's
`function_call` with a `namespace` is sent as; the default namespace `functions` (where
Responses-lite clients put their top-level tools) is offered under the bare names;
`additional_tools` input items (what Codex sends instead of `tools` to a model it knows as
OpenAI's) add their tools the same way. Any other tool type is dropped with a warning. The
`tool_choice` is read against the tools offered.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Final

from svir.protocols.responses.checks import ResponsesRequestError, Warnings, check
from svir.wire.jsonbody import json_type, shown

__all__ = ["DEFAULT_NAMESPACE", "ToolTable", "flat_tool_name"]

# Tools only OpenAI's own servers run: dropped (with a warning), since no upstream of svir does.
_HOSTED_TOOLS: Final = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "image_generation",
        "computer",
        "computer_use",
        "computer_use_preview",
        "local_shell",
        "shell",
        "apply_patch",
        "mcp",
        "code_interpreter",
        "custom",
        "tool_search",
    }
)
# The namespace of top-level tools (codex-rs's DEFAULT_FUNCTION_NAMESPACE): a Responses-lite
# client wraps its plain functions in it, and takes a call back with or without it.
DEFAULT_NAMESPACE: Final = "functions"
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# OpenAI's limit on a function's name, which the flat names of namespace tools stay within.
_NAME_LIMIT: Final = 64


def _unoffered_name(namespace: str, name: str) -> str:
    """The flat name of a call to a namespace function no longer offered: its own name in the
    default namespace, or in one named after itself (how the Agents SDK marks a deferred
    top-level function), else the name the namespace's function would have had."""
    if namespace in (DEFAULT_NAMESPACE, "", name):
        return name
    return flat_tool_name(namespace, name)


def flat_tool_name(namespace: str, name: str) -> str:
    """The function name a namespace tool's function is offered under before any collision is
    resolved: `<namespace>__<name>` (no second separator when the namespace ends in `_`, as
    Codex's `mcp__server__` do), only ASCII letters, digits, `_` and `-`, at most 64 characters
    (a longer one ends in a hash of the whole)."""
    joined = f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"
    clean = _NAME_BAD_CHARS.sub("_", joined) or "_"
    if len(clean) <= _NAME_LIMIT and clean == joined:
        return clean
    digest = hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{clean[: _NAME_LIMIT - 11]}_{digest}"


class ToolTable:
    """The tools one request offers upstream (`chat_tools`), their flat names (`offered`), and
    for a namespace's functions the (namespace, name) each flat name stands for (`names`) and
    back (`flat`)."""

    def __init__(self, warnings: Warnings) -> None:
        self.warnings = warnings
        self.chat_tools: list[dict[str, Any]] = []
        self.offered: set[str] = set()
        self.names: dict[str, tuple[str, str]] = {}
        self.flat: dict[tuple[str, str], str] = {}

    def tools(self, where: str, tools: list[Any]) -> None:
        for k, tool in enumerate(tools):
            here = f"{where}[{k}]"
            kind = check.tagged(here, tool)
            if kind == "function":
                self.function(here, tool, None)
            elif kind == "namespace":
                self.namespace(here, tool)
            else:
                name = tool.get("name")
                label = f"{kind} tool {name}" if isinstance(name, str) else f"{kind} tool"
                self.warnings.once(f"{label} dropped: svir serves function tools only")

    def namespace(self, here: str, tool: dict[str, Any]) -> None:
        ns = check.string(f"{here}.name", tool.get("name"))
        if not ns:
            raise ResponsesRequestError(f"{here}.name", "must not be empty")
        description = tool.get("description")
        if description is not None:
            description = check.string(f"{here}.description", description)
        inner = tool.get("tools")
        if not isinstance(inner, list):
            raise ResponsesRequestError(
                f"{here}.tools", f"must be an array, not {json_type(inner)}"
            )
        for j, fn in enumerate(inner):
            where = f"{here}.tools[{j}]"
            kind = check.tagged(where, fn)
            if kind == "function":
                self.function(where, fn, (ns, description or ""))
            else:
                self.warnings.once(
                    f"{kind} tool in namespace {ns} dropped: svir serves function tools only"
                )

    def function(self, here: str, tool: dict[str, Any], ns: tuple[str, str] | None) -> None:
        name = check.string(f"{here}.name", tool.get("name"))
        if not name:
            raise ResponsesRequestError(f"{here}.name", "must not be empty")
        function: dict[str, Any] = {}
        description = tool.get("description")
        if description is not None:
            description = check.string(f"{here}.description", description)
        if ns is None or ns[0] == DEFAULT_NAMESPACE:
            # A top-level function, or one of the default namespace's (Responses-lite clients
            # such as Codex wrap their top-level tools in it): offered under its own name.
            flat = name
            if flat in self.offered:
                if self.names.get(flat, (DEFAULT_NAMESPACE,))[0] != DEFAULT_NAMESPACE:
                    raise ResponsesRequestError(
                        f"{here}.name", f"{shown(name)} is also a namespace tool's flat name"
                    )
                return  # the same tool again (tools and additional_tools): offered once
            if ns is not None:
                self.flat[(ns[0], name)] = flat
                self.names[flat] = (ns[0], name)
        else:
            key = (ns[0], name)
            if key in self.flat:
                return
            flat = self.unique(flat_tool_name(*key))
            self.names[flat] = key
            self.flat[key] = flat
            if ns[1]:
                # The model sees one flat list: the namespace's description tells it the group.
                description = f"{ns[1]}\n{description}" if description else ns[1]
        function["name"] = flat
        if description:
            function["description"] = description
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise ResponsesRequestError(
                    f"{here}.parameters", f"must be an object, not {json_type(parameters)}"
                )
            function["parameters"] = parameters
        strict = tool.get("strict")
        if strict is not None:
            function["strict"] = check.boolean(f"{here}.strict", strict)
        self.offered.add(flat)
        self.chat_tools.append({"type": "function", "function": function})

    def unique(self, flat: str) -> str:
        if flat not in self.offered and flat not in self.names:
            return flat
        n = 2
        while True:
            tail = f"_{n}"
            candidate = flat[: _NAME_LIMIT - len(tail)] + tail
            if candidate not in self.offered and candidate not in self.names:
                return candidate
            n += 1

    def additional_tools(self, history: Sequence[Any], items: list[Any]) -> None:
        """The tools of `additional_tools` items, in the history and in this input."""
        if not history and len(items) == 1:  # the common first request: one item, no history
            item = items[0]
            if not isinstance(item, dict) or item.get("type") != "additional_tools":
                return
        for where, group in (("previous_response_id: item", history), ("input", items)):
            for k, item in enumerate(group):
                if isinstance(item, dict) and item.get("type") == "additional_tools":
                    here = f"{where} {k}" if group is history else f"{where}[{k}]"
                    tools = item.get("tools")
                    if not isinstance(tools, list):
                        raise ResponsesRequestError(
                            f"{here}.tools", f"must be an array, not {json_type(tools)}"
                        )
                    self.tools(f"{here}.tools", tools)

    def tool_choice(self, choice: Any, chat: dict[str, Any]) -> None:
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise ResponsesRequestError(
                    "tool_choice", f"must be 'auto', 'none' or 'required', not {shown(choice)}"
                )
            chat["tool_choice"] = choice
            return
        kind = check.tagged("tool_choice", choice)
        if kind == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": self.chosen(choice)}}
        elif kind == "allowed_tools":
            mode = choice.get("mode")
            if mode not in ("auto", "required"):
                raise ResponsesRequestError(
                    "tool_choice.mode", f"must be 'auto' or 'required', not {shown(mode)}"
                )
            tools = choice.get("tools")
            if not isinstance(tools, list):
                raise ResponsesRequestError(
                    "tool_choice.tools", f"must be an array, not {json_type(tools)}"
                )
            allowed = set()
            for k, tool in enumerate(tools):
                here = f"tool_choice.tools[{k}]"
                if check.tagged(here, tool) == "function":
                    allowed.add(self.chosen(tool, here))
            chat["tools"] = [t for t in self.chat_tools if t["function"]["name"] in allowed]
            chat["tool_choice"] = mode
        else:
            self.warnings.add(f"tool_choice {kind} ignored: svir serves function tools only")

    def chosen(self, choice: dict[str, Any], where: str = "tool_choice") -> str:
        name = check.string(f"{where}.name", choice.get("name"))
        ns = choice.get("namespace")
        if ns is not None:
            flat = self.flat.get((check.string(f"{where}.namespace", ns), name))
        else:
            flat = name if name in self.offered else None
        if flat is None:
            raise ResponsesRequestError(f"{where}.name", f"function {shown(name)} is not in tools")
        return flat

    def call_name(self, namespace: str, name: str) -> str:
        """The flat name a call to a namespace's function is sent upstream under: the name it is
        offered under, else the one it would have had (`_unoffered_name`)."""
        return self.flat.get((namespace, name)) or _unoffered_name(namespace, name)
