"""What this process saw of its requests, for the console (per process: with several workers each
has its own): per-second points of the last minutes (requests, errors by class, tokens in and
out, streams open), each model's latency, time to first token and tokens per second, the recent
requests' records (timings, attempts and why each was retried or fell back, usage, cost, error),
and the live feed of request events to the pages that subscribe.

Fed as an observer of the flow (svir.observers: the policy's attempts, the key gate's calls opened
and settled), and by an interceptor around every call. With
nobody subscribed a request costs a few counters and one small record; events are made only for
subscribers, each of whom has a bounded queue (the oldest dropped, then `event: lagged`), so a
slow page holds no more than its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from svir import observers
from svir.call import CallContext, CallRecord
from svir.chat import CallStats
from svir.console.panes import REDACTED

if TYPE_CHECKING:
    from svir.chat import Call, CloseHook
    from svir.policy.gateway import OpenCall

__all__ = ["AttemptFailure", "LiveRecord", "Observer", "Subscriber", "sse_frame"]

_encode = msgspec.json.encode
# Seconds of per-second points kept (a little over the 15 minutes a page shows).
WINDOW_SECONDS: Final = 16 * 60
# The largest number of distinct models measured apart; the rest are "other".
MAX_MODELS: Final = 256
OTHER: Final = "other"


def sse_frame(event: str, data: Any) -> bytes:
    """One server-sent event."""
    return b"event: " + event.encode() + b"\ndata: " + _encode(data) + b"\n\n"


class AttemptFailure(msgspec.Struct, gc=False):
    """An upstream attempt that did not serve a whole answer."""

    provider: str
    model: str
    kind: str
    message: str | None
    started: float


# Not tracked by the garbage collector (gc=False: nothing it holds refers back to it): a
# few thousand of them stay, and full collections need not walk them.
class LiveRecord(msgspec.Struct, gc=False):
    """A recent request as this process saw it: what it is made from, read by `Observer.detail`
    (the timings count from the gate's start, which was the record's `latency_ms` before
    `settled_at`)."""

    record: CallRecord
    attempts: tuple[str, ...]
    failures: list[AttemptFailure] | None
    stats: CallStats | None
    settled_at: float

    def timings(self) -> dict[str, float | None]:
        r = self.record
        start = self.settled_at - (r.latency_ms or 0.0) / 1000
        failures, stats = self.failures or (), self.stats
        first = failures[0].started if failures else (stats.started if stats else None)

        # At least 0: `settled_at` was read a moment after the record's latency was.
        def since(moment: float | None) -> float | None:
            return None if moment is None else round(max(0.0, moment - start) * 1000, 2)

        return {
            "queue_ms": since(first),
            "first_byte_ms": since(stats.first_byte_at if stats is not None else None),
            "first_token_ms": r.ttft_ms,
            "total_ms": r.latency_ms,
        }

    def error(self, secrets: Iterable[str]) -> str | None:
        """What went wrong, in words without a secret of `secrets` (None when it served)."""
        status = self.record.status
        if status == "ok":
            return None
        stats, failures = self.stats, self.failures or ()
        return clean(stats.error_message if stats is not None else None, secrets) or (
            failures[-1].message if failures else status
        )


class Subscriber:
    """One page's feed: at most `size` frames wait; past that the oldest go, and are counted."""

    __slots__ = ("dropped", "frames", "pinged", "size", "wake")

    def __init__(self, size: int) -> None:
        self.size = size
        self.frames: deque[bytes] = deque()
        self.dropped = 0
        self.pinged = False
        self.wake = asyncio.Event()

    def ping(self) -> None:
        """Time for a keep-alive comment (sent when nothing else is waiting)."""
        self.pinged = True
        self.wake.set()

    def put(self, frame: bytes) -> None:
        if len(self.frames) >= self.size:
            self.frames.popleft()
            self.dropped += 1
        self.frames.append(frame)
        self.wake.set()

    def take(self) -> bytes:
        """Every frame waiting, led by `event: lagged` when some were dropped."""
        self.wake.clear()
        pinged, self.pinged = self.pinged, False
        if not self.frames and not self.dropped:
            return b": ping\n\n" if pinged else b""
        out = []
        if self.dropped:
            out.append(sse_frame("lagged", {"dropped": self.dropped}))
            self.dropped = 0
        out.extend(self.frames)
        self.frames.clear()
        return b"".join(out)


def clean(text: str | None, secrets: Iterable[str]) -> str | None:
    """`text` (an error's words) without any of `secrets`, the app's (`App.secrets`): the call
    scrubbed its upstream's key already, and the console shows no other either."""
    if text:
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
    return text


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values.sort()
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


