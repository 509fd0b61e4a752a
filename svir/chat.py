"""One chat call: a validated request over a route, the upstream's stream, canonical output.

This is the core between the edges and the wire: it builds the upstream body, opens the upstream,
and turns its bytes into what the client gets, streamed (canonical or relayed) or aggregated. An
upstream failure before anything visible was produced is raised as a `GatewayError`, so the
client gets an HTTP error and not a 200 stream; after that it is one error frame.
"""

from __future__ import annotations

import enum
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

import msgspec

from svir.config.model import PYPI_GEMMA, ProviderConfig, Timeouts
from svir.errors import GatewayError, request_error
from svir.log import hundredths
from svir.providers import ProviderKind, build_upstream_body
from svir.providers.adapt import answer_transform
from svir.transport import Network, StreamResponse, Transport
from svir.wire.blobs import Blobs
from svir.wire.classify import to_client_error
from svir.wire.completions import (
    CompletionDialect,
    LlamaCompletionDecoder,
    OpenAICompletionDecoder,
    TextCompletionEncoder,
    completion_object,
    explain_fim_error,
    is_completion,
    is_fim,
    llama_body,
    llama_url,
    openai_body,
    openai_completions_url,
)
from svir.wire.decoder import ChatDecoder
from svir.wire.encoder import ChunkEncoder, CompletionAggregator, stream_error_fields
from svir.wire.errors import BodyError, ErrorKind, UpstreamError
from svir.wire.events import (
    SILENT,
    Event,
    Keepalive,
    ReasoningCarrier,
    ReasoningDelta,
    RefusalDelta,
    StreamError,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from svir.wire.redact import redact_error
from svir.wire.sse import encode_data

_encode = msgspec.json.encode


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where one request goes: a provider, the kind of server it is, and the model id there (what
    `Router.resolve` makes of a model name; the HTTP route a request came by is router.Route)."""

    provider: ProviderConfig
    kind: ProviderKind
    model_id: str
    base_url: str
    api_key: str | None
    timeouts: Timeouts
    # For a server svir runs itself: starts (or swaps in) the model and gives its base URL.
    ensure: Callable[[str], Awaitable[str]] | None = None
    # Called with the model id when a call whose `ensure` succeeded closes (in-flight tracking).
    release: Callable[[str], None] | None = None
    # For a server svir runs itself: stops the model's server now if no call is using it
    # (Ollama's `keep_alive: 0`); True if it was stopped.
    unload: Callable[[str], Awaitable[bool]] | None = None
    # How the transport reaches the server (proxy, TLS); None: the transport's default.
    network: Network | None = None

    @property
    def think_tags(self) -> bool:
        return self.kind.think_tags_for(self.provider)

    @property
    def fim(self) -> bool:
        """Whether this route fills in the middle (a completion with a suffix): a managed model's
        own `fim` setting, else the provider's, else what is known of the model file (Gemma 3
        from PyPI has no FIM tokens), else its kind's (`ProviderKind.fim_for`)."""
        kind, provider = self.kind, self.provider
        if kind.completions_for(provider) is None:
            return False
        spec = provider.managed.model(self.model_id) if provider.managed is not None else None
        if spec is not None and spec.fim is not None:
            return spec.fim
        if provider.fim is None and spec is not None and spec.path == PYPI_GEMMA:
            return False
        return kind.fim_for(provider)


@dataclass(slots=True)
class CallStats:
    """What one call measured, for the request's log line (and later the usage ledger)."""

    started: float = field(default_factory=time.perf_counter)
    first_token_ms: float | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    tokens_per_second: float | None = None
    upstream_id: str | None = None
    upstream_request_id: str | None = None
    # When the upstream's answer began (its status and headers; `time.perf_counter`).
    first_byte_at: float | None = None
    # The failure's words (scrubbed of the upstream key, naming where it failed), when it failed.
    error_message: str | None = None


