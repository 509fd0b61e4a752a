"""Ollama's embedding requests (`/api/embed`, and the older `/api/embeddings`) checked into the
canonical embedding request, and the canonical answer written as Ollama's (pure; the shared checks
and vectors are svir.wire.embeddings)."""

from __future__ import annotations

from typing import Any

from svir.wire.embeddings import (
    EmbeddingAnswer,
    EmbeddingInputError,
    as_json_floats,
    body_object,
    check_inputs,
    check_model,
    optional_field,
    positive_field,
)
from svir.wire.jsonbody import json_type

__all__ = [
    "check_ollama_embed",
    "check_ollama_embeddings",
    "ollama_embed_answer",
    "ollama_embeddings_answer",
]


def _is_duration(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _ollama_common(body: dict[str, Any], request: dict[str, Any]) -> None:
    for name, ok, what in (
        ("keep_alive", _is_duration, "a duration or a number of seconds"),
        ("options", lambda v: isinstance(v, dict), "an object"),
    ):
        value = optional_field(body, name, ok, what)
        if value is not None:
            request[name] = value


def _ollama_body(body: Any) -> dict[str, Any]:
    body = body_object(body)
    model = body.get("model")
    if model is None and "name" in body:
        model = body["name"]
    return {"model": check_model({"model": model})}


def check_ollama_embed(body: Any) -> dict[str, Any]:
    """Ollama's `/api/embed` request (`input` a string or an array of strings, `truncate`,
    `keep_alive`, `options`, `dimensions`), checked into the canonical embedding request."""
    request = _ollama_body(body)
    if "input" not in body:
        raise EmbeddingInputError("input is required", "input")
    request["input"] = check_inputs(body["input"], "input", tokens=False)
    truncate = optional_field(body, "truncate", lambda v: isinstance(v, bool), "true or false")
    if truncate is not None:
        request["truncate"] = truncate
    dimensions = positive_field(body, "dimensions")
    if dimensions is not None:
        request["dimensions"] = dimensions
    _ollama_common(body, request)
    return request


def check_ollama_embeddings(body: Any) -> dict[str, Any]:
    """The older `/api/embeddings` request (`prompt`: one string), checked into the canonical
    embedding request of one input."""
    request = _ollama_body(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise EmbeddingInputError("prompt is required", "prompt")
    if not isinstance(prompt, str):
        raise EmbeddingInputError(f"prompt must be a string, not {json_type(prompt)}", "prompt")
    request["input"] = [prompt]
    _ollama_common(body, request)
    return request


def ollama_embed_answer(
    answer: EmbeddingAnswer, *, model: str, total_duration: int, prompt_tokens: int
) -> dict[str, Any]:
    """Ollama's `/api/embed` answer: `embeddings`, the counts and durations (nanoseconds)."""
    return {
        "model": model,
        "embeddings": [as_json_floats(v) for v in answer.vectors],
        "total_duration": total_duration,
        "load_duration": answer.load_duration or 0,
        "prompt_eval_count": prompt_tokens,
    }


def ollama_embeddings_answer(answer: EmbeddingAnswer) -> dict[str, Any]:
    """The older `/api/embeddings` answer: the one input's `embedding`."""
    return {"embedding": as_json_floats(answer.vectors[0])}
