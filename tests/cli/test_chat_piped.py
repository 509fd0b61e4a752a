"""`svir chat` with stdin not a terminal: stdin is one message, stdout only the answer. Run as a
child process against a real svir over the replay server and over the real llama.cpp server."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cli.conftest import run_svir
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

CORPUS = "tests/conformance/decoder"


def expected(name: str) -> dict[str, object]:
    with open(f"{CORPUS}/{name}.json", encoding="utf-8") as f:
        return json.load(f)["expect"]  # type: ignore[no-any-return]


def test_prints_just_the_answer(replay: ScriptedServer, svir_replay: SvirProcess) -> None:
    replay.clear()
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, input="hi\n")
    assert out.returncode == 0, out.stderr
    # llama.cpp's stream carries reasoning too; only the answer reaches stdout.
    assert out.stdout == expected("llama-cpp")["answer"] + "\n"
    assert out.stderr == ""
    body = replay.last.body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["model"] == "llama-cpp"
    assert body["stream"] is True


def test_all_of_stdin_is_one_message(replay: ScriptedServer, svir_replay: SvirProcess) -> None:
    replay.clear()
    text = "Summarize this:\nline one\nline two\n"
    out = run_svir("chat", "rp/utf8", "--base-url", svir_replay.url, "--system", "Be brief.",
                   "--temperature", "0.5", "--max-tokens", "40", input=text)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == str(expected("utf8")["answer"]).rstrip("\n") + "\n"
    body = replay.last.body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarize this:\nline one\nline two"},
    ]
    assert body["temperature"] == 0.5
    assert body["max_tokens"] == 40


def test_upstream_error_goes_to_stderr(svir_replay: SvirProcess) -> None:
    out = run_svir("chat", "rp/status-400-lmstudio-json-object-400", "--base-url",
                   svir_replay.url, input="hi")  # fmt: skip
    assert out.returncode == 1
    assert out.stdout == ""
    assert "HTTP 400" in out.stderr
    assert "'response_format.type' must be 'json_schema' or 'text'" in out.stderr


def test_error_after_part_of_the_answer(svir_replay: SvirProcess) -> None:
    # llama.cpp fails the stream when its parser meets an unexpected call (§3.5).
    out = run_svir("chat", "rp/llama-cpp-error", "--base-url", svir_replay.url, input="hi")
    assert out.returncode == 1
    assert "does not match the expected peg-native format" in out.stderr


def test_tool_call_is_reported_on_stderr(svir_replay: SvirProcess) -> None:
    out = run_svir("chat", "rp/mlx-lm-tools", "--base-url", svir_replay.url, input="weather?")
    assert out.returncode == 0, out.stderr
    assert "svir chat: the model called" in out.stderr


def test_empty_stdin(svir_replay: SvirProcess) -> None:
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, input="  \n")
    assert out.returncode == 2
    assert "stdin is empty" in out.stderr


def test_svir_not_running() -> None:
    out = run_svir("chat", "lab/x", "--base-url", "http://127.0.0.1:9", input="hi")
    assert out.returncode == 1
    assert "cannot connect" in out.stderr and "svir serve" in out.stderr


def test_piped_into_a_thread(replay: ScriptedServer, svir_replay: SvirProcess) -> None:
    replay.clear()
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, "--history", "thread",
                   input="hi")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected("llama-cpp")["answer"] + "\n"
    threads = httpx.get(svir_replay.base_url + "/threads", params={"limit": "1"}).json()["data"]
    thread = httpx.get(f"{svir_replay.base_url}/threads/{threads[0]['id']}").json()
    assert [m["role"] for m in thread["messages"]] == ["user", "assistant"]
    # The next message goes on with that thread: svir sends the whole conversation.
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, "--thread",
                   threads[0]["id"], input="and again")  # fmt: skip
    assert out.returncode == 0, out.stderr
    sent = replay.last.body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == expected("llama-cpp")["answer"]
    assert sent[2]["content"] == "and again"


def test_unknown_thread(svir_replay: SvirProcess) -> None:
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, "--thread",
                   "thread_nope", input="hi")  # fmt: skip
    assert out.returncode == 1
    assert "HTTP 404" in out.stderr


def test_real_model(svir_llama: SvirProcess) -> None:
    out = run_svir("chat", "lab/gemma-3-270m", "--base-url", svir_llama.url, "--max-tokens", "8",
                   "--temperature", "0", input="Say hello.", timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert out.stdout.endswith("\n")
    assert out.stderr == ""
