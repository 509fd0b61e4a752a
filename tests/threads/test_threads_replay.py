"""/v1/threads end to end: plain httpx drives a real svir process, which drives the replay server
(the conformance corpus played over HTTP). Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.svir_proc import SvirProcess
from tests.support.upstream import CORPUS_DIR, ScriptedServer, ScriptedUpstream, status_model
from tests.support.waiting import PATIENCE, wait_until
from tests.threads.conftest import STORES, store_url
from tests.threads.support import Threads, parse_frames, start_svir

# Processes outside pytest in every test (the docstring says which): not in `make test-fast`.
pytestmark = pytest.mark.external

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
MAX_ATTACHMENT = 4096
MAX_THREAD = 10000
LEASE = 2.0


def expect(name: str) -> dict[str, Any]:
    return dict(json.loads((CORPUS_DIR / f"{name}.json").read_text())["expect"])


@pytest.fixture(scope="module")
def replay() -> Iterator[ScriptedServer]:
    with ScriptedServer(ScriptedUpstream(split="event", pieces=2, drip=0.05)) as server:
        yield server


@pytest.fixture(scope="module", params=STORES)
def svir(
    request: pytest.FixtureRequest,
    replay: ScriptedServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SvirProcess]:
    tmp = tmp_path_factory.mktemp(f"svir-{request.param}")
    postgres = request.getfixturevalue("postgres") if request.param == "postgres" else None
    proc = start_svir(
        tmp,
        replay.base_url,
        store_url(request.param, tmp, postgres),
        max_attachment_bytes=MAX_ATTACHMENT,
        max_thread_attachment_bytes=MAX_THREAD,
        lease_seconds=LEASE,
    )
    yield proc
    proc.stop()


@pytest.fixture
def api(svir: SvirProcess) -> Threads:
    return Threads(svir.base_url)


def user_thread(api: Threads, text: str = "hi", **create: Any) -> str:
    thread = api.create(**create)
    api.say(thread["id"], text)
    return str(thread["id"])


# ---------------------------------------------------------------------------------------------
# The resource


def test_create_get_update_list_delete(api: Threads) -> None:
    thread = api.create(model="plain/llama-cpp", system="Be brief.", metadata={"project": "x"})
    assert thread["id"].startswith("thread_") and thread["object"] == "thread"
    assert (thread["model"], thread["system"], thread["metadata"]) == (
        "plain/llama-cpp",
        "Be brief.",
        {"project": "x"},
    )
    got = api.get(thread["id"])
    assert got["messages"] == [] and got["busy"] is False and got["message_count"] == 0
    r = api.http.post(f"/threads/{thread['id']}", json={"metadata": {"project": "y"}})
    assert r.status_code == 200 and r.json()["metadata"] == {"project": "y"}
    assert r.json()["system"] == "Be brief."
    ids = [t["id"] for t in api.http.get("/threads", params={"limit": 100}).json()["data"]]
    assert thread["id"] in ids
    r = api.http.delete(f"/threads/{thread['id']}")
    assert r.json() == {"id": thread["id"], "object": "thread.deleted", "deleted": True}
    for method, path in [("GET", ""), ("DELETE", ""), ("GET", "/messages"), ("POST", "/continue")]:
        r = api.http.request(method, f"/threads/{thread['id']}{path}", json={})
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["code"] == "thread_not_found"


def test_threads_belong_to_their_key(svir: SvirProcess) -> None:
    one, two, anon = (
        Threads(svir.base_url, "key-one"),
        Threads(svir.base_url, "key-two"),
        Threads(svir.base_url, None),
    )
    mine = user_thread(one, model="plain/llama-cpp")
    message_id = one.get(mine)["messages"][0]["id"]
    for client in (two, anon):
        for method, path, body in [
            ("GET", "", None), ("POST", "", {"metadata": {}}), ("DELETE", "", None),
            ("GET", "/messages", None), ("POST", "/messages", {"content": "x"}),
            ("GET", f"/messages/{message_id}", None), ("POST", "/continue", {}),
            ("POST", "/cancel", None),
        ]:  # fmt: skip
            r = client.http.request(method, f"/threads/{mine}{path}", json=body)
            assert r.status_code == 404, (method, path, r.text)
        assert mine not in [t["id"] for t in client.http.get("/threads?limit=100").json()["data"]]
    # No key is one fixed anonymous owner: it sees its own threads, and only them.
    theirs = anon.create()["id"]
    assert Threads(svir.base_url, None).get(theirs)["id"] == theirs
    assert one.http.get(f"/threads/{theirs}").status_code == 404
    assert one.get(mine)["message_count"] == 1  # untouched by the others


def test_pagination(svir: SvirProcess) -> None:
    api = Threads(svir.base_url, f"pager-{time.monotonic_ns()}")
    made = [api.create()["id"] for _ in range(5)]
    first = api.http.get("/threads", params={"limit": 2}).json()
    assert [t["id"] for t in first["data"]] == made[::-1][:2] and first["has_more"] is True
    assert first["first_id"] == made[4] and first["last_id"] == made[3]
    second = api.http.get("/threads", params={"limit": 2, "after": first["last_id"]}).json()
    third = api.http.get("/threads", params={"limit": 2, "after": second["last_id"]}).json()
    assert [t["id"] for t in second["data"] + third["data"]] == made[::-1][2:]
    assert third["has_more"] is False
    asc = api.http.get("/threads", params={"order": "asc", "limit": 100}).json()
    assert [t["id"] for t in asc["data"]] == made
    for bad in (
        {"limit": "0"},
        {"limit": "101"},
        {"limit": "x"},
        {"order": "up"},
        {"after": "thread_nope"},
    ):
        r = api.http.get("/threads", params=bad)
        assert r.status_code == 400, bad
    # Messages page the same way.
    for i in range(3):
        api.say(made[0], f"m{i}")
    page = api.http.get(f"/threads/{made[0]}/messages", params={"limit": 2}).json()
    assert [m["content"][0]["text"] for m in page["data"]] == ["m0", "m1"] and page["has_more"]
    page = api.http.get(f"/threads/{made[0]}/messages", params={"after": page["last_id"]}).json()
    assert [m["content"][0]["text"] for m in page["data"]] == ["m2"] and not page["has_more"]


def test_an_after_not_in_the_list_is_400_invalid_cursor(svir: SvirProcess) -> None:
    api, other = Threads(svir.base_url, "cursor-one"), Threads(svir.base_url, "cursor-two")
    mine, theirs = user_thread(api), user_thread(other)
    their_message = other.get(theirs)["messages"][0]["id"]
    # Ids that exist, but in another key's list or another thread's, and one that never did.
    for path, after in [
        ("/threads", theirs),
        ("/threads", "thread_nope"),
        (f"/threads/{mine}/messages", their_message),
        (f"/threads/{mine}/messages", "nope"),
    ]:
        r = api.http.get(path, params={"after": after})
        assert r.status_code == 400, (path, after, r.text)
        assert r.json() == {
            "error": {
                "message": f"after: {after!r} is not an id in this list",
                "type": "invalid_request_error",
                "param": "after",
                "code": "invalid_cursor",
            }
        }


# ---------------------------------------------------------------------------------------------
# Continue: frames, storage, reasoning


def test_streamed_frames_then_the_answer_is_stored(api: Threads) -> None:
    want = expect("lmstudio-reasoning")
    tid = user_thread(api, model="lms/lmstudio-reasoning")
    frames = api.stream(tid)
    kinds = [f["type"] for f in frames]
    assert kinds[-1] == "done" and kinds.count("done") == 1
    assert set(kinds) == {"reasoning", "delta", "usage", "done"}
    assert kinds.index("delta") > kinds.index("reasoning")
    assert "".join(f["text"] for f in frames if f["type"] == "delta") == want["answer"]
    assert "".join(f["text"] for f in frames if f["type"] == "reasoning") == want["reasoning"]
    done = frames[-1]
    assert set(done) == {"type", "message_id", "finish_reason", "appended"}
    assert done["finish_reason"] == "stop" and done["appended"] == want["answer"]
    usage = next(f for f in frames if f["type"] == "usage")
    assert usage["prompt_tokens"] == want["usage"]["prompt_tokens"]
    thread = api.get(tid)
    last = thread["messages"][-1]
    assert [m["role"] for m in thread["messages"]] == ["user", "assistant"]
    assert last["id"] == done["message_id"]
    assert last["content"] == [{"type": "text", "text": want["answer"]}]
    assert (last["reasoning"], last["reasoning_carrier"]) == (
        want["reasoning"],
        "reasoning_content",
    )
    assert (
        last["model"] == "lms/lmstudio-reasoning"
        and last["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    )
    assert api.http.get(f"/threads/{tid}/messages/{done['message_id']}").json() == last


def test_non_streamed_is_the_last_frame_alone(api: Threads) -> None:
    tid = user_thread(api, model="plain/llama-cpp")
    r = api.continue_(tid, stream=False)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"type", "message_id", "finish_reason", "appended"}
    assert body["type"] == "done" and body["appended"] == expect("llama-cpp")["answer"]
    # The same turn streamed ends with the same frame, but for the new message's id.
    api.say(tid, "again")
    last = api.stream(tid)[-1]
    assert {**last, "message_id": body["message_id"]} == body and last["message_id"] != body[
        "message_id"
    ]
    assert api.roles(tid) == ["user", "assistant", "user", "assistant"]
    # The default is not streamed.
    api.say(tid, "once more")
    assert api.continue_(tid).json()["type"] == "done"


@pytest.mark.parametrize(
    ("model", "key", "text"),
    [
        # Each server's reasoning goes back under its own key (§2.2).
        ("mlx/mlx-lm", "reasoning", expect("mlx-lm")["reasoning"]),
        ("lms/lmstudio-reasoning", "reasoning_content", expect("lmstudio-reasoning")["reasoning"]),
        # Reasoning that came inline as <think> is not sent back at all (D23).
        ("tags/think-inline", None, None),
    ],
)
def test_reasoning_goes_back_under_the_servers_key(
    api: Threads, replay: ScriptedServer, model: str, key: str | None, text: str | None
) -> None:
    tid = user_thread(api, model=model)
    assert api.stream(tid)[-1]["type"] == "done"
    stored = api.get(tid)["messages"][-1]
    api.say(tid, "and then?")
    replay.clear()
    assert api.continue_(tid).json()["type"] == "done"
    sent = replay.last.body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assistant = sent[1]
    assert assistant["content"] == stored["content"][0]["text"]
    reasoning_keys = {k for k in assistant if k in ("reasoning", "reasoning_content")}
    if key is None:
        assert reasoning_keys == set()
        assert "<think>" not in assistant["content"] and stored["reasoning_carrier"] == "think"
        assert stored["reasoning"] == expect("think-inline")["reasoning"]
    else:
        assert reasoning_keys == {key} and assistant[key] == text


def test_system_prompt_and_generation_parameters_reach_the_upstream(
    api: Threads, replay: ScriptedServer
) -> None:
    tid = user_thread(api, "q", model="plain/llama-cpp", system="You are terse.")
    replay.clear()
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    r = api.continue_(tid, temperature=0.2, max_tokens=7, seed=3, stop=["\n"], response_format=fmt)
    assert r.json()["type"] == "done"
    body = replay.last.body
    assert body["messages"][:2] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "q"},
    ]
    assert (body["temperature"], body["max_tokens"], body["seed"], body["stop"]) == (
        0.2,
        7,
        3,
        ["\n"],
    )
    assert body["response_format"] == fmt and body["stream"] is True
    # A model given to /continue wins over the thread's, for that turn only.
    api.say(tid, "q2")
    replay.clear()
    api.continue_(tid, model="plain/utf8")
    assert replay.last.body["model"] == "utf8"
    assert (
        api.get(tid)["messages"][-1]["model"] == "plain/utf8"
        and api.get(tid)["model"] == "plain/llama-cpp"
    )


# ---------------------------------------------------------------------------------------------
# Tools


def test_tool_call_round_trip(api: Threads, replay: ScriptedServer) -> None:
    want = expect("mlx-lm-tools")
    tool = {
        "type": "function",
        "function": {"name": "open_locker", "parameters": {"type": "object"}},
    }
    tid = user_thread(api, "Open locker 12.", model="mlx/mlx-lm-tools")
    replay.clear()
    frames = api.stream(tid, tools=[tool])
    assert replay.last.body["tools"] == [tool]
    calls = [f for f in frames if f["type"] == "tool_call"]
    [call] = want["tool_calls"]
    assert calls == [
        {
            "type": "tool_call",
            "index": 0,
            "id": call["id"],
            "name": "open_locker",
            "arguments": call["arguments"],
        }
    ]
    done = frames[-1]
    assert done["type"] == "done" and done["finish_reason"] == "tool_calls"
    assistant = api.get(tid)["messages"][-1]
    assert assistant["tool_calls"] == [
        {
            "id": call["id"],
            "type": "function",
            "function": {"name": "open_locker", "arguments": call["arguments"]},
        }
    ]

    # Until the call has its result, the thread takes no user message and cannot go on.
    r = api.post(tid, {"content": "well?"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "tool_results_pending"
    r = api.continue_(tid)
    assert r.status_code == 400 and r.json()["error"]["code"] == "tool_results_pending"
    assert r.json()["type"] == "error" and r.json()["appended"] is None
    r = api.post(tid, {"role": "tool", "tool_call_id": "call-nope", "content": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_tool_call_id"
    r = api.post(tid, {"role": "tool", "content": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_call_id"

    result = {"opened": True, "locker": 12}
    r = api.post(tid, {"role": "tool", "tool_call_id": call["id"], "content": result})
    assert r.status_code == 200 and r.json()["tool_call_id"] == call["id"]
    assert r.json()["content"] == [
        {"type": "text", "text": json.dumps(result, separators=(",", ":"))}
    ]
    r = api.post(tid, {"role": "tool", "tool_call_id": call["id"], "content": "again"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_tool_result"

    replay.clear()
    frames = api.stream(tid, model="mlx/lmstudio-reasoning", tools=[tool])
    assert frames[-1]["type"] == "done"
    sent = replay.last.body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"] == assistant["tool_calls"]
    assert sent[1]["reasoning"] == want["reasoning"]  # mlx-lm's key
    assert sent[2] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": json.dumps(result, separators=(",", ":")),
    }
    assert api.roles(tid) == ["user", "assistant", "tool", "assistant"]


def test_several_tool_results_in_one_post(api: Threads, replay: ScriptedServer) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    tid = user_thread(api, model="plain/interleaved-tools")
    frames = api.stream(tid, tools=[tool])
    assert [f["id"] for f in frames if f["type"] == "tool_call"] == ["call-a", "call-b"]
    # One result is not enough to go on; both, in one post, are.
    r = api.post(tid, {"messages": [{"role": "tool", "tool_call_id": "call-b", "content": "2"}]})
    assert r.status_code == 200 and r.json()["object"] == "list"
    assert api.continue_(tid).json()["error"]["code"] == "tool_results_pending"
    r = api.post(tid, {"messages": [
        {"role": "tool", "tool_call_id": "call-a", "content": "1"},
        {"role": "user", "content": "Sum them."},
    ]})  # fmt: skip
    assert r.status_code == 200 and [m["role"] for m in r.json()["data"]] == ["tool", "user"]
    replay.clear()
    assert api.continue_(tid, model="plain/llama-cpp").json()["type"] == "done"
    sent = replay.last.body["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
        ("user", None), ("assistant", None), ("tool", "call-b"), ("tool", "call-a"), ("user", None),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Images and files


def test_images_and_files_reach_the_upstream_in_the_22_layout(
    api: Threads, replay: ScriptedServer
) -> None:
    notes = b"a,b\n1,2\n"
    tid = api.create(model="plain/llama-cpp")["id"]
    posted = api.say(tid, [
        {"type": "text", "text": "What is in"},
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "text", "text": "and in this file?"},
        {"type": "file", "file": {"filename": "t.csv", "file_data": "data:text/csv;base64," + base64.b64encode(notes).decode()}},
    ])  # fmt: skip
    image, file = posted["content"][1], posted["content"][3]
    assert (
        image["type"] == "image"
        and image["media_type"] == "image/png"
        and image["size"] == len(PNG)
    )
    assert (
        file["type"] == "file" and file["filename"] == "t.csv" and file["media_type"] == "text/csv"
    )
    # The attachments can be read back, by their owner only.
    r = api.http.get(image["url"].removeprefix("/v1"))
    assert r.status_code == 200 and r.content == PNG and r.headers["content-type"] == "image/png"
    assert r.headers["x-content-type-options"] == "nosniff"
    r = api.http.get(file["url"].removeprefix("/v1"))
    assert r.content == notes and r.headers["content-disposition"] == "attachment"
    assert (
        Threads(api.http.base_url.__str__(), "key-two")
        .http.get(image["url"].removeprefix("/v1"))
        .status_code
        == 404
    )
    replay.clear()
    assert api.continue_(tid).json()["type"] == "done"
    # One text part (the texts, then each file as a <file> block), then the images (§2.2).
    assert replay.last.body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": 'What is in\nand in this file?\n<file name="t.csv">\na,b\n1,2\n\n</file>'},
        {"type": "image_url", "image_url": {"url": PNG_URL}},
    ]}]  # fmt: skip


def test_uploads_as_multipart(api: Threads, replay: ScriptedServer) -> None:
    tid = api.create(model="plain/llama-cpp")["id"]
    files = [
        ("text", (None, "Describe these.")),
        ("file", ("pic.png", PNG, "application/octet-stream")),  # sniffed as a PNG
        ("file", ("notes.md", "# Notes\nü".encode(), "text/markdown")),
    ]
    r = api.http.post(f"/threads/{tid}/messages", files=files)
    assert r.status_code == 200, r.text
    parts = r.json()["content"]
    assert [p["type"] for p in parts] == ["text", "image", "file"]
    assert parts[1]["media_type"] == "image/png" and parts[2]["filename"] == "notes.md"
    replay.clear()
    assert api.continue_(tid).json()["type"] == "done"
    assert replay.last.body["messages"][0]["content"] == [
        {"type": "text", "text": 'Describe these.\n<file name="notes.md">\n# Notes\nü\n</file>'},
        {"type": "image_url", "image_url": {"url": PNG_URL}},
    ]
    # A binary file that is not an image is refused: servers take files only as text.
    r = api.http.post(
        f"/threads/{tid}/messages", files=[("file", ("x.bin", b"\x00\xff\xfe", "application/zip"))]
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_attachment"


def test_attachment_limits_are_413(api: Threads) -> None:
    tid = api.create()["id"]
    big = base64.b64encode(b"x" * (MAX_ATTACHMENT + 1)).decode()
    r = api.post(
        tid, {"content": [{"type": "file", "file": {"filename": "big.txt", "file_data": big}}]}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "attachment_too_large"
    r = api.http.post(
        f"/threads/{tid}/messages",
        files=[("file", ("big.txt", b"y" * (MAX_ATTACHMENT + 1), "text/plain"))],
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "attachment_too_large"
    # Per thread: distinct attachments add up; the same one again costs nothing.
    chunk = MAX_ATTACHMENT - 100
    for i in range(MAX_THREAD // chunk):
        body = base64.b64encode(bytes([65 + i]) * chunk).decode()
        assert (
            api.post(
                tid,
                {
                    "content": [
                        {"type": "file", "file": {"filename": f"{i}.txt", "file_data": body}}
                    ]
                },
            ).status_code
            == 200
        )
        assert (
            api.post(
                tid,
                {
                    "content": [
                        {"type": "file", "file": {"filename": f"{i}.txt", "file_data": body}}
                    ]
                },
            ).status_code
            == 200
        )
    over = base64.b64encode(b"z" * chunk).decode()
    r = api.post(
        tid, {"content": [{"type": "file", "file": {"filename": "over.txt", "file_data": over}}]}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "thread_attachments_too_large"
    thread = api.get(tid)
    assert thread["attachment_bytes"] == (MAX_THREAD // chunk) * chunk
    assert thread["message_count"] == 2 * (MAX_THREAD // chunk)


# ---------------------------------------------------------------------------------------------
# Failures


def test_a_failed_continuation_appends_nothing_and_says_so(api: Threads) -> None:
    tid = user_thread(api, model="plain/llama-cpp-error")
    frames = api.stream(tid)
    assert frames[0]["type"] == "reasoning"  # output had started: the error is the last frame
    error = frames[-1]
    assert error["type"] == "error" and error["appended"] is None
    assert set(error["error"]) >= {"message", "type", "code", "param"}
    assert (
        "peg-native" in error["error"]["message"]
        and "Nothing was appended" in error["error"]["message"]
    )
    assert sum(f["type"] == "error" for f in frames) == 1
    r = api.continue_(tid, stream=False)
    assert r.status_code == 502 and r.json()["type"] == "error" and r.json()["appended"] is None
    thread = api.get(tid)
    assert [m["role"] for m in thread["messages"]] == ["user"] and thread["busy"] is False


def test_context_overflow_is_context_length_exceeded_with_sizes(api: Threads) -> None:
    tid = user_thread(api, "a long prompt", model=f"plain/{status_model('llama-cpp-overflow-400')}")
    api.say(tid, "more")  # two user messages in a row are fine
    for stream in (True, False):
        r = api.continue_(tid, stream=stream)
        assert r.status_code == 400
        body = r.json()
        assert body["type"] == "error" and body["appended"] is None
        error = body["error"]
        assert (
            error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
        )
        sizes = error["sizes"]
        assert (sizes["prompt_tokens"], sizes["context_tokens"], sizes["messages"]) == (
            20056,
            16384,
            2,
        )
        assert sizes["message_bytes"] > 0
    # LM Studio says it inside a 200 stream, before any output, without numbers.
    r = api.continue_(tid, model="plain/lmstudio-error", stream=True)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["sizes"]["messages"] == 2
    assert api.roles(tid) == ["user", "user"] and not api.get(tid)["busy"]


def test_continue_preconditions(api: Threads) -> None:
    empty = api.create(model="plain/llama-cpp")["id"]
    r = api.continue_(empty)
    assert r.status_code == 400 and r.json()["error"]["code"] == "empty_thread"
    answered = user_thread(api, model="plain/llama-cpp")
    api.continue_(answered)
    r = api.continue_(answered)
    assert r.status_code == 400 and r.json()["error"]["code"] == "nothing_to_answer"
    modelless = user_thread(api)
    r = api.continue_(modelless)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = api.continue_(modelless, model="nope/x")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["type"] == "error"
    for body, param in [
        ({"model": "plain/x", "messages": []}, "messages"),
        ({"model": "plain/x", "stream": "yes"}, "stream"),
        ({"model": "plain/x", "n": 2}, "n"),
        ({"model": "plain/x", "tools": "no"}, "tools"),
        ({"model": "plain/x", "max_tokens": 0}, "max_tokens"),
        ({"model": 5}, "model"),
    ]:
        r = api.continue_(modelless, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, body
    assert api.roles(modelless) == ["user"] and not api.get(modelless)["busy"]


def test_bad_input_is_answered_and_the_process_lives(api: Threads, svir: SvirProcess) -> None:
    tid = api.create()["id"]
    cases: list[tuple[str, str, Any, int]] = [
        ("POST", "/threads", b"{not json", 400),
        ("POST", "/threads", b"[1,2]", 400),
        ("POST", "/threads", {"model": 3}, 400),
        ("POST", "/threads", {"model": "nope/x"}, 404),
        ("POST", "/threads", {"metadata": {"k": 1}}, 400),
        ("POST", "/threads", {"metadata": {f"k{i}": "v" for i in range(17)}}, 400),
        ("POST", "/threads", {"colour": "red"}, 400),
        ("POST", f"/threads/{tid}/messages", b"", 400),
        ("POST", f"/threads/{tid}/messages", {"content": 5}, 400),
        ("POST", f"/threads/{tid}/messages", {"content": []}, 400),
        ("POST", f"/threads/{tid}/messages", {"content": [{"type": "audio"}]}, 400),
        (
            "POST",
            f"/threads/{tid}/messages",
            {"content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
            400,
        ),
        (
            "POST",
            f"/threads/{tid}/messages",
            {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]},
            400,
        ),
        (
            "POST",
            f"/threads/{tid}/messages",
            {
                "content": [
                    {
                        "type": "file",
                        "file": {"file_data": base64.b64encode(b"\xff\xfe\x00").decode()},
                    }
                ]
            },
            400,
        ),
        ("POST", f"/threads/{tid}/messages", {"role": "assistant", "content": "x"}, 400),
        ("POST", f"/threads/{tid}/messages", {"role": "system", "content": "x"}, 400),
        ("POST", f"/threads/{tid}/messages", {"messages": []}, 400),
        ("POST", f"/threads/{tid}/messages", {"messages": ["x"]}, 400),
        ("POST", f"/threads/{tid}/messages", {"content": "x", "extra": 1}, 400),
        ("POST", f"/threads/{tid}/continue", b"\xff\xfe", 400),
        ("GET", f"/threads/{tid}/messages/nope", None, 404),
        ("GET", f"/threads/{tid}/attachments/" + "0" * 64, None, 404),
        ("PUT", f"/threads/{tid}", {}, 405),
        ("GET", f"/threads/{tid}/continue", None, 405),
        ("GET", f"/threads/{tid}/nothing", None, 404),
        ("GET", "/threadsX", None, 404),
    ]
    for method, path, body, status in cases:
        kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = api.http.request(method, path, **kw)
        assert r.status_code == status, (method, path, body, r.text)
        error = r.json()["error"]
        assert isinstance(error["message"], str) and "type" in error and "code" in error
    r = api.http.post(
        f"/threads/{tid}/messages",
        content=b"--x\r\n",
        headers={"content-type": "multipart/form-data; boundary=zzz"},
    )
    assert r.status_code == 400
    assert httpx.get(svir.url + "/healthz").status_code == 200
    assert api.get(tid)["message_count"] == 0
    assert "Traceback" not in svir.log()


# ---------------------------------------------------------------------------------------------
# Concurrency, cancel, disconnect


def wait_busy(api: Threads, tid: str, busy: bool) -> None:
    wait_until(lambda: api.get(tid)["busy"] is busy, f"the thread busy={busy}")


@pytest.fixture
def gate(replay: ScriptedServer) -> Iterator[threading.Event]:
    """Set it, and the upstream's `silent-` answers begin (they wait for nothing else)."""
    opened = threading.Event()

    async def wait(stage: str) -> None:
        while not opened.is_set():
            await asyncio.sleep(0.01)

    before = replay.handler.wait
    replay.handler.wait = wait
    yield opened
    opened.set()
    replay.handler.wait = before


