"""Limits and budgets over HTTP, on both backends (in-process counters and Redis): 429 with
Retry-After naming the limit, reservations settled from usage or from a count of what streamed,
and a budget running out mid-answer ending it with exactly one error frame."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from svir.wire.tokens import estimate_prompt_tokens
from tests.keys.conftest import OwnRedis
from tests.keys.support import Harness, frames
from tests.support.upstream import PROMPT_TOKENS, ScriptedServer

Make = Callable[..., Harness]


@pytest.fixture
def make(
    harness_factory: type[Harness], limits_backend: str, request: pytest.FixtureRequest
) -> Make:
    def build(**kw: object) -> Harness:
        if limits_backend == "redis":
            prefix = request.getfixturevalue("redis_prefix")
            return harness_factory(backend="redis", redis_prefix=prefix, **kw)  # type: ignore[arg-type]
        return harness_factory(**kw)  # type: ignore[arg-type]

    return build


def error_of(r: object) -> dict[str, object]:
    body = r.json()  # type: ignore[attr-defined]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


async def test_rpm_429_names_the_limit_with_retry_after(make: Make) -> None:
    h = await make().start()
    secret, _ = await h.new_key(name="ci", rpm=2)
    assert (await h.chat(secret)).status_code == 200
    assert (await h.chat(secret, stream=False)).status_code == 200
    r = await h.chat(secret)
    assert r.status_code == 429
    err = error_of(r)
    assert err["code"] == "rpm_exceeded" and err["type"] == "rate_limit_error"
    assert "requests per minute" in str(err["message"]) and "'ci'" in str(err["message"])
    assert 1 <= int(r.headers["retry-after"]) <= 120
    assert r.headers["x-svir-limit"] == "rpm"
    assert r.headers["x-ratelimit-limit-requests"] == "2"
    assert r.headers["x-request-id"]


async def test_limits_redis_gone_refuses_limited_keys_with_503(
    harness_factory: type[Harness], own_redis: OwnRedis
) -> None:
    # Fail closed: with its Redis gone, a key with limits is refused, never let through unchecked
    # (nor answered with a 500); a key without limits asks nothing of Redis and is served.
    h = await harness_factory(backend="redis", redis_url=own_redis.url).start()
    limited, _ = await h.new_key(name="limited", rpm=100)
    free, _ = await h.new_key(name="free")
    assert (await h.chat(limited)).status_code == 200
    own_redis.stop()
    for stream in (True, False):
        r = await h.chat(limited, stream=stream)
        assert r.status_code == 503, r.text
        err = error_of(r)
        assert err["code"] == "limits_unavailable" and err["type"] == "server_error"
        assert r.headers["retry-after"] == "1"
    assert (await h.chat(free)).status_code == 200
    rows = (await h.admin("GET", "/admin/usage?by=status")).json()["data"]
    assert {row["status"]: row["requests"] for row in rows} == {"ok": 2, "limits_unavailable": 2}


async def test_tpm_counts_what_was_used(make: Make, upstream: ScriptedServer) -> None:
    h = await make().start()
    secret, _ = await h.new_key(tpm=100)
    # Reserves prompt + 60, settles at 7 + 3 (the upstream's usage).
    assert (await h.chat(secret, "fake/tok-3", max_tokens=60)).status_code == 200
    await h.flush()
    view = (await h.chat_usage(secret))["limits"]["tpm"]
    assert view["used"] == PROMPT_TOKENS + 3
    r = await h.chat(secret, "fake/tok-3", max_tokens=95)
    assert r.status_code == 429
    assert error_of(r)["code"] == "tpm_exceeded"
    assert r.headers["x-svir-limit"] == "tpm"


async def test_concurrent_requests(make: Make) -> None:
    h = await make().start()
    secret, _ = await h.new_key(concurrent=2)
    results = await asyncio.gather(*(h.chat(secret, "fake/tok-15-slow") for _ in range(4)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 200, 429, 429]
    refused = [r for r in results if r.status_code == 429]
    assert error_of(refused[0])["code"] == "concurrent_exceeded"
    await h.flush()
    # The slots came back.
    assert (await h.chat(secret)).status_code == 200


@pytest.mark.parametrize("upstream_model", ["fake/tok-50", "fake/tok-50-slow", "fake/tok-50-split"])
async def test_budget_cut_mid_answer_is_one_error_frame(
    make: Make, upstream: ScriptedServer, upstream_model: str
) -> None:
    # "-split" sends the role alone, then the whole answer at once: svir reads ahead while priming,
    # and the cut must be counted on the batches the client sees, not on what was read.
    h = await make().start()
    budget = 30
    secret, _ = await h.new_key(name="small", tokens_per_day=budget)
    # No max_tokens: reserves the prompt estimate + 64 (more than the budget): starts with what
    # is left, and is cut when the answer passes it.
    r = await h.chat(secret, upstream_model)
    assert r.status_code == 200
    got = frames(r.content)
    assert got[-1] != "[DONE]" and "[DONE]" not in got
    errors = [f for f in got if isinstance(f, dict) and "error" in f]
    assert len(errors) == 1 and got[-1] is errors[0]
    err = errors[0]["error"]
    assert err["code"] == "tokens_per_day_exceeded" and err["type"] == "insufficient_quota"
    assert "cut" in err["message"]
    delivered = sum(
        1
        for f in got[:-1]
        if isinstance(f, dict) and (f["choices"] or [{}])[0].get("delta", {}).get("content")
    )
    await h.flush()
    view = await h.chat_usage(secret)
    used = view["limits"]["tokens_per_day"]["used"]
    assert used <= budget
    assert delivered >= 1 and used == view["totals"]["total_tokens"], (got, view)
    assert view["totals"]["completion_tokens"] == delivered
    # Nothing is left: the next call is refused before it starts, until midnight UTC.
    r = await h.chat(secret)
    assert r.status_code == 429
    assert error_of(r)["code"] == "tokens_per_day_exceeded"
    assert int(r.headers["retry-after"]) <= 86400


@pytest.mark.parametrize("upstream_model", ["fake/tok-20", "fake/tok-20-split"])
async def test_an_answer_cut_near_its_end_is_an_error_in_the_ledger(
    make: Make, upstream_model: str
) -> None:
    # The budget holds all but the last 3 tokens: svir has read the whole answer, finish and
    # usage included, by the time it cuts it; what the client got is still an error, and the
    # ledger and metrics must say so (not "ok" because the upstream completed).
    h = await make().start()
    estimate = estimate_prompt_tokens({"messages": [{"role": "user", "content": "hi"}]})
    secret, _ = await h.new_key(tokens_per_day=estimate + 17)
    r = await h.chat(secret, upstream_model)
    got = frames(r.content)
    assert got[-1]["error"]["code"] == "tokens_per_day_exceeded", got
    assert "cut after 17 tokens" in got[-1]["error"]["message"]
    await h.flush()
    view = await h.chat_usage(secret)
    assert view["totals"]["requests"] == 1 and view["totals"]["errors"] == 1, view
    rows = (await h.admin("GET", "/admin/usage?by=status")).json()["data"]
    assert [row["status"] for row in rows] == ["tokens_per_day_exceeded"], rows


async def test_budget_cut_in_a_non_streamed_answer(make: Make) -> None:
    h = await make().start()
    secret, _ = await h.new_key(tokens_per_day=25)
    r = await h.chat(secret, "fake/tok-50", stream=False)
    assert r.status_code == 429
    assert error_of(r)["code"] == "tokens_per_day_exceeded"
    assert "retry-after" in r.headers


async def test_answer_within_the_reservation_settles_from_usage(make: Make) -> None:
    h = await make().start()
    secret, _ = await h.new_key(tokens_per_month=1000)
    r = await h.chat(secret, "fake/tok-5", max_tokens=500)
    assert r.status_code == 200 and frames(r.content)[-1] == "[DONE]"
    await h.flush()
    view = await h.chat_usage(secret)
    assert view["limits"]["tokens_per_month"]["used"] == PROMPT_TOKENS + 5
    assert view["totals"]["prompt_tokens"] == PROMPT_TOKENS


async def test_without_usage_svir_counts_what_streamed(make: Make) -> None:
    h = await make().start()
    secret, _ = await h.new_key(tokens_per_day=10_000)
    r = await h.chat(secret, "fake/tok-9-nousage", max_tokens=100)
    assert r.status_code == 200
    await h.flush()
    view = await h.chat_usage(secret)
    totals = view["totals"]
    assert totals["completion_tokens"] == 9 and totals["counted"] == 1
    estimate = totals["prompt_tokens"]
    assert 1 <= estimate < 20
    assert view["limits"]["tokens_per_day"]["used"] == estimate + 9


async def test_cost_budget_from_prices(make: Make) -> None:
    prices = """
