"""No JSON value gets anything out of the Responses translation but a ResponsesRequest or a
ResponsesRequestError (a 400 naming the field), and what it translates the chat core takes;
no string gets anything out of unsealing but the sealed text or None."""

from __future__ import annotations

import base64
import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.protocols.responses.checks import ResponsesRequestError
from svir.protocols.responses.request import translate_request
from svir.protocols.responses.sealed import seal_reasoning, unseal_reasoning
from svir.providers.request import validate_chat_request
from svir.wire.errors import BodyError
from svir.wire.request import build_messages

KEY = bytes(32)
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()

SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes any JSON at all."""
    return st.one_of(valid, valid, valid, JSON)


TEXT_PART = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["input_text", "output_text"])), "text": mostly(st.text())}
)
PART = st.one_of(
    TEXT_PART,
    st.fixed_dictionaries(
        {
            "type": st.just("input_image"),
            "image_url": mostly(st.sampled_from([PNG, "https://e.org/a.png", "data:x"])),
        },
        optional={"detail": mostly(st.sampled_from(["auto", "high", "original"]))},
    ),
    st.fixed_dictionaries(
        {"type": st.just("input_file"), "filename": mostly(st.text(max_size=3))},
        optional={
            "file_data": mostly(st.sampled_from(["eA==", "data:text/plain;base64,eA==", "%"])),
            "file_id": JSON,
        },
    ),
    st.fixed_dictionaries({"type": st.just("refusal"), "refusal": mostly(st.text(max_size=3))}),
)
CONTENT = mostly(st.text(max_size=5) | st.lists(PART, max_size=3))
CALL_IDS = st.sampled_from(["c1", "c2", "c3"])
MESSAGE = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant", "system", "developer"])),
        "content": CONTENT,
    },
    optional={"type": st.just("message"), "id": mostly(st.text(max_size=3)), "phase": JSON},
)
CALL = st.fixed_dictionaries(
    {
        "type": st.just("function_call"),
        "call_id": mostly(CALL_IDS),
        "name": mostly(st.sampled_from(["f", "read", "g"])),
        "arguments": mostly(st.just('{"a":1}')),
    },
    optional={"namespace": mostly(st.just("ns")), "id": mostly(st.just("fc_1"))},
)
OUTPUT = st.fixed_dictionaries(
    {
        "type": st.just("function_call_output"),
        "call_id": mostly(CALL_IDS),
        "output": mostly(st.text(max_size=3) | st.lists(PART, max_size=2)),
    }
)
SUMMARY = st.lists(
    st.fixed_dictionaries(
        {"type": mostly(st.just("summary_text")), "text": mostly(st.text(max_size=3))}
    ),
    max_size=2,
)
REASONING = st.fixed_dictionaries(
    {"type": st.just("reasoning"), "summary": mostly(SUMMARY)},
    optional={
        "id": st.just("rs_1"),
        "encrypted_content": mostly(
            st.none() | st.just(seal_reasoning(KEY, "sealed thought", nonce=b"\1" * 12))
        ),
        "content": mostly(
            st.lists(
                st.fixed_dictionaries({"type": st.just("reasoning_text"), "text": st.text()}),
                max_size=1,
            )
        ),
    },
)
FUNCTION = st.fixed_dictionaries(
    {"type": st.just("function"), "name": mostly(st.sampled_from(["f", "read", "g"]))},
    optional={
        "description": mostly(st.text(max_size=3)),
        "parameters": mostly(st.just({"type": "object"})),
        "strict": mostly(st.booleans()),
    },
)
NAMESPACE = st.fixed_dictionaries(
    {
        "type": st.just("namespace"),
        "name": mostly(st.just("ns")),
        "description": mostly(st.text(max_size=3)),
        "tools": mostly(st.lists(FUNCTION, max_size=2)),
    }
)
TOOL = st.one_of(
    FUNCTION,
    NAMESPACE,
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "custom", "mcp", "x"])}),
)
ITEM = st.one_of(
    MESSAGE,
    CALL,
    OUTPUT,
    REASONING,
    st.fixed_dictionaries(
        {"type": st.just("additional_tools"), "tools": mostly(st.lists(TOOL, max_size=2))}
    ),
    st.fixed_dictionaries({"type": st.just("item_reference"), "id": mostly(st.just("fc_1"))}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search_call", "frobnicate"])}),
    JSON,
)
BODY = st.fixed_dictionaries(
    {"model": mostly(st.just("lab/m")), "input": mostly(st.text(max_size=3) | st.lists(ITEM))},
    optional={
        "instructions": mostly(st.text(max_size=3)),
        "tools": mostly(st.lists(TOOL, max_size=3)),
        "tool_choice": mostly(
            st.sampled_from(["auto", "none", "required"])
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "allowed_tools", "web_search"])},
                optional={
                    "name": st.sampled_from(["f", "read"]),
                    "namespace": st.just("ns"),
                    "mode": st.sampled_from(["auto", "required"]),
                    "tools": st.lists(FUNCTION, max_size=2),
                },
            )
        ),
        "parallel_tool_calls": mostly(st.booleans()),
        "max_output_tokens": mostly(st.integers(min_value=1, max_value=10**6)),
        "temperature": mostly(st.floats(0, 2)),
        "top_p": mostly(st.floats(0, 1)),
        "reasoning": mostly(
            st.fixed_dictionaries(
                {},
                optional={
                    "effort": mostly(st.sampled_from(["low", "high", "none"])),
                    "summary": mostly(st.sampled_from(["auto", "detailed"])),
                },
            )
        ),
        "text": mostly(
            st.fixed_dictionaries(
                {},
                optional={
                    "format": mostly(
                        st.sampled_from(
                            [
                                {"type": "text"},
                                {"type": "json_object"},
                                {"type": "json_schema", "name": "A", "schema": {}},
                            ]
                        )
                    ),
                    "verbosity": mostly(st.just("low")),
                },
            )
        ),
        "metadata": mostly(st.dictionaries(st.text(max_size=3), st.text(max_size=3))),
        "include": mostly(st.lists(st.just("reasoning.encrypted_content"), max_size=1)),
        "store": mostly(st.booleans()),
        "stream": mostly(st.booleans()),
        "previous_response_id": mostly(st.just("resp_1")),
        "background": mostly(st.just(False)),
        "user": mostly(st.text(max_size=3)),
        "prompt_cache_key": mostly(st.text(max_size=3)),
        "truncation": JSON,
        "service_tier": JSON,
    },
)
# Conversations of valid turns only, so that the checks after translation run often.
TURN = st.sampled_from(
    [
        [{"role": "user", "content": "q"}],
        [{"role": "developer", "content": [{"type": "input_text", "text": "d"}]}],
        [
            {"type": "reasoning", "summary": [], "encrypted_content": None},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
        ],
        [{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}],
        [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            }
        ],
    ]
)


def _numbered(turns: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    # Each turn's call gets its own call_id, so that valid turns stay valid together.
    out = []
    for k, turn in enumerate(turns):
        for item in turn:
            out.append({**item, "call_id": f"c{k}"} if "call_id" in item else item)
    return out


CONVERSATION = st.builds(
    lambda turns, rest: {"model": "lab/m", "input": _numbered(turns), **rest},
    st.lists(TURN, min_size=1, max_size=5),
    BODY.map(lambda b: {k: v for k, v in b.items() if k not in ("model", "input")}),
)


def _check(body: Any, history: Any = ()) -> None:
    try:
        got = translate_request(body, history=history, unseal=lambda t: unseal_reasoning(KEY, t))
    except ResponsesRequestError:
        return
    # A translated request is one the chat core takes: its fields pass the shared check, and its
    # messages build, or fail only as a client's BodyError (a bad base64 image).
    validate_chat_request(got.chat)
    with contextlib.suppress(BodyError):
        build_messages(got.chat["messages"], reasoning_key="reasoning_content")
    assert all(isinstance(i.get("id"), str) for i in got.input_items)
    for flat in got.names:
        assert len(flat) <= 64


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(JSON, BODY, CONVERSATION))
def test_any_json_translates_or_is_a_named_400(body: Any) -> None:
    _check(body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODY, st.lists(ITEM, max_size=4))
def test_any_history_translates_or_is_a_named_400(body: dict[str, Any], history: Any) -> None:
    _check(body, history)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.binary(min_size=12, max_size=12))
def test_seal_round_trip(text: str, nonce: bytes) -> None:
    assert unseal_reasoning(KEY, seal_reasoning(KEY, text, nonce=nonce)) == text


@settings(max_examples=300, deadline=None)
@given(st.text() | st.text(alphabet="svir1.-_ABCabc0123456789", max_size=80))
def test_any_string_unseals_to_none(token: str) -> None:
    assert unseal_reasoning(KEY, token) is None
