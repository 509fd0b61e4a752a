"""Structured JSON logs: one object a line, each with the request id of the request it is about."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import msgspec

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "svir_request_id", default=None
)

_encode = msgspec.json.Encoder(decimal_format="number").encode
# Values no log line may hold (upstream keys, the admin key): replaced wherever they appear.
_secrets: list[str] = []


def hide_in_logs(*values: str | None) -> None:
    """Never write these values in a log line (svir.keys registers the keys it knows)."""
    for value in values:
        if value and len(value) >= 4 and value not in _secrets:
            _secrets.append(value)


class JSONFormatter(logging.Formatter):
    """Formats a record as one JSON object; `extra={"fields": {...}}` adds fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        line = _encode(out).decode()
        for secret in _secrets:
            if secret in line:
                line = line.replace(secret, "[redacted]")
        return line


def setup_logging(level: str = "info") -> None:
    """Send svir's logs as JSON lines to stderr."""
    # The JSON lines name none of these; looking them up costs a system call per record.
    logging.logProcesses = False
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger("svir")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def now_ms(start: float) -> float:
    """Milliseconds since `start` (a perf_counter reading), rounded for logs."""
    return round((time.perf_counter() - start) * 1000, 2)
