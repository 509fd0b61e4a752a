"""`svir chat MODEL`: a terminal chat through svir (or any OpenAI-compatible base URL).

Interactive on a terminal: the answer streams as it comes, reasoning dimmed (or folded into one
line with `/reasoning off`), tool calls shown, and after each answer a line with the finish
reason, the tokens and the speed (§3.6, measured by the decoder on this machine's clock). Ctrl-C
stops an answer and returns to the prompt, also when svir was started with SIGINT ignored (see
`ctrl_c_interrupts`). With stdin not a terminal (`echo hi | svir chat m`),
stdin is one message and only the answer goes to stdout.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from svir.client import attach
from svir.client.connection import ClientFailure, Connection
from svir.client.history import (
    Answer,
    History,
    LocalHistory,
    Session,
    ThreadHistory,
    TurnOutcome,
    threads_available,
)
from svir.wire.answer import AnswerFold
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import (
    Event,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
)
from svir.wire.models import is_chat_model
from svir.wire.toolcalls import ToolCall

__all__ = ["ChatOptions", "Renderer", "load_tools", "run_chat", "stats_line"]

Clock = Callable[[], float]

HELP = """\
/model [NAME]          show the model, or switch to NAME for the next answers
/models                list the server's chat models
/attach FILE           attach an image or a text file to your next message
/detach                drop the attachments not sent yet
/reasoning [on|off]    show reasoning as it streams (on) or fold it into one line (off);
                       with no argument, print the last answer's reasoning in full
/result [ID] TEXT      answer the model's tool call (ID when it made several)
/retry                 ask for the answer again (after an error or Ctrl-C)
/new                   start a new conversation
/history               where the conversation is kept
/exit                  leave (Ctrl-D too); Ctrl-C stops an answer
"""


@dataclass
class ChatOptions:
    model: str
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    history: str = "auto"  # auto | thread | local
    thread_id: str | None = None
    show_reasoning: bool = True

    def request_params(self) -> dict[str, Any]:
        params = dict(self.params)
        if self.tools:
            params["tools"] = self.tools
        return params


def load_tools(path: str) -> list[dict[str, Any]]:
    """Tool definitions from a JSON file: an array of OpenAI tools (or bare functions), or an
    object with a `tools` array."""
    try:
        doc = msgspec.json.decode(Path(path).expanduser().read_bytes())
    except OSError as exc:
        raise ClientFailure(f"--tools {path}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise ClientFailure(f"--tools {path}: not JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("tools"), list):
        doc = doc["tools"]
    if not isinstance(doc, list) or not doc:
        raise ClientFailure(f"--tools {path}: expected a non-empty array of tools")
    tools: list[dict[str, Any]] = []
    for i, item in enumerate(doc):
        tool = item
        if isinstance(item, dict) and "type" not in item and "name" in item:
            tool = {"type": "function", "function": item}
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ClientFailure(f"--tools {path}: tool {i} has no function name")
        tools.append(tool)
    return tools


# ---------------------------------------------------------------------------------------------
# One answer on the terminal


def format_rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:.1f} tokens/s"


def stats_line(outcome: TurnOutcome) -> str:
    """The line after an answer: finish, tokens, speed (only an honest one, §3.6), time."""
    parts: list[str] = []
    if outcome.stopped:
        parts.append("stopped")
    elif outcome.finish_reason:
        parts.append(outcome.finish_reason)
    if outcome.usage is not None:
        parts.append(f"{outcome.usage.completion_tokens} tokens")
        if outcome.usage.reasoning_tokens:
            parts.append(f"{outcome.usage.reasoning_tokens} reasoning")
    if outcome.tokens_per_second is not None:
        parts.append(format_rate(outcome.tokens_per_second))
    parts.append(f"{outcome.seconds:.1f} s")
    return " · ".join(parts)


def _words(text: str) -> int:
    return len(text.split())


class Renderer:
    """Shows one answer's events on a rich console and sums them up in a `TurnOutcome`."""

    def __init__(
        self, console: Console, *, show_reasoning: bool, clock: Clock = time.monotonic
    ) -> None:
        self.console = console
        self.show_reasoning = show_reasoning
        self.clock = clock

    def play(self, answer: Answer) -> TurnOutcome:
        out = TurnOutcome()
        started = self.clock()
        fold = AnswerFold()
        screen = _Playback(self, out, fold.reasoning)
        try:
            for ev in answer:
                fold.add(ev)
                screen.show(ev)
        except KeyboardInterrupt:
            out.stopped = True
        finally:
            screen.stop_status()
            answer.close()
        screen.end()
        out.seconds = self.clock() - started
        out.text = "".join(fold.text)
        out.reasoning = "".join(fold.reasoning)
        # The key reasoning goes back under: inline <think> is not sent back (D23).
        out.reasoning_key = next((c for c in fold.carriers if c != "think"), None)
        out.refusal = "".join(fold.refusal)
        out.tool_calls = fold.tool_calls()
        out.finish_reason = fold.finish_reason
        out.usage = fold.usage
        out.error = fold.error
        out.tokens_per_second = answer.tokens_per_second
        self._report(out)
        return out

    def _summary(self, reasoning: list[str], seconds: float) -> None:
        words = _words("".join(reasoning))
        self.console.print(
            f"[dim]▸ reasoned {words} words in {seconds:.1f} s  (/reasoning shows it)[/dim]",
            highlight=False,
        )

    def _report(self, out: TurnOutcome) -> None:
        console = self.console
        if out.error is not None:
            console.print(f"[bold red]error:[/bold red] {escape(describe_error(out))}",
                          highlight=False)  # fmt: skip
        line = stats_line(out)
        if not out.complete:
            line += " · not kept in the history (/retry asks again)"
        console.print(f"[dim]{escape(line)}[/dim]", highlight=False)


