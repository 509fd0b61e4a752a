"""The probe's checks, in order, each sending its request and judging the answer into a finding
(`Prober.run`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import msgspec

from svir.client.connection import ClientFailure, Unreachable
from svir.client.probe.exchange import Exchange, clip
from svir.client.probe.payloads import (
    LOCKER_SCHEMA,
    OVERFLOW_WORDS_MAX,
    OVERFLOW_WORDS_UNKNOWN,
    REASONING_EFFORTS,
    TOOLS,
    tiny_png,
)
from svir.client.probe.report import Report
from svir.client.probe.session import Session
from svir.client.probe.suggest import guess_kind, suggest
from svir.wire.errors import ErrorKind
from svir.wire.models import is_chat_model

__all__ = ["Prober"]


class Prober(Session):
    """Sends the probe's requests one after another (local servers answer one at a time)."""

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
        judged = _tool_choice_verdict(which, called)
        if judged is not None:
            self.add(fid, label, sent, *judged, ex)

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
        verdict, meaning, summary, judged = _json_verdict(kind, ex)
        finding = self.add(fid, label, sent, verdict, meaning, ex, summary)
        finding.evidence.update(judged)

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
                f"{ex.status} · answered {clip(ex.text, 60)!r}",
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


def _json_verdict(kind: str, ex: Exchange) -> tuple[str, str, str, dict[str, Any]]:
    """The verdict on a completed answer to response_format `kind`, what it means, its summary,
    and what was found of the JSON (the finding's evidence)."""
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
    judged = {"parsed": parsed, "object": is_object, "matches_schema": matches,
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
    return verdict, meaning, summary, judged


def _tool_choice_verdict(which: str, called: list[str]) -> tuple[str, str] | None:
    """The verdict on a completed answer to tool_choice `which` (the tools it `called`), and
    what it means."""
    if which == "invalid":
        return (
            "ignored",
            "The server took a tool_choice the protocol does not have: it does not "
            "check the field, so it may not read it at all (mlx-lm, §2.4).",
        )
    if which == "auto":
        if called:
            return "kept", (
                "With auto the model called a tool: tools reach the model and calls come back "
                "assembled."
            )
        return "accepted", (
            "The model answered in text, which auto allows; this does not tell whether tools "
            "reach it."
        )
    if which == "none":
        if called:
            return "ignored", (
                "The model called a tool although tool_choice was none: the server does not "
                "hold the model to it."
            )
        return "kept", "No tool was called with none, though the prompt asked for one."
    if which == "required":
        if called:
            return "kept", (
                "Asked only to say hello, the model called a tool: the server holds it to required."
            )
        return "ignored", (
            "Asked to say hello with a tool required, the model called none: required is "
            "accepted and not kept (LM Studio does this, §2.4). A client that needs a call "
            "cannot count on one."
        )
    if which == "named":
        if called and all(n == "get_weather" for n in called):
            return "kept", (
                "Asked to open a locker with get_weather named, the model called get_weather: "
                "the server holds it to the name."
            )
        what = f"called {', '.join(called)}" if called else "called nothing"
        return "ignored", (
            f"With get_weather named, the model {what}: a named tool_choice is accepted and "
            "not kept (llama.cpp, §2.4)."
        )
    return None


def _json(text: str) -> tuple[bool, Any]:
    try:
        return True, msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False, None
