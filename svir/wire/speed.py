"""Generation speed (§3.6): tokens per second from the first visible token to the last."""

from __future__ import annotations

MIN_WINDOW = 0.05


class TokenRate:
    """Counts chunks that showed something, at times the caller reads from its own clock."""

    __slots__ = ("count", "first", "last")

    def __init__(self) -> None:
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None

    def tick(self, now: float, count: int = 1) -> None:
        """Record `count` visible tokens that arrived at `now` (seconds, any monotonic origin)."""
        if self.first is None:
            self.first = now
        self.last = now
        self.count += count

    @property
    def window(self) -> float | None:
        """Seconds from the first visible token to the last."""
        if self.first is None or self.last is None:
            return None
        return self.last - self.first

    @property
    def tokens_per_second(self) -> float | None:
        """The rate, or None when there is no honest one (one token, or a window under 50 ms)."""
        window = self.window
        if self.count < 2 or window is None or window < MIN_WINDOW:
            return None
        # The first token opens the window: count the intervals between tokens.
        return (self.count - 1) / window
