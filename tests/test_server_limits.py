"""What one client connection may hold (`[server]` head_timeout, keep_alive_timeout,
max_head_bytes, max_header_fields, max_connections: at the cap, the connection at rest longest
makes room), on a real `svir serve` driven with raw sockets.

No test depends on how fast the machine is: a server's close is waited for up to `PATIENCE`
seconds (the limits are a second or two), and nothing is asserted to take at least some time
unless the test itself waited that long.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest

from svir.config.load import parse_config
from svir.config.model import ServerConfig
from svir.errors import ConfigError
from tests.support.mock_server import MockServerThread
from tests.support.svir_proc import SvirProcess
from tests.support.upstream import ScriptedUpstream
from tests.test_h1_server import behind_a_response

# How long a server's close is waited for: far past every limit set below.
PATIENCE = 30.0

TIMEOUTS = """
[server]
head_timeout = 1
keep_alive_timeout = 1
"""

SIZES = """
[server]
head_timeout = 300
keep_alive_timeout = 300
max_head_bytes = 4096
max_header_fields = 20
max_body_bytes = 10000
"""


def capped(cap: int, more: str = "") -> str:
    """A config of `cap` connections, whose timeouts close nothing while a test runs."""
    return f"""
[server]
head_timeout = 300
keep_alive_timeout = 300
max_connections = {cap}
{more}"""


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def timeouts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    with SvirProcess(TIMEOUTS, tmp_path_factory.mktemp("timeouts")) as proc:
        yield proc


@pytest.fixture(scope="module")
def sizes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SvirProcess]:
    with SvirProcess(SIZES, tmp_path_factory.mktemp("sizes")) as proc:
        yield proc


def connect(proc: SvirProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proc.port), timeout=PATIENCE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as a close);
    fails if it is still open after `PATIENCE` seconds."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection is still open after {PATIENCE} s (got {out!r})")
    return out


def response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response from `sock`, which stays usable for the next request."""
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    body = answer.read()
    return answer.status, {k.lower(): v for k, v in answer.getheaders()}, body


