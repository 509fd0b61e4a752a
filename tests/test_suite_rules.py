"""The rules tests/conftest.py holds for the whole suite, run on a throwaway test file in a pytest
of its own: a skipped or expected-to-fail test fails the run, and Hypothesis runs without its
per-example deadline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_on(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_throwaway.py"
    test_file.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(test_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_skip_fails_a_run_that_is_otherwise_green(tmp_path: Path) -> None:
    done = pytest_on(
        tmp_path, "import pytest\ndef test_a(): pass\ndef test_b(): pytest.skip('x')\n"
    )
    assert done.returncode == 1, done.stdout
    assert "1 test(s) skipped or xfailed, which fails the run" in done.stdout
    assert "test_throwaway.py::test_b" in done.stdout


def test_an_xfail_fails_the_run_too(tmp_path: Path) -> None:
    source = "import pytest\n@pytest.mark.xfail\ndef test_a(): assert False\n"
    done = pytest_on(tmp_path, source)
    assert done.returncode == 1, done.stdout


def test_a_run_without_skips_passes(tmp_path: Path) -> None:
    done = pytest_on(tmp_path, "def test_a(): pass\ndef test_b(): pass\n")
    assert done.returncode == 0, done.stdout


def test_hypothesis_has_no_deadline(tmp_path: Path) -> None:
    # An example slower than Hypothesis' default 200 ms deadline passes under svir's profile.
    source = (
        "import time\nfrom hypothesis import given, settings, strategies as st\n"
        "@settings(max_examples=2)\n@given(st.integers())\n"
        "def test_slow(n): time.sleep(0.3)\n"
    )
    done = pytest_on(tmp_path, source)
    assert done.returncode == 0, done.stdout
