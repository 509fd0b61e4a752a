"""Which proxy an upstream request goes through: the proxy variables of the environment
(`https_proxy`, `http_proxy`, `all_proxy`, `no_proxy`, in either case) and a provider's own
`proxy`, read into rules that answer for one (scheme, host, port); and the CONNECT exchange's
bytes. Pure: the environment is a mapping given, nothing is resolved or connected here.

As curl reads them, with these differences (docs/providers.md, "Behind a corporate proxy"):

- `HTTP_PROXY` in upper case counts too (curl reads only the lower case, against CGI's
  "httpoxy", where a client's `Proxy:` header becomes `HTTP_PROXY`; svir is no CGI program).
- `no_proxy` entries may carry a port (`host:8080`: that port only), and `*` anywhere in the
  list, or `*.` before a domain, mean what they say; entries are split at commas and blanks.
- Loopback hosts (`localhost`, `*.localhost`, 127.0.0.0/8, ::1) never take the environment's
  proxy: a local server stays local. A provider's own `proxy` may take any host; `no_proxy`
  applies to it as to the environment's (as curl's to its `--proxy`).
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from svir.wire.errors import WireError
from svir.wire.origins import is_loopback as is_loopback_address

__all__ = [
    "DIRECT",
    "ConnectRefused",
    "NoProxy",
    "ProxyRules",
    "ProxyURL",
    "ProxyURLError",
    "UnusableProxy",
    "connect_request",
    "explicit_proxy",
    "is_loopback",
    "parse_connect_head",
    "parse_proxy_url",
    "rules_from_env",
]

# curl's default proxy port, for a proxy URL that gives none.
DEFAULT_PROXY_PORT: Final = 1080
# The longest CONNECT answer head read before the proxy is given up on.
MAX_CONNECT_HEAD: Final = 16 * 1024


class ProxyURLError(WireError):
    """A proxy URL svir cannot use; the message never repeats the URL (it may hold a password)."""


@dataclass(frozen=True, slots=True)
class ProxyURL:
    """An HTTP proxy: where it listens, and the `Proxy-Authorization` value its URL's user
    information makes (None without one). `address` (host:port) is how errors name it."""

    host: str
    port: int
    authorization: str | None = None
    password: str | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __repr__(self) -> str:  # never the credentials
        return f"ProxyURL({self.address})"


@dataclass(frozen=True, slots=True)
class UnusableProxy:
    """A proxy setting that names a proxy svir cannot use (a `socks5://` one, a malformed URL):
    requests it applies to fail saying so, rather than go around the proxy."""

    source: str
    reason: str


def parse_proxy_url(text: str) -> ProxyURL:
    """An `http://[user[:password]@]host[:port][/]` proxy URL; the scheme may be left out (as
    curl allows), the port defaults to curl's 1080. The user and password are percent-decoded."""
    text = text.strip()
    if not text:
        raise ProxyURLError("is empty")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ProxyURLError("is not a URL with a valid host and port") from None
    scheme = parts.scheme.lower()
    if scheme != "http":
        raise ProxyURLError(
            f"svir speaks to proxies over http:// only, not {scheme}:// (write http://host:port)"
        )
    host = parts.hostname
    if not host or any(ch in host for ch in " \t\r\n\0/\\"):
        raise ProxyURLError("has no host (write http://host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ProxyURLError("must be http://host:port with no path, query or fragment")
    if any(ch in text for ch in "\r\n\0"):
        raise ProxyURLError("must not contain line breaks or NUL")
    authorization = password = None
    if parts.username is not None or parts.password is not None:
        user = unquote(parts.username or "")
        password = unquote(parts.password or "") or None
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return ProxyURL(host.lower(), port or DEFAULT_PROXY_PORT, authorization, password)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name, or an address, IPv6 with or without brackets) is this machine:
    svir.wire.origins' loopback addresses and `localhost`, and the names under `.localhost`."""
    return host.rstrip(".").lower().endswith(".localhost") or is_loopback_address(host)


@dataclass(frozen=True, slots=True)
class _Entry:
    """One `no_proxy` entry: a domain (matching itself and its subdomains) or a network."""

    domain: str | None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    port: int | None


class NoProxy:
    """A parsed `no_proxy` list: the hosts that go direct (`matches`)."""

    __slots__ = ("_entries", "everything")

    def __init__(self, text: str) -> None:
        self.everything = False
        self._entries: list[_Entry] = []
        for token in text.replace(",", " ").split():
            if token == "*":
                self.everything = True
                continue
            entry = _parse_entry(token)
            if entry is not None:
                self._entries.append(entry)

    def matches(self, host: str, port: int) -> bool:
        """Whether a request to `host`:`port` goes direct."""
        if self.everything:
            return True
        if not self._entries:
            return False
        host = host.strip("[]").lower()
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
            host = host.rstrip(".")
        for entry in self._entries:
            if entry.port is not None and entry.port != port:
                continue
            if address is not None:
                network = entry.network
                if network is not None and network.version == address.version:
                    if address in network:
                        return True
            elif entry.domain is not None:
                domain = entry.domain
                if host == domain or host.endswith("." + domain):
                    return True
        return False


