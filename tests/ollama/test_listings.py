"""What the Ollama listings say of a model, as pure functions: llama.cpp's `/props` read, the words
of `details`, the capabilities, and the `template`/`parameters` texts clients read by substring
or by pattern (Continue, LiteLLM), from one `ModelFacts`."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from svir.protocols.ollama.listings import (
    details,
    ps_entry,
    pull_lines,
    show_response,
    tags_entry,
    template_text,
)
from svir.wire.errors import ProtocolError
from svir.wire.model_meta import (
    ModelFacts,
    architecture_of,
    capabilities,
    parameter_size,
    parse_props,
    quantization_level,
)
from svir.wire.models import parse_model_list
from tests.support.upstream import LLAMA_CPP_MODELS, LLAMA_CPP_PROPS

# Continue reads `parameters` line by line with this pattern and stops at the first line that
# does not match it (core/llm/llms/Ollama.ts).
CONTINUE_PARAMETER = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')

GEMMA = ModelFacts(
    name="local/gemma-3-270m",
    model_id="gemma-3-270m",
    kind="llamacpp-managed",
    context_length=4096,
    context_train=32768,
    parameters=268098176,
    size=246587904,
    quantization="Q4_K_M",
    format="gguf",
)


def test_props_of_a_real_llama_server() -> None:
    props = parse_props(msgspec.json.encode(LLAMA_CPP_PROPS))
    assert props.context_length == 16384
    assert props.vision is True and props.tools is True and props.thinking is True
    assert props.ftype == "Q4_K - Medium"
    assert parse_props(b'{"modalities": "x", "chat_template": ""}').vision is None
    for bad in (b"[]", b"{", b'"x"'):
        with pytest.raises(ProtocolError):
            parse_props(bad)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists, max_leaves=8))
def test_props_never_fail_but_as_protocol_errors(value: object) -> None:
    body = msgspec.json.encode({"default_generation_settings": value, "modalities": value})
    props = parse_props(body)
    assert props.context_length is None or props.context_length > 0


def test_model_list_meta_is_kept() -> None:
    (info,) = parse_model_list(msgspec.json.encode(LLAMA_CPP_MODELS))
    assert (info.context_length, info.context_train) == (16384, 262144)
    assert info.parameters == 30532122624 and info.size == 18556686336


def test_the_words_of_details() -> None:
    assert architecture_of("gemma-3-270m") == "gemma3"
    assert architecture_of("/models/Qwen3-8B-Q4_K_M.gguf") == "qwen3"
    assert architecture_of("llama3.2:3b") == "llama3"
    assert architecture_of("7b") == "unknown"  # a bare size is no family
    assert architecture_of("---") == "unknown"
    assert parameter_size(268098176, "x") == "268.10M"
    assert parameter_size(3212749888, "x") == "3.2B"
    assert parameter_size(None, "lab/qwen2.5-coder-1.5b") == "1.5B"
    assert parameter_size(None, "gemma-3-270m") == "270M"
    assert parameter_size(None, "devstral") == ""
    assert quantization_level("Q4_K - Medium", "x") == "Q4_K_M"
    assert quantization_level("Q8_0", "x") == "Q8_0"
    assert quantization_level(None, "/m/qwen3-8b-q5_k_s.gguf") == "Q5_K_S"
    assert quantization_level(None, "/m/model-F16.gguf") == "F16"
    assert quantization_level(None, "qwen3.8") == ""


def test_details_are_all_strings_as_zed_and_roo_parse_them() -> None:
    got = details(GEMMA)
    for key in ("parent_model", "format", "family", "parameter_size", "quantization_level"):
        assert isinstance(got[key], str)
    assert got["families"] == ["gemma3"]
    assert (got["family"], got["parameter_size"], got["format"]) == ("gemma3", "268.10M", "gguf")


def test_capabilities() -> None:
    none = {"tools": False, "vision": False, "thinking": False, "insert": False}
    assert capabilities(**none, embedding=False) == ["completion"]
    every = dict.fromkeys(none, True)
    assert capabilities(**every, embedding=False) == [
        "completion",
        "tools",
        "insert",
        "vision",
        "thinking",
    ]
    # An embedding model does nothing else, as Ollama lists it.
    assert capabilities(**every, embedding=True) == ["embedding"]


@pytest.mark.parametrize("tools", [True, False])
@pytest.mark.parametrize("insert", [True, False])
def test_template_says_suffix_and_tools_exactly_when_true(tools: bool, insert: bool) -> None:
    facts = msgspec.structs.replace(GEMMA, tools=tools, insert=insert)
    text = template_text(facts)
    assert (".Suffix" in text) is insert  # Continue's test for fill-in-the-middle
    assert ("tools" in text.lower()) is tools  # LiteLLM's test for tool calls
    shown = show_response(facts, "local")
    assert shown["template"] == text
    assert ("tools" in shown["capabilities"]) is tools
    assert ("insert" in shown["capabilities"]) is insert


def test_show_has_one_context_length_the_one_it_runs_with() -> None:
    shown = show_response(GEMMA, "local")
    info = shown["model_info"]
    keys = [k for k in info if "context_length" in k]
    assert keys == ["gemma3.context_length"]
    assert info[f"{info['general.architecture']}.context_length"] == 4096  # Copilot's read
    assert info["general.basename"] == "gemma-3-270m"
    assert info["general.parameter_count"] == 268098176
    assert info["general.svir.n_ctx_train"] == 32768
    lines = shown["parameters"].split("\n")
    assert lines == ["num_ctx 4096"]
    assert all(CONTINUE_PARAMETER.match(line) for line in lines)


def test_unknown_context_says_nothing() -> None:
    facts = ModelFacts(name="p/m", model_id="m", kind="openai")
    shown = show_response(facts, "p")
    assert shown["parameters"] == ""
    assert not [k for k in shown["model_info"] if "context_length" in k]
    assert tags_entry(facts)["size"] == 0


def test_basename_of_a_file() -> None:
    facts = ModelFacts(name="lab//m/Qwen3-8B.gguf", model_id="/m/Qwen3-8B.gguf", kind="llamacpp")
    assert facts.basename == "Qwen3-8B"


def test_ps_entry() -> None:
    entry = ps_entry(GEMMA, "2027-01-01T00:00:00.000000Z", 1234)
    assert entry["context_length"] == 4096 and entry["size"] == 1234
    assert entry["size_vram"] == 0 and entry["expires_at"].startswith("2027")
    assert entry["name"] == entry["model"] == "local/gemma-3-270m"
    assert "modified_at" not in entry


def test_pull_lines_end_in_success() -> None:
    lines = pull_lines("local/gemma-3-270m")
    assert lines[0] == {"status": "pulling manifest"}
    assert lines[-1] == {"status": "success"}
    assert all(isinstance(line["status"], str) for line in lines)
