"""The Codex CLI itself (`codex exec`, npm's @openai/codex, installed by `make test` through
scripts/agents.sh) pointed at a real `svir serve` by a custom model provider with
`wire_api = "responses"`: a task that makes it run its shell tool and finish, through svir to a
scripted chat-completions model server, and a plain question through svir to the real llama.cpp
server (Gemma 3 270M, managed by svir).

Nothing leaves loopback: Codex's update check, analytics, feedback, OpenTelemetry and the features
that reach GitHub and chatgpt.com are off in its config (`--strict-config`, so a key a new version
renames fails here), its proxies are a closed local port (svir is reached directly, by NO_PROXY),
its HOME and CODEX_HOME temp dirs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.anthropic.agent_model import FINAL, AgentModel
from tests.support.agents import gemma_answering, npm_binary, scripted_provider, served
from tests.support.mock_server import MockServerThread
from tests.support.mock_transport import Handler, MockRequest, MockResponse
from tests.support.svir_proc import SvirProcess, free_port

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

MODEL = "codex-main"
SHELL = "exec_command"  # Codex 0.169's shell tool (unified exec)
MARK = "svir-codex-was-here"
# The config that keeps Codex on loopback (docs/responses.md, "Codex").
QUIET = """
check_for_update_on_startup = false
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"
[features]
plugins = false
remote_plugin = false
apps = false
tool_suggest = false
"""
# Flags that leave Codex without any tool (for a model server whose grammar must apply).
NO_TOOLS = (
    *("--disable", "shell_tool", "--disable", "unified_exec", "--disable", "multi_agent"),
    *("--disable", "goals", "--disable", "view_image", "--disable", "image_generation"),
    *("-c", 'web_search="disabled"', "-c", "tools.experimental_request_user_input={enabled=false}"),
)


def codex_binary() -> Path:
    return npm_binary("codex")


def run_codex(
    svir: SvirProcess, work: Path, home: Path, prompt: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], str]:
    """`codex exec` in `work`; its result, its JSONL events and its last message."""
    codex_home = home / "codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "svir"\n'
        + QUIET
        + f'[model_providers.svir]\nname = "svir"\nbase_url = "{svir.base_url}"\n'
        'wire_api = "responses"\nenv_key = "SVIR_API_KEY"\n'
    )
    closed = f"http://127.0.0.1:{free_port()}"
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "SVIR_API_KEY": "sk-svir-test",
        "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
        "ALL_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    last = home / "last-message.txt"
    done = subprocess.run(
        [str(codex_binary()), "exec", "--strict-config", "--skip-git-repo-check", "--ephemeral",
         "--json", "--sandbox", "danger-full-access", "--output-last-message", str(last),
         *extra, prompt],
        cwd=work,
        env=environ,
        stdin=subprocess.DEVNULL,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, events, last.read_text() if last.exists() else ""


def routes(target: str) -> str:
    return f'[[routes]]\nname = "{MODEL}"\ntargets = [{{ model = "{target}" }}]\n'


def codex_through_svir(
    model: Handler, tmp_path: Path, work: Path, home: Path, prompt: str, *extra: str
) -> tuple[list[dict[str, Any]], str, str]:
    """`codex exec` through svir to `model`, which must succeed: Codex's events and last message,
    and svir's log."""
    with MockServerThread(model) as upstream:
        config = scripted_provider(upstream.base_url, "main") + routes("agent/main")
        with SvirProcess(config, tmp_path) as svir:
            done, events, last = run_codex(svir, work, home, prompt, *extra)
    log = svir.log()
    assert done.returncode == 0, (done.stdout, done.stderr[-4000:], log[-4000:])
    assert events[-1]["type"] == "turn.completed", events
    assert not [e for e in events if e["type"] in ("error", "turn.failed")], events
    return events, last, log


