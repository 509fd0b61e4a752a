"""The console's data of this process and of the ledger: the live feed (SSE), the per-second
stats, the request history with its filters, a request's page, through the whole app in process
driven by the openai SDK over the scripted upstream."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import openai
import pytest

from svir.call import CallContext, CallRecord
from svir.console import observe_api
from svir.console.observe import Observer, sse_frame
from svir.observers import CallSettled
from tests.console.observe_support import ADMIN, UP_KEY, Feed, Svir
from tests.support.upstream import PROMPT_TOKENS
from tests.support.waiting import eventually


async def test_a_request_appears_in_the_feed_started_then_finished_with_its_tokens(
    tmp_path: Path,
) -> None:
    async with Svir(tmp_path) as svir:
        feed = Feed(svir.app)
        await feed.start()
        try:
            rid = await svir.chat("up/tok-5")
            await eventually(
                lambda: any(d["id"] == rid for d in feed.named("request.finished")),
                "request.finished",
            )
            events = [(n, d) for n, d in feed.events() if d.get("id") == rid]
            names = [n for n, _ in events]
            assert names[0] == "request.started"
            assert names[-1] == "request.finished"
            started = events[0][1]
            assert started["model"] == "up/tok-5"
            assert started["api"] == "openai"
            assert started["stream"] is True
            finished = events[-1][1]
            assert finished["status"] == "ok"
            assert finished["served_model"] == "up/tok-5"
            assert finished["provider"] == "up"
            assert finished["prompt_tokens"] == PROMPT_TOKENS
            assert finished["completion_tokens"] == 5
            assert finished["latency_ms"] >= finished["ttft_ms"] >= 0
            # The stats event comes once a second while the page is open.
            await eventually(lambda: bool(feed.named("stats")), "a stats event")
            point = feed.named("stats")[0]
            assert set(point) == {
                "t",
                "requests",
                "errors",
                "tokens_in",
                "tokens_out",
                "streams_open",
            }
        finally:
            await feed.close()
        # The client went away: the feed ended and nobody subscribes any more.
        assert svir.console.observer.subscribers == set()


async def test_a_slow_stream_shows_its_progress_in_the_feed(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        svir.upstream.slow_delay = 0.05
        feed = Feed(svir.app)
        await feed.start()
        try:
            rid = await svir.chat("up/tok-30-slow")
            await eventually(
                lambda: any(d["id"] == rid for d in feed.named("request.finished")), "finished"
            )
            progress = [
                d["completion_tokens"] for d in feed.named("request.progress") if d["id"] == rid
            ]
            assert progress, "no request.progress for a stream of 1.5 s"
            assert progress == sorted(progress) and len(set(progress)) == len(progress)
            assert progress[-1] <= 30
        finally:
            await feed.close()


async def test_stats_points_count_the_requests_tokens_and_errors(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        for _ in range(3):
            await svir.chat("up/tok-5")
        await svir.chat("up/tok-2", stream=False)
        with pytest.raises(openai.NotFoundError):
            await svir.chat("nowhere/tok-2")
        answer = await svir.admin("/admin/stats", minutes="2")
        assert answer.status_code == 200
        body = answer.json()
        assert body["pid"] == os.getpid()
        assert body["interval_seconds"] == 1
        points = body["points"]
        assert len(points) == 120
        assert [p["t"] for p in points] == list(range(points[0]["t"], points[0]["t"] + 120))
        assert sum(p["requests"] for p in points) == 5
        assert sum(p["tokens_out"] for p in points) == 3 * 5 + 2
        assert sum(p["tokens_in"] for p in points) == 4 * PROMPT_TOKENS
        models = body["models"]
        assert models["up/tok-5"]["requests"] == 3
        assert models["up/tok-5"]["latency_ms_p50"] is not None
        assert models["up/tok-5"]["ttft_ms_p50"] is not None
        assert models["up/tok-2"]["requests"] == 1
        assert "nowhere/tok-2" not in models  # nothing served it
        with pytest.raises(openai.InternalServerError):  # every attempt fails
            await svir.chat("alt/always-503")
        points = (await svir.admin("/admin/stats", minutes="2")).json()["points"]
        errors: dict[str, int] = {}
        for p in points:
            for name, n in p["errors"].items():
                errors[name] = errors.get(name, 0) + n
        assert errors == {"model_not_found": 1, "transient": 1}


async def test_two_apps_in_one_process_each_have_their_own_console(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with Svir(tmp_path / "a") as one, Svir(tmp_path / "b") as other:
        assert one.console is not other.console
        await one.chat("up/tok-5")
        stats = [(await svir.admin("/admin/stats", minutes="1")).json() for svir in (one, other)]
        assert [sum(p["requests"] for p in s["points"]) for s in stats] == [1, 0]


async def test_stats_refuse_a_bad_window(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        for value in ("0", "-1", "16", "nan", "soon"):
            answer = await svir.admin("/admin/stats", minutes=value)
            assert answer.status_code == 400, value
            assert answer.json()["error"]["param"] == "minutes"


async def test_the_history_filters_and_pages(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        first = await svir.chat("up/tok-3")
        second = await svir.chat("alt/tok-2", stream=False)
        # A key: from now on the requests carry it.
        made = await svir.http.post(
            "/admin/keys", json={"name": "console"}, headers={"authorization": f"Bearer {ADMIN}"}
        )
        assert made.status_code == 201
        key = made.json()
        client = svir.openai(key["key"])
        third = (
            await client.chat.completions.with_raw_response.create(
                model="up/tok-3", messages=[{"role": "user", "content": "hi"}]
            )
        ).headers["x-request-id"]

        async def ids(**params: str) -> list[str]:
            answer = await svir.admin("/admin/requests", **params)
            assert answer.status_code == 200, answer.text
            return [row["request_id"] for row in answer.json()["data"]]

        assert await ids() == [third, second, first]
        assert await ids(key=key["id"]) == [third]
        assert await ids(key="none") == [second, first]
        assert await ids(model="alt/tok-2") == [second]
        assert await ids(provider="alt") == [second]
        assert await ids(provider="up", key="none") == [first]
        assert await ids(api="openai") == [third, second, first]
        assert await ids(status="ok") == [third, second, first]
        assert await ids(status="transient") == []
        assert await ids(since="2999-01-01") == []
        assert await ids(until="2000-01-01") == []
        assert await ids(since="1h") == [third, second, first]
        # One at a time, by the cursor.
        seen = []
        cursor: str | None = None
        while True:
            params = {"limit": "1"} | ({"before": cursor} if cursor else {})
            page = (await svir.admin("/admin/requests", **params)).json()
            seen += [row["request_id"] for row in page["data"]]
            if page["next"] is None:
                break
            cursor = str(page["next"])
        assert seen == [third, second, first]
        row = (await svir.admin("/admin/requests", limit="1")).json()["data"][0]
        assert row["model"] == "up/tok-3" and row["key_id"] == key["id"]
        assert row["completion_tokens"] == 3 and row["status"] == "ok"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"before": "-3"}, "before"),
        ({"before": str(2**64)}, "before"),
        ({"since": "yesterday-ish"}, "since"),
        ({"until": "inf"}, "until"),
        ({"model": "m" * 300}, "model"),
        ({"key": "a\x00b"}, "key"),
    ],
)
async def test_the_history_refuses_bad_parameters(
    tmp_path: Path, params: dict[str, str], param: str
) -> None:
    async with Svir(tmp_path) as svir:
        answer = await svir.admin("/admin/requests", **params)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"


async def test_a_request_page_shows_each_retry_and_why(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        rid = await svir.chat("up/flaky-2")
        answer = await svir.admin(f"/admin/requests/{rid}")
        assert answer.status_code == 200
        body = answer.json()
        assert body["request_id"] == rid
        assert [r["status"] for r in body["rows"]] == ["ok"]
        live = body["live"]
        attempts = live["attempts"]
        assert [a["model"] for a in attempts] == ["up/flaky-2"] * 3
        assert [a["outcome"] for a in attempts] == ["transient", "transient", "ok"]
        assert attempts[0]["why"] == "retried after transient"
        assert "overloaded" in attempts[0]["error"]
        assert attempts[-1]["why"] is None and attempts[-1]["error"] is None
        t = live["timings"]
        assert t["total_ms"] >= t["first_token_ms"] >= t["first_byte_ms"] >= t["queue_ms"] >= 0
        assert live["usage"]["completion_tokens"] == 2
        assert live["error"] is None
        assert body["capture"] is None  # capture is off


async def test_a_request_page_shows_the_fallback(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        rid = await svir.chat("up/always-503")
        body = (await svir.admin(f"/admin/requests/{rid}")).json()
        attempts = body["live"]["attempts"]
        assert [a["model"] for a in attempts] == ["up/always-503"] * 3 + ["alt/ok"]
        assert [a["why"] for a in attempts] == [
            "retried after transient",
            "retried after transient",
            "fell back to alt/ok after transient",
            None,
        ]
        assert attempts[-1]["provider"] == "alt" and attempts[-1]["outcome"] == "ok"
        assert body["rows"][0]["served_model"] == "alt/ok"


async def test_a_failed_request_page_names_the_error(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        with pytest.raises(openai.InternalServerError):
            await svir.chat("alt/always-503")
        rid = (await svir.admin("/admin/requests")).json()["data"][0]["request_id"]
        live = (await svir.admin(f"/admin/requests/{rid}")).json()["live"]
        assert live["attempts"][0]["outcome"] == "transient"
        assert "down" in live["error"]
        assert (await svir.admin("/admin/requests/no-such-request")).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/admin/events",
        "/admin/stats",
        "/admin/requests",
        "/admin/requests/x",
        "/admin/requests/x/conformance",
    ],
)
async def test_every_route_takes_the_admin_key(tmp_path: Path, path: str) -> None:
    async with Svir(tmp_path) as svir:
        answer = await svir.http.get(path, headers={"authorization": "Bearer not-the-key"})
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_admin_key"
        assert (await svir.http.get(path)).status_code == 401


async def test_a_slow_page_holds_no_more_than_its_queue(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        observer = svir.console.observer
        gate = asyncio.Event()
        feed = Feed(svir.app, gate=gate)  # reads the first frame, then stalls
        await feed.start()
        try:
            await eventually(lambda: len(observer.subscribers) == 1, "the subscriber")
            [sub] = observer.subscribers
            for i in range(5000):
                observer.publish("request.progress", {"id": f"r{i}", "completion_tokens": i})
                assert len(sub.frames) <= observer.queue_size
            for _ in range(3):
                await svir.chat("up/tok-2")
                assert len(sub.frames) <= observer.queue_size
            gate.set()
            await eventually(lambda: bool(feed.named("lagged")), "the lagged event")
            lagged = feed.named("lagged")[0]
            assert lagged["dropped"] > 5000 - observer.queue_size - 10
            # What was kept is the newest: the last progress published came through.
            last = 4999
            await eventually(
                lambda: any(d.get("id") == f"r{last}" for d in feed.named("request.progress")),
                "the newest event",
            )
        finally:
            gate.set()
            await feed.close()


def test_a_subscriber_queue_drops_the_oldest_and_says_how_many() -> None:
    async def run() -> None:
        observer = Observer(queue_size=4)
        sub = observer.subscribe()
        try:
            for i in range(10):
                observer.publish("x", i)
            assert list(sub.frames) == [sse_frame("x", i) for i in range(6, 10)]
            data = sub.take()
            assert data.startswith(sse_frame("lagged", {"dropped": 6}))
            assert data.endswith(sse_frame("x", 9))
            assert sub.take() == b""
        finally:
            observer.unsubscribe(sub)
        assert observer._task is None

    asyncio.run(run())


async def test_the_feed_ends_at_shutdown(tmp_path: Path) -> None:
    svir = Svir(tmp_path)
    await svir.__aenter__()
    feed = Feed(svir.app)
    await feed.start()
    await svir.__aexit__(None, None, None)
    await eventually(lambda: feed.ended, "the feed's end")
    await feed.close()


async def test_the_feed_ends_when_the_page_goes_while_a_stream_is_open(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        feed = Feed(svir.app)
        await feed.start()
        # A stream the client has not read yet: the page going must not wait on it.
        response = await svir.openai().chat.completions.with_raw_response.create(
            model="up/tok-5", messages=[{"role": "user", "content": "x"}], stream=True
        )
        await feed.close()
        assert svir.console.observer.subscribers == set()
        assert response.http_response.status_code == 200


async def test_a_quiet_feed_pings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observe_api, "PING_SECONDS", 0.01)
    async with Svir(tmp_path) as svir:
        feed = Feed(svir.app)
        await feed.start()
        try:
            await eventually(lambda: b": ping\n\n" in feed.data, "a ping")
        finally:
            await feed.close()


async def test_the_feed_and_the_request_page_show_no_secret(tmp_path: Path) -> None:
    async with Svir(tmp_path) as svir:
        feed = Feed(svir.app)
        await feed.start()
        try:
            # The fake server quotes the key it was sent: in a stream, and in a refusal.
            with pytest.raises(openai.APIError, match="credential"):
                await svir.chat("up/echo-stream")
            with pytest.raises(openai.InternalServerError, match="refused svir's credentials"):
                await svir.chat("alt/echo-401")
            await eventually(lambda: len(feed.named("request.finished")) == 2, "both finished")
            errors = [d["error"] for d in feed.named("request.finished")]
            assert all(e and "[redacted]" in e for e in errors), errors
            pages = [
                (await svir.admin(f"/admin/requests/{d['id']}")).text
                for d in feed.named("request.finished")
            ]
            for text in [bytes(feed.data).decode(), *pages]:
                assert UP_KEY not in text and ADMIN not in text
        finally:
            await feed.close()


def _record(rid: str, ts: float, latency: float, model: str = "p/m") -> CallRecord:
    return CallRecord(
        ts=ts, request_id=rid, key_id=None, api="openai", model=model, served_model=model,
        provider="p", status="ok", prompt_tokens=1, completion_tokens=2, reasoning_tokens=None,
        cached_tokens=None, usage_source="reported", cost_micros=None, latency_ms=latency,
        ttft_ms=latency / 2, tokens_per_second=10.0, upstream_request_id=None, upstream_id=None,
        client_user=None,
    )  # fmt: skip


def test_the_recent_records_are_bounded_and_the_figures_read_the_window() -> None:
    now = [5000.5]
    observer = Observer(clock=lambda: now[0], recent=3)
    for n in range(5):
        ctx = CallContext(f"r{n}", "openai")
        ctx.outcome.served_model = "p/m"
        ctx.outcome.attempts = ("p/m",)
        record = _record(f"r{n}", 5000.0 - 100 * (n == 0), 10.0 * (n + 1))
        observer.settled(CallSettled(ctx, record))
    assert [observer.find(f"r{n}") is not None for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert observer.detail("r1") is None
    assert observer.detail("r4")["usage"]["completion_tokens"] == 2  # type: ignore[index]
    stats = observer.stats(1)
    assert sum(p["requests"] for p in stats["points"]) == 4  # r0 was 100 s before
    assert stats["points"][-1]["t"] == 5000
    # The figures of the calls still recorded: r2, r3, r4.
    assert stats["models"]["p/m"]["requests"] == 3
    assert stats["models"]["p/m"]["latency_ms_p50"] == 40.0
    assert stats["models"]["p/m"]["latency_ms_p95"] == 50.0
