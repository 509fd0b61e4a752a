"""`GET /admin/requests` takes any query: a page (200) or a 400 naming the parameter, never a
500, on SQLite and on PostgreSQL (whose integers and text are the stricter)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.console.observe_support import AUTH, Svir

NAMES = ["limit", "before", "key", "model", "provider", "api", "status", "since", "until", "x"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
VALUES = st.one_of(
    TEXT,
    st.integers().map(str),
    st.floats().map(str),
    st.sampled_from(
        ["", "0", "1", "-1", "500", "501", "24h", "7d", "2026-01-31", "2026-13-45", "nan", "inf",
         "-inf", "1e309", "9" * 40, "none", "ok", "up/tok-2", "\x00", "%00", "0x10", "1_000"]
    ),
)  # fmt: skip
QUERIES = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=6)


def fuzz(svir: Svir, loop: asyncio.AbstractEventLoop) -> None:
    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(query=QUERIES)
    def check(query: dict[str, str]) -> None:
        answer = loop.run_until_complete(
            svir.http.get("/admin/requests", params=query, headers=AUTH)
        )
        assert answer.status_code in (200, 400), (query, answer.text)
        body = answer.json()
        if answer.status_code == 400:
            assert body["error"]["param"] in NAMES, body
        else:
            assert isinstance(body["data"], list)
            assert body["next"] is None or isinstance(body["next"], int)

    check()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_any_query_is_a_page_or_a_400(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    store = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    loop = asyncio.new_event_loop()
    try:
        svir = Svir(tmp_path, store=store)
        loop.run_until_complete(svir.__aenter__())
        try:
            for model in ("up/tok-2", "alt/tok-1"):
                loop.run_until_complete(svir.chat(model))
            fuzz(svir, loop)
        finally:
            loop.run_until_complete(svir.__aexit__(None, None, None))
    finally:
        loop.close()
