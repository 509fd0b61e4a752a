"""How `svir serve` runs: the app built from a config with every front end installed, in one
process or in N worker processes that share the listening socket.

With workers, uvicorn's supervisor binds the socket, starts the workers (restarting any that
dies) and each worker builds its own app with `worker_app`, from what the parent left in its
environment.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
from collections.abc import Mapping
from typing import Any

from svir.config import MANAGED_KIND, Config, load_config
from svir.edges.app import App
from svir.policy.resilience import Timing
from svir.store import default_url, make_store
from svir.threads.service import ThreadService
from svir.transport import Transport

log = logging.getLogger("svir.server")

# What the parent passes to its workers (they are new interpreters, not forks).
ENV_CONFIG = "SVIR_CONFIG"
ENV_LOG_LEVEL = "SVIR_LOG_LEVEL"


def build_app(
    config: Config,
    environ: Mapping[str, str],
    *,
    transport: Transport | None = None,
    timing: Timing | None = None,
) -> App:
    """svir's app with every front end: keys and limits, Ollama's API, threads, managed models.

    The one composition root: transport (default the upstream client, `UpstreamClient()`; a
    `svir.testing.MockTransport` runs the whole app in process) -> gateway -> front ends -> app.
    `timing` is the policy's sleep, randomness and clock (default the real ones; a test's own
    make backoff and breakers run without waiting).
    """
    from svir.edges import managed
    from svir.frontends import anthropic, completions, embeddings, ollama, openai_chat, threads
    from svir.keys import service as keys_service

    app = App(config, environ, transport=transport, timing=timing)
    keys_service.install(app)
    # The client protocols, one line each (svir.frontends says where a new one goes).
    openai_chat.install(app)
    completions.install(app)
    embeddings.install(app)
    ollama.install(app)
    anthropic.install(app)
    threads.install(app, thread_service(app))
    managed.install(app)
    return app


def thread_service(app: App) -> ThreadService:
    """The threads API's service over the store `[store] url` names (default: a file under the
    user's data directory), not opened yet: its front end opens it at start-up."""
    store = make_store(app.config.store.url or default_url(app.environ))
    return ThreadService(store, app.gateway, app.config.store)


def worker_refusal(config: Config, workers: int) -> str | None:
    """Why `config` cannot be served by `workers` processes, or None."""
    if workers < 1:
        return f"workers must be at least 1, not {workers}"
    if workers == 1:
        return None
    managed = [p.name for p in config.providers if p.kind == MANAGED_KIND]
    if managed:
        # Each worker would start its own llama-server for the same model.
        return (
            f"the managed provider(s) {', '.join(managed)} run their llama-server in svir's "
            "process: serve them with one worker, or run llama-server yourself and use kind "
            '"llamacpp"'
        )
    return None


def worker_warnings(config: Config, workers: int) -> list[str]:
    """What changes when one config is served by several processes."""
    if workers == 1:
        return []
    out = [
        f"{workers} workers: circuit breakers, retry budgets, learned quirks, least-in-flight "
        "balancing, /metrics and /healthz?verbose=1 are per worker"
    ]
    if config.limits.backend == "memory":
        out.append(
            f'limits.backend = "memory" counts per worker: a key\'s rpm, tpm, concurrency and '
            f'budgets may be exceeded up to {workers} times; use limits.backend = "redis" for '
            "exact limits"
        )
    return out


def run(
    config: Config, *, host: str, port: int, workers: int, log_level: str, path: str | None
) -> None:
    """Serve until stopped: the app in this process, or `workers` processes (see the module doc);
    `path` is the config file `config` came from (None: the default config)."""
    import uvicorn

    from svir.edges.coalesce import CoalescingHttpToolsProtocol

    short = raise_file_limit(open_files_needed(config.server.max_connections))
    if short is not None:
        log.warning(short)
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        # The limits on client connections (see svir.edges.coalesce); a partial pickles, so
        # each worker gets them too.
        "http": functools.partial(CoalescingHttpToolsProtocol, limits=config.server),
        "timeout_keep_alive": config.server.keep_alive_timeout,
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        "timeout_graceful_shutdown": 5,
    }
    if workers == 1:
        uvicorn.run(build_app(config, os.environ), **settings)
        return
    # Each worker is a new interpreter that builds its own app from this environment.
    if path:
        os.environ[ENV_CONFIG] = os.path.abspath(path)
    os.environ[ENV_LOG_LEVEL] = log_level
    uvicorn.run("svir.edges.server:worker_app", factory=True, workers=workers, **settings)


def open_files_needed(max_connections: int) -> int:
    """File descriptors a process needs for `max_connections` clients: each has its own and one
    to its upstream, and some are svir's own (listening socket, store, logs, managed servers)."""
    return 2 * max_connections + 100


def raise_file_limit(needed: int) -> str | None:
    """Raise this process's soft limit on open files towards `needed` (as far as the hard limit
    allows; workers inherit it), so that the connection cap, not the limit, refuses clients.
    Returns a warning when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # macOS caps it below an infinite hard limit
        target = soft
    if target >= needed:
        return None
    return (
        f"this process may open {target} files and server.max_connections needs about {needed}"
        " (a client's connection and its upstream's each): raise the hard limit (ulimit -Hn) or"
        " lower server.max_connections, else connections fail once the files run out"
    )


def worker_app() -> App:
    """The app of one worker process (uvicorn's factory), from the environment `svir serve` set."""
    from svir.edges import managed
    from svir.log import setup_logging

    setup_logging(os.environ.get(ENV_LOG_LEVEL, "info"))
    path = os.environ.get(ENV_CONFIG)
    config = load_config(path) if path else managed.default_config()
    return build_app(config, os.environ)
