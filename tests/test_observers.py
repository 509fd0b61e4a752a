"""The one place observers are told (svir.observers.Observers): every moment reaches each observer
in the order they were composed, an attempt's closers are those the observers gave (none for one
that gave nothing), a failing observer of a request's end is logged and the next still hears of
it, and an app's observers are composed once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from svir.call import CallContext
from svir.chat import CloseHook
from svir.observers import (
    AttemptStarted,
    CallOpened,
    CallSettled,
    Observer,
    Observers,
    RequestEnded,
)


class Notes(Observer):
    """Notes each moment it is told of, under its name."""

    def __init__(self, name: str, heard: list[str], *, closes: bool = True) -> None:
        self.name = name
        self.heard = heard
        self.closes = closes

    def attempt(self, event: AttemptStarted) -> CloseHook | None:
        self.heard.append(f"{self.name} attempt")
        if not self.closes:
            return None
        return lambda call: self.heard.append(f"{self.name} closed")

    def opened(self, event: CallOpened) -> None:
        self.heard.append(f"{self.name} opened")

    def settled(self, event: CallSettled) -> None:
        self.heard.append(f"{self.name} settled")

    def ended(self, event: RequestEnded) -> None:
        self.heard.append(f"{self.name} ended {event.fields['status']}")


class Quiet(Observer):
    """Writes no moment: each does nothing."""


class Failing(Observer):
    def ended(self, event: RequestEnded) -> None:
        raise RuntimeError("broken")


def test_each_moment_reaches_every_observer_in_the_order_composed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []
    observers = Observers()
    assert not observers  # nobody yet: a caller makes no event
    observers.compose([Notes("a", heard), Failing(), Notes("b", heard, closes=False)])
    assert observers
    ctx = CallContext("r", "openai")
    call: Any = object()
    closers = observers.attempt(AttemptStarted(None, {}, ctx))  # type: ignore[arg-type]
    assert heard == ["a attempt", "b attempt"]
    assert len(closers) == 1  # b gave nothing to run at the attempt's close
    closers[0](call)
    observers.opened(CallOpened(ctx, call))
    record: Any = None
    observers.settled(CallSettled(ctx, record))
    caplog.set_level(logging.ERROR)
    observers.ended(RequestEnded("/v1/chat/completions", "POST", {"status": 200}, ctx))
    assert heard[2:] == [
        "a closed",
        "a opened",
        "b opened",
        "a settled",
        "b settled",
        "a ended 200",
        "b ended 200",
    ]
    assert [r.getMessage() for r in caplog.records] == ["request end hook failed"]


def test_an_apps_observers_are_composed_once() -> None:
    observers = Observers()
    observers.compose([Quiet()])
    with pytest.raises(AssertionError):
        observers.compose([Quiet()])


def test_an_observer_that_does_not_watch_attempts_gives_nothing_to_run_at_their_close() -> None:
    none: Any = None
    assert Quiet().attempt(AttemptStarted(none, {}, CallContext("r", "openai"))) is None