def parsed(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """A response received whole (the server closed after it)."""
    pair = socket.socketpair()
    with pair[0], pair[1]:
        pair[0].sendall(raw)
        pair[0].shutdown(socket.SHUT_WR)
        return response(pair[1])


def send_until_answered(sock: socket.socket, pieces: Iterator[bytes], pause: float) -> bytes:
    """Send `pieces` one by one, `pause` seconds apart, until the server answers or closes
    (failing after `PATIENCE` seconds); return what it sent until it closed."""
    deadline = time.monotonic() + PATIENCE
    for piece in pieces:
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        if select.select([sock], [], [], pause)[0]:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the server read on for {PATIENCE} s without answering or closing")
    return until_closed(sock)


def is_refusal(raw: bytes, status: int, code: str) -> bool:
    """`raw` is the answer `status` with error code `code`, or nothing (the close came first)."""
    if not raw:
        return True
    got, headers, body = parsed(raw)
    return (
        got == status
        and headers["connection"] == "close"
        and headers["content-type"] == "application/json"
        and bool(headers["x-request-id"])
        and json.loads(body)["error"]["code"] == code
    )


def head(fields: int, value_bytes: int = 1) -> bytes:
    """A GET /healthz head with `fields` fields (Host among them), each value `value_bytes`."""
    lines = [b"GET /healthz HTTP/1.1", b"Host: localhost"]
    lines += [b"X-F%d: %s" % (i, b"v" * value_bytes) for i in range(fields - 1)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


# --- time -------------------------------------------------------------------------------------


def test_a_head_slower_than_head_timeout_is_closed_and_a_whole_one_is_not(
    timeouts: SvirProcess,
) -> None:
    def forever() -> Iterator[bytes]:
        yield b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
        while True:
            yield b"X"  # a field name that never ends

    with connect(timeouts) as sock:
        # A byte every 0.2 s: the head is never whole, and only the server can end this.
        raw = send_until_answered(sock, forever(), pause=0.2)
    assert is_refusal(raw, 408, "request_timeout"), raw

    # A head that came whole is not timed any more: its body may come well after head_timeout
    # (and after keep_alive_timeout) and the request is answered.
    with connect(timeouts) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n"
        )
        time.sleep(3)
        sock.sendall(b"{}")
        status, _, body = response(sock)
    assert status == 400 and json.loads(body)["error"]["param"] == "model"


def test_connections_that_never_send_a_byte_are_closed(timeouts: SvirProcess) -> None:
    with ExitStack() as stack:
        socks = [stack.enter_context(connect(timeouts)) for _ in range(50)]
        # An idle connection is closed quietly, without an answer to no request.
        assert [until_closed(sock) for sock in socks] == [b""] * len(socks)


def test_an_idle_keep_alive_connection_is_closed_even_after_a_stray_byte(
    timeouts: SvirProcess,
) -> None:
    with connect(timeouts) as sock:
        sock.sendall(HEALTHZ)
        assert response(sock)[0] == 200
        assert until_closed(sock) == b""

    # A byte after the response stops uvicorn's keep-alive timer; the head timer takes over.
    with connect(timeouts) as sock:
        sock.sendall(HEALTHZ)
        assert response(sock)[0] == 200
        sock.sendall(b"\r\n")  # blank lines: the parser skips them and begins no request
        assert is_refusal(until_closed(sock), 408, "request_timeout")
    with connect(timeouts) as sock:
        sock.sendall(HEALTHZ)
        assert response(sock)[0] == 200
        sock.sendall(b"G")
        assert is_refusal(until_closed(sock), 408, "request_timeout")


# --- size -------------------------------------------------------------------------------------


def test_a_head_over_max_head_bytes_gets_431_and_the_connection_closes(sizes: SvirProcess) -> None:
    # Just under 4096 bytes, in one piece and in pieces: answered, and the connection stays.
    under = head(3, value_bytes=1900)
    assert 3800 < len(under) < 4096
    with connect(sizes) as sock:
        sock.sendall(under)
        assert response(sock)[0] == 200
        for i in range(0, len(under), 700):
            sock.sendall(under[i : i + 700])
            time.sleep(0.05)
        assert response(sock)[0] == 200

    # Over it, whole: 431.
    with connect(sizes) as sock:
        sock.sendall(head(3, value_bytes=2200))
        assert is_refusal(until_closed(sock), 431, "request_header_fields_too_large")

    # Over it and never ending: 431 as soon as it is too large, not when it ends.
    def endless() -> Iterator[bytes]:
        yield b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: "
        while True:
            yield b"v" * 1000

    with connect(sizes) as sock:
        raw = send_until_answered(sock, endless(), pause=0.05)
    assert is_refusal(raw, 431, "request_header_fields_too_large"), raw


def test_the_rest_of_a_body_refused_early_is_not_taken_for_a_head(sizes: SvirProcess) -> None:
    # A body over max_body_bytes is refused (413) from its Content-Length, before it is sent;
    # what the client then sends of it belongs to that request, however much over max_head_bytes
    # it is, and the connection serves the next request.
    size = 50_000
    with connect(sizes) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size
        )
        status, _, body = response(sock)
        assert status == 413, body
        sock.sendall(b" " * size)
        sock.sendall(HEALTHZ)
        status, _, body = response(sock)
        assert status == 200, body


def test_a_head_over_max_header_fields_gets_431_and_the_connection_closes(
    sizes: SvirProcess,
) -> None:
    with connect(sizes) as sock:
        sock.sendall(head(20))
        assert response(sock)[0] == 200
    with connect(sizes) as sock:
        sock.sendall(head(21))
        raw = until_closed(sock)
    assert raw, "closed without an answer"
    assert is_refusal(raw, 431, "request_header_fields_too_large"), raw


@pytest.mark.external
def test_workers_have_the_limits(tmp_path: Path) -> None:
    # Each worker is a new interpreter that gets the protocol, and its limits, pickled.
    with SvirProcess(SIZES, tmp_path, args=["--workers", "2"]) as proc:
        # New connections, so that the kernel may hand them to either worker.
        for _ in range(6):
            with connect(proc) as sock:
                sock.sendall(head(21))
                assert is_refusal(until_closed(sock), 431, "request_header_fields_too_large")


