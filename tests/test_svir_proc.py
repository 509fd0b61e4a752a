"""The end-to-end tests' `svir serve` child (tests.support.svir_proc) never outlives a failed
start (a `with` block whose `__enter__` raises never runs its `__exit__`, and a fixture that
failed to start one never stops it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.svir_proc import SvirProcess

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external


def test_a_svir_that_is_not_healthy_in_time_is_stopped(tmp_path: Path) -> None:
    svir = SvirProcess(None, tmp_path)
    with pytest.raises(RuntimeError, match="did not become healthy"):
        svir.start(timeout=0)  # no time at all to become healthy
    assert svir.proc is not None and svir.proc.poll() is not None