class _Playback:
    """One answer as it is shown: which part of it the terminal is in (`phase`: wait, reasoning,
    text or tool), whether at a line's start, and the spinner shown until the first output."""

    def __init__(self, renderer: Renderer, out: TurnOutcome, reasoning: list[str]) -> None:
        self.renderer = renderer
        self.console = renderer.console
        self.out = out
        # The fold's reasoning so far (the spinner counts its words).
        self.reasoning = reasoning
        self.phase = "wait"
        self.at_line_start = True
        self.reasoning_started: float | None = None
        self.status: Status | None = None
        if self.console.is_terminal:
            self.status = self.console.status("[dim]waiting for the model…", spinner="dots")
            self.status.start()

    def show(self, ev: Event) -> None:
        """Show one event of the answer."""
        show_reasoning = self.renderer.show_reasoning
        if isinstance(ev, ReasoningDelta):
            if self.phase != "reasoning":
                if self.phase != "wait":
                    self.newline()
                self.reasoning_started = self.renderer.clock()
                self.phase = "reasoning"
            if show_reasoning:
                self.write(ev.text, "dim italic")
            elif self.status is not None:
                self.status.update(f"[dim]thinking… {_words(''.join(self.reasoning))} words")
        elif isinstance(ev, TextDelta | RefusalDelta):
            if self.phase == "reasoning":
                self.leave_reasoning()
            elif self.phase == "tool":
                self.newline()
            self.phase = "text"
            self.write(ev.text, None if isinstance(ev, TextDelta) else "yellow")
        elif isinstance(ev, ToolCallStart):
            if self.phase == "reasoning":
                self.leave_reasoning()
            self.newline()
            self.phase = "tool"
            self.write(f"→ {ev.name}(", "bold cyan")
        elif isinstance(ev, ToolCallDelta):
            self.write(ev.arguments, "cyan")

    def end(self) -> None:
        """Close what the answer left open (its reasoning, a tool call's parenthesis, its line)."""
        if self.phase == "reasoning":
            self.leave_reasoning()
        if self.phase == "tool":
            self.write(")", "bold cyan")
        self.newline()

    def stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def write(self, piece: str, style: str | None = None) -> None:
        self.stop_status()
        self.console.print(piece, end="", style=style, markup=False, highlight=False,
                           soft_wrap=True)  # fmt: skip
        self.at_line_start = piece.endswith("\n")

    def newline(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def leave_reasoning(self) -> None:
        if self.phase != "reasoning":
            return
        out = self.out
        if self.reasoning_started is not None:
            out.reasoning_seconds = self.renderer.clock() - self.reasoning_started
        if self.renderer.show_reasoning:
            self.newline()
            self.write("\n")  # a blank line between the reasoning and the answer
        else:
            self.stop_status()
            self.renderer._summary(self.reasoning, out.reasoning_seconds)


def error_text(err: UpstreamError) -> str:
    """An error as one line: the status, the server's words, and what kind of failure it is."""
    status = f"HTTP {err.status}: " if err.status is not None else ""
    kind = "" if err.kind is ErrorKind.OTHER else f" [{err.kind.value}]"
    hint = ""
    if err.kind is ErrorKind.TRANSIENT and err.message.startswith("cannot connect"):
        hint = " (is `svir serve` running, or is --base-url right?)"
    return f"{status}{err.message}{kind}{hint}"


def describe_error(out: TurnOutcome) -> str:
    if out.error is None:
        return ""
    partial = " (the answer above is partial)" if out.error.in_stream and out.text else ""
    return error_text(out.error) + partial


# ---------------------------------------------------------------------------------------------
# The chat


class Chat:
    """The interactive loop: commands, messages, answers."""

    def __init__(
        self,
        session: Session,
        history: History,
        options: ChatOptions,
        console: Console,
        *,
        clock: Clock = time.monotonic,
        read_line: Callable[[str], str] = input,
    ) -> None:
        self.session = session
        self.history = history
        self.options = options
        self.console = console
        self.clock = clock
        self.read_line = read_line
        self.renderer = Renderer(console, show_reasoning=options.show_reasoning, clock=clock)
        self.pending: list[attach.Attachment] = []
        self.tool_calls: list[ToolCall] = []
        self.last: TurnOutcome | None = None

    def say(self, markup: str) -> None:
        self.console.print(markup, highlight=False)

    def banner(self) -> None:
        conn = self.session.conn
        self.say(f"[bold]svir chat[/bold] · model [bold]{escape(self.options.model)}[/bold] · "
                 f"{escape(conn.root)}")  # fmt: skip
        self.say(f"[dim]history: {escape(self.history.describe())} · /help for commands[/dim]")

    def loop(self) -> int:
        self.banner()
        while True:
            try:
                line = self.read_line("> ")
            except EOFError:
                self.console.print()
                return 0
            except KeyboardInterrupt:
                self.console.print()
                continue
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if self.command(line) == "exit":
                        return 0
                else:
                    self.send_text(line)
            except KeyboardInterrupt:
                self.session.renew()
                self.say("[dim]stopped[/dim]")
            except ClientFailure as exc:
                self.say(f"[bold red]error:[/bold red] {escape(str(exc))}")

    # Commands

    def command(self, line: str) -> str | None:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        name = name.lower()
        if name in ("/exit", "/quit", "/q"):
            return "exit"
        if name in ("/help", "/?"):
            self.console.print(HELP, markup=False, highlight=False, end="")
        elif name == "/model":
            self.switch_model(rest)
        elif name == "/models":
            self.list_models()
        elif name == "/attach":
            self.attach(rest)
        elif name == "/detach":
            self.say(f"[dim]dropped {len(self.pending)} attachment(s)[/dim]")
            self.pending = []
        elif name == "/reasoning":
            self.reasoning(rest)
        elif name == "/result":
            self.result(rest)
        elif name == "/retry":
            self.answer()
        elif name == "/new":
            self.history.reset()
            self.pending, self.tool_calls, self.last = [], [], None
            self.say(f"[dim]new conversation · history: {escape(self.history.describe())}[/dim]")
        elif name == "/history":
            self.say(f"[dim]history: {escape(self.history.describe())} · "
                     f"{self.history.count()} message(s)[/dim]")  # fmt: skip
        else:
            self.say(f"[red]unknown command {escape(name)}[/red] · /help lists them")
        return None

    def switch_model(self, name: str) -> None:
        if not name:
            self.say(f"model: [bold]{escape(self.options.model)}[/bold]")
            return
        try:
            listed = [m.id for m in self.session.conn.list_models(self.session.client)]
        except ClientFailure:
            listed = []
        self.options.model = name
        note = ""
        if listed and name not in listed:
            note = " [yellow](not in the server's list; it may still route it)[/yellow]"
        self.say(f"[dim]model:[/dim] [bold]{escape(name)}[/bold]{note}")

    def list_models(self) -> None:
        models = self.session.conn.list_models(self.session.client)
        for m in models:
            if is_chat_model(m.id, m.name):
                mark = "*" if m.id == self.options.model else " "
                self.console.print(f"{mark} {m.id}", markup=False, highlight=False)

    def attach(self, rest: str) -> None:
        if not rest:
            if self.pending:
                for a in self.pending:
                    self.say(f"[dim]pending:[/dim] {escape(a.describe())}")
            else:
                self.say("[dim]usage: /attach FILE[/dim]")
            return
        try:
            paths = shlex.split(rest)
        except ValueError:
            paths = [rest]
        for path in paths:
            try:
                a = attach.load(path)
            except attach.AttachError as exc:
                self.say(f"[red]cannot attach:[/red] {escape(str(exc))}")
                continue
            self.pending.append(a)
            self.say(f"[dim]attached {a.kind}[/dim] {escape(a.describe())} "
                     "[dim]· it goes with your next message[/dim]")  # fmt: skip

    def reasoning(self, rest: str) -> None:
        arg = rest.lower()
        if arg in ("on", "show"):
            self.renderer.show_reasoning = True
            self.say("[dim]reasoning: shown as it streams[/dim]")
        elif arg in ("off", "hide"):
            self.renderer.show_reasoning = False
            self.say("[dim]reasoning: folded into one line[/dim]")
        elif arg:
            self.say("[dim]usage: /reasoning [on|off][/dim]")
        elif self.last is not None and self.last.reasoning:
            self.console.print(self.last.reasoning, style="dim italic", markup=False,
                               highlight=False)  # fmt: skip
        else:
            self.say("[dim]the last answer had no reasoning[/dim]")

    def result(self, rest: str) -> None:
        if not self.tool_calls:
            self.say("[dim]no tool call is waiting for a result[/dim]")
            return
        ids = {c.id: c for c in self.tool_calls}
        first, _, after = rest.partition(" ")
        if first in ids:
            call, text = ids[first], after.strip()
        elif len(self.tool_calls) == 1:
            call, text = self.tool_calls[0], rest
        else:
            self.say("[dim]several calls wait: /result ID TEXT, with ID one of "
                     f"{escape(', '.join(ids))}[/dim]")  # fmt: skip
            return
        self.history.add(
            [{"role": "tool", "tool_call_id": call.id, "content": text}], self.options.model
        )
        self.tool_calls = [c for c in self.tool_calls if c.id != call.id]
        if self.tool_calls:
            self.say(f"[dim]{len(self.tool_calls)} more call(s) wait for a result[/dim]")
            return
        self.answer()

    # Messages

    def send_text(self, text: str) -> None:
        messages: list[dict[str, Any]] = []
        if self.tool_calls:
            # A tool call must be answered before the conversation goes on (§2.2).
            for call in self.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": "Not run: the user replied instead."})  # fmt: skip
            self.say(f"[dim]{len(self.tool_calls)} tool call(s) answered as not run[/dim]")
        content = attach.user_content(text, self.pending)
        messages.append({"role": "user", "content": content})
        self.history.add(messages, self.options.model)
        self.pending = []
        self.tool_calls = []
        self.answer()

    def answer(self) -> None:
        answer = self.history.answer(self.options.model, self.options.request_params(), self.clock)
        outcome = self.renderer.play(answer)
        if outcome.stopped:
            self.session.renew()
            self.history.stopped()
        self.history.record(outcome)
        self.last = outcome
        if outcome.complete and outcome.tool_calls:
            self.tool_calls = list(outcome.tool_calls)
            how = "/result TEXT" if len(outcome.tool_calls) == 1 else "/result ID TEXT"
            self.say(f"[dim]the model called {len(outcome.tool_calls)} tool(s): "
                     f"answer with {how}[/dim]")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Piped: one message in, the answer out


def run_piped(
    history: History,
    options: ChatOptions,
    text: str,
    *,
    out: IO[str],
    err: IO[str],
    clock: Clock = time.monotonic,
) -> int:
    """Send `text`; write only the answer to `out`. 0 when the answer completed."""
    history.add([{"role": "user", "content": text}], options.model)
    answer = history.answer(options.model, options.request_params(), clock)
    fold = AnswerFold()
    last = [""]  # the last piece written, also when stopped halfway
    try:
        _write_answer(answer, fold, out, last)
    except KeyboardInterrupt:
        if last[0] and not last[0].endswith("\n"):
            out.write("\n")  # a stopped answer still ends its line
        out.flush()
        raise
    finally:
        answer.close()
    if last[0] and not last[0].endswith("\n"):
        out.write("\n")
    out.flush()
    if isinstance(history, ThreadHistory) and history.thread_id is not None:
        # stdout is only the answer; the thread to go on with goes beside it.
        err.write(f"svir chat: thread {history.thread_id} (go on with --thread"
                  f" {history.thread_id})\n")  # fmt: skip
    for call in fold.tool_calls():
        err.write(f"svir chat: the model called {call.name}({call.arguments})\n")
    if fold.error is not None:
        err.write(f"svir chat: error: {error_text(fold.error)}\n")
        return 1
    return 0


def _write_answer(answer: Answer, fold: AnswerFold, out: IO[str], last: list[str]) -> None:
    """Write the answer's text as it comes, noting the last piece written in `last`."""
    for ev in answer:
        fold.add(ev)
        if isinstance(ev, TextDelta):
            out.write(ev.text)
            out.flush()
            last[0] = ev.text or last[0]
        elif isinstance(ev, RefusalDelta):
            out.write(ev.text)
            last[0] = ev.text or last[0]


# ---------------------------------------------------------------------------------------------
# Entry


def open_history(session: Session, options: ChatOptions, *, interactive: bool) -> History:
    """Threads when asked for, or (auto) when the server has them and the chat is interactive."""
    mode = options.history
    if options.thread_id is not None:
        mode = "thread"
    if mode == "auto":
        mode = "thread" if interactive and threads_available(session) else "local"
    if mode == "thread":
        history = ThreadHistory(session, options.system, options.thread_id)
        if options.thread_id is not None:
            history.resume()
        return history
    return LocalHistory(session, options.system)


@contextlib.contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt inside the block, whatever SIGINT was on entry.

    A shell passes an ignored SIGINT on to what it starts (`cmd &` from a script, `nohup`,
    `trap '' INT`), and Python then leaves it ignored: Ctrl-C at the chat would do nothing. At a
    terminal Ctrl-C is how a person stops an answer, so the chat takes it back while it runs, and
    gives the process its handler back after. (A piped chat keeps what it was given: there, an
    ignored SIGINT is the caller's choice.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and only it gets KeyboardInterrupt
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def run_chat(
    conn: Connection,
    options: ChatOptions,
    *,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    interactive = stdin.isatty()
    session = Session(conn)
    try:
        history = open_history(session, options, interactive=interactive)
        if not interactive:
            text = stdin.read().strip()
            if not text:
                stderr.write("svir chat: nothing to send: stdin is empty\n")
                return 2
            try:
                return run_piped(history, options, text, out=stdout, err=stderr)
            except KeyboardInterrupt:
                stderr.write("\nsvir chat: stopped\n")
                return 130
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        console = Console(file=stdout, highlight=False)
        with ctrl_c_interrupts():
            return Chat(session, history, options, console).loop()
    except ClientFailure as exc:
        stderr.write(f"svir chat: {exc}\n")
        return 1
    finally:
        session.close()
