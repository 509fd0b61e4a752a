"""What the core needs of an upstream HTTP client, as protocols: the edge's
`svir.edges.upstream.UpstreamClient` is one, the tests' `MockTransport`
(tests/support/mock_transport.py: scripted answers, in process) another, and the core (chat,
gateway, policy) types against these, so that it does not import the IO edge. The transport is
chosen where the server is composed (`svir.server.build_app`, default `UpstreamClient()`)
and handed to the gateway.

Also here: what every transport does alike with an answer it cannot stream (a non-2xx status, a
2xx that is not an event stream) and with a timeout, so that a mock fails exactly as the real
client does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from svir.config.model import ProviderConfig, Timeouts
from svir.wire.classify import classify_http_error
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.proxy import (
    DIRECT,
    ProxyRules,
    ProxyURLError,
    UnusableProxy,
    explicit_proxy,
    parse_proxy_url,
)

__all__ = [
    "ERROR_BODY_LIMIT",
    "ERROR_BODY_TIMEOUT",
    "JSON_BODY_LIMIT",
    "Headers",
    "Network",
    "StreamResponse",
    "Transport",
    "error_answer",
    "first_byte_timeout",
    "idle_timeout",
    "network_of",
    "too_large",
]

ERROR_BODY_LIMIT = 65536  # bytes of an error answer's body read for its classification
ERROR_BODY_TIMEOUT = 5.0  # s an error answer's body is waited for
JSON_BODY_LIMIT = 4 << 20  # bytes of a GET's body (model lists)


def too_large(limit: int) -> UpstreamError:
    """The failure of an answer longer than svir reads."""
    return UpstreamError(ErrorKind.PROTOCOL, f"the upstream's answer is larger than {limit} bytes")


AUTH_BODY_TIMEOUT = 1.0  # s an auth error's body is waited for: some servers stall it


def error_body_timeout(status: int) -> float:
    """How long an error answer's body is waited for: an auth error's only briefly, since some
    servers send its head and stall its body, while svir's answer would wait on it. (Its words
    say why the key was refused; they reach the client with any credential redacted.)"""
    return AUTH_BODY_TIMEOUT if status in (401, 403) else ERROR_BODY_TIMEOUT


def error_answer(
    status: int, headers: Mapping[str, str], body: bytes, *, now: float
) -> UpstreamError:
    """The classified error of a non-2xx answer to a streamed request, from the body as far as
    it was read (within `error_body_timeout`, up to `ERROR_BODY_LIMIT`); `now` is the wall clock
    (unix time) a Retry-After date is read against."""
    return classify_http_error(status, headers, body[:ERROR_BODY_LIMIT], now=now)


def first_byte_timeout(seconds: float) -> UpstreamError:
    return UpstreamError(ErrorKind.TIMEOUT, f"upstream did not answer within {seconds:g} s")


def idle_timeout(seconds: float) -> UpstreamError:
    return UpstreamError(
        ErrorKind.TIMEOUT, f"upstream sent nothing for {seconds:g} s", in_stream=True
    )


def merge_header(merged: dict[str, str], key: str, value: str) -> None:
    """Add one header (`key` in lower case) to `merged`: a repeated one is joined with ", "."""
    merged[key] = f"{merged[key]}, {value}" if key in merged else value


class Headers(Mapping[str, str]):
    """Response headers, looked up case-insensitively; repeated ones joined with ", "."""

    __slots__ = ("_items", "_map")

    def __init__(self, items: list[tuple[str, str]], merged: dict[str, str] | None = None) -> None:
        """`merged`: the same headers already merged by lower-case name (a parser that merges
        them as they come: svir.edges.h1), so that they are not gone through twice."""
        self._items = items
        if merged is None:
            merged = {}
            for name, value in items:
                merge_header(merged, name.lower(), value)
        self._map = merged

    def __getitem__(self, name: str) -> str:
        return self._map[name.lower()]

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return self._map.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._map

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


@dataclass(frozen=True, slots=True, eq=False)
class Network:
    """How the transport reaches one provider's server: the proxy rules its requests follow,
    and the TLS trust and client certificate it uses (absolute paths; None: the defaults, which
    `SSL_CERT_FILE` and `SSL_CERT_DIR` set). Compared by identity: one is made per provider each
    time the routing is built (`network_of`), and the transport keeps what it derives from one
    (its TLS context, each URL's proxy decision) for as long as that one is used."""

    proxies: ProxyRules = DIRECT
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    # Who it is for, named in errors about the proxy or the TLS setup.
    provider: str = ""


def network_of(
    provider: ProviderConfig, env_rules: ProxyRules, environ: Mapping[str, str]
) -> Network:
    """`provider`'s network: its own `proxy` (or `proxy_env`'s URL, either with the
    environment's `no_proxy`), none for `proxy = false` and for a server svir runs itself (on
    loopback), else the environment's rules (`svir.wire.proxy.rules_from_env`, read once for all
    providers)."""
    rules: ProxyRules
    if provider.managed is not None or provider.proxy is False:
        rules = DIRECT
    elif isinstance(provider.proxy, str):
        # Checked when loaded.
        rules = explicit_proxy(parse_proxy_url(provider.proxy), env_rules.no_proxy)
    elif provider.proxy_env is not None:
        value = environ.get(provider.proxy_env) or ""
        try:
            rules = explicit_proxy(parse_proxy_url(value), env_rules.no_proxy)
        except ProxyURLError as exc:
            reason = "is not set" if not value.strip() else str(exc)
            unusable = UnusableProxy(provider.proxy_env, f"proxy_env {provider.proxy_env} {reason}")
            rules = explicit_proxy(unusable, env_rules.no_proxy)
    else:
        rules = env_rules
    return Network(
        rules, provider.ca_file, provider.client_cert, provider.client_key, provider.name
    )


class StreamResponse(Protocol):
    """An open, successful streamed response."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The body's next bytes as they come, b"" at its end; a classified UpstreamError on a
        timeout or a break. A method, not an async generator: each generator costs a request
        its registration with the event loop and its closing."""
        ...

    def close(self) -> None:
        """Drop the connection (the body was not read to its end)."""
        ...

    def finish(self) -> None:
        """The body was read to its end: the connection may be used again."""
        ...


class Transport(Protocol):
    """Open a streamed POST, or fetch a JSON body of at most `limit` bytes (a GET, or a POST of
    `body`: llama.cpp's tokenizer, an embeddings request); failures are classified
    UpstreamErrors, and a body past `limit` is one (PROTOCOL). `network` is the provider's
    (`Network`: proxy and TLS); None, the transport's default (the environment's proxies)."""

    async def open_stream(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | list[bytes | memoryview],
        timeouts: Timeouts,
        network: Network | None = None,
    ) -> StreamResponse: ...

    async def get_json_bytes(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
        body: bytes | None = None,
        limit: int = JSON_BODY_LIMIT,
        network: Network | None = None,
    ) -> bytes: ...

    async def close(self) -> None: ...