# Ids need to be unique, not secret: a random per-process prefix and a counter cost no system
# call per request, unlike uuid4.
_ID_PREFIX = os.urandom(10).hex()
_id_counter = itertools.count()


def unique_id() -> str:
    """32 hex characters, unique across processes and requests."""
    return f"{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFF:012x}"


def completion_id() -> str:
    return "chatcmpl-" + unique_id()


def tool_names(request: Mapping[str, Any]) -> list[str]:
    names = []
    for tool in request.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


Batch = tuple[list[bytes], list[Event]]


def has_images(request: Mapping[str, Any]) -> bool:
    """Whether any message carries an image part."""
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                    return True
    return False


@dataclass(frozen=True, slots=True)
class Cut:
    """A guard's verdict: let the batch's first `keep` visible pieces through, then end the
    answer with `error` (one error frame)."""

    error: UpstreamError
    keep: int = 0


class StreamGuard(Protocol):
    """Watches a call's events as they go to the client (svir.policy.key_gate: token budgets).
    `check` gets each batch and returns None to let it pass, or an awaitable that gives None
    (pass) or a `Cut`."""

    def check(self, events: list[Event]) -> Awaitable[Cut | None] | None: ...


# The events that show the client a piece of the answer (exact types: see svir.wire.events).
_VISIBLE: Final = frozenset({TextDelta, ReasoningDelta, RefusalDelta, ToolCallStart, ToolCallDelta})


def visible_count(events: list[Event]) -> int:
    """How many pieces of the answer a batch shows the client (each one chunk on the wire)."""
    return sum(1 for ev in events if type(ev) in _VISIBLE)


def _first_visible(events: list[Event], keep: int) -> list[Event]:
    """The events up to the `keep`-th visible one (silent ones before it kept)."""
    out: list[Event] = []
    seen = 0
    for ev in events:
        if type(ev) in _VISIBLE:
            if seen >= keep:
                break
            seen += 1
        elif seen >= keep > 0:
            break
        out.append(ev)
    return out


def _ends_in_error(batch: Batch) -> bool:
    events = batch[1]
    return bool(events) and type(events[-1]) is StreamError


class CallState(enum.Enum):
    """Where a `ChatCall` is in its life. Forward only, and any state may go to CLOSED."""

    NEW = "new"  # built: nothing sent
    OPENING = "opening"  # `open()` runs: sending, then reading to the first visible output
    PRIMED = "primed"  # opened: what was read up to the first visible output is held
    STREAMING = "streaming"  # the one output method hands the answer out
    CUT = "cut"  # a guard ended the answer with its error: the output stops after this batch
    CLOSED = "closed"  # the upstream let go, the stats settled, the close hooks run


_NEW: Final = CallState.NEW
_OPENING: Final = CallState.OPENING
_PRIMED: Final = CallState.PRIMED
_STREAMING: Final = CallState.STREAMING
_CUT: Final = CallState.CUT
_CLOSED: Final = CallState.CLOSED
_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})

# Run with the call when it closes.
CloseHook = Callable[["Call"], None]


class Call(Protocol):
    """What the policy, the key gate, the metrics and the traces read of an opened call, whatever
    it does: a `ChatCall` and an `EmbeddingCall` (svir.embeddings) are ones. Each goes
    through the same policy loop (retries, fallbacks, breakers) and the same interceptors."""

    route: UpstreamTarget
    request: dict[str, Any]
    model_label: str
    stats: CallStats
    headers: Mapping[str, str]

    @property
    def succeeded(self) -> bool: ...
    @property
    def error(self) -> UpstreamError | None: ...
    @property
    def visible_tokens(self) -> int: ...
    @property
    def response_model(self) -> str | None: ...

    def attach(self, *, guard: StreamGuard | None, on_close: CloseHook) -> None: ...
    async def open(self) -> None: ...
    def close(self) -> None: ...


