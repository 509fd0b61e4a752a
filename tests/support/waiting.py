"""Waiting in a test for something to happen: poll for it, bounded by `PATIENCE`.

The bound only catches a hang: it is far past anything a loaded or slow machine takes, and a test
never asserts how long a thing took (a slow machine only takes longer to pass).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["PATIENCE", "eventually", "wait_until"]

PATIENCE = 60.0  # seconds: how long a test waits for what should happen at once


def wait_until(check: Callable[[], bool], what: str, timeout: float = PATIENCE) -> None:
    """Return once `check()` holds; fail naming `what` if it does not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.01)


async def eventually(check: Callable[[], bool], what: str, timeout: float = PATIENCE) -> None:
    """`wait_until` for a coroutine: the loop runs on while it waits."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.005)