def _parse_entry(token: str) -> _Entry | None:
    """One entry: `name`, `.name`, `*.name`, `name:port`, an address (IPv6 bare or in
    brackets, the bracketed one with `:port`), or a CIDR; None for one that can match nothing."""
    port: int | None = None
    body = token
    if body.startswith("["):
        inside, _, rest = body[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        elif rest:
            return None
        body = inside
    elif body.count(":") == 1:
        body, _, port_text = body.partition(":")
        if not port_text.isdigit():
            return None
        port = int(port_text)
    if port is not None and not 0 < port < 65536:
        return None
    try:
        network = ipaddress.ip_network(body, strict=False)
    except ValueError:
        pass
    else:
        return _Entry(None, network, port)
    if "/" in body:
        return None
    domain = body.lower().removeprefix("*").lstrip(".").rstrip(".")
    if not domain or "*" in domain:
        return None
    return _Entry(domain, None, port)


Proxy = ProxyURL | UnusableProxy


@dataclass(frozen=True, slots=True)
class ProxyRules:
    """Which proxy serves each scheme, and the hosts that go direct. `spare_loopback`: loopback
    hosts go direct (the environment's rules); a provider's own `proxy` takes every host."""

    http: Proxy | None = None
    https: Proxy | None = None
    no_proxy: NoProxy | None = None
    spare_loopback: bool = True

    def proxy_for(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy a request to `scheme://host:port` goes through; None: direct."""
        proxy = self.https if scheme == "https" else self.http
        if proxy is None:
            return None
        if self.spare_loopback and is_loopback(host):
            return None
        if self.no_proxy is not None and self.no_proxy.matches(host, port):
            return None
        return proxy


# No proxy at all: `proxy = false`, and the servers svir runs itself.
DIRECT: Final = ProxyRules()


def explicit_proxy(proxy: Proxy, no_proxy: NoProxy | None = None) -> ProxyRules:
    """A provider's own proxy: every request of that provider but those `no_proxy` (the
    environment's) sends direct, loopback hosts too."""
    return ProxyRules(http=proxy, https=proxy, no_proxy=no_proxy, spare_loopback=False)


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(name as set, value) of the lower-case variable, else the upper-case one (curl's order);
    an empty one counts as unset."""
    for key in (name, name.upper()):
        value = environ.get(key)
        if value and value.strip():
            return key, value
    return None


def _env_proxy(environ: Mapping[str, str], name: str) -> Proxy | None:
    found = _variable(environ, name) or _variable(environ, "all_proxy")
    if found is None:
        return None
    key, value = found
    try:
        return parse_proxy_url(value)
    except ProxyURLError as exc:
        return UnusableProxy(key, f"{key} {exc}")


def rules_from_env(environ: Mapping[str, str]) -> ProxyRules:
    """The environment's proxy rules: `https_proxy` for https, `http_proxy` for http,
    `all_proxy` for either when its own is unset, `no_proxy` for the hosts that go direct."""
    https = _env_proxy(environ, "https_proxy")
    http = _env_proxy(environ, "http_proxy")
    found = _variable(environ, "no_proxy")
    return ProxyRules(http=http, https=https, no_proxy=NoProxy(found[1]) if found else None)


class ConnectRefused(WireError):
    """The proxy answered a CONNECT with something other than 2xx (`status`, 0 when the answer
    was not HTTP)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}".strip() if status else reason)
        self.status = status
        self.reason = reason


def connect_request(host: str, port: int, authorization: str | None) -> bytes:
    """The CONNECT request that opens a tunnel to `host`:`port`."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_connect_head(data: bytes) -> int | None:
    """The status of a CONNECT answer once its head (up to the blank line) is in `data`; None
    while it is still to come. Raises ConnectRefused for an answer that is not 2xx, or not HTTP,
    or a head longer than MAX_CONNECT_HEAD."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_CONNECT_HEAD:
            raise ConnectRefused(0, "the proxy's answer to CONNECT has no end to its head")
        return None
    line = data[: data.find(b"\r\n")].decode("latin-1")
    version, _, rest = line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ConnectRefused(0, "the proxy's answer to CONNECT is not HTTP/1.x")
    status = int(code)
    if not 200 <= status < 300:
        raise ConnectRefused(status, "".join(ch for ch in reason[:100] if ch.isprintable()))
    return status
