"""The client subcommands of `svir`: `chat`, `models` and `probe` (parsers and dispatch)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["CLIENT_COMMANDS", "add_client_commands", "run_client_command"]

CLIENT_COMMANDS = frozenset({"chat", "models", "probe"})

_BASE_HELP = (
    "svir's base URL, with or without /v1 (default $SVIR_BASE_URL or http://127.0.0.1:11434)"
)
_KEY_HELP = "name of an environment variable holding the key to send as a bearer token"
_SVIR_KEY_HELP = _KEY_HELP + " (default: $SVIR_API_KEY when set)"


def add_client_commands(commands: Any) -> None:
    """Add `chat`, `models` and `probe` to the `svir` subparsers."""
    chat = commands.add_parser(
        "chat",
        help="chat with a model in the terminal (or pipe a message in)",
        description="An interactive chat through svir. With stdin not a terminal, stdin is one "
        "message and only the answer goes to stdout.",
    )
    chat.add_argument("model", help="model as svir lists it, e.g. local/gemma-3-270m")
    chat.add_argument("--base-url", help=_BASE_HELP)
    chat.add_argument("--api-key-env", metavar="VAR", help=_SVIR_KEY_HELP)
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("--tools", metavar="FILE", help="a JSON file of tool definitions to offer")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--max-tokens", type=int)
    chat.add_argument("--reasoning-effort", choices=["none", "low", "medium", "high", "xhigh"])
    chat.add_argument(
        "--history",
        choices=["auto", "thread", "local"],
        default="auto",
        help="where the conversation is kept: a thread on svir, or here (auto: a thread when the "
        "server offers /v1/threads; piped chats keep it here)",
    )
    chat.add_argument("--thread", metavar="ID", help="go on with an existing thread")
    chat.add_argument(
        "--no-reasoning", action="store_true", help="fold reasoning into one line (/reasoning on)"
    )

    models = commands.add_parser("models", help="list the models a server offers")
    models.add_argument("--base-url", help=_BASE_HELP)
    models.add_argument("--api-key-env", metavar="VAR", help=_SVIR_KEY_HELP)
    models.add_argument("--all", action="store_true", help="also list non-chat models")
    models.add_argument("--json", action="store_true", help="print JSON")

    probe = commands.add_parser(
        "probe",
        help="find out what a model server keeps, ignores or rejects",
        description="Drive a server directly (not through svir) through tool_choice, "
        "response_format, reasoning_effort, stream_options, an image and a context overflow, "
        "and report what it kept, ignored or rejected, with suggested provider settings.",
    )
    probe.add_argument("base_url", metavar="BASE_URL", help="the server, with or without /v1")
    probe.add_argument("--model", help="model id as the server lists it (default: the first "
                       "chat model listed)")  # fmt: skip
    probe.add_argument("--api-key-env", metavar="VAR", help=_KEY_HELP)
    probe.add_argument("--json", action="store_true", help="print the report as JSON")
    probe.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for each answer (180)"
    )
    probe.add_argument(
        "--only",
        metavar="GROUPS",
        help="comma-separated checks to run: tools, json, reasoning, image, overflow "
        "(the plain request that checks usage always runs)",
    )


def run_client_command(args: argparse.Namespace) -> int:
    """Run `chat`, `models` or `probe`."""
    from svir.client.connection import API_KEY_ENV, ClientFailure, Connection

    name = f"svir {args.command}"
    try:
        if args.command == "probe":
            from svir.client.probe.payloads import GROUPS
            from svir.client.probe.run import run_probe

            only = None
            if args.only:
                only = frozenset(g.strip() for g in args.only.split(",") if g.strip())
                unknown = only - set(GROUPS)
                if unknown:
                    raise ClientFailure(f"--only: unknown check {sorted(unknown)[0]!r} "
                                        f"(known: {', '.join(GROUPS)})")  # fmt: skip
            conn = Connection.open(args.base_url, args.api_key_env, timeout=args.timeout)
            return run_probe(
                conn, model=args.model, as_json=args.json, timeout=args.timeout, only=only
            )
        conn = Connection.open(args.base_url, args.api_key_env, default_key_env=API_KEY_ENV)
        if args.command == "models":
            from svir.client.models import run_models

            return run_models(conn, show_all=args.all, as_json=args.json)
        from svir.client.chat import ChatOptions, load_tools, run_chat

        params: dict[str, Any] = {}
        if args.temperature is not None:
            params["temperature"] = args.temperature
        if args.max_tokens is not None:
            params["max_tokens"] = args.max_tokens
        if args.reasoning_effort is not None:
            params["reasoning_effort"] = args.reasoning_effort
        options = ChatOptions(
            model=args.model,
            system=args.system,
            tools=load_tools(args.tools) if args.tools else None,
            params=params,
            history=args.history,
            thread_id=args.thread,
            show_reasoning=not args.no_reasoning,
        )
        return run_chat(conn, options)
    except ClientFailure as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
