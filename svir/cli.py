"""The `svir` command line: `svir serve` runs the gateway."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from svir import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svir", description="A gateway for OpenAI-compatible chat."
    )
    parser.add_argument("--version", action="version", version=f"svir {__version__}")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="TOML config file (default: none, or $SVIR_CONFIG)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 11434)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from svir.config import Config, ConfigError, check_keys, load_config
    from svir.edges.app import App
    from svir.log import setup_logging

    setup_logging(args.log_level)
    path = args.config or os.environ.get("SVIR_CONFIG")
    try:
        config = load_config(path) if path else Config.default()
    except ConfigError as exc:
        print(f"svir: bad config: {exc}", file=sys.stderr)
        return 2
    for warning in check_keys(config, os.environ):
        print(f"svir: warning: {warning}", file=sys.stderr)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    app = App(config, os.environ)
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    parser.print_help()
    return 0
