"""The Codex CLI itself (`codex exec`, npm's @openai/codex, installed by `make test` through
scripts/codex.sh) pointed at a real `svir serve` by a custom model provider with
`wire_api = "responses"`: a task that makes it run its shell tool and finish, through svir to a
scripted chat-completions model server, and a plain question through svir to the real llama.cpp
server (Gemma 3 270M, managed by svir).

Nothing leaves loopback: Codex's update check, analytics, feedback, OpenTelemetry and the features
that reach GitHub and chatgpt.com are off in its config (`--strict-config`, so a key a new version
renames fails here), its proxies are a closed local port (svir is reached directly, by NO_PROXY),
its HOME and CODEX_HOME temp dirs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from svir.edges.llama_server import ensure_gemma_model, find_llama_server
from svir.errors import LlamaServerError
from svir.testing import MockServerThread
from tests.anthropic.agent_model import FINAL, AgentModel
from tests.support.svir_proc import SvirProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
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
    version = re.search(r"^CODEX_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version is not None
    cache = Path(os.environ.get("CACHE", Path.home() / ".cache" / "svir"))
    binary = cache / f"codex-{version.group(1)}" / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        pytest.fail(
            f"Codex is not installed at {binary}: run `make test` (or `make codex`).",
            pytrace=False,
        )
    return binary


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


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    return work, home


@pytest.fixture
def agent(dirs: tuple[Path, Path]) -> Iterator[tuple[AgentModel, str]]:
    """The scripted model (its shell call writes a file in the work dir) and its base URL."""
    model = AgentModel({"cmd": f"echo {MARK} > made.txt && cat made.txt"}, tool=SHELL)
    with MockServerThread(model) as server:
        yield model, server.base_url


def test_codex_runs_its_shell_tool_and_finishes_through_svir(
    tmp_path: Path, dirs: tuple[Path, Path], agent: tuple[AgentModel, str]
) -> None:
    work, home = dirs
    model, base_url = agent
    config = (
        f'[[providers]]\nname = "agent"\nkind = "openai-compatible"\n'
        f'base_url = "{base_url}"\ndiscover = false\nmodels = ["main"]\n\n' + routes("agent/main")
    )
    svir = SvirProcess(config, tmp_path).start()
    try:
        done, events, last = run_codex(svir, work, home, "Make the file made.txt.")
    finally:
        svir.stop()
    log = svir.log()
    assert done.returncode == 0, (done.stdout, done.stderr[-4000:], log[-4000:])
    # Codex ran the command the model asked for, in its work dir, and finished the turn.
    assert (work / "made.txt").read_text().strip() == MARK
    commands = [e["item"] for e in events if e["type"] == "item.completed"]
    assert any(
        c["type"] == "command_execution" and c["exit_code"] == 0 and "made.txt" in c["command"]
        for c in commands
    ), commands
    assert last.startswith(FINAL), (last, done.stdout)
    assert events[-1]["type"] == "turn.completed", events[-1]
    assert not [e for e in events if e["type"] in ("error", "turn.failed")], events
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
    served = [line for line in log.splitlines() if '"path":"/v1/responses"' in line]
    assert len(served) == 2 and all('"status":200' in line for line in served), served
    assert '"status":500' not in log


def test_codex_asks_the_real_llama_server_through_svir(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    try:
        find_llama_server()
        gguf = ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(f"{exc}: run `make install`.", pytrace=False)
    work, home = dirs
    # Gemma 3 270M does not stop by itself, and Codex fails a turn cut at max_output_tokens
    # (response.incomplete): a grammar (the server's default for every request) makes its
    # answer "4", and the turn ends. With tools, llama.cpp's own tool-call grammar replaces it,
    # so Codex goes without its tools (NO_TOOLS: it then sends `tools: []`); its prompt is still
    # ~5k tokens, which one slot with the model's whole context holds.
    grammar = 'root ::= "4"'
    config = (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
        '[providers.managed]\nchat_template = "builtin:gemma3-tools"\nparallel = 1\n'
        f"extra_args = ['--grammar', '{grammar}']\n"
        "[providers.managed.models]\n"
        f'gemma = {{ path = "{gguf}", ctx = 32768 }}\n\n' + routes("local/gemma")
    )
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
    served = [line for line in log.splitlines() if '"path":"/v1/responses"' in line]
    assert served and all('"status":200' in line for line in served), served
    assert all('"served_model":"local/gemma"' in line for line in served)
    prompts = [int(n) for n in re.findall(r'"prompt_tokens":([0-9]+)', log)]
    assert prompts and max(prompts) > 2000, prompts  # Codex's own system prompt
    print(f"codex exec via svir to llama-server: {took:.1f} s, prompt tokens {prompts}")
