"""How `svir serve` runs: the app built from a config with every front end installed, in one
process or in N worker processes that share the listening socket.

With workers, uvicorn's supervisor binds the socket, starts the workers (restarting any that
dies) and each worker builds its own app with `worker_app`, from what the parent left in its
environment.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from svir import __version__
from svir.asgi import GRACEFUL_STOP_SECONDS
from svir.config.load import load_config
from svir.config.model import DEFAULT_MAX_CONNECTIONS, MANAGED_KIND, Config, ServerConfig
from svir.edges.app import App
from svir.errors import SvirError
from svir.policy.resilience import Timing
from svir.providers import get_kind
from svir.store import make_store, sqlite_path, store_url, with_store_url
from svir.threads.service import ThreadService
from svir.transport import Transport

if TYPE_CHECKING:
    from uvicorn.supervisors import Multiprocess

log = logging.getLogger("svir.server")

# What the parent passes to its workers (they are new interpreters, not forks).
ENV_CONFIG = "SVIR_CONFIG"
ENV_LOG_LEVEL = "SVIR_LOG_LEVEL"
ENV_LOG_FORMAT = "SVIR_LOG_FORMAT"
ENV_WORKERS = "SVIR_WORKERS"
# svir's default port, which is Ollama's too (so that Ollama's clients find svir unchanged).
DEFAULT_PORT = 11434


def build_app(
    config: Config,
    environ: Mapping[str, str],
    *,
    transport: Transport | None = None,
    timing: Timing | None = None,
    source: str | None = None,
    workers: int = 1,
    watch: bool = False,
) -> App:
    """svir's app with every front end: keys and limits, Ollama's API, Anthropic's, threads,
    OpenAI's Responses, managed models, the console's admin routes (which say `source`, the
    config file or None for the default config, and how many `workers` serve the port), and
    config reloads of `source` (svir.edges.reload; with `watch`, as `svir serve` runs it, the
    file is watched and SIGHUP reloads it).

    The one composition root: transport (default the upstream client, `UpstreamClient()`; the
    tests' `MockTransport`, tests/support/mock_transport.py, runs the whole app in process) ->
    gateway -> protocols -> app.
    `timing` is the policy's sleep, randomness and clock (default the real ones; a test's own
    make backoff and breakers run without waiting).
    """
    from svir.console import observe_api, ops
    from svir.edges import console_ui, keys_service, reload
    from svir.edges.managed.install import install as install_managed
    from svir.protocols import (
        anthropic,
        completions,
        embeddings,
        ollama,
        openai_chat,
        responses,
        threads,
    )
    from svir.store.responses import SqlResponseStore

    app = App(config, environ, transport=transport, timing=timing)
    keys = keys_service.install(app)
    # The client protocols, one line each (svir.protocols says where a new one goes).
    openai_chat.install(app)
    completions.install(app)
    embeddings.install(app)
    ollama.install(app)
    anthropic.install(app)
    threads.install(app, thread_service(app))
    responses.install(app, SqlResponseStore(store_url(app.config, app.environ)))
    supervisors = install_managed(app)
    ops.install(app, keys, supervisors, source=source, workers=workers)
    reload.install(
        app,
        source,
        managed=supervisors,
        keys=keys,
        check=lambda c: worker_refusal(c, workers),
        workers=workers,
        watch=watch,
    )
    console = observe_api.install(app, keys)
    # What watches requests and calls (svir.observers), told in this order from one place, and
    # the capture of the client routes' requests (whichever installed them, before or after).
    app.compose([*keys.observers(), *console.observers()], console.capturer)
    # The web console's files (no key needed for them; the admin API behind them wants one).
    console_ui.install(app, keys.auth)
    return app


def thread_service(app: App) -> ThreadService:
    """The threads API's service over the store `[store] url` names (default: a file under the
    user's data directory), not opened yet: its front end opens it at start-up."""
    store = make_store(store_url(app.config, app.environ))
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


class ListenError(SvirError):
    """svir cannot listen where it was asked to; the message says why and what to do."""


