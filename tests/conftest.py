"""Shared pytest fixtures.

llama part: real `llama-server` processes serving Gemma 3 270M, one of each kind per session, on
free loopback ports, stopped when the session ends. They are part of the test setup (`make
install` builds and installs them), so a missing binary or model fails the tests that need them;
it does not skip them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from svir.edges.llama_server import (
    LlamaServer,
    ensure_gemma_model,
    find_llama_server,
    gemma_tools_template,
)
from svir.errors import LlamaServerError

# Hypothesis without its 200 ms deadline per example: the deadline measures the machine, and a
# correct parser misses it under load or on a slow machine (`nohup make test &` beside a build).
# Each property test still says how many examples it wants; a failure prints the blob that
# reproduces it. SVIR_HYPOTHESIS_PROFILE=default brings Hypothesis' own settings back.
settings.register_profile("svir", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("SVIR_HYPOTHESIS_PROFILE", "svir"))

LLAMA_CTX = 4096
LLAMA_SMALL_CTX = 256

_llama_startup_seconds: dict[str, float] = {}


def _start_llama(tmp_path_factory: pytest.TempPathFactory, name: str, ctx: int) -> LlamaServer:
    try:
        binary = find_llama_server()
        model = ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(
            f"{exc}\nThe real llama-server and its model are required for these tests: "
            "run `make install`.",
            pytrace=False,
        )
    log_path = tmp_path_factory.mktemp("llama") / f"{name}.log"
    server = LlamaServer.start(
        binary, model, ctx=ctx, chat_template_file=gemma_tools_template(), log_path=log_path
    )
    try:
        _llama_startup_seconds[name] = server.wait_healthy(timeout=120)
    except LlamaServerError as exc:
        server.stop()
        pytest.fail(str(exc), pytrace=False)
    return server


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A real llama-server with svir's Gemma tools template and a 4096-token context."""
    server = _start_llama(tmp_path_factory, "llama_server", LLAMA_CTX)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_server_small_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """Like `llama_server`, with a 256-token context, for context-overflow tests."""
    server = _start_llama(tmp_path_factory, "llama_server_small_ctx", LLAMA_SMALL_CTX)
    yield server
    server.stop()


@pytest.fixture
def agent_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """An npm agent's work dir and its HOME (tests/anthropic/test_claude_code.py,
    tests/responses/test_codex.py)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    return work, home


# The `external` marker (pyproject.toml): a test that starts a process outside pytest. `make
# test-fast` (`pytest -m "not external"`) runs the others, the in-process ones, in a few minutes. A
# module whose every test starts one says so itself (`pytestmark = pytest.mark.external`), a test
# among in-process ones with `@pytest.mark.external`; a fixture that starts one is listed here, and
# every test that uses it, directly or through another fixture, is marked. Each is named by the
# file that defines it: a name alone is not enough (`svir` is a process in some modules and an app
# in process in others). tests/test_suite_rules.py checks that each entry still names a fixture.
PROCESS_FIXTURES: dict[str, str] = {
    "tests/conftest.py::llama_server": "the real llama-server of the session",
    "tests/conftest.py::llama_server_small_ctx": "the session's second llama-server, 256 tokens",
    "tests/cli/conftest.py::svir_replay": "`svir serve` over the replay server, per module",
    "tests/cli/conftest.py::svir_llama": "`svir serve` over the real llama-server, per module",
    "tests/test_gateway_replay.py::svir": "`svir serve` over the replay server, for the SDK tests",
    "tests/test_server_limits.py::timeouts": "`svir serve` with short connection timeouts",
    "tests/test_server_limits.py::sizes": "`svir serve` with small head limits",
    "tests/test_llama_server.py::own_server": "a llama-server of the test's own, which it stops",
}


def fixture_key(fixturedef: pytest.FixtureDef[object]) -> str:
    """A fixture as PROCESS_FIXTURES names it: the file that defines it, then its name."""
    return f"{fixturedef.func.__module__.replace('.', '/')}.py::{fixturedef.argname}"


# First, so that `-m` deselects by the marks given here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # pytest's own record of a test function's fixtures (the one pytest-asyncio reads too):
        # for each name in the closure, the definitions it sees, the one it uses last.
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        used = {fixture_key(defs[-1]) for defs in info.name2fixturedefs.values() if defs}
        if not used.isdisjoint(PROCESS_FIXTURES):
            item.add_marker(pytest.mark.external)


# A skipped (or expected-to-fail) test fails the run: the suite's components are all installed by
# `make test`, so a skip can only hide a test that did not run in a run that looks green.
_not_run: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _not_run.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _not_run and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _llama_startup_seconds:
        started = ", ".join(f"{k} {v:.2f} s" for k, v in _llama_startup_seconds.items())
        terminalreporter.write_line(f"llama-server startup (until /health is 200): {started}")
    if _not_run:
        terminalreporter.write_line(
            f"{len(_not_run)} test(s) skipped or xfailed, which fails the run (tests/conftest.py): "
            + ", ".join(_not_run[:10]),
            red=True,
        )
