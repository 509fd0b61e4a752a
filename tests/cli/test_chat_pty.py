"""The interactive `svir chat` in a pseudo-terminal (pexpect), as a person uses it: through a real
svir process over the replay server, which records what the upstream received."""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pytest

from tests.cli.conftest import ROOT, svir_env
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedServer

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

PROMPT = "\n> "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(screen: str) -> str:
    """What a person reads: the text without colours and cursor moves."""
    return ANSI.sub("", screen).replace("\r", "")


RATE = re.compile(r"stop · \d+ tokens · \d+\.\d tokens/s · \d+\.\d s")


def spawn(
    svir: SvirProcess, *args: str, preexec_fn: Callable[[], None] | None = None
) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable, ["-m", "svir", "chat", *args, "--base-url", svir.url],
        cwd=str(ROOT), env=svir_env(TERM="xterm-256color"), encoding="utf-8",
        dimensions=(40, 160), timeout=30, preexec_fn=preexec_fn,
    )  # fmt: skip
    child.expect_exact(PROMPT)
    return child


@pytest.fixture
def chat(svir_replay: SvirProcess, replay: ScriptedServer) -> Iterator[pexpect.spawn]:
    replay.clear()
    child = spawn(svir_replay, "rp/llama-cpp")
    yield child
    child.close(force=True)


def ask(child: pexpect.spawn, line: str) -> str:
    """Send a line, wait for the next prompt, and return what the chat printed in between."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    return plain(str(child.before))


def test_a_conversation(chat: pexpect.spawn, replay: ScriptedServer, tmp_path: Path) -> None:
    screen = ask(chat, "What is 17 times 3?")
    # The reasoning, then the answer, streamed; then the stats line with an honest rate (§3.6).
    assert "Simple arithmetic: 17 times 3 is 51." in screen
    assert "17 × 3 = 51." in screen
    assert screen.index("Simple arithmetic") < screen.index("17 × 3 = 51.")
    assert RATE.search(screen), screen
    assert "stop · 34 tokens" in screen
    first = replay.last
    assert first.body["messages"][-1] == {"role": "user", "content": "What is 17 times 3?"}

    # A text file goes with the next message, laid out by svir as §2.2 says.
    note = tmp_path / "note.txt"
    note.write_text("The secret word is plum.\n")
    screen = ask(chat, f"/attach {note}")
    assert "attached file note.txt (text/plain, 25 B)" in screen
    screen = ask(chat, "What is the secret word?")
    assert RATE.search(screen), screen
    sent = replay.last.body["messages"]
    # The thread held the first turn; the new user message carries the file.
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == (
        'What is the secret word?\n<file name="note.txt">\nThe secret word is plum.\n\n</file>'
    )
    # The reasoning went back under the key the server used (§2.2).
    assert sent[1]["reasoning_content"] == "Simple arithmetic: 17 times 3 is 51."

    # Another model for the next answer.
    screen = ask(chat, "/model rp/lmstudio-reasoning")
    assert "model: rp/lmstudio-reasoning" in screen
    screen = ask(chat, "/reasoning off")
    screen = ask(chat, "And the capital of France?")
    assert replay.last.model == "lmstudio-reasoning"
    assert "The capital of France is Paris." in screen
    # Folded: one line instead of the reasoning.
    assert "▸ reasoned 11 words" in screen
    assert "The user asks for the capital" not in screen
    screen = ask(chat, "/reasoning")
    assert "The user asks for the capital of France. That is Paris." in screen

    screen = ask(chat, "/history")
    assert re.search(r"thread thread_\w+ · 6 message\(s\)", screen), screen

    chat.sendline("/exit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def ignore_sigint() -> None:
    """What a shell does to a command it starts in the background (`cmd &` from a script)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["as-is", "ignored"])