class Observer(observers.Observer):
    """See the module doc. `clock` is the wall clock (Unix seconds) the points are dated by."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        secrets: Callable[[], Iterable[str]] = tuple,
        recent: int = 4096,
        queue_size: int = 256,
        progress_interval: float = 0.25,
    ) -> None:
        self.clock = clock
        # The secrets of the app it watches, as they are now (a reload may change them).
        self.secrets = secrets
        self.recent_size = recent
        self.queue_size = queue_size
        self.progress_interval = progress_interval
        w = WINDOW_SECONDS
        self._second = [-1] * w
        self._requests = [0] * w
        self._tokens_in = [0] * w
        self._tokens_out = [0] * w
        self._streams = [0] * w
        self._errors: list[dict[str, int] | None] = [None] * w
        # The calls streaming now, by request id (their visible tokens feed request.progress).
        self.open_calls: dict[str, Call] = {}
        self._failures: dict[str, list[AttemptFailure]] = {}
        # The last `recent` calls' records, a ring (`_at` the next to replace).
        self.recent: list[LiveRecord | None] = [None] * recent
        self._at = 0
        # The most calls streaming at once since the last settled call.
        self._peak = 0
        self.subscribers: set[Subscriber] = set()
        self.closing = False
        self._task: asyncio.Task[None] | None = None

    # Feeds

    def intercept(self, ctx: CallContext, request: dict[str, Any], proceed: OpenCall) -> Any:
        """The interceptor (outermost): tells subscribers of each call as it starts."""
        if not self.subscribers:
            return proceed(ctx, request)
        key = ctx.key
        self.publish(
            "request.started",
            {
                "id": ctx.request_id,
                "ts": self.clock(),
                "api": ctx.api,
                "model": request.get("model"),
                "key_id": key.id if key is not None else None,
                "stream": bool(request.get("stream")),
                "operation": ctx.operation,
            },
        )
        return proceed(ctx, request)

    def attempt(self, event: observers.AttemptStarted) -> CloseHook:
        """Note why each attempt failed, when it closes."""
        return self._attempt_closed

    def _attempt_closed(self, call: Call) -> None:
        if call.succeeded:
            return
        s = call.stats
        rid = getattr(call, "request_id", None)
        if rid is None:
            return
        failures = self._failures.get(rid)
        if failures is None:
            if len(self._failures) >= self.recent_size:
                # A request that never settled (none should): its failures are let go.
                del self._failures[next(iter(self._failures))]
            failures = self._failures[rid] = []
        failures.append(
            AttemptFailure(
                provider=call.route.provider.name,
                model=call.model_label,
                kind=s.error_kind or "cancelled",
                message=clean(s.error_message, self.secrets()),
                started=s.started,
            )
        )

    def opened(self, event: observers.CallOpened) -> None:
        """A call streams."""
        calls = self.open_calls
        calls[event.ctx.request_id] = event.call
        if len(calls) > self._peak:  # noqa: PLR1730 - a comparison costs less than max()
            self._peak = len(calls)

    def settled(self, event: observers.CallSettled) -> None:
        """What a call came to. Kept lean (it runs for every call): the request's record is the
        references it is made from, turned into its page on demand."""
        ctx, record = event.ctx, event.record
        rid = ctx.request_id
        o = ctx.outcome
        if o.served_model is not None:
            self.open_calls.pop(rid, None)
        second = int(record.ts)
        i = second % WINDOW_SECONDS
        if self._second[i] != second:
            self._reset(i, second)
        self._requests[i] += 1
        self._tokens_in[i] += record.prompt_tokens
        self._tokens_out[i] += record.completion_tokens
        if self._peak > self._streams[i]:  # noqa: PLR1730 - a comparison costs less than max()
            self._streams[i] = self._peak
        self._peak = len(self.open_calls)
        status = record.status
        if status != "ok":
            errors = self._errors[i]
            if errors is None:
                errors = self._errors[i] = {}
            errors[status] = errors.get(status, 0) + 1
        failures = self._failures.pop(rid, None) if self._failures else None
        at = self._at
        self.recent[at] = live = LiveRecord(
            record, o.attempts, failures, o.stats, time.perf_counter()
        )
        self._at = at + 1 if at + 1 < self.recent_size else 0
        if self.subscribers:
            self.publish(
                "request.finished",
                {
                    "id": rid,
                    "status": status,
                    "model": record.model,
                    "served_model": record.served_model,
                    "provider": record.provider,
                    "prompt_tokens": record.prompt_tokens,
                    "completion_tokens": record.completion_tokens,
                    "latency_ms": record.latency_ms,
                    "ttft_ms": record.ttft_ms,
                    "tokens_per_second": record.tokens_per_second,
                    "error": live.error(self.secrets()),
                },
            )

    def _reset(self, i: int, second: int) -> None:
        """Slot `i` starts the point of `second`."""
        self._second[i] = second
        self._requests[i] = self._tokens_in[i] = self._tokens_out[i] = 0
        self._streams[i] = len(self.open_calls)
        self._errors[i] = None

    # Reading

    def point(self, second: int, streams: int = 0) -> dict[str, Any]:
        """The point of one second (`streams`: the streams open to show when nothing happened in
        it, the last count seen before)."""
        i = second % WINDOW_SECONDS
        if self._second[i] != second:
            return {
                "t": second,
                "requests": 0,
                "errors": {},
                "tokens_in": 0,
                "tokens_out": 0,
                "streams_open": streams,
            }
        return {
            "t": second,
            "requests": self._requests[i],
            "errors": dict(self._errors[i] or {}),
            "tokens_in": self._tokens_in[i],
            "tokens_out": self._tokens_out[i],
            "streams_open": self._streams[i],
        }

    def stats(self, minutes: float) -> dict[str, Any]:
        """The last `minutes` (at most the window) as points a second apart, oldest first, and each
        model's figures over them."""
        now = int(self.clock())
        span = max(1, min(WINDOW_SECONDS - 1, int(minutes * 60)))
        points = []
        streams = 0
        for second in range(now - span + 1, now + 1):
            p = self.point(second, streams if second != now else len(self.open_calls))
            streams = p["streams_open"]
            points.append(p)
        since = now - span + 1
        by_model: dict[str, list[CallRecord]] = {}
        for live in self.recent:
            if live is None or live.record.ts < since or live.record.served_model is None:
                continue
            model = live.record.served_model
            if model not in by_model and len(by_model) >= MAX_MODELS:
                model = OTHER
            by_model.setdefault(model, []).append(live.record)
        models: dict[str, Any] = {}
        for model, rows in sorted(by_model.items()):
            latency = [r.latency_ms for r in rows if r.latency_ms is not None]
            ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None]
            tps = [r.tokens_per_second for r in rows if r.tokens_per_second is not None]
            models[model] = {
                "requests": len(rows),
                "latency_ms_p50": _percentile(latency, 0.5),
                "latency_ms_p95": _percentile(latency, 0.95),
                "ttft_ms_p50": _percentile(ttft, 0.5),
                "ttft_ms_p95": _percentile(ttft, 0.95),
                "tokens_per_second_p50": _percentile(tps, 0.5),
            }
        return {"interval_seconds": 1, "points": points, "models": models}

    def find(self, request_id: str) -> LiveRecord | None:
        """The newest record of `request_id` among the recent ones."""
        n = self.recent_size
        for k in range(1, n + 1):
            live = self.recent[(self._at - k) % n]
            if live is None:
                return None
            if live.record.request_id == request_id:
                return live
        return None

    def detail(self, request_id: str) -> dict[str, Any] | None:
        """The record of a recent request of this process, in the console's shape (the newest, if
        the id came twice)."""
        live = self.find(request_id)
        if live is None:
            return None
        r = live.record
        names = live.attempts
        failures = list(live.failures or ())
        attempts = []
        for n, name in enumerate(names):
            failure = failures[n] if n < len(failures) else None
            served = n == len(names) - 1 and r.served_model == name
            if failure is not None and failure.model != name:
                failure = None  # attempts and failures are in the same order: never expected
            entry: dict[str, Any] = {
                "provider": failure.provider if failure else (r.provider if served else None),
                "model": name,
                "outcome": failure.kind if failure else ("ok" if served else r.status),
                "error": failure.message if failure else None,
                "why": None,
            }
            if n + 1 < len(names):
                nxt = names[n + 1]
                kind = entry["outcome"]
                entry["why"] = (
                    f"retried after {kind}" if nxt == name else f"fell back to {nxt} after {kind}"
                )
            attempts.append(entry)
        return {
            "timings": live.timings(),
            "status": r.status,
            "model": r.model,
            "served_model": r.served_model,
            "provider": r.provider,
            "attempts": attempts,
            "usage": {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "reasoning_tokens": r.reasoning_tokens,
                "cached_tokens": r.cached_tokens,
                "source": r.usage_source,
            },
            "cost_usd": r.cost_micros / 1_000_000 if r.cost_micros is not None else None,
            "tokens_per_second": r.tokens_per_second,
            "error": live.error(self.secrets()),
        }

    # The live feed

    def subscribe(self) -> Subscriber:
        sub = Subscriber(self.queue_size)
        self.subscribers.add(sub)
        if self._task is None and not self.closing:
            self._task = asyncio.get_running_loop().create_task(self._tick())
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers and self._task is not None:
            self._task.cancel()
            self._task = None

    def publish(self, event: str, data: Any) -> None:
        frame = sse_frame(event, data)
        for sub in self.subscribers:
            sub.put(frame)

    async def _tick(self) -> None:
        """While anyone subscribes: each request's progress (at most once a tick) and, once a
        second, the second that just ended."""
        seen: dict[str, int] = {}
        last_second = int(self.clock())
        while True:
            await asyncio.sleep(self.progress_interval)
            now: dict[str, int] = {}
            for rid, call in list(self.open_calls.items()):
                count = call.visible_tokens
                now[rid] = count
                if count and seen.get(rid) != count:
                    self.publish("request.progress", {"id": rid, "completion_tokens": count})
            seen = now
            second = int(self.clock())
            if second != last_second:
                last_second = second
                self.publish("stats", self.point(second - 1, len(self.open_calls)))

    def end_feeds(self) -> None:
        """Every feed ends (the server stops: svir.edges.app.App.on_stopping)."""
        self.closing = True
        for sub in self.subscribers:
            sub.wake.set()

    async def close(self) -> None:
        """At shut-down: every feed ends."""
        self.end_feeds()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
