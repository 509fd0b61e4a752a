"""`svir probe`: the probe run from the command line, its report written as a table or JSON."""

from __future__ import annotations

import sys
from typing import IO

import msgspec
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from svir.client.connection import ClientFailure, Connection
from svir.client.probe.prober import Prober
from svir.client.probe.report import render

__all__ = ["run_probe"]


def run_probe(
    conn: Connection,
    *,
    model: str | None = None,
    as_json: bool = False,
    timeout: float = 180.0,
    only: frozenset[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    err_console = Console(file=stderr, highlight=False)
    progress: Progress | None = None
    task = None
    if err_console.is_terminal:
        progress = Progress(SpinnerColumn(), TextColumn("[dim]probing[/dim] {task.description}"),
                            TimeElapsedColumn(), console=err_console, transient=True)  # fmt: skip
        task = progress.add_task("", total=None)

    def on_step(step: str) -> None:
        if progress is not None and task is not None:
            progress.update(task, description=step)

    prober = Prober(conn, model, timeout=timeout, on_step=on_step, only=only)
    try:
        if progress is not None:
            with progress:
                report = prober.run()
        else:
            report = prober.run()
    except ClientFailure as exc:
        stderr.write(f"svir probe: {exc}\n")
        return 1
    except KeyboardInterrupt:
        stderr.write("svir probe: stopped\n")
        return 130
    if as_json:
        stdout.write(msgspec.json.format(msgspec.json.encode(report.to_json())).decode() + "\n")
    else:
        console = Console(file=stdout, highlight=False)
        if not console.is_terminal:
            # A file or a pipe has no width: keep the table's lines whole.
            console = Console(file=stdout, highlight=False, width=200)
        render(report, console)
    return 0
