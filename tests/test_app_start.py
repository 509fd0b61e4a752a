"""What the app's start-up does to the process (svir.edges.app's lifespan): what start-up built is
frozen out of the garbage collector's way, and the young generation is collected less often."""

from __future__ import annotations

import gc

from svir.config import parse_config
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
