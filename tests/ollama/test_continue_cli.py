"""The Continue CLI itself (`cn -p`, npm's @continuedev/cli, installed by `make test` through
scripts/agents.sh) with a local config.yaml pointed at a real `svir serve`: a model of provider
`ollama` (whose apiBase is svir's root: the CLI speaks OpenAI's API under its `/v1`) and one of
provider `openai` (apiBase svir's `/v1`), to a scripted upstream and to the real llama.cpp server.

Nothing leaves loopback: telemetry is off, the proxies point at a closed port, and a preloaded
guard (tests/support/agents.py's LOOPBACK_GUARD) refuses any other connection and lists it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from svir.edges.llama_server import ensure_gemma_model, find_llama_server
from svir.errors import LlamaServerError
from tests.support.agents import LOOPBACK_GUARD, agent_env, npm_binary
from tests.support.svir_proc import SvirProcess, free_port
from tests.support.upstream import ScriptedServer, ScriptedUpstream

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
# The CLI looks for its updates at api.continue.dev whatever its settings: the guard stops it.
KNOWN_CALLS_HOME = {"api.continue.dev"}


def cn_binary() -> Path:
    return npm_binary("cn")


def config_yaml(provider: str, model: str, api_base: str, max_tokens: int = 64) -> str:
    return (
        "name: svir-test\nversion: 0.0.1\nschema: v1\nmodels:\n"
        f"  - name: svir\n    provider: {provider}\n    model: {model}\n"
        f"    apiBase: {api_base}\n    apiKey: sk-svir-test\n    roles: [chat]\n"
        f"    defaultCompletionOptions:\n      maxTokens: {max_tokens}\n      temperature: 0\n"
    )


def run_cn(
    tmp: Path, config: str, prompt: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`cn -p PROMPT --config FILE` in a home of its own; returns what it did and the hosts the
    guard stopped it from reaching."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    path = tmp / "config.yaml"
    path.write_text(config)
    blocked = tmp / "blocked.log"
    env = agent_env(
        home,
        CONTINUE_GLOBAL_DIR=str(home / ".continue"),
        CONTINUE_CLI_ENABLE_TELEMETRY="0",
        CONTINUE_METRICS_ENABLED="0",
        # Its hub API, at a closed port too.
        CONTINUE_API_BASE=f"http://127.0.0.1:{free_port()}/",
        NODE_OPTIONS=f"--require {LOOPBACK_GUARD}",
        SVIR_BLOCKED_LOG=str(blocked),
    )
    done = subprocess.run(
        [str(cn_binary()), "-p", prompt, "--config", str(path), *extra],
        cwd=tmp,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    hosts = set(blocked.read_text().split()) if blocked.exists() else set()
    return done, hosts


def served(svir: SvirProcess, path: str) -> list[str]:
    return [line for line in svir.log().splitlines() if f'"path":"{path}"' in line]


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_continue_cli_answers_through_svir(tmp_path: Path, provider: str) -> None:
    with ScriptedServer(ScriptedUpstream()) as upstream:
        config = (
            f'[[providers]]\nname = "lab"\nkind = "openai-compatible"\n'
            f'base_url = "{upstream.base_url}"\ndiscover = false\nmodels = ["tok-5"]\n'
        )
        with SvirProcess(config, tmp_path) as svir:
            base = svir.url if provider == "ollama" else svir.url + "/v1"
            done, hosts = run_cn(tmp_path, config_yaml(provider, "lab/tok-5", base), "Say hi")
            log = svir.log()
            chats = served(svir, "/v1/chat/completions")
    assert done.returncode == 0, (done.stdout, done.stderr, log[-3000:])
    # The scripted model's five tokens, as the CLI prints them.
    assert done.stdout.split() == ["w0", "w1", "w2", "w3", "w4"], done.stdout
    assert chats and all('"status":200' in line for line in chats), chats
    assert all('"served_model":"lab/tok-5"' in line for line in chats)
    assert hosts <= KNOWN_CALLS_HOME, hosts
    assert '"status":500' not in log


def test_continue_cli_asks_the_real_llama_server_through_svir(tmp_path: Path) -> None:
    try:
        find_llama_server()
        gguf = ensure_gemma_model()
    except LlamaServerError as exc:
        pytest.fail(f"{exc}: run `make install`.", pytrace=False)
    # Gemma 3 270M answers nonsense: a grammar makes its answer "4". The CLI's prompt with its
    # tools is long, so one slot with the model's whole context.
    config = (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
        '[providers.managed]\nchat_template = "builtin:gemma3-tools"\nparallel = 1\n'
        "extra_args = ['--grammar', 'root ::= \"4\"']\n"
        "[providers.managed.models]\n"
        f'gemma = {{ path = "{gguf}", ctx = 32768 }}\n'
    )
    with SvirProcess(config, tmp_path) as svir:
        done, hosts = run_cn(
            tmp_path,
            config_yaml("ollama", "local/gemma", svir.url, 16),
            "What is 2 + 2?",
            "--exclude",
            "*",
        )
        log = svir.log()
        chats = served(svir, "/v1/chat/completions")
    assert done.returncode == 0, (done.stdout, done.stderr, log[-3000:])
    assert done.stdout.strip() == "4", (done.stdout, done.stderr, log[-3000:])
    assert chats and all('"status":200' in line for line in chats), chats
    assert all('"served_model":"local/gemma"' in line for line in chats)
    assert hosts <= KNOWN_CALLS_HOME, hosts
