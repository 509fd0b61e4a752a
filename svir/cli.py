"""The `svir` command line: `svir serve` runs the gateway; `chat`, `models` and `probe` are its
clients (svir/client)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from svir import __version__
from svir.client.commands import CLIENT_COMMANDS, add_client_commands, run_client_command
from svir.edges.keys_cli import COMMANDS as KEYS_COMMANDS
from svir.edges.keys_cli import add_commands as add_keys_commands


def port_number(text: str) -> int:
    """`--port`: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{port} is not a port: a port is between 0 (any free one) and 65535"
        )
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svir", description="A gateway for OpenAI-compatible chat."
    )
    parser.add_argument("--version", action="version", version=f"svir {__version__}")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="TOML config file (default: none, or $SVIR_CONFIG)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=port_number, help="port to listen on (default 11434; 0: any free port)"
    )
    serve.add_argument(
        "--workers", type=int, help="processes serving the port (default 1, or [server] workers)"
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "json", "text"],
        help="json: one JSON object a line, for machines; text: plain lines for a person;"
        " auto (default): text on a terminal, else json",
    )
    serve.add_argument(
        "--allow-open",
        action="store_true",
        help="listen beyond this machine even with no API keys issued (anyone may use svir)",
    )
    add_client_commands(commands)
    add_keys_commands(commands)
    return parser


def serve(args: argparse.Namespace) -> int:
    from svir import server
    from svir.config.load import check_keys, load_config
    from svir.edges import keys_cli
    from svir.edges.managed.defaults import default_config
    from svir.errors import ConfigError
    from svir.log import setup_logging
    from svir.store import with_store_url

    log_format = args.log_format
    if log_format == "auto":
        log_format = "text" if sys.stderr.isatty() else "json"
    setup_logging(args.log_level, fmt=log_format)
    path = args.config or os.environ.get("SVIR_CONFIG")
    try:
        config = load_config(path) if path else default_config()
        # The entries SVIR_ORIGINS and SVIR_ALLOWED_HOSTS add, checked before svir listens.
        config.server.origin_patterns(os.environ)
        config.server.host_patterns(os.environ)
    except ConfigError as exc:
        print(f"svir: bad config: {exc}", file=sys.stderr)
        return 2
    config, moved = with_store_url(config, path, os.environ)
    warnings = check_keys(config, os.environ)
    if path and not config.providers:
        warnings.append(
            f"{path} names no providers: every model request will be answered 404 and"
            " /v1/models is empty. Add a [[providers]] table (see svir.example.toml), or run"
            " without --config to serve the bundled local model"
        )
    if moved is not None:
        warnings.append(moved)
    for warning in warnings:
        print(f"svir: warning: {warning}", file=sys.stderr)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    refusal = keys_cli.check_listen(config, host, args.allow_open)
    if refusal is not None:
        print(f"svir: {refusal}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else config.server.workers
    refusal = server.worker_refusal(config, workers)
    if refusal is not None:
        print(f"svir: {refusal}", file=sys.stderr)
        return 2
    for warning in server.worker_warnings(config, workers):
        print(f"svir: warning: {warning}", file=sys.stderr)
    return server.run(
        config,
        host=host,
        port=port,
        workers=workers,
        log_level=args.log_level,
        path=path,
        log_format=log_format,
        keys=keys_cli.keys_state(config),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command in CLIENT_COMMANDS:
        return run_client_command(args)
    if args.command in KEYS_COMMANDS:
        from svir.edges.keys_cli import run as run_keys_command

        return run_keys_command(args)
    parser.print_help()
    return 0
