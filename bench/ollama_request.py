"""The cost of translating an Ollama `/api/chat` request to the canonical chat request: this tree's
`svir.protocols.ollama.request` against the same module at another commit (`--before`, the
hand-checked translation by default), in one process, alternating rounds, the best of each (CPU
time). Also an `/api/generate` body of a prompt and a system text.

The chat request is an agent's turn deep in a session (built here, about 60 KB): a system prompt,
12 tools with JSON schemas, and 20 rounds of a user's text, the assistant's thinking and a call,
and the call's result, with sampling options. Both modules get the same decoded body; their answers
must be equal.

`--instructions` counts instead the instructions of one translation under valgrind's callgrind
(a run of `--number` calls less a run of none, for each module). `--agree N` checks the errors
instead: the answers of both modules to N bodies of tests/ollama/test_fuzz.py's fuzz (as chat
bodies, and with generate's fields as generate bodies), which must be the same (the same
translation, or the same error) or, where a body has several mistakes, another of them named.

    .venv/bin/python -m bench.ollama_request [--before REV] [--rounds 15] [--number 100]
        [--instructions] [--agree N]
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from bench import before_after
from bench.anthropic_request import tool, words
from bench.before_after import cpu_per_call, load_before
from svir.errors import OllamaError
from svir.protocols.ollama import request as typed
from svir.wire.jsonbody import decode_body

# The last commit whose translation checks every field by hand.
HAND_CHECKED = "2d3ce0a"
MODULE = "svir/protocols/ollama/request.py"


def agent_request() -> dict[str, Any]:
    """An agent's `/api/chat` turn deep in a session, as its body comes decoded."""
    names = "read_file write_file list_dir grep run_command fetch_url search edit_file"
    names += " create_dir delete_file git_status ask_user"
    tools = []
    for i, name in enumerate(names.split()):
        spec = tool(name, 2 + i % 4)
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": spec["description"],
                    "parameters": spec["input_schema"],
                },
            }
        )
    messages: list[dict[str, Any]] = [{"role": "system", "content": words(800, 2)}]
    for r in range(20):
        name = "read_file" if r % 2 else "run_command"
        messages.append({"role": "user", "content": words(40, r)})
        messages.append(
            {
                "role": "assistant",
                "content": words(30, r + 1),
                "thinking": words(60, r),
                "tool_calls": [
                    {"function": {"name": name, "arguments": {"path": f"/w/src/{r}.py"}}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_name": name, "content": words(90, r)})
    return {
        "model": "qwen3-coder:30b",
        "messages": messages,
        "tools": tools,
        "stream": True,
        "think": True,
        "options": {"temperature": 0.7, "top_p": 0.8, "num_predict": 4096, "num_ctx": 32768},
        "keep_alive": "30m",
    }


def generate_request() -> dict[str, Any]:
    """An `/api/generate` body: a prompt, a system text and options."""
    return {
        "model": "llama3.2:latest",
        "prompt": words(300, 4),
        "system": words(100, 6),
        "stream": False,
        "options": {"temperature": 0.2, "seed": 42, "stop": ["\n\n"]},
    }


def loaded(rev: str, tmp: Path) -> tuple[ModuleType, dict[str, Any], dict[str, Any]]:
    """The module before and the two decoded bodies, each translated alike by both modules."""
    before = load_before(rev, tmp, MODULE)
    chat = decode_body(msgspec.json.encode(agent_request()))
    generate = decode_body(msgspec.json.encode(generate_request()))
    assert before.to_openai_request(chat) == typed.to_openai_request(chat), "chat differs"
    assert before.to_generate_request(generate) == typed.to_generate_request(generate)
    return before, chat, generate


def timed(rev: str, rounds: int, number: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        before, chat, generate = loaded(rev, Path(tmp))
        cases = {
            "chat before (hand checks)": lambda: before.to_openai_request(chat),
            "chat after (convert + translate)": lambda: typed.to_openai_request(chat),
            "generate before": lambda: before.to_generate_request(generate),
            "generate after": lambda: typed.to_generate_request(generate),
        }
        runs: dict[str, list[float]] = {label: [] for label in cases}
        for _ in range(rounds):
            for label, fn in cases.items():
                runs[label].append(cpu_per_call(fn, number))
    size = len(msgspec.json.encode(chat)) / 1024
    print(
        f"chat: {size:.1f} KB, {len(chat['messages'])} messages, {len(chat['tools'])} tools; "
        f"CPU time, best of {rounds} rounds of {number} calls"
    )
    for label, times in runs.items():
        print(f"  {label:36} {min(times) * 1e6:8.1f} µs")
    for what in ("chat", "generate"):
        after = runs[next(k for k in runs if k.startswith(f"{what} after"))]
        hand = runs[next(k for k in runs if k.startswith(f"{what} before"))]
        paired = statistics.median(a / b for a, b in zip(after, hand, strict=True))
        print(f"{what} after / before: {min(after) / min(hand):.3f} (best), {paired:.3f} (median)")


def calls(rev: str, which: str, number: int) -> None:
    """The work one callgrind run counts: setup, one call of each, then `number` calls of one."""
    with tempfile.TemporaryDirectory() as tmp:
        before, chat, _ = loaded(rev, Path(tmp))
        translate = {"before": before.to_openai_request, "after": typed.to_openai_request}
        for _ in range(number if which != "none" else 0):
            translate[which](chat)


_MESSAGE_AT = re.compile(r"^messages\[(\d+)\]")
_OPTION_AT = re.compile(r"^options\.(\w+)")


def mistakes(translate: Any, body: Any, limit: int = 12) -> list[str]:
    """Every mistake `translate` names in the body, one after another: each named one mended (its
    field left out, a message replaced by a plain one, a model given) and the body tried again."""
    named: list[str] = []
    while len(named) < limit and isinstance(body, dict):
        try:
            translate(body)
        except OllamaError as exc:
            named.append(exc.message)
            body = dict(body)
            message, option = _MESSAGE_AT.match(exc.message), _OPTION_AT.match(exc.message)
            if exc.message.startswith("model"):
                body.pop("name", None)
                body["model"] = "m"
            elif message and isinstance(body.get("messages"), list):
                body["messages"] = list(body["messages"])
                body["messages"][int(message.group(1))] = {"role": "user"}
            elif option and isinstance(body.get("options"), dict):
                body["options"] = {k: v for k, v in body["options"].items() if k != option[1]}
            else:
                body.pop(re.split(r"[ .\[:]", exc.message, maxsplit=1)[0], None)
        else:
            break
    return named


def agreement(rev: str, examples: int) -> None:
    """How the two modules answer `examples` fuzzed bodies, as chat and as generate bodies: alike
    (the same translation or error); refused by both naming another of the body's mistakes (the
    typed module names the first type mistake in the body's order, then what is missing or
    wrong in meaning); refused in other words; or one translating what the other refuses."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.ollama.test_fuzz import anything, as_received, images, json_values, maybe

    extra = st.fixed_dictionaries(
        {},
        optional={
            "prompt": maybe(st.text(max_size=8)),
            "suffix": maybe(st.sampled_from(["", "}", "end"])),
            "system": maybe(st.text(max_size=5)),
            "template": maybe(st.sampled_from(["", "{{ .Prompt }}"])),
            "raw": maybe(st.booleans()),
            "context": maybe(st.lists(st.integers(0, 9), max_size=2)),
            "images": maybe(images),
        },
    )

    def outcome(translate: Any, body: Any) -> tuple[Any, ...]:
        try:
            return ("translated", translate(body))
        except OllamaError as exc:
            return ("refused", exc.message, exc.status)

    counts = {"same": 0, "translated": 0, "other words": 0, "another": 0, "differ": 0}
    differing: list[tuple[Any, ...]] = []
    reworded: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        before = load_before(rev, Path(tmp), MODULE)

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(anything, st.one_of(json_values, extra), st.booleans())
        def compare(body: Any, more: Any, generate: bool) -> None:
            if generate and isinstance(body, dict) and isinstance(more, dict):
                body = {**body, **more}
            body = as_received(body)
            name = "to_generate_request" if generate else "to_openai_request"
            old = outcome(getattr(before, name), body)
            new = outcome(getattr(typed, name), body)
            counts["translated"] += old[0] == "translated"
            if old == new:
                counts["same"] += 1
            elif old[0] == new[0] == "refused" and new[1] in mistakes(getattr(before, name), body):
                counts["another"] += 1
            elif old[0] == new[0] == "refused":
                counts["other words"] += 1
                reworded.append((body, old, new))
            else:
                counts["differ"] += 1
                differing.append((body, old, new))

        compare()
    print(
        f"{counts['same']} of {examples} bodies answered alike ({counts['translated']} translated "
        f"by the module before), {counts['another']} refused naming another of the body's "
        f"mistakes (one the module before names once the first is mended), "
        f"{counts['other words']} refused in other words, {counts['differ']} differ"
    )
    for label, cases in (("differ", differing), ("other words", reworded)):
        for body, old, new in cases[:6]:
            print(f"  [{label}] {str(body)[:300]}\n    before: {old[1:]}\n    after:  {new[1:]}")


def main(argv: list[str] | None = None) -> int:
    return before_after.main(
        argv,
        __doc__,
        "bench.ollama_request",
        HAND_CHECKED,
        timed=timed,
        calls=calls,
        agreement=agreement,
    )


if __name__ == "__main__":
    sys.exit(main())
