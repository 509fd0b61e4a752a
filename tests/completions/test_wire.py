"""The completion wire core on its own: each upstream dialect's stream decoded whole and split
anywhere, the `text_completion` SSE and object, the kind data that says where FIM goes, and the
config settings that override it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from svir.chat import UpstreamTarget
from svir.config.load import parse_config
from svir.errors import ConfigError
from svir.policy.routing import Router
from svir.providers import KINDS
from svir.wire.answer import AnswerFold
from svir.wire.completions import (
    LlamaCompletionDecoder,
    OpenAICompletionDecoder,
    TextCompletionEncoder,
    completion_object,
    explain_fim_error,
    llama_url,
)
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.events import Done, Event, Finish, Role, StreamError, TextDelta, Usage
from tests.completions.test_completions_inprocess import llama_stream, openai_stream
from tests.support.mock_transport import MockResponse, MockTransport


def decode(decoder: LlamaCompletionDecoder | OpenAICompletionDecoder, data: bytes) -> list[Event]:
    events = decoder.feed(data)
    return events + decoder.close()


def splits(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(6, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(20))
def test_llama_stream_split_anywhere_gives_the_same_events(seed: int) -> None:
    data = b"".join(llama_stream("Hel", "lo", stop_type="word"))
    whole = decode(LlamaCompletionDecoder(), data)
    assert whole == [
        Role("assistant", "", "", 0),
        TextDelta("Hel"),
        TextDelta("lo"),
        Finish("stop"),
        Usage(7, 2, 9, cached_tokens=2),
        Done(),
    ]
    decoder = LlamaCompletionDecoder()
    pieces: list[Event] = []
    for part in splits(data, random.Random(seed)):
        pieces.extend(decoder.feed(part))
    pieces.extend(decoder.close())
    assert [e for e in pieces if not isinstance(e, Role)] == whole[1:]
    assert decoder.complete and decoder.finish_reason == "stop"


@pytest.mark.parametrize("seed", range(20))
def test_openai_stream_split_anywhere(seed: int) -> None:
    data = b"".join(openai_stream("Hel", "lo", finish="length"))
    decoder = OpenAICompletionDecoder()
    events: list[Event] = []
    for part in splits(data, random.Random(seed)):
        events.extend(decoder.feed(part))
    events.extend(decoder.close())
    texts = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert texts == "Hello"
    assert events[-3:] == [Finish("length"), Usage(4, 2, 6), Done()]
    assert decoder.id == "cmpl-up"


def test_llama_stream_cut_before_stop_is_incomplete() -> None:
    data = b"".join(llama_stream("a")[:1])
    events = decode(LlamaCompletionDecoder(), data)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.INCOMPLETE


def test_error_inside_the_stream_is_classified() -> None:
    data = (
        b'data: {"error":{"code":400,"message":"request (1502 tokens) exceeds the available '
        b'context size (1024 tokens), try increasing it","type":"exceed_context_size_error"}}\n\n'
    )
    events = decode(LlamaCompletionDecoder(), data)
    assert isinstance(events[-1], StreamError)
    assert events[-1].error.kind is ErrorKind.CONTEXT_OVERFLOW


def test_garbage_is_a_protocol_error_not_an_exception() -> None:
    for decoder in (LlamaCompletionDecoder(), OpenAICompletionDecoder()):
        events = decode(decoder, b"data: {not json\n\n")
        assert isinstance(events[-1], StreamError)
        assert events[-1].error.kind is ErrorKind.PROTOCOL


def test_encoder_writes_text_completion_chunks_and_one_error_frame() -> None:
    enc = TextCompletionEncoder(id="cmpl-1", model="lab/m", created=5, include_usage=True)
    out = b"".join(enc.encode(e) for e in [Role("assistant", "", "", 0), TextDelta("a")])
    assert out == (
        b'data: {"id":"cmpl-1","object":"text_completion","created":5,"model":"lab/m",'
        b'"choices":[{"text":"a","index":0,"logprobs":null,"finish_reason":null}]}\n\n'
    )
    failed = enc.encode(StreamError(UpstreamError(ErrorKind.TRANSIENT, "boom", in_stream=True)))
    assert failed.startswith(b'data: {"error":') and b"boom" in failed
    assert enc.encode(Done()) == b"" and enc.ended


def test_encoder_leaves_usage_out_unless_asked() -> None:
    enc = TextCompletionEncoder(id="c", model="m", created=1)
    assert enc.encode(Usage(1, 2, 3)) == b""
    assert enc.encode(Done()) == b"data: [DONE]\n\n"


def test_completion_object() -> None:
    fold = AnswerFold()
    for e in [TextDelta("x"), TextDelta("y"), Finish("length"), Usage(1, 2, 3), Done()]:
        fold.add(e)
    obj = completion_object(fold, id="cmpl-1", model="m", created=1)
    assert obj["choices"] == [
        {"text": "xy", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert obj["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


def test_native_urls_live_at_the_servers_root() -> None:
    assert llama_url("http://h:8080/v1", fim=False) == "http://h:8080/completion"
    assert llama_url("http://h/llama/v1/", fim=True) == "http://h/llama/infill"


def test_explain_fim_error_leaves_other_errors_alone() -> None:
    other = UpstreamError(ErrorKind.TRANSIENT, "overloaded", status=503)
    assert explain_fim_error(other, "m") is other


def test_kinds_say_where_completions_and_fim_go() -> None:
    dialects = {name: kind.completions for name, kind in KINDS.items()}
    assert dialects["llamacpp"] == dialects["llamacpp-managed"] == "llama"
    assert dialects["vllm"] == dialects["openai-compatible"] == dialects["ollama"] == "openai"
    assert dialects["anthropic"] is None and dialects["gemini"] is None
    assert {n for n, k in KINDS.items() if k.fim} == {
        "llamacpp",
        "llamacpp-managed",
        "ollama",
        "openai",
    }


PROVIDER = '[[providers]]\nname = "p"\nkind = "{kind}"\nbase_url = "http://h/v1"\n{extra}\n'


def provider(kind: str, extra: str = "") -> object:
    return parse_config(PROVIDER.format(kind=kind, extra=extra)).providers[0]


def test_provider_settings_override_the_kind() -> None:
    vllm = KINDS["vllm"]
    assert vllm.fim_for(provider("vllm")) is False  # type: ignore[arg-type]
    assert vllm.fim_for(provider("vllm", "fim = true")) is True  # type: ignore[arg-type]
    llama = KINDS["llamacpp"]
    assert llama.fim_for(provider("llamacpp", "fim = false")) is False  # type: ignore[arg-type]
    off = provider("llamacpp", "completions = false")
    assert llama.completions_for(off) is None and llama.fim_for(off) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "extra", "field", "words"),
    [
        ("anthropic", "completions = true", "completions", "has no text-completion endpoint"),
        ("gemini", "fim = true", "fim", "has no text-completion endpoint"),
        ("vllm", "completions = false\nfim = true", "fim", "completions = false sends it none"),
        ("vllm", 'fim = "yes"', "fim", "expected a boolean"),
    ],
)
def test_bad_settings_name_file_field_and_fix(
    kind: str, extra: str, field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(PROVIDER.format(kind=kind, extra=extra), source="svir.toml")
    assert info.value.field == f"providers[0].{field}"
    assert words in str(info.value) and "svir.toml" in str(info.value)


MANAGED = """
[[providers]]
name = "local"
kind = "llamacpp-managed"
{extra}
[providers.managed.models]
gemma = "pypi:gemma3-270m"
coder = {{ path = "{gguf}", fim = true }}
plain = "{gguf}"
"""


def managed_route(model_id: str, extra: str = "") -> UpstreamTarget:
    gguf = Path(__file__)  # any file: the config checks that it is there
    config = parse_config(MANAGED.format(extra=extra, gguf=gguf))
    return Router(config, {}, MockTransport(lambda r: MockResponse())).resolve(f"local/{model_id}")


def test_a_managed_models_fim_is_what_is_known_of_it() -> None:
    assert managed_route("gemma").fim is False  # Gemma 3 has no FIM tokens (llama-server: 501)
    assert managed_route("coder").fim is True
    assert managed_route("plain").fim is True  # the kind's; the server says if it cannot
    assert managed_route("plain", "fim = false").fim is False
    assert managed_route("gemma", "fim = true").fim is True  # the provider's word is taken
    assert managed_route("coder", "completions = false").fim is False


class _GeneralLlama(LlamaCompletionDecoder):
    _plain_ok = False  # every read through SSEParser.feed


class _GeneralOpenAI(OpenAICompletionDecoder):
    _plain_ok = False


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(
    ("fast", "general", "stream"),
    [
        (LlamaCompletionDecoder, _GeneralLlama, llama_stream),
        (OpenAICompletionDecoder, _GeneralOpenAI, openai_stream),
    ],
)
def test_the_plain_event_fast_path_decodes_as_the_general_path(
    seed: int, fast: Any, general: Any, stream: Any
) -> None:
    rng = random.Random(seed)
    data = b"".join(stream("Hel", "lo", " wor", "ld"))
    fast_decoder, general_decoder = fast(), general()
    for part in splits(data, rng):
        assert fast_decoder.feed(part) == general_decoder.feed(part)
    assert fast_decoder.close() == general_decoder.close()
    assert fast_decoder.usage == general_decoder.usage
    assert fast_decoder.complete and general_decoder.complete
