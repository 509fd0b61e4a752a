"""Small pieces: the prompt estimate, what a call asks of its key's limits, model patterns, CLI
spellings, prices, addresses, the metrics text, and trimming a batch at a cut."""

from __future__ import annotations

import datetime

import pytest

from svir.call import EMBEDDINGS, CallContext
from svir.chat import _first_visible
from svir.config.model import LimitsConfig, PriceConfig
from svir.edges.metrics import Counter, Histogram, Registry
from svir.keys.limits import Ask, Limits
from svir.keys.model import (
    hash_secret,
    model_allowed,
    new_secret,
    parse_budget,
    parse_duration,
    parse_expiry,
)
from svir.policy.auth import is_loopback
from svir.policy.key_gate import Gate, Price, completion_allowance
from svir.wire.events import Finish, Role, TextDelta, ToolCallDelta, ToolCallStart
from svir.wire.tokens import estimate_input_tokens, estimate_prompt_tokens


def test_prompt_estimate() -> None:
    short = estimate_prompt_tokens({"messages": [{"role": "user", "content": "hi"}]})
    assert 4 <= short <= 10
    long = estimate_prompt_tokens({"messages": [{"role": "user", "content": "word " * 400}]})
    assert 480 <= long <= 520  # 2,000 characters: about 500 tokens
    cjk = estimate_prompt_tokens({"messages": [{"role": "user", "content": "漢" * 100}]})
    assert cjk >= 100
    image = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ]
    }
    assert estimate_prompt_tokens(image) > 1000
    tools = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f" * 400}}],
    }
    assert estimate_prompt_tokens(tools) > 100
    assert completion_allowance({"max_tokens": 50}, 1024) == 50
    assert completion_allowance({"max_completion_tokens": 70, "max_tokens": 50}, 1024) == 70
    assert completion_allowance({"max_tokens": True}, 1024) == 1024


def test_what_a_call_asks_of_its_key_limits() -> None:
    # 1 and 2 USD per million tokens: 1 and 2 micro-USD a token.
    price = PriceConfig(model="lab/", input=1.0, output=2.0)
    gate = Gate(backend=None, limits=LimitsConfig(default_completion_tokens=100), prices=(price,))
    chat = CallContext(request_id="r", api="openai")
    request = {"model": "lab/m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    prompt = estimate_prompt_tokens(request)
    # Only the request is counted: no estimate made.
    assert gate.ask(chat, request, Limits(rpm=5), "lab/m") == (Ask(tokens=1, floor=1), None)
    tokens = Ask(tokens=prompt + 50, floor=prompt + 1)
    assert gate.ask(chat, request, Limits(tpm=1000), "lab/m") == (tokens, prompt)
    unbounded = {"model": "lab/m", "messages": request["messages"]}
    assert gate.ask(chat, unbounded, Limits(tpm=1000), "lab/m")[0].tokens == prompt + 100
    costed = Ask(tokens=prompt + 50, floor=prompt + 1, cost=prompt + 100, cost_floor=prompt + 2)
    assert gate.ask(chat, request, Limits(cost_per_day=10**6), "lab/m") == (costed, prompt)
    # A cost budget and a model without a price: only the request is counted.
    unpriced = gate.ask(chat, request, Limits(cost_per_day=10**6), "other/m")
    assert unpriced == (Ask(tokens=1, floor=1), None)
    # Embeddings generate nothing: their inputs' tokens, no answer allowance.
    embed = CallContext(request_id="r", api="openai", operation=EMBEDDINGS)
    inputs = {"model": "lab/e", "input": ["one two three", "four"], "max_tokens": 50}
    counted = estimate_input_tokens(inputs["input"])
    assert gate.ask(embed, inputs, Limits(tpm=1000), "lab/e") == (
        Ask(tokens=counted, floor=counted),
        counted,
    )


def test_model_patterns() -> None:
    assert model_allowed(None, "anything/at-all")
    assert model_allowed(("openai/",), "openai/gpt-5")
    assert not model_allowed(("openai/",), "openai-compat/x")
    assert model_allowed(("lab/gemma*",), "lab/gemma-3")
    assert not model_allowed(("lab/gemma",), "lab/gemma-3")
    assert model_allowed(("smart",), "smart")
    assert model_allowed(("*",), "x/y")


def test_secrets_are_random_and_hashed() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("sk-svir-") and len(a) == 8 + 43
    assert len(hash_secret(a)) == 64 and hash_secret(a) != hash_secret(b)


def test_spellings() -> None:
    assert parse_duration("90") == 90 and parse_duration("15m") == 900
    assert parse_duration("2w") == 14 * 86400
    assert parse_budget("100000/day") == (100000, "day")
    assert parse_budget("2_000_000/month") == (2_000_000, "month")
    assert parse_budget("$5.50/day") == (5.5, "day")
    with pytest.raises(ValueError, match="not a budget"):
        parse_budget("lots")
    assert parse_expiry("1h", now=1000) == 4600
    expected = datetime.datetime(2030, 12, 31, tzinfo=datetime.UTC).timestamp()
    assert parse_expiry("2030-12-31") == expected
    with pytest.raises(ValueError, match="neither a duration"):
        parse_expiry("soon")


def test_price() -> None:
    price = Price(PriceConfig(model="m", input=0.25, output=2.0, cached_input=0.025))
    # micro-USD: 1000 prompt tokens (400 cached) and 100 answer tokens.
    assert price.cost(1000, 100, cached=400) == 600 * 0.25 + 400 * 0.025 + 200
    assert price.cost(1, 0) == 1  # rounded up


def test_loopback() -> None:
    for host in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com", "192.168.1.1", None):
        assert not is_loopback(host), host


def test_exposition_escapes_and_orders() -> None:
    r = Registry()
    c = r.add(Counter("x_total", "X.", ("label",)))
    c.inc(('a"b\\c\nd',), 2)
    h = r.add(Histogram("y_seconds", "Y.", (), (0.1, 1.0)))
    h.observe((), 0.05)
    h.observe((), 0.5)
    h.observe((), 5)
    text = r.render().decode()
    assert 'x_total{label="a\\"b\\\\c\\nd"} 2' in text
    assert 'y_seconds_bucket{le="0.1"} 1' in text
    assert 'y_seconds_bucket{le="1"} 2' in text
    assert 'y_seconds_bucket{le="+Inf"} 3' in text
    assert "y_seconds_count 3" in text and "y_seconds_sum 5.55" in text


def test_trimming_a_batch_at_a_cut() -> None:
    role = Role("assistant", "i", "m", 0)
    events = [role, TextDelta("a"), TextDelta("b"), TextDelta("c"), Finish("stop")]
    assert _first_visible(events, 0) == [role]
    assert _first_visible(events, 2) == [role, TextDelta("a"), TextDelta("b")]
    assert _first_visible(events, 9) == events
    calls = [ToolCallStart(0, "c1", "f"), ToolCallDelta(0, "{}")]
    assert _first_visible(calls, 1) == [calls[0]]
