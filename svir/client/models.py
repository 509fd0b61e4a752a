"""`svir models`: the models a server lists (§6), chat models only unless `--all`."""

from __future__ import annotations

import sys
from typing import IO, Any

import msgspec
from rich.console import Console
from rich.table import Table

from svir.client.connection import ClientFailure, Connection
from svir.wire.models import ModelInfo, is_chat_model

__all__ = ["model_rows", "run_models"]


def model_rows(models: list[ModelInfo], *, show_all: bool) -> list[dict[str, Any]]:
    """The models to show, each as a JSON-ready object with `chat` saying what the name rule
    (§6) made of it."""
    rows = []
    for m in models:
        chat = is_chat_model(m.id, m.name)
        if chat or show_all:
            rows.append({
                "id": m.id,
                "name": m.name,
                "owned_by": m.owned_by,
                "context_length": m.context_length,
                "input_modalities": list(m.input_modalities) if m.input_modalities else None,
                "chat": chat,
            })  # fmt: skip
    return rows


def run_models(
    conn: Connection,
    *,
    show_all: bool = False,
    as_json: bool = False,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        with conn.client() as client:
            models = conn.list_models(client)
    except ClientFailure as exc:
        stderr.write(f"svir models: {exc}\n")
        return 1
    rows = model_rows(models, show_all=show_all)
    hidden = len(models) - len(rows)
    if as_json:
        stdout.write(msgspec.json.encode(rows).decode() + "\n")
        return 0
    console = Console(file=stdout, highlight=False)
    if rows and not console.is_terminal:
        # Piped: one id a line, for scripts (--json has the rest).
        for row in rows:
            stdout.write(row["id"] + "\n")
    elif not rows:
        console.print("[dim]no models listed[/dim]" if not models else
                      "[dim]no chat models listed (--all shows every model)[/dim]")  # fmt: skip
    else:
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        table.add_column("MODEL", overflow="fold")
        table.add_column("OWNER")
        table.add_column("CONTEXT", justify="right")
        table.add_column("INPUT")
        if show_all:
            table.add_column("KIND")
        for row in rows:
            cells = [
                row["id"],
                row["owned_by"] or "",
                f"{row['context_length']:,}" if row["context_length"] else "",
                ", ".join(row["input_modalities"] or ()),
            ]
            if show_all:
                cells.append("chat" if row["chat"] else "other")
            table.add_row(*cells)
        console.print(table)
    if hidden:
        Console(file=stderr, highlight=False).print(
            f"[dim]{hidden} model(s) that are not chat models hidden; --all shows them[/dim]"
        )
    return 0
