"""svir.console.panes: secrets redacted wherever they are (also cut by a pane's bound or split
between pieces), credential headers by name, and a pane bounded with its truncation said."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svir.config.load import parse_config
from svir.config.model import CaptureConfig
from svir.console.panes import (
    REDACTED,
    Pane,
    client_credentials,
    redact,
    redact_headers,
    secret_forms,
)
from svir.errors import ConfigError

KEY = 'sk-"quoted"-key-0123456789'


def test_a_secret_is_redacted_as_written_and_as_json_escapes_it() -> None:
    secrets = secret_forms([KEY, None, "abc"])  # too short to be a secret: "abc"
    assert b"abc" not in secrets
    data = b'{"a": "sk-\\"quoted\\"-key-0123456789", "b": sk-"quoted"-key-0123456789, "c": "abc"}'
    assert redact(data, secrets) == b'{"a": "[redacted]", "b": [redacted], "c": "abc"}'


def test_credential_headers_are_redacted_by_name_and_others_by_value() -> None:
    secrets = secret_forms([KEY])
    headers = [
        ("Authorization", "Bearer whatever-token"),
        ("X-Api-Key", "k"),
        ("Cookie", "session=1"),
        ("X-Echo", f"it was {KEY}"),
        ("Content-Type", "application/json"),
    ]
    assert redact_headers(headers, secrets) == [
        ["Authorization", REDACTED],
        ["X-Api-Key", REDACTED],
        ["Cookie", REDACTED],
        ["X-Echo", f"it was {REDACTED}"],
        ["Content-Type", "application/json"],
    ]
    assert client_credentials(headers) == [
        "whatever-token",
        "Bearer whatever-token",
        "k",
        "session=1",
    ]


@given(
    before=st.binary(max_size=300),
    after=st.binary(max_size=300),
    limit=st.integers(1, 400),
    cuts=st.lists(st.integers(0, 700), max_size=8),
)
def test_a_pane_never_keeps_a_secret_wherever_the_bound_and_pieces_fall(
    before: bytes, after: bytes, limit: int, cuts: list[int]
) -> None:
    secrets = secret_forms([KEY])
    data = before + KEY.encode() + after
    pane = Pane(limit, max(len(s) for s in secrets))
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for a, b in itertools.pairwise(bounds):
        pane.add(data[a:b])
    kept, truncated = pane.value(secrets)
    assert pane.total == len(data)
    assert len(kept) <= limit
    whole = redact(data, secrets)
    # What is kept is the start of the redacted stream; cut exactly when it was longer.
    assert whole.startswith(kept)
    assert truncated == (len(data) > limit or len(whole) > limit)
    if not truncated:
        assert kept == whole
    for n in range(4, len(KEY) + 1):
        # Not even the key's start survives at the cut (beyond what ordinary bytes could hold).
        assert KEY.encode()[:n] not in kept or KEY.encode()[:n] in before + after


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("max_body_bytes = 10", "capture.max_body_bytes"),
        ("max_body_bytes = 100000000", "capture.max_body_bytes"),
        ("max_age = 0", "capture.max_age"),
        ("max_age = inf", "capture.max_age"),
        ("max_rows = 0", "capture.max_rows"),
    ],
)
def test_a_bad_capture_setting_names_its_field(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[capture]\nenabled = true\n{text}\n", source="svir.toml")
    assert caught.value.field == field
    assert caught.value.path == "svir.toml"
    assert "must" in caught.value.reason


def test_capture_is_off_by_default_and_takes_its_settings() -> None:
    assert parse_config("").capture == CaptureConfig(enabled=False)
    config = parse_config("[capture]\nenabled = true\nmax_body_bytes = 2048\nmax_age = 60\n")
    assert config.capture == CaptureConfig(
        enabled=True, max_body_bytes=2048, max_age=60.0, max_rows=1000
    )
