"""State keyed by model names, held within a bound whatever names clients invent.

A client may ask for any `<provider>/<model-id>`, and some servers answer every id they are sent.
What svir keeps per name (a deployment's breaker and in-flight count, when Ollama's `/api/ps` last
saw a model) is a `BoundedMap`: every entry whose key `keep` accepts (the configured and discovered
models, a set the config and the upstreams bound, see `Router.known`) and at most `cap` others.
Past the cap the least recently used other is forgotten, first among those `idle` says hold
nothing worth keeping (a closed breaker with nothing in flight), else the least recently used
outright: the bound holds even when a client makes every entry busy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["BoundedMap"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _never(key: object) -> bool:
    return False


class BoundedMap(Generic[K, V]):
    """A dict of the kept keys plus at most `cap` others, least recently used first out."""

    __slots__ = ("_kept", "_others", "cap", "idle", "keep")

    def __init__(
        self,
        cap: int,
        *,
        keep: Callable[[K], bool] = _never,
        idle: Callable[[V], bool] | None = None,
    ) -> None:
        if cap < 0:
            raise ValueError(f"cap must be 0 or more, not {cap}")
        self.cap = cap
        self.keep = keep
        self.idle = idle
        self._kept: dict[K, V] = {}
        self._others: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept) + len(self._others)

    def __contains__(self, key: K) -> bool:
        return key in self._kept or key in self._others

    def get(self, key: K) -> V | None:
        """The entry, now the most recently used; None if there is none."""
        kept = self._kept
        if key in kept:
            return kept[key]
        return self._touch_other(key) if key in self._others else None

    def setdefault(self, key: K, make: Callable[[], V]) -> V:
        """The entry for `key`, made with `make()` if there is none."""
        # A kept key first, inline: every call of a configured or listed model asks for one.
        kept = self._kept
        if key in kept:
            return kept[key]
        if key in self._others:
            return self._touch_other(key)
        value = self[key] = make()
        return value

    def _touch_other(self, key: K) -> V:
        if self.keep(key):
            # Listed since it came (discovery ran): held from now on as the configured ones are.
            value = self._kept[key] = self._others.pop(key)
            return value
        self._others.move_to_end(key)
        return self._others[key]

    def __setitem__(self, key: K, value: V) -> None:
        if key in self._kept:
            self._kept[key] = value
        elif key in self._others:
            self._others[key] = value
            self._others.move_to_end(key)
        elif self.keep(key):
            self._kept[key] = value
        elif self.cap:
            if len(self._others) >= self.cap:
                self._evict()
            self._others[key] = value
        # cap 0: only kept keys are held; the caller's value lives on without an entry.

    def __delitem__(self, key: K) -> None:
        if key in self._kept:
            del self._kept[key]
        else:
            del self._others[key]

    def items(self) -> list[tuple[K, V]]:
        return [*self._kept.items(), *self._others.items()]

    def _evict(self) -> None:
        idle = self.idle
        if idle is not None:
            victim = next((k for k, v in self._others.items() if idle(v)), None)
            if victim is not None:
                del self._others[victim]
                return
        self._others.popitem(last=False)
