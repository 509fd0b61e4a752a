"""What one client connection may hold (`[server]` head_timeout, keep_alive_timeout,
max_head_bytes, max_header_fields, max_connections), on a real `svir serve` driven with raw
sockets.

No test depends on how fast the machine is: a server's close is waited for up to `PATIENCE`
seconds (the limits are a second or two), and nothing is asserted to take at least some time
unless the test itself waited that long.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest

from svir.config import ConfigError, ServerConfig, parse_config
from tests.support.svir_proc import SvirProcess
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

CAP = 4
CAPPED = f"""
[server]
head_timeout = 300
keep_alive_timeout = 300
max_connections = {CAP}
"""

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


# --- connections ------------------------------------------------------------------------------


def answered(proc: SvirProcess, deadline: float) -> socket.socket:
    """A connection that got its 200 (retried while the server still counts connections that
    were closed a moment ago, such as the start-up health checks')."""
    while time.monotonic() < deadline:
        sock = connect(proc)
        try:
            sock.sendall(HEALTHZ)
            if response(sock)[0] == 200:
                return sock
        except (ConnectionError, http.client.HTTPException):
            pass
        sock.close()
        time.sleep(0.1)
    pytest.fail(f"no connection was answered within {PATIENCE} s")


def test_connections_past_max_connections_are_refused_until_one_closes(tmp_path: Path) -> None:
    with SvirProcess(CAPPED, tmp_path) as proc:
        deadline = time.monotonic() + PATIENCE
        held = [answered(proc, deadline) for _ in range(CAP)]
        try:
            # CAP connections are open (and answered): the next one is closed at accept,
            # before it is read, without an answer.
            for _ in range(3):
                with connect(proc) as extra:
                    with suppress(BrokenPipeError, ConnectionResetError):
                        extra.sendall(HEALTHZ)
                    assert until_closed(extra) == b""
            # The held ones still work.
            for sock in held:
                sock.sendall(HEALTHZ)
                assert response(sock)[0] == 200
            held.pop().close()
            held.append(answered(proc, time.monotonic() + PATIENCE))
        finally:
            for sock in held:
                sock.close()
        assert "server.max_connections" in proc.log()


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


def test_the_open_files_limit_is_raised_to_fit_max_connections() -> None:
    # In a child: the test process's own limit is left alone.
    script = """
import resource
from svir.edges.server import open_files_needed, raise_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
limit = 10**9 if hard == resource.RLIM_INFINITY else hard
needed = min(limit, open_files_needed(200))
assert raise_file_limit(needed) is None
assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == needed
if limit < 10**9:
    warning = raise_file_limit(limit + 1)
    assert warning is not None and "server.max_connections" in warning, warning
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == limit
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