def upstream_headers(route: UpstreamTarget, request_id: str, accept: str) -> dict[str, str]:
    """The headers of a request to the route's upstream: JSON in, `accept` out, svir's request
    id, the provider's extra headers and the key in the kind's header."""
    headers = {"Content-Type": "application/json", "Accept": accept, "X-Request-Id": request_id}
    headers.update(route.provider.extra_headers or {})
    if route.api_key:
        headers.update(route.kind.auth_headers(route.api_key))
    return headers


def scrubbed(route: UpstreamTarget, error: UpstreamError) -> UpstreamError:
    """The error without the route's upstream key in any of its words (message, code, type,
    param, details): a server may quote the key it was sent, and nothing past the call (the
    client, a log line, the ledger, a metric, a trace) may see it. Every front end's errors come
    through here."""
    key = route.api_key
    return redact_error(error, (key,) if key and len(key) >= 4 else ())


class ChatCall:
    """One request to one route, from opening the upstream to the last byte for the client.

    Built with everything it needs: the headers its answer carries, the fields its upstream is
    known to reject, the hooks its close runs (the policy's, and each attempt watcher's).
    `open()` sends the request and reads until the first visible output, so that every failure
    before it (an HTTP error, an error event, a timeout, a broken connection) is raised while the
    client has seen nothing and the policy may still retry or fall back. Whoever then gets the
    opened call (the key gate) may `attach` a guard and a close hook, once, before the output.
    One output method (`stream`, `complete`, `events`) replays what opening read, then goes on;
    `close()` ends it all, at once, from any state (see `CallState`).
    """

    def __init__(
        self,
        client: Transport,
        route: UpstreamTarget,
        request: dict[str, Any],
        *,
        request_id: str,
        model_label: str,
        blobs: Blobs | None = None,
        headers: Mapping[str, str] = _NO_HEADERS,
        drop_fields: frozenset[str] = frozenset(),
        on_close: Iterable[CloseHook] = (),
    ) -> None:
        self.client = client
        self.blobs = blobs
        self.route = route
        self.request = request
        self.request_id = request_id
        self.model_label = model_label
        # Headers of the client's answer (x-svir-served-model, x-svir-warning).
        self.headers = headers
        # Fields this upstream is known to reject, taken out of the body it is sent.
        self.drop_fields = drop_fields
        self.state = _NEW
        self.stats = CallStats()
        # A text completion (svir.wire.completions) is the same call to another endpoint of the
        # same server, with its own body and stream decoder; everything around it is the same.
        self.completion = is_completion(request)
        self._dialect: CompletionDialect | None = None
        if self.completion:
            self._dialect = route.kind.completions_for(route.provider)
            decoder_type = (
                LlamaCompletionDecoder if self._dialect == "llama" else OpenAICompletionDecoder
            )
            self._decoder: ChatDecoder = decoder_type(clock=time.perf_counter)
        else:
            self._decoder = route.kind.new_decoder(
                think_tags=route.think_tags,
                tool_names=tool_names(request),
                clock=time.perf_counter,
            )
        options = request.get("stream_options")
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self.relay_mode = (
            bool(route.provider.relay) and bool(request.get("stream")) and not self.completion
        )
        self._on_close: list[CloseHook] = [*on_close]
        self._guard: StreamGuard | None = None
        self._transform = (
            None
            if self.completion
            else answer_transform(route.kind, route.provider.response_format, request)
        )
        self._resp: StreamResponse | None = None
        self._body_read = False  # the upstream's answer has given its last batch
        self._primed: list[Batch] = []
        # Set by the policy for a streamed request with a commit deadline: takes the upstream's
        # keep-alives read before the first output (a prompt's progress), instead of holding them.
        self.keepalive_to: Callable[[str], None] | None = None
        # The base URL the request went to (a managed server's once it runs), for errors.
        self._base = route.base_url

    def attach(self, *, guard: StreamGuard | None, on_close: CloseHook) -> None:
        """The one step that adds to a built call, for whoever gets it opened (the key gate),
        before its output is read: a guard on the batches that go to the client, and a hook
        for its close (run after the policy's and the attempt watchers')."""
        assert self.state is _PRIMED, f"attach() to a call {self.state.value}"
        self._guard = guard
        self._on_close.append(on_close)

    # What the call read, for those who account for it (the stats settle these at close).

    @property
    def error(self) -> UpstreamError | None:
        """The upstream's failure in the stream, if it had one (as the upstream said it)."""
        return self._decoder.error

    @property
    def visible_tokens(self) -> int:
        """The visible pieces of the answer the upstream streamed (§3.6's count)."""
        return self._decoder.rate.count

    @property
    def first_token_at(self) -> float | None:
        """When the first visible piece came (`time.perf_counter`), if one did."""
        return self._decoder.rate.first

    @property
    def response_model(self) -> str | None:
        """The model the upstream's answer names, if it named one."""
        return self._decoder.model or None

    @property
    def reasoning_carrier(self) -> ReasoningCarrier | None:
        """Where the upstream put its reasoning first (a field's name, or "think" tags)."""
        return self._decoder.reasoning_carrier

    def upstream_body(self) -> list[bytes | memoryview]:
        """The body in pieces: the encoded JSON, with large image data spliced back in."""
        body = self._encoded_body()
        return self.blobs.splice(body) if self.blobs is not None else [body]

    def _encoded_body(self) -> bytes:
        if self.completion:
            return self._completion_body()
        if not self.route.kind.images_for(self.route.provider) and has_images(self.request):
            # Refused here rather than by the server, which may answer 404 or 500 (§2.2).
            name = self.route.provider.name
            err = UpstreamError(
                ErrorKind.UNSUPPORTED_INPUT,
                f"The provider {name!r} does not take images; send text only or use a model "
                "that sees images.",
                param="messages",
            )
            raise GatewayError(to_client_error(err), err)
        try:
            body = build_upstream_body(
                self.request,
                kind=self.route.kind,
                provider=self.route.provider,
                model_id=self.route.model_id,
            )
        except BodyError as exc:
            raise request_error(str(exc), param="messages") from None
        for name in self.drop_fields:
            body.pop(name, None)
        return _encode(body)

    def _completion_body(self) -> bytes:
        route = self.route
        fim = is_fim(self.request)
        refusal: str | None = None
        where = f"provider {route.provider.name!r} (kind {route.kind.name!r})"
        if self._dialect is None:
            refusal = (
                f"The model {self.model_label!r} does not take text completions: {where} has no "
                "completion endpoint svir sends to; use a chat model or /v1/chat/completions."
            )
        elif fim and not route.fim:
            # Refused here: sending the prefix alone would answer with a plain continuation.
            refusal = (
                f"The model {self.model_label!r} cannot fill in the middle (suffix): {where} is "
                f"not known to take a suffix (set fim = true under [providers] name = "
                f"{route.provider.name!r} if it does), or send the prompt without a suffix."
            )
        if refusal is not None:
            err = UpstreamError(
                ErrorKind.UNSUPPORTED_INPUT, refusal, param="suffix" if fim else "model"
            )
            raise GatewayError(to_client_error(err), err)
        if self._dialect == "llama":
            body = llama_body(self.request, route.model_id)
        else:
            body = openai_body(self.request, route.model_id)
        for name in self.drop_fields | route.kind.drop_params_for(route.provider):
            body.pop(name, None)
        return _encode(body)

    def _completion_url(self, base: str) -> str:
        if self._dialect == "llama":
            return llama_url(base, is_fim(self.request))
        return openai_completions_url(base)

    def upstream_headers(self) -> dict[str, str]:
        return upstream_headers(self.route, self.request_id, "text/event-stream")

    def _scrub(self, error: UpstreamError) -> UpstreamError:
        return scrubbed(self.route, error)

    def _raise(self, error: UpstreamError) -> None:
        error = self.route.kind.explain_error(error)
        if self.completion and is_fim(self.request):
            error = explain_fim_error(error, self.model_label)
        error = located(self._scrub(error), self.route, self._base)
        self.stats.error_kind = error.kind.value
        self.stats.error_message = error.message
        self.close()
        raise GatewayError(to_client_error(error), error)

    async def open(self) -> None:
        """Send the request and read until the first visible output (see the class doc)."""
        assert self.state is _NEW, f"open() a call {self.state.value}"
        self.state = _OPENING
        try:
            await self._open()
        except BaseException:
            # Also when cancelled (the client went away): what the call holds is given back.
            self.close()
            raise
        if self.state is _OPENING:  # a call closed meanwhile stays closed
            self.state = _PRIMED

    async def _open(self) -> None:
        route = self.route
        try:
            body = self.upstream_body()
        except GatewayError:
            self.close()
            raise
        base = self._base = route.base_url
        if route.ensure is not None:
            try:
                base = await route.ensure(route.model_id)
            except UpstreamError as exc:
                self._raise(exc)
            self._base = base
            if route.release is not None:
                release, model_id = route.release, route.model_id
                self._on_close.append(lambda _call: release(model_id))
        if self.completion:
            url = self._completion_url(base)
        else:
            url = route.kind.chat_url(base, route.model_id, route.provider)
        try:
            self._resp = await self.client.open_stream(
                url,
                headers=self.upstream_headers(),
                body=body,
                timeouts=route.timeouts,
                network=route.network,
            )
        except UpstreamError as exc:
            self._raise(exc)
        assert self._resp is not None
        self.stats.first_byte_at = time.perf_counter()
        headers = self._resp.headers
        self.stats.upstream_request_id = headers.get("x-request-id") or headers.get("request-id")
        await self._prime()

    async def _prime(self) -> None:
        tell = self.keepalive_to
        while (batch := await self._read_batch()) is not None:
            frames, events = batch
            # `in` over the types: a scan in C, not a generator resumed per event.
            if tell is not None and Keepalive in map(type, events):
                for ev in events:
                    if type(ev) is Keepalive:
                        tell(ev.comment)
                events = [ev for ev in events if type(ev) is not Keepalive]
                if not events and not frames:
                    continue
            self._primed.append((frames, events))
            for ev in events:
                if type(ev) is StreamError:
                    self._raise(ev.error)
                if type(ev) not in SILENT:
                    return

    def _start_output(self) -> None:
        assert self.state is _PRIMED, f"the output of a call {self.state.value}"
        self.state = _STREAMING

    def _next_batch(self) -> Awaitable[Batch | None]:
        """The next batch of the one output method: what opening read, then the rest as it
        arrives; None at the end (at once after a guard's cut). A coroutine, not a generator
        over the batches: each async generator costs a stream its registration with the loop
        and its closing. Not one itself: a stream's every batch but the primed ones, with no
        guard, is the read's own coroutine (which scrubs a failure as this would), one level
        fewer to make and resume for each chunk."""
        if self.state is _STREAMING and not self._primed and self._guard is None:
            return self._read_batch()
        return self._next_vetted()

    async def _next_vetted(self) -> Batch | None:
        if self.state is not _STREAMING:
            return None
        if self._primed:
            batch = self._primed.pop(0)
        else:
            read = await self._read_batch()
            if read is None:
                return None
            batch = read
        if self._guard is not None or _ends_in_error(batch):
            batch = await self._vetted(batch)
        return batch

    async def _vetted(self, batch: Batch) -> Batch:
        """The batch with its error scrubbed, or the guard's error in its place."""
        frames, events = batch
        events = self._scrubbed(events)
        if self._guard is not None:
            pending = self._guard.check(events)
            if pending is not None:
                cut = await pending
                if cut is not None:
                    self.state = _CUT
                    # In relay mode a data frame carries at most one visible piece.
                    kept = frames[: cut.keep] if self.relay_mode else []
                    return kept, [*_first_visible(events, cut.keep), StreamError(cut.error)]
        return frames, events

    async def events(self) -> AsyncIterator[list[Event]]:
        """The events in batches as bytes arrive; the last batch ends the stream (with `Done`
        or a `StreamError`). For front ends that speak another protocol."""
        self._start_output()
        try:
            while (batch := await self._next_batch()) is not None:
                yield batch[1]
        finally:
            self.close()

    async def _read_batch(self) -> Batch | None:
        """The next (raw frames, events) as bytes arrive (raw frames in relay mode only); None
        after the last. A coroutine over the response's `read`, not a generator: each async
        generator costs a request its registration with the loop and its closing."""
        if self._body_read:
            return None
        resp = self._resp
        assert resp is not None
        decoder = self._decoder
        transform = self._transform
        frames: list[bytes] = []
        try:
            while True:
                data = await resp.read()
                if not data:
                    self._body_read = True
                    events = decoder.close()
                    return self._last([], transform(events) if transform is not None else events)
                if self.relay_mode:
                    frames, events = decoder.feed_frames(data, self.include_usage)
                else:
                    events = decoder.feed(data)
                if transform is not None:
                    events = transform(events)
                if decoder.error is not None or decoder.complete:
                    # The answer ended before the body did: what is left of it is not read.
                    self._body_read = True
                    return self._last(frames, events) if events or frames else None
                if events or frames:
                    return frames, events
        except UpstreamError as exc:
            self._body_read = True
            return self._last([], decoder.fail(exc))

    def _last(self, frames: list[bytes], events: list[Event]) -> Batch:
        """The stream's last batch; read past opening, with its failure scrubbed: `_next_batch`
        has no level of its own around the read to do it then (while opening, the failure is
        raised by `_raise`, which scrubs it, or scrubbed when the primed batch is given out)."""
        if self.state is not _OPENING:
            return frames, self._scrubbed(events)
        return frames, events

    def _scrubbed(self, events: list[Event]) -> list[Event]:
        """`events` with the failure that ends them (if one does) scrubbed."""
        if events and type(last := events[-1]) is StreamError:
            error = self._scrub(last.error)
            if error is not last.error:
                return [*events[:-1], StreamError(error)]
        return events

    def close(self) -> None:
        """Let go of the upstream response (its connection kept for the next request when the
        answer was whole, dropped otherwise so that the server stops), settle the stats, run the
        close hooks."""
        if self.state is _CLOSED:
            return
        self.state = _CLOSED
        if self._resp is not None:
            if self._decoder.complete:
                self._resp.finish()
            else:
                self._resp.close()
        self._finish_stats()
        # The hooks and the guard hold this call in turn (a meter, a breaker's closer): let go
        # of them so that the call is freed when its request ends, not by the cycle collector.
        hooks, self._on_close = self._on_close, []
        self._guard = None
        for hook in hooks:
            hook(self)

    def _finish_stats(self) -> None:
        d = self._decoder
        s = self.stats
        s.usage = d.usage
        s.finish_reason = d.finish_reason if d.complete else None
        s.tokens_per_second = d.tokens_per_second
        s.upstream_id = d.id or None
        if d.error is not None:
            s.error_kind = d.error.kind.value
            if s.error_message is None:
                s.error_message = self._scrub(d.error).message
        if d.rate.first is not None:
            s.first_token_ms = hundredths((d.rate.first - s.started) * 1000)

    @property
    def succeeded(self) -> bool:
        """Whether the upstream delivered a complete answer."""
        return self._decoder.complete

    def stream(self) -> AsyncIterator[bytes]:
        """Canonical chunks, or in relay mode the upstream's own data lines."""
        if self.relay_mode:
            return self._relayed()
        # A text completion's chunks are `text_completion`s; the stream rules are the same.
        make = TextCompletionEncoder if self.completion else ChunkEncoder
        encoder = make(
            id=self._answer_id(),
            model=self.model_label,
            created=int(time.time()),
            include_usage=self.include_usage,
        )
        return self.encoded(encoder.encode)

    async def _relayed(self) -> AsyncIterator[bytes]:
        self._start_output()
        try:
            while (batch := await self._next_batch()) is not None:
                frames, events = batch
                if events and type(events[-1]) is StreamError:
                    frames.append(_error_frame(events[-1].error))
                if frames:
                    yield b"".join(frames)
        finally:
            self.close()

    async def encoded(
        self, encode: Callable[[Event], bytes], tail: Callable[[], bytes] | None = None
    ) -> AsyncIterator[bytes]:
        """The events as `encode` writes them, the bytes of a batch in one piece (none when they
        are empty), then `tail()`'s once the events ran out (when not empty). A front end that
        speaks another protocol writes its bytes here, with no iterator of its own around
        `events()`: each such layer costs a coroutine per batch."""
        self._start_output()
        try:
            while (batch := await self._next_batch()) is not None:
                events = batch[1]
                # A read of one event (a stream that arrives as it is made) is encoded without
                # the list comprehension's frame.
                if len(events) == 1:
                    out = encode(events[0])
                else:
                    out = b"".join([encode(ev) for ev in events])
                if out:
                    yield out
            if tail is not None and (out := tail()):
                yield out
        finally:
            self.close()

    async def complete(self) -> dict[str, Any]:
        """The aggregated `chat.completion` (a `text_completion` for a text completion); a
        failure after priming is a GatewayError too."""
        agg = CompletionAggregator()
        self._start_output()
        try:
            while (batch := await self._next_batch()) is not None:
                agg.extend(batch[1])
                # A failure ends its batch (nothing is decoded after it): the fold holds it.
                if agg.error is not None:
                    raise GatewayError(to_client_error(agg.error), agg.error)
        finally:
            self.close()
        answer_id, created = self._answer_id(), int(time.time())
        if self.completion:
            return completion_object(agg, id=answer_id, model=self.model_label, created=created)
        return agg.completion(id=answer_id, model=self.model_label, created=created)

    def _answer_id(self) -> str:
        return ("cmpl-" + unique_id()) if self.completion else completion_id()


