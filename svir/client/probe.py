"""`svir probe BASE_URL`: drive a model server directly through the behaviours the wire protocol
reference describes (§2.4 tools, §2.5 optional fields, §2.6 structured output, §2.2 images, §5
context overflow), and report what it kept, ignored or rejected, with the evidence.

Verdicts:
- `kept`: the server did what the field asks (a required tool was called, the JSON matched).
- `ignored`: the request was taken (200) and the field changed nothing it should have.
- `rejected`: the server refused the request (an HTTP error, or an error before any output).
- `failed`: the request was taken, then the stream failed.
- `accepted`: taken, with nothing in the answer to tell whether the field was acted on.
- `unclear`: the answer cannot tell (cut off by the token cap, a timeout, a broken connection).

The report's `suggested_provider_settings` uses svir's config field names (ProviderConfig), so it
can seed the provider's entry in svir.toml.
"""

from __future__ import annotations

import base64
import struct
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import httpx
import jsonschema
import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from svir.client.connection import ClientFailure, Connection, Unreachable
from svir.providers import KINDS
from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import ReasoningDelta, RefusalDelta, StreamError, TextDelta
from svir.wire.models import ModelInfo, is_chat_model
from svir.wire.toolcalls import ToolCall

__all__ = [
    "REASONING_EFFORTS",
    "Exchange",
    "Finding",
    "Prober",
    "Report",
    "run_probe",
    "tiny_png",
]

Clock = Callable[[], float]

REASONING_EFFORTS = ("none", "low", "medium", "high", "xhigh")
# The groups of checks `--only` can pick; the plain request that reports usage always runs.
GROUPS = ("usage", "tools", "json", "reasoning", "image", "overflow")
# A prompt this many words long exceeds any context a server lists; used when it lists none.
OVERFLOW_WORDS_UNKNOWN = 300_000
# The overflow body stays bounded whatever context a server claims (about 3 MB).
OVERFLOW_WORDS_MAX = 1_000_000
_ERROR_BODY_LIMIT = 64 * 1024
_SHOWN_BODY = 600

LOCKER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "open_locker",
        "description": "Open a locker by its number.",
        "parameters": {
            "type": "object",
            "properties": {"locker": {"type": "integer", "description": "The locker number"}},
            "required": ["locker"],
        },
    },
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
TOOLS = [LOCKER_TOOL, WEATHER_TOOL]
LOCKER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"locker": {"type": "integer"}, "open": {"type": "boolean"}},
    "required": ["locker", "open"],
    "additionalProperties": False,
}

_encode = msgspec.json.encode


