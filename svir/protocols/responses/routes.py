"""OpenAI's Responses API (docs/responses.md): what Codex, the Agents SDK and the OpenAI SDK's
`client.responses` speak.

    POST   /v1/responses                          a response: SSE stream, or one object
    GET    /v1/responses/{response_id}            a stored response
    DELETE /v1/responses/{response_id}            delete it
    GET    /v1/responses/{response_id}/input_items  its input items, OpenAI's list (order, after,
                                                  limit)

The request becomes the canonical chat request by svir.protocols.responses.request (what it dropped
is said in `x-svir-warning`); the canonical events become the Responses stream, or its response
object, by svir.protocols.responses.encode. Errors are OpenAI's shape with `param`; a stream that
fails after its start ends with `response.failed`, and one whose call ends without an end gets one
too: a Responses stream never just ends (Codex reports "stream closed before response.completed").

State: with `store` (the default, as OpenAI's) the response (its request's input items, its output
items and the response object) is written to svir's store before `response.completed` is sent, or
before the answer not streamed, so that a request naming it as `previous_response_id` right after
finds it; `store: false` writes nothing. A response belongs to the bearer token that made it (as a
thread does: svir.protocols.http.owner_of); any other gets 404. Reasoning items sent back with
`encrypted_content` are opened with a random key kept in the store (every replica on it shares
it), made on first use.

A streamed answer whose upstream has shown nothing by its provider's commit deadline
(`timeouts.commit_deadline`) starts anyway (`response.created`, `response.in_progress`: svir.
frontends.http `EarlyStart`), then keeps the connection alive every `keepalive_every` seconds (well
inside Codex's idle timeout, 300 s) and for each of the upstream's own keep-alives until the
output comes, as the Anthropic front end does; a failure after that start is `response.failed`,
not retried.
"""

from __future__ import annotations

import abc
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from svir.asgi import Receive, Scope, Send
from svir.call import CallContext
from svir.chat import ChatCall, unique_id
from svir.errors import GatewayError, NotFound, StoreError, request_error
from svir.protocols.http import (
    KEEPALIVE_EVERY,
    WARNING_HEADER,
    EarlyStart,
    UntilDisconnect,
    merge_headers,
    new_call_context,
    open_early,
    owner_of,
    query_params,
    read_json,
    send_json,
    warning_header,
)
from svir.protocols.responses.checks import ResponsesRequestError
from svir.protocols.responses.encode import ResponseStreamEncoder
from svir.protocols.responses.request import ResponsesRequest, translate_request
from svir.protocols.responses.sealed import NONCE_BYTES, seal_reasoning, unseal_reasoning
from svir.protocols.router import Host
from svir.providers import validate_chat_request
from svir.threads.service import list_object, page_query
from svir.wire.classify import ClientError, to_client_error
from svir.wire.events import StreamError

__all__ = ["ResponseStore", "ResponsesAPI", "StoredResponse", "install"]

log = logging.getLogger("svir.responses")

