"""One request the probe sends to the server (`send`), and everything its answer showed
(`Exchange`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import ReasoningDelta, RefusalDelta, StreamError, TextDelta
from svir.wire.toolcalls import ToolCall

__all__ = ["Clock", "Exchange", "clip", "send"]

Clock = Callable[[], float]

_ERROR_BODY_LIMIT = 64 * 1024
_SHOWN_BODY = 600
_encode = msgspec.json.encode


@dataclass
class Exchange:
    """One request sent to the server and everything its answer showed."""

    status: int | None = None
    error: UpstreamError | None = None
    error_body: str | None = None
    text: str = ""
    reasoning: str = ""
    reasoning_carrier: str | None = None
    refusal: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    output_before_error: bool = False
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The answer completed."""
        return self.error is None and not self.timed_out and self.finish_reason is not None

    @property
    def refused(self) -> bool:
        """The server refused the request: an HTTP error, or an error before any output."""
        if self.error is None:
            return False
        if not self.error.in_stream:
            return self.error.status is not None
        return not self.output_before_error

    @property
    def called(self) -> list[str]:
        return [c.name for c in self.tool_calls if c.name]

    def evidence(self) -> dict[str, Any]:
        ev: dict[str, Any] = {
            "status": self.status,
            "finish_reason": self.finish_reason,
            "text": clip(self.text, 200),
            "reasoning_chars": len(self.reasoning),
            "reasoning_carrier": self.reasoning_carrier,
            "tool_calls": [
                {"name": c.name, "arguments": clip(c.arguments, 120)} for c in self.tool_calls
            ],
            "usage": self.usage,
            "seconds": round(self.seconds, 2),
        }
        if self.refusal:
            ev["refusal"] = clip(self.refusal, 200)
        if self.timed_out:
            ev["timed_out"] = True
        if self.error is not None:
            err = self.error
            ev["error"] = {
                "kind": err.kind.value,
                "message": clip(err.message, 400),
                "status": err.status,
                "code": err.code,
                "type": err.type,
                "in_stream": err.in_stream,
                "after_output": self.output_before_error,
            }
            for key in ("n_prompt_tokens", "n_ctx", "event"):
                if key in err.details:
                    ev["error"][key] = err.details[key]
        if self.error_body is not None:
            ev["error_body"] = self.error_body
        return ev

    def brief(self) -> str:
        """The evidence in one line for the table."""
        parts: list[str] = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.error is not None:
            where = "in stream: " if self.error.in_stream else ""
            parts.append(f"{where}{clip(self.error.message, 140)}")
        if self.timed_out:
            parts.append(f"no answer within {self.seconds:.0f} s")
        if self.called:
            parts.append("called " + ", ".join(self.called))
        if self.finish_reason:
            parts.append(f"finish {self.finish_reason}")
        return " · ".join(parts)


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def send(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    *,
    timeout: float,
    clock: Clock,
    first_output: bool = False,
) -> Exchange:
    """Send one streamed request to `url` (chat completions), reading its answer for at most
    `timeout` seconds of `clock`; with `first_output`, stop reading at the first output."""
    ex = Exchange()
    tools = body.get("tools") or ()
    names = [t["function"]["name"] for t in tools]
    decoder = StreamDecoder(think_tags=True, tool_names=names)
    started = clock()
    deadline = started + timeout
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    try:
        with client.stream("POST", url, content=_encode(body), headers=headers) as resp:
            ex.status = resp.status_code
            if resp.status_code >= 300:
                raw = b"" if resp.status_code in (401, 403) else _read_some(resp)
                ex.error = classify_http_error(resp.status_code, dict(resp.headers), raw)
                ex.error_body = clip(raw.decode("utf-8", "replace"), _SHOWN_BODY)
                return ex
            problem = check_stream_response(resp.status_code, resp.headers.get("content-type"))
            if problem is not None:
                ex.error = problem
                ex.error_body = clip(_read_some(resp).decode("utf-8", "replace"), _SHOWN_BODY)
                return ex
            ended = False
            for chunk in resp.iter_raw():
                for ev in decoder.feed(chunk):
                    _take(ex, ev)
                if decoder.complete or decoder.error is not None:
                    ended = True
                    break
                if first_output and (ex.text or ex.reasoning or decoder.tool_calls):
                    ended = True
                    break
                if clock() > deadline:
                    ex.timed_out = True
                    ended = True
                    break
            if not ended:
                for ev in decoder.close():
                    _take(ex, ev)
    except httpx.TimeoutException:
        ex.timed_out = True
    except httpx.HTTPError as exc:
        in_stream = ex.status is not None
        ex.error = UpstreamError(
            ErrorKind.INCOMPLETE if in_stream else ErrorKind.TRANSIENT,
            f"{type(exc).__name__}: {exc}", in_stream=in_stream,
        )  # fmt: skip
    finally:
        ex.seconds = clock() - started
    ex.tool_calls = decoder.tool_calls
    if decoder.complete:
        ex.finish_reason = decoder.finish_reason
    ex.reasoning_carrier = decoder.reasoning_carrier
    if decoder.usage is not None:
        u = decoder.usage
        ex.usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                    "total_tokens": u.total_tokens}  # fmt: skip
        if u.reasoning_tokens is not None:
            ex.usage["reasoning_tokens"] = u.reasoning_tokens
    return ex


def _take(ex: Exchange, ev: Any) -> None:
    if isinstance(ev, TextDelta):
        ex.text += ev.text
    elif isinstance(ev, ReasoningDelta):
        ex.reasoning += ev.text
    elif isinstance(ev, RefusalDelta):
        ex.refusal += ev.text
    elif isinstance(ev, StreamError):
        ex.error = ev.error
        ex.output_before_error = bool(ex.text or ex.reasoning or ex.refusal)


def _read_some(resp: httpx.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    try:
        for data in resp.iter_raw():
            parts.append(data)
            size += len(data)
            if size >= _ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass
    return b"".join(parts)[:_ERROR_BODY_LIMIT]
