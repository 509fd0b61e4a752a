"""Embeddings on the wire, sans-IO: the canonical embedding request and the checks every
protocol's request goes through into it (OpenAI's `POST /v1/embeddings` in
svir.protocols.embeddings, Ollama's `/api/embed` and `/api/embeddings` in svir.protocols.ollama),
the upstream's body (OpenAI-compatible `/v1/embeddings`, which llama-server, vLLM and OpenAI
serve, or Ollama's own `/api/embed`), its answer parsed back into an `EmbeddingAnswer`, and its
vectors in each encoding a client may ask for.

The canonical request is a dict (the gateway's chain takes dicts): `model`, `input` (a list of
strings, or a list of token arrays), and, when the client gave them, `encoding_format`,
`dimensions`, `user`, and Ollama's `truncate`, `keep_alive` and `options`.

A vector is the upstream's JSON array of numbers as it came (`msgspec.Raw`: checked to be one,
never turned into Python floats unless a client wants another encoding), the upstream's base64
text (little-endian float32, as OpenAI sends it with `encoding_format: "base64"`), or a list of
floats. A vector in the encoding the client asks for goes through as it came: 2048 vectors of 768
floats are 31 MB of JSON, which as Python floats would be 50 MB more and a second's work.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from svir.wire.errors import BodyError, ErrorKind, UpstreamError
from svir.wire.jsonbody import json_type

__all__ = [
    "MAX_INPUTS",
    "EmbeddingAnswer",
    "EmbeddingInputError",
    "Vector",
    "as_json_floats",
    "body_object",
    "check_inputs",
    "check_model",
    "decode_vector",
    "encode_vector",
    "input_texts",
    "ollama_upstream_body",
    "openai_upstream_body",
    "optional_field",
    "parse_ollama_answer",
    "parse_openai_answer",
    "positive_field",
    "said",
]

# OpenAI's own cap on the inputs of one request.
MAX_INPUTS: Final = 2048
EncodingFormat = Literal["float", "base64"]
# A vector as svir holds it: the upstream's JSON array of numbers, the base64 of little-endian
# float32s, or floats.
Vector = msgspec.Raw | str | list[float]
_LITTLE: Final = sys.byteorder == "little"
# What a JSON array of numbers is written with (msgspec has checked that it is JSON).
_NUMBER_CHARS: Final = b"0123456789.-+eE, \t\r\n[]"


class EmbeddingInputError(BodyError):
    """A client's embedding request svir will not send: `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def check_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise EmbeddingInputError("model is required", "model")
    if not isinstance(model, str) or not model.strip():
        raise EmbeddingInputError(
            f"model must be a non-empty string, not {json_type(model)}", "model"
        )
    return model


def _is_token(value: Any) -> bool:
    return type(value) is int and value >= 0


def _check_tokens(items: list[Any], where: str, param: str) -> None:
    for j, token in enumerate(items):
        if not _is_token(token):
            raise EmbeddingInputError(
                f"{where}[{j}] must be a token id (an integer, 0 or more), not {json_type(token)}",
                param,
            )


def check_inputs(value: Any, param: str, *, tokens: bool) -> list[str] | list[list[int]]:
    """The inputs as a list: a string is one input, an array of strings many; with `tokens`,
    an array of integers is one token array and an array of such arrays many."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        what = "a string, an array of strings or token arrays" if tokens else "a string or an array"
        raise EmbeddingInputError(f"{param} must be {what}, not {json_type(value)}", param)
    if not value:
        raise EmbeddingInputError(f"{param} must not be empty", param)
    if len(value) > MAX_INPUTS:
        raise EmbeddingInputError(
            f"{param} has {len(value)} inputs; svir takes at most {MAX_INPUTS} in one request",
            param,
        )
    first = value[0]
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise EmbeddingInputError(
                    f"{param}[{i}] must be a string like the others, not {json_type(item)}", param
                )
        return value
    if tokens and type(first) is int:
        _check_tokens(value, param, param)
        return [value]
    if tokens and isinstance(first, list):
        for i, item in enumerate(value):
            if not isinstance(item, list):
                raise EmbeddingInputError(
                    f"{param}[{i}] must be a non-empty array of token ids, not {json_type(item)}",
                    param,
                )
            if not item:
                raise EmbeddingInputError(f"{param}[{i}] must not be empty", param)
            _check_tokens(item, f"{param}[{i}]", param)
        return value
    raise EmbeddingInputError(
        f"{param}[0] must be a string{' or a token id' if tokens else ''}, not {json_type(first)}",
        param,
    )


def positive_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise EmbeddingInputError(f"{name} must be an integer of 1 or more", name)
    return value


def said(value: Any) -> str:
    return repr(value) if isinstance(value, str) and len(value) <= 40 else json_type(value)


def optional_field(body: dict[str, Any], name: str, ok: Callable[[Any], bool], what: str) -> Any:
    """The field `name` when it is there and not null, checked by `ok` (`what` it must be)."""
    value = body.get(name)
    if value is not None and not ok(value):
        raise EmbeddingInputError(f"{name} must be {what}, not {json_type(value)}", name)
    return value


def body_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise EmbeddingInputError(
            f"the request body must be a JSON object, not {json_type(body)}", "body"
        )
    return body


def input_texts(request: dict[str, Any]) -> bool:
    """Whether the request's inputs are texts (not token arrays)."""
    inputs = request["input"]
    return not inputs or isinstance(inputs[0], str)


# Upstream bodies


