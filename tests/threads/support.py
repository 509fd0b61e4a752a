"""Helpers for driving /v1/threads of a real svir process with plain httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.svir_proc import SvirProcess


def providers_toml(base_url: str) -> str:
    """Providers over one replay server, one per reasoning key and dialect."""
    return f"""
[[providers]]
name = "plain"
kind = "openai-compatible"
base_url = "{base_url}"
think_tags = false
discover = false

[[providers]]
name = "tags"
kind = "openai-compatible"
base_url = "{base_url}"
think_tags = true
discover = false

[[providers]]
name = "mlx"
kind = "mlx-lm"
base_url = "{base_url}"
discover = false

[[providers]]
name = "lms"
kind = "lmstudio"
base_url = "{base_url}"
discover = false
"""


def config_toml(base_url: str, store_url: str, **store: Any) -> str:
    lines = [f'url = "{store_url}"'] + [f"{k} = {json.dumps(v)}" for k, v in store.items()]
    return "[store]\n" + "\n".join(lines) + "\n" + providers_toml(base_url)


def start_svir(tmp: Path, base_url: str, store_url: str, **store: Any) -> SvirProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return SvirProcess(config_toml(base_url, store_url, **store), tmp).start()


def parse_frames(raw: bytes) -> list[dict[str, Any]]:
    """The JSON frames of a continue stream; comments (keep-alives) are left out."""
    out = []
    for block in raw.split(b"\n\n"):
        lines = [line for line in block.split(b"\n") if line.startswith(b"data: ")]
        if lines:
            out.append(json.loads(b"\n".join(line[6:] for line in lines)))
    return out


class Threads:
    """A client of one svir's thread API, with one bearer token (or none)."""

    def __init__(self, base_url: str, key: str | None = "key-one", timeout: float = 30) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def create(self, **body: Any) -> dict[str, Any]:
        r = self.http.post("/threads", json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def say(self, thread_id: str, content: Any, **extra: Any) -> dict[str, Any]:
        r = self.http.post(f"/threads/{thread_id}/messages", json={"content": content, **extra})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def post(self, thread_id: str, body: Any) -> httpx.Response:
        return self.http.post(f"/threads/{thread_id}/messages", json=body)

    def get(self, thread_id: str) -> dict[str, Any]:
        r = self.http.get(f"/threads/{thread_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def continue_(self, thread_id: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/threads/{thread_id}/continue", json=body)

    def stream(self, thread_id: str, **body: Any) -> list[dict[str, Any]]:
        r = self.continue_(thread_id, stream=True, **body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "text/event-stream"
        assert b"[DONE]" not in r.content
        return parse_frames(r.content)

    def open_stream(self, thread_id: str, **body: Any) -> Iterator[httpx.Response]:
        with self.http.stream(
            "POST", f"/threads/{thread_id}/continue", json={"stream": True, **body}
        ) as r:
            yield r

    def roles(self, thread_id: str) -> list[str]:
        return [m["role"] for m in self.get(thread_id)["messages"]]
