"""The event types are final: svir dispatches on an event's exact type (`type(ev) is TextDelta`,
a dict keyed by type), not on isinstance, because a failing isinstance against a msgspec Struct
class costs several times an identity test, on every event. A subclass of an event type would
slip through those dispatches unseen; this test says so first."""

from __future__ import annotations

import importlib
import pkgutil
import typing

import svir
from svir.wire.answer import AnswerFold
from svir.wire.events import Event, Finish, TextDelta


def _load_all_of_svir() -> None:
    for module in pkgutil.walk_packages(svir.__path__, "svir."):
        if module.name.startswith("svir.__main__"):
            continue
        importlib.import_module(module.name)


def test_no_module_of_svir_subclasses_an_event_type() -> None:
    _load_all_of_svir()
    kinds = typing.get_args(Event)
    assert len(kinds) == 14
    subclassed = {kind.__name__: kind.__subclasses__() for kind in kinds if kind.__subclasses__()}
    assert subclassed == {}


def test_the_fold_takes_each_event_by_its_type() -> None:
    fold = AnswerFold()
    for event in (TextDelta("a"), TextDelta("b"), Finish("stop")):
        fold.add(event)
    assert fold.text == ["a", "b"]
    assert fold.finish_reason == "stop"
