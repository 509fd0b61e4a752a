"""What is true of a model as svir serves it, read from what its server says: llama.cpp's `/props`
(the context it runs with, images, tools, its quantization) on top of the model list's fields
(svir.wire.models), and the words model listings use for it (family, parameter size,
quantization level, the capabilities list). Pure: the catalog that fetches and caches these is
svir.policy.catalog.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from svir.wire.models import json_object

__all__ = [
    "ModelFacts",
    "ServerProps",
    "architecture_of",
    "capabilities",
    "parameter_size",
    "parse_props",
    "quantization_level",
]


class ServerProps(msgspec.Struct, frozen=True):
    """llama.cpp's `GET /props`, the parts svir uses; None where the server did not say."""

    # The context of a slot: what one request may use (`default_generation_settings.n_ctx`).
    context_length: int | None = None
    vision: bool | None = None
    tools: bool | None = None
    thinking: bool | None = None
    # llama.cpp's words for the file's type, "Q4_K - Medium".
    ftype: str | None = None


class ModelFacts(msgspec.Struct, frozen=True):
    """One model as svir serves it: each field from the server, the config or svir's own
    knowledge, None (or False) where nothing says."""

    name: str
    model_id: str
    kind: str
    # The context the model runs with now, not the one it was trained for.
    context_length: int | None = None
    context_train: int | None = None
    parameters: int | None = None
    size: int | None = None
    quantization: str = ""
    format: str = ""
    tools: bool = True
    vision: bool = False
    thinking: bool = False
    insert: bool = False
    embedding: bool = False
    # The model's id as its server lists it, when it differs (llama.cpp: its file's path,
    # whatever name the request used).
    served: str = ""

    @property
    def own_id(self) -> str:
        return self.served or self.model_id

    @property
    def architecture(self) -> str:
        return architecture_of(self.own_id)

    @property
    def basename(self) -> str:
        """The model's own name: a file's without its folders and `.gguf`."""
        last = self.own_id.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return last.removesuffix(".gguf") or self.own_id

    @property
    def capabilities(self) -> list[str]:
        return capabilities(
            tools=self.tools,
            vision=self.vision,
            thinking=self.thinking,
            insert=self.insert,
            embedding=self.embedding,
        )


def capabilities(
    *, tools: bool, vision: bool, thinking: bool, insert: bool, embedding: bool
) -> list[str]:
    """Ollama's capability words for what a model does. An embedding model does nothing else:
    Ollama lists it with `embedding` alone, and clients that see `completion` would chat to it."""
    if embedding:
        return ["embedding"]
    caps = ["completion"]
    if tools:
        caps.append("tools")
    if insert:
        caps.append("insert")
    if vision:
        caps.append("vision")
    if thinking:
        caps.append("thinking")
    return caps


def parse_props(body: bytes | bytearray | memoryview) -> ServerProps:
    """Read llama.cpp's `/props`; a body that is not a JSON object raises ProtocolError."""
    doc = json_object(body, "/props")
    settings = doc.get("default_generation_settings")
    context = None
    if isinstance(settings, dict):
        context = _positive_int(settings.get("n_ctx"))
    modalities = doc.get("modalities")
    vision = modalities.get("vision") if isinstance(modalities, dict) else None
    caps = doc.get("chat_template_caps")
    tools = caps.get("supports_tools") if isinstance(caps, dict) else None
    template = doc.get("chat_template")
    thinking = None
    if isinstance(template, str) and template:
        thinking = any(mark in template for mark in _THINKING_MARKS)
    ftype = doc.get("model_ftype")
    return ServerProps(
        context_length=context,
        vision=vision if isinstance(vision, bool) else None,
        tools=tools if isinstance(tools, bool) else None,
        thinking=thinking,
        ftype=ftype if isinstance(ftype, str) and ftype else None,
    )


# What a chat template that lets the model reason before it answers has in it.
_THINKING_MARKS: Final = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


_ARCH: Final = re.compile(r"([a-z]{2,})[-_ ]?(\d+)?")
_SIZE_LABEL: Final = re.compile(r"(?:^|[-_:.])(\d+(?:\.\d+)?)([bmk])(?:$|[-_:.])", re.IGNORECASE)
_QUANT_IN_NAME: Final = re.compile(
    r"(?:^|[-_.])((?:i?q\d(?:_[a-z0-9]+)*)|bf16|f16|f32)(?:$|[-_.])", re.IGNORECASE
)
_FTYPE_SUFFIX: Final = {
    " - Extra Small": "_XS",
    " - Small": "_S",
    " - Medium": "_M",
    " - Large": "_L",
}


def architecture_of(model_id: str) -> str:
    """A family name for a model, from its id as Ollama names families (`gemma3`, `qwen3`,
    `llama3`): the leading word of the id's last segment and its version's first number."""
    last = model_id.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    found = _ARCH.search(last)
    if found is None:
        return "unknown"
    word, number = found.groups()
    return word + (number or "")


def parameter_size(parameters: int | None, model_id: str) -> str:
    """Ollama's size label ("268.10M", "3.2B") from the count, else the one the id carries."""
    if parameters is not None and parameters > 0:
        if parameters >= 1_000_000_000:
            return f"{parameters / 1e9:.1f}B"
        if parameters >= 1_000_000:
            return f"{parameters / 1e6:.2f}M"
        return f"{parameters / 1e3:.2f}K"
    last = model_id.rsplit("/", 1)[-1]
    found = _SIZE_LABEL.search(last)
    if found is None:
        return ""
    return found.group(1) + found.group(2).upper()


def quantization_level(ftype: str | None, model_id: str) -> str:
    """Ollama's quantization words ("Q4_K_M") from llama.cpp's ("Q4_K - Medium"), else from
    the file name."""
    if ftype:
        for words, suffix in _FTYPE_SUFFIX.items():
            if ftype.endswith(words):
                return ftype[: -len(words)] + suffix
        return ftype.replace(" ", "_")
    last = model_id.rsplit("/", 1)[-1]
    found = _QUANT_IN_NAME.search(last.removesuffix(".gguf"))
    return found.group(1).upper() if found is not None else ""
