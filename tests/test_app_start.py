"""What the app's start-up does to the process (svir.edges.app's lifespan): what start-up built is
frozen out of the garbage collector's way, and the young generation is collected less often. And
how servers see the app: an ASGI 3 app, though its `__call__` returns the coroutine it runs."""

from __future__ import annotations

import asyncio
import gc
import inspect
import sys

import uvicorn

from svir.config.load import parse_config
from svir.edges.app import YOUNG_GC_THRESHOLD, App
from tests.support.asgi import Lifespan


async def test_start_up_freezes_what_it_built_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default
    try:
        lifespan = Lifespan(App(parse_config(""), {}))
        await lifespan.start()
        try:
            assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
            assert gc.get_freeze_count() > 0
        finally:
            await lifespan.stop()
    finally:
        gc.set_threshold(*before)


def test_servers_see_an_asgi3_app() -> None:
    """uvicorn picks ASGI 2 or 3 by whether `__call__` is a coroutine function: it must say 3,
    else it wraps the app in its ASGI 2 adapter, which calls it with the scope alone."""
    app = App(parse_config(""), {})
    if sys.version_info >= (3, 12):
        assert inspect.iscoroutinefunction(app.__call__)
    else:
        assert asyncio.iscoroutinefunction(app.__call__)
    config = uvicorn.Config(app, log_level="error")
    config.load()
    assert config.interface == "asgi3"
