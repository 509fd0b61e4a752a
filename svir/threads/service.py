"""The thread service: the resource behind /v1/threads, over a store and the gateway.

Everything here answers a client's mistake with a `GatewayError` (an OpenAI-shaped error with its
status) and lets nothing else out on bad input. The HTTP edge only reads bodies and writes
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Literal

import msgspec

from svir.call import CallContext
from svir.chat import ChatCall
from svir.config.model import StoreConfig
from svir.errors import (
    BadCursor,
    BadRequest,
    Busy,
    GatewayError,
    LimitExceeded,
    NotFound,
    StoreError,
    ThreadError,
    invalid_request,
    request_error,
)
from svir.policy.gateway import Gateway
from svir.providers import check_chat_fields, validate_chat_settings
from svir.threads import frames
from svir.threads.content import (
    Limits,
    blob_hashes,
    check_append,
    check_continue,
    message_object,
    new_id,
    parse_messages,
    parse_multipart,
    thread_object,
    upstream_messages,
)
from svir.threads.frames import Frame
from svir.threads.records import NewMessage, Store
from svir.wire.answer import AnswerFold, openai_tool_call
from svir.wire.classify import ClientError, to_client_error
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Done,
    Keepalive,
    ReasoningDelta,
    RefusalDelta,
    StreamError,
    TextDelta,
)
from svir.wire.jsonbody import json_type

__all__ = ["Continuation", "ThreadService", "list_object", "page_query"]

log = logging.getLogger("svir.threads")
_encode = msgspec.json.encode

MAX_METADATA_KEYS: Final = 16
MAX_METADATA_KEY: Final = 64
MAX_METADATA_VALUE: Final = 512
DEFAULT_PAGE: Final = 20
MAX_PAGE: Final = 100
NOTHING_APPENDED: Final = "Nothing was appended to the thread."
# Fields of a continue request that svir decides or that make no sense on a thread.
_CONTINUE_REFUSED: Final = {
    "messages": "the thread holds the conversation: post messages to /v1/threads/{id}/messages",
    "stream_options": "usage comes as a usage frame; stream_options does not apply",
}


def _not_found(thread_id: str) -> GatewayError:
    return request_error(
        f"No thread found with id {thread_id!r}.", status=404, code="thread_not_found"
    )


def _busy(thread_id: str) -> GatewayError:
    return request_error(
        f"Thread {thread_id!r} is busy: a continuation is running on it. Wait for it to end"
        " (or cancel it with POST /v1/threads/{id}/cancel) and try again.",
        status=409,
        code="thread_busy",
    )


def store_errors(thread_id: str | None, exc: StoreError) -> GatewayError:
    """The client's answer for a store error."""
    if isinstance(exc, NotFound):
        return _not_found(thread_id or str(exc))
    if isinstance(exc, Busy):
        return _busy(thread_id or str(exc))
    if isinstance(exc, BadCursor):
        return request_error(
            f"after: {str(exc)!r} is not an id in this list", param="after", code="invalid_cursor"
        )
    if isinstance(exc, LimitExceeded):
        return request_error(
            f"The thread's attachments would pass the per-thread limit: {exc}",
            status=413,
            code="thread_attachments_too_large",
        )
    return GatewayError(
        ClientError(503, "server_error", "store_unavailable", f"The thread store failed: {exc}")
    )


# ---------------------------------------------------------------------------------------------
# Request checks