def listen(host: str, port: int) -> socket.socket:
    """The listening socket on `host`:`port` (0: a free port), or ListenError saying what to do:
    a port in use is named, with the other program that may hold it and how to pick another."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        other = 11500 if port == DEFAULT_PORT else DEFAULT_PORT + 1
        if exc.errno == errno.EADDRINUSE:
            ollama = (
                f" ({DEFAULT_PORT} is also Ollama's default port: is Ollama, or another svir,"
                " running?)"
                if port == DEFAULT_PORT
                else f" (the default, {DEFAULT_PORT}, is also Ollama's port)"
            )
            raise ListenError(
                f"port {port} is already in use on {host}{ollama}. Pick another port:"
                f' `svir serve --port {other}`, `make serve ARGS="--port {other}"`, or'
                " [server] port in the config file"
            ) from None
        raise ListenError(
            f"cannot listen on {where}: {exc.strerror or exc}. Pick another address or port"
            f' (`svir serve --host 127.0.0.1 --port {other}`, `make serve ARGS="--port'
            f' {other}"`)'
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int) -> str:
    """The URL people type for `host`:`port`."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def banner(
    config: Config, *, path: str | None, host: str, port: int, workers: int, keys: str
) -> tuple[str, dict[str, Any], str]:
    """What svir says once it listens: a log message, its fields, and the block of text a
    person reads (`--log-format text`): the URLs, the config, the providers and their models,
    the store, and whether keys are on."""
    url = url_of(host, port)
    if host in ("0.0.0.0", "::"):
        url += f" (every interface; on this machine {url_of('127.0.0.1', port)})"
    base = url_of(host, port)
    urls = {
        "openai": f"{base}/v1",
        "ollama": f"{base}/api",
        "anthropic": f"{base}/v1/messages",
    }
    if path is not None:
        where = os.path.abspath(path)
    elif config.providers:
        where = "no config: serving the bundled local model (local/gemma-3-270m)"
    else:
        where = "no config, and no local model to serve (see the warning above)"
    providers = []
    for p in config.providers:
        count = len(p.managed.models) if p.managed is not None else len(p.models)
        discovered = p.managed is None and get_kind(p.kind).discover_for(p)
        models = f"{count} model{'s' if count != 1 else ''}"
        if discovered:
            models += " configured, more from its server's /models"
        providers.append(f"{p.name} ({p.kind}, {models})")
    store = store_url(config)
    store_text = sqlite_path(store) or store.split("@")[-1]
    fields: dict[str, Any] = {
        "version": __version__,
        "url": url,
        "urls": urls,
        "config": where,
        "providers": providers,
        "store": store_text,
        "keys": keys,
        "workers": workers,
    }
    message = f"svir {__version__} listening on {url}"
    lines = [
        message,
        f"  OpenAI API   {urls['openai']}  (Ollama: {urls['ollama']},"
        f" Anthropic: {urls['anthropic']})",
        f"  config       {where}",
        f"  providers    {len(providers)}: {', '.join(providers)}"
        if providers
        else "  providers    none: every model request is answered 404",
        f"  store        {store_text}",
        f"  keys         {keys}",
    ]
    if workers > 1:
        lines.append(f"  workers      {workers}")
    return message, fields, "\n".join(lines)


def _server_limits(config: Config) -> ServerConfig:
    """The config's `[server]` limits, with `max_connections` what this process's open-files
    limit holds (`connections_that_fit`)."""
    cap, short = connections_that_fit(config.server.max_connections)
    if short is not None:
        # The default bends to the machine's limit without alarm; a cap the config asked for is
        # a warning.
        asked = config.server.max_connections != DEFAULT_MAX_CONNECTIONS
        log.log(logging.WARNING if asked else logging.INFO, short)
    return msgspec.structs.replace(config.server, max_connections=cap)


def server_settings(host: str, port: int, limits: ServerConfig) -> dict[str, Any]:
    """uvicorn's settings as `svir serve` runs it: svir's HTTP/1.1 protocol with `limits`."""
    from svir.edges.h1_server import H1ServerProtocol

    return {
        "host": host,
        "port": port,
        "loop": "uvloop",
        # svir's HTTP/1.1 protocol, with the limits on client connections (svir.edges.h1_server);
        # a partial pickles, so each worker gets them too.
        "http": functools.partial(H1ServerProtocol, limits=limits),
        "timeout_keep_alive": limits.keep_alive_timeout,
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        "timeout_graceful_shutdown": GRACEFUL_STOP_SECONDS,
    }


