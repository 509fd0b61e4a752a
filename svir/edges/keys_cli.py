"""`svir keys create|list|revoke` and `svir usage`: straight on the store that the config names
(the same one `svir serve` uses), so they work with or without a running server. A running svir
sees a new or revoked key within `[auth] cache_seconds`."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TextIO

import msgspec

if TYPE_CHECKING:
    from svir.config.model import Config
    from svir.keys.limits import Limits
    from svir.keys.model import KeySpec
    from svir.store.base import SqlStore

__all__ = ["COMMANDS", "add_commands", "check_listen", "run"]

COMMANDS: Final = frozenset({"keys", "usage"})


def add_commands(commands: Any) -> None:
    """Add `keys` and `usage` to the `svir` parser's subcommands."""
    keys = commands.add_parser("keys", help="issue, list and revoke svir's own API keys")
    actions = keys.add_subparsers(dest="keys_command", required=True)

    create = actions.add_parser("create", help="issue a key (its secret is shown once)")
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument(
        "--models",
        help="comma-separated models the key may use; a trailing / or * is a prefix"
        " (default: every model)",
    )
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute")
    create.add_argument("--concurrent", type=int, help="requests running at once")
    create.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="TOKENS/PERIOD",
        help="token budget, e.g. 100000/day or 5000000/month (repeatable)",
    )
    create.add_argument(
        "--cost-budget",
        action="append",
        default=[],
        metavar="USD/PERIOD",
        help="cost budget from [[prices]], e.g. 5/day or 100/month (repeatable)",
    )
    create.add_argument("--expires", help="30d, 12h, or a date such as 2026-12-31")

    listing = actions.add_parser("list", help="the keys (never their secrets)")
    listing.add_argument("--all", action="store_true", help="revoked keys too")

    revoke = actions.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("key_id", help="the key's id (key_…)")

    for parser in (create, listing, revoke):
        parser.add_argument("--config", help="TOML config file (default: $SVIR_CONFIG)")
        parser.add_argument("--json", action="store_true", help="print JSON")

    usage = commands.add_parser("usage", help="summarise the usage ledger")
    usage.add_argument("--since", default="24h", help="24h, 7d, or a date (default 24h)")
    usage.add_argument("--key", help="one key's requests (its id)")
    usage.add_argument(
        "--by",
        default="key,model",
        help="comma-separated groups among key, model, served_model, provider, api, status, day"
        " (default key,model)",
    )
    usage.add_argument("--config", help="TOML config file (default: $SVIR_CONFIG)")
    usage.add_argument("--json", action="store_true", help="print JSON")


def _config(args: argparse.Namespace) -> Config:
    """The config the command names, its store's place filled in as `svir serve` fills it."""
    from svir.config.load import load_config
    from svir.config.model import Config
    from svir.store import with_store_url

    path = args.config or os.environ.get("SVIR_CONFIG")
    config, warning = with_store_url(load_config(path) if path else Config.default(), path)
    if warning is not None:
        print(f"svir: warning: {warning}", file=sys.stderr)
    return config


def store_line(config: Config) -> str:
    """Which store a command read or wrote, as its text output says it."""
    from svir.store import sqlite_path

    url = config.store.url
    path = sqlite_path(url)
    return f"Store: {path} (SQLite)" if path is not None else f"Store: {_without_password(url)}"


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    who, at, where = rest.rpartition("@")
    if not at or ":" not in who:
        return url
    return f"{scheme}{sep}{who.split(':', 1)[0]}:***@{where}"