def _check_model(value: Any, param: str = "model") -> str | None:
    """A model name as /v1/models lists it (`<provider>/<model-id>`) or a configured route."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise request_error(
            f"{param} must be a string, not {json_type(value)}", param=param, code="invalid_type"
        )
    if not value.strip():
        raise request_error(f"{param} must not be empty", param=param)
    return value


def _check_system(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise request_error("system must be a string", param="system", code="invalid_type")
    return value or None


def _check_metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise request_error(
            "metadata must be an object of strings", param="metadata", code="invalid_type"
        )
    if len(value) > MAX_METADATA_KEYS:
        raise request_error(f"metadata takes at most {MAX_METADATA_KEYS} keys", param="metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise request_error(
                f"metadata keys are at most {MAX_METADATA_KEY} characters", param="metadata"
            )
        if not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise request_error(
                f"metadata[{key!r}] must be a string of at most {MAX_METADATA_VALUE} characters",
                param="metadata",
            )
    return dict(value)


def _thread_fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise request_error("the request body must be a JSON object", code="invalid_type")
    unknown = set(body) - allowed
    if unknown:
        name = sorted(unknown)[0]
        raise request_error(
            f"unknown field {name!r} (known: {', '.join(sorted(allowed))})", param=name
        )
    out: dict[str, Any] = {}
    if "model" in body:
        out["model"] = _check_model(body["model"])
    if "system" in body:
        out["system"] = _check_system(body["system"])
    if "metadata" in body:
        out["metadata"] = _check_metadata(body["metadata"])
    return out


def page_query(query: Mapping[str, str], default_order: str) -> tuple[int, str | None, Any]:
    raw_limit = query.get("limit")
    limit = DEFAULT_PAGE
    if raw_limit is not None:
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            raise request_error(f"limit must be a whole number from 1 to {MAX_PAGE}", param="limit")
        limit = int(raw_limit)
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise request_error("order must be 'asc' or 'desc'", param="order")
    after = query.get("after") or None
    return limit, after, order


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list shape: a page of objects with ids, and whether more follow."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


class ContinueParams(msgspec.Struct, frozen=True):
    model: str | None
    stream: bool
    generation: dict[str, Any]


def parse_continue(body: Any) -> ContinueParams:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise request_error("the request body must be a JSON object", code="invalid_type")
    for key, why in _CONTINUE_REFUSED.items():
        if key in body:
            raise request_error(f"{key}: {why}", param=key, code="unsupported_parameter")
    model = _check_model(body.get("model"))
    try:
        check_chat_fields(body)  # the words of every front end for the same mistake
    except BadRequest as exc:
        raise invalid_request(exc) from None
    stream = body.get("stream") or False
    generation = {k: v for k, v in body.items() if k not in ("model", "stream")}
    return ContinueParams(model, stream, generation)


_OVERFLOW_CONTEXT: Final = (
    re.compile(r"context size \((\d+) tokens\)"),
    re.compile(r"context: (\d+) tokens"),
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"context length (?:is|of) (\d+)"),
)
_OVERFLOW_PROMPT: Final = (
    re.compile(r"request \((\d+) tokens\)"),
    re.compile(r"prompt: (\d+) tokens"),
    re.compile(r"prompt contains at least (\d+)"),
    re.compile(r"resulted in (\d+) tokens"),
)


def overflow_sizes(
    message: str, details: Mapping[str, Any] | None, *, messages: int, message_bytes: int | None
) -> dict[str, Any]:
    """What is known of the sizes of a prompt that did not fit: tokens as the server counted them
    (when it said), and the thread's messages and their JSON size as svir sent them."""

    def first(patterns: tuple[re.Pattern[str], ...]) -> int | None:
        for pattern in patterns:
            found = pattern.search(message)
            if found:
                return int(found[1])
        return None

    details = details or {}
    prompt = details.get("n_prompt_tokens")
    context = details.get("n_ctx")
    return {
        "prompt_tokens": prompt if isinstance(prompt, int) else first(_OVERFLOW_PROMPT),
        "context_tokens": context if isinstance(context, int) else first(_OVERFLOW_CONTEXT),
        "messages": messages,
        "message_bytes": message_bytes,
    }


def known_model(gateway: Gateway, model: str) -> None:
    """Refuse (404) a model that is neither a configured route nor `<provider>/<model-id>` of a
    configured provider."""
    if model not in gateway.policy.routes:
        gateway.router.resolve(model)


