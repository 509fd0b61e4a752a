"""A scripted upstream that answers by what the request holds, not only by its model name: enough
of a server's behaviour (§2.4–§2.6, §5) to drive `svir probe` against servers that cannot run here.

`script(body)` returns what to play: a corpus or `streams` name (or any name `ScriptedUpstream`
knows, such as `status-400-lmstudio-tool-choice-400`), or `(status, body bytes)` for an error
made up on the spot. Streams are built with `text_stream` and `tool_stream`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.mock_server import MockServerThread
from tests.support.mock_transport import MockRequest, MockResponse
from tests.support.upstream import BODIES_DIR, ScriptedUpstream

Reply = str | tuple[int, bytes]
Script = Callable[[dict[str, Any]], Reply]


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _chunk(model: str, delta: dict[str, Any] | None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    chunk: dict[str, Any] = {"id": f"chatcmpl-{model}", "object": "chat.completion.chunk",
                             "created": 1790000000, "model": model}  # fmt: skip
    if usage is not None:
        chunk["choices"] = []
        chunk["usage"] = usage
    else:
        chunk["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return chunk


def text_stream(
    text: str,
    *,
    reasoning: str | None = None,
    reasoning_key: str = "reasoning_content",
    usage: bool = True,
    finish: str = "stop",
    model: str = "scripted",
) -> bytes:
    """A streamed answer: reasoning (if any), then `text` word by word, finish, usage, [DONE]."""
    out = [_event(_chunk(model, {"role": "assistant", "content": ""}))]
    if reasoning:
        for word in reasoning.split(" "):
            out.append(_event(_chunk(model, {reasoning_key: word + " "})))
    pieces = text.split(" ")
    for i, word in enumerate(pieces):
        out.append(_event(_chunk(model, {"content": word + (" " if i < len(pieces) - 1 else "")})))
    out.append(_event(_chunk(model, {}, finish)))
    if usage:
        out.append(_event(_chunk(model, None, usage={
            "prompt_tokens": 12, "completion_tokens": len(pieces), "total_tokens": 12 + len(pieces),
        })))  # fmt: skip
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def tool_stream(name: str, arguments: str, *, finish: str = "tool_calls",
                model: str = "scripted") -> bytes:  # fmt: skip
    """A streamed tool call: id and name first, the arguments in two pieces, usage, [DONE]."""
    half = len(arguments) // 2
    out = [
        _event(_chunk(model, {"role": "assistant", "content": None})),
        _event(_chunk(model, {"tool_calls": [{"index": 0, "id": "call-1", "type": "function",
                                              "function": {"name": name, "arguments": arguments[:half]}}]})),
        _event(_chunk(model, {"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]})),
        _event(_chunk(model, {}, finish)),
        _event(_chunk(model, None, usage={"prompt_tokens": 30, "completion_tokens": 9,
                                          "total_tokens": 39})),
        b"data: [DONE]\n\n",
    ]  # fmt: skip
    return b"".join(out)


def prompt_of(body: dict[str, Any]) -> str:
    """The last message's text (the text parts of a parts array)."""
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


def has_image(body: dict[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, list) and any(p.get("type") == "image_url" for p in content)


def body_file(name: str) -> bytes:
    return (BODIES_DIR / f"{name}.json").read_bytes()


class ByBody(ScriptedUpstream):
    """`ScriptedUpstream` whose chat answers are what `script(body)` names."""

    def __init__(self, script: Script, **options: Any) -> None:
        super().__init__(**options)
        self.script = script

    def chat(
        self, request: MockRequest, name: str, n: int
    ) -> MockResponse | Awaitable[MockResponse] | None:
        body = request.json()
        if not isinstance(body, dict):
            return super().chat(request, name, n)
        reply = self.script(body)
        if isinstance(reply, tuple):
            status, payload = reply
            return MockResponse(status, payload, {"Content-Type": "application/json"})
        return super().chat(request, reply, n)


class ScriptedReplay(MockServerThread[ByBody]):
    """`ByBody(script, **options)` over loopback HTTP."""

    def __init__(self, script: Script, **options: Any) -> None:
        super().__init__(ByBody(script, **options))


# ---------------------------------------------------------------------------------------------
# Servers as the reference describes them

LOCKER_ARGS = '{"locker": 7}'
OVERFLOW_CHARS = 100_000

LMSTUDIO_STREAMS = {
    "hello": text_stream("Hello! How can I help?"),
    "hello-reasoning": text_stream("Hello!", reasoning="The user greets me."),
    "locker-call": tool_stream("open_locker", LOCKER_ARGS),
    "json-in-reasoning": text_stream("", reasoning='{"locker": 7, "open": true}'),
    "fifty-one": text_stream("51", reasoning="17 times 3 is 51."),
    "fifty-one-plain": text_stream("51"),
    "red": text_stream("Red."),
}


def lmstudio(body: dict[str, Any]) -> Reply:
    """LM Studio as §2.4–§2.6 and §3.5 describe it."""
    prompt = prompt_of(body)
    choice = body.get("tool_choice")
    rf = body.get("response_format") or {}
    if len(prompt) > OVERFLOW_CHARS:
        return "lmstudio-error"  # the context overflow, as an SSE error event with status 200
    if isinstance(choice, dict):
        return "status-400-lmstudio-tool-choice-400"
    if rf.get("type") == "json_object":
        return "status-400-lmstudio-json-object-400"
    if rf.get("type") == "json_schema":
        return "json-in-reasoning"  # the schema held to the reasoning, content empty
    if body.get("tools"):
        if choice == "required" or "locker" not in prompt:
            return "hello"  # required is accepted and not kept
        return "hello" if choice == "none" else "locker-call"
    if has_image(body):
        return "red"
    effort = body.get("reasoning_effort")
    if effort is not None:
        return "fifty-one-plain" if effort == "none" else "fifty-one"
    return "hello-reasoning"


MLX_LM_STREAMS = {
    "hello": text_stream("Hello!", reasoning="Greeting.", reasoning_key="reasoning"),
    "locker-call": tool_stream("open_locker", LOCKER_ARGS),
    "table": text_stream("| locker | open |\n|---|---|\n| 7 | yes |"),
    "fifty-one": text_stream("51", reasoning="17 times 3 is 51.", reasoning_key="reasoning"),
}


def mlx_lm(body: dict[str, Any]) -> Reply:
    """mlx-lm: reads no tool_choice, response_format or reasoning_effort, takes no image, and
    has no context limit (§2.2, §2.4–§2.6, §5)."""
    if has_image(body):
        return "status-404-mlx-lm-image-404"
    prompt = prompt_of(body)
    if body.get("tools") and "locker" in prompt:
        return "locker-call"  # whatever tool_choice says, "bogus" included
    if body.get("response_format"):
        return "table"
    if "17 times 3" in prompt:
        return "fifty-one"
    return "hello"


STRICT_STREAMS = {"hello": text_stream("Hello!", usage=False)}


def strict(body: dict[str, Any]) -> Reply:
    """A strict server (§2.5): refuses stream_options and every reasoning_effort."""
    if "stream_options" in body:
        return (
            400,
            b'{"error":{"message":"Unrecognized request argument supplied: stream_options","type":"invalid_request_error","param":"stream_options","code":null}}',
        )
    if "reasoning_effort" in body:
        return (
            422,
            b'{"detail":[{"type":"extra_forbidden","loc":["body","reasoning_effort"],"msg":"Extra inputs are not permitted"}]}',
        )
    return "hello"
