"""The model list (`GET /v1/models`) read into `ModelInfo` records, the name rule that tells chat
models from the rest (§6), and the base URL every endpoint hangs from (§1).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any, Final

import msgspec

from svir.wire.errors import BaseURLError, ProtocolError
from svir.wire.jsonbody import json_type

__all__ = [
    "ModelInfo",
    "clean_model_id",
    "endpoint_url",
    "is_chat_model",
    "json_object",
    "normalize_base_url",
    "parse_model_list",
]


class ModelInfo(msgspec.Struct, frozen=True):
    """One model as a server lists it, with what svir can use of its extra fields."""

    id: str
    name: str | None = None
    owned_by: str | None = None
    # The context the server actually runs with (vLLM's max_model_len, llama.cpp's meta.n_ctx),
    # not the one the model was trained for.
    context_length: int | None = None
    input_modalities: tuple[str, ...] | None = None
    # llama.cpp's `meta`: the context the model was trained for, its parameters, its file's
    # bytes and type.
    context_train: int | None = None
    parameters: int | None = None
    size: int | None = None
    ftype: str | None = None


def parse_model_list(body: bytes | bytearray | memoryview) -> list[ModelInfo]:
    """Read a model-list body: its `data` array, and llama.cpp's second `models` array (§6).

    Entries are kept in the order listed, each id once; an entry without a usable id is skipped.
    A body that is not JSON, or has neither array, raises ProtocolError.
    """
    doc = json_object(body, "model list")
    data, models = doc.get("data"), doc.get("models")
    if not isinstance(data, list) and not isinstance(models, list):
        raise ProtocolError("model list has no `data` array")

    found: dict[str, ModelInfo] = {}
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict):
            info = _from_data_entry(entry)
            if info is not None and info.id not in found:
                found[info.id] = info
    # llama.cpp lists its model a second time here, keyed by `model`/`name` instead of `id`; it
    # adds to an entry already listed rather than listing the model twice.
    for entry in models if isinstance(models, list) else ():
        if isinstance(entry, dict):
            _merge_models_entry(found, entry)
    return list(found.values())


def json_object(body: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    """A server's JSON object (`what` names it in the error): a body that is not JSON, or not
    an object, raises ProtocolError."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    try:
        doc = msgspec.json.decode(bytes(body))
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {json_type(doc)}")
    return doc


def _from_data_entry(entry: dict[str, Any]) -> ModelInfo | None:
    model_id = _text(entry.get("id"))
    if model_id is None:
        return None
    meta = entry.get("meta")
    context = _positive_int(entry.get("max_model_len"))
    if context is None and isinstance(meta, dict):
        context = _positive_int(meta.get("n_ctx"))
    if context is None:
        context = _positive_int(entry.get("context_length"))
    if not isinstance(meta, dict):
        meta = {}
    ftype = meta.get("ftype")
    return ModelInfo(
        id=model_id,
        # Anthropic's list names a model's `display_name`.
        name=_text(entry.get("name")) or _text(entry.get("display_name")),
        owned_by=_text(entry.get("owned_by")),
        context_length=context,
        input_modalities=_modalities(entry),
        context_train=_positive_int(meta.get("n_ctx_train")),
        parameters=_positive_int(meta.get("n_params")),
        size=_positive_int(meta.get("size")),
        ftype=ftype if isinstance(ftype, str) and ftype else None,
    )


def _merge_models_entry(found: dict[str, ModelInfo], entry: dict[str, Any]) -> None:
    model, name = _text(entry.get("model")), _text(entry.get("name"))
    key = next((k for k in (model, name) if k is not None and k in found), None)
    modalities = _modalities(entry)
    if key is not None:
        known = found[key]
        if known.input_modalities is None and modalities is not None:
            found[key] = msgspec.structs.replace(known, input_modalities=modalities)
        return
    model_id = model or name
    if model_id is None:
        return
    found[model_id] = ModelInfo(
        id=model_id,
        name=name if name != model_id else None,
        input_modalities=modalities,
    )


def _modalities(entry: dict[str, Any]) -> tuple[str, ...] | None:
    arch = entry.get("architecture")
    raw = arch.get("input_modalities") if isinstance(arch, dict) else None
    if raw is None:
        raw = entry.get("input_modalities")
    if not isinstance(raw, list):
        return None
    kept = tuple(item for item in raw if isinstance(item, str) and item)
    return kept or None


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


