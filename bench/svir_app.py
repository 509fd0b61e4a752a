"""svir's ASGI app as an import string, for servers other than `svir serve`'s uvicorn.run (the
bench's granian and multi-worker uvicorn figures): built like `svir serve` builds it, from the
config file in $SVIR_CONFIG.

    SVIR_CONFIG=svir.toml granian --interface asgi --loop uvloop bench.svir_app:app
    SVIR_CONFIG=svir.toml uvicorn --loop uvloop --http httptools --workers 2 bench.svir_app:app
"""

from __future__ import annotations

import os

from svir.config import load_config
from svir.edges import managed, ollama_api, threads_api
from svir.edges.app import App
from svir.log import setup_logging

setup_logging("info")
app = App(load_config(os.environ["SVIR_CONFIG"]), os.environ)
if os.environ.get("SVIR_BENCH_KEYS", "1") == "1":
    from svir.keys import service as keys_service

    keys_service.install(app)
ollama_api.install(app)
threads_api.install(app)
managed.install(app)
