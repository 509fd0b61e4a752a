"""The cost of translating an Anthropic Messages request to the canonical chat request: this tree's
`svir.protocols.anthropic.request` against the same module at another commit (`--before`, the
hand-checked translation by default), in one process, alternating rounds, the best of each (CPU time).

The request is a Claude Code turn deep in a session (built here, about 70 KB): three system blocks
with cache marks, 18 tools with JSON schemas, and 24 rounds of a user's text, the assistant's
thinking, text and a call, and the call's result. Both modules get the same decoded body (a front
end decodes every body with `read_json` before it translates); their answers must be equal. Also
shown, for scale: the decode of the body's bytes, and msgspec's typed decode straight from the
bytes into `MessagesBody` (what a route reading the bytes itself would do).

`--instructions` counts instead the instructions of one translation under valgrind's callgrind
(a run of `--number` calls less a run of none, for each module), which the load of a shared machine
does not move as it moves time. `--agree N` checks the errors instead: the answers of both
modules to N bodies of tests/anthropic/test_request.py's fuzz, which must be the same (the same
translation, or the same param and message).

    .venv/bin/python -m bench.anthropic_request [--before REV] [--rounds 15] [--number 100]
        [--instructions] [--agree N]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from bench import before_after
from bench.before_after import cpu_per_call, load_before
from svir.protocols.anthropic import request as typed
from svir.protocols.anthropic.body import MessagesBody
from svir.wire.jsonbody import decode_body

# The last commit whose translation checks every field by hand.
HAND_CHECKED = "70f08ab"
MODULE = "svir/protocols/anthropic/request.py"
EPHEMERAL = {"type": "ephemeral"}


def words(n: int, seed: int) -> str:
    """n words of varied text, the same for the same seed."""
    vocabulary = [
        "the",
        "file",
        "function",
        "test",
        "error",
        "value",
        "config",
        "request",
        "module",
        "line",
        "path",
        "call",
    ]
    return " ".join(vocabulary[(i * 7 + seed) % len(vocabulary)] for i in range(n))


def tool(name: str, params: int) -> dict[str, Any]:
    properties = {
        f"{name.lower()}_{k}": {"type": "string", "description": words(25, k)}
        for k in range(params)
    }
    return {
        "name": name,
        "description": words(120, len(name)),
        "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": properties,
            "required": list(properties)[:2],
            "additionalProperties": False,
        },
    }


def claude_code_request() -> dict[str, Any]:
    """A Claude Code turn deep in a session, as its body comes decoded."""
    names = "Task Bash Glob Grep LS ExitPlanMode Read Edit MultiEdit Write NotebookEdit WebFetch"
    names += " TodoWrite WebSearch BashOutput KillShell SlashCommand Skill"
    tools = [tool(name, 3 + i % 4) for i, name in enumerate(names.split())]
    tools[-1]["cache_control"] = EPHEMERAL
    messages: list[dict[str, Any]] = []
    for r in range(24):
        call = f"toolu_{r:04d}"
        user: list[dict[str, Any]] = [{"type": "text", "text": words(40, r)}]
        if r == 0:
            user.insert(0, {"type": "text", "text": "<system-reminder>" + words(300, 1)})
        messages.append({"role": "user", "content": user})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": words(60, r), "signature": "sig" * 30},
                    {"type": "text", "text": words(30, r + 1)},
                    {
                        "type": "tool_use",
                        "id": call,
                        "name": "Read" if r % 2 else "Bash",
                        "input": {"file_path": f"/w/src/{r}.py", "limit": 200},
                    },
                ],
            }
        )
        result = {"type": "tool_result", "tool_use_id": call, "content": words(90, r)}
        messages.append({"role": "user", "content": [result]})
    messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
            {"type": "text", "text": words(1000, 3), "cache_control": EPHEMERAL},
            {"type": "text", "text": "<env>" + words(120, 5) + "</env>"},
        ],
        "messages": messages,
        "tools": tools,
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
    }


def loaded(rev: str, tmp: Path) -> tuple[ModuleType, bytes, Any]:
    """The module before, the request's bytes and its decoded body, the two translations checked
    equal."""
    raw = msgspec.json.encode(claude_code_request())
    body = decode_body(raw)
    before = load_before(rev, tmp, MODULE)
    old, new = before.translate_request(body), typed.translate_request(body)
    assert (old.chat, old.warnings, old.user_id, old.image_urls) == (
        new.chat,
        new.warnings,
        new.user_id,
        new.image_urls,
    ), "the two translations differ"
    return before, raw, body


def timed(rev: str, rounds: int, number: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        before, raw, body = loaded(rev, Path(tmp))
        typed_decoder = msgspec.json.Decoder(MessagesBody)
        cases = {
            "before: translate (hand checks)": lambda: before.translate_request(body),
            "after: convert + translate": lambda: typed.translate_request(body),
            "decode_body (bytes -> dict)": lambda: decode_body(raw),
            "typed decode (bytes -> MessagesBody)": lambda: typed_decoder.decode(raw),
        }
        runs: dict[str, list[float]] = {label: [] for label in cases}
        for _ in range(rounds):
            for label, fn in cases.items():
                runs[label].append(cpu_per_call(fn, number))
    print(
        f"request: {len(raw) / 1024:.1f} KB, {len(body['messages'])} messages, "
        f"{len(body['tools'])} tools; CPU time, best of {rounds} rounds of {number} calls"
    )
    for label, times in runs.items():
        print(f"  {label:40} {min(times) * 1e6:8.1f} µs")
    after, hand = runs["after: convert + translate"], runs["before: translate (hand checks)"]
    paired = statistics.median(a / b for a, b in zip(after, hand, strict=True))
    print(f"after / before: {min(after) / min(hand):.3f} (best), {paired:.3f} (median of rounds)")


def calls(rev: str, which: str, number: int) -> None:
    """The work one callgrind run counts: setup, one call of each, then `number` calls of one."""
    with tempfile.TemporaryDirectory() as tmp:
        before, _, body = loaded(rev, Path(tmp))
        translate = {"before": before.translate_request, "after": typed.translate_request}
        for _ in range(number if which != "none" else 0):
            translate[which](body)


def agreement(rev: str, examples: int) -> None:
    """How many of `examples` bodies (the fuzz of tests/anthropic/test_request.py: any JSON, bodies
    of every field right or wrong, valid conversations) the two modules answer alike: the same
    translation, or the same error (param and message)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.anthropic.test_request import BODY, CONVERSATION, JSON

    def outcome(module: ModuleType, body: Any) -> tuple[Any, ...]:
        try:
            got = module.translate_request(body)
        except module.MessagesRequestError as exc:
            return ("refused", exc.param, exc.message)
        return ("translated", got.chat, got.warnings, got.user_id, got.image_urls)

    counts = {"same": 0, "translated": 0, "differ": 0}
    differing: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        before = load_before(rev, Path(tmp), MODULE)

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.one_of(JSON, BODY, CONVERSATION))
        def compare(body: Any) -> None:
            old, new = outcome(before, body), outcome(typed, body)
            counts["translated"] += old[0] == "translated"
            if old == new:
                counts["same"] += 1
            else:
                counts["differ"] += 1
                differing.append((body, old, new))

        compare()
    print(
        f"{counts['same']} of {examples} bodies answered alike "
        f"({counts['translated']} translated by the module before), {counts['differ']} differ"
    )
    for body, old, new in differing[:5]:
        print(f"  {str(body)[:300]}\n    before: {str(old)[:200]}\n    after:  {str(new)[:200]}")


def main(argv: list[str] | None = None) -> int:
    return before_after.main(
        argv,
        __doc__,
        "bench.anthropic_request",
        HAND_CHECKED,
        timed=timed,
        calls=calls,
        agreement=agreement,
    )


if __name__ == "__main__":
    sys.exit(main())
