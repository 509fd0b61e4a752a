"""The checks of a configuration that msgspec cannot make: ranges, names, each provider against
its kind, the files the config names (made absolute), routes against the providers. Each failure
is a `ConfigError` naming the file, the field and the fix.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec

from svir.config.model import (
    BUILTIN_GEMMA_TEMPLATE,
    MANAGED_BASE_URL,
    MANAGED_KIND,
    POOLINGS,
    PYPI_GEMMA,
    CaptureConfig,
    Config,
    ManagedConfig,
    ManagedModel,
    ProviderConfig,
    RouteConfig,
    RouteTarget,
    StoreConfig,
)
from svir.errors import ConfigError
from svir.providers import KINDS
from svir.providers.base import ProviderKind
from svir.wire.errors import BaseURLError
from svir.wire.origins import (
    PatternError,
    parse_host_pattern,
    parse_origin_pattern,
)
from svir.wire.proxy import ProxyURLError, parse_proxy_url

__all__ = ["checked", "reject_inline_keys"]


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


def reject_inline_keys(source: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    providers = doc.get("providers")
    if not isinstance(providers, list):
        return
    for i, entry in enumerate(providers):
        if not isinstance(entry, dict):
            continue
        for key in entry:
            if key.replace("_", "").replace("-", "").lower() in _INLINE_KEYS:
                raise ConfigError(source, f"providers[{i}].{key}", _KEYS_GO_IN_ENV)


def checked(source: str | os.PathLike[str], config: Config) -> Config:
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

    _check_kind_options(fail, at, provider, kind)
    models = _checked_models(fail, at, provider, managed)
    _check_request_shaping(fail, at, provider)
    tls = _checked_network(fail, at, provider, kind=kind.name, base_url=base_url, base_dir=base_dir)
    _check_resilience(fail, at, provider)
    return msgspec.structs.replace(
        provider, base_url=base_url, models=tuple(models), managed=managed, **tls
    )


def _check_kind_options(
    fail: Callable[[str, str], ConfigError], at: str, provider: ProviderConfig, kind: ProviderKind
) -> None:
    """The fields that apply to some kinds only: api_version, relay, completions, fim."""
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


def _checked_models(
    fail: Callable[[str, str], ConfigError],
    at: str,
    provider: ProviderConfig,
    managed: ManagedConfig | None,
) -> list[str]:
    """The provider's models (a managed one's first), each once, the embedding models among
    them."""
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
    return models


def _check_request_shaping(
    fail: Callable[[str, str], ConfigError], at: str, provider: ProviderConfig
) -> None:
    """What svir changes in every request to the provider: drop_params and extra_headers."""
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


def _check_resilience(
    fail: Callable[[str, str], ConfigError], at: str, provider: ProviderConfig
) -> None:
    """The provider's timeouts, retries, breaker and response_format."""
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
    if kind == MANAGED_KIND:
        for field in ("proxy", "proxy_env", "ca_file", "client_cert", "client_key"):
            if getattr(provider, field) not in (None, False):
                raise fail(
                    f"{at}.{field}",
                    f"kind {MANAGED_KIND!r} runs its servers on this machine (plain HTTP on"
                    " loopback, never through a proxy); remove it",
                )
        return {}
    _check_proxy(fail, at, provider)
    return _checked_tls(fail, at, provider, base_url=base_url, base_dir=base_dir)


def _check_proxy(
    fail: Callable[[str, str], ConfigError], at: str, provider: ProviderConfig
) -> None:
    """`proxy` (a URL without a password, or false) and `proxy_env` (a variable's name)."""
    proxy = provider.proxy
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


def _checked_tls(
    fail: Callable[[str, str], ConfigError],
    at: str,
    provider: ProviderConfig,
    *,
    base_url: str,
    base_dir: Path,
) -> dict[str, str | None]:
    """The TLS files (ca_file, client_cert, client_key), made absolute and loaded once."""

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

    _check_server_settings(fail, at, m)
    template = m.chat_template
    if template is not None:
        template = _managed_path(fail, f"{at}.chat_template", template, base_dir)
    models: dict[str, str | ManagedModel] = {
        model_id: _checked_managed_model(fail, f"{at}.models.{model_id}", model_id, given, base_dir)
        for model_id, given in m.models.items()
    }
    if not math.isfinite(m.idle_unload) or m.idle_unload < 0:
        raise fail(f"{at}.idle_unload", "must be a finite number of seconds, 0 (never) or more")
    if m.max_loaded < 1:
        raise fail(f"{at}.max_loaded", "must be at least 1")
    if not math.isfinite(m.start_timeout) or m.start_timeout <= 0:
        raise fail(f"{at}.start_timeout", "must be a finite number of seconds above 0")
    return msgspec.structs.replace(m, models=models, chat_template=template)


def _checked_managed_model(
    fail: Callable[[str, str], ConfigError],
    here: str,
    model_id: str,
    given: str | ManagedModel,
    base_dir: Path,
) -> ManagedModel:
    """One model of a managed provider (a path, or a table), its files made absolute."""
    if not model_id.strip() or model_id != model_id.strip():
        raise fail(here, "a model id must not be empty or start or end with a space")
    path_field = here if isinstance(given, str) else f"{here}.path"
    entry = ManagedModel(path=given) if isinstance(given, str) else given
    _check_server_settings(fail, here, entry)
    if entry.pooling is not None:
        if entry.pooling not in POOLINGS:
            raise fail(f"{here}.pooling", f"must be one of {', '.join(POOLINGS)}")
        if not entry.embeddings:
            raise fail(f"{here}.pooling", "applies to an embedding model: set embeddings = true")
    template = entry.chat_template
    if template is not None:
        template = _managed_path(fail, f"{here}.chat_template", template, base_dir)
    return msgspec.structs.replace(
        entry,
        path=_managed_path(fail, path_field, entry.path, base_dir, special=PYPI_GEMMA),
        chat_template=template,
    )


def _managed_path(
    fail: Callable[[str, str], ConfigError],
    field: str,
    value: str,
    base_dir: Path,
    *,
    special: str = BUILTIN_GEMMA_TEMPLATE,
) -> str:
    """A model's or a template's file, made absolute; `special` (svir's own) as it is."""
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


def _check_server_settings(
    fail: Callable[[str, str], ConfigError], field: str, entry: ManagedConfig | ManagedModel
) -> None:
    """ctx, threads and parallel of a managed provider or of one of its models."""
    if entry.ctx is not None and entry.ctx < 1:
        raise fail(f"{field}.ctx", "must be at least 1")
    if entry.threads is not None and entry.threads < 1:
        raise fail(f"{field}.threads", "must be at least 1")
    if entry.parallel is not None and entry.parallel < 1:
        raise fail(f"{field}.parallel", "must be at least 1")


def _show(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")