# ---------------------------------------------------------------------------------------------
# The service


class ThreadService:
    def __init__(self, store: Store, gateway: Gateway, config: StoreConfig) -> None:
        self.store = store
        self.gateway = gateway
        self.config = config
        self.limits = Limits(config.max_attachment_bytes)
        self.running: dict[str, Continuation] = {}

    # Threads

    async def create(self, owner: str, body: Any) -> dict[str, Any]:
        fields = _thread_fields(body if body is not None else {}, _CREATE_FIELDS)
        if fields.get("model"):
            known_model(self.gateway, fields["model"])
        thread_id = "thread_" + uuid.uuid4().hex
        try:
            thread = await self.store.create_thread(
                owner,
                thread_id,
                model=fields.get("model"),
                system=fields.get("system"),
                metadata=fields.get("metadata") or {},
            )
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None
        return thread_object(thread)

    async def update(self, owner: str, thread_id: str, body: Any) -> dict[str, Any]:
        fields = _thread_fields(body, _CREATE_FIELDS)
        if fields.get("model"):
            known_model(self.gateway, fields["model"])
        try:
            return thread_object(await self.store.update_thread(owner, thread_id, fields))
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None

    async def list_threads(self, owner: str, query: Mapping[str, str]) -> dict[str, Any]:
        limit, after, order = page_query(query, "desc")
        try:
            page = await self.store.list_threads(owner, limit=limit, after=after, order=order)
        except StoreError as exc:
            raise store_errors(None, exc) from None
        return list_object([thread_object(t) for t in page.items], page.has_more)

    async def get(self, owner: str, thread_id: str) -> dict[str, Any]:
        try:
            thread = await self.store.get_thread(owner, thread_id)
            page = await self.store.list_messages(
                owner, thread_id, limit=None, after=None, order="asc"
            )
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None
        return {**thread_object(thread), "messages": [message_object(m) for m in page.items]}

    async def delete(self, owner: str, thread_id: str) -> dict[str, Any]:
        try:
            await self.store.delete_thread(owner, thread_id)
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None
        return {"id": thread_id, "object": "thread.deleted", "deleted": True}

    # Messages

    async def post_json_messages(self, owner: str, thread_id: str, body: Any) -> dict[str, Any]:
        messages, single = parse_messages(body, self.limits)
        stored = await self._append(owner, thread_id, messages)
        if single:
            return message_object(stored[0])
        return list_object([message_object(m) for m in stored], False)

    async def post_multipart_message(
        self, owner: str, thread_id: str, body: bytes, content_type: str
    ) -> dict[str, Any]:
        message = parse_multipart(body, content_type, self.limits)
        stored = await self._append(owner, thread_id, [message])
        return message_object(stored[0])

    async def _append(self, owner: str, thread_id: str, messages: list[NewMessage]) -> list[Any]:
        try:
            return await self.store.append_messages(
                owner,
                thread_id,
                messages,
                check=check_append,
                max_thread_bytes=self.config.max_thread_attachment_bytes,
            )
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None

    async def list_messages(
        self, owner: str, thread_id: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        limit, after, order = page_query(query, "asc")
        try:
            page = await self.store.list_messages(
                owner, thread_id, limit=limit, after=after, order=order
            )
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None
        return list_object([message_object(m) for m in page.items], page.has_more)

    async def get_message(self, owner: str, thread_id: str, message_id: str) -> dict[str, Any]:
        try:
            await self.store.get_thread(owner, thread_id)
            return message_object(await self.store.get_message(owner, thread_id, message_id))
        except NotFound:
            # Say which one is missing: the thread, or the message in it.
            try:
                await self.store.get_thread(owner, thread_id)
            except NotFound:
                raise _not_found(thread_id) from None
            raise request_error(
                f"No message found with id {message_id!r} in thread {thread_id!r}.",
                status=404,
                code="message_not_found",
            ) from None
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None

    async def attachment(self, owner: str, thread_id: str, blob_hash: str) -> tuple[str, bytes]:
        try:
            return await self.store.get_attachment(owner, thread_id, blob_hash)
        except NotFound:
            raise request_error(
                f"No attachment {blob_hash!r} in thread {thread_id!r}.",
                status=404,
                code="attachment_not_found",
            ) from None
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None

    # Continuations

    async def cancel(self, owner: str, thread_id: str) -> dict[str, Any]:
        try:
            marked = await self.store.request_cancel(owner, thread_id)
        except StoreError as exc:
            raise store_errors(thread_id, exc) from None
        local = self.running.get(thread_id)
        if marked and local is not None:
            local.abort("cancelled")
        return {"id": thread_id, "object": "thread.cancel", "cancelled": marked}

    def abort_running(self) -> None:
        """End every running continuation with 503 `server_shutting_down`: svir stops."""
        for run in list(self.running.values()):
            run.abort("shutdown")

    async def shutdown(self) -> None:
        """Give back the leases of the continuations still running, before the store closes: on
        a graceful stop their threads are free at once rather than after lease_seconds."""
        running = list(self.running.values())
        self.abort_running()
        await asyncio.gather(*(run.release() for run in running), return_exceptions=True)

    def continuation(
        self, owner: str, thread_id: str, params: ContinueParams, ctx: CallContext,
        fields: dict[str, Any],
    ) -> Continuation:  # fmt: skip
        return Continuation(
            self, owner=owner, thread_id=thread_id, params=params, ctx=ctx, fields=fields
        )


_CREATE_FIELDS: Final = frozenset({"model", "system", "metadata"})
AbortReason = Literal["lost", "cancelled", "shutdown"]


class Continuation:
    """One run of /continue: take the thread's lease, send the thread, turn the answer into
    frames, store the answer when it completed, give the lease back."""

    def __init__(
        self,
        service: ThreadService,
        *,
        owner: str,
        thread_id: str,
        params: ContinueParams,
        ctx: CallContext,
        fields: dict[str, Any],
    ) -> None:  # fmt: skip
        self.service = service
        self.store = service.store
        self.owner = owner
        self.thread_id = thread_id
        self.params = params
        self.ctx = ctx
        self.fields = fields
        self.lease_id = uuid.uuid4().hex
        self.ttl = service.config.lease_seconds
        self.call: ChatCall | None = None
        self.messages = 0
        self.message_bytes: int | None = None
        self._held = False
        self._aborted = asyncio.Event()
        self._abort_reason: AbortReason | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def abort(self, reason: AbortReason) -> None:
        if self._abort_reason is None:
            self._abort_reason = reason
        self._aborted.set()

    async def start(self) -> None:
        """Everything up to the upstream's first byte; raises GatewayError when it fails."""
        store = self.store
        try:
            thread = await store.get_thread(self.owner, self.thread_id)
        except StoreError as exc:
            raise store_errors(self.thread_id, exc) from None
        model = self.params.model or thread.model
        if model is None:
            raise request_error(
                "model is required: the thread has no model of its own",
                param="model",
                code="missing_required_parameter",
            )
        # The thread holds the messages: they are read under the lease, below.
        request: dict[str, Any] = {**self.params.generation, "model": model, "stream": True}
        try:
            validate_chat_settings(request)
        except BadRequest as exc:
            raise invalid_request(exc) from None
        gateway = self.service.gateway
        known_model(gateway, model)
        try:
            thread, messages = await store.acquire(
                self.owner, self.thread_id, self.lease_id, ttl=self.ttl, check=check_continue
            )
        except StoreError as exc:
            raise store_errors(self.thread_id, exc) from None
        self._held = True
        self.messages = len(messages)
        self.service.running[self.thread_id] = self
        self._heartbeat = asyncio.ensure_future(self._beat())
        try:
            blobs = await store.blob_data(blob_hashes(messages))
            upstream = upstream_messages(thread, messages, blobs)
        except (StoreError, KeyError) as exc:
            error = StoreError(f"an attachment is missing: {exc}")
            raise store_errors(self.thread_id, error) from None
        del blobs
        request["messages"] = upstream
        self.message_bytes = len(_encode(upstream))
        opening = asyncio.ensure_future(gateway.open_chat(self.ctx, request))
        aborted = asyncio.ensure_future(self._aborted.wait())
        try:
            await asyncio.wait({opening, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
            if not opening.done():
                opening.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await opening
        if opening.cancelled():
            raise self._abort_error()
        failure = opening.exception()
        if isinstance(failure, GatewayError):
            upstream_error = failure.upstream
            details = upstream_error.details if upstream_error is not None else None
            raise self._failed(failure.error, details) from None
        if failure is not None:
            raise failure
        self.call = opening.result()

    def _failed(self, ce: ClientError, details: Mapping[str, Any] | None) -> ThreadError:
        extra: dict[str, Any] = {}
        if ce.code == "context_length_exceeded":
            extra["sizes"] = overflow_sizes(
                ce.message,
                details,
                messages=self.messages,
                message_bytes=self.message_bytes,
            )
        text = ce.message.rstrip()
        message = f"{text}{'' if text.endswith(('.', '!', '?')) else '.'} {NOTHING_APPENDED}"
        return ThreadError(msgspec.structs.replace(ce, message=message), **extra)

    def _abort_error(self) -> ThreadError:
        if self._abort_reason == "shutdown":
            ce = ClientError(
                503,
                "server_error",
                "server_shutting_down",
                f"svir is shutting down. {NOTHING_APPENDED}",
            )
        elif self._abort_reason == "cancelled":
            ce = ClientError(
                409,
                "invalid_request_error",
                "continuation_cancelled",
                f"The continuation was cancelled. {NOTHING_APPENDED}",
            )
        else:
            ce = ClientError(
                409,
                "invalid_request_error",
                "lease_lost",
                "The continuation lost its hold on the thread (its lease expired and another"
                f" continuation took it). {NOTHING_APPENDED}",
            )
        return ThreadError(ce)

    async def _beat(self) -> None:
        interval = min(self.ttl / 3, 5.0)
        while True:
            await asyncio.sleep(interval)
            try:
                state = await self.store.renew(self.thread_id, self.lease_id, ttl=self.ttl)
            except Exception:
                # The store may come back; finishing checks the lease again in any case.
                log.warning("could not renew the lease of thread %s", self.thread_id, exc_info=True)
                continue
            if state != "held":
                self.abort("cancelled" if state == "cancelled" else "lost")
                return

    async def frames(self) -> AsyncIterator[tuple[list[Frame | None], int]]:
        """The frames of each upstream read as one list, with the HTTP status of its last frame:
        a front end sends a list in one piece (one write for the events of one read). The last
        frame of all, a `done` or an `error` frame, waits on the store (the answer's commit, the
        lease given back): the frames of its read before it go out first, and its own list
        holds only what the commit adds (`tool_call`s, `usage`) and it. None is a keep-alive,
        given only once a frame went out; a read that makes no frame gives no list."""
        call = self.call
        assert call is not None
        answer = AnswerFold()
        started = False
        events = call.events()
        aborted = asyncio.ensure_future(self._aborted.wait())
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                if self._aborted.is_set():
                    yield await self._error_frame(self._abort_error())
                    return
                pending = asyncio.ensure_future(anext(events, None))
                await asyncio.wait({pending, aborted}, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await pending
                    pending = None
                    yield await self._error_frame(self._abort_error())
                    return
                batch = pending.result()
                pending = None
                if batch is None:
                    err = UpstreamError(ErrorKind.INCOMPLETE, "the upstream stream ended early")
                    yield await self._error_frame(self._failed(to_client_error(err), None))
                    return
                out: list[Frame | None] = []
                for ev in batch:
                    answer.add(ev)
                    kind = type(ev)
                    if kind is TextDelta:
                        started = True
                        out.append(frames.delta(ev.text))
                    elif kind is ReasoningDelta:
                        started = True
                        out.append(frames.reasoning(ev.text))
                    elif kind is RefusalDelta:
                        started = True
                        out.append(frames.refusal(ev.text))
                    elif kind is Keepalive:
                        if started:
                            out.append(None)
                    elif isinstance(ev, StreamError):
                        ce = to_client_error(ev.error, before_first_byte=not started)
                        if out:  # what the read showed goes out before the lease is given back
                            yield out, 200
                        yield await self._error_frame(self._failed(ce, ev.error.details))
                        return
                    elif kind is Done:
                        if out:  # what the read showed goes out before the answer's commit
                            yield out, 200
                        yield await self._complete(answer)
                        return
                if out:
                    yield out, 200
        finally:
            aborted.cancel()
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
            closer = getattr(events, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    async def _error_frame(self, exc: ThreadError) -> tuple[list[Frame | None], int]:
        """The final error frame (alone in its list), once the upstream is closed and the lease
        given back."""
        self.fields["error"] = exc.error.code or exc.error.type
        if self.call is not None:
            self.call.close()
        await self.release()
        return [frames.error(exc.error, **exc.extra)], exc.error.status

    async def _complete(self, answer: AnswerFold) -> tuple[list[Frame | None], int]:
        """The answer committed to the thread: its final frames (`tool_call`s, `usage`, `done`),
        or the error frame when the commit failed."""
        call = self.call
        assert call is not None
        text = "".join(answer.text)
        # The reasoning kept is that of the carrier the server used first (the one it takes back).
        carrier = call.reasoning_carrier
        thought = answer.reasoning_of(carrier)
        key = call.route.kind.reasoning_key
        if thought and carrier != "think" and key is not None and key != carrier:
            # The kind decides the key reasoning goes back under; this server used another.
            log.warning(
                "reasoning came as %r but provider %r sends it back as %r: set the provider's"
                " kind to the server's",
                carrier,
                call.route.provider.name,
                key,
            )
        calls = answer.tool_calls()
        usage = answer.usage
        finish_reason = answer.finish_reason or "stop"
        message = NewMessage(
            id=new_id(),
            role="assistant",
            content=[{"type": "text", "text": text}] if text else [],
            tool_calls=[openai_tool_call(c) for c in calls] or None,
            reasoning=thought or None,
            reasoning_carrier=carrier if thought else None,
            refusal="".join(answer.refusal) or None,
            finish_reason=finish_reason,
            model=call.model_label,
            usage=msgspec.structs.asdict(usage) if usage is not None else None,
        )
        try:
            state, stored = await self.store.finish(self.thread_id, self.lease_id, message)
        except StoreError as exc:
            err = store_errors(self.thread_id, exc)
            return await self._error_frame(ThreadError(err.error))
        if stored is None:
            self.abort("cancelled" if state == "cancelled" else "lost")
            return await self._error_frame(self._abort_error())
        self._held = False
        await self.release()  # the commit gave the lease back; this stops the renewals
        self.fields["message_id"] = stored.id
        out: list[Frame | None] = [frames.tool_call(c) for c in calls]
        if usage is not None:
            out.append(frames.usage(usage))
        out.append(frames.done(stored.id, finish_reason, text))
        return out, 200

    async def release(self) -> None:
        """Stop renewing, and give the lease back unless the answer's commit already did. Done
        before a final error frame goes out, so that a client that reads it may go on at once."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.service.running.get(self.thread_id) is self:
            del self.service.running[self.thread_id]
        if self._held:
            self._held = False
            try:
                await asyncio.shield(self.store.release(self.thread_id, self.lease_id))
            except Exception:
                # The lease then lapses by itself after lease_seconds.
                log.warning("could not release thread %s", self.thread_id, exc_info=True)

    async def close(self) -> None:
        if self.call is not None:
            self.call.close()
        await self.release()