[[prices]]
model = "fake/"
input = 1000.0
output = 2000.0
"""
    h = await make(extra=prices).start()
    # $0.05 a day: the prompt (7 tokens, $0.007) and 21 tokens of answer ($0.042) fit.
    secret, _ = await h.new_key(cost_per_day=0.05)
    r = await h.chat(secret, "fake/tok-3", max_tokens=10)
    assert r.status_code == 200
    await h.flush()
    view = await h.chat_usage(secret)
    spent = view["limits"]["cost_per_day"]["used_usd"]
    assert spent == pytest.approx((PROMPT_TOKENS * 1000 + 3 * 2000) / 1e6)
    assert view["totals"]["cost_usd"] == pytest.approx(spent)
    r = await h.chat(secret, "fake/tok-60")
    assert r.status_code == 200
    last = frames(r.content)[-1]
    assert last["error"]["code"] == "cost_per_day_exceeded"
    # A model without a price is not held by a cost budget.
    assert (await h.chat(secret, "other/tok-2")).status_code == 200


async def test_limits_apply_to_the_ollama_api(make: Make) -> None:
    h = await make(fronts=("ollama",)).start()
    secret, _ = await h.new_key(rpm=1, models=["fake/"])
    assert h.http is not None
    headers = {"Authorization": f"Bearer {secret}"}
    body = {"model": "fake/tok-2", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = await h.http.post("/api/chat", json=body, headers=headers)
    assert r.status_code == 200, r.text
    r = await h.http.post("/api/chat", json=body, headers=headers)
    assert r.status_code == 429
    assert "requests per minute" in r.json()["error"]
    assert "retry-after" in r.headers
    r = await h.http.post("/api/chat", json={**body, "model": "other/tok-2"}, headers=headers)
    assert r.status_code == 403
    assert (await h.http.post("/api/chat", json=body)).status_code == 401


async def test_ollama_stream_cut_by_a_budget(make: Make) -> None:
    import json

    h = await make(fronts=("ollama",)).start()
    secret, _ = await h.new_key(tokens_per_day=20)
    assert h.http is not None
    body = {"model": "fake/tok-40-slow", "messages": [{"role": "user", "content": "hi"}]}
    r = await h.http.post("/api/chat", json=body, headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert "error" in lines[-1] and "cut" in lines[-1]["error"]
    assert not any(line.get("done") for line in lines)


async def test_limits_apply_to_thread_continuations(make: Make) -> None:
    h = await make(fronts=("threads",)).start()
    secret, _ = await h.new_key(rpm=1, tokens_per_day=40)
    assert h.http is not None
    auth = {"Authorization": f"Bearer {secret}"}
    r = await h.http.post("/v1/threads", json={"model": "fake/tok-60"}, headers=auth)
    assert r.status_code in (200, 201), r.text
    thread = r.json()["id"]
    r = await h.http.post(
        f"/v1/threads/{thread}/messages", json={"role": "user", "content": "hi"}, headers=auth
    )
    assert r.status_code in (200, 201), r.text
    r = await h.http.post(f"/v1/threads/{thread}/continue", json={"stream": True}, headers=auth)
    assert r.status_code == 200
    got = frames(r.content)
    assert got[-1]["type"] == "error"
    assert "cut" in got[-1]["error"]["message"]
    assert got[-1]["error"]["code"] == "tokens_per_day_exceeded"
    assert any(f["type"] == "delta" for f in got[:-1])
    # Nothing was appended (the answer was cut), and the next continuation is over the rpm.
    r = await h.http.post(f"/v1/threads/{thread}/continue", json={"stream": True}, headers=auth)
    assert r.status_code == 429
    assert r.json()["error"]["code"] in ("rpm_exceeded", "tokens_per_day_exceeded")
    assert "retry-after" in r.headers