def test_ctrl_c_stops_the_answer(
    svir_replay: SvirProcess, replay: ScriptedServer, inherited: str
) -> None:
    # "as-is": the chat gets the signal disposition this test runs with; "ignored": started with
    # SIGINT ignored, as from `trap '' INT` or `nohup make test &`. Ctrl-C works either way.
    replay.clear()
    chat = spawn(
        svir_replay, "rp/llama-cpp", preexec_fn=ignore_sigint if inherited == "ignored" else None
    )
    try:
        stop_an_answer(chat, replay)
    finally:
        chat.close(force=True)


def stop_an_answer(chat: pexpect.spawn, replay: ScriptedServer) -> None:
    ask(chat, "/model rp/slow-drip")
    chat.sendline("Count forever.")
    chat.expect_exact("tick 3")
    chat.sendintr()
    chat.expect_exact("stopped")
    chat.expect_exact(PROMPT)
    assert "not kept in the history" in plain(str(chat.before))
    # Closing the stream reached the upstream: the generation stopped there too.
    replay.wait_disconnect(timeout=10)
    # The chat goes on.
    screen = ask(chat, "/model rp/llama-cpp")
    screen = ask(chat, "/retry")
    assert "17 × 3 = 51." in screen
    chat.sendeof()
    chat.expect(pexpect.EOF)


def test_tool_calls_and_results(
    svir_replay: SvirProcess, replay: ScriptedServer, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }]))  # fmt: skip
    replay.clear()
    child = spawn(svir_replay, "rp/lmstudio-reasoning-tools", "--tools", str(tools))
    try:
        screen = ask(child, "Weather in Paris?")
        assert '→ get_weather({"city":"Paris"})' in screen
        assert "answer with /result TEXT" in screen
        assert replay.last.body["tools"][0]["function"]["name"] == "get_weather"
        ask(child, "/model rp/llama-cpp")
        screen = ask(child, "/result Sunny, 24 °C")
        assert "17 × 3 = 51." in screen
        sent = replay.last.body["messages"]
        assert sent[-2]["tool_calls"][0]["function"] == {
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        }
        assert sent[-1] == {"role": "tool", "tool_call_id": "617532804",
                            "content": "Sunny, 24 °C"}  # fmt: skip
    finally:
        child.close(force=True)


def test_local_history(svir_replay: SvirProcess, replay: ScriptedServer) -> None:
    replay.clear()
    child = spawn(svir_replay, "rp/llama-cpp", "--history", "local", "--system", "Be brief.")
    try:
        assert "kept by this client" in plain(str(child.before))
        ask(child, "first")
        ask(child, "second")
        sent = replay.last.body["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
        assert sent[2]["content"] == "17 × 3 = 51."
        assert sent[2]["reasoning_content"] == "Simple arithmetic: 17 times 3 is 51."
        # An error keeps the question; /retry asks again with the same history.
        ask(child, "/model rp/status-503-openai-429")
        screen = ask(child, "third")
        assert "error:" in screen and "HTTP 502" in screen
        ask(child, "/model rp/llama-cpp")
        ask(child, "/retry")
        sent = replay.last.body["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["first", "second", "third"]
        screen = ask(child, "/new")
        ask(child, "fresh")
        assert [m["role"] for m in replay.last.body["messages"]] == ["system", "user"]
    finally:
        child.close(force=True)


def test_attach_refuses_binary_files(chat: pexpect.spawn, tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00\xff\xfe binary")
    screen = ask(chat, f"/attach {blob}")
    assert "neither an image" in screen
    screen = ask(chat, "/attach /nonexistent/file.txt")
    assert "cannot attach" in screen


def test_image_attachment(chat: pexpect.spawn, replay: ScriptedServer, tmp_path: Path) -> None:
    from svir.client.probe.payloads import tiny_png

    image = tmp_path / "photo.dat"  # the type comes from the bytes, not the name
    image.write_bytes(tiny_png(8, 8))
    screen = ask(chat, f"/attach {image}")
    assert "attached image photo.dat (image/png" in screen
    ask(chat, "What is this?")
    content = replay.last.body["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What is this?"}
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