# The name rule (§6). No field tells a chat model from an embedding, speech or image model, so the
# name does. Matching whole tokens rather than substrings keeps words that merely contain a
# keyword out: "speechless" is a chat family, "task" is not "asr", "Pitts" is not "tts". Tokens are
# cut at punctuation, at letter/digit changes and at camelCase bumps, and the lowercase run of
# letters is kept as well, so "OuteTTS" yields both "oute"+"tts" and "outetts".
#
# Three kinds of match, from strictest to loosest:
# - a token equal to the keyword: short or common keywords, where looser matching misfires;
# - a token starting with it: keywords that appear glued into compounds ("embedding",
#   "embeddinggemma", "reranker", "whisperx");
# - a token ending with it: keywords that appear as a suffix of a product name ("xtts", "outetts",
#   "stablediffusion").
#
# Only the id's last path segment and the name are looked at: a directory on the way to a model
# file ("/srv/image-models/qwen3.gguf") says nothing about the model.
#
# Known misses, accepted: chat models that take audio ("Qwen2-Audio-7B-Instruct",
# "gpt-4o-audio-preview") are counted out with the speech models, and a non-chat model whose name
# has none of the keywords ("all-MiniLM-L6-v2", "e5-mistral-7b-instruct") is counted in.
_EXACT = frozenset({"bge", "clip", "asr", "speech", "audio", "image", "flux", "sdxl", "diffusion"})
_PREFIX = ("embed", "rerank", "whisper")
_SUFFIX = ("tts", "diffusion")
# English words that end in a suffix keyword without meaning it.
_SUFFIX_EXCEPTIONS = frozenset({"watts", "mitts", "butts", "putts", "mutts", "pitts", "matts"})

_CAMEL_TOKEN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_LOWER_TOKEN = re.compile(r"[a-z]+|[0-9]+")


def is_chat_model(model_id: str, name: str | None = None) -> bool:
    """Whether a listed model looks like a chat model by its id and name (see the rule above)."""
    if not isinstance(model_id, str):
        raise TypeError(f"model_id must be a str, not {type(model_id).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, not {type(name).__name__}")
    texts = [_last_segment(model_id)]
    if name:
        texts.append(_last_segment(name))
    return not any(_matches(token) for text in texts for token in _tokens(text))


def _last_segment(text: str) -> str:
    # Ids are paths on disk as often as Hugging Face names (§6), and Windows paths use backslashes.
    trimmed = text.replace("\\", "/").rstrip("/")
    return trimmed.rsplit("/", 1)[-1]


def _tokens(text: str) -> set[str]:
    tokens = {token.lower() for token in _CAMEL_TOKEN.findall(text)}
    tokens.update(_LOWER_TOKEN.findall(text.lower()))
    return tokens


def _matches(token: str) -> bool:
    return (
        token in _EXACT
        or token.startswith(_PREFIX)
        or (token.endswith(_SUFFIX) and token not in _SUFFIX_EXCEPTIONS)
    )


def normalize_base_url(url: str) -> str:
    """The base URL in one form: scheme, host and path ending in `/v1`, no trailing slash (§1).

    Both `http://host:8080` and `http://host:8080/v1/` give `http://host:8080/v1`. Raises
    BaseURLError naming what is wrong; the message never repeats the URL, which may hold a
    secret.
    """
    if not isinstance(url, str):
        raise TypeError(f"base URL must be a str, not {type(url).__name__}")
    text = url.strip()
    if not text:
        raise BaseURLError("base URL is empty")
    # urlsplit silently drops tabs and newlines inside a URL; a pasted URL that has them is wrong,
    # and guessing which half was meant would hide it.
    if any(not ch.isprintable() or ch.isspace() for ch in text):
        raise BaseURLError("base URL contains whitespace or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        raise BaseURLError("base URL cannot be parsed (check the host and port)") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        if "://" not in text:
            raise BaseURLError("base URL must start with http:// or https://")
        raise BaseURLError("base URL scheme must be http or https")
    if "@" in parts.netloc:
        raise BaseURLError(
            "base URL must not contain credentials (user:password@); "
            "configure the API key separately"
        )
    if "#" in text:
        raise BaseURLError("base URL must not contain a fragment (#…)")
    if "?" in text:
        raise BaseURLError("base URL must not contain a query (?…)")
    if not parts.hostname:
        raise BaseURLError("base URL has no host")
    if port == 0:
        raise BaseURLError("base URL has port 0")
    path = parts.path.rstrip("/")
    for endpoint in ("/v1/chat/completions", "/v1/models"):
        if path.endswith(endpoint):
            raise BaseURLError(
                f"base URL names an endpoint ({endpoint}); give the part before /chat/completions"
            )
    if not path.endswith("/v1"):
        path += "/v1"
    # Rebuilt rather than copied, so that "Host:" and "host" give the same base.
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return f"{scheme}://{netloc}{path}"


def endpoint_url(base: str, path: str) -> str:
    """The URL of an endpoint (`chat/completions`, `models`) under a base URL in any form."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    relative = path.strip("/")
    if not relative:
        raise ValueError("endpoint path is empty")
    return f"{normalize_base_url(base)}/{relative}"


_PATH_START: Final = re.compile(r"^(?:/|~/|\.\.?/|[A-Za-z]:[\\/]|\\\\)")
_MODEL_FILE: Final = re.compile(r"\.gguf$", re.IGNORECASE)


def clean_model_id(model_id: str) -> str | None:
    """The id a person would type for a model a server lists by its file path (llama-server
    lists `/models/Qwen3-8B-Q4_K_M.gguf`): the file's stem (`Qwen3-8B-Q4_K_M`). None when the
    id is no path: a Hugging Face id such as `Qwen/Qwen3-8B` stays as it is."""
    if not (_PATH_START.match(model_id) or _MODEL_FILE.search(model_id)):
        return None
    name = re.split(r"[\\/]", model_id.rstrip("\\/"))[-1]
    stem = _MODEL_FILE.sub("", name)
    return stem if stem.strip() and stem not in (".", "..") else None
