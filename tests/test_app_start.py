"""What starting an app does to the process: nothing of its own, but under `svir serve`
(svir.server.tune_the_process) what start-up built is frozen out of the garbage collector's way,
the young generation is collected less often, and log records skip what no line shows. And how
servers see the app: an ASGI 3 app, though its `__call__` returns the coroutine it runs."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import sys

import uvicorn

from svir.config.load import parse_config
from svir.edges.app import App
from svir.server import YOUNG_GC_THRESHOLD, tune_the_process
from tests.support.asgi import Lifespan


async def test_an_apps_start_up_leaves_the_process_alone() -> None:
    # Two apps in one process (or svir embedded in another program) share the collector and the
    # logging module: an app's own start-up sets neither.
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default
    frozen = gc.get_freeze_count()
    srcfile = logging._srcfile
    try:
        lifespan = Lifespan(App(parse_config(""), {}))
        await lifespan.start()
        try:
            assert gc.get_threshold() == (700, 10, 10)
            assert gc.get_freeze_count() == frozen
            assert logging._srcfile == srcfile is not None
        finally:
            await lifespan.stop()
    finally:
        gc.set_threshold(*before)


async def test_serving_freezes_what_start_up_built_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    flags = (logging.logProcesses, logging.logThreads, logging.logMultiprocessing)
    srcfile = logging._srcfile
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()  # what an earlier test froze: this one's freeze is then seen
    try:
        app = App(parse_config(""), {})
        seen: list[int] = []

        async def start_up() -> None:  # a start-up hook of the app's own, added before
            seen.append(gc.get_threshold()[0])

        app.on_startup(start_up)
        tune_the_process(app)
        assert gc.get_threshold() == (700, 10, 10)  # not before the app starts
        lifespan = Lifespan(app)
        await lifespan.start()
        try:
            assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
            assert gc.get_freeze_count() > 0
            assert seen == [700]  # the app's own start-up ran first
            assert logging._srcfile is None and logging.logThreads is False
        finally:
            await lifespan.stop()
    finally:
        gc.set_threshold(*before)
        logging.logProcesses, logging.logThreads, logging.logMultiprocessing = flags
        logging._srcfile = srcfile


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