async def _with_store(config: Config, work: Callable[[SqlStore], Awaitable[int]]) -> int:
    from svir.store import make_store, store_url
    from svir.store.base import SqlStore

    store = make_store(store_url(config))  # set by _config; empty in tests
    assert isinstance(store, SqlStore)
    await store.open()
    try:
        return await work(store)
    finally:
        await store.close()


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from svir.errors import ConfigError, StoreError

    out = out or sys.stdout
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"svir: bad config: {exc}", file=sys.stderr)
        return 2
    args.resolved_config = config
    if args.command == "keys" and args.keys_command == "create":
        refusal = cost_budget_refusal(config, args)
        if refusal is not None:
            print(f"svir: {refusal}", file=sys.stderr)
            return 2
    try:
        if args.command == "usage":
            return asyncio.run(_with_store(config, lambda s: _usage(s, args, out)))
        action = {"create": _create, "list": _list, "revoke": _revoke}[args.keys_command]
        return asyncio.run(_with_store(config, lambda s: action(s, args, out)))
    except StoreError as exc:
        print(f"svir: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"svir: {exc}", file=sys.stderr)
        return 2


def cost_budget_refusal(config: Config, args: argparse.Namespace) -> str | None:
    """Why `svir keys create --cost-budget` cannot work with `config`, or None: a cost is
    counted from the config's [[prices]], and with none every request costs $0, so the budget
    would never run out."""
    if not args.cost_budget or config.prices:
        return None
    where = args.config or os.environ.get("SVIR_CONFIG")
    source = f"the config {where}" if where else "no config file (--config or $SVIR_CONFIG)"
    return (
        f"--cost-budget needs prices, and {source} has no [[prices]] entries: every request"
        " would cost $0 and the budget never run out. Add [[prices]] (model, input, output in"
        " USD per million tokens; docs/keys.md) to the config and pass it with --config, or"
        " limit tokens instead with --budget TOKENS/PERIOD."
    )


def spec_from_args(args: argparse.Namespace) -> KeySpec:
    from svir.keys.limits import Limits
    from svir.keys.model import KeySpec, parse_budget, parse_expiry, usd_to_micros

    budgets: dict[str, int] = {}
    for text in args.budget:
        amount, period = parse_budget(text)
        budgets[f"tokens_per_{period}"] = int(amount)
    for text in args.cost_budget:
        amount, period = parse_budget(text)
        budgets[f"cost_per_{period}"] = usd_to_micros(amount)
    models = None
    if args.models:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    spec = KeySpec(
        name=args.name,
        models=models,
        limits=Limits(rpm=args.rpm, tpm=args.tpm, concurrent=args.concurrent, **budgets),
        expires_at=parse_expiry(args.expires) if args.expires else None,
    )
    problem = spec.check()
    if problem is not None:
        raise ValueError(problem)
    return spec


async def _create(store: SqlStore, args: argparse.Namespace, out: TextIO) -> int:
    from svir.store.keys import KeyStore

    spec = spec_from_args(args)
    record, secret = await KeyStore(store).create(spec)
    if args.json:
        out.write(msgspec.json.encode({**record.public(), "key": secret}).decode() + "\n")
        return 0
    out.write(f"Created key {record.id} ({record.name}).\n")
    out.write("Its secret, shown this once (svir keeps only a hash of it):\n\n")
    out.write(f"    {secret}\n\n")
    out.write("Clients send it as: Authorization: Bearer <secret>\n")
    out.write(f"{store_line(args.resolved_config)}: the svir serving this config sees it.\n")
    return 0


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _limits_text(limits: Limits) -> str:
    parts = []
    for name, label in (
        ("rpm", "rpm"),
        ("tpm", "tpm"),
        ("concurrent", "concurrent"),
        ("tokens_per_day", "tok/day"),
        ("tokens_per_month", "tok/month"),
    ):
        value = limits.value(name)
        if value is not None:
            parts.append(f"{label} {value}")
    for name, label in (("cost_per_day", "day"), ("cost_per_month", "month")):
        value = limits.value(name)
        if value is not None:
            parts.append(f"${value / 1_000_000:g}/{label}")
    return ", ".join(parts) or "-"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


async def _list(store: SqlStore, args: argparse.Namespace, out: TextIO) -> int:
    from svir.store.keys import KeyStore

    records = await KeyStore(store).list(include_revoked=args.all)
    if args.json:
        out.write(msgspec.json.encode([r.public() for r in records]).decode() + "\n")
        return 0
    if not records:
        out.write("No keys: svir runs open, for this machine only.\n")
        out.write(store_line(args.resolved_config) + "\n")
        return 0
    now = time.time()
    rows = [["ID", "NAME", "STATE", "MODELS", "LIMITS", "EXPIRES", "HINT"]]
    for r in records:
        models = ",".join(r.models) if r.models is not None else "*"
        rows.append(
            [
                r.id,
                r.name,
                r.state(now),
                models,
                _limits_text(r.limits),
                _when(r.expires_at),
                r.hint,
            ]
        )
    _table(rows, out)
    out.write(store_line(args.resolved_config) + "\n")
    return 0


async def _revoke(store: SqlStore, args: argparse.Namespace, out: TextIO) -> int:
    from svir.keys.model import is_key_id
    from svir.store.keys import KeyStore

    if not is_key_id(args.key_id):
        raise ValueError(f"{args.key_id!r} is not a key id (key_ and 16 hex digits)")
    record = await KeyStore(store).revoke(args.key_id)
    if record is None:
        print(f"svir: no key {args.key_id}", file=sys.stderr)
        return 1
    if args.json:
        out.write(msgspec.json.encode(record.public()).decode() + "\n")
    else:
        out.write(f"Revoked {record.id} ({record.name}). {store_line(args.resolved_config)}\n")
    return 0


async def _usage(store: SqlStore, args: argparse.Namespace, out: TextIO) -> int:
    from svir.edges.keys_service import parse_since
    from svir.ledger.queries import ALL_KEYS, summarize

    now = time.time()
    since = parse_since(args.since, now, now - 86400)
    by = tuple(g.strip() for g in args.by.split(",") if g.strip())
    rows = await summarize(store, since=since, key=args.key or ALL_KEYS, by=by)
    if args.json:
        out.write(msgspec.json.encode({"since": since, "until": now, "data": rows}).decode() + "\n")
        return 0
    out.write(f"Usage since {_when(since)} UTC\n")
    if not rows:
        out.write("No requests.\n")
        return 0
    head = [g.upper() for g in by] + [
        "REQUESTS",
        "ERRORS",
        "PROMPT",
        "COMPLETION",
        "COST $",
        "LATENCY ms",
        "TTFT ms",
        "TOK/S",
    ]
    table = [head]
    for row in rows:
        table.append(
            [str(row[g] if row[g] is not None else "-") for g in by]
            + [
                str(row["requests"]),
                str(row["errors"]),
                str(row["prompt_tokens"]),
                str(row["completion_tokens"]),
                f"{row['cost_usd']:.4f}",
                _num(row["latency_ms"]),
                _num(row["ttft_ms"]),
                _num(row["tokens_per_second"]),
            ]
        )
    _table(table, out)
    return 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _has_keys(config: Config) -> bool:
    """Whether the config's store holds a key (KeyStore.configured); StoreError if unreadable."""
    from svir.store.keys import KeyStore

    async def configured(store: SqlStore) -> int:
        return 1 if await KeyStore(store).configured() else 0

    return bool(asyncio.run(_with_store(config, configured)))


def keys_state(config: Config) -> str:
    """Whether svir's keys are on, for the start-up banner."""
    from svir.errors import StoreError

    try:
        on = _has_keys(config)
    except StoreError as exc:
        return f"unknown: cannot read the store ({exc})"
    if on:
        return "on: every request needs a key (svir keys list)"
    return "off: no keys issued, open to whoever reaches it (svir keys create --name NAME)"


def check_listen(config: Config, host: str, allow_open: bool) -> str | None:
    """Why `svir serve` must not listen on `host`, or None: without keys, only on loopback,
    unless told otherwise (`--allow-open` or `[auth] allow_open_non_loopback`)."""
    from svir.errors import StoreError
    from svir.policy.auth import is_loopback

    if is_loopback(host) or allow_open or config.auth.allow_open_non_loopback:
        return None
    try:
        has_keys = _has_keys(config)
    except StoreError as exc:
        return f"cannot read the keys to decide whether {host} is safe: {exc}"
    if has_keys:
        return None
    return (
        f"refusing to listen on {host}: svir has no API keys, so anyone who can reach it could"
        " use it. Issue a key (`svir keys create --name NAME`), listen on 127.0.0.1, or allow"
        " it explicitly with --allow-open (or [auth] allow_open_non_loopback = true)."
    )
