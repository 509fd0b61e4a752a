"""OpenAI's embeddings request checked into the canonical embedding request, and the canonical
answer written as OpenAI's (pure; the shared checks and vectors are svir.wire.embeddings)."""

from __future__ import annotations

from typing import Any

import msgspec

from svir.wire.embeddings import (
    EmbeddingAnswer,
    EmbeddingInputError,
    Vector,
    as_json_floats,
    body_object,
    check_inputs,
    check_model,
    encode_vector,
    optional_field,
    positive_field,
    said,
)

__all__ = ["check_openai_request", "openai_answer"]


def check_openai_request(body: Any) -> dict[str, Any]:
    """OpenAI's embeddings request, checked: the canonical embedding request, or an
    EmbeddingInputError naming the field."""
    body = body_object(body)
    request: dict[str, Any] = {"model": check_model(body)}
    if "input" not in body:
        raise EmbeddingInputError("input is required", "input")
    request["input"] = check_inputs(body["input"], "input", tokens=True)
    fmt = body.get("encoding_format")
    if fmt is not None:
        if fmt not in ("float", "base64"):
            raise EmbeddingInputError(
                f"encoding_format must be 'float' or 'base64', not {said(fmt)}",
                "encoding_format",
            )
        request["encoding_format"] = fmt
    dimensions = positive_field(body, "dimensions")
    if dimensions is not None:
        request["dimensions"] = dimensions
    user = optional_field(body, "user", lambda v: isinstance(v, str), "a string")
    if user is not None:
        request["user"] = user
    return request


class _OutItem(msgspec.Struct):
    index: int
    embedding: Vector
    object: str = "embedding"


class _OutUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class _OutList(msgspec.Struct):
    data: list[_OutItem]
    model: str
    usage: _OutUsage
    object: str = "list"


def openai_answer(
    answer: EmbeddingAnswer, *, model: str, encoding_format: str, prompt_tokens: int
) -> _OutList:
    """OpenAI's embeddings answer (encode with msgspec): a list of `embedding` objects, base64
    or floats as the client asked."""
    convert = encode_vector if encoding_format == "base64" else as_json_floats
    data = [_OutItem(i, convert(v)) for i, v in enumerate(answer.vectors)]
    return _OutList(data, model, _OutUsage(prompt_tokens, prompt_tokens))
