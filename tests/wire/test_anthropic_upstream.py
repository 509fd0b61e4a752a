"""The upstream kind `anthropic` on the wire: a chat request as a Messages request, and what the
Messages stream decoder does beyond the recorded corpus (tests/conformance/anthropic)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from svir.protocols.anthropic.encode import MessageAggregator, MessageStreamEncoder
from svir.protocols.anthropic.request import translate_request
from svir.providers import build_upstream_body, get_kind
from svir.providers.anthropic_dialect import (
    DEFAULT_MAX_TOKENS,
    AnthropicStreamDecoder,
    messages_body,
)
from svir.wire.encoder import ChunkEncoder, CompletionAggregator
from svir.wire.errors import BodyError, ErrorKind
from svir.wire.events import (
    Done,
    Finish,
    Keepalive,
    ReasoningSignature,
    Role,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from svir.wire.request import build_messages
from svir.wire.sse import SSEComment, SSEEvent

PNG = "data:image/png;base64,iVBORw0KGgo="
TOOL = {
    "type": "function",
    "function": {
        "name": "look",
        "description": "Look something up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return messages_body({"model": "a/claude", "messages": messages, **fields}, "claude")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# ---------------------------------------------------------------------------------------------
# The request


def test_a_plain_request() -> None:
    assert body([user("hi")]) == {
        "model": "claude",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
        "max_tokens": DEFAULT_MAX_TOKENS,
    }


def test_leading_system_messages_are_the_system_blocks_with_their_cache_marks() -> None:
    mark = {"type": "ephemeral"}
    got = body(
        [
            {"role": "system", "content": "You are terse."},
            {
                "role": "developer",
                "content": [
                    {"type": "text", "text": "Tools:"},
                    {"type": "text", "text": "a long tool manual", "cache_control": mark},
                ],
            },
            {"role": "system", "content": "Late", "cache_control": mark},
            user("hi"),
        ]
    )
    assert got["system"] == [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Tools:"},
        {"type": "text", "text": "a long tool manual", "cache_control": mark},
        {"type": "text", "text": "Late", "cache_control": mark},
    ]


def test_a_system_message_inside_the_conversation_reaches_the_model_as_user_text() -> None:
    got = body([user("hi"), {"role": "system", "content": "env: linux"}, user("go")])
    assert "system" not in got
    assert got["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "text", "text": "env: linux"},
                {"type": "text", "text": "go"},
            ],
        }
    ]


def test_tool_results_are_one_user_message_ahead_of_its_text() -> None:
    calls = [
        {"id": "t1", "type": "function", "function": {"name": "look", "arguments": '{"q":"a"}'}},
        {"id": "t2", "type": "function", "function": {"name": "look", "arguments": ""}},
    ]
    got = body(
        [
            user("look twice"),
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "t1", "content": "A"},
            {"role": "tool", "tool_call_id": "t2", "content": [{"type": "text", "text": "B"}]},
            user("thanks"),
        ],
        tools=[TOOL],
    )
    assert got["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "look", "input": {"q": "a"}},
                {"type": "tool_use", "id": "t2", "name": "look", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "A"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "B"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


def test_a_tool_result_after_user_text_still_comes_first() -> None:
    got = body(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            user("by the way"),
            {"role": "tool", "tool_call_id": "t1", "content": "", "is_error": True},
        ]
    )
    assert got["messages"][1]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "is_error": True},
        {"type": "text", "text": "by the way"},
    ]


def test_images_as_base64_and_url_sources() -> None:
    got = body(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "compare"},
                    {"type": "image_url", "image_url": {"url": PNG}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                ],
            }
        ]
    )
    assert got["messages"][0]["content"] == [
        {"type": "text", "text": "compare"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
    ]


def test_a_cache_mark_on_a_part_folded_with_an_image_goes_on_the_last_block() -> None:
    mark = {"type": "ephemeral"}
    got = body(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see", "cache_control": mark},
                    {"type": "image_url", "image_url": {"url": PNG}},
                ],
            }
        ]
    )
    blocks = got["messages"][0]["content"]
    assert "cache_control" not in blocks[0]
    assert blocks[1]["cache_control"] == mark


def test_a_cache_mark_on_a_part_folded_with_a_file_stays() -> None:
    mark = {"type": "ephemeral"}
    file = {"filename": "a.txt", "file_data": "data:text/plain;base64,aGk="}
    got = body(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "read", "cache_control": mark},
                    {"type": "file", "file": file},
                ],
            }
        ]
    )
    (block,) = got["messages"][0]["content"]
    assert block == {
        "type": "text",
        "text": 'read\n<file name="a.txt">\nhi\n</file>',
        "cache_control": mark,
    }


def test_signed_thinking_goes_back_as_it_came_and_unsigned_reasoning_does_not() -> None:
    blocks = [
        {"type": "redacted_thinking", "data": "ENCRYPTED"},
        {"type": "thinking", "thinking": "plan", "signature": "SIG"},
        # Claude Code echoes its blocks with an empty signature: Anthropic would refuse them.
        {"type": "thinking", "thinking": "unsigned", "signature": ""},
    ]
    got = body(
        [
            user("q"),
            {
                "role": "assistant",
                "content": "answer",
                "reasoning_content": "plan",
                "thinking_blocks": blocks,
            },
            {"role": "assistant", "content": "more", "reasoning_content": "not signed"},
            user("next"),
        ]
    )
    assert got["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "ENCRYPTED"},
            {"type": "thinking", "thinking": "plan", "signature": "SIG"},
            {"type": "text", "text": "answer"},
            {"type": "text", "text": "more"},
        ],
    }


@pytest.mark.parametrize(
    ("blocks", "words"),
    [
        ("x", "thinking_blocks must be an array"),
        ([{"type": "secret"}], "thinking_blocks[0].type must be"),
        ([{"type": "thinking", "thinking": 1}], "thinking_blocks[0].thinking must be a string"),
        ([{"type": "redacted_thinking"}], "thinking_blocks[0].data must be"),
    ],
)
def test_bad_thinking_blocks_are_named(blocks: Any, words: str) -> None:
    with pytest.raises(BodyError, match=r"messages\[1\]\." + words.replace("[", r"\[")):
        body([user("q"), {"role": "assistant", "content": "a", "thinking_blocks": blocks}])


def test_an_empty_assistant_turn_is_left_out_and_its_neighbours_merge() -> None:
    got = body([user("a"), {"role": "assistant", "content": ""}, user("b")])
    assert got["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_an_assistant_messages_mark_goes_on_its_last_block_only() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    mark = {"type": "ephemeral"}
    msg = {"role": "assistant", "content": "Looking.", "tool_calls": [call], "cache_control": mark}
    got = body([user("a"), msg, {"role": "tool", "tool_call_id": "c1", "content": "r"}])
    text, tool_use = got["messages"][1]["content"]
    assert text == {"type": "text", "text": "Looking."}
    assert tool_use["type"] == "tool_use" and tool_use["cache_control"] == mark


def test_tools_and_tool_choice() -> None:
    bare = {"type": "function", "function": {"name": "now"}, "cache_control": {"type": "ephemeral"}}
    got = body([user("x")], tools=[TOOL, bare], tool_choice="required")
    assert got["tools"] == [
        {
            "name": "look",
            "description": "Look something up",
            "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
        },
        {
            "name": "now",
            "input_schema": {"type": "object", "properties": {}},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert got["tool_choice"] == {"type": "any"}


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        (
            {"type": "function", "function": {"name": "look"}},
            None,
            {"type": "tool", "name": "look"},
        ),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (None, None, None),
    ],
)
def test_tool_choice_mapping(choice: Any, parallel: Any, expected: Any) -> None:
    got = body([user("x")], tools=[TOOL], tool_choice=choice, parallel_tool_calls=parallel)
    assert got.get("tool_choice") == expected


def test_tool_settings_without_tools_are_not_sent() -> None:
    got = body([user("x")], tools=[], tool_choice="required")
    assert "tools" not in got and "tool_choice" not in got


def test_sampling_stop_and_limits() -> None:
    got = body(
        [user("x")],
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop="END",
        max_tokens=100,
        max_completion_tokens=50,
        user="u-1",
        # OpenAI's settings Anthropic has no field for, which it would refuse as unknown.
        n=1,
        seed=3,
        frequency_penalty=0.1,
        response_format={"type": "json_object"},
        stream_options={"include_usage": True},
    )
    assert got == {
        "model": "claude",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
        "stream": True,
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
    }


def test_reasoning_effort_is_a_thinking_budget_with_room_above_it() -> None:
    got = body([user("x")], reasoning_effort="medium", temperature=0.3)
    assert got["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert got["max_tokens"] == DEFAULT_MAX_TOKENS + 4096
    # Anthropic refuses a temperature with thinking on.
    assert "temperature" not in got


def test_a_budget_is_held_under_the_clients_cap_or_thinking_is_off() -> None:
    got = body([user("x")], reasoning_effort="high", max_tokens=5000)
    assert (got["max_tokens"], got["thinking"]["budget_tokens"]) == (5000, 4999)
    low = body([user("x")], reasoning_effort="low", max_tokens=500, temperature=0.5)
    assert "thinking" not in low
    assert (low["max_tokens"], low["temperature"]) == (500, 0.5)


def test_thinking_off_and_anthropics_own_thinking_object() -> None:
    off = body([user("x")], reasoning_effort="none", temperature=0.5)
    assert off["thinking"] == {"type": "disabled"}
    assert off["temperature"] == 0.5
    own = body([user("x")], thinking={"type": "enabled", "budget_tokens": 2048})
    assert own["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert own["max_tokens"] == DEFAULT_MAX_TOKENS + 2048


def test_metadata_user_id_wins_over_user() -> None:
    got = body([user("x")], user="u", metadata={"user_id": "m"})
    assert got["metadata"] == {"user_id": "m"}


def test_mistakes_have_the_words_of_every_other_upstream() -> None:
    messages = [{"role": "bot", "content": "x"}]
    with pytest.raises(BodyError) as ours:
        body(messages)
    with pytest.raises(BodyError) as theirs:
        build_messages(messages, reasoning_key=None)
    assert str(ours.value) == str(theirs.value)


def test_a_conversation_of_system_messages_alone_is_refused() -> None:
    with pytest.raises(BodyError, match="no user or assistant message"):
        body([{"role": "system", "content": "s"}])


def test_the_clients_request_is_not_touched() -> None:
    client = {
        "model": "a/c",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "s", "cache_control": {}}]},
            user("x"),
            {
                "role": "assistant",
                "content": "y",
                "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "S"}],
            },
        ],
        "tools": [TOOL],
    }
    before = copy.deepcopy(client)
    got = messages_body(client, "c")
    got["messages"][0]["content"].append({"type": "text", "text": "z"})
    got["system"][0]["text"] = "changed"
    assert client == before


def test_the_kind_builds_this_body_and_drops_what_the_provider_drops() -> None:
    class Provider:
        discover = None
        drop_params: tuple[str, ...] | None = ("temperature",)
        think_tags = None
        images = None
        api_version = None

    client = {"model": "a/c", "messages": [user("x")], "temperature": 0.5, "top_k": 3}
    got = build_upstream_body(client, kind=get_kind("anthropic"), provider=Provider(), model_id="c")
    assert got["model"] == "c" and got["top_k"] == 3 and "temperature" not in got


# ---------------------------------------------------------------------------------------------
# The stream, beyond the corpus


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n"
        for e in events
    )


START = {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {}}}
STOP = {"type": "message_stop"}


def test_unknown_events_and_deltas_are_ignored() -> None:
    dec = AnthropicStreamDecoder()
    events = dec.feed(
        sse(
            START,
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta"}},
            {"type": "some_future_event", "index": 3},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "a"},
            },
            STOP,
        )
    )
    assert events == [
        Role("assistant", "msg_1", "claude", 0),
        TextDelta("a"),
        Finish("stop"),
        Done(),
    ]
    assert dec.complete and dec.usage is None


def test_a_server_tools_input_is_not_a_tool_call() -> None:
    dec = AnthropicStreamDecoder()
    start = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    events = dec.feed(
        sse(
            START,
            {"type": "content_block_start", "index": 0, "content_block": start},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"query":"x"}'},
            },
            {"type": "content_block_stop", "index": 0},
            STOP,
        )
    )
    assert not any(isinstance(e, ToolCallStart | ToolCallDelta) for e in events)
    assert dec.tool_calls == [] and dec.finish_reason == "stop"


def test_a_tool_input_given_whole_at_the_start_is_its_arguments() -> None:
    dec = AnthropicStreamDecoder()
    block = {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}
    events = dec.feed(
        sse(
            START,
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_stop", "index": 0},
            STOP,
        )
    )
    assert ToolCallDelta(0, '{"a":1}') in events
    assert dec.finish_reason == "tool_calls"  # no stop_reason: the calls say it


@pytest.mark.parametrize(
    "raw",
    [
        b"event: content_block_delta\ndata: {not json\n\n",
        sse(
            START,
            {
                "type": "content_block_delta",
                "index": 7,
                "delta": {"type": "input_json_delta", "partial_json": "{}"},
            },
        ),
        sse(START, {"type": "content_block_start", "index": 0}),
        sse(
            START,
            {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}},
        ),
    ],
)
def test_a_broken_stream_is_a_protocol_error_and_nothing_after_it(raw: bytes) -> None:
    dec = AnthropicStreamDecoder()
    events = dec.feed(raw)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.PROTOCOL
    assert dec.feed(sse(STOP)) == [] and dec.close() == [] and not dec.complete


def test_framed_items_comments_and_the_rate() -> None:
    times = iter([1.0, 2.0])
    dec = AnthropicStreamDecoder(clock=lambda: next(times))
    assert dec.feed_item(SSEComment("hi")) == [Keepalive("hi")]
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "a"},
    }
    dec.feed_item(SSEEvent(json.dumps(START).encode()))
    dec.feed_item(
        SSEEvent(
            json.dumps(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
            ).encode()
        )
    )
    dec.feed_item(SSEEvent(json.dumps(delta).encode()))
    dec.feed_item(SSEEvent(json.dumps(delta).encode()))
    assert dec.rate.count == 2 and dec.tokens_per_second == 1.0


def test_the_stop_sequence_is_kept_apart() -> None:
    dec = AnthropicStreamDecoder()
    dec.feed(
        sse(
            START,
            {
                "type": "message_delta",
                "delta": {"stop_reason": "stop_sequence", "stop_sequence": "###"},
                "usage": {"output_tokens": 3},
            },
            STOP,
        )
    )
    assert (dec.finish_reason, dec.stop_reason, dec.stop_sequence) == (
        "stop",
        "stop_sequence",
        "###",
    )


def test_a_signature_is_an_event_of_its_own() -> None:
    dec = AnthropicStreamDecoder()
    events = dec.feed(
        sse(
            START,
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": "S"},
            },
        )
    )
    assert events[-1] == ReasoningSignature("S")
    assert dec.close()[-1].error.kind is ErrorKind.INCOMPLETE  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# The seals, Anthropic in and Anthropic out: a later turn gets back what the upstream signed


SEALED_STREAM = sse(
    START,
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "redacted_thinking", "data": "ENC"},
    },
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "thinking", "thinking": ""},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "thinking_delta", "thinking": "hm"},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "signature_delta", "signature": "SIG"},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}},
    STOP,
)
BLOCKS = [
    {"type": "redacted_thinking", "data": "ENC"},
    {"type": "thinking", "thinking": "hm", "signature": "SIG"},
]


def test_the_openai_answer_keeps_the_blocks_and_the_stream_shows_none_of_them() -> None:
    events = AnthropicStreamDecoder().feed(SEALED_STREAM)
    agg = CompletionAggregator()
    for ev in events:
        agg.add(ev)
    message = agg.completion(id="c", model="m", created=0)["choices"][0]["message"]
    assert message["thinking_blocks"] == BLOCKS
    assert message["reasoning_content"] == "hm"
    # The message sent back as it came gives the upstream the same blocks.
    again = body([user("q"), message, user("more")])
    assert again["messages"][1]["content"][:2] == BLOCKS
    encoder = ChunkEncoder(id="c", model="m", created=0)
    wire = b"".join(encoder.encode(ev) for ev in events)
    assert b"SIG" not in wire and b"ENC" not in wire


def test_the_anthropic_front_end_passes_the_seals_on_and_takes_them_back() -> None:
    events = AnthropicStreamDecoder().feed(SEALED_STREAM)
    encoder = MessageStreamEncoder(id="msg_x", model="m")
    out = [
        json.loads(line[6:])
        for line in b"".join(encoder.encode(ev) for ev in events).split(b"\n")
        if line.startswith(b"data: ")
    ]
    blocks = [o["content_block"] for o in out if o["type"] == "content_block_start"]
    assert [b["type"] for b in blocks] == ["redacted_thinking", "thinking", "text"]
    assert blocks[0]["data"] == "ENC"
    signatures = [o["delta"] for o in out if o.get("delta", {}).get("type") == "signature_delta"]
    assert signatures == [{"type": "signature_delta", "signature": "SIG"}]
    fold = MessageAggregator()
    for ev in events:
        fold.add(ev)
    content = fold.message(id="msg_x", model="m")["content"]
    assert content == [*BLOCKS, {"type": "text", "text": "ok"}]

    # The client's next turn, with the blocks echoed, comes back to the upstream signed.
    request = translate_request(
        {
            "model": "a/claude",
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": content},
                {"role": "user", "content": "more"},
            ],
        }
    )
    again = messages_body(request.chat, "claude")
    assert again["messages"][1]["content"] == [*BLOCKS, {"type": "text", "text": "ok"}]
