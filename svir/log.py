"""svir's logs: one JSON object a line (the default, for machines), or one plain line each for a
person at a terminal (`svir serve --log-format text`); each with its ISO-8601 UTC time and the
request id of the request it is about."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

import msgspec

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "svir_request_id", default=None
)

_encode = msgspec.json.Encoder(decimal_format="number").encode
# Values no log line may hold (upstream keys, the admin key): replaced wherever they appear.
_secrets: list[str] = []


def hide_in_logs(*values: str | None) -> None:
    """Never write these values in a log line (svir.config hides every secret it reads)."""
    for value in values:
        if not value or len(value) < 4:
            continue
        # As the line has it: a quote or a control character in the value is escaped there.
        for form in (value, _encode(value).decode()[1:-1]):
            if form not in _secrets:
                _secrets.append(form)


# The formats `setup_logging` takes (`svir serve --log-format`).
LOG_FORMATS = ("json", "text")
# The time text of the last second formatted: most lines of a busy second share it.
_second: tuple[int, str] = (-1, "")


# The end of the time text for each millisecond: formatting `.{millis:03d}Z` cost more than the
# rest of the time text.
_MILLIS: Final = tuple(f".{millis:03d}Z" for millis in range(1000))


def iso_time(created: float) -> str:
    """`created` (unix time) as ISO-8601 UTC with milliseconds: 2026-01-02T03:04:05.123Z."""
    global _second
    whole, millis = divmod(round(created * 1000), 1000)
    second = _second  # one read: another thread may swap it meanwhile
    if second[0] != whole:
        second = _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return second[1] + _MILLIS[millis]


def _redacted(line: str) -> str:
    for secret in _secrets:
        if secret in line:
            line = line.replace(secret, "[redacted]")
    return line


def json_line(
    created: float,
    level: str,
    logger: str,
    msg: str,
    *,
    request_id: str | None = None,
    fields: Mapping[str, Any] | None = None,
    exc: str | None = None,
) -> str:
    """One log line: a JSON object with the time, level, logger, message, request id and fields,
    every registered secret replaced."""
    out: dict[str, Any] = {"ts": iso_time(created), "level": level, "logger": logger, "msg": msg}
    if request_id:
        out["request_id"] = request_id
    if fields:
        out.update(fields)
    if exc:
        out["exc"] = exc
    return _redacted(_encode(out).decode())


def text_line(
    created: float,
    level: str,
    logger: str,
    msg: str,
    *,
    request_id: str | None = None,
    fields: Mapping[str, Any] | None = None,
    exc: str | None = None,
) -> str:
    """The same as `json_line` for a person: `time level logger: message key=value ...`, the
    traceback on the lines after, every registered secret replaced."""
    parts = [iso_time(created), f"{level:<7}", f"{logger}:", msg]
    if request_id:
        parts.append(f"request_id={request_id}")
    for key, value in (fields or {}).items():
        text = value if isinstance(value, str) and value and " " not in value else None
        parts.append(f"{key}={text if text is not None else _encode(value).decode()}")
    line = " ".join(parts)
    if exc:
        line += "\n" + exc
    return _redacted(line)


LineFormat = Callable[..., str]


class JSONFormatter(logging.Formatter):
    """Formats a record as one JSON object; `extra={"fields": {...}}` adds fields."""

    line: LineFormat = staticmethod(json_line)

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        return self.line(
            record.created,
            record.levelname.lower(),
            record.name,
            record.getMessage(),
            request_id=getattr(record, "request_id", None) or request_id_var.get(),
            fields=fields if isinstance(fields, dict) else None,
            exc=self.formatException(record.exc_info) if record.exc_info else None,
        )


class TextFormatter(JSONFormatter):
    """Formats a record as one plain line (`text_line`), fields as key=value; a record with
    `extra={"banner": text}` (svir's start-up banner) as that text, for a person to read."""

    line: LineFormat = staticmethod(text_line)

    def format(self, record: logging.LogRecord) -> str:
        block = getattr(record, "banner", None)
        if isinstance(block, str):
            return _redacted(block)
        return super().format(record)


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
        self.add(line)

    def add(self, line: str) -> None:
        """Write a formatted line with the others of this loop turn."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        assert self.lock is not None
        with self.lock:  # a flush in another thread swaps the list out
            self._pending.append(line)
        if loop is None:
            self.flush()
        elif self._scheduled_on is not loop:
            self._scheduled_on = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        assert self.lock is not None
        with self.lock:
            self._scheduled_on = None
            if self._pending:
                lines, self._pending = self._pending, []
                lines.append("")
                try:
                    self.stream.write("\n".join(lines))
                    self.stream.flush()
                except Exception:  # a closed stream at exit: nothing left to tell
                    pass


_svir = logging.getLogger("svir")
_access = logging.getLogger("svir.access")
# svir's own handler, once `setup_logging` installed it: the access lines go to it directly.
_direct: BatchedHandler | None = None
# How that handler writes a line (json_line or text_line).
_line: LineFormat = json_line


# The access line's own keys, in `json_line`'s order; fields with one of these names take the
# general path (where a field overwrites the key in its place).
_ACCESS_KEYS: Final = frozenset({"ts", "level", "logger", "msg", "request_id", "exc"})
# What follows the time in every JSON access line, up to the request id's value.
_ACCESS_MIDDLE: Final = '","level":"info","logger":"svir.access","msg":"request","request_id":'


def log_request(fields: Mapping[str, Any], request_id: str) -> None:
    """A request's access line: logger `svir.access`, level info, message "request", `fields`.

    Under svir's own logging set-up, with nothing attached to `svir.access` itself and nothing
    set on svir's handler that would refuse the line, it goes straight to that handler: the same
    line without a LogRecord and the handler chain, which cost ~6% of the instructions of a
    non-streamed request. A JSON line is then written from its constant part and the encoded
    request id and fields, the same bytes `json_line` makes without building its dict. Otherwise
    (svir embedded, tests, handlers, filters or levels of one's own) it is an ordinary log record.
    """
    handler = _direct
    access = _access
    if (
        handler is not None
        and not access.handlers
        and not access.filters
        and access.propagate
        and handler in _svir.handlers
        and not handler.filters
        and handler.level <= logging.INFO
        and access.isEnabledFor(logging.INFO)
    ):
        if _line is json_line and request_id and fields and fields.keys().isdisjoint(_ACCESS_KEYS):
            # `json_line`'s object: its four keys and the request id, then the fields.
            line = (
                f'{{"ts":"{iso_time(time.time())}{_ACCESS_MIDDLE}'
                f"{_encode(request_id).decode()},{_encode(fields).decode()[1:]}"
            )
            if _secrets:
                line = _redacted(line)
        else:
            line = _line(
                time.time(), "info", "svir.access", "request", request_id=request_id, fields=fields
            )
        handler.add(line)
    else:
        access.info("request", extra={"fields": fields, "request_id": request_id})


def setup_logging(level: str = "info", stream: TextIO | None = None, fmt: str = "json") -> None:
    """Send svir's logs to stderr (or `stream`): JSON lines, or with `fmt="text"` plain ones."""
    global _direct, _line
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    handler = BatchedHandler(stream or sys.stderr)
    formatter = TextFormatter() if fmt == "text" else JSONFormatter()
    handler.setFormatter(formatter)
    _line = formatter.line
    _svir.handlers[:] = [handler]
    _svir.setLevel(level.upper())
    _svir.propagate = False
    _direct = handler


def hundredths(value: float) -> float:
    """`value` to two decimals, as logs, metrics and the ledger give times and rates. The same
    float as `round(value, 2)` but where `value * 100` lands on a tie that its binary form
    misstates; without `round`'s exact decimal conversion (~1.5k instructions a call, and a
    request makes about six)."""
    return round(value * 100) / 100


def now_ms(start: float) -> float:
    """Milliseconds since `start` (a perf_counter reading), to two decimals."""
    return hundredths((time.perf_counter() - start) * 1000)
