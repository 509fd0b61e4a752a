"""What watches the flow of requests and calls (the metrics, the traces, the ledger, the console,
capture): one interface, `Observer`, told of four moments by frozen event records, and the one
place that tells them, `Observers`, which the gateway holds and `svir.server.build_app`
composes once, in order.

The four moments, each told by the one who sees it: an upstream attempt about to be sent (the
policy: `AttemptStarted`; an observer may give back what the attempt's close runs), a call the key
gate let through streaming (the gate: `CallOpened`), what a call came to, refused, failed or served
(the gate: `CallSettled`, with its `CallRecord`), and an HTTP request that ended (the app:
`RequestEnded`, with its log fields, status and duration set).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

if TYPE_CHECKING:
    from svir.call import CallContext, CallRecord
    from svir.chat import Call, CloseHook, UpstreamTarget

__all__ = [
    "AttemptStarted",
    "CallOpened",
    "CallSettled",
    "Observer",
    "Observers",
    "RequestEnded",
]

log = logging.getLogger("svir.access")


# Frozen msgspec Structs: a few are made per request, and a Struct is made in a fraction of the
# time a frozen dataclass takes.
class AttemptStarted(msgspec.Struct, frozen=True):
    """An upstream attempt about to be sent: the deployment's route, the request it sends (the
    served model's id in it) and its call's context."""

    route: UpstreamTarget
    request: dict[str, Any]
    ctx: CallContext


class CallOpened(msgspec.Struct, frozen=True):
    """A call the key gate let through, opened (its answer streams now)."""

    ctx: CallContext
    call: Call


class CallSettled(msgspec.Struct, frozen=True):
    """What a call came to: refused by svir, failed at every upstream tried, or served and
    closed; `record` is the ledger's row."""

    ctx: CallContext
    record: CallRecord


class RequestEnded(msgspec.Struct, frozen=True):
    """An HTTP request that ended: the template of the route it matched (None: no route), its
    method, its log fields (status and duration set; read, never written) and the context of the
    call it made, if it made one."""

    route: str | None
    method: str
    fields: dict[str, Any]
    call: CallContext | None


class Observer(Protocol):
    """What watches requests and calls. Each moment does nothing unless an observer says what it
    does: an implementation subclasses this and writes the moments it watches."""

    def attempt(self, event: AttemptStarted) -> CloseHook | None:
        """An attempt is about to be sent; what is given back runs when the attempt closes."""
        return None

    def opened(self, event: CallOpened) -> None:
        """A call streams."""
        return None

    def settled(self, event: CallSettled) -> None:
        """A call came to its end (one of these for every call the gate saw)."""
        return None

    def ended(self, event: RequestEnded) -> None:
        """An HTTP request ended, before its access line is written."""
        return None


class Observers:
    """The observers of one app, composed once (`compose`, by build_app), in the order each
    moment tells them; the one place they are called. False while there is none, so that a caller
    makes no event for nobody. Each moment calls only the observers that watch it (that write the
    method): most watch one or two of the four, and a call that does nothing costs as much as one
    that does."""

    __slots__ = ("_all", "_attempt", "_ended", "_opened", "_settled")

    def __init__(self) -> None:
        self._all: tuple[Observer, ...] = ()
        self._attempt: tuple[Callable[[AttemptStarted], CloseHook | None], ...] = ()
        self._opened: tuple[Callable[[CallOpened], None], ...] = ()
        self._settled: tuple[Callable[[CallSettled], None], ...] = ()
        self._ended: tuple[Callable[[RequestEnded], None], ...] = ()

    def compose(self, observers: Iterable[Observer]) -> None:
        """Watch with `observers`, in this order, from now on (once: the pipeline is built
        once)."""
        assert not self._all, "an app's observers are composed once"
        self._all = tuple(observers)
        self._attempt = tuple(o.attempt for o in self._all if _watches(o, "attempt"))
        self._opened = tuple(o.opened for o in self._all if _watches(o, "opened"))
        self._settled = tuple(o.settled for o in self._all if _watches(o, "settled"))
        self._ended = tuple(o.ended for o in self._all if _watches(o, "ended"))

    def __bool__(self) -> bool:
        return bool(self._all)

    def attempt(self, event: AttemptStarted) -> list[CloseHook]:
        """Tell each observer of the attempt; what their closes run, in order."""
        closers: list[CloseHook] = []
        for attempt in self._attempt:
            closer = attempt(event)
            if closer is not None:
                closers.append(closer)
        return closers

    def opened(self, event: CallOpened) -> None:
        for opened in self._opened:
            opened(event)

    def settled(self, event: CallSettled) -> None:
        for settled in self._settled:
            settled(event)

    def ended(self, event: RequestEnded) -> None:
        # Past the answer: an observer's failure is logged, and the next still hears of it.
        for ended in self._ended:
            try:
                ended(event)
            except Exception:
                log.exception("request end hook failed")


def _watches(observer: Observer, moment: str) -> bool:
    """Whether `observer` writes `moment` (else it is Observer's, which does nothing)."""
    return getattr(type(observer), moment, None) is not getattr(Observer, moment)
