"""Where `svir chat` keeps the conversation: as a thread on svir (`/v1/threads`, seed 002) when the
server offers one, else here, sending the whole history with every request.

Both give the same events (the wire core's), so the terminal shows either the same way:
- `LocalHistory` posts `/v1/chat/completions` with every message so far and reads the stream with
  the wire core's decoder;
- `ThreadHistory` posts the new messages to `/v1/threads/{id}/messages`, then reads the frames of
  `/v1/threads/{id}/continue` (delta, reasoning, refusal, tool_call, usage, done, error) into
  the same events.

Either way an answer that did not complete (an error, or stopped with Ctrl-C) adds nothing to the
history; the user message stays, so `/retry` asks again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec

from svir.client.connection import ClientFailure, Connection, error_of, not_a_stream, stream_chat
from svir.wire.classify import classify_stream_error
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Event,
    Finish,
    Keepalive,
    ReasoningDelta,
    RefusalDelta,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from svir.wire.speed import TokenRate
from svir.wire.sse import SSEEvent, SSEParser
from svir.wire.toolcalls import ToolCall

__all__ = [
    "Answer",
    "History",
    "LocalHistory",
    "Session",
    "ThreadHistory",
    "TurnOutcome",
    "threads_available",
]

Clock = Callable[[], float]


class Session:
    """The connection and its httpx client, which is replaced after a Ctrl-C: an interrupt can
    land anywhere inside httpx, and a fresh pool is the safe way on."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = self.conn.client()
        return self._client

    def renew(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # An interrupted pool may fail to close; it is dropped either way.
            with contextlib.suppress(Exception):
                client.close()

    def close(self) -> None:
        self.renew()


@dataclass
class TurnOutcome:
    """What one answer showed, complete or not."""

    text: str = ""
    reasoning: str = ""
    # The key the server sent reasoning under; None for inline <think> (not sent back, D23).
    reasoning_key: str | None = None
    refusal: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    tokens_per_second: float | None = None
    error: UpstreamError | None = None
    stopped: bool = False
    seconds: float = 0.0
    reasoning_seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None and self.error is None and not self.stopped


class Answer:
    """An answer's events as they come, and its speed once they are read."""

    def __init__(self, events: Iterator[Event], rate: Callable[[], float | None]) -> None:
        self._events = events
        self._rate = rate

    def __iter__(self) -> Iterator[Event]:
        return self._events

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens per second from the first visible token to the last (§3.6), or None."""
        return self._rate()

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close is not None:
            close()


class History(Protocol):
    """A conversation the chat adds to."""

    mode: str

    def describe(self) -> str: ...

    def add(self, messages: list[dict[str, Any]], model: str) -> None:
        """Add user messages or tool results."""

    def answer(self, model: str, params: dict[str, Any], clock: Clock) -> Answer:
        """Ask the model to answer the conversation as it stands."""

    def record(self, outcome: TurnOutcome) -> None:
        """Keep a completed answer (a no-op where the server keeps it)."""

    def stopped(self) -> None:
        """The user stopped the answer: let the server know, where it keeps state."""

    def reset(self) -> None:
        """Start a new conversation."""

    def count(self) -> int:
        """Messages in the conversation, as far as the client knows."""


def _assistant_message(outcome: TurnOutcome) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text or outcome.refusal}
    if outcome.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in outcome.tool_calls
        ]
    # Reasoning goes back under the key the server used (§2.2); inline <think> does not (D23).
    if outcome.reasoning and outcome.reasoning_key in ("reasoning_content", "reasoning"):
        message[outcome.reasoning_key] = outcome.reasoning
    return message


def _tool_names(params: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in params.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(name)
    return names


class LocalHistory:
    """The conversation kept here and sent whole to `/v1/chat/completions` every turn."""

    mode = "local"

    def __init__(self, session: Session, system: str | None = None) -> None:
        self.session = session
        self.system = system
        self.messages: list[dict[str, Any]] = []
        self.reset()

    def describe(self) -> str:
        return "kept by this client (sent whole with every request)"

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def count(self) -> int:
        return len(self.messages)

    def add(self, messages: list[dict[str, Any]], model: str) -> None:
        self.messages.extend(messages)

    def answer(self, model: str, params: dict[str, Any], clock: Clock) -> Answer:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        decoder = StreamDecoder(clock=clock, tool_names=_tool_names(params))
        events = stream_chat(
            self.session.client, self.session.conn.url("chat/completions"), body, decoder=decoder
        )
        return Answer(events, lambda: decoder.tokens_per_second)

    def record(self, outcome: TurnOutcome) -> None:
        if outcome.complete:
            self.messages.append(_assistant_message(outcome))

    def stopped(self) -> None:
        pass


def threads_available(session: Session) -> bool:
    """Whether the server keeps threads: `GET /v1/threads` answers 200."""
    try:
        resp = session.client.get(session.conn.url("threads"), params={"limit": "1"})
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


_decode = msgspec.json.decode


class ThreadHistory:
    """The conversation kept by svir as a thread; created on the first message."""

    mode = "thread"

    def __init__(
        self, session: Session, system: str | None = None, thread_id: str | None = None
    ) -> None:
        self.session = session
        self.system = system
        self.thread_id = thread_id
        self._count = 0

    def describe(self) -> str:
        if self.thread_id is None:
            return "kept by svir as a thread (created with the first message)"
        return f"kept by svir as thread {self.thread_id}"

    def reset(self) -> None:
        self.thread_id = None
        self._count = 0

    def count(self) -> int:
        return self._count

    def resume(self) -> None:
        """Check that the thread to go on with exists (ClientFailure otherwise)."""
        assert self.thread_id is not None
        url = self.session.conn.url(f"threads/{self.thread_id}")
        try:
            resp = self.session.client.get(url)
        except httpx.HTTPError as exc:
            raise ClientFailure(f"GET {url}: {exc}") from None
        self._checked(resp, f"thread {self.thread_id}")

    def _checked(self, resp: httpx.Response, what: str) -> Any:
        if resp.status_code >= 300:
            raise ClientFailure(f"{what}: HTTP {resp.status_code}: {error_of(resp).message}")
        try:
            return _decode(resp.content)
        except msgspec.DecodeError:
            raise ClientFailure(f"{what}: the answer is not JSON") from None

    def _ensure(self, model: str) -> str:
        if self.thread_id is None:
            body: dict[str, Any] = {"model": model}
            if self.system:
                body["system"] = self.system
            resp = self.session.conn.post_json(self.session.client, "threads", body)
            created = self._checked(resp, "creating a thread")
            thread_id = created.get("id") if isinstance(created, dict) else None
            if not isinstance(thread_id, str) or not thread_id:
                raise ClientFailure("creating a thread: the answer has no id")
            self.thread_id = thread_id
        return self.thread_id

    def add(self, messages: list[dict[str, Any]], model: str) -> None:
        thread_id = self._ensure(model)
        resp = self.session.conn.post_json(
            self.session.client, f"threads/{thread_id}/messages", {"messages": messages}
        )
        self._checked(resp, "adding the message to the thread")
        self._count += len(messages)

    def answer(self, model: str, params: dict[str, Any], clock: Clock) -> Answer:
        thread_id = self._ensure(model)
        rate = TokenRate()
        body = {"model": model, "stream": True, **params}
        events = self._frames(self.session.conn.url(f"threads/{thread_id}/continue"), body,
                              rate, clock)  # fmt: skip
        return Answer(events, lambda: rate.tokens_per_second)

    def record(self, outcome: TurnOutcome) -> None:
        if outcome.complete:
            self._count += 1

    def stopped(self) -> None:
        """Closing the stream already cancels the continuation; the explicit cancel makes sure
        the thread is free for the next message at once (best effort)."""
        if self.thread_id is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            self.session.client.post(
                self.session.conn.url(f"threads/{self.thread_id}/cancel"), timeout=5.0
            )

    def _frames(
        self, url: str, body: dict[str, Any], rate: TokenRate, clock: Clock
    ) -> Iterator[Event]:
        client = self.session.client
        data = msgspec.json.encode(body)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        try:
            with client.stream("POST", url, content=data, headers=headers) as resp:
                refused = not_a_stream(resp)
                if refused is not None:
                    yield refused
                    return
                parser = SSEParser()
                reader = _FrameReader(rate, clock)
                for chunk in resp.iter_raw():
                    for item in parser.feed(chunk):
                        if isinstance(item, SSEEvent):
                            yield from reader.read(item.data)
                        else:
                            yield Keepalive(item.text)
                        if reader.ended:
                            return
                yield StreamError(UpstreamError(
                    ErrorKind.INCOMPLETE, "the thread stream ended before its done frame",
                    in_stream=True,
                ))  # fmt: skip
        except httpx.HTTPError as exc:
            yield StreamError(UpstreamError(
                ErrorKind.INCOMPLETE, f"the connection failed: {type(exc).__name__}: {exc}",
                in_stream=True,
            ))  # fmt: skip


class _FrameReader:
    """Thread frames (svir/threads/frames.py) into wire events."""

    def __init__(self, rate: TokenRate, clock: Clock) -> None:
        self.rate = rate
        self.clock = clock
        self.usage: Usage | None = None
        self.ended = False

    def read(self, data: bytes) -> list[Event]:
        try:
            frame = _decode(data)
        except msgspec.DecodeError:
            self.ended = True
            return [StreamError(UpstreamError(
                ErrorKind.PROTOCOL, "a thread frame is not JSON", in_stream=True
            ))]  # fmt: skip
        if not isinstance(frame, dict):
            return []
        kind = frame.get("type")
        text = frame.get("text")
        if kind in ("delta", "reasoning", "refusal") and isinstance(text, str) and text:
            self.rate.tick(self.clock())
            if kind == "delta":
                return [TextDelta(text)]
            if kind == "reasoning":
                return [ReasoningDelta(text, "reasoning")]
            return [RefusalDelta(text)]
        if kind == "tool_call":
            index = frame.get("index")
            return [
                ToolCallStart(index if isinstance(index, int) else 0, str(frame.get("id") or ""),
                              str(frame.get("name") or "")),
                ToolCallDelta(index if isinstance(index, int) else 0,
                              str(frame.get("arguments") or "")),
            ]  # fmt: skip
        if kind == "usage":
            self.usage = Usage(
                _int(frame.get("prompt_tokens")),
                _int(frame.get("completion_tokens")),
                _int(frame.get("total_tokens")),
            )
            return []
        if kind == "done":
            self.ended = True
            out: list[Event] = [Finish(str(frame.get("finish_reason") or "stop"))]
            if self.usage is not None:
                out.append(self.usage)
            out.append(Done())
            return out
        if kind == "error":
            self.ended = True
            error = classify_stream_error({"error": frame.get("error")})
            return [StreamError(error)]
        return []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