def openai_upstream_body(
    request: dict[str, Any], model_id: str, *, base64_answer: bool
) -> dict[str, Any]:
    """The body of an OpenAI-compatible `/v1/embeddings` request. `base64_answer` asks the
    server for base64 vectors (smaller and quicker to read than JSON floats) where it has them."""
    body: dict[str, Any] = {"model": model_id, "input": request["input"]}
    body["encoding_format"] = "base64" if base64_answer else "float"
    for name in ("dimensions", "user"):
        if name in request:
            body[name] = request[name]
    return body


def ollama_upstream_body(request: dict[str, Any], model_id: str) -> dict[str, Any]:
    """The body of an Ollama `/api/embed` request."""
    if not input_texts(request):
        raise EmbeddingInputError(
            "Ollama takes texts to embed, not token arrays: send the input as strings", "input"
        )
    body: dict[str, Any] = {"model": model_id, "input": request["input"]}
    for name in ("truncate", "keep_alive", "options", "dimensions"):
        if name in request:
            body[name] = request[name]
    return body


# Upstream answers


class _Item(msgspec.Struct):
    embedding: msgspec.Raw
    index: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    total_tokens: int | None = None


class _OpenAIAnswer(msgspec.Struct):
    data: list[_Item]
    model: str | None = None
    usage: _Usage | None = None


class _OllamaAnswer(msgspec.Struct):
    embeddings: list[msgspec.Raw]
    model: str | None = None
    prompt_eval_count: int | None = None
    total_duration: int | None = None
    load_duration: int | None = None


class EmbeddingAnswer(msgspec.Struct):
    """What an upstream answered: one vector per input, in the inputs' order, the prompt tokens
    it counted (None if it said nothing) and the model it named."""

    vectors: list[Vector]
    prompt_tokens: int | None = None
    model: str | None = None
    load_duration: int | None = None


_decode_openai = msgspec.json.Decoder(_OpenAIAnswer).decode
_decode_ollama = msgspec.json.Decoder(_OllamaAnswer).decode


def _protocol(message: str) -> UpstreamError:
    return UpstreamError(ErrorKind.PROTOCOL, f"the upstream's embeddings answer {message}")


def _count(value: int | None) -> int | None:
    return value if value is not None and value >= 0 else None


def parse_openai_answer(raw: bytes | bytearray | memoryview, count: int) -> EmbeddingAnswer:
    """An OpenAI-compatible embeddings answer for `count` inputs; a PROTOCOL UpstreamError when it
    is not one (not JSON, the wrong shape, a vector missing or twice, base64 that is not)."""
    try:
        answer = _decode_openai(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _protocol(f"cannot be read: {exc}") from None
    if len(answer.data) != count:
        raise _protocol(f"has {len(answer.data)} vectors for {count} inputs")
    vectors: list[Vector | None] = [None] * count
    for at, item in enumerate(answer.data):
        index = at if item.index is None else item.index
        if not 0 <= index < count or vectors[index] is not None:
            raise _protocol(f"has a vector at index {index} that is out of range or repeated")
        vectors[index] = _vector(item.embedding, index, base64_ok=True)
    usage = answer.usage
    prompt = None
    if usage is not None:
        prompt = _count(usage.prompt_tokens)
        if prompt is None:
            prompt = _count(usage.total_tokens)
    return EmbeddingAnswer([v for v in vectors if v is not None], prompt, answer.model)


def parse_ollama_answer(raw: bytes | bytearray | memoryview, count: int) -> EmbeddingAnswer:
    """An Ollama `/api/embed` answer for `count` inputs; a PROTOCOL UpstreamError otherwise."""
    try:
        answer = _decode_ollama(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _protocol(f"cannot be read: {exc}") from None
    if len(answer.embeddings) != count:
        raise _protocol(f"has {len(answer.embeddings)} vectors for {count} inputs")
    vectors: list[Vector] = [
        _vector(v, i, base64_ok=False) for i, v in enumerate(answer.embeddings)
    ]
    return EmbeddingAnswer(
        vectors, _count(answer.prompt_eval_count), answer.model, _count(answer.load_duration)
    )


def _vector(raw: msgspec.Raw, index: int, *, base64_ok: bool) -> Vector:
    """An upstream's vector checked: a JSON array of numbers (kept as it came), or with
    `base64_ok` a base64 string of float32s; a PROTOCOL UpstreamError otherwise."""
    data = bytes(raw)
    if data[:1] == b"[":
        # One level of array, and nothing in it but numbers.
        if data.count(b"[") == 1 and not data.translate(None, _NUMBER_CHARS):
            return raw
    elif base64_ok and data[:1] == b'"':
        text = msgspec.json.decode(data, type=str)
        if _valid_base64(text):
            return text
        raise _protocol(f"has a vector at index {index} that is not base64 float32")
    raise _protocol(f"has a vector at index {index} that is not an array of numbers")


def _valid_base64(text: str) -> bool:
    try:
        return len(base64.b64decode(text, validate=True)) % 4 == 0
    except ValueError:
        return False


# Vectors both ways


_floats = msgspec.json.Decoder(list[float]).decode


def decode_vector(vector: Vector) -> list[float]:
    """The floats of a vector (its JSON array read, base64 of little-endian float32s decoded)."""
    if isinstance(vector, list):
        return vector
    if isinstance(vector, msgspec.Raw):
        return _floats(vector)
    values = array("f", base64.b64decode(vector))
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


def encode_vector(vector: Vector) -> str:
    """A vector as OpenAI's base64: little-endian float32s (what the OpenAI SDK decodes)."""
    if isinstance(vector, str):
        return vector
    values = array("f", decode_vector(vector))
    if not _LITTLE:
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def as_json_floats(vector: Vector) -> msgspec.Raw | list[float]:
    """A vector to write as a JSON array of floats: an upstream's array as it came."""
    return vector if isinstance(vector, msgspec.Raw | list) else decode_vector(vector)