def test_codex_runs_its_shell_tool_and_finishes_through_svir(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # The scripted model's call of the shell tool writes a file in the work dir.
    model = AgentModel({"cmd": f"echo {MARK} > made.txt && cat made.txt"}, tool=SHELL)
    events, last, log = codex_through_svir(model, tmp_path, work, home, "Make made.txt.")
    # Codex ran the command the model asked for, in its work dir, and finished the turn.
    assert (work / "made.txt").read_text().strip() == MARK
    commands = [e["item"] for e in events if e["type"] == "item.completed"]
    assert any(
        c["type"] == "command_execution" and c["exit_code"] == 0 and "made.txt" in c["command"]
        for c in commands
    ), commands
    assert last.startswith(FINAL), last
    turns = model.bodies()
    assert len(turns) == 2, [b["messages"][-1] for b in turns]
    first, second = turns
    # Codex's developer messages (its system prompt) and its function tools reach the model as
    # a chat request; web_search, which svir cannot serve, does not.
    assert first["messages"][0]["role"] == "system" and "Codex" in str(
        first["messages"][0]["content"]
    )
    assert first["messages"][-1]["role"] == "user"
    assert "made.txt" in str(first["messages"][-1]["content"])
    names = {t["function"]["name"] for t in first["tools"]}
    assert SHELL in names and "write_stdin" in names and "web_search" not in names, names
    # The second turn carries the call and the command's output, as OpenAI servers take them.
    call, result = second["messages"][-2:]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == SHELL
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == model.arguments
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert MARK in str(result["content"])
    lines = served(log, "/v1/responses")
    assert len(lines) == 2 and all('"status":200' in line for line in lines), lines
    assert '"status":500' not in log


def test_codex_goes_on_when_the_server_repeats_a_call_id_on_every_answer(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # The scripted model calls the shell twice, with the same call id both times (as servers
    # that number their calls per answer do); Codex sends the whole history back each turn.
    model = AgentModel({"cmd": f"echo {MARK} >> made.txt"}, tool=SHELL, calls=2)
    _, last, _ = codex_through_svir(model, tmp_path, work, home, "Append to made.txt twice.")
    assert (work / "made.txt").read_text().split() == [MARK, MARK]
    assert last.startswith(FINAL), last
    turns = model.bodies()
    assert len(turns) == 3, [b["messages"][-1] for b in turns]
    calls = [c["id"] for m in turns[2]["messages"] for c in m.get("tool_calls") or ()]
    results = [m["tool_call_id"] for m in turns[2]["messages"] if m["role"] == "tool"]
    assert len(calls) == 2 and len(set(calls)) == 2 and results == calls, turns[2]["messages"]


def test_codex_runs_a_namespace_tool_called_by_its_flat_name(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # Codex's namespace tool multi_agent_v1 reaches the model as flat functions; the model's
    # call of one must come back to Codex as `namespace` + `name`, or Codex answers it with
    # "unsupported call" instead of running it.
    flat = "multi_agent_v1__close_agent"
    model = AgentModel({"target": "no-such-agent"}, tool=flat)
    _, last, _ = codex_through_svir(model, tmp_path, work, home, "Close the agent.")
    first, second = model.bodies()
    assert flat in {t["function"]["name"] for t in first["tools"]}
    call, result = second["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == flat
    assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
    # close_agent ran (and found no such agent) rather than being refused as unknown.
    assert "unsupported call" not in result["content"] and result["content"], result
    assert last.startswith(FINAL), last


class Silent:
    """`model`'s answer after `seconds` of silence (not even headers), as a model loading or a
    long prompt keeps a local server."""

    def __init__(self, model: AgentModel, seconds: float) -> None:
        self.model, self.seconds = model, seconds

    async def __call__(self, request: MockRequest) -> MockResponse:
        await asyncio.sleep(self.seconds)
        return self.model(request)


def test_codex_waits_out_a_silent_upstream_on_svirs_keepalives(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # Codex gives up on a stream with no event for its idle timeout (300 s by default; 25 s
    # here, no retry), and SSE comments do not count: svir's keep-alive events (one every
    # KEEPALIVE_EVERY, 10 s) carry it over the upstream's 40 s of silence.
    model = AgentModel({}, tool="none-offered")
    quiet = ("-c", "model_providers.svir.stream_idle_timeout_ms=25000")
    no_retry = ("-c", "model_providers.svir.stream_max_retries=0")
    events, last, _ = codex_through_svir(
        Silent(model, 40), tmp_path, work, home, "Say ok.", *quiet, *no_retry
    )
    assert last == "ok" and len(model.requests) == 1, (last, events)


def test_codex_asks_the_real_llama_server_through_svir(
    tmp_path: Path, agent_dirs: tuple[Path, Path]
) -> None:
    work, home = agent_dirs
    # Codex fails a turn cut at max_output_tokens (response.incomplete), and goes without its
    # tools here (NO_TOOLS, see gemma_answering): it then sends `tools: []`, and a prompt of ~5k
    # tokens.
    config = gemma_answering("4", routes("local/gemma"))
    svir = SvirProcess(config, tmp_path).start()
    started = time.monotonic()
    try:
        done, events, last = run_codex(svir, work, home, "What is 2 + 2?", *NO_TOOLS)
    finally:
        svir.stop()
    took = time.monotonic() - started
    log = svir.log()
    assert done.returncode == 0, (done.stdout, done.stderr[-4000:], log[-4000:])
    assert last.strip() == "4", (last, done.stdout, log[-4000:])
    assert events[-1]["type"] == "turn.completed", events
    lines = served(log, "/v1/responses")
    assert lines and all('"status":200' in line for line in lines), lines
    assert all('"served_model":"local/gemma"' in line for line in lines)
    prompts = [int(n) for n in re.findall(r'"prompt_tokens":([0-9]+)', log)]
    assert prompts and max(prompts) > 2000, prompts  # Codex's own system prompt
    print(f"codex exec via svir to llama-server: {took:.1f} s, prompt tokens {prompts}")
