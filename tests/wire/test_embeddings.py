"""svir.wire.embeddings as pure functions: the three client requests checked, the upstream bodies,
the answers parsed back (and refused when they are not answers), base64 both ways; the parsers
fuzzed: whatever a client or an upstream sends, they give a request or their own error, never
anything else."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svir.protocols.embeddings.request import check_openai_request, openai_answer
from svir.protocols.ollama.embed import (
    check_ollama_embed,
    check_ollama_embeddings,
    ollama_embed_answer,
)
from svir.wire.classify import classify_http_error, to_client_error
from svir.wire.embeddings import (
    MAX_INPUTS,
    EmbeddingAnswer,
    EmbeddingInputError,
    decode_vector,
    encode_vector,
    ollama_upstream_body,
    openai_upstream_body,
    parse_ollama_answer,
    parse_openai_answer,
)
from svir.wire.errors import ErrorKind, UpstreamError
from svir.wire.tokens import estimate_input_tokens


def b64(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


# Requests


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("one", ["one"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        ([""], [""]),
    ],
)
def test_openai_inputs(given: Any, inputs: Any) -> None:
    assert check_openai_request({"model": "p/m", "input": given}) == {
        "model": "p/m",
        "input": inputs,
    }


def test_openai_fields_kept() -> None:
    got = check_openai_request(
        {"model": "m", "input": "x", "encoding_format": "base64", "dimensions": 8, "user": "u"}
    )
    assert got == {
        "model": "m",
        "input": ["x"],
        "encoding_format": "base64",
        "dimensions": 8,
        "user": "u",
    }


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x"}, "model", "model is required"),
        ({"model": 3, "input": "x"}, "model", "non-empty string"),
        ({"model": "m"}, "input", "input is required"),
        ({"model": "m", "input": []}, "input", "must not be empty"),
        ({"model": "m", "input": {"a": 1}}, "input", "not an object"),
        ({"model": "m", "input": ["a", 1]}, "input", "input[1] must be a string"),
        ({"model": "m", "input": [1, -2]}, "input", "input[1] must be a token id"),
        ({"model": "m", "input": [1, True]}, "input", "input[1] must be a token id"),
        ({"model": "m", "input": [[1], []]}, "input", "input[1] must not be empty"),
        ({"model": "m", "input": [[1], "a"]}, "input", "input[1] must be a non-empty array"),
        ({"model": "m", "input": [1.5]}, "input", "input[0] must be a string or a token id"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "'int8'"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", "1 or more"),
        ({"model": "m", "input": "x", "dimensions": "8"}, "dimensions", "integer"),
        ({"model": "m", "input": "x", "user": 1}, "user", "must be a string"),
    ],
)
def test_openai_refusals(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(EmbeddingInputError) as info:
        check_openai_request(body)
    assert info.value.param == param
    assert words in info.value.message


def test_too_many_inputs() -> None:
    with pytest.raises(EmbeddingInputError, match=f"at most {MAX_INPUTS}"):
        check_openai_request({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)})


def test_ollama_embed() -> None:
    got = check_ollama_embed(
        {
            "model": "m",
            "input": ["a"],
            "truncate": False,
            "keep_alive": "5m",
            "options": {"num_ctx": 512},
        }
    )
    assert got == {
        "model": "m",
        "input": ["a"],
        "truncate": False,
        "keep_alive": "5m",
        "options": {"num_ctx": 512},
    }
    assert check_ollama_embed({"name": "old", "input": "a"})["model"] == "old"
    with pytest.raises(EmbeddingInputError, match="input must be a string or an array"):
        check_ollama_embed({"model": "m", "input": 3})
    with pytest.raises(EmbeddingInputError, match="must be a string"):
        check_ollama_embed({"model": "m", "input": [[1, 2]]})  # Ollama takes no token arrays
    with pytest.raises(EmbeddingInputError, match="truncate must be true or false"):
        check_ollama_embed({"model": "m", "input": "a", "truncate": "yes"})
    with pytest.raises(EmbeddingInputError, match="options must be an object"):
        check_ollama_embed({"model": "m", "input": "a", "options": []})


def test_ollama_embeddings_legacy() -> None:
    assert check_ollama_embeddings({"model": "m", "prompt": "p"}) == {"model": "m", "input": ["p"]}
    with pytest.raises(EmbeddingInputError, match="prompt is required"):
        check_ollama_embeddings({"model": "m"})


# Upstream bodies


def test_openai_upstream_body() -> None:
    request = {
        "model": "p/m",
        "input": ["a"],
        "dimensions": 4,
        "user": "u",
        "encoding_format": "float",
    }
    assert openai_upstream_body(request, "m", base64_answer=True) == {
        "model": "m",
        "input": ["a"],
        "encoding_format": "base64",
        "dimensions": 4,
        "user": "u",
    }
    assert openai_upstream_body(request, "m", base64_answer=False)["encoding_format"] == "float"


def test_ollama_upstream_body() -> None:
    request = {"model": "o/m", "input": ["a"], "truncate": True, "user": "u"}
    assert ollama_upstream_body(request, "m") == {"model": "m", "input": ["a"], "truncate": True}
    with pytest.raises(EmbeddingInputError, match="token arrays"):
        ollama_upstream_body({"model": "o/m", "input": [[1]]}, "m")


# Answers


def test_openai_answer_parsed_in_index_order() -> None:
    raw = json.dumps(
        {
            "data": [
                {"index": 1, "embedding": [0.5, 0.25]},
                {"index": 0, "embedding": b64([1.0, -1.0])},
            ],
            "model": "served",
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        }
    ).encode()
    got = parse_openai_answer(raw, 2)
    assert [decode_vector(v) for v in got.vectors] == [[1.0, -1.0], [0.5, 0.25]]
    assert got.prompt_tokens == 7 and got.model == "served"


def test_llama_server_answer_without_index_and_total_only() -> None:
    raw = b'{"data":[{"embedding":[1.0]},{"embedding":[2.0]}],"usage":{"total_tokens":3}}'
    got = parse_openai_answer(raw, 2)
    assert [decode_vector(v) for v in got.vectors] == [[1.0], [2.0]] and got.prompt_tokens == 3


def test_a_float_array_goes_to_a_float_client_as_it_came() -> None:
    raw = b'{"data":[{"index":0,"embedding":[1e-3, -0.50]}]}'
    answer = parse_openai_answer(raw, 1)
    out = msgspec.json.encode(
        openai_answer(answer, model="m", encoding_format="float", prompt_tokens=1)
    )
    assert b'"embedding":[1e-3, -0.50]' in out  # not read into floats and written again
    ollama = msgspec.json.encode(
        ollama_embed_answer(answer, model="m", total_duration=1, prompt_tokens=1)
    )
    assert b'"embeddings":[[1e-3, -0.50]]' in ollama


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"not json", "cannot be read"),
        (b'{"data": {}}', "cannot be read"),
        (b'{"data": [{"embedding": [1.0]}]}', "1 vectors for 2 inputs"),
        (b'{"data": [{"index": 0, "embedding": [1]}, {"index": 0, "embedding": [1]}]}', "repeated"),
        (
            b'{"data": [{"index": 5, "embedding": [1]}, {"index": 0, "embedding": [1]}]}',
            "out of range",
        ),
        (b'{"data": [{"embedding": "!!"}, {"embedding": [1]}]}', "not base64"),
        (b'{"data": [{"embedding": "AAA="}, {"embedding": [1]}]}', "not base64"),
        (b'{"data": [{"embedding": [1, "x"]}, {"embedding": [1]}]}', "not an array of numbers"),
        (b'{"data": [{"embedding": [[1]]}, {"embedding": [1]}]}', "not an array of numbers"),
        (b'{"data": [{"embedding": {"a": 1}}, {"embedding": [1]}]}', "not an array of numbers"),
        (b'{"data": [{"embedding": null}, {"embedding": [1]}]}', "not an array of numbers"),
        (b'{"data": [{"embedding": [true]}, {"embedding": [1]}]}', "not an array of numbers"),
    ],
)
def test_openai_answer_refused(raw: bytes, words: str) -> None:
    with pytest.raises(UpstreamError) as info:
        parse_openai_answer(raw, 2)
    assert info.value.kind is ErrorKind.PROTOCOL
    assert words in info.value.message


def test_ollama_answer() -> None:
    raw = b'{"model":"m","embeddings":[[0.1],[0.2]],"prompt_eval_count":4,"load_duration":9}'
    got = parse_ollama_answer(raw, 2)
    assert [decode_vector(v) for v in got.vectors] == [[0.1], [0.2]]
    assert got.prompt_tokens == 4 and got.load_duration == 9
    with pytest.raises(UpstreamError, match="not an array of numbers"):
        parse_ollama_answer(b'{"embeddings":["AAAAAA=="]}', 1)  # Ollama sends no base64
    with pytest.raises(UpstreamError, match="1 vectors for 2 inputs"):
        parse_ollama_answer(b'{"embeddings":[[0.1]]}', 2)


def test_client_answers() -> None:
    answer = EmbeddingAnswer([[0.5, -0.25], b64([1.0, 2.0])], 3, "m")
    out = openai_answer(answer, model="p/m", encoding_format="base64", prompt_tokens=3)
    assert [decode_vector(item.embedding) for item in out.data] == [[0.5, -0.25], [1.0, 2.0]]
    assert out.data[1].embedding == b64([1.0, 2.0])  # passed through, not re-encoded
    out = openai_answer(answer, model="p/m", encoding_format="float", prompt_tokens=3)
    assert [item.embedding for item in out.data] == [[0.5, -0.25], [1.0, 2.0]]
    assert out.usage.prompt_tokens == out.usage.total_tokens == 3
    ollama = ollama_embed_answer(answer, model="p/m:latest", total_duration=5, prompt_tokens=3)
    assert ollama == {
        "model": "p/m:latest",
        "embeddings": [[0.5, -0.25], [1.0, 2.0]],
        "total_duration": 5,
        "load_duration": 0,
        "prompt_eval_count": 3,
    }


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=64))
def test_base64_round_trip(values: list[float]) -> None:
    text = encode_vector(values)
    assert text == b64(values)  # little-endian float32, as OpenAI's SDK decodes it
    assert decode_vector(text) == values


def test_estimate() -> None:
    assert estimate_input_tokens(["abcdefgh", "abcd"]) == 3 + 2
    assert estimate_input_tokens([[1, 2, 3]]) == 4


# Fuzz


def outcome(fn: Callable[[Any], Any], arg: Any, error: type[Exception]) -> Any:
    """What `fn(arg)` gives, or the `error` it raised (any other exception fails the test)."""
    try:
        return fn(arg)
    except error as exc:
        return exc


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=10), json_values),
        "name": json_values,
        "input": st.one_of(
            st.text(max_size=10),
            st.lists(st.text(max_size=5), max_size=4),
            st.lists(st.integers(-2, 5), max_size=4),
            st.lists(st.lists(st.integers(-2, 5), max_size=3), max_size=3),
            json_values,
        ),
        "prompt": json_values,
        "encoding_format": st.sampled_from(["float", "base64", "x", 1]),
        "dimensions": json_values,
        "user": json_values,
        "truncate": json_values,
        "keep_alive": json_values,
        "options": json_values,
    },
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(bodies, json_values))
def test_fuzz_requests(body: Any) -> None:
    for check in (check_openai_request, check_ollama_embed, check_ollama_embeddings):
        request = outcome(check, body, EmbeddingInputError)
        if isinstance(request, EmbeddingInputError):
            assert request.message and request.param
            continue
        assert isinstance(request["model"], str) and request["model"].strip()
        assert isinstance(request["input"], list) and request["input"]
        assert estimate_input_tokens(request["input"]) >= len(request["input"])


answers = st.fixed_dictionaries(
    {},
    optional={
        "data": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "embedding": st.one_of(
                            st.lists(st.floats(width=32), max_size=3),
                            st.text(max_size=8),
                            json_values,
                        )
                    },
                    optional={"index": st.one_of(st.integers(-1, 3), json_values)},
                ),
                max_size=4,
            ),
            json_values,
        ),
        "embeddings": st.one_of(
            st.lists(st.lists(st.floats(width=32), max_size=3), max_size=4), json_values
        ),
        "usage": json_values,
        "model": json_values,
        "prompt_eval_count": json_values,
    },
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.one_of(answers.map(lambda a: json.dumps(a).encode()), st.binary(max_size=40)),
    st.integers(1, 4),
)
def test_fuzz_answers(raw: bytes, count: int) -> None:
    for parse in (parse_openai_answer, parse_ollama_answer):
        got = outcome(lambda r: parse(r, count), raw, UpstreamError)  # noqa: B023
        if isinstance(got, UpstreamError):
            assert got.kind is ErrorKind.PROTOCOL
            continue
        assert len(got.vectors) == count
        for vector in got.vectors:
            assert isinstance(decode_vector(vector), list)


# Classification: a server that cannot embed says so in its words (llama-server, as seen)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            501,
            b'{"error":{"code":501,"message":"This server does not support embeddings. Start it'
            b' with `--embeddings`","type":"not_supported_error"}}',
        ),
        (
            400,
            b'{"error":{"code":400,"message":"Pooling type \'none\' is not OAI compatible. Please'
            b' use a different pooling type","type":"invalid_request_error"}}',
        ),
        (500, b'{"error":"\\"llama3.2\\" does not support embeddings"}'),
    ],
)
def test_a_server_that_cannot_embed_is_unsupported_input(status: int, body: bytes) -> None:
    err = classify_http_error(status, {"Content-Type": "application/json"}, body)
    assert err.kind is ErrorKind.UNSUPPORTED_INPUT
    assert not err.retryable
    assert to_client_error(err).status == 400
