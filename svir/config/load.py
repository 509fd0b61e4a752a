"""Reading svir's TOML file (or text) into a checked `Config`, every mistake one `ConfigError`
naming the file, the field and the fix; msgspec's messages said in TOML's terms.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from svir.config.checks import checked, reject_inline_keys
from svir.config.model import (
    AuthConfig,
    Config,
    LedgerConfig,
    LimitsConfig,
    ManagedConfig,
    PriceConfig,
    ProviderConfig,
    ServerConfig,
    StoreConfig,
    TelemetryConfig,
    Timeouts,
)
from svir.errors import ConfigError
from svir.providers import KINDS

__all__ = ["check_keys", "load_config", "parse_config"]


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check the TOML file at `path`. Raises ConfigError for anything wrong with it."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the file ({exc.strerror or exc})") from None
    try:
        # utf-8-sig: some editors on Windows start a UTF-8 file with a byte-order mark.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(path, None, "the file is not UTF-8 text") from None
    return parse_config(text, source=path)


def parse_config(text: str, *, source: str | os.PathLike[str] = "<string>") -> Config:
    """Check TOML text as `load_config` does; `source` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line N, column M)".
        raise ConfigError(source, None, f"TOML syntax error: {exc}") from None
    reject_inline_keys(source, doc)
    try:
        config = msgspec.convert(doc, Config)
    except msgspec.ValidationError as exc:
        field, reason = _explain(str(exc))
        raise ConfigError(source, field, reason) from None
    return checked(source, config)


def check_keys(config: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """Warnings about provider keys missing from the environment. The keys are never shown."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    for provider in config.providers:
        var = provider.api_key_env
        if var is not None and provider.api_key(env) is None:
            warnings.append(
                f"provider {provider.name!r}: environment variable {var} is not set or empty;"
                " its requests go without a key"
            )
        elif var is None and KINDS[provider.kind].key_required:
            warnings.append(
                f"provider {provider.name!r}: no api_key_env, and {provider.kind} refuses"
                " requests without a key"
            )
    return warnings


# ---------------------------------------------------------------------------------------------
# msgspec's messages, said in TOML's terms

_AT: Final = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_MISSING: Final = re.compile(r"Object missing required field `(?P<name>[^`]*)`")
_EXPECTED: Final = re.compile(r"Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`")
_TOML_TYPES: Final = {
    "object": "a table",
    "array": "an array",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "nothing",
}
_INDEX: Final = re.compile(r"\[\d+\]")
_STRUCTS: Final[dict[str, type[msgspec.Struct]]] = {
    "": Config,
    "server": ServerConfig,
    "store": StoreConfig,
    "providers[]": ProviderConfig,
    "providers[].timeouts": Timeouts,
    "auth": AuthConfig,
    "limits": LimitsConfig,
    "prices[]": PriceConfig,
    "telemetry": TelemetryConfig,
    "ledger": LedgerConfig,
    "providers[].managed": ManagedConfig,
}


def _explain(message: str) -> tuple[str | None, str]:
    """Split a msgspec ValidationError message into the field it names and a reason."""
    match = _AT.match(message)
    what = match.group("what") if match else message
    path = (match.group("path") or "").lstrip(".") if match else ""
    field = path or None

    if found := _UNKNOWN.fullmatch(what):
        name = found.group("name")
        known = _STRUCTS.get(_INDEX.sub("[]", path))
        hint = ""
        if known is not None:
            close = difflib.get_close_matches(name, known.__struct_fields__, n=1)
            if close:
                hint = f" (did you mean {close[0]!r}?)"
        return _join(path, name), f"unknown field{hint}"
    if found := _MISSING.fullmatch(what):
        return _join(path, found.group("name")), "is required"
    if found := _EXPECTED.match(what):
        want = _toml_type(found.group("want"))
        got = _toml_type(found.group("got"))
        reason = f"expected {want}, got {got}"
        if path == "providers" and found.group("got") == "object":
            reason += " (write [[providers]], with two brackets, once per provider)"
        return field, reason
    return field, what


def _toml_type(name: str) -> str:
    # TOML has no null, so an optional field's "| null" only confuses.
    options = [_TOML_TYPES.get(t, t) for t in name.split(" | ") if t != "null"] or [name]
    return " or ".join(options)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