def run(
    config: Config,
    *,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    path: str | None,
    log_format: str = "json",
    keys: str = "",
) -> int:
    """Serve until stopped: the app in this process, or `workers` processes (see the module doc);
    `path` is the config file `config` came from (None: the default config). Says where it
    listens once it does (`banner`; `keys` says whether keys are on), and when it stopped.
    Returns the exit status: 1 when it cannot listen, 3 when start-up failed."""
    import uvicorn

    limits = _server_limits(config)
    try:
        sock = listen(host, port)
    except ListenError as exc:
        log.error(str(exc))
        return 1
    port = sock.getsockname()[1]
    message, fields, block = banner(
        config, path=path, host=host, port=port, workers=workers, keys=keys
    )
    settings = server_settings(host, port, limits)
    # Said once, by this process, also with workers.
    log.info(message, extra={"fields": fields, "banner": block})
    status = 0
    server: uvicorn.Server | None = None
    # uvicorn stops on SIGTERM and then raises it again: noted here, so that the stop line is
    # said first, and raised once more after it (the exit status stays the signal's). One that
    # comes before uvicorn takes the signal is noted too (`_Stop`), and svir does not serve.
    stop = _Stop()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, stop.handle)
    try:
        if workers == 1:
            ignore_sighup()
            source = os.path.abspath(path) if path else None
            app = build_app(config, os.environ, source=source, watch=True)
            tune_the_process(app)
            server = uvicorn.Server(uvicorn.Config(app, **settings))
            stop.tell = functools.partial(setattr, server, "should_exit", True)
            if not stop.requested:
                server.run(sockets=[sock])
        else:
            _run_workers(
                settings,
                sock,
                stop,
                path=path,
                workers=workers,
                log_level=log_level,
                log_format=log_format,
            )
    except KeyboardInterrupt:  # uvicorn raises the signal it caught again once it stopped
        pass
    finally:
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if server is not None and not server.started and not stop.requested:
        status = 3
    if status:
        log.error("svir did not start (see the lines above)")
    else:
        log.info(
            f"svir stopped listening on {url_of(host, port)}",
            extra={"fields": {"url": url_of(host, port)}},
        )
    if stop.requested:
        signal.raise_signal(signal.SIGTERM)
    return status


# Net container allocations between two collections of the youngest generation, once started.
YOUNG_GC_THRESHOLD = 10_000


def tune_the_process(app: App) -> None:
    """Tune this process for serving `app`, the one app `svir serve` runs in it: its logging
    records skip what no svir line shows, and once the app has started, what start-up built is
    frozen out of the garbage collector's way and the young generation is collected less often.

    The process's, not an App's: the logging module and the collector are shared by everything
    in the process, so an app that set them would set them for a second app beside it, for
    svir embedded in another program, and for a test run."""
    # The JSON lines name none of these; looking them up costs a system call per record, and
    # finding the caller's file and line walks the stack (the logging HOWTO's optimization list).
    logging.logProcesses = False
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    # Added last: it runs after every hook of the app's own start-up.
    app.on_startup(_settle_the_collector)


async def _settle_the_collector() -> None:
    # What start-up built lives as long as the process: out of the collector's way.
    gc.collect()
    gc.freeze()
    # A young collection every 700 net allocations (CPython's default) ran every ~20 requests
    # under load, each walking every live object of the requests in flight: ~4% of a request's
    # CPU (BENCHMARKS.md). Requests free what they make by reference counting; the collector is
    # for the rare cycle.
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])


def _run_workers(
    settings: dict[str, Any],
    sock: socket.socket,
    stop: _Stop,
    *,
    path: str | None,
    workers: int,
    log_level: str,
    log_format: str,
) -> None:
    """Serve with `workers` processes under uvicorn's supervisor until stopped."""
    import uvicorn

    # Each worker is a new interpreter that builds its own app from this environment; they
    # share this socket (as `uvicorn.run` shares the one it binds).
    if path:
        os.environ[ENV_CONFIG] = os.path.abspath(path)
    os.environ[ENV_LOG_LEVEL] = log_level
    os.environ[ENV_LOG_FORMAT] = log_format
    os.environ[ENV_WORKERS] = str(workers)
    worker = uvicorn.Config("svir.server:worker_app", factory=True, workers=workers, **settings)
    supervisor = _supervisor_class()(worker, sockets=[sock])
    stop.tell = supervisor.should_exit.set
    if not stop.requested:
        supervisor.run()


