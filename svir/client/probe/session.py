"""One probe's connection to the server and what it has seen: the model it probes, the model
list, each request's `Exchange` and the findings, with the request body every check starts from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from svir.client.connection import Connection
from svir.client.probe.exchange import Clock, Exchange, send
from svir.client.probe.report import Finding
from svir.wire.models import ModelInfo

__all__ = ["Session"]


class Session:
    """A probe of one server: its settings, what it has seen, and how it sends a request and
    records a finding. `Prober` runs the checks on it."""

    def __init__(
        self,
        conn: Connection,
        model: str | None = None,
        *,
        timeout: float = 180.0,
        clock: Clock = time.monotonic,
        on_step: Callable[[str], None] | None = None,
        only: frozenset[str] | None = None,
        deadline: float | None = None,
    ) -> None:
        self.conn = conn
        self.only = only
        # By `clock`: checks not started by then are left out, and the report says which.
        self.deadline = deadline
        self.skipped: list[str] = []
        self.model = model
        self.timeout = timeout
        self.clock = clock
        self.on_step = on_step or (lambda _step: None)
        self.stream_options = True
        self.listed: ModelInfo | None = None
        self.models: list[ModelInfo] = []
        self.findings: list[Finding] = []
        self.exchanges: dict[str, Exchange] = {}

    # Requests

    def body(self, content: Any, max_tokens: int, **fields: Any) -> dict[str, Any]:
        assert self.model is not None
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "stream": True,
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        if self.stream_options:
            body["stream_options"] = {"include_usage": True}
        body.update(fields)
        return body

    def send(self, client: httpx.Client, body: dict[str, Any], *, first_output: bool = False
             ) -> Exchange:  # fmt: skip
        """Send one streamed request; with `first_output`, stop reading at the first output."""
        url = self.conn.url("chat/completions")
        return send(client, url, body, timeout=self.timeout, clock=self.clock,
                    first_output=first_output)  # fmt: skip

    def add(self, finding_id: str, behaviour: str, sent: dict[str, Any], verdict: str,  # noqa: PLR0917
            meaning: str, ex: Exchange, summary: str | None = None) -> Finding:  # fmt: skip
        finding = Finding(finding_id, behaviour, sent, verdict, summary or ex.brief(), meaning,
                          ex.evidence())  # fmt: skip
        self.findings.append(finding)
        self.exchanges[finding_id] = ex
        return finding
