"""From a probe's findings to a provider's settings (svir.toml's field names), why each is set,
and notes on what svir already handles by itself.
"""

from __future__ import annotations

from typing import Any

from svir.client.probe.payloads import REASONING_EFFORTS
from svir.client.probe.report import Finding
from svir.client.probe.session import Session
from svir.providers import KINDS

__all__ = ["guess_kind", "suggest"]


def _error_text(prober: Session) -> str:
    texts = []
    for ex in prober.exchanges.values():
        if ex.error is not None:
            texts.append(ex.error.message)
        if ex.error_body:
            texts.append(ex.error_body)
    return "\n".join(texts)


def guess_kind(prober: Session) -> tuple[str, str]:
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


def suggest(prober: Session) -> tuple[dict[str, Any], dict[str, str], list[str]]:
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

    notes += _behaviour_notes(found, kind)
    return settings, why, notes


def _behaviour_notes(found: dict[str, Finding], kind: str) -> list[str]:
    """Notes on what the findings mean for clients, which no setting changes (or which kind
    `kind` does not handle)."""

    def verdict(fid: str) -> str | None:
        f = found.get(fid)
        return f.verdict if f else None

    notes: list[str] = []
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
    return notes
