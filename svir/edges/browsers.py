"""What a browser may make svir do, checked by the app before every request (svir.edges.app).

svir listens on this machine without keys by default, and any web page the user opens can make
the browser send it requests. So, for every route:

- a request whose `Origin` is not allowed (svir.wire.origins: this machine's pages, apps' and
  editors', the request's own origin, and `[server] allowed_origins` or SVIR_ORIGINS) is refused
  with 403 `origin_not_allowed` before any guard or handler runs: it reaches no upstream and
  changes nothing;
- a request that came in over loopback whose `Host` is a name svir does not know is refused with
  403 `host_not_allowed` (DNS rebinding: a page whose name is made to resolve to 127.0.0.1 is then
  svir's own origin to its browser, which lets it read every answer). On another listener
  (0.0.0.0, a LAN address) the names svir is reached by are not its to know: `Host` is checked
  there only once `[server] allowed_hosts` or SVIR_ALLOWED_HOSTS names some;
- a browser's request from another site that carries no `Origin` (an `<img>`, `<script>` or frame
  load, which `Sec-Fetch-Site` gives away) is refused with 403 `cross_site_request`, unless it is
  a page the user opens (a top-level navigation);
- an allowed origin gets CORS: its preflight (`OPTIONS` with `Access-Control-Request-Method`) is
  answered 204 before the key guard (a preflight carries no key), and every answer echoes the
  origin, with `Vary: Origin`;
- an admin write (POST, PUT, PATCH or DELETE under /admin/) needs `Content-Type:
  application/json` or an `Authorization` header, neither of which a form can send (415
  `json_required`); checked after the key guard, whose refusal says more.

A request without `Origin` (SDKs, curl, agents) is served as before. The refusals are in the
error shape of the route asked for (the app's error mapper), and say which setting admits what
they refuse.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from svir.asgi import Message, Scope, Send, header
from svir.config.model import ENV_ALLOWED_HOSTS, ENV_ORIGINS, ServerConfig
from svir.errors import GatewayError, auth_error, request_error
from svir.policy.auth import ADMIN_PREFIX, is_loopback
from svir.wire.origins import OriginPolicy

__all__ = ["BrowserGuard", "Headers", "with_headers"]

Headers = tuple[tuple[bytes, bytes], ...]

# What tells a request from another site that sent no Origin.
_OTHER_SITE: Final = (b"cross-site", b"same-site")
_READS: Final = frozenset({"GET", "HEAD"})
_WRITES: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A preflight is cached this long (Chromium caps it at 2 hours); a restart with other origins
# is seen within it.
_PREFLIGHT_MAX_AGE: Final = b"600"
_ALLOW_METHODS: Final = b"GET, HEAD, POST, PUT, PATCH, DELETE"
_HEADER_NAME: Final = re.compile(rb"[!#$%&'*+.^_`|~0-9a-z-]+")
_SHOWN: Final = 80
# How many Host and Origin values seen are remembered with their verdicts, each (`_verdict`).
_CACHE_CAP: Final = 512


class BrowserGuard:
    """The checks of the module doc, with the origins and hosts of `server` and `environ`
    (ConfigError for an entry of SVIR_ORIGINS or SVIR_ALLOWED_HOSTS that means nothing);
    `hostname` is this machine's name (default: the system's)."""

    def __init__(
        self, server: ServerConfig, environ: Mapping[str, str], *, hostname: str | None = None
    ) -> None:
        self.policy = OriginPolicy(
            server.origin_patterns(environ),
            server.host_patterns(environ),
            hostname=socket.gethostname() if hostname is None else hostname,
        )
        # Once names are given, Host is checked on every listener.
        self.hosts_named = bool(self.policy.hosts)
        self._hosts: dict[bytes, bool] = {}
        self._origins: dict[bytes, bool] = {}

    def check(self, scope: Scope) -> Headers | None:
        """Refuse the request (GatewayError) as the module doc says, or return the CORS headers
        of its allowed Origin (None: it sent none)."""
        origin = host = site = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = host or value
            elif key == b"origin":
                origin = origin or value
            elif key == b"sec-fetch-site":
                site = value
        if (
            host is not None
            and not _verdict(self._hosts, host, self.policy.host_allowed)
            and self._checks_host(scope)
        ):
            raise _refused_host(host)
        if origin is None:
            if site in _OTHER_SITE and not _navigation(scope):
                raise auth_error(
                    "svir refuses a request a page of another site made the browser send"
                    " without its Origin (an <img>, <script> or frame load): a page may use svir"
                    " with fetch(), from an origin svir allows ([server] allowed_origins or the"
                    f" environment variable {ENV_ORIGINS}).",
                    status=403,
                    code="cross_site_request",
                )
            return None
        if not self._origin_allowed(origin, host):
            raise _refused_origin(origin)
        return ((b"access-control-allow-origin", origin), (b"vary", b"Origin"))

    def preflight(self, scope: Scope, cors: Headers) -> Headers:
        """The headers of the 204 that answers an allowed origin's preflight: the methods svir
        takes, the headers the page asked to send (any: the origin is trusted; the SDKs send
        authorization, x-api-key, anthropic-version, openai-* and x-stainless-*), and Chrome's
        private network access to this machine."""
        out = [
            cors[0],
            (b"vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
            (b"access-control-allow-methods", _ALLOW_METHODS),
            (b"access-control-max-age", _PREFLIGHT_MAX_AGE),
        ]
        requested = header(scope, b"access-control-request-headers")
        if requested:
            names = [n.strip().lower() for n in requested.split(b",")]
            allowed = b", ".join(n for n in names if _HEADER_NAME.fullmatch(n))
            if allowed:
                out.append((b"access-control-allow-headers", allowed))
        if header(scope, b"access-control-request-private-network") == b"true":
            out.append((b"access-control-allow-private-network", b"true"))
        return tuple(out)

    def _checks_host(self, scope: Scope) -> bool:
        """Whether this request's Host is checked: it came in over loopback (or from where the
        server does not say), or names are given."""
        if self.hosts_named:
            return True
        server = scope.get("server")
        return server is None or is_loopback(server[0])

    def _origin_allowed(self, origin: bytes, host: bytes | None) -> bool:
        # The request's own origin (the console's, wherever svir is reached): what its page's
        # Host says, with whatever scheme a proxy in front may have added.
        if host:
            _, sep, authority = origin.lower().partition(b"://")
            if sep and authority == host.lower():
                return True
        return _verdict(self._origins, origin, self.policy.origin_allowed)


def check_admin_write(scope: Scope) -> None:
    """Refuse an admin write (the caller checks the method and path) that a form could have sent:
    one with neither a JSON body type nor an Authorization header (415 `json_required`)."""
    if header(scope, b"authorization") is not None:
        return
    kind = header(scope, b"content-type")
    if kind is not None and kind.partition(b";")[0].strip().lower() == b"application/json":
        return
    raise request_error(
        "svir's admin writes take 'Content-Type: application/json' (or svir's admin key as"
        " 'Authorization: Bearer <admin key>'): a web page's form can send neither, so no page"
        " can make a browser change svir. With curl: -H 'Content-Type: application/json'.",
        status=415,
        code="json_required",
    )


def is_admin_write(method: str, path: str) -> bool:
    """Whether `method path` is an admin write (`check_admin_write`)."""
    return method in _WRITES and path.startswith(ADMIN_PREFIX)


def with_headers(send: Send, headers: Headers) -> Send:
    """`send`, adding `headers` to the response's head."""

    def sending(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *headers]
        return send(message)

    return sending


