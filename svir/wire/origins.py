"""Which web pages and which host names may reach svir through a browser: a request's `Origin`
and `Host` read, and the patterns of `[server] allowed_origins` and `allowed_hosts` (and of their
environment variables) parsed and matched. Pure: text in, verdicts out; the app applies them to
every request (svir.edges.browsers).

An origin is `scheme://host[:port]` (RFC 6454), the port left out when it is the scheme's
default, or `null` for an opaque one (a sandboxed frame; a local file in most browsers). Allowed
without saying: http and https pages on this machine (`localhost`, `*.localhost`, `127.x.y.z`,
`[::1]`, `0.0.0.0`; any port), and the schemes of apps and editors that embed a page
(`APP_SCHEMES`). A pattern is an origin whose host may be `*` (any) or begin with `*.` (any name
under it, not the name itself) and whose port may be `*` (any; no port: the default one only);
`*` alone allows every origin, `null` the opaque one. This is what Ollama's OLLAMA_ORIGINS
takes, written `https://*.example.com` or `chrome-extension://*` alike.

A host is what `Host` names, without its port. Allowed without saying: `localhost`, `*.localhost`
(browsers resolve those themselves, to this machine), this machine's own name, and any IP
address: a page cannot make its browser send an address it was not loaded from, so only a name
can be rebound (DNS rebinding). A host pattern is a name, `*.` a name (the names under it) or
`*` (any).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from svir.wire.errors import WireError

__all__ = [
    "APP_SCHEMES",
    "NULL_ORIGIN",
    "HostPattern",
    "Origin",
    "OriginPattern",
    "OriginPolicy",
    "PatternError",
    "is_local_name",
    "is_loopback",
    "parse_host",
    "parse_host_pattern",
    "parse_origin",
    "parse_origin_pattern",
    "split_list",
]

# Pages of desktop apps (Electron, Tauri), local files and editors' webviews (VS Code, Cursor):
# allowed from any host, as Ollama allows them.
APP_SCHEMES: Final = frozenset({"app", "file", "tauri", "vscode-webview", "vscode-file"})
_DEFAULT_PORTS: Final = {"http": "80", "https": "443", "ws": "80", "wss": "443"}
_SCHEME: Final = re.compile(r"[a-z][a-z0-9+.-]*")
_PORT: Final = re.compile(r"[0-9]{1,5}")
# A host name's characters (IDNs come as punycode); `*` only as a whole first label, checked apart.
_NAME: Final = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")
_SHOWN: Final = 60


class PatternError(WireError):
    """An entry of allowed_origins or allowed_hosts that means nothing; its str says why."""


@dataclass(frozen=True, slots=True)
class Origin:
    """An origin as a browser sends it: scheme and host lowercased, the port None when it is the
    scheme's default; the opaque origin is `NULL_ORIGIN`."""

    scheme: str
    host: str
    port: str | None


NULL_ORIGIN: Final = Origin("null", "", None)


@dataclass(frozen=True, slots=True)
class OriginPattern:
    """One entry of allowed origins (see the module doc); `text` as written."""

    text: str
    # None: every origin (`*`).
    scheme: str | None
    # A name or address, `*` (any), or `*.<name>` (the names under it).
    host: str
    # Digits, `*` (any), or None (the default port only).
    port: str | None

    def matches(self, origin: Origin) -> bool:
        if self.scheme is None:
            return True
        if origin.scheme != self.scheme:
            return False
        if self.port not in ("*", origin.port):
            return False
        return _host_matches(self.host, origin.host)


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One entry of allowed hosts (see the module doc); `text` as written."""

    text: str
    # A name, `*` (any), or `*.<name>` (the names under it).
    host: str

    def matches(self, host: str) -> bool:
        return _host_matches(self.host, host)


def _host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str | None) -> bool:
    """Whether `host` (an address, or `localhost`) is this machine. Names other than localhost
    are not resolved: they count as elsewhere."""
    if host is None:
        return False
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def is_local_name(host: str) -> bool:
    """Whether a page's host (lowercased, without brackets) is this machine: a loopback address,
    `localhost` or a name under it (RFC 6761: browsers resolve those to loopback themselves), or
    0.0.0.0 (which browsers on Linux and macOS connect to this machine)."""
    return is_loopback(host) or host.endswith(".localhost") or host == "0.0.0.0"


def _split_authority(authority: str) -> tuple[str, str | None] | None:
    """(host, port) of `host[:port]` or `[v6][:port]`, host without brackets; None if malformed."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return None
        return host, rest[1:]
    host, colon, port = authority.rpartition(":")
    if not colon:
        return authority, None
    if ":" in host:  # an IPv6 address without brackets is not an authority
        return None
    return host, port


def parse_origin(value: str) -> Origin | None:
    """The origin an `Origin` header names, or None when it is not one (a browser never sends
    that)."""
    value = value.strip().lower()
    if value == "null":
        return NULL_ORIGIN
    scheme, sep, authority = value.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme) or any(c in authority for c in "/?#@ "):
        return None
    parts = _split_authority(authority)
    if parts is None:
        return None
    host, port = parts
    if port is not None:
        if not _PORT.fullmatch(port):
            return None
        if port == _DEFAULT_PORTS.get(scheme):
            port = None
    return Origin(scheme, host, port)


