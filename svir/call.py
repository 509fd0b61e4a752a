"""The typed context of one request's call (a chat, or embeddings: its `operation`): who asked and
through which front end, and what became of the call. Every front end makes one and hands it to
`Gateway.open_chat` (or `Gateway.open_embeddings`); the policy and the key gate fill its outcome;
the ledger, the metrics, the traces and the access log read it. When the call is over the key
gate settles it into a `CallRecord`, the ledger's row.

The request's log fields about the call are written from it in one place (`CallContext.log_into`,
when the request ends), so a log key is a name in a log line and nothing reads it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from svir.log import hundredths

if TYPE_CHECKING:
    from svir.chat import CallStats
    from svir.keys.model import KeyRecord
    from svir.transport import Transport
    from svir.wire.blobs import Blobs

__all__ = [
    "CHAT",
    "CLIENT_USER_CHARS",
    "EMBEDDINGS",
    "INTERNAL",
    "CallContext",
    "CallOutcome",
    "CallRecord",
    "Capture",
    "Commit",
]

# What a call does (`CallContext.operation`): the policy opens a `ChatCall` (svir.chat) for a
# chat, an `EmbeddingCall` (svir.embeddings) for embeddings (both a `svir.chat.Call`); the
# interceptors see which.
CHAT: Final = "chat"
EMBEDDINGS: Final = "embeddings"

# The front end of a call that no client protocol made (tests, tools in process).
INTERNAL = "internal"
# The most of a client's user id that is kept: it is client input, written to every log line and
# ledger row of the call.
CLIENT_USER_CHARS = 200


class Commit:
    """A streamed request's commit: when its answer commits, as the policy decides it
    (svir.policy.resilience), told to the front end that acts on it
    (svir.protocols.http.EarlyStart). Made when the request arrives. For each attempt the policy
    says when the answer commits (`due_after`: its provider's deadline, counted from the
    arrival); once that passes, the answer is `committed`: the client has (or is getting) the
    response's head and keep-alives, so a failure is no longer retried nor sent to a fallback,
    and the front end is told, once (`on_commit`). The upstream's keep-alive comments read while
    waiting for the first output (`upstream_keepalive`) go to the front end's `relay` once
    committed (before that, a progress note that would only arrive stale with the answer is
    dropped). `close` ends it: the call opened or failed, and nothing commits any more."""

    __slots__ = ("_arrived", "_loop", "_timer", "closed", "committed", "on_commit", "relay")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arrived = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self.committed = False
        self.closed = False
        # What the front end does when the answer commits, and with each upstream keep-alive.
        self.on_commit: Callable[[], None] | None = None
        self.relay: Callable[[str], None] | None = None

    def due_after(self, seconds: float) -> None:
        """The answer commits `seconds` after the request arrived (at once if that is past),
        unless it has committed or ended already; said again for each attempt."""
        if self.committed or self.closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self._arrived + seconds, self._due)

    def _due(self) -> None:
        self._timer = None
        self.committed = True
        if self.on_commit is not None:
            self.on_commit()

    def upstream_keepalive(self, comment: str) -> None:
        """An upstream keep-alive read before the first output: to the front end once committed."""
        relay = self.relay
        if self.committed and not self.closed and relay is not None:
            relay(comment)

    def close(self) -> None:
        """Nothing commits any more (the call opened in time, or the answer's end is decided)."""
        self.closed = True
        # The front end's callbacks hold the front end, which holds this: no cycle left behind.
        self.on_commit = self.relay = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Capture(Protocol):
    """A captured request's tap on its upstream traffic (svir.console.capture): the policy opens
    each attempt of the request's call through `tap(transport)`, which keeps what goes up and
    comes back, the last attempt's winning."""

    def tap(self, transport: Transport) -> Transport: ...


# msgspec Structs rather than dataclasses: one of each is made per request, and a Struct is made
# in a fraction of the time a frozen dataclass takes.
class CallOutcome(msgspec.Struct):
    """What became of the call, filled as it goes: by the policy (who was tried, who served, what
    the serving call measured) and by the key gate (the limit that refused or cut it)."""

    # The provider of the last attempt: the one that served, or the last one that failed.
    provider: str | None = None
    # Set once a call serves: the model the client asked for, and the deployment that serves it.
    model: str | None = None
    served_model: str | None = None
    # Every deployment tried, in order (retries and fallbacks each count).
    attempts: tuple[str, ...] = ()
    # What the serving call measured (usage, finish, error class, timings); settled at its close.
    stats: CallStats | None = None
    # The key's limit that refused the call or cut its answer ("models" for a model not allowed).
    limit: str | None = None
    # "counted" when the call's tokens were counted by svir, not reported by the upstream.
    usage_source: str | None = None


class CallContext(msgspec.Struct, frozen=True):
    """One chat request as the gateway sees it: its id, the front end it came in on ("openai",
    "ollama", "threads", ... or INTERNAL), the caller's key (None without keys), the large image
    data kept out of its body, the end user the client named (Anthropic's `metadata.user_id`,
    OpenAI's `user`; at most CLIENT_USER_CHARS), the outcome (the only part that changes), for
    a streamed answer its commit deadline, and the request's capture when it is captured."""

    request_id: str
    api: str
    key: KeyRecord | None = None
    blobs: Blobs | None = None
    client_user: str | None = None
    outcome: CallOutcome = msgspec.field(default_factory=CallOutcome)
    # CHAT or EMBEDDINGS: which call the policy opens for the request.
    operation: str = CHAT
    # A streamed answer's commit (None: the answer is held to its first output).
    commit: Commit | None = None
    # The request's capture ([capture] on, a client route): None when it is not captured.
    capture: Capture | None = None

    def log_into(self, fields: dict[str, Any]) -> None:
        """Write the call's outcome into the request's log fields (the access log's names)."""
        if self.client_user is not None:
            fields["client_user"] = self.client_user
        o = self.outcome
        if o.limit is not None:
            fields["limit"] = o.limit
        if o.served_model is not None:
            fields["model"] = o.model
            fields["served_model"] = o.served_model
            if len(o.attempts) > 1:
                fields["attempts"] = list(o.attempts)
        if o.provider is not None:
            # Also when every attempt failed: the log names who failed.
            fields["provider"] = o.provider
        if o.usage_source is not None:
            fields["usage_source"] = o.usage_source
        s = o.stats
        if s is None:
            return
        fields["upstream_request_id"] = s.upstream_request_id
        fields["upstream_id"] = s.upstream_id
        fields["finish_reason"] = s.finish_reason
        if s.error_kind:
            fields["error_kind"] = s.error_kind
        if s.first_token_ms is not None:
            fields["ttft_ms"] = s.first_token_ms
        if s.tokens_per_second is not None:
            fields["tokens_per_second"] = hundredths(s.tokens_per_second)
        if s.usage is not None:
            fields["prompt_tokens"] = s.usage.prompt_tokens
            fields["completion_tokens"] = s.usage.completion_tokens


# Not tracked by the garbage collector (gc=False: every field is a str, a number or None, so a
# record is never part of a cycle): up to a second of them waits in the ledger for its next write,
# and tracked ones made every full collection under load walk thousands of them.
class CallRecord(msgspec.Struct, gc=False):
    """What one chat call came to, refused, failed or served: the usage ledger's row (a column a
    field, svir.ledger) and what the metrics count."""

    ts: float
    request_id: str
    key_id: str | None
    api: str
    model: str
    served_model: str | None
    provider: str | None
    status: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None
    cached_tokens: int | None
    usage_source: str
    cost_micros: int | None
    latency_ms: float | None
    ttft_ms: float | None
    tokens_per_second: float | None
    upstream_request_id: str | None
    upstream_id: str | None
    client_user: str | None
