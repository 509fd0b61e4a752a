"""What a probe found (`Finding`, `Report`), and the report as a table (`render`) or as a
`[[providers]]` entry (`settings_toml`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["Finding", "Report", "render", "settings_toml"]


@dataclass
class Finding:
    id: str
    behaviour: str
    sent: dict[str, Any]
    verdict: str
    summary: str
    meaning: str
    evidence: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "behaviour": self.behaviour,
            "sent": self.sent,
            "verdict": self.verdict,
            "summary": self.summary,
            "meaning": self.meaning,
            "evidence": self.evidence,
        }


@dataclass
class Report:
    base_url: str
    model: str
    server: dict[str, Any]
    findings: list[Finding]
    settings: dict[str, Any]
    why: dict[str, str]
    notes: list[str]
    seconds: float

    def finding(self, finding_id: str) -> Finding:
        return next(f for f in self.findings if f.id == finding_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": {"version": 1, "base_url": self.base_url, "model": self.model,
                      "seconds": round(self.seconds, 1)},
            "server": self.server,
            "findings": [f.to_json() for f in self.findings],
            "suggested_provider_settings": self.settings,
            "why": self.why,
            "notes": self.notes,
        }  # fmt: skip


def settings_toml(settings: dict[str, Any], name: str = "probed") -> str:
    """The settings as a `[[providers]]` entry for svir.toml."""
    lines = ["[[providers]]", f"name = {_toml(name)}"]
    lines += [f"{key} = {_toml(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}")


_VERDICT_STYLE = {
    "kept": "green",
    "accepted": "cyan",
    "ignored": "yellow",
    "rejected": "red",
    "failed": "bold red",
    "unclear": "magenta",
}


def render(report: Report, console: Console) -> None:
    server = report.server
    facts = []
    if server.get("context_length"):
        facts.append(f"context {server['context_length']:,}")
    if server.get("owned_by"):
        facts.append(f"owned by {server['owned_by']}")
    console.print(f"[bold]svir probe[/bold] · {escape(report.base_url)} · model "
                  f"[bold]{escape(report.model)}[/bold]"
                  + (f" ({escape(', '.join(facts))})" if facts else ""))  # fmt: skip
    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("behaviour")
    table.add_column("verdict")
    table.add_column("evidence", overflow="fold")
    table.add_column("what it means", overflow="fold", style="dim")
    for f in report.findings:
        style = _VERDICT_STYLE.get(f.verdict, "")
        table.add_row(escape(f.behaviour), f"[{style}]{f.verdict}[/{style}]", escape(f.summary),
                      escape(f.meaning))  # fmt: skip
    console.print(table)
    if report.notes:
        console.print("[bold]Notes[/bold]")
        for note in report.notes:
            console.print(f" • {escape(note)}")
    console.print(f"[bold]Suggested provider settings[/bold] (svir.toml; {report.seconds:.0f} s)")
    console.print(settings_toml(report.settings), markup=False, highlight=False, end="")
    for key, reason in report.why.items():
        console.print(f"[dim]# {escape(key)}: {escape(reason)}[/dim]")
