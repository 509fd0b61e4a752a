"""svir.wire.capture: secrets redacted wherever they are (also cut by a pane's bound or split
between pieces), credential headers by name, and a pane bounded with its truncation said."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from svir.wire.capture import (
    REDACTED,
    Pane,
    client_credentials,
    redact,
    redact_headers,
    secret_forms,
)

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
