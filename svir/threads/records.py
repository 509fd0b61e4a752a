"""What a thread store holds and the interface every store implements (`Store`), apart from the
SQL that implements it (svir/store/), so that the threads core reads records without importing an
edge. Every method that takes an owner answers NotFound for a thread of another owner.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

__all__ = [
    "AcquireCheck",
    "AppendCheck",
    "LeaseState",
    "MessageRecord",
    "NewBlob",
    "NewMessage",
    "Order",
    "Page",
    "Store",
    "ThreadRecord",
]

LeaseState = Literal["held", "lost", "cancelled"]
Order = Literal["asc", "desc"]


@dataclass(frozen=True, slots=True)
class ThreadRecord:
    id: str
    owner: str
    created_at: float
    updated_at: float
    model: str | None
    system: str | None
    metadata: dict[str, str]
    busy: bool
    message_count: int
    attachment_bytes: int


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: str
    thread_id: str
    seq: int
    created_at: float
    role: str
    content: list[dict[str, Any]]
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_carrier: str | None = None
    refusal: str | None = None
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NewBlob:
    """An attachment's bytes, named by their SHA-256 (hex)."""

    hash: str
    data: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append; its content parts name the blobs it carries by hash."""

    id: str
    role: str
    content: list[dict[str, Any]]
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_carrier: str | None = None
    refusal: str | None = None
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    blobs: tuple[NewBlob, ...] = field(default=())


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


# Checks the service runs inside the store's transaction, on what the thread holds at that moment.
AppendCheck = Callable[[list[MessageRecord], Sequence[NewMessage]], None]
AcquireCheck = Callable[[ThreadRecord, list[MessageRecord]], None]


class Store(abc.ABC):
    """Where threads live. Every method that takes an owner answers NotFound for a thread that
    exists but belongs to another owner, exactly as for one that does not exist."""

    dialect: str

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, and apply the schema migrations this version knows and the database lacks."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def schema_version(self) -> int: ...

    @abc.abstractmethod
    async def create_thread(
        self,
        owner: str,
        thread_id: str,
        *,
        model: str | None,
        system: str | None,
        metadata: Mapping[str, str],
    ) -> ThreadRecord: ...

    @abc.abstractmethod
    async def update_thread(
        self, owner: str, thread_id: str, changes: Mapping[str, Any]
    ) -> ThreadRecord:
        """Change `model`, `system` or `metadata` (the keys given in `changes`)."""

    @abc.abstractmethod
    async def get_thread(self, owner: str, thread_id: str) -> ThreadRecord: ...

    @abc.abstractmethod
    async def list_threads(
        self, owner: str, *, limit: int, after: str | None, order: Order
    ) -> Page[ThreadRecord]: ...

    @abc.abstractmethod
    async def delete_thread(self, owner: str, thread_id: str) -> None:
        """Delete a thread, its messages and the attachments no other thread uses; Busy while a
        continuation holds it."""

    @abc.abstractmethod
    async def list_messages(
        self, owner: str, thread_id: str, *, limit: int | None, after: str | None, order: Order
    ) -> Page[MessageRecord]: ...

    @abc.abstractmethod
    async def get_message(self, owner: str, thread_id: str, message_id: str) -> MessageRecord: ...

    @abc.abstractmethod
    async def append_messages(
        self,
        owner: str,
        thread_id: str,
        messages: Sequence[NewMessage],
        *,
        check: AppendCheck,
        max_thread_bytes: int,
    ) -> list[MessageRecord]:
        """Append in one transaction, after `check(tail, messages)` passed; `tail` is the thread's
        messages from its last assistant message on (or its last message when it has none).
        Busy while a continuation holds the thread; LimitExceeded past `max_thread_bytes`."""

    @abc.abstractmethod
    async def acquire(
        self, owner: str, thread_id: str, lease_id: str, *, ttl: float, check: AcquireCheck
    ) -> tuple[ThreadRecord, list[MessageRecord]]:
        """Take the thread's lease for `ttl` seconds, after `check(thread, messages)` passed, and
        return the thread and all its messages as they were when it was taken. Busy when another
        lease is live."""

    @abc.abstractmethod
    async def renew(self, thread_id: str, lease_id: str, *, ttl: float) -> LeaseState: ...

    @abc.abstractmethod
    async def finish(
        self, thread_id: str, lease_id: str, message: NewMessage
    ) -> tuple[LeaseState, MessageRecord | None]:
        """Append the answer and give the lease back, in one transaction: ("held", the message).
        Nothing is written when the lease is no longer held ("lost") or its continuation was
        cancelled ("cancelled")."""

    @abc.abstractmethod
    async def release(self, thread_id: str, lease_id: str) -> None:
        """Give the lease back, if it is still this one."""

    @abc.abstractmethod
    async def request_cancel(self, owner: str, thread_id: str) -> bool:
        """Mark the running continuation cancelled; False when none runs."""

    @abc.abstractmethod
    async def blob_data(self, hashes: Sequence[str]) -> dict[str, bytes]: ...

    @abc.abstractmethod
    async def get_attachment(self, owner: str, thread_id: str, blob_hash: str) -> tuple[str, bytes]:
        """The media type and bytes of an attachment of this thread."""
