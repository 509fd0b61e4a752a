"""The web console's static files (`svir/console/ui/`, shipped in the package) served under `/ui`.

`/ui` redirects to `/ui/` (the page's relative URLs resolve under it), `/ui/` is `index.html`, and
`/ui/<name>` is one file of that folder, which is flat: a name is a key of the table read from the
package, so no path reaches outside it. Every answer carries a strict Content-Security-Policy (the
page's own scripts, styles and API only: no inline script, no other origin), an ETag to revalidate
against (`no-cache`: a new svir's files are seen at once, an unchanged file costs a 304), and is
gzipped for a client that takes it. The files are read and compressed once, on the first request:
nothing is spent while nobody opens the console.

The files need no auth (the page holds no data: it asks the admin API, with the admin key the
user gives it, svir.edges.keys_service); the key guard is told to let `/ui` through.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from svir.asgi import Receive, Scope, Send, header
from svir.edges.app import App
from svir.errors import request_error
from svir.policy.auth import Authenticator

__all__ = ["CSP", "UI_PACKAGE", "Asset", "ConsoleFiles", "install"]

UI_PACKAGE: Final = "svir.console"
UI_FOLDER: Final = "ui"
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
}
# Compressing a PNG or a tiny file gains nothing.
_COMPRESSED_TYPES: Final = (".html", ".js", ".css", ".svg", ".json", ".txt")
_MIN_GZIP: Final = 512
_SECURITY_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


@dataclass(frozen=True, slots=True)
class Asset:
    """One file as served: its bytes, their gzip (None when not worth it), and its ETag."""

    content_type: str
    body: bytes
    gzipped: bytes | None
    etag: str


class ConsoleFiles:
    """The console's files by name, read from the package once (`load`)."""

    def __init__(self, package: str = UI_PACKAGE, folder: str = UI_FOLDER) -> None:
        self.package = package
        self.folder = folder
        self._assets: dict[str, Asset] | None = None

    def load(self) -> dict[str, Asset]:
        if self._assets is None:
            self._assets = read_assets(self.package, self.folder)
        return self._assets

    def get(self, name: str) -> Asset | None:
        return self.load().get(name)


def read_assets(package: str, folder: str) -> dict[str, Asset]:
    """Every file of the package's folder with a known type (not its subfolders)."""
    out: dict[str, Asset] = {}
    root = resources.files(package).joinpath(folder)
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        content_type = _TYPES.get(suffix)
        if content_type is None or not entry.is_file() or name.startswith("."):
            continue
        body = entry.read_bytes()
        gzipped = None
        if suffix in _COMPRESSED_TYPES and len(body) >= _MIN_GZIP:
            # mtime=0: the same bytes on every start, so a cache keeps them.
            gzipped = gzip.compress(body, compresslevel=9, mtime=0)
        digest = hashlib.sha256(body).hexdigest()[:20]
        out[name] = Asset(content_type, body, gzipped, f'"{digest}"')
    return out


def _accepts_gzip(scope: Scope) -> bool:
    value = header(scope, b"accept-encoding")
    if value is None:
        return False
    for part in value.lower().split(b","):
        coding, _, params = part.strip().partition(b";")
        if coding.strip() in (b"gzip", b"*"):
            return params.replace(b" ", b"") not in (b"q=0", b"q=0.0", b"q=0.00", b"q=0.000")
    return False


def _matches(scope: Scope, etag: str) -> bool:
    given = header(scope, b"if-none-match")
    if given is None:
        return False
    tags = [t.strip().removeprefix(b"W/") for t in given.split(b",")]
    return b"*" in tags or etag.encode() in tags


class ConsoleRoutes:
    """The handlers of `/ui`, `/ui/` and `/ui/{asset}`."""

    def __init__(self, files: ConsoleFiles) -> None:
        self.files = files

    async def redirect(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        await send(
            {
                "type": "http.response.start",
                "status": 308,
                "headers": [
                    (b"location", b"/ui/"),
                    (b"content-length", b"0"),
                    (b"x-request-id", rid.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        return 308

    async def index(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        return await self._serve(scope, send, rid, "index.html")

    async def asset(
        self, scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        return await self._serve(scope, send, rid, scope["path_params"]["asset"])

    async def _serve(self, scope: Scope, send: Send, rid: str, name: str) -> int:
        asset = self.files.get(name)
        if asset is None:
            raise request_error(f"The console has no file {name!r}.", status=404, code="not_found")
        gzipped = asset.gzipped is not None and _accepts_gzip(scope)
        # The compressed bytes are another representation: another tag.
        etag = asset.etag[:-1] + '-gz"' if gzipped else asset.etag
        headers: list[tuple[bytes, bytes]] = [
            (b"etag", etag.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", rid.encode()),
            *_SECURITY_HEADERS,
        ]
        if asset.gzipped is not None:
            headers.append((b"vary", b"accept-encoding"))
        if _matches(scope, etag):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return 304
        body = asset.gzipped if gzipped and asset.gzipped is not None else asset.body
        headers.append((b"content-type", asset.content_type.encode()))
        headers.append((b"content-length", str(len(body)).encode()))
        if gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return 200


def install(app: App, auth: Authenticator, files: ConsoleFiles | None = None) -> ConsoleRoutes:
    """Serve the console under `/ui` on `app`, past the key guard `auth`."""
    routes = ConsoleRoutes(files or ConsoleFiles())
    app.routes.add("GET", "/ui", routes.redirect)
    app.routes.add("GET", "/ui/", routes.index)
    app.routes.add("GET", "/ui/{asset}", routes.asset)
    auth.exempt_paths.add("/ui")
    auth.exempt_prefixes = (*auth.exempt_prefixes, "/ui/")
    return routes