# The failures whose own words do not say where they happened: the connection's, the time's and
# the credentials' (a server's 4xx about the request itself speaks for itself).
_LOCATED: Final = frozenset({ErrorKind.TRANSIENT, ErrorKind.TIMEOUT, ErrorKind.AUTH})


def located(error: UpstreamError, route: UpstreamTarget, base: str) -> UpstreamError:
    """`error` naming the provider and the base URL it failed at ("cannot connect to upstream"
    says neither), and for a refused credential whether the provider's `api_key_env` is set.
    Errors in a stream, and svir's own, are left as they are."""
    if error.in_stream or error.kind not in _LOCATED or "client_error" in error.details:
        return error
    provider = route.provider
    where = f"provider {provider.name!r}" + (f" at {base}" if base else "")
    if error.kind is ErrorKind.AUTH:
        var = provider.api_key_env
        if var is None:
            hint = "it has no api_key_env, so svir sent no key"
        elif not route.api_key:
            hint = f"its api_key_env is {var}, which is not set (or empty) in svir's environment"
        else:
            hint = f"it refused the key in {var}"
        message = f"{error.message} ({where}: {hint})"
    else:
        message = f"{where}: {error.message}"
    return error.replaced(message=message)


def _error_frame(err: UpstreamError) -> bytes:
    message, type_, code = stream_error_fields(err)
    return encode_data(_encode({"error": {"message": message, "type": type_, "code": code}}))
