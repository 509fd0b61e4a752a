"""Run a real `svir serve` process for end-to-end tests, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SvirProcess:
    """`svir serve --config FILE` in a child process; `base_url` ends in /v1.

    With `config_text` None, `svir serve` without a config (and without $SVIR_CONFIG)."""

    def __init__(
        self,
        config_text: str | None,
        tmp: Path,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.args = list(args)
        self.port = free_port()
        self.config_path: Path | None = None
        if config_text is not None:
            self.config_path = tmp / "svir.toml"
            self.config_path.write_text(config_text)
        self.log_path = tmp / "svir.log"
        # What svir puts in the temp dir (a managed provider's logs) stays in the test's, also
        # when a test kills svir outright and nothing can clean up.
        self.temp_dir = tmp / "tmp"
        self.temp_dir.mkdir(exist_ok=True)
        # The default store lives under the data dir: keep each test's svir in its own.
        self.env = {
            **os.environ,
            "XDG_DATA_HOME": str(tmp / "data"),
            "TMPDIR": str(self.temp_dir),
            **(env or {}),
        }
        if config_text is None:
            self.env.pop("SVIR_CONFIG", None)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 20.0) -> SvirProcess:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "svir", "serve", "--port", str(self.port),
             *(["--config", str(self.config_path)] if self.config_path else []), *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )  # fmt: skip
        try:
            self._wait_healthy(timeout)
        except BaseException:
            # Not a running svir to the caller (a `with` never reaches __exit__ when __enter__
            # fails): stopped here, or it would outlive the test run.
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"svir exited {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"svir did not become healthy: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> SvirProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