PREFIX: Final = "/v1/responses"
# The store's name of the key that seals reasoning items.
SEAL_SECRET: Final = "responses.reasoning"
_STORE_CLOSED: Final = GatewayError(
    ClientError(503, "server_error", "store_unavailable", "The response store is not open.")
)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: what a continuation needs (its request's input items and its output
    items, both in the Responses API's item shapes) and what retrieval answers."""

    id: str
    owner: str
    created_at: float
    model: str
    previous_response_id: str | None
    input_items: list[dict[str, Any]]
    output_items: list[dict[str, Any]]
    response: dict[str, Any]


class ResponseStore(abc.ABC):
    """Where responses live (svir.store.responses). Every method that takes an owner answers
    NotFound for a response of another owner, exactly as for one that does not exist."""

    dialect: str

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def put(self, record: StoredResponse) -> None: ...

    @abc.abstractmethod
    async def get(self, owner: str, response_id: str) -> StoredResponse: ...

    @abc.abstractmethod
    async def delete(self, owner: str, response_id: str) -> None: ...

    @abc.abstractmethod
    async def chain(self, owner: str, response_id: str) -> list[StoredResponse]:
        """The response and those it continues, oldest first (a deleted one ends the chain)."""

    @abc.abstractmethod
    async def secret(self, name: str) -> bytes:
        """A random secret kept under `name`, made on first use, the same for every replica."""


def install(
    app: Host, store: ResponseStore, *, keepalive_every: float = KEEPALIVE_EVERY
) -> ResponsesAPI:
    """Serve the Responses API on `app` over `store`, opened at start-up and closed at shut-down
    (the composition root makes it: svir.server)."""
    api = ResponsesAPI(app, store, keepalive_every=keepalive_every)
    app.routes.add("POST", PREFIX, api.create)
    app.routes.add("GET", PREFIX + "/{response_id}", api.retrieve)
    app.routes.add("DELETE", PREFIX + "/{response_id}", api.delete)
    app.routes.add("GET", PREFIX + "/{response_id}/input_items", api.input_items)
    app.on_startup(api.startup)
    app.on_shutdown(api.shutdown)
    return api


def _not_found(response_id: str, param: str | None = None) -> GatewayError:
    what = "Previous response" if param == "previous_response_id" else "Response"
    return request_error(
        f"{what} with id {response_id!r} not found.",
        status=404,
        code="previous_response_not_found" if param else "not_found",
        param=param,
    )


def _store_failed(exc: StoreError) -> GatewayError:
    return GatewayError(
        ClientError(503, "server_error", "store_unavailable", f"The response store failed: {exc}")
    )


def _call_ids(chat: dict[str, Any]) -> set[str]:
    """The ids of the calls a chat request's conversation holds."""
    # Loops, not a comprehension: most conversations hold no call, and pay only the walk.
    ids: set[str] = set()
    for message in chat.get("messages", ()):
        calls = message.get("tool_calls")
        if calls:
            for call in calls:
                ids.add(str(call.get("id")))
    return ids


def _new_id(prefix: str) -> str:
    """A new item's id (`msg_…`): unique, as the input_items list pages by id."""
    return f"{prefix}_{unique_id()}"


def _sealer(key: bytes) -> Callable[[str], str]:
    def seal(text: str) -> str:
        return seal_reasoning(key, text, nonce=os.urandom(NONCE_BYTES))

    return seal


class ResponsesAPI:
    def __init__(
        self,
        app: Host,
        store: ResponseStore,
        *,
        keepalive_every: float = KEEPALIVE_EVERY,
    ) -> None:
        self.gateway = app.gateway
        self.max_body_bytes = app.config.server.max_body_bytes
        self.keepalive_every = keepalive_every
        self._store = store
        # The store while it is open (None: a 503).
        self.store: ResponseStore | None = None
        self._seal_key: bytes | None = None
        # `unseal_reasoning` bound to that key, made once with it.
        self._unseal: Callable[[str], str | None] | None = None

    async def startup(self) -> None:
        await self._store.open()
        self.store = self._store
        log.info("response store open", extra={"fields": {"store": self._store.dialect}})

    async def shutdown(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            await store.close()

    def _open(self) -> ResponseStore:
        if self.store is None:
            raise _STORE_CLOSED
        return self.store

    # POST /v1/responses

    async def create(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        fields["api"] = "responses"
        body = await read_json(scope, receive, self.max_body_bytes)
        store = self._open()
        history = await _history(store, scope, body)
        key, unseal = await self._sealing(store)
        try:
            translated = translate_request(body, history=history, unseal=unseal, new_id=_new_id)
        except ResponsesRequestError as exc:
            raise request_error(exc.message, param=exc.param) from None
        request = validate_chat_request(translated.chat)
        if translated.cache_key and "prompt_cache_key" not in request:
            # The policy keeps one key's calls on one deployment (svir.policy.resilience.pick).
            request["prompt_cache_key"] = translated.cache_key
        fields["stream"] = translated.stream
        headers = {"x-request-id": rid}
        if translated.warnings:
            headers[WARNING_HEADER] = warning_header(translated.warnings)
        user = request.get("user")
        response_id = "resp_" + unique_id()
        encoder = ResponseStreamEncoder(
            id=response_id,
            model=str(body["model"]),
            created_at=int(time.time()),
            echo=translated.echo,
            summary=translated.summary,
            names=translated.names,
            seal=_sealer(key) if translated.include_encrypted else None,
            taken_call_ids=_call_ids(translated.chat),
        )
        keep = None
        if translated.store:
            keep = _keeper(
                store, scope, translated, encoder, response_id=response_id, model=str(body["model"])
            )
        early: EarlyStart | None = None
        if request.get("stream"):
            early = EarlyStart(
                send,
                headers,
                first=encoder.start,
                ping=encoder.keepalive,
                fail=lambda exc: encoder.error(exc.error),
                relay=lambda _comment: encoder.keepalive(),
                every=self.keepalive_every,
            )
        ctx = new_call_context(
            scope,
            rid,
            "responses",
            client_user=user if isinstance(user, str) else None,
            early=early,
        )
        with UntilDisconnect(scope, receive):
            return await self._serve(ctx, request, encoder, keep, early, send=send, headers=headers)

    async def _sealing(self, store: ResponseStore) -> tuple[bytes, Callable[[str], str | None]]:
        """The key reasoning is sealed with, and the unsealer of what it sealed: the store's
        secret, the same for every replica and for ever, read once."""
        key, unseal = self._seal_key, self._unseal
        if key is None or unseal is None:
            try:
                key = self._seal_key = await store.secret(SEAL_SECRET)
            except StoreError as exc:
                raise _store_failed(exc) from None
            unseal = self._unseal = functools.partial(unseal_reasoning, key)
        return key, unseal

    async def _serve(
        self,
        ctx: CallContext,
        request: dict[str, Any],
        encoder: ResponseStreamEncoder,
        keep: Callable[[], Awaitable[None]] | None,
        early: EarlyStart | None,
        *,
        send: Send,
        headers: dict[str, str],
    ) -> int:
        call = await open_early(self.gateway.open_chat(ctx, request), early)
        if call is None:
            return 200  # the started stream ended with the failure
        merge_headers(headers, call.headers)
        try:
            if early is None:
                await self._answer(call, encoder, keep, send, headers)
                return 200

            def ends(data: bytes) -> bool:
                # The piece that ends the response is the last: it goes with the body's end.
                return encoder.ended

            # The encoder writes `response.created` with the first event (or `close`'s failure
            # when the events run out without an end); the early start may have sent it.
            pieces: AsyncIterator[bytes] = call.encoded(encoder.encode, encoder.close)
            if keep is not None:
                pieces = _Kept(call, encoder, keep)
            await early.stream(pieces, last=ends)
            return 200
        finally:
            call.close()  # at once, also when cancelled: the upstream stops with the client

    async def _answer(
        self,
        call: ChatCall,
        encoder: ResponseStreamEncoder,
        keep: Callable[[], Awaitable[None]] | None,
        send: Send,
        headers: dict[str, str],
    ) -> None:
        """The answer not streamed: the response object the stream would have ended with (a
        failure is an HTTP error)."""
        encoder.start()
        encode = encoder.encode
        async for events in call.events():
            for event in events:
                if type(event) is StreamError:
                    raise GatewayError(to_client_error(event.error), event.error)
                encode(event)
        if keep is not None:
            await keep()
        await send_json(send, 200, encoder.response, headers)

    # GET /v1/responses/{id}, DELETE, input_items

    async def _record(self, scope: Scope) -> StoredResponse:
        response_id: str = scope["path_params"]["response_id"]
        try:
            return await self._open().get(owner_of(scope), response_id)
        except NotFound:
            raise _not_found(response_id) from None
        except StoreError as exc:
            raise _store_failed(exc) from None

    async def retrieve(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        record = await self._record(scope)
        await send_json(send, 200, record.response, {"x-request-id": rid})
        return 200

    async def delete(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        response_id: str = scope["path_params"]["response_id"]
        try:
            await self._open().delete(owner_of(scope), response_id)
        except NotFound:
            raise _not_found(response_id) from None
        except StoreError as exc:
            raise _store_failed(exc) from None
        answer = {"id": response_id, "object": "response", "deleted": True}
        await send_json(send, 200, answer, {"x-request-id": rid})
        return 200

    async def input_items(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        limit, after, order = page_query(query_params(scope), "desc")
        record = await self._record(scope)
        items = record.input_items if order == "asc" else record.input_items[::-1]
        if after is not None:
            at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
            if at is None:
                raise request_error(
                    f"after: {after!r} is not an id in this list",
                    param="after",
                    code="invalid_cursor",
                )
            items = items[at + 1 :]
        page = list_object(items[:limit], len(items) > limit)
        await send_json(send, 200, page, {"x-request-id": rid})
        return 200


async def _history(store: ResponseStore, scope: Scope, body: Any) -> list[dict[str, Any]]:
    """The items of the responses a request continues (its `previous_response_id`'s chain),
    oldest first: each one's input, then its output."""
    history: list[dict[str, Any]] = []
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if isinstance(previous, str) and previous:
        try:
            chain = await store.chain(owner_of(scope), previous)
        except NotFound:
            raise _not_found(previous, "previous_response_id") from None
        except StoreError as exc:
            raise _store_failed(exc) from None
        for earlier in chain:
            history += earlier.input_items
            history += earlier.output_items
    return history


def _keeper(
    store: ResponseStore,
    scope: Scope,
    translated: ResponsesRequest,
    encoder: ResponseStreamEncoder,
    *,
    response_id: str,
    model: str,
) -> Callable[[], Awaitable[None]]:
    """What keeps the response `encoder` makes, once it is finished (`store: true`)."""
    # Only what is kept has an owner: a `store: false` request hashes no token.
    owner = owner_of(scope)

    def record() -> StoredResponse:
        return StoredResponse(
            id=response_id,
            owner=owner,
            created_at=time.time(),
            model=model,
            previous_response_id=translated.previous_response_id,
            input_items=list(translated.input_items),
            output_items=encoder.output_items,
            response=encoder.response,
        )

    return functools.partial(_keep, store, record)


async def _keep(store: ResponseStore, record: Callable[[], StoredResponse]) -> None:
    """Write the finished response. A store that fails costs the continuation, not the answer
    the client is being sent: logged, and the answer goes on."""
    stored = record()
    try:
        await store.put(stored)
    except StoreError as exc:
        log.warning(
            "response not stored", extra={"fields": {"response_id": stored.id, "error": str(exc)}}
        )


class _Kept:
    """The stream's pieces (`ChatCall.encoded`), the response kept (`keep`) before the piece that
    ends it is sent. A stream whose events ran out before its end is not kept (it ends with
    `close`'s failure)."""

    __slots__ = ("_encoder", "_keep", "_pieces")

    def __init__(
        self, call: ChatCall, encoder: ResponseStreamEncoder, keep: Callable[[], Awaitable[None]]
    ) -> None:
        self._encoder = encoder
        self._keep: Callable[[], Awaitable[None]] | None = keep
        self._pieces = call.encoded(encoder.encode, self._ran_out)

    def _ran_out(self) -> bytes:
        self._keep = None
        return self._encoder.close()

    def __aiter__(self) -> _Kept:
        return self

    async def __anext__(self) -> bytes:
        data = await anext(self._pieces)
        keep = self._keep
        if keep is not None and self._encoder.ended:
            self._keep = None
            await keep()
        return data
