"""The pieces of the thread service that need no server: reading posted messages, the checks on a
thread's tail, the messages sent upstream, sizes of an overflow, owners, and the [store] config."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from svir.config.load import parse_config
from svir.config.model import StoreConfig
from svir.errors import ConfigError, GatewayError
from svir.protocols.threads.routes import ANONYMOUS, owner_of
from svir.providers import KINDS, build_upstream_body
from svir.store import default_url
from svir.threads import frames
from svir.threads.content import (
    Limits,
    check_append,
    check_continue,
    parse_messages,
    parse_multipart,
    pending_tool_calls,
    upstream_messages,
)
from svir.threads.records import MessageRecord, ThreadRecord
from svir.threads.service import overflow_sizes, parse_continue
from svir.wire.classify import ClientError

LIMITS = Limits(max_attachment_bytes=1000)
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def record(role: str, seq: int, **kw: Any) -> MessageRecord:
    kw.setdefault("content", [{"type": "text", "text": f"{role} {seq}"}])
    return MessageRecord(id=f"m{seq}", thread_id="t", seq=seq, created_at=0.0, role=role, **kw)


def thread(system: str | None = None) -> ThreadRecord:
    return ThreadRecord("t", "o", 0.0, 0.0, "p/m", system, {}, False, 0, 0)


def calls(*ids: str) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]


def gateway_error(call: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call()
    return info.value


# Reading posted messages


def test_a_plain_message_and_a_list() -> None:
    [m], single = parse_messages({"content": "hi"}, LIMITS)
    assert (
        single
        and m.role == "user"
        and m.content == [{"type": "text", "text": "hi"}]
        and not m.blobs
    )
    ms, single = parse_messages(
        {"messages": [{"role": "tool", "tool_call_id": "c", "content": [1, 2]}]}, LIMITS
    )
    assert (
        not single
        and ms[0].content == [{"type": "text", "text": "[1,2]"}]
        and ms[0].tool_call_id == "c"
    )


def test_images_and_files_become_attachments_named_by_hash() -> None:
    [m], _ = parse_messages({"content": [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG), "detail": "low"}},
        {"type": "image_url", "image_url": "data:;base64," + b64(PNG)},  # sniffed
        {"type": "file", "file": {"filename": "a.txt", "file_data": b64("\ufeffhé".encode())}},
    ]}, LIMITS)  # fmt: skip
    digest = hashlib.sha256(PNG).hexdigest()
    assert m.content[1] == {
        "type": "image",
        "attachment_id": digest,
        "media_type": "image/png",
        "size": len(PNG),
        "detail": "low",
    }
    assert m.content[2]["media_type"] == "image/png" and m.content[2]["attachment_id"] == digest
    assert m.content[3]["type"] == "file" and m.content[3]["media_type"] == "text/plain"
    assert [b.hash for b in m.blobs] == [
        digest,
        digest,
        hashlib.sha256("\ufeffhé".encode()).hexdigest(),
    ]


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (
            [
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64," + b64(b"x" * 1001)},
                }
            ],
            413,
            "attachment_too_large",
        ),
        ([{"type": "file", "file": {"file_data": b64(b"y" * 2000)}}], 413, "attachment_too_large"),
        (
            [{"type": "file", "file": {"file_data": b64(b"\xff\xfe\xfd")}}],
            400,
            "unsupported_attachment",
        ),
        (
            [
                {
                    "type": "image_url",
                    "image_url": {"url": "data:text/plain;base64," + b64(b"hello")},
                }
            ],
            400,
            "unsupported_attachment",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
            400,
            "invalid_value",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}],
            400,
            "invalid_value",
        ),
        ([{"type": "file", "file": {"file_id": "file-1"}}], 400, "invalid_value"),
        ([{"type": "input_audio"}], 400, "invalid_value"),
        ([], 400, "invalid_value"),
        ("", 400, "invalid_value"),
        (None, 400, "missing_required_parameter"),
        (7, 400, "invalid_value"),
    ],
)
def test_bad_content_is_refused_with_the_right_status(content: Any, status: int, code: str) -> None:
    err = gateway_error(lambda: parse_messages({"content": content}, LIMITS))
    assert (err.error.status, err.error.code) == (status, code)


def test_roles_and_fields() -> None:
    for body in ({"role": "assistant", "content": "x"}, {"role": "system", "content": "x"},
                 {"content": "x", "name": "n"}, {"role": "user", "content": "x", "tool_call_id": "c"},
                 {"role": "tool", "content": "x"}, {"messages": "x"}, {"messages": [], }, [1]):  # fmt: skip
        assert gateway_error(lambda body=body: parse_messages(body, LIMITS)).error.status == 400


def multipart(*parts: tuple[str, str | None, str | None, bytes]) -> tuple[bytes, str]:
    out = b""
    for name, filename, ctype, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += b"--BOUND\r\nContent-Disposition: " + disp.encode() + b"\r\n"
        if ctype:
            out += b"Content-Type: " + ctype.encode() + b"\r\n"
        out += b"\r\n" + data + b"\r\n"
    return out + b"--BOUND--\r\n", "multipart/form-data; boundary=BOUND"


def test_multipart_uploads() -> None:
    body, ctype = multipart(
        ("text", None, None, "Look ✓".encode()),
        ("file", "p.png", "image/png", PNG),
        ("file", "n.txt", "text/plain", b"line1\r\nline2"),
    )
    m = parse_multipart(body, ctype, LIMITS)
    assert [p["type"] for p in m.content] == ["text", "image", "file"]
    assert m.content[0]["text"] == "Look ✓" and m.blobs[0].data == PNG
    assert m.blobs[1].data == b"line1\r\nline2"  # bytes kept exactly
    body, ctype = multipart(("file", "big.txt", "text/plain", b"z" * 1001))
    assert gateway_error(lambda: parse_multipart(body, ctype, LIMITS)).error.status == 413
    body, ctype = multipart(("role", None, None, b"assistant"))
    assert gateway_error(lambda: parse_multipart(body, ctype, LIMITS)).error.status == 400
    assert (
        gateway_error(
            lambda: parse_multipart(b"junk", "multipart/form-data; boundary=BOUND", LIMITS)
        ).error.status
        == 400
    )


# The tail checks


def test_tool_results_answer_the_last_assistant_turn_only() -> None:
    tail = [record("assistant", 2, tool_calls=calls("a", "b")), record("tool", 3, tool_call_id="a")]
    assert pending_tool_calls(tail) == ["b"]
    [tool_b], _ = parse_messages({"role": "tool", "tool_call_id": "b", "content": "ok"}, LIMITS)
    [tool_a], _ = parse_messages({"role": "tool", "tool_call_id": "a", "content": "ok"}, LIMITS)
    [tool_z], _ = parse_messages({"role": "tool", "tool_call_id": "z", "content": "ok"}, LIMITS)
    [question], _ = parse_messages({"content": "q"}, LIMITS)
    check_append(tail, [tool_b, question])  # answered, then the user speaks
    assert (
        gateway_error(lambda: check_append(tail, [question])).error.code == "tool_results_pending"
    )
    assert gateway_error(lambda: check_append(tail, [tool_a])).error.code == "duplicate_tool_result"
    assert gateway_error(lambda: check_append(tail, [tool_z])).error.code == "unknown_tool_call_id"
    assert (
        gateway_error(lambda: check_append(tail, [tool_b, tool_b])).error.code
        == "duplicate_tool_result"
    )
    no_calls = [record("assistant", 2)]
    assert (
        gateway_error(lambda: check_append(no_calls, [tool_b])).error.code
        == "no_pending_tool_calls"
    )
    check_append([], [question])


def test_continue_needs_something_to_answer() -> None:
    assert gateway_error(lambda: check_continue(thread(), [])).error.code == "empty_thread"
    done = [record("user", 1), record("assistant", 2)]
    assert gateway_error(lambda: check_continue(thread(), done)).error.code == "nothing_to_answer"
    waiting = [record("user", 1), record("assistant", 2, tool_calls=calls("a"))]
    assert (
        gateway_error(lambda: check_continue(thread(), waiting)).error.code
        == "tool_results_pending"
    )
    check_continue(thread(), [*waiting, record("tool", 3, tool_call_id="a")])
    check_continue(thread(), [record("user", 1), record("user", 2)])


# Upstream messages


def test_upstream_messages_follow_the_22_layout_for_every_kind() -> None:
    text_blob = b"col\n1"
    hashes = {"img": PNG, "txt": text_blob}
    messages = [
        record("user", 1, content=[
            {"type": "text", "text": "a"},
            {"type": "image", "attachment_id": "img", "media_type": "image/png", "size": len(PNG)},
            {"type": "file", "attachment_id": "txt", "filename": "c.csv", "media_type": "text/csv", "size": 5},
            {"type": "text", "text": "b"},
        ]),
        record("assistant", 2, content=[], tool_calls=calls("x"), reasoning="hmm", reasoning_carrier="reasoning"),
        record("tool", 3, tool_call_id="x", content=[{"type": "text", "text": "42"}]),
        record("assistant", 4, reasoning="inline", reasoning_carrier="think"),
        record("user", 5),
    ]  # fmt: skip
    out = upstream_messages(thread("sys"), messages, hashes)
    for kind_name, key in (
        ("mlx-lm", "reasoning"),
        ("llamacpp", "reasoning_content"),
        ("openai", None),
    ):
        kind = KINDS[kind_name]
        from svir.config.model import ProviderConfig

        body = build_upstream_body(
            {"model": "p/m", "messages": out},
            kind=kind,
            provider=ProviderConfig(name="p", kind=kind_name, base_url="http://h/v1"),
            model_id="m",
        )
        sent = body["messages"]
        assert sent[0] == {"role": "system", "content": "sys"}
        assert sent[1]["content"] == [
            {"type": "text", "text": 'a\n<file name="c.csv">\ncol\n1\n</file>\nb'},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(PNG)}},
        ]
        assert sent[2]["content"] == "" and sent[2]["tool_calls"] == calls("x")
        assert {k for k in sent[2] if k.startswith("reasoning")} == ({key} if key else set())
        assert sent[3] == {"role": "tool", "tool_call_id": "x", "content": "42"}
        assert not any(
            k.startswith("reasoning") for k in sent[4]
        )  # inline <think>: never sent back
        assert sent[5] == {"role": "user", "content": "user 5"}


# Continue parameters, overflow sizes, frames


def test_continue_parameters() -> None:
    params = parse_continue({"model": "p/m", "stream": True, "temperature": 0.5, "tools": []})
    assert (params.model, params.stream, params.generation) == (
        "p/m",
        True,
        {"temperature": 0.5, "tools": []},
    )
    assert parse_continue(None).stream is False and parse_continue({}).model is None
    for body in (
        {"messages": []},
        {"stream_options": {}},
        {"stream": 1},
        {"tools": {}},
        {"response_format": "json"},
        {"model": ""},
        [1],
    ):
        assert gateway_error(lambda body=body: parse_continue(body)).error.status == 400


@pytest.mark.parametrize(
    ("message", "details", "prompt", "context"),
    [
        (
            "request (20056 tokens) exceeds the available context size (16384 tokens), try increasing it",
            {},
            20056,
            16384,
        ),
        ("whatever", {"n_prompt_tokens": 300, "n_ctx": 256}, 300, 256),
        (
            "This model's maximum context length is 262144 tokens. However, you requested 0 output tokens and your prompt contains at least 262145 input tokens",
            {},
            262145,
            262144,
        ),
        (
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
            {},
            9000,
            8192,
        ),
        (
            "The number of tokens to keep from the initial prompt is greater than the context length.",
            {},
            None,
            None,
        ),
    ],
)
def test_overflow_sizes(
    message: str, details: dict[str, int], prompt: int | None, context: int | None
) -> None:
    sizes = overflow_sizes(message, details, messages=3, message_bytes=99)
    assert sizes == {
        "prompt_tokens": prompt,
        "context_tokens": context,
        "messages": 3,
        "message_bytes": 99,
    }


def test_error_frame_is_an_openai_error_body_too() -> None:
    frame = frames.error(ClientError(409, "invalid_request_error", "thread_busy", "busy"))
    assert frame == {
        "type": "error",
        "appended": None,
        "error": {
            "message": "busy",
            "type": "invalid_request_error",
            "param": None,
            "code": "thread_busy",
        },
    }
    assert frames.encode(frames.delta("a\nb")) == b'data: {"type":"delta","text":"a\\nb"}\n\n'


# Owners and the [store] config


def scope(auth: bytes | None) -> dict[str, Any]:
    return {"headers": [(b"authorization", auth)] if auth is not None else []}


def test_owner_is_the_tokens_hash() -> None:
    owner = owner_of(scope(b"Bearer sk-abc"))
    assert owner == "sha256:" + hashlib.sha256(b"sk-abc").hexdigest()
    assert owner_of(scope(b"bearer   sk-abc ")) == owner
    assert owner_of(scope(b"Bearer sk-abd")) != owner
    assert owner_of(scope(None)) == owner_of(scope(b"Bearer ")) == ANONYMOUS
    assert "sk-abc" not in owner


def test_default_store_is_sqlite_under_the_data_dir() -> None:
    assert (
        default_url({"XDG_DATA_HOME": "/data", "HOME": "/home/u"}) == "sqlite:////data/svir/svir.db"
    )
    assert default_url({"HOME": "/home/u"}) == "sqlite:////home/u/.local/share/svir/svir.db"
    assert (
        default_url({"XDG_DATA_HOME": "relative", "HOME": "/home/u"})
        == "sqlite:////home/u/.local/share/svir/svir.db"
    )


def test_store_config() -> None:
    assert parse_config("").store == StoreConfig()
    config = parse_config(
        '[store]\nurl = "postgresql://u@h/db?schema=s"\nmax_attachment_bytes = 10\nmax_thread_attachment_bytes = 20\nlease_seconds = 5'
    )
    assert config.store == StoreConfig("postgresql://u@h/db?schema=s", 10, 20, 5.0)
    for text, field in [
        ('[store]\nurl = "mysql://x"', "store.url"),
        ('[store]\nurl = "sqlite:///"', "store.url"),
        ("[store]\nmax_attachment_bytes = 0", "store.max_attachment_bytes"),
        (
            "[store]\nmax_attachment_bytes = 50\nmax_thread_attachment_bytes = 10",
            "store.max_thread_attachment_bytes",
        ),
        ("[store]\nlease_seconds = 0.1", "store.lease_seconds"),
        ("[store]\nurll = 'x'", "store.urll"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert info.value.field == field, text
    with pytest.raises(ConfigError) as info:
        parse_config('[store]\nurl = "mysql://user:hunter2@h/db"')
    assert "hunter2" not in str(info.value)


def test_media_types_are_checked_before_they_reach_a_header() -> None:
    url = "data:text/plain\r\nx-evil: 1;base64," + b64(b"hi")
    err = gateway_error(
        lambda: parse_messages({"content": [{"type": "file", "file": {"file_data": url}}]}, LIMITS)
    )
    assert err.error.status == 400
    [m], _ = parse_messages(
        {
            "content": [
                {
                    "type": "file",
                    "file": {
                        "file_data": "data:text/x-python;charset=utf-8;base64," + b64(b"x = 1")
                    },
                }
            ]
        },
        LIMITS,
    )
    assert m.content[0]["media_type"] == "text/x-python"
