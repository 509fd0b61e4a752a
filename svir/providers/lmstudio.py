"""LM Studio: rewrites the two request forms it rejects into ones it takes (§2.4, §2.6)."""

from __future__ import annotations

from typing import Any

from svir.providers.base import ProviderKind


def adapt_body(body: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a named `tool_choice` and a `json_object` response format.

    LM Studio answers both with 400. A named function becomes `required` over that one tool,
    which is the same request in the form LM Studio accepts, though it may not hold the model to
    it (§2.4). `json_object` becomes a schema that admits any object, which it compiles (§2.6).
    """
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        tools = body.get("tools")
        if isinstance(name, str) and isinstance(tools, list):
            named = [t for t in tools if _tool_name(t) == name]
            # A name that matches no tool is the client's mistake; LM Studio can say so.
            if named:
                body["tools"] = named
                body["tool_choice"] = "required"
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_object":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "json_object", "schema": {"type": "object"}},
        }
    return body


def _tool_name(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


KIND = ProviderKind(
    name="lmstudio",
    reasoning_key="reasoning_content",
    adapt_body=adapt_body,
    json_in_reasoning=True,
)
