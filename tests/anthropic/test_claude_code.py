"""Claude Code itself (`claude -p`, npm's @anthropic-ai/claude-code, installed by `make test` through
scripts/agents.sh) pointed at a real `svir serve` by `ANTHROPIC_BASE_URL`: a task that makes
it call a tool and finish, through svir to a scripted model server, and a plain question through
svir to the real llama.cpp server (Gemma 3 270M, managed by svir).

Nothing leaves loopback: Claude Code's non-essential traffic is off, and its proxy is a closed
local port (svir and the model servers are reached directly, by NO_PROXY), its HOME a temp dir.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.anthropic.agent_model import FINAL, TOOL, AgentModel
from tests.support.agents import gemma_answering, npm_binary, scripted_provider, served
from tests.support.mock_server import MockServerThread
from tests.support.svir_proc import SvirProcess, free_port

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

MAIN_MODEL = "claude-sonnet-4-5"
SMALL_MODEL = "claude-haiku-4-5"


def claude_binary() -> Path:
    return npm_binary("claude")


def routes(target_main: str, target_small: str) -> str:
    return (
        f'[[routes]]\nname = "{MAIN_MODEL}"\ntargets = [{{ model = "{target_main}" }}]\n\n'
        f'[[routes]]\nname = "{SMALL_MODEL}"\ntargets = [{{ model = "{target_small}" }}]\n'
    )


def run_claude(
    svir: SvirProcess, cwd: Path, home: Path, prompt: str, *extra: str, **env: str
) -> subprocess.CompletedProcess[str]:
    closed = f"http://127.0.0.1:{free_port()}"
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": svir.url,
        "ANTHROPIC_API_KEY": "sk-svir-test",
        "ANTHROPIC_MODEL": MAIN_MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": SMALL_MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": SMALL_MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        **env,
    }
    return subprocess.run(
        [str(claude_binary()), "-p", prompt, *extra],
        cwd=cwd,
        env=environ,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def agent(agent_dirs: tuple[Path, Path]) -> Iterator[tuple[AgentModel, str]]:
    """The scripted model and the base URL it is served on."""
    work, _ = agent_dirs
    (work / "notes.txt").write_text("svir was here\nsecond line\n")
    model = AgentModel({"file_path": str(work / "notes.txt")})
    with MockServerThread(model) as server:
        yield model, server.base_url


def test_claude_code_calls_a_tool_and_finishes_through_svir(
    tmp_path: Path, agent_dirs: tuple[Path, Path], agent: tuple[AgentModel, str]
) -> None:
    work, home = agent_dirs
    model, base_url = agent
    config = scripted_provider(base_url, "main", "small") + routes("agent/main", "agent/small")
    svir = SvirProcess(config, tmp_path).start()
    try:
        done = run_claude(
            svir, work, home, "Read notes.txt and tell me what it says.", "--allowedTools", TOOL
        )
    finally:
        svir.stop()
    assert done.returncode == 0, (done.stdout, done.stderr, svir.log()[-4000:])
    # The scripted model's last words quote the first line of the tool's result.
    assert FINAL in done.stdout and "svir was here" in done.stdout, done.stdout
    turns = [b for b in model.bodies() if b["model"] == "main"]
    assert len(turns) == 2, [b["model"] for b in model.bodies()]
    first, second = turns
    # Claude Code's system blocks and its tools reach the model as a chat request.
    assert first["messages"][0]["role"] == "system" and first["messages"][0]["content"]
    names = {t["function"]["name"] for t in first["tools"]}
    assert TOOL in names and "Bash" in names
    assert all("$schema" not in t["function"]["parameters"] for t in first["tools"])
    # The second turn carries the call and its result, as OpenAI servers take them.
    call, result = second["messages"][-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == TOOL
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert "svir was here" in result["content"]
    for request in model.requests:
        names = [name.lower() for name in request.headers]
        assert not any(n.startswith("anthropic") or n == "x-api-key" for n in names), names
    assert '"status":500' not in svir.log()


def test_claude_code_asks_the_real_llama_server_through_svir(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # Without Claude Code's tools (`--tools ""`, see gemma_answering) its prompt is ~7k tokens
    # (~21k with them, which the scripted test sends). Output is bounded in case the grammar is
    # not applied.
    config = gemma_answering("4", routes("local/gemma", "local/gemma"))
    svir = SvirProcess(config, tmp_path).start()
    started = time.monotonic()
    try:
        done = run_claude(
            svir, work, home, "What is 2 + 2?", "--tools", "", CLAUDE_CODE_MAX_OUTPUT_TOKENS="64"
        )
    finally:
        svir.stop()
    took = time.monotonic() - started
    log = svir.log()
    assert done.returncode == 0, (done.stdout, done.stderr, log[-4000:])
    assert done.stdout.strip() == "4", (done.stdout, done.stderr, log[-4000:])
    lines = served(log, "/v1/messages")
    assert lines and all('"status":200' in line for line in lines), lines
    assert all('"served_model":"local/gemma"' in line for line in lines)
    prompts = [int(n) for n in re.findall(r'"prompt_tokens":([0-9]+)', log)]
    assert prompts and max(prompts) > 2000, prompts  # Claude Code's own system prompt
    print(f"claude -p via svir to llama-server: {took:.1f} s, prompt tokens {prompts}")
