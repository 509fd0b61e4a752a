"""Structured JSON logs: one object a line, each with the request id of the request it is about."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from typing import Any, TextIO

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


class BatchedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes lines in batches: in a running event loop, the lines logged during one turn of the
    loop go out together in one write when that turn ends; outside a loop, at once.

    Under load one write carries the access lines of many requests instead of one each (a write
    per request was ~4% of svir's time on the streamed path). A crash loses at most the lines of
    the loop turn it happened in.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        # The loop a flush is scheduled on: a loop that stopped before running it is not waited
        # for by the next one.
        self._scheduled_on: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._pending.append(line)
        if loop is None:
            self.flush()
        elif self._scheduled_on is not loop:
            self._scheduled_on = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        self.acquire()
        try:
            self._scheduled_on = None
            if self._pending:
                lines, self._pending = self._pending, []
                lines.append("")
                try:
                    self.stream.write("\n".join(lines))
                    self.stream.flush()
                except Exception:  # a closed stream at exit: nothing left to tell
                    pass
        finally:
            self.release()


def setup_logging(level: str = "info") -> None:
    """Send svir's logs as JSON lines to stderr."""
    # The JSON lines name none of these; looking them up costs a system call per record, and
    # finding the caller's file and line walks the stack (the logging HOWTO's optimization list).
    logging.logProcesses = False
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging._srcfile = None
    handler = BatchedHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger("svir")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def now_ms(start: float) -> float:
    """Milliseconds since `start` (a perf_counter reading), rounded for logs."""
    return round((time.perf_counter() - start) * 1000, 2)
