"""The Responses front end through the whole app in process (tests/support/inprocess.py),
driven by the OpenAI Python SDK's `client.responses`: created streamed and not, the `stream`
helper with a function call, `parse` with a pydantic model, `previous_response_id` chains,
retrieval, deletion and input items, another key's response, and errors as the SDK's classes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from tests.responses.support import ANSWER, ARGUMENTS, CONFIG, TOOL, Upstream
from tests.support.inprocess import InProcess, serve

WEATHER_TOOL = {
    "type": "function",
    "name": TOOL,
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
async def svir(tmp_path: Path) -> AsyncIterator[tuple[InProcess, Upstream]]:
    upstream = Upstream()
    async with serve(tmp_path, CONFIG, upstream) as app:
        yield app, upstream


async def test_create_not_streamed_answers_the_response_object(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, upstream = svir
    response = await app.client.responses.create(
        model="up/ok", input="Say hello", instructions="Be brief."
    )
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "up/ok"
    assert response.output_text == "hello world"
    [sent] = upstream.bodies()
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["messages"][-1]["role"] == "user"


async def test_create_streamed_has_the_event_order_and_ends_completed(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, _ = svir
    stream = await app.client.responses.create(model="up/ok", input="hi", stream=True)
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "hello world"
    assert events[-1].response.output_text == "hello world"  # type: ignore[union-attr]


async def test_the_stream_helper_with_a_function_call_and_its_final_response(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, upstream = svir
    async with app.client.responses.stream(
        model="up/agent", input="Weather in Paris?", tools=[WEATHER_TOOL]
    ) as stream:
        names = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in names
    assert names[-1] == "response.completed"
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == TOOL and json.loads(call.arguments) == ARGUMENTS
    assert call.call_id and call.id
    [sent] = upstream.bodies()
    assert sent["tools"][0]["function"]["name"] == TOOL
    # The call's result sent back as items (no stored state): the agent's final answer.
    second = await app.client.responses.create(
        model="up/agent",
        store=False,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
    )
    assert second.output_text == "The file says: sunny, 21 C"
    tool_message = upstream.bodies()[-1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == call.call_id
    with pytest.raises(openai.NotFoundError):
        await app.client.responses.retrieve(second.id)  # store: false wrote nothing


class Weather(pydantic.BaseModel):
    city: str
    temperature: int


async def test_parse_with_a_pydantic_model(svir: tuple[InProcess, Upstream]) -> None:
    app, upstream = svir
    parsed = await app.client.responses.parse(
        model="up/structured", input="Weather as JSON", text_format=Weather
    )
    assert parsed.output_parsed == Weather(**ANSWER)
    [sent] = upstream.bodies()
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["properties"]["city"]


async def test_previous_response_id_chains_are_usable_at_once(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, upstream = svir
    first = await app.client.responses.create(model="up/ok", input="one")
    # Streamed: read to its end, and the next request names it straight away.
    stream = await app.client.responses.create(
        model="up/ok", input="two", previous_response_id=first.id, stream=True
    )
    second = [e async for e in stream][-1].response  # type: ignore[union-attr]
    third = await app.client.responses.create(
        model="up/ok", input="three", previous_response_id=second.id
    )
    assert third.previous_response_id == second.id
    messages = upstream.bodies()[-1]["messages"]
    said = [(m["role"], m["content"]) for m in messages]
    assert said == [
        ("user", "one"),
        ("assistant", "hello world"),
        ("user", "two"),
        ("assistant", "hello world"),
        ("user", "three"),
    ]


async def test_retrieve_delete_and_input_items(svir: tuple[InProcess, Upstream]) -> None:
    app, _ = svir
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"part {i}"}],
        }
        for i in range(5)
    ]
    made = await app.client.responses.create(model="up/ok", input=items)  # type: ignore[arg-type]
    got = await app.client.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == "hello world"
    listed = await app.client.responses.input_items.list(made.id)
    texts = [item.content[0].text for item in listed.data]  # type: ignore[union-attr]
    assert texts == [f"part {i}" for i in reversed(range(5))]  # newest first by default
    page = await app.client.responses.input_items.list(made.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["part 0", "part 1"]  # type: ignore[union-attr]
    assert page.has_more
    rest = await app.client.responses.input_items.list(made.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["part 2", "part 3", "part 4"]  # type: ignore[union-attr]
    assert not rest.has_more
    every = [item async for item in app.client.responses.input_items.list(made.id, limit=2)]
    assert len(every) == 5  # the SDK's auto-paging follows `after`
    await app.client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await app.client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await app.client.responses.delete(made.id)
    # A string input is listed as the user message item it stands for.
    said = await app.client.responses.create(model="up/ok", input="just this")
    [item] = (await app.client.responses.input_items.list(said.id)).data
    assert item.type == "message" and item.role == "user" and item.id  # type: ignore[union-attr]
    assert item.content[0].text == "just this"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as bad:
        await app.client.responses.input_items.list(said.id, after="msg_nothing")
    assert bad.value.param == "after"  # type: ignore[attr-defined]


async def test_another_keys_response_is_not_found(svir: tuple[InProcess, Upstream]) -> None:
    app, _ = svir
    made = await app.client.responses.create(model="up/ok", input="mine")
    other = app.openai(api_key="someone-else")
    for attempt in (
        other.responses.retrieve(made.id),
        other.responses.delete(made.id),
        other.responses.input_items.list(made.id),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt
    with pytest.raises(openai.NotFoundError) as raised:
        await other.responses.create(model="up/ok", input="x", previous_response_id=made.id)
    assert raised.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert (await app.client.responses.retrieve(made.id)).id == made.id  # still there


async def test_errors_are_the_sdks_classes(svir: tuple[InProcess, Upstream]) -> None:
    app, _ = svir
    client = app.client
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="up/ok", input=[{"type": "bogus"}])  # type: ignore[list-item]
    assert bad.value.param and bad.value.param.startswith("input")  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="up/ok", input=42)  # type: ignore[arg-type]
    assert bad.value.param == "input"  # type: ignore[attr-defined]
    with pytest.raises(openai.RateLimitError) as limited:
        await client.responses.create(model="up/limited", input="hi")
    assert limited.value.response.headers.get("retry-after") == "2"
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="up/missing", input="hi", stream=True)
    with pytest.raises(openai.BadRequestError) as overflow:
        await client.responses.create(model="up/overflow", input="hi")
    assert overflow.value.code == "context_length_exceeded"  # type: ignore[attr-defined]


async def test_a_stream_that_fails_after_its_start_ends_with_response_failed(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, _ = svir
    for model in ("up/crash-late", "up/reset-late"):
        stream = await app.client.responses.create(model=model, input="hi", stream=True)
        events = [e async for e in stream]
        assert events[0].type == "response.created"
        assert events[-1].type == "response.failed"
        assert [e.type for e in events].count("response.failed") == 1
        assert events[-1].response.error is not None  # type: ignore[union-attr]


async def test_sealed_reasoning_comes_back_and_a_tampered_token_is_not_trusted(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, upstream = svir
    first = await app.client.responses.create(
        model="up/lmstudio-reasoning",
        input="hi",
        store=False,
        include=["reasoning.encrypted_content"],
    )
    [reasoning] = [i for i in first.output if i.type == "reasoning"]
    token = reasoning.encrypted_content
    assert token and "Paris" not in token  # opaque
    thought = reasoning.content[0].text  # type: ignore[index]

    async def sent_back(token: str) -> tuple[str | None, dict[str, Any]]:
        # As Codex sends it back: the token only, no text of its own.
        item = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": token}
        raw = await app.client.responses.with_raw_response.create(
            model="up/ok",
            store=False,
            input=[  # type: ignore[list-item]
                {"role": "user", "content": "hi"},
                item,
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "and then?"},
            ],
        )
        return raw.headers.get("x-svir-warning"), upstream.bodies()[-1]["messages"][1]

    warning, assistant = await sent_back(token)
    assert warning is None and assistant["reasoning_content"] == thought
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    warning, assistant = await sent_back(tampered)
    assert "reasoning_content" not in assistant
    assert warning is not None and "encrypted_content ignored" in warning


async def test_a_tool_svir_cannot_serve_is_dropped_with_a_warning(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, upstream = svir
    raw = await app.client.responses.with_raw_response.create(
        model="up/ok", input="hi", tools=[{"type": "web_search"}, WEATHER_TOOL]
    )
    assert "web_search" in (raw.headers.get("x-svir-warning") or "")
    assert raw.parse().status == "completed"
    assert [t["function"]["name"] for t in upstream.bodies()[-1]["tools"]] == [TOOL]


async def test_a_prompt_cache_key_keeps_one_conversation_on_one_deployment(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, _ = svir

    async def served(key: str) -> str:
        raw = await app.client.responses.with_raw_response.create(
            model="pair", input="hi", prompt_cache_key=key, store=False
        )
        return raw.headers["x-svir-served-model"]

    for key in ("conversation-a", "conversation-b", "conversation-c"):
        assert len({await served(key) for _ in range(6)}) == 1
    # Different conversations spread over both deployments.
    assert {await served(f"conversation-{i}") for i in range(24)} == {"up/ok", "up2/ok"}


async def test_the_translations_warnings_and_the_upstreams_are_both_said(
    svir: tuple[InProcess, Upstream],
) -> None:
    app, _ = svir
    raw = await app.client.responses.with_raw_response.create(
        model="up/effort", input="hi", tools=[{"type": "web_search"}], reasoning={"effort": "high"}
    )
    warning = raw.headers.get("x-svir-warning") or ""
    assert "web_search" in warning and "reasoning_effort" in warning, warning
    assert raw.parse().status == "completed"
