"""The rules tests/conftest.py holds for the whole suite, run on a throwaway test file in a pytest
of its own: a skipped or expected-to-fail test fails the run, Hypothesis runs without its
per-example deadline, and a test on a fixture that starts a process is `external` (out of `make
test-fast`), as is one marked so."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROCESS_FIXTURES

ROOT = Path(__file__).resolve().parent.parent


def pytest_on(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_throwaway.py"
    test_file.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), *args, str(test_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.external
def test_a_skip_fails_a_run_that_is_otherwise_green(tmp_path: Path) -> None:
    done = pytest_on(
        tmp_path, "import pytest\ndef test_a(): pass\ndef test_b(): pytest.skip('x')\n"
    )
    assert done.returncode == 1, done.stdout
    assert "1 test(s) skipped or xfailed, which fails the run" in done.stdout
    assert "test_throwaway.py::test_b" in done.stdout


@pytest.mark.external
def test_an_xfail_fails_the_run_too(tmp_path: Path) -> None:
    source = "import pytest\n@pytest.mark.xfail\ndef test_a(): assert False\n"
    done = pytest_on(tmp_path, source)
    assert done.returncode == 1, done.stdout


@pytest.mark.external
def test_a_run_without_skips_passes(tmp_path: Path) -> None:
    done = pytest_on(tmp_path, "def test_a(): pass\ndef test_b(): pass\n")
    assert done.returncode == 0, done.stdout


@pytest.mark.external
def test_hypothesis_has_no_deadline(tmp_path: Path) -> None:
    # An example slower than Hypothesis' default 200 ms deadline passes under svir's profile.
    source = (
        "import time\nfrom hypothesis import given, settings, strategies as st\n"
        "@settings(max_examples=2)\n@given(st.integers())\n"
        "def test_slow(n): time.sleep(0.3)\n"
    )
    done = pytest_on(tmp_path, source)
    assert done.returncode == 0, done.stdout


MARKED = """import pytest
@pytest.fixture
def through(llama_server): pass
def test_in_process(): pass
def test_on_llama(llama_server): pass
def test_through_a_fixture(through): pass
@pytest.mark.external
def test_marked(): pass
"""


@pytest.mark.external
def test_a_test_on_a_process_fixture_is_external(tmp_path: Path) -> None:
    # Collected only: nothing starts. `-m` deselects by the marks the conftest gives.
    fast = pytest_on(tmp_path, MARKED, "--collect-only", "-m", "not external")
    assert fast.returncode == 0, fast.stdout
    assert [line for line in fast.stdout.splitlines() if "::" in line] == [
        "test_throwaway.py::test_in_process"
    ]
    slow = pytest_on(tmp_path, MARKED, "--collect-only", "-m", "external")
    assert [line for line in slow.stdout.splitlines() if "::" in line] == [
        "test_throwaway.py::test_on_llama",
        "test_throwaway.py::test_through_a_fixture",
        "test_throwaway.py::test_marked",
    ]


def test_each_process_fixture_is_where_the_list_says() -> None:
    # A fixture renamed or moved would leave its tests unmarked, and in `make test-fast`.
    for key in PROCESS_FIXTURES:
        path, name = key.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert getattr(getattr(module, name, None), "name", None) == name, key


# What a test module writes when it starts a process outside pytest itself.
_STARTS_A_PROCESS = ("SvirProcess(", "chromium.launch(", "subprocess.Popen(", "npm_binary(")


def test_a_test_module_that_starts_a_process_is_external() -> None:
    # Its tests are marked by the module (`pytestmark`, or a mark on each) or reach the process
    # through a fixture of PROCESS_FIXTURES; else `make test-fast` would run them, on a machine
    # that may lack what they start (a browser test slipped through this way once).
    fixture_files = {key.split("::")[0] for key in PROCESS_FIXTURES}
    unmarked = sorted(
        relative
        for path in (ROOT / "tests").rglob("test_*.py")
        if (relative := str(path.relative_to(ROOT))) not in fixture_files
        and any(call in (source := path.read_text(encoding="utf-8")) for call in _STARTS_A_PROCESS)
        and "mark.external" not in source
    )
    assert unmarked == []