def _verdict(cache: dict[bytes, bool], value: bytes, decide: Callable[[str], bool]) -> bool:
    """`decide` on a header's `value`, remembered in `cache`: bounded (emptied when full), for
    the values are the client's to choose."""
    known = cache.get(value)
    if known is None:
        known = decide(value.decode("latin-1"))
        if len(cache) >= _CACHE_CAP:
            cache.clear()
        cache[value] = known
    return known


def _navigation(scope: Scope) -> bool:
    """Whether the request is a page the user opens (a link followed, a bookmark)."""
    return (
        scope["method"] in _READS
        and header(scope, b"sec-fetch-mode") == b"navigate"
        and header(scope, b"sec-fetch-dest") == b"document"
    )


def _shown(value: bytes) -> str:
    text = value.decode("latin-1")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def _refused_origin(origin: bytes) -> GatewayError:
    if origin.strip().lower() == b"null":
        what = "a page with an opaque origin (null: a sandboxed frame, or a local file)"
        allow = "null"
    else:
        what = f"the web page at {_shown(origin)}"
        allow = origin.decode("latin-1")[:_SHOWN]
    return auth_error(
        f"svir refuses requests from {what}: a page of another origin may not use svir through"
        " your browser unless you allow it. To allow it, add it to [server] allowed_origins in"
        f" svir's config or to the environment variable {ENV_ORIGINS} (comma-separated), e.g."
        f" {ENV_ORIGINS}={allow}",
        status=403,
        code="origin_not_allowed",
    )


def _refused_host(host: bytes) -> GatewayError:
    return auth_error(
        f"svir refuses requests addressed to {_shown(host)} (the Host header): over loopback it"
        " answers localhost, *.localhost, this machine's name and IP addresses only, so that a"
        " web page whose name is made to resolve to 127.0.0.1 cannot read it. To serve this"
        " name, add it to [server] allowed_hosts in svir's config or to the environment"
        f" variable {ENV_ALLOWED_HOSTS} (comma-separated).",
        status=403,
        code="host_not_allowed",
    )