def ignore_sighup() -> None:
    """Ignore SIGHUP until the app's start-up takes it for reloads (svir.edges.reload): its
    default would end the process."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _supervisor_class() -> type[Multiprocess]:
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        """uvicorn's supervisor of the workers, but SIGHUP reloads the config in every worker
        (svir.edges.reload) instead of restarting them: state in the workers lives on."""

        def handle_hup(self) -> None:
            pids = [p.pid for p in self.processes if p.pid is not None]
            log.info("SIGHUP: every worker reloads its config", extra={"fields": {"pids": pids}})
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGHUP)

    return Supervisor


class _Stop:
    """svir's SIGTERM handler, around uvicorn's (which takes the signal while it serves, and
    raises it again once it stopped). It only notes the signal, and tells uvicorn's server or
    supervisor to stop once there is one (`tell`: its `should_exit`, which it reads as it starts
    and then on every tick): an exception raised from a signal handler can be lost (one raised
    while the interpreter compiled an import was, and svir served on as though it had never
    been asked to stop)."""

    def __init__(self) -> None:
        self.tell: Callable[[], object] | None = None
        self.requested = False

    def handle(self, signum: int, frame: object) -> None:
        self.requested = True
        if self.tell is not None:
            self.tell()


# Files svir holds besides its connections': the listening socket, the store, logs, managed
# servers.
OWN_FILES: Final = 100


def open_files_needed(max_connections: int) -> int:
    """File descriptors a process needs for `max_connections` clients: each has its own and one
    to its upstream, and some are svir's own (`OWN_FILES`)."""
    return 2 * max_connections + OWN_FILES


def connections_that_fit(max_connections: int) -> tuple[int, str | None]:
    """The cap on client connections this process keeps: `max_connections` when its open-files
    limit rises to fit them (`raise_file_limit`), else as many as the limit holds, and a warning
    that says so. Past the cap, a connection at rest makes room for a new one (svir.edges.
    h1_server); past the limit, accepting one would fail, and so would a request's upstream."""
    needed = open_files_needed(max_connections)
    allowed = raise_file_limit(needed)
    if allowed >= needed:
        return max_connections, None
    fitted = max(1, (allowed - OWN_FILES) // 2)
    return fitted, (
        f"this process may open {allowed} files and server.max_connections = {max_connections}"
        f" needs about {needed} (a client's connection and its upstream's each): svir keeps at"
        f" most {fitted} connections open; raise the hard limit (ulimit -Hn) to keep more"
    )


def raise_file_limit(needed: int) -> int:
    """Raise this process's soft limit on open files towards `needed`, as far as the system allows
    (workers inherit it). Returns how many of the `needed` files it may open now: all of them, or
    the most the system allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if not _set_file_limit(target, hard):
        # macOS refuses more than its own per-process maximum (kern.maxfilesperproc) even under
        # an infinite hard limit: the most it takes, searched for between the two.
        low, high = soft, target - 1
        while low < high:
            middle = (low + high + 1) // 2
            if _set_file_limit(middle, hard):
                low = middle
            else:
                high = middle - 1
        target = low
    return min(target, needed)


def _set_file_limit(soft: int, hard: int) -> bool:
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ValueError, OSError):
        return False
    return True


def worker_app() -> App:
    """The app of one worker process (uvicorn's factory), from the environment `svir serve` set."""
    from svir.edges.managed.defaults import default_config
    from svir.log import setup_logging

    setup_logging(os.environ.get(ENV_LOG_LEVEL, "info"), fmt=os.environ.get(ENV_LOG_FORMAT, "json"))
    ignore_sighup()
    path = os.environ.get(ENV_CONFIG)
    config = load_config(path) if path else default_config(warn=False)
    config, _ = with_store_url(config, path, os.environ)  # the parent warned
    workers = int(os.environ.get(ENV_WORKERS) or 1)
    app = build_app(config, os.environ, source=path, workers=workers, watch=True)
    tune_the_process(app)
    return app