def parse_host(value: str) -> str | None:
    """The host a `Host` header names (lowercased, without port, brackets or a final dot), or
    None when it is not one."""
    parts = _split_authority(value.strip().lower())
    if parts is None:
        return None
    host, port = parts
    if port is not None and not _PORT.fullmatch(port):
        return None
    if not host:
        return None
    return host.removesuffix(".") or None


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def _checked_host(text: str, host: str, what: str, example: str) -> str:
    """`host` of a pattern, checked: a name or address, `*`, or `*.<name>`."""
    if host == "*":
        return host
    name = host[2:] if host.startswith("*.") else host
    if "*" in name:
        raise PatternError(
            f"{_shown(text)}: * may stand for the whole host or its first label"
            f" ({example}), nothing else"
        )
    try:
        ipaddress.ip_address(name)
        return host
    except ValueError:
        pass
    if not _NAME.fullmatch(name):
        raise PatternError(f"{_shown(text)}: {_shown(name)} is not a {what}")
    return host.removesuffix(".")


def parse_origin_pattern(text: str) -> OriginPattern:
    """One entry of allowed origins (see the module doc), or PatternError saying what is wrong."""
    entry = text.strip().lower()
    if not entry:
        raise PatternError("an empty entry: write an origin, e.g. https://app.example.com")
    if entry == "*":
        return OriginPattern(text, None, "*", "*")
    if entry == "null":
        return OriginPattern(text, "null", "", None)
    scheme, sep, authority = entry.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        raise PatternError(
            f"{_shown(text)} is not an origin: write scheme://host[:port], e.g."
            " https://app.example.com (or * for every origin, null for the opaque one)"
        )
    if any(c in authority for c in "/?#"):
        bare = f"{scheme}://{re.split(r'[/?#]', authority, maxsplit=1)[0]}"
        raise PatternError(
            f"{_shown(text)}: an origin has no path, and a browser sends none: write {bare}"
        )
    if "@" in authority or any(c.isspace() for c in authority):
        raise PatternError(f"{_shown(text)} is not an origin: write scheme://host[:port]")
    parts = _split_authority(authority)
    if parts is None:
        raise PatternError(f"{_shown(text)} is not an origin: write scheme://host[:port]")
    host, port = parts
    if not host and scheme not in APP_SCHEMES:
        raise PatternError(
            f"{_shown(text)} names no host: write e.g. {scheme}://app.example.com, or"
            f" {scheme}://* for any host"
        )
    if host:
        host = _checked_host(text, host, "host name", "https://*.example.com")
    if port is not None and port != "*":
        if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
            raise PatternError(
                f"{_shown(text)}: the port must be a number from 1 to 65535, or * for any"
            )
        port = str(int(port))
        if port == _DEFAULT_PORTS.get(scheme):
            port = None
    if host == "*" and port is None:
        # `app://*` is any page of that scheme, whatever port (Ollama's patterns read so).
        port = "*"
    return OriginPattern(text, scheme, host, port)


def parse_host_pattern(text: str) -> HostPattern:
    """One entry of allowed hosts (see the module doc), or PatternError saying what is wrong."""
    entry = text.strip().lower()
    if not entry:
        raise PatternError("an empty entry: write a host name, e.g. svir.example.com")
    if "://" in entry or "/" in entry:
        raise PatternError(
            f"{_shown(text)}: a host is a name alone, without scheme or path: e.g. svir.example.com"
        )
    if ":" in entry.strip("[]") and not _is_address(entry.strip("[]")):
        raise PatternError(
            f"{_shown(text)}: a host is a name alone, without a port (every port of it is"
            " allowed): e.g. svir.example.com"
        )
    return HostPattern(text, _checked_host(text, entry.strip("[]"), "host name", "*.example.com"))


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def split_list(value: str) -> list[str]:
    """The entries of a comma-separated environment variable (OLLAMA_ORIGINS' syntax): spaces
    and quotes around the value and each entry dropped, empty entries skipped."""
    out = []
    for part in value.strip().strip("\"'").split(","):
        entry = part.strip().strip("\"'").strip()
        if entry:
            out.append(entry)
    return out


class OriginPolicy:
    """Which origins and hosts svir serves: the defaults of the module doc, `origins` and
    `hosts` (the configured patterns), and `hostname`, this machine's name."""

    def __init__(
        self,
        origins: Iterable[OriginPattern] = (),
        hosts: Iterable[HostPattern] = (),
        *,
        hostname: str | None = None,
    ) -> None:
        self.origins = tuple(origins)
        self.hosts = tuple(hosts)
        self.hostname = hostname.lower().removesuffix(".") if hostname else None

    def origin_allowed(self, value: str) -> bool:
        """Whether a page of the origin an `Origin` header names may use svir."""
        origin = parse_origin(value)
        if origin is None:
            return False
        if origin.scheme in ("http", "https") and is_local_name(origin.host):
            return True
        if origin.scheme in APP_SCHEMES:
            return True
        return any(pattern.matches(origin) for pattern in self.origins)

    def host_allowed(self, value: str) -> bool:
        """Whether svir answers a request whose `Host` header is `value` (empty: as if there
        were none, which HTTP/1.0 allows)."""
        if not value.strip():
            return True
        host = parse_host(value)
        if host is None:
            return False
        if host == "localhost" or host.endswith(".localhost") or host == self.hostname:
            return True
        if _is_address(host):
            return True
        return any(pattern.matches(host) for pattern in self.hosts)