def test_a_second_continue_on_a_busy_thread_is_409(
    api: Threads, replay: ScriptedServer, gate: threading.Event
) -> None:
    # The first continuation's upstream answers once the gate opens: busy however long the
    # checks below take.
    tid = user_thread(api, model="plain/silent-ok")
    results: dict[str, Any] = {}

    def first() -> None:
        results["frames"] = api.stream(tid)

    runner = threading.Thread(target=first)
    runner.start()
    try:
        wait_busy(api, tid, True)
        r = api.continue_(tid, stream=True)
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "thread_busy" and r.json()["type"] == "error"
        r = api.post(tid, {"content": "meanwhile"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "thread_busy"
        r = api.http.delete(f"/threads/{tid}")
        assert r.status_code == 409
    finally:
        gate.set()
        runner.join(PATIENCE)
    assert results["frames"][-1]["type"] == "done"
    assert api.roles(tid) == ["user", "assistant"]


def test_racing_continues_one_answers(
    api: Threads, replay: ScriptedServer, gate: threading.Event
) -> None:
    # The winner's upstream answers once the gate opens: it is busy however late the others come.
    tid = user_thread(api, model="plain/silent-ok")
    statuses: list[int] = []
    lock = threading.Lock()

    def go() -> None:
        r = api.continue_(tid, stream=False)
        with lock:
            statuses.append(r.status_code)

    runners = [threading.Thread(target=go) for _ in range(6)]
    for t in runners:
        t.start()
    wait_until(lambda: len(statuses) == 5, "five of six continues answered")
    assert statuses == [409] * 5
    gate.set()
    for t in runners:
        t.join(PATIENCE)
    assert sorted(statuses) == [200] + [409] * 5
    assert api.roles(tid) == ["user", "assistant"]


def test_cancel_stops_the_stream_and_appends_nothing(api: Threads, replay: ScriptedServer) -> None:
    replay.handler.drip_count = None  # forever
    tid = user_thread(api, model="plain/slow-drip")
    assert api.http.post(f"/threads/{tid}/cancel").json()["cancelled"] is False
    seen: list[dict[str, Any]] = []
    with api.http.stream("POST", f"/threads/{tid}/continue", json={"stream": True}) as r:
        assert r.status_code == 200
        buf = b""
        for chunk in r.iter_bytes():
            buf += chunk
            if buf.count(b"\n\n") == 3:
                c = api.http.post(f"/threads/{tid}/cancel")
                assert c.status_code == 200 and c.json()["cancelled"] is True
        seen = parse_frames(buf)
    assert seen[-1]["type"] == "error" and seen[-1]["appended"] is None
    assert seen[-1]["error"]["code"] == "continuation_cancelled"
    assert api.roles(tid) == ["user"] and not api.get(tid)["busy"]
    replay.handler.drip_count = 3
    assert api.continue_(tid).json()["type"] == "done"  # the thread goes on


def test_a_client_that_leaves_mid_stream_appends_nothing(
    api: Threads, replay: ScriptedServer
) -> None:
    replay.handler.drip_count = None
    replay.clear()
    tid = user_thread(api, model="plain/slow-drip")
    with api.http.stream("POST", f"/threads/{tid}/continue", json={"stream": True}) as r:
        assert r.status_code == 200
        for n, _ in enumerate(r.iter_bytes()):
            if n >= 3:
                break
    record = replay.wait_disconnect(timeout=PATIENCE)
    assert record.model == "slow-drip"
    wait_busy(api, tid, False)
    assert api.roles(tid) == ["user"]


def test_response_headers(api: Threads) -> None:
    tid = user_thread(api, model="plain/llama-cpp")
    r = api.http.post(
        f"/threads/{tid}/continue", json={}, headers={"x-request-id": "trace-thread-1"}
    )
    assert r.headers["x-request-id"] == "trace-thread-1"
    assert r.headers["x-svir-served-model"] == "plain/llama-cpp"


@pytest.fixture(autouse=True)
def _finite_drip(replay: ScriptedServer) -> Iterator[None]:
    yield
    replay.handler.drip_count = None


def test_log_never_holds_the_bearer_token(svir: SvirProcess) -> None:
    api = Threads(svir.base_url, "sk-very-secret-token-1234")
    r = api.http.post("/threads", json={}, headers={"x-request-id": "secret-token-create"})
    assert r.status_code == 200, r.text
    # Its log line written (waited for, not slept for), the token is in no line.
    wait_until(lambda: "secret-token-create" in svir.log(), "the request's log line")
    assert "sk-very-secret-token-1234" not in svir.log()
    assert Path(svir.log_path).exists()