def tiny_png(width: int = 64, height: int = 64, rgb: tuple[int, int, int] = (220, 30, 30)) -> bytes:
    """A solid-colour RGB PNG, made here: no image file or library needed."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------
# One request and what it showed


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
            "text": _clip(self.text, 200),
            "reasoning_chars": len(self.reasoning),
            "reasoning_carrier": self.reasoning_carrier,
            "tool_calls": [
                {"name": c.name, "arguments": _clip(c.arguments, 120)} for c in self.tool_calls
            ],
            "usage": self.usage,
            "seconds": round(self.seconds, 2),
        }
        if self.refusal:
            ev["refusal"] = _clip(self.refusal, 200)
        if self.timed_out:
            ev["timed_out"] = True
        if self.error is not None:
            err = self.error
            ev["error"] = {
                "kind": err.kind.value,
                "message": _clip(err.message, 400),
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
            parts.append(f"{where}{_clip(self.error.message, 140)}")
        if self.timed_out:
            parts.append(f"no answer within {self.seconds:.0f} s")
        if self.called:
            parts.append("called " + ", ".join(self.called))
        if self.finish_reason:
            parts.append(f"finish {self.finish_reason}")
        return " · ".join(parts)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Findings and the report


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


# ---------------------------------------------------------------------------------------------
# The prober


class Prober:
    """Sends the probe's requests one after another (local servers answer one at a time)."""

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
        ex = Exchange()
        tools = body.get("tools") or ()
        names = [t["function"]["name"] for t in tools]
        decoder = StreamDecoder(think_tags=True, tool_names=names)
        started = self.clock()
        deadline = started + self.timeout
        url = self.conn.url("chat/completions")
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        try:
            with client.stream("POST", url, content=_encode(body), headers=headers) as resp:
                ex.status = resp.status_code
                if resp.status_code >= 300:
                    raw = b"" if resp.status_code in (401, 403) else _read_some(resp)
                    ex.error = classify_http_error(resp.status_code, dict(resp.headers), raw)
                    ex.error_body = _clip(raw.decode("utf-8", "replace"), _SHOWN_BODY)
                    return ex
                problem = check_stream_response(resp.status_code, resp.headers.get("content-type"))
                if problem is not None:
                    ex.error = problem
                    ex.error_body = _clip(_read_some(resp).decode("utf-8", "replace"), _SHOWN_BODY)
                    return ex
                ended = False
                for chunk in resp.iter_raw():
                    for ev in decoder.feed(chunk):
                        self._take(ex, ev)
                    if decoder.complete or decoder.error is not None:
                        ended = True
                        break
                    if first_output and (ex.text or ex.reasoning or decoder.tool_calls):
                        ended = True
                        break
                    if self.clock() > deadline:
                        ex.timed_out = True
                        ended = True
                        break
                if not ended:
                    for ev in decoder.close():
                        self._take(ex, ev)
        except httpx.TimeoutException:
            ex.timed_out = True
        except httpx.HTTPError as exc:
            in_stream = ex.status is not None
            ex.error = UpstreamError(
                ErrorKind.INCOMPLETE if in_stream else ErrorKind.TRANSIENT,
                f"{type(exc).__name__}: {exc}", in_stream=in_stream,
            )  # fmt: skip
        finally:
            ex.seconds = self.clock() - started
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

    @staticmethod
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

    def add(self, finding_id: str, behaviour: str, sent: dict[str, Any], verdict: str,  # noqa: PLR0917
            meaning: str, ex: Exchange, summary: str | None = None) -> Finding:  # fmt: skip
        finding = Finding(finding_id, behaviour, sent, verdict, summary or ex.brief(), meaning,
                          ex.evidence())  # fmt: skip
        self.findings.append(finding)
        self.exchanges[finding_id] = ex
        return finding

    # The run

    def steps(self) -> list[tuple[str, Callable[[httpx.Client], None]]]:
        """The checks to run, in order: (name, check)."""
        groups: list[tuple[str, list[tuple[str, Callable[[httpx.Client], None]]]]] = [
            ("usage", [("usage", self.check_usage)]),
            ("tools", [(f"tool_choice {w}", self._tool_step(w))
                       for w in ("auto", "none", "required", "named", "invalid")]),
            ("json", [("json_object", lambda c: self.check_json(c, "json_object")),
                      ("json_schema", lambda c: self.check_json(c, "json_schema"))]),
            ("reasoning", [(f"reasoning_effort {e}", self._effort_step(e))
                           for e in REASONING_EFFORTS]),
            ("image", [("image", self.check_image)]),
            ("overflow", [("overflow", self.check_overflow)]),
        ]  # fmt: skip
        return [
            step
            for group, checks in groups
            if group == "usage" or self.only is None or group in self.only
            for step in checks
        ]

    def _tool_step(self, which: str) -> Callable[[httpx.Client], None]:
        return lambda c: self.check_tool_choice(c, which)

    def _effort_step(self, effort: str) -> Callable[[httpx.Client], None]:
        return lambda c: self.check_effort(c, effort)

    def run(self) -> Report:
        started = self.clock()
        client = httpx.Client(headers=self.conn.headers(),
                              timeout=httpx.Timeout(self.timeout, connect=10.0))  # fmt: skip
        with client:
            self.pick_model(client)
            for name, step in self.steps():
                if self.deadline is not None and self.clock() >= self.deadline:
                    self.skipped.append(name)
                    continue
                self.on_step(name)
                step(client)
        self.judge_efforts()
        settings, why, notes = suggest(self)
        if self.skipped:
            notes.append(f"Out of time: {', '.join(self.skipped)} not checked.")
        return Report(
            base_url=self.conn.base,
            model=self.model or "",
            server=self.server_info(),
            findings=self.findings,
            settings=settings,
            why=why,
            notes=notes,
            seconds=self.clock() - started,
        )

    def pick_model(self, client: httpx.Client) -> None:
        self.on_step("models")
        try:
            self.models = self.conn.list_models(client)
        except ClientFailure as exc:
            if self.model is None:
                if isinstance(exc, Unreachable):
                    raise  # naming a model would not make the server answer
                raise ClientFailure(f"{exc}; name the model with --model") from None
            self.models = []
        if self.model is None:
            chat = [m for m in self.models if is_chat_model(m.id, m.name)]
            if not chat:
                raise ClientFailure("the server lists no chat model; name one with --model")
            self.model = chat[0].id
        self.listed = next((m for m in self.models if m.id == self.model), None)
        if self.listed is None and len(self.models) == 1:
            # llama.cpp serves its one model under any name (§2.1).
            self.listed = self.models[0]

    def server_info(self) -> dict[str, Any]:
        m = self.listed
        return {
            "models_listed": len(self.models),
            "model_listed": m is not None and m.id == self.model,
            "owned_by": m.owned_by if m else None,
            "context_length": m.context_length if m else None,
            "input_modalities": list(m.input_modalities) if m and m.input_modalities else None,
            "kind_guess": guess_kind(self)[0],
        }

    # Checks

    def check_usage(self, client: httpx.Client) -> None:
        sent = {"stream_options": {"include_usage": True}}
        ex = self.send(client, self.body("Say hello.", 16))
        if ex.refused and ex.error is not None and ex.error.status in (400, 422):
            # Perhaps the field (§2.5): the same request without it tells.
            self.stream_options = False
            again = self.send(client, self.body("Say hello.", 16))
            if again.ok:
                self.add("usage", "usage chunk (stream_options)", sent, "rejected",
                         "The server refuses stream_options.include_usage; without it the request "
                         "goes through. svir retries without the field and remembers that, so "
                         "usage may be missing.", ex)  # fmt: skip
                self.exchanges["baseline"] = again
                return
            self.stream_options = True
        if not ex.ok:
            raise ClientFailure(
                f"a plain request to {self.model} failed, so nothing else can be probed: "
                f"{ex.brief() or 'no answer'}"
            )
        self.exchanges["baseline"] = ex
        if ex.usage is not None:
            self.add("usage", "usage chunk (stream_options)", sent, "kept",
                     "The server sends the trailing usage chunk when asked (§3.4): token counts "
                     "and tokens/s reach svir's logs and clients.", ex,
                     f"{ex.status} · usage {ex.usage['prompt_tokens']} prompt + "
                     f"{ex.usage['completion_tokens']} completion tokens")  # fmt: skip
        else:
            self.add("usage", "usage chunk (stream_options)", sent, "ignored",
                     "The server takes stream_options but sends no usage: answers are complete, "
                     "token counts are unknown (§3.4).", ex)  # fmt: skip

    def check_tool_choice(self, client: httpx.Client, which: str) -> None:
        choice: Any
        if which == "named":
            choice = {"type": "function", "function": {"name": "get_weather"}}
            prompt = "Open locker 7."
        elif which == "invalid":
            choice = "bogus"
            prompt = "Say hello."
        else:
            choice = which
            prompt = "Say hello." if which == "required" else "Open locker 7."
        sent = {"tool_choice": choice, "tools": ["open_locker", "get_weather"], "prompt": prompt}
        ex = self.send(client, self.body(prompt, 48, tools=TOOLS, tool_choice=choice))
        fid = f"tool_choice.{which}"
        label = f"tool_choice {choice if isinstance(choice, str) else 'named get_weather'}"
        if which == "invalid":
            label = 'tool_choice "bogus" (invalid)'
        if ex.refused:
            meaning = {
                "invalid": "The server checks tool_choice and refuses a value the protocol does "
                           "not have, as it should.",
                "named": "The server refuses a named tool_choice (LM Studio does, §2.4); svir's "
                         "lmstudio kind sends it as required over that one tool.",
            }.get(which, f"The server refuses tool_choice {which!r} with these tools (§2.4): a "
                         "client that sends it gets this error.")  # fmt: skip
            self.add(fid, label, sent, "rejected", meaning, ex)
            return
        if ex.error is not None and not ex.timed_out:
            self.add(fid, label, sent, "failed",
                     "The server took the request, then the stream failed (llama.cpp does when "
                     "the model writes a call its parser does not expect, §3.5): the client "
                     "gets a partial answer and an error.", ex)  # fmt: skip
            return
        called = ex.called
        if not ex.ok and not called:
            self.add(fid, label, sent, "unclear", "The answer did not complete.", ex)
            return
        if which == "invalid":
            self.add(
                fid,
                label,
                sent,
                "ignored",
                "The server took a tool_choice the protocol does not have: it does not "
                "check the field, so it may not read it at all (mlx-lm, §2.4).",
                ex,
            )
        elif which == "auto":
            if called:
                self.add(fid, label, sent, "kept", "With auto the model called a tool: tools "
                         "reach the model and calls come back assembled.", ex)  # fmt: skip
            else:
                self.add(
                    fid,
                    label,
                    sent,
                    "accepted",
                    "The model answered in text, which "
                    "auto allows; this does not tell whether tools reach it.",
                    ex,
                )
        elif which == "none":
            if called:
                self.add(
                    fid,
                    label,
                    sent,
                    "ignored",
                    "The model called a tool although "
                    "tool_choice was none: the server does not hold the model to it.",
                    ex,
                )
            else:
                self.add(
                    fid,
                    label,
                    sent,
                    "kept",
                    "No tool was called with none, though the prompt asked for one.",
                    ex,
                )
        elif which == "required":
            if called:
                self.add(fid, label, sent, "kept", "Asked only to say hello, the model called a "
                         "tool: the server holds it to required.", ex)  # fmt: skip
            else:
                self.add(
                    fid,
                    label,
                    sent,
                    "ignored",
                    "Asked to say hello with a tool required, "
                    "the model called none: required is accepted and not kept (LM Studio "
                    "does this, §2.4). A client that needs a call cannot count on one.",
                    ex,
                )
        elif which == "named":
            if called and all(n == "get_weather" for n in called):
                self.add(fid, label, sent, "kept", "Asked to open a locker with get_weather "
                         "named, the model called get_weather: the server holds it to the name.",
                         ex)  # fmt: skip
            else:
                what = f"called {', '.join(called)}" if called else "called nothing"
                self.add(
                    fid,
                    label,
                    sent,
                    "ignored",
                    f"With get_weather named, the model {what}: "
                    "a named tool_choice is accepted and not kept (llama.cpp, §2.4).",
                    ex,
                )

    def check_json(self, client: httpx.Client, kind: str) -> None:
        if kind == "json_object":
            rf: dict[str, Any] = {"type": "json_object"}
            prompt = ("Reply with a JSON object with two keys: locker, the number 7, "
                      "and open, true.")  # fmt: skip
        else:
            rf = {
                "type": "json_schema",
                "json_schema": {"name": "locker", "schema": LOCKER_SCHEMA, "strict": True},
            }
            prompt = "Locker 7 is open. Describe it as JSON."
        sent = {"response_format": rf, "prompt": prompt}
        ex = self.send(client, self.body(prompt, 96, response_format=rf))
        fid = f"response_format.{kind}"
        label = f"response_format {kind}"
        if ex.refused:
            meaning = (
                "The server refuses json_object (LM Studio does, §2.6); svir's lmstudio "
                "kind sends a json_schema that admits any object instead."
                if kind == "json_object"
                else "The server refuses json_schema: structured output is not available here."
            )
            self.add(fid, label, sent, "rejected", meaning, ex)  # fmt: skip
            return
        if ex.error is not None or ex.timed_out:
            self.add(
                fid,
                label,
                sent,
                "failed" if ex.error else "unclear",
                "The answer did not complete, so its JSON cannot be judged.",
                ex,
            )
            return
        answer, where = ex.text.strip(), "content"
        if not answer and ex.reasoning.strip():
            answer, where = ex.reasoning.strip(), "reasoning"
        parsed, value = _json(answer)
        matches = None
        if parsed and kind == "json_schema":
            try:
                jsonschema.validate(value, LOCKER_SCHEMA)
                matches = True
            except jsonschema.ValidationError:
                matches = False
        is_object = parsed and isinstance(value, dict)
        ex_ev_extra = {"parsed": parsed, "object": is_object, "matches_schema": matches,
                       "answer_in": where}  # fmt: skip
        kept = is_object and (kind == "json_object" or matches)
        if kept:
            verdict = "kept"
            meaning = (
                "The answer parsed as a JSON object."
                if kind == "json_object"
                else "The answer parsed as JSON and matched the schema."
            )
            if where == "reasoning":
                meaning += (
                    " It arrived as reasoning with the content empty, as LM Studio does "
                    "with reasoning on (§2.6); svir's lmstudio kind takes that reasoning "
                    "as the answer."
                )
            summary = f"{ex.status} · {'matches schema' if matches else 'JSON object'}"
            summary += f" (in {where})" if where != "content" else ""
        elif ex.finish_reason == "length" and answer.startswith(("{", "[")):
            verdict = "unclear"
            meaning = (
                "The answer started as JSON and was cut off by max_tokens, so it cannot "
                "be judged (§2.6: treat length as incomplete)."
            )
            summary = f"{ex.status} · JSON cut off by length"
        else:
            verdict = "ignored"
            what = (
                "is JSON but not an object"
                if parsed and not is_object
                else "does not match the schema"
                if parsed
                else "is not JSON"
            )
            meaning = (
                f"The answer {what}: the server takes response_format and does not "
                'constrain the answer (mlx-lm, §2.6). With response_format = "validate" '
                "svir checks answers and fails the ones that do not match."
            )
            summary = f"{ex.status} · answer {what} · finish {ex.finish_reason}"
        finding = self.add(fid, label, sent, verdict, meaning, ex, summary)
        finding.evidence.update(ex_ev_extra)

    def check_effort(self, client: httpx.Client, effort: str) -> None:
        prompt = "What is 17 times 3? Answer with the number only."
        ex = self.send(client, self.body(prompt, 48, reasoning_effort=effort))
        sent = {"reasoning_effort": effort, "prompt": prompt}
        label = f"reasoning_effort {effort}"
        fid = f"reasoning_effort.{effort}"
        if ex.refused:
            self.add(
                fid,
                label,
                sent,
                "rejected",
                f"The server refuses reasoning_effort {effort!r} (vLLM refuses values its "
                "chat template does not name, §2.5). svir retries once with the nearest "
                "value the error names, or without the field, and remembers it.",
                ex,
            )
            return
        reasoned = (f"{len(ex.reasoning)} characters of reasoning" if ex.reasoning
                    else "no reasoning")  # fmt: skip
        # The verdict waits until every level has been seen (judge_efforts).
        self.add(fid, label, sent, "accepted" if ex.ok else "unclear", "", ex,
                 f"{ex.status} · {reasoned} · finish {ex.finish_reason}")  # fmt: skip

    def judge_efforts(self) -> None:
        levels = {f.id.split(".", 1)[1]: f for f in self.findings
                  if f.id.startswith("reasoning_effort.")}  # fmt: skip
        taken = {e: f for e, f in levels.items() if f.verdict != "rejected"}
        amount = {e: len(self.exchanges[f.id].reasoning) for e, f in taken.items()}
        any_reasoning = any(amount.values())
        for effort, f in taken.items():
            if f.verdict == "unclear":
                f.meaning = "The answer did not complete."
                continue
            if not any_reasoning:
                f.verdict = "accepted"
                f.meaning = (
                    "Taken; no reasoning appeared at any effort, so its effect cannot be "
                    "seen (the model may not reason, or the server does not show it)."
                )
            elif effort == "none":
                if amount[effort]:
                    f.verdict = "ignored"
                    f.meaning = (
                        "The model reasoned although the effort was none: the server "
                        "or its chat template does not read the field (llama.cpp, "
                        "mlx-lm, §2.5)."
                    )
                else:
                    f.verdict = "kept"
                    f.meaning = (
                        "No reasoning at none, reasoning at other efforts: the effort "
                        "turns reasoning off."
                    )
            elif amount[effort]:
                none_reasoned = amount.get("none", 0) > 0
                f.verdict = "accepted" if none_reasoned else "kept"
                f.meaning = (
                    "Taken and the model reasoned; since it reasons at none too, the "
                    "effort may change nothing."
                    if none_reasoned
                    else "Taken and the model reasoned; at none it does not."
                )
            else:
                f.verdict = "ignored"
                f.meaning = (
                    "No reasoning at this effort while other efforts reasoned: the "
                    "server dropped or mapped this value."
                )

    def check_image(self, client: httpx.Client) -> None:
        png = tiny_png()
        url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        content = [
            {"type": "text", "text": "What colour is this image? Answer in one word."},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        sent = {"image": f"a {len(png)}-byte 64x64 red PNG as a data URL"}
        ex = self.send(client, self.body(content, 16))
        if ex.refused:
            recognized = ex.error is not None and ex.error.kind is ErrorKind.UNSUPPORTED_INPUT
            meaning = (
                "The server refuses images"
                + (
                    " and svir recognizes the refusal as unsupported input (never retried)."
                    if recognized
                    else "; svir does not recognize this refusal as unsupported "
                    "input, so set images = false."
                )
                + " With images = false svir refuses images "
                "itself with 400 unsupported_input, so a route's fallback can take them."
            )
            self.add("image", "image (data URL)", sent, "rejected", meaning, ex)  # fmt: skip
        elif ex.ok:
            self.add(
                "image",
                "image (data URL)",
                sent,
                "kept",
                "The server took the image and answered; the answer says whether the "
                "model saw red.",
                ex,
                f"{ex.status} · answered {_clip(ex.text, 60)!r}",
            )
        else:
            self.add(
                "image",
                "image (data URL)",
                sent,
                "failed" if ex.error else "unclear",
                "The server took the image, then the answer did not complete.",
                ex,
            )

    def check_overflow(self, client: httpx.Client) -> None:
        ctx = self.listed.context_length if self.listed else None
        words = min(ctx * 2 + 1024, OVERFLOW_WORDS_MAX) if ctx else OVERFLOW_WORDS_UNKNOWN
        prompt = "hi " * words + "\nSay hello."
        sent = {"prompt": f"'hi' repeated {words} times ({len(prompt)} bytes)",
                "context_listed": ctx}  # fmt: skip
        ex = self.send(client, self.body(prompt, 4), first_output=True)
        label = "context overflow"
        if ex.refused or (ex.error is not None and ex.error.kind is ErrorKind.CONTEXT_OVERFLOW):
            err = ex.error
            assert err is not None
            if err.kind is ErrorKind.CONTEXT_OVERFLOW:
                where = "inside the stream (status 200)" if err.in_stream else f"with {err.status}"
                self.add(
                    "overflow",
                    label,
                    sent,
                    "rejected",
                    f"The server refuses a prompt beyond its context {where}, in words svir "
                    "recognizes as an overflow (§5): clients get context_length_exceeded, "
                    "and a route's context_fallback can take the request.",
                    ex,
                )
            else:
                self.add(
                    "overflow",
                    label,
                    sent,
                    "rejected",
                    "The server refuses the long prompt, but not in words svir recognizes "
                    "as a context overflow (§5): clients get a plain rejection, and a "
                    "route's context_fallback is not used.",
                    ex,
                )
        elif ex.timed_out:
            self.add(
                "overflow",
                label,
                sent,
                "unclear",
                f"No answer within {self.timeout:g} s: the server enforces no limit before "
                "reading the whole prompt (mlx-lm has none, §5), or reads slowly.",
                ex,
            )
        elif ex.text or ex.reasoning or ex.tool_calls or ex.ok:
            self.add("overflow", label, sent, "ignored",
                     f"The server started answering a prompt of about {words} tokens"
                     + (f", beyond the {ctx} it lists" if ctx else "")
                     + ": it enforces no context limit, or truncates the prompt silently (§5).",
                     ex, f"{ex.status} · answered anyway")  # fmt: skip
        else:
            self.add(
                "overflow",
                label,
                sent,
                "failed",
                "The stream failed in a way that does not say overflow.",
                ex,
            )


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


def _json(text: str) -> tuple[bool, Any]:
    try:
        return True, msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False, None


# ---------------------------------------------------------------------------------------------
# From findings to settings


def _error_text(prober: Prober) -> str:
    texts = []
    for ex in prober.exchanges.values():
        if ex.error is not None:
            texts.append(ex.error.message)
        if ex.error_body:
            texts.append(ex.error_body)
    return "\n".join(texts)


def guess_kind(prober: Prober) -> tuple[str, str]:
    """The provider kind the evidence points to, and why."""
    owner = (prober.listed.owned_by or "").lower() if prober.listed else ""
    if owner == "vllm":
        return "vllm", 'the model list says owned_by "vllm"'
    if owner == "llamacpp":
        return "llamacpp", 'the model list says owned_by "llamacpp"'
    errors = _error_text(prober)
    lm_studio = ("Invalid tool_choice type: 'object'",
                 "'response_format.type' must be 'json_schema' or 'text'")  # fmt: skip
    if any(s in errors for s in lm_studio):
        return "lmstudio", "its refusals are LM Studio's (§2.4, §2.6)"
    if any(ex.error is not None and ex.error.details.get("event") == "error"
           for ex in prober.exchanges.values()):  # fmt: skip
        return "lmstudio", "it reports errors as an SSE `event: error` (LM Studio, §3.5)"
    if "Only 'text' content type is supported" in errors:
        return "mlx-lm", "it refuses images with mlx-lm's message (§2.2)"
    if any(ex.error_body and ex.error_body.lstrip().startswith('{"detail"')
           for ex in prober.exchanges.values()):  # fmt: skip
        return "mlx-vlm", "its errors carry `detail` (mlx-vlm, §5)"
    if prober.listed is not None and prober.listed.owned_by == "organization_owner":
        return "lmstudio", 'the model list says owned_by "organization_owner" (LM Studio)'
    return "openai-compatible", "nothing in the answers names a known server"


def suggest(prober: Prober) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Provider settings (svir.toml field names), why each is set, and notes on what svir
    already handles by itself."""
    kind, kind_why = guess_kind(prober)
    spec = KINDS[kind]
    settings: dict[str, Any] = {"kind": kind, "base_url": prober.conn.base}
    why: dict[str, str] = {"kind": f"{kind}: {kind_why}."}
    notes: list[str] = []
    found = {f.id: f for f in prober.findings}

    def verdict(fid: str) -> str | None:
        f = found.get(fid)
        return f.verdict if f else None

    image = verdict("image")
    if image == "rejected":
        settings["images"] = False
        why["images"] = (
            "The server refused the image: svir refuses images for this provider "
            "before sending (400 unsupported_input), so a fallback can serve them."
        )
    elif image == "kept":
        settings["images"] = True
        why["images"] = "The server took the image."

    ignored = [k for k in ("json_object", "json_schema")
               if verdict(f"response_format.{k}") == "ignored"]  # fmt: skip
    if ignored:
        settings["response_format"] = "validate"
        why["response_format"] = (
            f"The server ignored {' and '.join(ignored)}: svir checks each answer against the "
            "requested JSON and ends the call with an error when it does not match, so no "
            "client takes free text for structured output."
        )
    elif "response_format.json_schema" in found or "response_format.json_object" in found:
        settings["response_format"] = "pass"
        why["response_format"] = (
            "The server constrained the answer or refused the format "
            "openly: svir passes response_format on."
        )

    drop = set(spec.default_drop)
    efforts = [verdict(f"reasoning_effort.{e}") for e in REASONING_EFFORTS]
    if all(v == "rejected" for v in efforts):
        drop.add("reasoning_effort")
        why["drop_params"] = (
            "Every reasoning_effort was refused: svir leaves the field out for this provider."
        )
    elif "rejected" in efforts:
        refused = [e for e, v in zip(REASONING_EFFORTS, efforts, strict=True) if v == "rejected"]
        notes.append(
            f"reasoning_effort {', '.join(refused)} refused: svir retries with the "
            "nearest value the error names (or without the field) and remembers it."
        )
    if drop != set(spec.default_drop):
        settings["drop_params"] = sorted(drop)

    baseline = prober.exchanges.get("baseline")
    if baseline is not None and baseline.reasoning_carrier == "think":
        settings["think_tags"] = True
        why["think_tags"] = (
            "Reasoning arrived inline as <think>…</think> in the content: svir "
            "splits it off as reasoning (§4)."
        )
    if prober.conn.api_key is not None:
        notes.append("The probe sent a key: name its environment variable in api_key_env.")

    if verdict("usage") == "rejected":
        notes.append(
            "stream_options was refused: svir retries without it and remembers that "
            "(usage may then be missing); it cannot be put in drop_params."
        )
    if verdict("tool_choice.named") == "rejected" and kind != "lmstudio":
        notes.append(
            "A named tool_choice was refused: kind lmstudio sends it as required over "
            "the one tool; other kinds pass it on as the client sent it."
        )
    if verdict("response_format.json_object") == "rejected" and kind != "lmstudio":
        notes.append(
            "json_object was refused: kind lmstudio sends a json_schema admitting any "
            "object instead; other kinds pass it on."
        )
    if verdict("tool_choice.required") == "ignored":
        notes.append(
            "tool_choice required is not kept: a client that requires a call may get "
            "text. No setting changes that."
        )
    if verdict("tool_choice.named") == "ignored":
        notes.append(
            "A named tool_choice is not kept: the model may call another tool or none. "
            "No setting changes that."
        )
    if verdict("tool_choice.none") in ("ignored", "failed"):
        notes.append("tool_choice none is not kept: the model may call a tool anyway"
                     + (" and the stream then fails." if verdict("tool_choice.none") == "failed"
                        else "."))  # fmt: skip
    f = found.get("response_format.json_schema")
    if f is not None and f.evidence.get("answer_in") == "reasoning" and kind != "lmstudio":
        notes.append(
            "The JSON answer arrived as reasoning: only kind lmstudio takes such "
            "reasoning as the answer."
        )
    overflow = found.get("overflow")
    if overflow is not None:
        if overflow.verdict == "rejected" and "not in words" in overflow.meaning:
            notes.append(
                "The context overflow is not recognizable: a route's context_fallback "
                "will not take such requests."
            )
        elif overflow.verdict in ("ignored", "unclear"):
            notes.append(
                "No context limit was enforced: a prompt beyond the context is read "
                "(or cut) without an error."
            )
    return settings, why, notes


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


# ---------------------------------------------------------------------------------------------
# Output

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