async def test_a_head_refused_while_a_response_goes_out_waits_for_its_end() -> None:
    """A pipelined head that is too large while the previous response is still streaming: no
    431 inside that response; nothing more is read, and the connection closes after it."""
    seen = await behind_a_response(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"v" * 200,
        ServerConfig(max_head_bytes=100),
    )
    assert seen.paused and not seen.closed_then and seen.closed_after
    assert seen.sent.endswith(b"3\r\nend\r\n0\r\n\r\n") and b"431" not in seen.sent


# --- connections ---------------------------------------------------------------------------


def is_closed(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (which it has sent nothing unread on): a peek that
    does not wait, and works past select's 1,024 descriptors."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # else recv waits for the socket to be readable, up to its timeout
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(timeout)


def until_all_closed(socks: list[socket.socket]) -> None:
    deadline = time.monotonic() + PATIENCE
    while not all(is_closed(sock) for sock in socks):
        if time.monotonic() > deadline:
            open_ = sum(not is_closed(sock) for sock in socks)
            pytest.fail(f"{open_} of {len(socks)} connections still open after {PATIENCE} s")
        time.sleep(0.05)


def answered_on(sock: socket.socket) -> None:
    sock.sendall(HEALTHZ)
    assert response(sock)[0] == 200


def evicts_the_longest_idle(proc: SvirProcess, cap: int, idle_count: int) -> None:
    """`idle_count` connections that send nothing (more than `cap`), then 20 clients that each
    get an answer and stay: the cap holds the clients and the youngest idle connections, and
    the others were closed, longest idle first."""
    with ExitStack() as stack:
        idle = [stack.enter_context(connect(proc)) for _ in range(idle_count)]
        clients = []
        for _ in range(20):
            clients.append(stack.enter_context(connect(proc)))
            answered_on(clients[-1])  # no reset: a connection at rest made room
        kept = cap - len(clients)
        until_all_closed(idle[:-kept])
        assert [is_closed(sock) for sock in idle[-kept:]] == [False] * kept
        for sock in idle[-kept:] + clients:
            answered_on(sock)


@pytest.mark.external
def test_at_the_cap_the_longest_idle_connections_make_room(tmp_path: Path) -> None:
    with SvirProcess(capped(50), tmp_path) as proc:
        evicts_the_longest_idle(proc, 50, idle_count=120)
        assert "connection(s) at rest" in proc.log()


@pytest.mark.external
def test_two_thousand_idle_connections_do_not_lock_clients_out(tmp_path: Path) -> None:
    """Issue 39's case: 2,000 idle connections, 20 requests, svir's former default of 1,000."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2_000 + 20 + 200
    if soft != resource.RLIM_INFINITY and soft < wanted:
        assert hard == resource.RLIM_INFINITY or hard >= wanted, f"ulimit -Hn is {hard}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        with SvirProcess(capped(1_000), tmp_path) as proc:
            evicts_the_longest_idle(proc, 1_000, idle_count=2_000)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: "


@pytest.mark.external
def test_slow_heads_cannot_hold_the_cap(tmp_path: Path) -> None:
    """Slowloris: connections whose heads never end, a byte at a time. They are at rest from
    their head's first byte, which their later bytes do not move: the oldest make room."""
    cap = 50
    with SvirProcess(capped(cap), tmp_path) as proc, ExitStack() as stack:
        # Once `probe` is answered, svir has read every byte sent before its request (on a
        # connection it reads: each slow one first gets an answer).
        probe = stack.enter_context(connect(proc))
        slow = []
        for _ in range(80):
            slow.append(stack.enter_context(connect(proc)))
            answered_on(slow[-1])
            slow[-1].sendall(SLOW_HEAD)
            answered_on(probe)
        clients = []
        for _ in range(20):
            # A byte each, the youngest first: were a byte to make a head younger, the oldest
            # would be the youngest now.
            for sock in reversed(slow):
                if not is_closed(sock):
                    with suppress(BrokenPipeError, ConnectionResetError):
                        sock.sendall(b"a")
            answered_on(probe)
            clients.append(stack.enter_context(connect(proc)))
            answered_on(clients[-1])
        # The cap holds the probe, the clients and the youngest slow ones.
        kept = cap - 1 - len(clients)
        until_all_closed(slow[:-kept])
        assert [is_closed(sock) for sock in slow[-kept:]] == [False] * kept
        for sock in clients:
            answered_on(sock)


@pytest.mark.external
def test_with_every_connection_busy_a_new_one_is_refused_and_none_is_cut(
    tmp_path: Path,
) -> None:
    """Requests under way (answers the upstream holds back, a body still arriving) are not cut
    for a new connection: it is closed as it is accepted; once they are answered, a new one
    gets in."""
    release = threading.Event()

    async def held(_stage: str) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    script = ScriptedUpstream(wait=held)
    chat = {"model": "up/silent-ok", "messages": [{"role": "user", "content": "hi"}]}

    def post(body: dict[str, object], *extra: bytes) -> bytes:
        data = json.dumps(body).encode()
        fields = [b"POST /v1/chat/completions HTTP/1.1", b"Host: localhost", *extra]
        fields += [b"Content-Type: application/json", b"Content-Length: %d" % len(data)]
        return b"\r\n".join(fields) + b"\r\n\r\n" + data

    with MockServerThread(script) as upstream, ExitStack() as stack:
        provider = (
            f'[[providers]]\nname = "up"\nkind = "openai-compatible"\n'
            f'base_url = "{upstream.base_url}"\ndiscover = false\n'
        )
        proc = stack.enter_context(SvirProcess(capped(4, provider), tmp_path))
        # Two requests and a stream waiting on the upstream, and a request whose body is half
        # sent (svir asked for it: its head was read whole).
        waiting = [stack.enter_context(connect(proc)) for _ in range(3)]
        waiting[0].sendall(post(chat))
        waiting[1].sendall(post({**chat, "stream": True}))
        waiting[2].sendall(post(chat))
        sending = stack.enter_context(connect(proc))
        whole = post(chat, b"Expect: 100-continue")
        split = whole.index(b"\r\n\r\n") + 4
        sending.sendall(whole[:split])
        continued = b""
        while not continued.endswith(b"\r\n\r\n"):
            continued += sending.recv(1)
        assert continued == b"HTTP/1.1 100 Continue\r\n\r\n"
        sending.sendall(whole[split : split + 10])
        deadline = time.monotonic() + PATIENCE
        while script.hits["silent-ok"] < 3:
            assert time.monotonic() < deadline, "the upstream did not get the requests"
            time.sleep(0.05)

        # Closed as accepted, without an answer (svir's start-up health checks may still be
        # counted for a moment: such a connection at rest makes room instead, and this one is
        # answered).
        refused = 0
        while refused < 3:
            assert time.monotonic() < deadline, "no connection was refused"
            with connect(proc) as extra:
                with suppress(BrokenPipeError, ConnectionResetError):
                    extra.sendall(HEALTHZ)
                try:
                    first = extra.recv(65536)
                except ConnectionResetError:
                    first = b""
                assert not first or first.startswith(b"HTTP/1.1 200 "), first
                refused += not first
        assert not any(is_closed(sock) for sock in [*waiting, sending])

        release.set()
        sending.sendall(whole[split + 10 :])
        answers = [response(sock) for sock in [*waiting, sending]]
        assert [status for status, _, _ in answers] == [200] * 4
        for _, _, body in [answers[0], *answers[2:]]:
            assert json.loads(body)["choices"][0]["message"]["content"] == "hello world"
        # The stream, whole.
        events = [line[6:] for line in answers[1][2].split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(event)["choices"] for event in events[:-1]]
        text = "".join(c[0]["delta"].get("content") or "" for c in chunks if c)
        assert text == "hello world"
        # At rest now: one of them makes room for a new one.
        answered_on(stack.enter_context(connect(proc)))
        while not any(is_closed(sock) for sock in [*waiting, sending]):
            assert time.monotonic() < deadline + PATIENCE, "no connection made room"
            time.sleep(0.05)
        assert "each has a request under way" in proc.log()


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("head_timeout = 0", "server.head_timeout"),
        ("keep_alive_timeout = -1", "server.keep_alive_timeout"),
        ("head_timeout = inf", "server.head_timeout"),
        ("max_head_bytes = 0", "server.max_head_bytes"),
        ("max_header_fields = 0", "server.max_header_fields"),
        ("max_connections = 0", "server.max_connections"),
    ],
)
def test_a_bad_limit_is_a_config_error_naming_it(line: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[server]\n{line}\n", source="svir.toml")
    assert caught.value.field == field
    assert str(caught.value).startswith(f"svir.toml: {field}: must be")


@pytest.mark.external
def test_the_open_files_limit_is_raised_to_fit_max_connections() -> None:
    # In a child: the test process's own limit is left alone.
    script = """
import resource
from svir.server import connections_that_fit, open_files_needed, raise_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
limit = 10**9 if hard == resource.RLIM_INFINITY else hard
needed = min(limit, open_files_needed(200))
assert raise_file_limit(needed) == needed
assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == needed
assert connections_that_fit(200) == (200, None)
# A hard limit under what the cap needs: as many connections as it holds, and a warning.
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 1100))
cap, warning = connections_that_fit(10_000)
assert cap == 500, cap
assert warning is not None and "server.max_connections = 10000" in warning, warning
assert "at most 500 connections" in warning and "ulimit -Hn" in warning, warning
assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 1100
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_system_that_refuses_the_limit_asked_gets_the_most_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """macOS refuses a soft limit over its own maximum (kern.maxfilesperproc) though the hard
    limit is infinite: svir takes the most it allows, not its former soft limit."""
    from svir import server

    limits = [256, resource.RLIM_INFINITY]

    def setrlimit(kind: int, pair: tuple[int, int]) -> None:
        if pair[0] > 12_288:
            raise ValueError("current limit exceeds maximum limit")
        limits[:] = pair

    monkeypatch.setattr(server.resource, "getrlimit", lambda kind: tuple(limits))
    monkeypatch.setattr(server.resource, "setrlimit", setrlimit)
    assert server.raise_file_limit(20_100) == 12_288 and limits[0] == 12_288
    assert server.connections_that_fit(10_000)[0] == (12_288 - server.OWN_FILES) // 2
    limits[0] = 256
    assert server.raise_file_limit(2_100) == 2_100 and limits[0] == 2_100


# `svir serve ARGS` with its open-files limit, hard and soft, lowered under what 10,000
# connections need (set in the child before it becomes svir).
UNDER_A_LOW_FILE_LIMIT = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1100, 1100))
os.execv(sys.executable, [sys.executable, "-m", "svir", "serve", *sys.argv[1:]])
"""


@pytest.mark.external
@pytest.mark.parametrize(
    ("config_text", "level"), [("", "info"), ("[server]\nmax_connections = 10001\n", "warning")]
)
def test_a_cap_the_limit_cannot_hold_is_said_as_info_by_default_and_warned_when_asked(
    tmp_path: Path, config_text: str, level: str
) -> None:
    config = tmp_path / "svir.toml"
    config.write_text(config_text)
    # The cap is worked out before svir listens: on a port already taken it says so and exits.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        done = subprocess.run(
            [sys.executable, "-c", UNDER_A_LOW_FILE_LIMIT, "--port", str(taken.getsockname()[1]),
             "--config", str(config), "--log-format", "json"],
            capture_output=True, timeout=120, check=False,
            env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [json.loads(raw) for raw in (done.stdout + done.stderr).splitlines() if raw[:1] == b"{"]
    [said] = [line for line in lines if "svir keeps at most" in line["msg"]]
    assert said["level"] == level, lines
    assert "at most 500 connections" in said["msg"]
