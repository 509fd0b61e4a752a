"""The console's files under /ui (svir.edges.console_ui), through the whole app in process: every
file the page loads is there with its type, under a strict Content-Security-Policy and without
inline scripts or another origin; revalidation (ETag, 304) and gzip; unknown names and paths that
try to leave the folder are 404; and no key is needed for the files while the API wants one."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import httpx
import pytest

from svir.edges.console_ui import ConsoleFiles
from tests.keys.support import ADMIN_KEY
from tests.support.inprocess import InProcess, serve

UI = Path(__file__).resolve().parents[2] / "svir" / "console" / "ui"
CONFIG = """
[[providers]]
name = "up"
kind = "openai-compatible"
base_url = "http://up.invalid/v1"
models = ["m"]
discover = false
"""
IMPORT = re.compile(r"""(?:from\s+|import\s*\(\s*|import\s+)["']\./([^"']+)["']""")
PAGE_IMPORT = re.compile(r"import\(`\./page-\$\{page\}\.js`\)")


def handler(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "no upstream here"}})


@pytest.fixture
async def svir(tmp_path: Path):
    async with serve(tmp_path, CONFIG, handler, {"SVIR_ADMIN_KEY": ADMIN_KEY}) as app:
        yield app


def loaded_by_index(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"#]+)"', html)


async def test_ui_redirects_to_its_folder_and_serves_the_page(svir: InProcess) -> None:
    r = await svir.http.get("/ui")
    assert r.status_code == 308
    assert r.headers["location"] == "/ui/"
    r = await svir.http.get("/ui/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.text == (UI / "index.html").read_text()
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-cache"


async def test_every_file_the_page_loads_is_served_with_its_type(svir: InProcess) -> None:
    index = (await svir.http.get("/ui/")).text
    # No inline script, no inline style, no other origin: the CSP would refuse them.
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", index) == []
    assert "<style" not in index and " style=" not in index
    wanted = set(loaded_by_index(index))
    assert {"app.js", "console.css", "favicon.svg"} <= wanted
    # The modules the shell imports, and those they import, and every page the router loads.
    pages = {p.name for p in UI.glob("page-*.js")}
    assert PAGE_IMPORT.search((UI / "app.js").read_text())
    todo, seen = [*wanted, *pages], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        r = await svir.http.get(f"/ui/{name}")
        assert r.status_code == 200, name
        kind = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
        assert r.headers["content-type"].startswith(kind[name.rsplit(".", 1)[1]]), name
        if name.endswith(".js"):
            todo += IMPORT.findall(r.text)
    assert seen | {"index.html"} == {p.name for p in UI.iterdir()}, "a file nothing loads"


def test_nothing_reaches_another_origin_or_runs_inline() -> None:
    for path in UI.iterdir():
        text = path.read_text()
        # The SVG namespace is a name, not a fetch.
        for url in re.findall(r"https?://[^\s\"'`)]+", text):
            assert url == "http://www.w3.org/2000/svg", (path.name, url)
        assert "eval(" not in text and "new Function" not in text, path.name
        assert ".innerHTML" not in text and "insertAdjacentHTML" not in text, path.name
        assert "document.cookie" not in text, path.name
        assert "localStorage" not in text, path.name  # the key lives for the tab only


async def test_an_unchanged_file_is_a_304_and_gzip_is_another_representation(
    svir: InProcess,
) -> None:
    first = await svir.http.get("/ui/app.js", headers={"accept-encoding": "identity"})
    etag = first.headers["etag"]
    assert first.content == (UI / "app.js").read_bytes()
    assert "content-encoding" not in first.headers
    again = await svir.http.get(
        "/ui/app.js", headers={"if-none-match": etag, "accept-encoding": "identity"}
    )
    assert again.status_code == 304 and again.content == b""
    zipped = await svir.http.get("/ui/app.js", headers={"accept-encoding": "gzip, br"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.headers["vary"] == "accept-encoding"
    assert zipped.headers["etag"] != etag
    # httpx decodes it: the same bytes, fewer on the wire.
    assert zipped.content == first.content
    assert int(zipped.headers["content-length"]) < len(first.content)
    # The identity tag does not match the gzip representation.
    stale = await svir.http.get(
        "/ui/app.js", headers={"if-none-match": etag, "accept-encoding": "gzip"}
    )
    assert stale.status_code == 200
    refused = await svir.http.get("/ui/app.js", headers={"accept-encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers


@pytest.mark.parametrize(
    "path",
    [
        "/ui/nope.js",
        "/ui/%2e%2e",
        "/ui/..%2f__init__.py",
        "/ui/..%2F..%2Fpyproject.toml",
        "/ui/../edges/console_ui.py",
        "/ui/%2e%2e%2f%2e%2e%2fconfig.py",
        "/ui/.hidden",
        "/ui/pages/x.js",
        "/ui/index.html%00.js",
    ],
)
async def test_unknown_names_and_paths_out_of_the_folder_are_404(
    svir: InProcess, path: str
) -> None:
    r = await svir.http.get(path)
    assert r.status_code == 404, (path, r.text[:200])
    assert r.json()["error"]["code"] == "not_found"


async def test_the_files_need_no_key_while_the_api_does(svir: InProcess) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = await svir.http.post("/admin/keys", json={"name": "ui"}, headers=admin)
    assert made.status_code == 201, made.text
    assert (await svir.http.get("/v1/models")).status_code == 401
    for path in ("/ui", "/ui/", "/ui/app.js", "/ui/console.css"):
        r = await svir.http.get(path)
        assert r.status_code in (200, 308), (path, r.text[:200])
    # The exemption is the console's folder, not a prefix of other paths.
    assert (await svir.http.get("/uix")).status_code == 401


def test_the_files_are_read_once_and_compressed_when_worth_it() -> None:
    files = ConsoleFiles()
    assets = files.load()
    assert files.load() is assets
    assert set(assets) == {p.name for p in UI.iterdir()}
    app_js = assets["app.js"]
    assert app_js.gzipped is not None
    assert gzip.decompress(app_js.gzipped) == app_js.body


def test_a_cold_load_of_the_overview_is_small() -> None:
    # What the first visit fetches: the shell, its modules and the overview's, as sent gzipped.
    # A budget for the page's weight (no framework, no build), not a measurement of time.
    assets = ConsoleFiles().load()
    shell = re.findall(r'(?:src|href)="([^"#]+)"', assets["index.html"].body.decode())
    first_visit = {"index.html", *shell, "page-overview.js", "charts.js"}
    sent = sum(len(assets[name].gzipped or assets[name].body) for name in first_visit)
    assert sent < 40_000, sent
