"""The conformance corpus's format (tests/conformance/README.md): a recorded stream (`NAME.sse`,
the exact bytes) beside its expected result (`NAME.json`: `server`, `proves`, `options`,
`expect`), and the one fold of a decoder's events into that result (`summarize`). The console's
"download as a conformance case" writes a captured stream in it (`case_zip`); the corpus test
reads it.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any, Final

from svir.wire.events import (
    ContentFilter,
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    RefusalDelta,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)

__all__ = ["ANTHROPIC_SERVER", "EXPECT_KEYS", "case_files", "case_name", "case_zip", "summarize"]

# The `server` whose streams are Anthropic's Messages streams (the corpus's `anthropic/` folder).
ANTHROPIC_SERVER: Final = "anthropic"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
# The keys of an expected result in the `decoder/` folder; `anthropic/` adds `thinking_blocks`.
EXPECT_KEYS: Final = (
    "id", "model", "answer", "reasoning", "reasoning_carrier", "refusal", "tool_calls",
    "finish_reason", "usage", "content_filter", "keepalives", "error", "complete",
)  # fmt: skip


def summarize(events: list[Event]) -> dict[str, Any]:
    """The expected-result form of a decoded stream (every key of `EXPECT_KEYS`, and
    `thinking_blocks`)."""
    answer: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    carrier = None
    calls: dict[int, dict[str, Any]] = {}
    blocks: list[dict[str, str]] = []
    sealed = 0  # pieces of reasoning already in a sealed block
    out: dict[str, Any] = {
        "id": None,
        "model": None,
        "finish_reason": None,
        "usage": None,
        "content_filter": [],
        "keepalives": 0,
        "error": None,
        "complete": False,
    }
    finished = False
    for ev in events:
        assert out["error"] is None and not out["complete"], f"event after the end: {ev!r}"
        if isinstance(ev, Role):
            assert out["id"] is None, "two role events"
            out["id"], out["model"] = ev.id or None, ev.model or None
        elif isinstance(ev, TextDelta):
            assert not finished
            answer.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            assert not finished
            reasoning.append(ev.text)
            carrier = carrier or ev.carrier
        elif isinstance(ev, RefusalDelta):
            refusal.append(ev.text)
        elif isinstance(ev, ReasoningSignature):
            text = "".join(reasoning[sealed:])
            sealed = len(reasoning)
            blocks.append({"type": "thinking", "thinking": text, "signature": ev.signature})
        elif isinstance(ev, RedactedReasoning):
            blocks.append({"type": "redacted_thinking", "data": ev.data})
        elif isinstance(ev, ToolCallStart):
            assert ev.index not in calls, "a call started twice"
            calls[ev.index] = {"index": ev.index, "id": ev.id, "name": ev.name, "arguments": ""}
        elif isinstance(ev, ToolCallDelta):
            calls[ev.index]["arguments"] += ev.arguments
        elif isinstance(ev, Finish):
            finished = True
            out["finish_reason"] = ev.reason
        elif isinstance(ev, Usage):
            out["usage"] = {
                "prompt_tokens": ev.prompt_tokens,
                "completion_tokens": ev.completion_tokens,
                "total_tokens": ev.total_tokens,
                "reasoning_tokens": ev.reasoning_tokens,
                "cached_tokens": ev.cached_tokens,
            }
        elif isinstance(ev, ContentFilter):
            out["content_filter"].append(
                {"scope": ev.scope, "filtered": ev.filtered, "categories": list(ev.categories)}
            )
        elif isinstance(ev, Keepalive):
            out["keepalives"] += 1
        elif isinstance(ev, StreamError):
            out["error"] = {"kind": ev.error.kind.value, "message": ev.error.message}
        elif isinstance(ev, Done):
            out["complete"] = True
    out["answer"] = "".join(answer)
    out["reasoning"] = "".join(reasoning)
    out["reasoning_carrier"] = carrier
    out["refusal"] = "".join(refusal) if refusal else None
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    out["thinking_blocks"] = blocks
    return out


def case_name(request_id: str) -> str:
    """The file name (without suffix) of a captured request's case."""
    return "capture-" + (_UNSAFE.sub("_", request_id)[:100] or "request")


def case_files(
    name: str,
    raw: bytes,
    events: list[Event],
    *,
    server: str,
    options: dict[str, Any],
    proves: str,
) -> dict[str, bytes]:
    """The two files of a case, by their path in the corpus (`decoder/NAME.sse` and
    `decoder/NAME.json`, or under `anthropic/` for Anthropic's streams): the raw stream and what
    `events` (its decoding) sum up to."""
    summary = summarize(events)
    keys = EXPECT_KEYS + (("thinking_blocks",) if server == ANTHROPIC_SERVER else ())
    spec = {
        "server": server,
        "proves": proves,
        "options": {
            "think_tags": bool(options.get("think_tags", False)),
            "tool_names": options.get("tool_names"),
        },
        "expect": {k: summary[k] for k in keys},
    }
    folder = "anthropic" if server == ANTHROPIC_SERVER else "decoder"
    text = json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
    return {f"{folder}/{name}.sse": raw, f"{folder}/{name}.json": text.encode()}


def case_zip(files: dict[str, bytes]) -> bytes:
    """The files in one zip archive, laid out as the corpus folder has them (no clock read: each
    entry is dated 1980-01-01, so the same case gives the same bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return out.getvalue()
