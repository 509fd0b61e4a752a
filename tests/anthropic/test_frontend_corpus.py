"""Every upstream behaviour of the conformance corpus reaches an Anthropic client through the whole
app: each recorded stream (tests/conformance/decoder/*.sse) is the answer of the mock upstream,
and what the official SDK assembles from svir's `/v1/messages` stream (text, reasoning, tool
calls, stop reason, usage) is what the corpus expects; a stream that fails is an error the SDK
raises, with what came before it assembled."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from svir.config.load import parse_config
from svir.server import build_app
from tests.anthropic.sdk import check_as_expected
from tests.support.asgi import Lifespan
from tests.support.mock_transport import MockRequest, MockResponse, MockTransport

CORPUS = Path(__file__).parents[1] / "conformance" / "decoder"
CASES = sorted(p.stem for p in CORPUS.glob("*.sse"))


def provider(name: str, think_tags: bool) -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "openai-compatible"\n'
        f'base_url = "http://upstream.test/v1"\ndiscover = false\n'
        f"think_tags = {str(think_tags).lower()}\n[providers.retry]\nattempts = 1\n"
    )


def play(request: MockRequest) -> MockResponse:
    name = request.json()["model"]
    return MockResponse(body=(CORPUS / f"{name}.sse").read_bytes())


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[anthropic.AsyncAnthropic]:

    text = provider("tags", True) + provider("plain", False)
    text += f'\n[store]\nurl = "sqlite:///{tmp_path / "svir.db"}"\n'
    app = build_app(parse_config(text), {}, transport=MockTransport(play))
    lifespan = Lifespan(app)
    await lifespan.start()
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), timeout=20)
    try:
        yield anthropic.AsyncAnthropic(
            api_key="x", base_url="http://svir", max_retries=0, http_client=http
        )
    finally:
        await http.aclose()
        await lifespan.stop()


async def streamed(
    client: anthropic.AsyncAnthropic, model: str, tools: list[Any]
) -> tuple[Any, Exception | None]:
    """The final message, or the error raised with the snapshot assembled until then."""
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    messages: Any = [{"role": "user", "content": "hi"}]
    try:
        async with client.messages.stream(
            model=model, max_tokens=64, messages=messages, **extra
        ) as s:
            try:
                async for _ in s:
                    pass
                return await s.get_final_message(), None
            except anthropic.APIStatusError as exc:
                snapshot = s._AsyncMessageStream__final_message_snapshot  # type: ignore[attr-defined]
                return snapshot, exc
    except anthropic.APIStatusError as exc:  # an HTTP error: the failure came before any output
        return None, exc


@pytest.mark.parametrize("name", CASES)
async def test_corpus_stream_through_svir_to_the_sdk(
    client: anthropic.AsyncAnthropic, name: str
) -> None:
    spec = json.loads((CORPUS / f"{name}.json").read_text())
    expect, options = spec["expect"], spec["options"]
    model = ("tags/" if options["think_tags"] else "plain/") + name
    tools = [
        {"name": tool, "input_schema": {"type": "object"}} for tool in options["tool_names"] or ()
    ]
    message, error = await streamed(client, model, tools)
    check_as_expected(expect, message, error)
